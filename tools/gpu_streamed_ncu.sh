# ncu of the streamed smooth2d kernel: instruction mix, source counters, stalls.
export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 ncu --kernel-name regex:smooth2d_u1_u2_u3_u4 --launch-skip 2 --launch-count 1 --set full --import-source yes -o $OUT/smooth2d python3 experiments/timesteps_experiment.py smooth2d --forms streamed --rounds 1 --runs 2 > $OUT/ncu_log.txt 2>&1
ncu --import $OUT/smooth2d.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
ncu --import $OUT/smooth2d.ncu-rep --page source --csv --print-source sass > $OUT/ncu_sass.csv 2>&1
grep -E "Executed Instructions|Issued Instructions|Issue Slots Busy|SM Frequency|Duration|No Eligible|Stall|Theoretical Occ|Achieved Occ" $OUT/ncu_details.txt | head -30
ls -la $OUT
