"""Fused 2-D register-tile kernels with their next tiles' inputs bulk-prefetched into L2 (GPU).

An experiment for issue 3, not part of kfuse: the generated fused kernel of each app is
patched so that, at the start of each of its tiles, a block asks the copy engine
(``cp.async.bulk.prefetch.L2``, sm_90) for the input rows of the tile it will compute
``DISTANCE`` tiles later (halo included), and launched with fewer blocks along the rows so
that each block walks several tiles. The question: does DRAM stay busier while the warps
compute (Harris and Shi-Tomasi stop at 1.46-1.53x the floor while their loads are idle
during the arithmetic)? Each patched result is checked against the unpatched one.

Usage on the device machine: PYTHONPATH=. python3 scripts/prefetch_experiment.py [app ...]
(ROWS_OF_BLOCKS=8,16,32,64 blocks along the rows; DISTANCES=0,1,2 tiles ahead, 0: none)
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

LOOP = re.compile(r"for \(int iy = \(blockIdx\.y \* blockDim\.y \+ threadIdx\.y\) \* (\d+); "
                  r"iy < (\w+);\n\s*iy \+= gridDim\.y \* blockDim\.y \* \d+\) \{\n")
HALO_ROWS, HALO_COLUMNS = 4, 8  # at least every app's reach; multiples of 4 columns


def patched(source: str, symbol: str, distance: int) -> str:
    """``source`` with the prefetch of the block's tile ``distance`` steps ahead."""
    start = source.index(f" {symbol}(")
    signature = source[start:source.index(")", start)]
    inputs = re.findall(r"const float\* __restrict__ (\w+)", signature)
    width = re.findall(r"const int (n_\w+_1)", signature)[0]
    match = LOOP.search(source, start)
    rows, height = int(match.group(1)), match.group(2)
    columns = re.search(r"const int ix = \(blockIdx\.x \* blockDim\.x \+ threadIdx\.x\) "
                        r"\* (\d+);", source[start:])
    columns = int(columns.group(1)) if columns else 1
    lines = [
        "{  // experiment: bulk-prefetch the input rows of a later tile into L2",
        f"  const int kf_next = iy - threadIdx.y * {rows} + "
        f"{distance} * gridDim.y * blockDim.y * {rows};",
        f"  const int kf_rows = blockDim.y * {rows} + {2 * HALO_ROWS};",
        "  const int kf_tid = threadIdx.y * blockDim.x + threadIdx.x;",
        f"  const int kf_c0 = max((int)(blockIdx.x * blockDim.x * {columns}) - {HALO_COLUMNS}, 0);",
        f"  const int kf_c1 = min((int)((blockIdx.x + 1) * blockDim.x * {columns}) + "
        f"{HALO_COLUMNS}, {width});",
        f"  const int kf_row = kf_next - {HALO_ROWS} + kf_tid;",
        f"  if (kf_tid < kf_rows && kf_row >= 0 && kf_row < {height} && kf_c1 > kf_c0 && "
        f"{width} % 4 == 0) {{",
    ]
    for name in inputs:
        lines.append(f"    asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: "
                     f"\"l\"({name} + (long long)kf_row * {width} + kf_c0), "
                     f"\"r\"((kf_c1 - kf_c0) * 4) : \"memory\");")
    lines += ["  }", "}"]
    at = match.end()
    return source[:at] + "\n".join(lines) + "\n" + source[at:]


def main(names: list[str]) -> None:
    import cupy

    bandwidth = calibrate(repeat=20, progress=False).copy_bandwidth_bytes_per_s
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    backend = get_backend("cuda")
    block_rows = [int(v) for v in os.environ.get("ROWS_OF_BLOCKS", "8,16,32,64").split(",")]
    distances = [int(v) for v in os.environ.get("DISTANCES", "0,1,2").split(",")]
    for name in names or ["harris", "shi_tomasi", "sobel", "unsharp"]:
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
        timing = time_gpu(executable.launch_all, warmup=5, repeat=50)
        print(f"{name:11s} generated                 {timing.median_s * 1e3:.4f} ms  "
              f"{timing.median_s / floor_s:.2f}x floor", flush=True)
        if len(program.launches) != 1:
            print("  (not one kernel: skipped)")
            continue
        (spec,) = program.launches
        args = [executable.argument(spec, param) for param in spec.params]
        grid = spec.grid_size(executable.bound.sizes)
        for distance in distances:
            try:
                source = patched(program.source, spec.symbol, distance) if distance \
                    else program.source
            except (AttributeError, IndexError, ValueError) as error:
                print(f"  cannot patch: {error}")
                break
            other = backend.prepare(graph, given, program=dataclasses.replace(
                program, source=source))
            for rows_of_blocks in [grid[1], *block_rows]:
                def launch(other=other, spec=spec, grid=(grid[0], rows_of_blocks, grid[2]),
                           args=args):
                    other.launch(spec, grid, spec.block, args)
                for output in graph.outputs:
                    executable.buffers[output].fill(np.nan)
                launch()
                error = max(relative_error(executable.buffers[k].get(), expected[k])
                            for k in graph.outputs)
                timing = time_gpu(launch, warmup=5, repeat=50)
                print(f"{name:11s} prefetch {distance} ahead, {rows_of_blocks:4d} block rows "
                      f"{timing.median_s * 1e3:.4f} ms  {timing.median_s / floor_s:.2f}x floor"
                      f"  err {error:.1e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
