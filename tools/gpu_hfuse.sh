#!/usr/bin/env bash
# User kernels and horizontal fusion on the GPU, in one device call (repo root):
#   the cuda tests of user kernels and side-by-side kernels, the benchmark pairs
#   (benchmarks/hfuse_bench.py), and compute-sanitizer's racecheck and synccheck over every
#   side-by-side candidate at the pairs' test sizes.
GPU_PART="part ${1:-all}"
source tools/gpu_setup.sh
python3 -m pytest -q tests/test_cuda_backend.py -k "user or side" 2>&1 | tail -5 | tee "$OUT/pytest_cuda.txt"
python3 benchmarks/hfuse_bench.py --json "$OUT/hfuse_bench.json" ${PAIRS:-} 2>&1 | tee "$OUT/hfuse_bench.txt"
[ "${SANITIZE:-1}" = 1 ] && for tool in racecheck synccheck; do
  compute-sanitizer --tool "$tool" --print-limit 20 python3 benchmarks/hfuse_bench.py --sanitize \
    > "$OUT/sanitize_$tool.txt" 2>&1
  tail -3 "$OUT/sanitize_$tool.txt"
done
