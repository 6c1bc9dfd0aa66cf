"""Generated kernels specialised to the array sizes, against the generated ones (GPU experiment).

torch.compile (``dynamic=False``) compiles each kernel for one size: loops of known trip
count are unrolled, addresses become immediate offsets. kfuse passes sizes as kernel
arguments. Here every size argument of an app's default program is renamed and the size
defined as a constant at the top of each kernel body (``const int n_A_1 = 16384;``), so
NVRTC compiles the same source for the one size (the mechanism the cuda backend adopted,
kfuse.codegen.specialise; "generated" here is the program with sizes as arguments,
``KFUSE_SPECIALISE_SIZES=0``); ``unroll`` also asks for the stream
kernels' step loops to be unrolled (``#pragma unroll`` before them). Generated and
specialised programs are timed in alternating rounds; results must agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/specialize_experiment.py [app ...] [--rounds 5] [--subsets]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.cli.arguments import POSITIVE_INT
from kfuse.codegen.cexpr import size_var
from kfuse.codegen.specialise import RUNTIME_SUFFIX
from kfuse.runtime import auto_plan, get_backend
from kfuse.tune.timing import print_rounds, time_alternating

DEFAULT_APPS = ("sgemv", "gesummv", "sgemvt", "atax", "bicgk", "harris", "shi_tomasi",
                "diffusion3d", "sobel", "unsharp", "enhance")
STEP_LOOP = "for (; kf_cs + "


def specialise(program, sizes: dict[str, int], unroll: bool,
               only: frozenset[str] | None = None) -> str:
    """``program``'s source with every size argument (or those whose C names ``only``
    lists) a constant of its kernel's body (kfuse.codegen.specialise's mechanism without
    its policy: the outermost axis of 3-D spaces too)."""
    chosen = {symbol: value for symbol, value in sizes.items()
              if only is None or size_var(symbol) in only}
    launches = iter(program.launches)
    lines: list[str] = []
    source = program.source.splitlines()
    index = 0
    while index < len(source):
        line = source[index]
        if line.startswith("KF_KERNEL"):  # the header and its "{": sizes made constants
            launch = next(launches)
            fixed = [p for p in launch.params if p.role == "size" and p.ref in chosen]
            for param in fixed:
                line = re.sub(rf"\bconst int {param.name}\b",
                              f"const int {param.name}{RUNTIME_SUFFIX}", line)
            lines += [line, source[index + 1],
                      *(f"  const int {p.name} = {int(chosen[p.ref])};" for p in fixed)]
            index += 2
            continue
        if unroll and line.lstrip().startswith(STEP_LOOP):
            lines.append(" " * (len(line) - len(line.lstrip())) + "#pragma unroll")
        lines.append(line)
        index += 1
    return "\n".join(lines) + "\n"


def compare(name: str, rounds: int, subsets: bool = False, drop_scales: bool = False
            ) -> None:
    import cupy

    app = get_app(name)
    if app.name in ("sgemv", "gesummv", "sgemvt", "atax", "bicgk"):
        size = (16384, 16384)
    else:
        size = app.bench_size
    graph = app.build().graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    backend = get_backend("cuda")
    generated = backend.prepare(graph, given, plan=auto_plan(graph, given))
    generated.launch_all()
    expected = {k: generated.buffers[k].get() for k in graph.outputs}
    variants = {"generated": generated}
    for unroll in (False, True):
        source = specialise(generated.program, generated.bound.sizes, unroll)
        if unroll and STEP_LOOP not in source:
            continue
        program = dataclasses.replace(generated.program, source=source)
        executable = backend.prepare(graph, given, program=program)
        executable.launch_all()
        error = max(relative_error(executable.buffers[k].get(), expected[k])
                    for k in graph.outputs)
        assert error < 1e-5, f"{name}: specialised result differs by {error:.1e}"
        variants["specialised" + (" + unroll" if unroll else "")] = executable
    if drop_scales:  # timing only: the masks' constant scales deleted (wrong values; since
        # kfuse carries constant factors out of fused groups, commit 4b597aa, the fused
        # kernels hold no such multiplications and this variant equals "specialised")
        source = specialise(generated.program, generated.bound.sizes, False)
        for scale in ("0.16666666666666666f * ", "0.0625f * "):
            source = source.replace(scale, "")
        program = dataclasses.replace(generated.program, source=source)
        variants["specialised, no scales (wrong)"] = backend.prepare(graph, given,
                                                                     program=program)
    names = sorted({size_var(symbol) for symbol in generated.bound.sizes})
    for count in range(1, len(names)) if subsets else ():
        for chosen in itertools.combinations(names, count):
            source = specialise(generated.program, generated.bound.sizes, False,
                                frozenset(chosen))
            program = dataclasses.replace(generated.program, source=source)
            variants["only " + ",".join(chosen)] = backend.prepare(graph, given,
                                                                   program=program)
    runs = {label: executable.launch_all for label, executable in variants.items()}
    print_rounds(name, time_alternating(runs, rounds, repeat=30, warmup=3), "generated")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=list(DEFAULT_APPS))
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--subsets", action="store_true",
                        help="also every proper subset of the sizes made constant")
    parser.add_argument("--drop-scales", action="store_true",
                        help="also time the specialised program without the masks' constant "
                             "scales (timing only: its values are wrong)")
    args = parser.parse_args()
    os.environ["KFUSE_SPECIALISE_SIZES"] = "0"  # "generated": sizes as arguments
    for name in args.apps:
        compare(name, args.rounds, args.subsets, args.drop_scales)


if __name__ == "__main__":
    main()
