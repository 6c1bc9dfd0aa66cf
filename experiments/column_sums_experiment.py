"""Column reductions (``Aᵀ y``) with whole columns against atomics and torch.compile, in
alternating rounds (GPU experiment).

For each app, the planned program is timed beside torch.compile, then programs whose
column-reducing group runs under other implementations:

- ``split``: the plan without whole columns (the group's core under its best-predicted
  atomic variant, an epilogue as its own kernel): the form kfuse planned before whole
  columns, one fill and one launch more;
- the ``--top`` best-predicted whole-column variants of the planned group, and ``--picks``;
- ``--masked-twins``: each of these also with its tile mapping's straight pass turned off
  (``kf_full = false``: every tile masked, as before session 10; timing only).

Programs are compiled for their sizes as the backend compiles its own; outputs are checked
against the planned program's first.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/column_sums_experiment.py [app ...] [--top 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from kfuse.bench.experiment import (
    device_case,
    masked_only,
    normalized_variants,
    planned_run,
    run_checked,
)
from kfuse.cli.arguments import POSITIVE_INT
from kfuse.codegen import generate
from kfuse.fusion.legality import split_epilogue
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.fusion.plan import group_outputs, order_groups
from kfuse.runtime import get_backend
from kfuse.schedule.forms import MapReduceVariant, is_variant_text
from kfuse.search.variants import ImplementationSpace
from kfuse.tune.timing import print_rounds, time_alternating

PICKS = ("32x32:r4:i1:w:shuffle:wc", "32x32:r2:i1:w8:shuffle:wc", "32x16:r4:i1:w8:shuffle:wc",
         "32x16:r4:i1:s:shuffle:wc", "32x32:r4:i1:s:shuffle:wc")


def column_group(graph, groups) -> int:
    """Index of the first group with a column reduction."""
    for index, (members, outputs, variant) in enumerate(groups):
        if is_variant_text(variant) and MapReduceGroup(graph, members, outputs).col_reductions():
            return index
    raise SystemExit(f"{graph.name}: no group reduces along columns")


def split_groups(graph, space, groups, index) -> list[tuple]:
    """``groups`` with group ``index`` as its core under the best atomic variant, and its
    epilogue (if any) a kernel of its own."""
    members = groups[index][0]
    core, epilogue = split_epilogue(graph, members)
    atomic = next(c.variant for c in space.choices(tuple(core))
                  if not (is_variant_text(c.variant)
                          and MapReduceVariant.parse(c.variant).whole_columns))
    parts = [(tuple(core), group_outputs(graph, core), atomic)]
    if epilogue:
        parts.append((tuple(epilogue), group_outputs(graph, epilogue),
                      space.choices(tuple(epilogue))[0].variant))
    result = [*groups[:index], *parts, *groups[index + 1:]]
    order = order_groups(graph, [g[0] for g in result])
    return sorted(result, key=lambda group: order.index(tuple(group[0])))


def compare(name: str, top: int, rounds: int, runs: int, picks: tuple[str, ...],
            twins: bool = False) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    graph, given, sizes, plan = case.graph, case.given, case.sizes, case.plan
    space = ImplementationSpace(graph, sizes)
    groups = [(tuple(g.members), tuple(g.outputs), g.variant) for g in plan.groups]
    index = column_group(graph, groups)
    backend = get_backend("cuda")
    planned, expected = planned_run(case, backend)
    runs_by_label = {"compile": compiled_on(graph, given),
                     f"plan {[g[2] for g in groups]}": planned.launch_all}
    members, outputs = groups[index][:2]
    group = MapReduceGroup(graph, members, outputs)
    ranked = [c.variant for c in space.choices(members)
              if is_variant_text(c.variant) and MapReduceVariant.parse(c.variant).whole_columns]
    trials = {"split " + " | ".join(g[2] for g in split_groups(graph, space, groups, index)):
              split_groups(graph, space, groups, index)}
    for normal in normalized_variants(group, [*ranked[:top], *("mapreduce:" + p for p in picks)],
                                      name):
        rank = ranked.index(normal) + 1 if normal in ranked else None
        label = f"{normal.removeprefix('mapreduce:')} (rank {rank})"
        if normal != groups[index][2]:
            trials.setdefault(label, [*groups[:index], (members, outputs, normal),
                                      *groups[index + 1:]])
    programs = {}
    for label, trial in [("plan", plan.kernel_groups), *trials.items()]:
        program = generate(graph, trial, fixed_sizes=sizes)  # as the backend compiles its own
        if label != "plan":
            programs[label] = program
        if twins and "kf_full" in program.source:
            programs[label + ", masked tiles"] = replace(program,
                                                         source=masked_only(program.source))
    for label, program in programs.items():
        executable, error, registers = run_checked(backend, case, program, expected)
        print(f"{name} {label} (registers {registers}): error against the plan {error:.1e}",
              flush=True)
        if error < 1e-4:
            runs_by_label[f"{label} r{registers}"] = executable.launch_all
    print_rounds(name, time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=["sgemvt", "atax", "bicgk", "gemver"])
    parser.add_argument("--top", type=POSITIVE_INT, default=4)
    parser.add_argument("--rounds", type=POSITIVE_INT, default=3)
    parser.add_argument("--runs", type=POSITIVE_INT, default=30)
    parser.add_argument("--picks", default=None, help="comma-separated variants (no prefix)")
    parser.add_argument("--masked-twins", action="store_true",
                        help="timing only: each program also with every tile masked")
    args = parser.parse_args()
    picks = tuple(args.picks.split(",")) if args.picks else PICKS
    for name in args.apps:
        compare(name, args.top, args.rounds, args.runs, picks, args.masked_twins)


if __name__ == "__main__":
    main()
