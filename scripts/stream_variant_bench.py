"""Generated variants of each app's matrix-row (or vector) group against torch.compile, in
alternating rounds (GPU experiment).

For each app, the program the planner picks is timed beside torch.compile, then the same
program with its row-streaming group (the group whose planned implementation is a stream
variant; else its first map-reduce group, e.g. the vector kernel of MADD) under other
variants: the ``--top`` best-predicted ones and the ``--picks`` list (warp rows and block
rows by default; picks that do not apply to the group are skipped). Every program's outputs are checked against the
planned program's first. Prints each label's median over the rounds and its speed-up over
torch.compile.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/stream_variant_bench.py [app ...] [--top 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from dataclasses import replace

import numpy as np

from kfuse.apps import get_app
from kfuse.bench.timing import print_rounds, time_alternating
from kfuse.codegen import generate
from kfuse.codegen.mapreduce import MapReduceGroup, MapReduceVariant, is_variant_text
from kfuse.errors import KfuseError
from kfuse.runtime import _auto_plan, get_backend
from kfuse.runtime.binding import bind
from kfuse.search.variants import ImplementationSpace

PICKS = ("32x4:r1:i1:w:stream:u16", "32x4:r1:i1:w:stream:u8",
         "512x1:r1:i1:w8:stream:u16", "512x1:r1:i1:w8:stream:u8", "512x1:r1:i1:w:stream:u8",
         "1024x1:r1:i1:w8:stream:u8", "256x1:r1:i1:w8:stream:u16", "256x1:r1:i1:w:stream:u16",
         "256x1:r1:i1:w8:stream:u32")


def hoist_factors(source: str) -> str:
    """Timing only: a row sum of ``p * term`` (``p`` a scalar parameter) accumulates the terms
    and multiplies the row's total by ``p`` once (``sum(p f) = p sum(f)``; rounding differs)."""
    factors = {}
    for var, value in re.findall(r"kf_racc_(\w+)\[kf_k\]\[(?:kf_u|0)\] = kf_combine<0, float>"
                                 r"\(kf_racc_\1\[kf_k\]\[(?:kf_u|0)\], (?:\S+ \? )?\(float\)(v\d+)",
                                 source):
        found = re.search(rf"const float {value} = (p_\w+) \* (v\d+);", source)
        if found:
            factors[var] = found.group(1)
            source = source.replace(found.group(0), f"const float {value} = {found.group(2)};")
    for var, factor in factors.items():
        source = re.sub(rf"((kf_row_{var}|kf_part) = kf_(?:mr_warp|block)_reduce<[^;]*;)",
                        rf"\1 \2 *= {factor};", source)
    return source


def studied_group(plan) -> int | None:
    """Index of the plan's group that runs a stream variant (else the first map-reduce one,
    else the first)."""
    indices = [i for i, g in enumerate(plan.groups) if is_variant_text(g.variant)]
    streams = [i for i in indices if ":stream" in plan.groups[i].variant]
    return (streams or indices or [0])[0]


def compare(name: str, top: int, rounds: int, runs: int, sass_dir: str | None = None,
            picks: tuple[str, ...] = PICKS, hoist: bool = False,
            plain_loads: bool = False) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app(name)
    graph = app.build().graph()
    size = (2**27,) if app.ndim == 1 else (16384, 16384)
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    plan = _auto_plan(graph, given)
    backend = get_backend("cuda")
    planned = backend.prepare(graph, given, plan=plan)
    planned.launch_all()
    expected = {o: planned.buffers[o].copy() for o in graph.outputs}
    runs_by_label = {"compile": compiled_on(graph, given),
                     f"plan {[g.variant for g in plan.groups]}": planned.launch_all}
    if hasattr(app, "planner"):  # BLAS apps: also the implementation space's predicted best
        blas_plan = app.planner(graph, app.sizes(graph, size))
        label = f"blas plan {[g.variant for g in blas_plan.groups]}"
        runs_by_label[label] = backend.prepare(graph, given, plan=blas_plan).launch_all
    index = studied_group(plan)
    if index is not None:
        chosen = plan.groups[index]
        members, outputs = tuple(chosen.members), tuple(chosen.outputs)
        space = ImplementationSpace(graph, app.sizes(graph, size))
        ranked = [c.variant for c in space.choices(members)[:top]]
        group = MapReduceGroup(graph, members, outputs)
        candidates = []
        for text in [*ranked, *("mapreduce:" + p for p in picks)]:
            try:
                normal = group.normalize(MapReduceVariant.parse(text)).text()
            except KfuseError as error:
                print(f"{name}: skipped {text}: {error}", flush=True)
                continue
            if normal not in candidates and normal != chosen.variant:
                candidates.append(normal)
        for variant in candidates:
            groups = [(tuple(g.members), tuple(g.outputs),
                       variant if i == index else g.variant) for i, g in enumerate(plan.groups)]
            program = generate(graph, groups, fixed_sizes=backend.fixed_sizes(bind(graph, given)))
            if hoist:
                program = replace(program, source=hoist_factors(program.source))
            if plain_loads:  # timing only: inputs not restrict, so loads are plain ld.global
                program = replace(program, source=program.source.replace(
                    "const float* __restrict__", "const float*"))
            executable = backend.prepare(graph, given, program=program)
            executable.launch_all()
            error = max(float(cupy.abs(executable.buffers[o] - expected[o]).max()
                              / cupy.abs(expected[o]).max()) for o in graph.outputs)
            rank = ranked.index(variant) + 1 if variant in ranked else None
            registers = "/".join(str(f.num_regs) for f in executable.functions.values())
            label = f"{variant.removeprefix('mapreduce:')} (rank {rank}, r{registers})"
            if sass_dir:
                from kfuse.runtime.cuda_backend import compile_cubin, device_arch
                cubin = compile_cubin(executable.program.source, device_arch())
                done = subprocess.run(["nvdisasm", "-c", str(cubin)], text=True,
                                      capture_output=True)
                listing = done.stdout + done.stderr
                with open(os.path.join(sass_dir, f"{name}-{variant[10:]}.sass".replace(":", "_")),
                          "w") as file:
                    file.write(listing)
            print(f"{name} {label}: error against the plan {error:.1e}", flush=True)
            if error < 1e-4:
                runs_by_label[label] = executable.launch_all
    print_rounds(name, time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*",
                        default=["sgemv", "gesummv", "sgemvt", "atax", "gemver"])
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--sass", default=None, help="write each program's SASS here")
    parser.add_argument("--picks", default=None, help="comma-separated variants (no prefix)")
    parser.add_argument("--matrix-first", action="store_true",
                        help="each chunk's matrix loads before its vectors' (MATRIX_FIRST)")
    parser.add_argument("--plain-loads", action="store_true",
                        help="timing only: inputs without __restrict__ (plain, not .nc, loads)")
    parser.add_argument("--hoist", action="store_true",
                        help="timing only: row sums of p * term multiply by p once per row")
    args = parser.parse_args()
    picks = tuple(args.picks.split(",")) if args.picks else PICKS
    if args.matrix_first:
        import kfuse.codegen.mapreduce_stream as stream
        stream.MATRIX_FIRST = True
    for name in args.apps:
        compare(name, args.top, args.rounds, args.runs, args.sass, picks, args.hoist,
                args.plain_loads)


if __name__ == "__main__":
    main()
