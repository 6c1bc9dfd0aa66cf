"""Exact search: set partitioning over all legal groups, solved with HiGHS (``highspy``).

Columns are the legal candidate groups (connected through shared arrays, convex, passing
``group_reason``; enumerated by :func:`~kfuse.search.problem.enumerate_groups`), one binary
variable each; every kernel is covered exactly once; the objective is the summed predicted
time. The quotient graph must also be acyclic, which a column model cannot say directly:
it is enforced lazily. When the optimum's groups form a cycle, a no-good cut (those groups
not all together) is added and the model solved again; the first acyclic optimum is the
optimum of the full problem.

The enumeration stops growing a set that ``hereditary_reason`` rejects (no superset can be
legal: resources, launch shapes, and for the literal ``wahib`` model of the codeless
projection a profit bound; see ``AppProblem.hereditary_reason``), which is what lets it
finish on the 50-kernel instances of the synthetic suite.

Limits: ``max_candidates`` legal groups (default 200,000), ``max_visits`` convex sets
looked at (default 5 million) and ``time_limit_s`` (default 600 s); past any of them
:class:`~kfuse.search.problem.TooManyCandidates` is raised instead of a non-optimal answer. ``max_group_size`` restricts groups (then ``stats['optimal']`` is
False when the restriction cut off a possibly legal group). The result is the ground truth
for problems up to ~60 kernels when the sharing graph is sparse enough.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from kfuse.errors import KfuseError
from kfuse.search.problem import (
    FusionProblem,
    TooManyCandidates,
    enumerate_groups,
    iter_bits,
)


def quiet_highs(highspy: Any) -> Any:
    """A ``highspy.Highs`` that prints nothing. The first one a process makes writes HiGHS's
    banner to file descriptor 1 from C++ before any option can be set (it would corrupt
    ``--json`` output), so it is made with that descriptor pointed at the null device."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 to protect
        saved = None
    if saved is not None:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
    try:
        solver = highspy.Highs()
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    solver.setOptionValue("output_flag", False)
    return solver


def exact_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
                 max_group_size: int | None = None, max_candidates: int = 200_000,
                 max_visits: int = 5_000_000, time_limit_s: float = 600.0,
                 max_cuts: int = 5000) -> tuple[list[tuple[str, ...]], dict, dict]:
    """The optimal plan by integer programming (``seed`` sets HiGHS's random seed)."""
    try:
        import highspy
    except ImportError as error:  # pragma: no cover - a base dependency
        raise KfuseError("the exact strategy needs highspy (pip install highspy)") from error
    del progress
    started = time.perf_counter()
    bits = problem.bits
    n = bits.n
    candidates, stats = enumerate_groups(problem, max_group_size, max_candidates, max_visits,
                                         deadline=started + time_limit_s)
    enumerated = time.perf_counter() - started
    costs = np.array([bits.time(m) for m in candidates])
    scale = float(np.mean(costs[:n])) or 1.0  # singletons come first

    starts = [0]
    rows: list[int] = []
    for mask in candidates:
        rows.extend(iter_bits(mask))
        starts.append(len(rows))
    lp = highspy.HighsLp()
    lp.num_col_ = len(candidates)
    lp.num_row_ = n
    lp.col_cost_ = costs / scale
    lp.col_lower_ = np.zeros(len(candidates))
    lp.col_upper_ = np.ones(len(candidates))
    lp.row_lower_ = np.ones(n)
    lp.row_upper_ = np.ones(n)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(rows, dtype=np.int32)
    lp.a_matrix_.value_ = np.ones(len(rows))
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(candidates)
    solver = quiet_highs(highspy)
    solver.setOptionValue("mip_rel_gap", 1e-9)
    solver.setOptionValue("mip_abs_gap", 1e-12)
    solver.setOptionValue("random_seed", int(seed) % (2**31 - 1))
    solver.passModel(lp)

    cuts = 0
    while True:
        remaining = time_limit_s - (time.perf_counter() - started)
        if remaining <= 0:
            raise TooManyCandidates(f"exact search ran out of time ({time_limit_s:.0f} s) "
                                    "before proving an optimum; use the gga strategy")
        solver.setOptionValue("time_limit", float(remaining))
        solver.run()
        status = solver.getModelStatus()
        if status == highspy.HighsModelStatus.kTimeLimit:
            raise TooManyCandidates(f"exact search ran out of time ({time_limit_s:.0f} s) "
                                    f"with {len(candidates)} candidate groups; use the gga "
                                    "strategy")
        if status != highspy.HighsModelStatus.kOptimal:
            raise KfuseError(f"exact search: HiGHS stopped with {status} before proving an "
                             f"optimum ({len(candidates)} candidate groups, {cuts} cuts)")
        values = solver.getSolution().col_value
        chosen = [c for c, value in enumerate(values) if value > 0.5]
        masks = [candidates[c] for c in chosen]
        covered = 0
        for mask in masks:
            if covered & mask:
                raise KfuseError("exact search: HiGHS returned overlapping groups")
            covered |= mask
        if covered != bits.full:
            raise KfuseError("exact search: HiGHS returned a plan that misses kernels")
        cycle = bits.quotient_cycle(masks)
        if cycle is None:
            break
        cuts += 1
        if cuts > max_cuts:
            raise KfuseError(f"exact search: more than {max_cuts} cycle cuts; use the gga "
                             "strategy")
        in_cycle = set(cycle)
        columns = [c for c in chosen if candidates[c] in in_cycle]
        solver.addRow(-highspy.kHighsInf, float(len(columns) - 1), len(columns),
                      np.array(columns, dtype=np.int32), np.ones(len(columns)))
    stats.update(optimal=not stats["size_capped"], cycle_cuts=cuts,
                 enumeration_seconds=enumerated,
                 solver_seconds=time.perf_counter() - started - enumerated,
                 max_group_size=max_group_size)
    return [bits.members(m) for m in masks], {}, stats
