"""Time every app on the GPU over several register tiles (rows x columns per thread).

For each tile: the unfused program (each kernel timed alone too, as % of copy bandwidth),
the greedy plan, and everything in one kernel (recompute and staged variants where legal).
Exploration for the defaults in ``kfuse.schedule.tiles``; results in docs/journal/benchmarks.md.

Usage on the device machine: TILES=8x1,8x4,8x2x4 (a 3-part tile applies to 3-D apps; none:
the defaults)
ITEMS=4,8 (points per thread of flat kernels with special functions, swept first)
BLOCKS=64x4x0,32x4x4 (threads along x and y per block, blocks per SM asked of the compiler)
FUSED_ONLY=1 times only the fused programs
PYTHONPATH=. python3 benchmarks/tile_sweep.py [app ...]
"""

from __future__ import annotations

import os
import sys

import cupy
import numpy as np

from kfuse.apps import get_app, list_apps
from kfuse.apps.check import relative_error
from kfuse.bench.floor import dram_floor_bytes, launch_bytes
from kfuse.codegen import generate as generate_program
from kfuse.config import configured
from kfuse.fusion.plan import group_outputs, make_plan
from kfuse.runtime import compiles_for_sizes, get_backend
from kfuse.search import search
from kfuse.tune.calibrate import calibrate
from kfuse.tune.timing import time_gpu


def programs(graph, sizes):
    """(label, program) of each plan timed, compiled for ``sizes`` as the cuda backend does
    (unless KFUSE_SPECIALISE_SIZES=0)."""
    fused_only = bool(os.environ.get("FUSED_ONLY"))
    fixed = sizes if compiles_for_sizes("cuda") else None

    def generate(graph, groups=None):
        return generate_program(graph, groups, fixed_sizes=fixed)

    if not fused_only:
        yield "unfused", generate(graph)
    plan = search(graph, sizes=sizes)
    yield "greedy[" + ",".join(g.variant for g in plan.groups if len(g.members) > 1) + "]", \
        generate(graph, plan.kernel_groups)
    everything = tuple(k.name for k in graph.kernels)
    try:
        make_plan(graph, [everything], check_resources=False)
    except Exception:  # noqa: BLE001 - an illegal grouping is simply not timed
        return
    outputs = group_outputs(graph, everything)
    for variant in ("recompute",) if fused_only else ("recompute", "staged"):
        try:
            yield f"all-{variant}", generate(graph, [(everything, outputs, variant)])
        except Exception as error:  # noqa: BLE001 - variant not applicable
            print(f"    all-{variant}: {error}")


def sweep(names: list[str], bandwidth: float) -> None:
    backend = get_backend("cuda")
    for name in names:
        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
        given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
        reference = None
        floor_s = None
        for label, program in programs(graph, graph.bind_shapes(
                {n: app.bench_size for n in graph.inputs})):
            executable = backend.prepare(graph, given, program=program)
            sizes = executable.bound.sizes
            floor_s = floor_s or dram_floor_bytes(graph, sizes) / bandwidth
            executable.launch_all()
            result = {k: executable.buffers[k].get() for k in graph.outputs}
            reference = reference or result
            error = max(relative_error(result[k], reference[k]) for k in graph.outputs)
            timing = time_gpu(executable.launch_all, warmup=5, repeat=30)
            print(f"  {name:12s} {label:28s} {timing.median_s * 1e3:8.3f} ms "
                  f"{timing.median_s / floor_s:5.2f}x floor  err {error:.1e}", flush=True)
            if label == "unfused":
                for spec in program.launches:
                    one = time_gpu(lambda spec=spec, run=executable: run.launch_one(spec),
                                   warmup=3,
                                   repeat=30)
                    share = launch_bytes(graph, spec, sizes) / one.median_s / bandwidth
                    print(f"      {spec.symbol:36s} {one.median_s * 1e3:7.3f} ms "
                          f"{100 * share:5.1f}% of copy", flush=True)


def main(names: list[str]) -> None:
    bandwidth = calibrate(repeat=20, progress=False).copy_bandwidth_bytes_per_s  # the floor's
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    names = names or [a.name for a in list_apps()]
    for items in os.environ.get("ITEMS", "").split(","):
        if items:  # points per thread of flat kernels with special functions
            print(f"== {items} points per thread (flat kernels with special functions)")
            with configured(items_per_thread_special=int(items)):
                sweep(names, bandwidth)
    tiles = [t for t in os.environ.get("TILES", "").split(",") if t]
    blocks = [b for b in os.environ.get("BLOCKS", "").split(",") if b]
    if os.environ.get("ITEMS") and not (tiles or blocks):
        return
    for block in blocks or [None]:
        # threads along x, along y, blocks per SM asked of the compiler (None: the defaults)
        tile_block = tuple(int(b) for b in block.split("x")) if block else None
        for tile in tiles or [None]:
            register_tile = tuple(int(t) for t in tile.split("x")) if tile else None
            label = (f"register tile {' x '.join(map(str, register_tile))}" if register_tile
                     else "the default register tiles")
            shape = ("the default blocks of threads" if tile_block is None else
                     f"blocks of {tile_block[0]} x {tile_block[1]} threads, at least "
                     f"{tile_block[2]} per SM")
            print(f"== {label}, {shape}", flush=True)
            with configured(register_tile=register_tile, tile_block=tile_block):
                sweep(names, bandwidth)


if __name__ == "__main__":
    main(sys.argv[1:])
