# The start of a device call's script (sourced from the repo root): kfuse from the checkout,
# a cache, $OUT, the GPU's name and clocks, and the calibrated profile the models read.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
echo "== $(date -u +%FT%TZ) ${GPU_PART:-}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
python3 -m kfuse calibrate > "$OUT/calibrate.txt" 2>&1
