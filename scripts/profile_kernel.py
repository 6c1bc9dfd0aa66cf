"""Run one app's unfused program once at its benchmark size (for Nsight Compute).

Usage: ncu -k regex:NAME python3 scripts/profile_kernel.py APP [--fused]
(``--fused``: the default plan's program instead of the unfused one)
"""

import sys

import cupy
import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import get_backend

app = get_app(sys.argv[1])
graph = app.build().graph()
arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
plan = None  # one kernel per operator
if "--fused" in sys.argv:
    from kfuse.search import search

    plan = search(graph, sizes=graph.bind_shapes({n: app.bench_size for n in graph.inputs}))
executable = get_backend("cuda").prepare(graph, given, plan=plan)
for _ in range(3):
    executable.launch_all()
cupy.cuda.runtime.deviceSynchronize()
