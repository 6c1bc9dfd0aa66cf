"""SASS of a hand-written block-row GEMV of block_row_gemv_experiment.py (GPU machine: nvcc
and cuobjdump). The generated kernels' SASS: tools/dump_sass.py (``--variant``).

Usage: PYTHONPATH=. python3 experiments/hand_gemv_sass.py sgemv|gesummv THREADS WIDTH
"""

import importlib.util
import os
import sys

from kfuse.tune.sass import sass_of

spec = importlib.util.spec_from_file_location(
    "block_row", os.path.join(os.path.dirname(__file__), "block_row_gemv_experiment.py"))
block_row = importlib.util.module_from_spec(spec)
spec.loader.exec_module(block_row)
app, threads, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(sass_of(block_row.source(app, 16384, threads, width, 0)))
