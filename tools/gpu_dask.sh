#!/usr/bin/env bash
# kfuse over Dask arrays on one and two GPUs, in one device call (repo root; kind
# nvidia-h200-x2; carry .whl, which holds dask/: the wheels of dask[array] and distributed for
# Python 3.12, from `pip download --only-binary=:all: --python-version 3.12 ...`).
source tools/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/dasksite .whl/dask/*.whl || exit 1
export PYTHONPATH="/tmp/dasksite:$PYTHONPATH"
python3 -c "import dask, distributed; print('dask', dask.__version__)"
python3 benchmarks/dask_bench.py ${DASK_ARGS:-} 2>&1 | tee "$OUT/dask_bench.txt"
