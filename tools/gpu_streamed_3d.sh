# The streamed form in 3-D: correctness on the cuda backend, timings of whole chains and of
# 2-step groups beside the plan and torch.compile.
export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 experiments/timesteps_experiment.py heat3d stencil27 smooth2d --check --forms streamed:t32 streamed:t8:y12 > $OUT/check.txt 2>&1
echo "check: $(grep -c ' ok$' $OUT/check.txt) ok, $(grep -c WRONG $OUT/check.txt) wrong"; grep -v " ok$" $OUT/check.txt | tail -3
python3 experiments/timesteps_experiment.py heat3d stencil27 --forms streamed:t32 streamed:t16:y32 streamed:t32:y8 recompute --rounds 3 --runs 10 2>&1 | grep -E " ms |registers|cannot" | tee $OUT/timing_all.txt
python3 experiments/timesteps_experiment.py heat3d --steps 2 --forms streamed:t32 streamed:t32:y8 recompute --rounds 3 --runs 10 2>&1 | grep -E " ms |registers|cannot" | tee $OUT/timing_2.txt
python3 experiments/timesteps_experiment.py smooth2d --forms streamed --rounds 3 --runs 20 2>&1 | grep -E " ms |registers" | tee $OUT/timing_smooth.txt
