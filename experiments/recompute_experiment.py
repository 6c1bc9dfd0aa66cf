"""Variants of the fused kernels of 2-D image apps, timed in alternating rounds (GPU experiment).

kfuse.codegen.cexpr sums a 3-tap window ``x[i-1] + x[i] + x[i+1]`` of one expression so
that a thread's neighbouring points share ``x[i] + x[i+1]`` (``window_sums`` of ``kfuse.config``). Here each
app's default program is generated with it on and off, for each register tile of 2-D
recompute groups (``--tiles 8x4,10x4``) and block shape (``--blocks 32x2,32x4``),
compiled for the benchmark size, checked against the float64 reference, timed in
alternating rounds, and the SASS of each program counted by instruction class (nvcc +
cuobjdump, when present: ``tools/dump_sass.py``). ``--sqrt-ftz`` adds, for each, the
program whose float32 square root flushes subnormal inputs and results to zero
(``sqrt.approx.ftz.f32``; timing only).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/recompute_experiment.py [app ...] [--rounds 7] [--tiles T,..]
        [--blocks B,..] [--sqrt-ftz]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.codegen import generate
from kfuse.config import configured
from kfuse.schedule import Recompute
from kfuse.search import search
from kfuse.tune.sass import opcode_counts, sass_of
from kfuse.tune.timing import print_rounds, time_alternating

DEFAULT_APPS = ("harris", "shi_tomasi", "enhance")


def compare(name: str, rounds: int, tiles: list[tuple[int, ...]],
            blocks: list[tuple[int, ...]], sqrt_ftz: bool) -> None:
    import cupy

    from kfuse.runtime import get_backend

    app = get_app(name)
    graph = app.build().graph()
    arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    sizes = app.sizes(graph, app.bench_size)
    reference = app.reference(arrays, params, "clamp")
    backend = get_backend("cuda")
    executables = {}
    default_tile = tiles.REGISTER_TILES[("recompute", 2)]
    default_block = tiles.TILED_BLOCKS[("recompute", 2)]
    for tile, block, (sharing, window_sums), ftz in itertools.product(
            tiles or [default_tile], blocks or [default_block],
            (("pairs shared", True), ("as written", False)), (False, True) if sqrt_ftz else (False,)):
        label = " ".join([sharing, "x".join(map(str, tile)), "in", "x".join(map(str, block))]
                         + ["ftz"] * ftz)
        with configured(window_sums=window_sums):
            plan = search(graph, sizes=sizes)
            groups = [dataclasses.replace(g, form=Recompute(tuple(tile), tuple(block)))
                      if isinstance(g.form, Recompute) else g for g in plan.kernel_groups]
            program = generate(graph, groups, fixed_sizes=sizes)
        if ftz:
            source = program.source.replace("sqrt.approx.f32", "sqrt.approx.ftz.f32")
            if source == program.source:
                continue
            program = dataclasses.replace(program, source=source)
        executable = backend.prepare(graph, given, program=program)
        executable.launch_all()
        error = max(relative_error(executable.buffers[k].get(), reference[k])
                    for k in graph.outputs)
        sass = sass_of(program.source)
        counts = opcode_base_counts(sass) if sass else {}
        floating = sum(v for k, v in counts.items() if k in ("FADD", "FMUL", "FFMA", "MUFU"))
        print(f"{name:11s} {label:32s} error {error:.1e}  SASS {sum(counts.values())} "
              f"(FADD {counts.get('FADD', 0)}, FMUL {counts.get('FMUL', 0)}, "
              f"FFMA {counts.get('FFMA', 0)}, float {floating})", flush=True)
        executables[label] = executable
    runs = {label: executable.launch_all for label, executable in executables.items()}
    print_rounds(name, time_alternating(runs, rounds), next(iter(runs)))


def opcode_base_counts(sass: str) -> dict[str, int]:
    """Instructions by opcode without modifiers (``FMUL.M4`` counts as ``FMUL``)."""
    counts: dict[str, int] = {}
    for opcode, count in opcode_counts(sass).items():
        base = opcode.split(".")[0]
        counts[base] = counts.get(base, 0) + count
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=list(DEFAULT_APPS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiles", default="", help="register tiles of 2-D recompute groups")
    parser.add_argument("--blocks", default="", help="thread blocks of 2-D recompute groups")
    parser.add_argument("--sqrt-ftz", action="store_true",
                        help="also time each program with sqrt.approx.ftz.f32 (timing only)")
    args = parser.parse_args()
    for name in args.apps:
        compare(name, args.rounds, shapes(args.tiles), shapes(args.blocks), args.sqrt_ftz)


def shapes(text: str) -> list[tuple[int, ...]]:
    """``"8x4,10x4"`` -> [(8, 4), (10, 4)]."""
    return [tuple(map(int, item.split("x"))) for item in text.split(",") if item]


if __name__ == "__main__":
    main()
