"""Time-stepped 2-D stencils that are not kfuse's apps: how they plan and how close to the
floor they run, beside torch.compile.

Four pipelines written as a user would (5 Jacobi sweeps of a Poisson problem, 4 passes of a
3x3 box filter under mirrored borders, 3 steps of a doubly periodic shallow-water-like pair
of fields, 5 explicit heat steps under a constant border), each planned by the default
search at 8192², checked against its unfused program and timed against torch.compile in
alternating rounds; the floor is every input read once and every output written once at
the calibrated copy bandwidth.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/heldout_steps_experiment.py [jacobi box shallow heat]
        [--size 8192] [--dtype float64] [--steps 4] [--halves]
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

import kfuse
import kfuse.dsl as kf


def jacobi(steps: int = 5, dtype: str = "float32") -> kf.Pipeline:
    p = kf.Pipeline("jacobi")
    u = p.input("u", ndim=2, dtype=dtype)
    f = p.input("f", shape=u.shape, dtype=dtype)
    for step in range(steps):
        u = kf.local(0.25 * (u.at(-1, 0) + u.at(1, 0) + u.at(0, -1) + u.at(0, 1)) - 0.1 * f,
                     name=f"j{step}")
    p.output(u)
    return p


def box(steps: int = 4, dtype: str = "float32") -> kf.Pipeline:
    p = kf.Pipeline("box")
    u = p.input("u", ndim=2, dtype=dtype)
    for step in range(steps):
        total = None
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                total = u.at(dy, dx) if total is None else total + u.at(dy, dx)
        u = kf.local(total * (1.0 / 9.0), boundary="mirror", name=f"b{step}")
    p.output(u)
    return p


def shallow(steps: int = 3, dtype: str = "float32") -> kf.Pipeline:
    p = kf.Pipeline("shallow")
    h = p.input("h", ndim=2, dtype=dtype)
    u = p.input("u", shape=h.shape, dtype=dtype)
    for step in range(steps):
        h_next = kf.local(h - 0.1 * (u.at(0, 1) - u.at(0, -1))
                          + 0.05 * (h.at(1, 0) + h.at(-1, 0) - 2.0 * h),
                          boundary="repeat", name=f"h{step}")
        u = kf.local(u - 0.1 * (h_next.at(0, 1) - h_next.at(0, -1)), boundary="repeat",
                     name=f"u{step}")
        h = h_next
    p.output(h, u)
    return p


def heat(steps: int = 5, dtype: str = "float32") -> kf.Pipeline:
    p = kf.Pipeline("heat")
    u = p.input("u", ndim=2, dtype=dtype)
    c = p.param("c", dtype=dtype)
    for step in range(steps):
        u = kf.local(u + c * (u.at(-1, 0) + u.at(1, 0) + u.at(0, -1) + u.at(0, 1) - 4.0 * u),
                     boundary=kfuse.constant(0.0), name=f"t{step}")
    p.output(u)
    return p


PIPELINES = (jacobi, box, shallow, heat)


def halves_program(case) -> object:
    """``case``'s chain as two recompute kernels, the first half of its steps and the rest
    (what the planner picks where one streamed kernel is refused)."""
    from kfuse.codegen import generate
    from kfuse.runtime.backend import VECTOR_ALIGNMENT

    members = tuple(k.name for k in case.graph.kernels)
    middle = len(members) // 2
    readers = {name for k in case.graph.kernels[middle:] for name in k.reads}
    first_outputs = tuple(m for m in members[:middle]
                          if m in readers or m in case.graph.outputs)
    return generate(case.graph, [(members[:middle], first_outputs, "recompute"),
                                 (members[middle:], tuple(o for o in case.graph.outputs
                                                          if o in members[middle:]),
                                  "recompute")],
                    fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)


def main() -> None:
    import cupy

    from experiments.timesteps_experiment import flat_sums_program
    from kfuse.bench.experiment import DeviceCase, planned_program, time_sources
    from kfuse.model.device import current_profile
    from kfuse.search import default_plan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", help="which (default: all)")
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--least-blocks", type=int, nargs="*", default=[],
                        help="also the planned program asking at least this many blocks "
                             "per SM of the compiler (__launch_bounds__, a source patch)")
    parser.add_argument("--dtype", default="float32", help="float32 or float64")
    parser.add_argument("--steps", type=int, default=0, help="steps (default: each one's own)")
    parser.add_argument("--halves", action="store_true",
                        help="also the chain as two recompute kernels of half its steps each")
    args = parser.parse_args()
    profile = current_profile()
    for build in PIPELINES:
        if args.pipelines and build.__name__ not in args.pipelines:
            continue
        graph = (build(args.steps, dtype=args.dtype) if args.steps
                 else build(dtype=args.dtype)).graph()
        rng = np.random.default_rng(0)
        shape = (args.size, args.size)
        given = {name: cupy.asarray(rng.uniform(0.5, 2.0, shape).astype(args.dtype))
                 for name in graph.inputs} | {name: 0.1 for name in graph.params}
        sizes = graph.bind_shapes({name: shape for name in graph.inputs})
        plan = default_plan(graph, sizes=sizes, profile=profile)
        case = DeviceCase(SimpleNamespace(name=graph.name), graph, given, sizes, plan)
        floor = sum(graph.nbytes(name, sizes) for name in (*graph.inputs, *graph.outputs)) \
            / profile.copy_bandwidth_bytes_per_s
        print(f"== {graph.name} {args.size}²: planned "
              f"{[(len(g.members), g.form.text()) for g in plan.groups]}, floor "
              f"{floor * 1e3:.4f} ms", flush=True)
        programs = {"planned": planned_program(case),
                    "planned, flat sums": flat_sums_program(case)}
        if args.halves:
            programs["two recompute kernels"] = halves_program(case)
        for least in args.least_blocks:
            program = programs["planned"]
            programs[f"planned, {least} blocks per SM"] = replace(
                program, source=re.sub(r"__launch_bounds__\((\d+)\)",
                                       rf"__launch_bounds__(\1, {least})", program.source))
        time_sources(case, programs, args.rounds, args.runs)


if __name__ == "__main__":
    main()
