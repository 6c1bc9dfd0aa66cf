"""Run one app's unfused program once at its benchmark size (for Nsight Compute).

Usage: ncu -k regex:NAME python3 scripts/profile_kernel.py APP
"""

import sys

import cupy
import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import get_backend

app = get_app(sys.argv[1])
graph = app.build().graph()
arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
executable = get_backend("cuda").prepare(graph, {k: cupy.asarray(v) for k, v in arrays.items()}
                                         | params)
for _ in range(3):
    executable.launch_all()
cupy.cuda.runtime.deviceSynchronize()
