"""3-D fused kernels whose blocks walk consecutive plane chunks (GPU experiment, issue 3).

Nsight Compute finds the fused diffusion3d kernel 81% L2-busy: each block loads its input
planes again for the halo that the next chunk along z shares. Here the generated kernel's
grid-stride loop over plane chunks is patched into a loop over *consecutive* chunks, and
the kernel is launched with fewer blocks along z, so a block's next chunk may find the
shared halo planes still in L1. Each patched result is checked against the unpatched one.

Usage on the device machine: PYTHONPATH=. python3 scripts/zloop_experiment.py [app ...]
(Z_BLOCKS=32,16,8,4 blocks along z)
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.bench.calibrate import calibrate
from kfuse.bench.floor import dram_floor_bytes
from kfuse.bench.timing import time_gpu
from kfuse.codegen import generate
from kfuse.runtime import get_backend
from kfuse.search import search

LOOP = re.compile(r"for \(int iz = \(blockIdx\.z\) \* (\d+); iz < (\w+);\n\s*"
                  r"iz \+= gridDim\.z \* \d+\) \{\n")


def contiguous(source: str) -> str:
    """``source`` with each block walking consecutive chunks of planes."""
    match = LOOP.search(source)
    rows, depth = match.group(1), match.group(2)
    span = f"((({depth} + {rows} * gridDim.z - 1) / ({rows} * gridDim.z)) * {rows})"
    loop = (f"for (int iz = blockIdx.z * {span}; iz < {depth} && "
            f"iz < (blockIdx.z + 1) * {span}; iz += {rows}) {{\n")
    return source[:match.start()] + loop + source[match.end():]


def main(names: list[str]) -> None:
    import cupy

    bandwidth = calibrate(repeat=20, progress=False).copy_bandwidth_bytes_per_s
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    backend = get_backend("cuda")
    z_blocks = [int(v) for v in os.environ.get("Z_BLOCKS", "32,16,8,4").split(",")]
    for name in names or ["diffusion3d"]:
        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
        given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
        plan = search(graph, sizes=graph.bind_shapes({n: app.bench_size for n in graph.inputs}))
        program = generate(graph, plan.kernel_groups)
        executable = backend.prepare(graph, given, program=program)
        executable.launch_all()
        expected = {k: executable.buffers[k].get() for k in graph.outputs}
        floor_s = dram_floor_bytes(graph, executable.bound.sizes) / bandwidth
        (spec,) = program.launches
        args = [executable.argument(spec, param) for param in spec.params]
        grid = spec.grid_size(executable.bound.sizes)
        other = backend.prepare(graph, given, program=dataclasses.replace(
            program, source=contiguous(program.source)))
        for label, runner, blocks in [("generated", executable, grid[2]),
                                      *(("consecutive chunks", other, z) for z in
                                        [grid[2], *z_blocks])]:
            def launch(runner=runner, spec=spec, grid=(grid[0], grid[1], blocks), args=args):
                runner.launch(spec, grid, spec.block, args)
            for output in graph.outputs:
                executable.buffers[output].fill(np.nan)
            launch()
            error = max(relative_error(executable.buffers[k].get(), expected[k])
                        for k in graph.outputs)
            timing = time_gpu(launch, warmup=5, repeat=50)
            print(f"{name:11s} {label:18s} {blocks:3d} blocks along z  "
                  f"{timing.median_s * 1e3:.4f} ms  {timing.median_s / floor_s:.2f}x floor  "
                  f"err {error:.1e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
