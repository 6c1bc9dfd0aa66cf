#!/usr/bin/env bash
# Rows held whole by the blocks of a thread-block cluster (issue 29), in one device call:
# the cuda tests of held rows (clusters, segments, held columns) and of the normalisation
# apps, racecheck over the cluster cases, rows in clusters beside rows in segments and
# torch.compile (experiments/held_rows_norm_experiment.py --clusters), then kfuse bench of
# the long rows (a call from Python too) and of the benchmark sizes.
# Usage (device machine, repo root): bash tools/gpu_clusters.sh
source tools/gpu_setup.sh
LONG="rmsnorm:1024x65536 layernorm:1024x65536 logsoftmax:512x131072 crossentropy:512x131072 softmax:1024x128256"
python3 -m pytest -q tests/test_cuda_backend.py \
  -k "segments or (blas_apps and (norm or softmax or entropy or standardise))" 2>&1 \
  | tail -5 | tee "$OUT/pytest_clusters_cuda.txt"
timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -x \
  tests/test_cuda_backend.py -k "segments and cl and (layernorm or softmax)" 2>&1 | tail -4 \
  | tee "$OUT/clusters_racecheck.txt"
for spec in $LONG; do
  python3 experiments/held_rows_norm_experiment.py "${spec%%:*}" --size "${spec#*:}" \
    --clusters --rounds "${ROUNDS:-3}" 2>&1 | tee -a "$OUT/clusters_experiment.txt"
done
for spec in $LONG; do
  python3 -m kfuse bench "${spec%%:*}" --size "${spec#*:}" 2>&1 | tee -a "$OUT/bench_long.txt"
done
python3 -m kfuse bench rmsnorm layernorm logsoftmax crossentropy colstandardise --no-calls \
  2>&1 | tee "$OUT/bench_std.txt"
