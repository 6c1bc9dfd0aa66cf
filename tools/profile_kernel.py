"""Run one app's unfused (or fused) program a few times at its benchmark size (for Nsight Compute).

Usage: ncu -k regex:NAME python3 tools/profile_kernel.py APP [--fused] [--constant V]
    [--dtype float16]
(``--fused``: the default plan's program instead of the unfused one; ``--constant V``: every
read in constant mode with value V instead of the app's boundary mode; ``--dtype``: the
app's dtype where it takes one, float32 by default; CuPy holds no bfloat16)
"""

import sys

import cupy
import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import get_backend

app = get_app(sys.argv[1])
constant = sys.argv.index("--constant") + 1 if "--constant" in sys.argv else 0
dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "float32"
graph = (app.build(boundary=("constant", float(sys.argv[constant]))) if constant
         else app.build(dtype=dtype) if dtype != "float32" else app.build()).graph()
arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), dtype)
given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
plan = None  # one kernel per operator
if "--fused" in sys.argv:
    from kfuse.runtime.binding import bind
    from kfuse.search import default_plan

    plan = default_plan(graph, bind(graph, given).sizes)
executable = get_backend("cuda").prepare(graph, given, plan=plan)
for _ in range(3):
    executable.launch_all()
cupy.cuda.runtime.deviceSynchronize()
