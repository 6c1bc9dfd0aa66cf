# kfuse bench of the time-step apps beside torch.compile (after calibrating), and the
# streamed form's prefetch depths timed side by side.
export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m kfuse calibrate > $OUT/calibrate.txt 2>&1; tail -1 $OUT/calibrate.txt
python3 -m kfuse bench ${STEP_APPS:-smooth2d wave2d heat3d stencil27} --json $OUT/steps.json 2>&1 | tee $OUT/steps_bench.txt | grep -v "^\s*$" | head -40
python3 experiments/timesteps_experiment.py smooth2d wave2d --forms streamed:p3 streamed:p4 --rounds 3 --runs 20 2>&1 | grep -E " ms " | tee $OUT/timing.txt
