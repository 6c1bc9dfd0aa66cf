export PYTHONPATH=$PWD KFUSE_CACHE_DIR=/tmp/kc PYTHONUNBUFFERED=1
FORMS="streamed streamed:p6 streamed:t64" bash tools/gpu_streamed.sh 2>&1 | grep -v "warning #177\|declared but never\|^\s*\^\|^$\|const int row_\|Remark"
timeout 240 ncu --kernel-name regex:smooth2d_u1_u2_u3_u4 --launch-skip 2 --launch-count 1 --section SchedulerStats --section WarpStateStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis python3 experiments/timesteps_experiment.py smooth2d --forms streamed --rounds 1 --runs 2 > $OUT/ncu_smooth2d.txt 2>&1
grep -E "Issue Slots Busy|Issued Ipc|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|DRAM Throughput|Memory Throughput|Duration|Compute \(SM\)" $OUT/ncu_smooth2d.txt | head -40
python3 -m kfuse calibrate > $OUT/calibrate.txt 2>&1; tail -2 $OUT/calibrate.txt
python3 -m kfuse bench smooth2d wave2d --json $OUT/steps.json 2>&1 | tee $OUT/steps_bench.txt | tail -20
