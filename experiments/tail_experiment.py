"""Statistics and a map of them: the held group's tail against a second kernel.

Pipelines whose last operators map a row's (a column's) results alone: the log-sum-exp of
each row (``kfuse.apps.normalise``'s ``logsumexp``), a row's standard deviation, a
cross-entropy of soft targets written as ``ts * (m + log s) - tx`` (four row sums), and the
log-sum-exp of each column. Each planned (one kernel: the tail after the last phase) and
split (the same variant for the statistics, the map of them a kernel of its own, as planned
before the tail existed), checked against each other and timed in alternating rounds beside
torch.compile; the floor is every input read once and every output written once.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/tail_experiment.py [--rows 16384 --cols 4096]
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np

import kfuse.dsl as kf
from kfuse.apps import get_app


def row_deviation() -> kf.Pipeline:
    p = kf.Pipeline("row_deviation")
    x = p.input("x", ndim=2)
    inv_n = p.param("inv_n")
    total = kf.reduce_sum(x, axis=1, name="total")
    centred = x - total.at(0, dims=(0,)) * inv_n
    spread = kf.reduce_sum(centred * centred, axis=1, name="spread")
    p.output(kf.point(kf.sqrt(spread * inv_n), name="deviation"))
    return p


def soft_cross_entropy() -> kf.Pipeline:
    p = kf.Pipeline("soft_cross_entropy")
    x = p.input("x", ndim=2)
    t = p.input("t", shape=x.shape)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    tx = kf.reduce_sum(t * x, axis=1, name="tx")
    ts = kf.reduce_sum(t, axis=1, name="ts")
    p.output(kf.point(ts * (top + kf.log(total)) - tx, name="loss"))
    return p


def column_logsumexp() -> kf.Pipeline:
    p = kf.Pipeline("column_logsumexp")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=0, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(1,))), axis=0, name="total")
    p.output(kf.point(top + kf.log(total), name="lse"))
    return p


def main() -> None:
    import cupy

    from kfuse.bench.experiment import DeviceCase, planned_program, time_sources
    from kfuse.codegen import generate
    from kfuse.model.device import current_profile
    from kfuse.runtime.backend import VECTOR_ALIGNMENT
    from kfuse.search import default_plan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    profile = current_profile()
    shape = (args.rows, args.cols)
    for pipeline in (get_app("logsumexp").build(), row_deviation(), soft_cross_entropy(),
                     column_logsumexp()):
        graph = pipeline.graph()
        rng = np.random.default_rng(0)
        given = {name: cupy.asarray(rng.standard_normal(shape).astype(np.float32) * 2)
                 for name in graph.inputs} | {name: 1.0 / args.cols for name in graph.params}
        sizes = graph.bind_shapes({name: shape for name in graph.inputs})
        plan = default_plan(graph, sizes=sizes, profile=profile)
        case = DeviceCase(SimpleNamespace(name=graph.name), graph, given, sizes, plan)
        programs = {"tail": planned_program(case)}
        held = [group for group in plan.kernel_groups if len(group.members) > 1]
        if len(plan.groups) == 1 and held:
            from kfuse.fusion.legality import split_tail
            _, tail = split_tail(graph, held[0].members)
            rest = [name for name in held[0].members if name not in tail]
            split = pipeline.fuse([rest, list(tail)], forms=[held[0].form, None])
            programs["split"] = generate(graph, split.kernel_groups, fixed_sizes=sizes,
                                         array_alignment=VECTOR_ALIGNMENT)
        floor = sum(graph.nbytes(name, sizes) for name in (*graph.inputs, *graph.outputs)) \
            / profile.copy_bandwidth_bytes_per_s
        print(f"== {graph.name} {shape}: planned "
              f"{[(len(g.members), g.form.text()) for g in plan.groups]}, floor "
              f"{floor * 1e3:.4f} ms", flush=True)
        time_sources(case, programs, args.rounds, args.runs)


if __name__ == "__main__":
    main()
