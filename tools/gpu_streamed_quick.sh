# Quick look at the streamed kernels: check, timings beside torch.compile, executed
# instructions per point of smooth2d's (ncu source counters).
export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
FORMS="${FORMS:-streamed}"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 experiments/timesteps_experiment.py smooth2d wave2d --check --forms $FORMS > $OUT/check.txt 2>&1
echo "check: $(grep -c ' ok$' $OUT/check.txt) ok, $(grep -c WRONG $OUT/check.txt) wrong"
python3 experiments/timesteps_experiment.py smooth2d wave2d --forms $FORMS --rounds 3 --runs 20 2>&1 | grep -E "ms|registers" | tee $OUT/timing.txt
timeout 300 ncu --kernel-name regex:smooth2d_u1_u2_u3_u4 --launch-skip 2 --launch-count 1 --section SourceCounters --section SchedulerStats -o $OUT/s python3 experiments/timesteps_experiment.py smooth2d --forms streamed --rounds 1 --runs 2 > /dev/null 2>&1
ncu --import $OUT/s.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>/dev/null
python3 - $OUT/sass.csv <<'PY'
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ie = hdr.index("Instructions Executed"); src = hdr.index("Source")
ops = collections.Counter()
for r in data:
    if r[ie].isdigit():
        words = r[src].split()
        op = words[1] if words[0].startswith("@") else words[0]
        ops[op.split(".")[0]] += int(r[ie])
total = sum(ops.values())
print("executed per point", round(total * 32 / 8192**2, 1), {k: round(v * 32 / 8192**2, 1) for k, v in ops.most_common(14)})
PY
