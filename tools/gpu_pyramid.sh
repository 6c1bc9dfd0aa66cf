#!/usr/bin/env bash
# Pyramids and lookups on the GPU, in one device call (repo root): the cuda tests of reads
# at another resolution and at computed indices and of the pyramid apps, kfuse bench of the
# pyramid apps beside torch.compile (SIZES: which), compute-sanitizer's memcheck over the
# remapped reads, and the fuzzer's cases on the cuda backend (SEEDS, default 0:400).
source tools/gpu_setup.sh
python3 -m pytest -q tests/test_cuda_backend.py -k "pyramid or remapped" 2>&1 | tail -5 \
  | tee "$OUT/pytest_cuda.txt"
for size in ${SIZES:-4096x4096}; do
  python3 -m kfuse bench blend --no-calls --size "$size" --json "$OUT/bench_blend_$size.json" 2>&1 \
    | tee "$OUT/bench_blend_$size.txt"
done
compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x \
  tests/test_cuda_backend.py -k "remapped or (pyramid and 1x1)" > "$OUT/memcheck.txt" 2>&1
tail -3 "$OUT/memcheck.txt"
python3 -m kfuse fuzz --seeds "${SEEDS:-0:400}" --backend cuda 2>&1 | tail -8 | tee "$OUT/fuzz_cuda.txt"
