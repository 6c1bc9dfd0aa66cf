#!/usr/bin/env bash
# kfuse.scaleout on the GPU in one device call (repo root; kind nvidia-h200-x2; carry .whl,
# which holds dask/: the wheels of dask[array] and distributed for Python 3.12): the GPU
# tests of Dask chunks and slabs, then benchmarks/dask_bench.py on one and two GPUs (one-shot
# calls, four in flight, with the chunks' GPU work timed without Dask; and a time loop of
# heat3d exchanging halos every SCALEOUT_PER_EXCHANGE calls; one chunk per GPU; chunks
# in host memory).
source tools/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/dasksite .whl/dask/*.whl || exit 1
export PYTHONPATH="/tmp/dasksite:$PYTHONPATH"
timeout 300 python3 -m pytest -q -p no:logging -m gpu tests/test_dask.py tests/test_slabs.py \
    2>&1 | tail -5 | tee "$OUT/scaleout_tests.txt"
timeout 300 python3 benchmarks/dask_bench.py --gpus 1,2 --apps harris,heat3d --calls 4 \
    --repeat 3 --tasks --direct 2>&1 | grep -E "per call|without|client|rror" \
    | tee "$OUT/dask_bench.txt"
# one chunk per GPU (a domain decomposition: the fewest tasks and halos per call)
timeout 300 python3 benchmarks/dask_bench.py --gpus 1,2 --apps harris,heat3d --calls 4 \
    --repeat 3 --chunks2d 16384,32768 --chunks3d 512,1024,1024 2>&1 \
    | grep -E "per call|rror" | tee "$OUT/dask_bands.txt"
# the scene in host memory (NumPy chunks, each copied to its worker's GPU and back)
timeout 300 python3 benchmarks/dask_bench.py --gpus 1,2 --apps harris,heat3d --calls 2 \
    --repeat 2 --host 2>&1 | grep -E "per call|rror" | tee "$OUT/dask_host.txt"
timeout 300 python3 benchmarks/dask_bench.py --gpus 1,2 --apps heat3d --calls 1 --repeat 3 \
    --steps 8 --per-exchange "${SCALEOUT_PER_EXCHANGE:-4}" 2>&1 \
    | grep -E "per call|rror" | tee "$OUT/dask_steps.txt"
