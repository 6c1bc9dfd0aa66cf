"""kfuse and torch.compile writing the very same output buffers (GPU experiment, issue 5).

``interleaved_bench.py`` gives both the same input arrays, but each writes its own outputs:
kfuse's from CuPy's pool, torch.compile's from PyTorch's caching allocator. Session 16 found
that where a streaming kernel's output lies moves its time by up to 0.6% on an H200, as much
as the elementwise sequences' whole gap to torch.compile, whose sign changed between machines.
Here torch.compile also runs a function that stores its results into kfuse's output buffers
(the translated pipeline followed by ``out.copy_(result)``, compiled as one: Inductor writes
the result straight into ``out``), so that both read and write the same memory. Timed in
alternating rounds: torch.compile on its own outputs, torch.compile into kfuse's outputs,
kfuse's planned program, and the ``--variants`` of its first group on the same buffers.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/same_buffers_experiment.py [app ...] [--rounds 7]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from kfuse.bench.experiment import (
    device_case,
    largest_error,
    normalized_variants,
    planned_run,
    run_checked,
)
from kfuse.codegen import generate
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.runtime import get_backend
from kfuse.runtime.backend import VECTOR_ALIGNMENT
from kfuse.tune.timing import print_rounds, time_alternating

APPS = ("waxpby", "sscal", "madd", "vadd", "gesummv", "sgemv")
MAP_VARIANTS = ("mapreduce:128x1:r1:i1:w8:shuffle", "mapreduce:128x1:r1:i1:w:shuffle",
                "mapreduce:256x1:r1:i1:w:shuffle")
ROW_VARIANTS = ("mapreduce:512x1:r1:i1:w8:stream:u16", "mapreduce:512x1:r1:i1:w8:stream:u8",
                "mapreduce:1024x1:r1:i1:w8:stream:u8")


def compiled_into(case, buffers):
    """torch.compile of the pipeline storing its outputs into ``buffers`` (by name): a
    callable of no arguments."""
    import torch

    from kfuse.bench.torch_baseline import COMPILE_MODE, translate

    program = translate(case.graph)
    count = len(program.outputs)

    def into(*arguments):
        for out, result in zip(arguments[:count], program.core(*arguments[count:]),
                               strict=True):
            out.copy_(result)

    compiled = torch.compile(into, dynamic=False, mode=COMPILE_MODE)
    outs = [torch.as_tensor(buffers[name], device="cuda") for name in program.outputs]
    arrays = [torch.as_tensor(case.given[name], device="cuda") for name in program.inputs]
    scalars = program.scalar_values({k: v for k, v in case.given.items()
                                     if isinstance(v, float)})

    def run() -> None:
        compiled(*outs, *arrays, *scalars)

    return run


def plain_loads(source: str) -> str:
    """Timing only: inputs without ``__restrict__``, so that their loads are plain
    ``ld.global`` as Triton's, not the read-only path (``ld.global.nc``)."""
    return source.replace("const float* __restrict__", "const float*")


def compare(name: str, rounds: int, runs: int, variants: tuple[str, ...],
            plain: bool = False) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    graph, plan = case.graph, case.plan
    planned, expected = planned_run(case, get_backend("cuda"))
    labels = {"compile (own outputs)": compiled_on(graph, case.given)}
    into = compiled_into(case, planned.buffers)
    into()
    error = largest_error(planned.buffers, expected)  # torch.compile wrote kfuse's buffers
    assert error < 1e-4, f"{name}: torch.compile into kfuse's outputs differs by {error:.1e}"
    labels["compile (kfuse's outputs)"] = into
    labels[f"kfuse {plan.groups[0].variant}"] = planned.launch_all
    first = plan.groups[0]
    group = MapReduceGroup(graph, tuple(first.members), tuple(first.outputs))
    for variant in normalized_variants(group, variants, name):
        groups = [(tuple(g.members), tuple(g.outputs), variant if i == 0 else g.variant)
                  for i, g in enumerate(plan.groups)]
        program = generate(graph, groups, fixed_sizes=case.sizes,
                           array_alignment=VECTOR_ALIGNMENT)
        forms = {"": program} if variant != first.variant else {}
        if plain:
            forms[", plain loads"] = replace(program, source=plain_loads(program.source))
        for suffix, form in forms.items():
            other, error, _ = run_checked(get_backend("cuda"), case, form, expected,
                                          buffers_of=planned)  # the same buffers
            print(f"{name} {variant}{suffix}: error {error:.1e}", flush=True)
            if error < 1e-5:
                labels[f"kfuse {variant}{suffix}"] = other.launch_all
    print_rounds(name, time_alternating(labels, rounds, repeat=runs),
                 "compile (kfuse's outputs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=list(APPS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--plain-loads", action="store_true",
                        help="each variant also with its inputs' loads plain (no __restrict__)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated map-reduce variants of the first group (default: "
                             "plain maps' or matrix rows' usual ones)")
    args = parser.parse_args()
    for name in args.apps:
        rows = name in ("sgemv", "gesummv", "sgemvt")
        variants = (tuple(v for v in args.variants.split(",") if v) if args.variants
                    else ROW_VARIANTS if rows else MAP_VARIANTS)
        compare(name, args.rounds, args.runs, variants, args.plain_loads)


if __name__ == "__main__":
    main()
