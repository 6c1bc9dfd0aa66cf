"""Time several fusion plans of each app on the GPU (exploration for the planner).

Usage on the device machine: PYTHONPATH=. python3 scripts/plan_sweep.py [app ...]
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

from kfuse.apps import get_app, list_apps
from kfuse.apps.check import relative_error
from kfuse.bench.timing import time_gpu
from kfuse.fusion.plan import make_plan
from kfuse.runtime import get_backend
from kfuse.search import search


def plans_for(graph, app_size):
    yield "unfused", None
    yield "greedy", search(graph, sizes=graph.bind_shapes(
        {n: app_size for n in graph.inputs}))
    try:
        yield "all-in-one", make_plan(graph, [[k.name for k in graph.kernels]])
    except Exception as error:  # noqa: BLE001 - report and go on
        print(f"  all-in-one illegal: {error}")


def main(names: list[str]) -> None:
    import os

    import kfuse.codegen.kernels as kernels
    tiles = os.environ.get("TILES", f"{kernels.TILE_X}x{kernels.TILE_Y}").split(",")
    for rows in [int(r) for r in os.environ.get("ROWS", str(kernels.ROWS_PER_THREAD)).split(",")]:
        for tile in tiles:
            kernels.ROWS_PER_THREAD = rows
            kernels.TILE_X, kernels.TILE_Y = (int(t) for t in tile.split("x"))
            print(f"== rows per thread: {rows}, tile {tile}")
            sweep(names)


def sweep(names: list[str]) -> None:
    backend = get_backend("cuda")
    for name in names or [a.name for a in list_apps()]:
        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
        given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
        reference = None
        for label, plan in plans_for(graph, app.bench_size):
            executable = backend.prepare(graph, given, plan=plan)
            executable.launch_all()
            result = {k: executable.buffers[k].get() for k in graph.outputs}
            if reference is None:
                reference = result
            error = max(relative_error(result[k], reference[k]) for k in graph.outputs)
            timing = time_gpu(executable.launch_all, warmup=5, repeat=30)
            groups = " | ".join("+".join(g.members) for g in plan.groups) if plan else "-"
            print(f"{name:12s} {label:10s} {timing.median_s * 1e3:8.3f} ms  err {error:.1e}  "
                  f"{groups}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
