"""Time each unfused stencil kernel, and whole fused apps, as tiled vs staged-inputs kernels.

Usage on the device machine: PYTHONPATH=. python3 experiments/variant_sweep.py [app ...]
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

from kfuse.apps import get_app
from kfuse.bench.floor import launch_bytes
from kfuse.codegen import generate
from kfuse.codegen.kernels import staged_tile
from kfuse.codegen.staged import can_stage
from kfuse.model.device import current_profile
from kfuse.runtime import get_backend
from kfuse.tune.timing import time_gpu

TILE = staged_tile()


def main(names: list[str]) -> None:
    backend = get_backend("cuda")
    copy = current_profile().copy_bandwidth_bytes_per_s
    for name in names or ["harris", "sobel", "unsharp", "diffusion3d"]:
        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
        given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
        for variant in ("auto", "staged-inputs"):
            groups = [((k.name,), (k.output,),
                       variant if can_stage(graph, (k.name,), TILE, True) is None else "auto")
                      for k in graph.topological_kernels()]
            executable = backend.prepare(graph, given, program=generate(graph, groups))
            executable.launch_all()
            for spec in executable.program.launches:
                timing = time_gpu(lambda s=spec, e=executable: e.launch_one(s), warmup=3, repeat=30)
                nbytes = launch_bytes(graph, spec, executable.bound.sizes)
                share = nbytes / timing.median_s / copy
                print(f"{name:12s} {variant:14s} {spec.symbol:28s} {timing.median_s * 1e3:7.3f} ms"
                      f" {share * 100:5.1f}% of copy", flush=True)
        members = tuple(k.name for k in graph.kernels)
        for variant in ("staged", "staged-inputs"):
            if can_stage(graph, members, TILE, variant == "staged-inputs") is not None:
                continue
            program = generate(graph, [(members, tuple(graph.outputs), variant)])
            executable = backend.prepare(graph, given, program=program)
            timing = time_gpu(executable.launch_all, warmup=3, repeat=30)
            print(f"{name:12s} all-in-one {variant:14s} {timing.median_s * 1e3:7.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
