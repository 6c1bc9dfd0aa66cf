export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 experiments/timesteps_experiment.py smooth2d wave2d --check --forms streamed streamed:t64 > $OUT/check.txt 2>&1
echo "check: $(grep -c ' ok$' $OUT/check.txt) ok, $(grep -c WRONG $OUT/check.txt) wrong"; grep -v " ok$" $OUT/check.txt | tail -5
for tool in racecheck synccheck memcheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 experiments/timesteps_experiment.py smooth2d wave2d --check --forms streamed > $OUT/san-$tool.txt 2>&1
  echo "$tool exit $?: $(grep -c ' ok$' $OUT/san-$tool.txt) ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-$tool.txt | tail -1)"
done
python3 experiments/timesteps_experiment.py smooth2d wave2d --forms streamed streamed:t64 streamed:t32 streamed:p3 streamed:p10 streamed:l64 --rounds 3 --runs 20 2>&1 | tee $OUT/timing.txt
