# The streamed form on the GPU: correctness in every boundary mode (and under
# compute-sanitizer with SANITIZE=1), SASS histogram of the smooth2d kernel, timings, and
# with NCU=1 ncu's full report of smooth2d's kernel and its executed instructions per point.
export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
FORMS="${FORMS:-streamed streamed:t64 streamed:p3}"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 experiments/timesteps_experiment.py smooth2d wave2d --check --forms $FORMS > $OUT/check.txt 2>&1
echo "check: $(grep -c ' ok$' $OUT/check.txt) ok, $(grep -c WRONG $OUT/check.txt) wrong"; grep -v " ok$" $OUT/check.txt | tail -5
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in racecheck synccheck memcheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 experiments/timesteps_experiment.py smooth2d wave2d --check --forms streamed > $OUT/san-$tool.txt 2>&1
    echo "$tool exit $?: $(grep -c ' ok$' $OUT/san-$tool.txt) ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.txt | tail -1)"
  done
fi
python3 - <<'PY'
from kfuse.apps import get_app
from kfuse.schedule.forms import parse_form, GroupSchedule, group_outputs
from kfuse.codegen.generate import generate
for name in ("smooth2d", "wave2d"):
    g = get_app(name).build().graph()
    names = tuple(k.name for k in g.kernels)
    open(f"/tmp/{name}.cu", "w").write(generate(g, [GroupSchedule(names, group_outputs(g, names), parse_form("streamed"))]).source)
PY
for name in smooth2d wave2d; do
  nvcc -arch=sm_90 -std=c++17 -cubin -o /tmp/$name.cubin /tmp/$name.cu && cuobjdump -sass /tmp/$name.cubin > $OUT/$name.sass
  echo "$name SASS: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $OUT/$name.sass) instructions;" $(grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+[A-Z0-9_.]+' $OUT/$name.sass | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -12 | awk '{printf "%s %s, ", $2, $1}')
done
python3 experiments/timesteps_experiment.py ${APPS:-smooth2d wave2d} --forms $FORMS --rounds 3 --runs 20 2>&1 | tee $OUT/timing.txt
if [ "${NCU:-0}" = 1 ]; then
  timeout 400 ncu --kernel-name regex:smooth2d_u1_u2_u3_u4 --launch-skip 2 --launch-count 1 \
    --set full --import-source yes -o $OUT/smooth2d python3 experiments/timesteps_experiment.py \
    smooth2d --forms streamed --rounds 1 --runs 2 > $OUT/ncu_log.txt 2>&1
  ncu --import $OUT/smooth2d.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
  ncu --import $OUT/smooth2d.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1
  grep -E "Issue Slots Busy|SM Frequency|Duration|No Eligible|Stall|Occupancy" $OUT/ncu_details.txt | head -30
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
print("executed per point", round(total * 32 / 8192**2, 1),
      {k: round(v * 32 / 8192**2, 1) for k, v in ops.most_common(14)})
PY
fi
