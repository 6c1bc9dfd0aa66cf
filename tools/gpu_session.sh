#!/usr/bin/env bash
# Everything the GPU must check for the end-to-end skeleton, in one device call.
# Usage (device machine, repo root): bash tools/gpu_session.sh [part]
#   part = check  : calibrate, demo, cuda tests, every app verified at its benchmark size
#   part = bench  : kfuse bench of every app with baselines (JSON + PNG)
#   part = norm   : the normalisation apps on the cuda backend, then kfuse bench of them
#                   beside torch.compile (NORM_APPS: which), and of rows longer than a block
#                   holds (LONG=0: not; LONG_APPS="app:MxN ...": which), racecheck over rows
#                   held in segments and held columns
#   part = blas   : BLAS variants per group (experiments/blas_experiments.py), then the BLAS
#                   benchmark with cuBLAS / torch.compile baselines, autotuned per group
#   part = sanitize : compute-sanitizer's memcheck, racecheck and synccheck over every
#                   generated kernel of the apps (tools/sanitize_apps.py)
#   part = dtypes : the dtype tests on the cuda backend, and Harris of a uint8 image against
#                   its floor (benchmarks/integer_image_bench.py)
#   part = calls  : the C call path's tests and the compiled pipelines' cuda tests, then what
#                   a call from Python costs (benchmarks/call_cost.py, QUICK=1: small sizes)
#   part = fuzz   : kfuse fuzz on the cuda backend (SEEDS, default 0:300) beside the cpu
#                   backend on the other cores (CPU_SEEDS, default 300:5300), and a slice
#                   of the cuda cases under memcheck
set -uo pipefail
part="${1:-check}"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
APPS="harris shi_tomasi sobel unsharp enhance night diffusion3d"
# The device's copy of the working tree can carry stale git metadata: name the sources by a
# digest of their contents too (the same command in a checkout gives the commit's digest).
digest=$(find kfuse benchmarks experiments tools -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort \
         | xargs cat | sha256sum | cut -c1-12)
echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "sources $digest part $part"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
if [ "$part" = check ]; then
  python3 -m kfuse calibrate 2>&1 | tee "$OUT/calibrate.txt"
  python3 -m kfuse demo --backend cuda 2>&1 | tee "$OUT/demo.txt"
  python3 -m pytest -q tests/test_cuda_backend.py 2>&1 | tail -5 | tee "$OUT/pytest_cuda.txt"
  python3 benchmarks/verify_apps.py --backend cuda $APPS 2>&1 | tee "$OUT/run_verify.jsonl"
  python3 benchmarks/fp32_math_check.py 2>&1 | tee "$OUT/fp32_math.txt"
  python3 -m kfuse run harris --resources 2>&1 | tee "$OUT/resources.txt"
fi
if [ "$part" = blas ]; then
  python3 -m kfuse calibrate > "$OUT/calibrate.txt" 2>&1
  python3 experiments/blas_experiments.py --no-calibrate --budget 150 \
    --json "$OUT/blas_experiments.json" 2>&1 | tee "$OUT/blas_experiments.txt" | grep -E "whole|^=="
  python3 benchmarks/blas_bench.py --rank 4 --autotune 4 --json "$OUT/blas_bench.json" 2>&1 \
    | tee "$OUT/blas_bench.txt"
fi
if [ "$part" = norm ]; then
  python3 -m kfuse calibrate > "$OUT/calibrate.txt" 2>&1
  python3 -m pytest -q tests/test_cuda_backend.py -k "segments or (blas_apps and (norm or softmax or entropy or standardise))" \
    2>&1 | tail -3 | tee "$OUT/pytest_norm_cuda.txt"
  python3 -m kfuse bench ${NORM_APPS:-rmsnorm layernorm logsoftmax softmax crossentropy colstandardise} \
    --json "$OUT/norm.json" 2>&1 | tee "$OUT/norm.txt"
  # rows longer than a block holds (held in segments), beside torch.compile (LONG=0: none)
  if [ "${LONG:-1}" = 1 ]; then
    for spec in ${LONG_APPS:-logsoftmax:512x131072 crossentropy:512x131072 \
                rmsnorm:1024x65536 layernorm:1024x65536 colstandardise:2048x32768}; do
      python3 -m kfuse bench "${spec%%:*}" --size "${spec#*:}" --no-calls 2>&1 \
        | tee -a "$OUT/norm_long.txt"
    done
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -x \
      tests/test_cuda_backend.py -k "segments and (layernorm or colstandardise)" 2>&1 \
      | tail -4 \
      | tee "$OUT/segments_racecheck.txt"
  fi
