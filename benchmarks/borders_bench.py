"""Border handling of the stencil apps: the edge test against a partitioned iteration space
(GPU benchmark; kfuse.schedule.borders, Membarth 2013 ch. 5).

For each app, its planned program (compiled for its sizes) is generated three times: every
tiled kernel with the edge test, every one partitioned, and as the benefit model chooses
per kernel (the default). Each is run once and checked against the edge-test program's
outputs, then all are timed in alternating rounds. Prints the model's gain G per kernel and
one line per program (median ms, speed-up over the edge test, every round).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 benchmarks/borders_bench.py [app ...] [--rounds 5] [--runs 30]
"""

from __future__ import annotations

from dataclasses import replace

from kfuse.bench.experiment import device_case, run_checked
from kfuse.cli.arguments import alternating_main
from kfuse.schedule import borders
from kfuse.schedule.forms import GroupSchedule, Single, Tiled, default_form

STENCIL_APPS = ["harris", "shi_tomasi", "sobel", "unsharp", "enhance", "night", "diffusion3d"]


def form_of(graph, group: GroupSchedule):
    """The form ``group`` is generated under (its own, else the default)."""
    return group.form or (Single() if len(group.members) == 1
                          else default_form(graph, group.members))


def with_borders(graph, groups: list[GroupSchedule], choice: str | None) -> list[GroupSchedule]:
    """``groups`` with every tiled form's border handling set to ``choice``."""
    chosen = []
    for group in groups:
        form = form_of(graph, group)
        if isinstance(form, Tiled):
            group = replace(group, form=replace(form, borders=choice))
        chosen.append(group)
    return chosen


def compare(name: str, rounds: int, runs: int) -> None:
    from kfuse.codegen import generate
    from kfuse.runtime import get_backend
    from kfuse.runtime.backend import VECTOR_ALIGNMENT
    from kfuse.tune.timing import print_rounds, time_alternating

    case = device_case(name)
    backend = get_backend("cuda")
    groups = list(case.plan.kernel_groups)
    programs = {label: generate(case.graph, with_borders(case.graph, groups, choice),
                                fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)
                for label, choice in (("edge test", "edge_test"),
                                      ("partitioned", "partitioned"), ("model", None))}
    for group in groups:
        estimate = None
        form = form_of(case.graph, group)
        if isinstance(form, Tiled):
            kernels = [case.graph.kernel_by_name[m] for m in group.members]
            tile, block = form.shape(kernels, len(kernels[-1].domain))
            estimate = borders.estimate(case.graph, group.members, group.outputs, tile,
                                        block, case.sizes)
        if estimate is not None:
            print(f"{name} {'+'.join(group.members)}: G {estimate.gain:.4f}, interior "
                  f"{estimate.interior_share:.1%}, {estimate.checks_left_out:.0f} checks "
                  "left out per interior thread", flush=True)
    first, expected = None, None
    labels = {}
    for label, program in programs.items():
        if expected is None:
            first = backend.prepare(case.graph, case.given, program=program)
            first.launch_all()
            expected = {o: first.buffers[o].copy() for o in case.graph.outputs}
            labels[label] = first.launch_all
            continue
        executable, error, registers = run_checked(backend, case, program, expected)
        print(f"{name} {label}: error {error:.1e}, registers {registers}", flush=True)
        if error < 1e-6:
            labels[label] = executable.launch_all
    print_rounds(name, time_alternating(labels, rounds, repeat=runs), "edge test")


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, STENCIL_APPS, rounds=5, runs=30)


if __name__ == "__main__":
    main()
