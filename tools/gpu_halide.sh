#!/usr/bin/env bash
# The pyramid apps beside torch.compile and Halide on the GPU, in one device call (repo root;
# carry .whl, which holds halide312.tar.xz: the halide wheel for Python 3.12 unpacked,
# its command-line tools and headers left out to fit the call's 64 MiB).
source tools/gpu_setup.sh
mkdir -p /tmp/site && tar xJf .whl/halide312.tar.xz -C /tmp/site || exit 1
export PYTHONPATH="/tmp/site:$PYTHONPATH"
python3 -c "import halide; print('halide', halide.get_host_target())"
python3 benchmarks/pyramid_bench.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/pyramid_bench.txt"