fi
if [ "$part" = bench ]; then
  python3 -m kfuse bench $APPS --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 \
    | tee "$OUT/bench.txt"
fi
if [ "$part" = sanitize ]; then
  for tool in memcheck racecheck synccheck; do
    timeout "${SANITIZE_TIMEOUT:-180}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 tools/sanitize_apps.py > "$OUT/sanitize-$tool.txt" 2>&1
    echo "== $tool exit $?: $(grep -c ' ok$' "$OUT/sanitize-$tool.txt") programs ok," \
         "$(grep -c 'WRONG' "$OUT/sanitize-$tool.txt") wrong;" \
         "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.txt" | tail -1)" \
      | tee -a "$OUT/sanitize-summary.txt"
  done
fi
if [ "$part" = dtypes ]; then
  python3 -c "import ml_dtypes, torch, cupy; print('ml_dtypes', ml_dtypes.__version__)"
  python3 -m pytest -q -rs tests/test_dtypes.py -k "cuda or torch" 2>&1 | tail -15 \
    | tee "$OUT/pytest_dtypes_cuda.txt"
  python3 benchmarks/integer_image_bench.py --dtype uint8 --json "$OUT/harris_uint8.json" \
    2>&1 | tee "$OUT/harris_uint8.txt"
fi
if [ "$part" = calls ]; then
  python3 -c "import sysconfig; print('Python.h in', sysconfig.get_paths()['include'])"
  KFUSE_LOG=info python3 -c "from kfuse.runtime import native; print('C call path', native.module())"
  python3 -m pytest -q -rs tests/test_native_call.py tests/test_compiled.py tests/test_streams.py \
    tests/test_cuda_backend.py -k "native or compiled or stream or torch" 2>&1 | tail -15 \
    | tee "$OUT/pytest_calls.txt"
  python3 benchmarks/call_cost.py ${QUICK:+--quick} --json "$OUT/call_cost.json" 2>&1 \
    | tee "$OUT/call_cost.txt"
fi
if [ "$part" = fuzz ]; then
  timeout "${FUZZ_TIMEOUT:-500}" python3 -m kfuse fuzz --seeds "${CPU_SEEDS:-300:5300}" \
    --jobs "${CPU_JOBS:-10}" --json > "$OUT/fuzz-cpu.jsonl" 2> "$OUT/fuzz-cpu.err" &
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m kfuse fuzz \
    --seeds 0:8 --backend cuda --json > "$OUT/fuzz-cuda-memcheck.txt" 2>&1
  echo "== memcheck over fuzz 0:8 exit $?: $(grep -E 'ERROR SUMMARY' \
    "$OUT/fuzz-cuda-memcheck.txt" | tail -1)" | tee -a "$OUT/fuzz-summary.txt"
  timeout "$(( ${FUZZ_TIMEOUT:-500} - 100 ))" python3 -m kfuse fuzz --seeds "${SEEDS:-8:300}" \
    --backend cuda --jobs "${CUDA_JOBS:-4}" --json > "$OUT/fuzz-cuda.jsonl" 2> "$OUT/fuzz-cuda.err"
  wait
  pkill -f "kfuse fuzz" || true  # (the workers of a run its timeout ended)
  for backend in cuda cpu; do
    python3 - "$OUT/fuzz-$backend.jsonl" "$backend" <<'PY' | tee -a "$OUT/fuzz-summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
cases = [r for r in rows if "seed" in r]
bad = [r for r in cases if r["status"] != "ok"]
seeds = [r["seed"] for r in cases]
print(f"== fuzz {sys.argv[2]}: {len(cases)} cases (seeds {min(seeds, default=None)}..."
      f"{max(seeds, default=None)}), {len(bad)} not ok")
for r in bad[:20]:
    print("  ", r["status"], r["case"][:200], r["message"][:300])
PY
  done
fi

