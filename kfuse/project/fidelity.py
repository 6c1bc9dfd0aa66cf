"""Search fidelity: a heuristic strategy against the exact optimum on synthetic instances.

For every cell ``(#kernels, #arrays)`` of a grid, ``instances`` applications are drawn
with :func:`kfuse.project.synth.synthesize` (one seed each) and solved twice under the
same model: by the strategy under test (``gga`` by default) and by the reference
(``exact`` by default, set partitioning with HiGHS). As in Wahib & Maruyama 2014b Table 5, an answer
is *feasible* when it is a legal plan and *optimal* when its predicted time is within
``tolerance`` (1%, Wahib & Maruyama 2014b's E) of the reference's. The worst relative gap and the solve
times (wall clock and CPU time of the process, mean and max) complete the row. Each solve
gets a fresh problem, so neither reuses the other's memoised evaluations.

The other Table V attributes (copies, sharing-set size, thread load, kinship) are those
of ``base``, or, for the attributes named in ``vary``, drawn per instance from the given
values (deterministically from the instance's seed and cell); :data:`TABLE_V` holds
Wahib & Maruyama 2014's ranges. :func:`total_row` sums the rows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kfuse.errors import KfuseError
from kfuse.project.problem import AppProblem
from kfuse.project.synth import SynthSpec, suite, synthesize

DEFAULT_KERNELS = (20, 30, 40, 50)
DEFAULT_ARRAYS = (20, 40, 60)
TOLERANCE = 0.01
# Wahib & Maruyama 2014 Table V (= Wahib & Maruyama 2014b Table 3): the values each attribute is swept over
TABLE_V: dict[str, tuple[Any, ...]] = {
    "copies": (2, 4, 6, 8, 10),
    "sharing": (2, 4, 6, 8),
    "thread_load": (4.0, 8.0, 12.0),
    "kinship": (2, 3, 4, 5),
}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


@dataclass
class FidelityRow:
    """One grid cell: how often the strategy was feasible and optimal, and how fast."""

    kernels: int
    arrays: int
    instances: int = 0
    feasible: int = 0
    optimal: int = 0
    compared: int = 0           # instances whose reference finished
    reference_failed: int = 0   # the reference gave up (too many candidate groups)
    worst_gap: float = 0.0
    times_s: list[float] = field(default_factory=list)       # wall clock, per instance
    cpu_times_s: list[float] = field(default_factory=list)   # process CPU time
    reference_times_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def feasible_pct(self) -> float:
        return 100.0 * self.feasible / self.instances if self.instances else 0.0

    @property
    def optimal_pct(self) -> float | None:
        return 100.0 * self.optimal / self.compared if self.compared else None

    @property
    def mean_time_s(self) -> float | None:
        return _mean(self.times_s)

    @property
    def max_time_s(self) -> float | None:
        return _max(self.times_s)

    @property
    def mean_cpu_time_s(self) -> float | None:
        return _mean(self.cpu_times_s)

    @property
    def max_cpu_time_s(self) -> float | None:
        return _max(self.cpu_times_s)

    @property
    def max_reference_time_s(self) -> float | None:
        return _max(self.reference_times_s)

    @property
    def mean_reference_time_s(self) -> float | None:
        return _mean(self.reference_times_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("feasible_pct", "optimal_pct", "mean_time_s", "max_time_s",
                     "mean_cpu_time_s", "max_cpu_time_s", "mean_reference_time_s",
                     "max_reference_time_s"):
            data[name] = getattr(self, name)
        return data


def _solve(app, model: str, strategy: str, seed: int, options: dict[str, Any],
           catch: type[Exception] = KfuseError
           ) -> tuple[Any, float, float, str | None]:
    """(legal result or None, wall seconds, CPU seconds, why not) for one fresh problem
    (building the problem is timed too); ``catch`` errors count as a failure of this
    instance, any other error stops the run."""
    from kfuse.search.problem import solve

    started, cpu = time.perf_counter(), time.process_time()
    problem = AppProblem(app, model).fusion_problem()
    try:
        result = solve(problem, strategy, seed=seed, **options)
    except catch as error:
        return (None, time.perf_counter() - started, time.process_time() - cpu,
                f"{strategy}: {error}")
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    reason = problem.plan_reason(result.groups)
    return (result if reason is None else None), elapsed, used, reason


def vary_spec(spec: SynthSpec, vary: Mapping[str, Sequence[Any]] | None) -> SynthSpec:
    """``spec`` with each attribute named in ``vary`` drawn from its values (seeded by the
    spec, so the same cell and seed always give the same instance); kinship is capped at
    ``kernels - 1``."""
    if not vary:
        return spec
    rng = random.Random(f"{spec.kernels}/{spec.arrays}/{spec.seed}")
    changes = {name: rng.choice(list(values)) for name, values in sorted(vary.items())}
    unknown = set(changes) - set(TABLE_V)
    if unknown:
        raise KfuseError(f"fidelity can vary only {', '.join(TABLE_V)}; not {sorted(unknown)}")
    spec = replace(spec, **changes)
    return replace(spec, kinship=min(spec.kinship, spec.kernels - 1))


def run_fidelity(kernels: Sequence[int] = DEFAULT_KERNELS,
                 arrays: Sequence[int] = DEFAULT_ARRAYS, instances: int = 10,
                 base: SynthSpec | None = None, *, strategy: str = "gga",
                 reference: str = "exact", model: str = "wahib",
                 tolerance: float = TOLERANCE, seed: int = 0,
                 strategy_options: dict[str, Any] | None = None,
                 reference_options: dict[str, Any] | None = None,
                 on_instance: Callable[[SynthSpec], None] | None = None,
                 vary: Mapping[str, Sequence[Any]] | None = None) -> list[FidelityRow]:
    """Compare ``strategy`` with ``reference`` over the grid; one row per cell.

    ``vary`` maps Table V attributes (``copies``, ``sharing``, ``thread_load``,
    ``kinship``) to the values each instance draws from (:func:`vary_spec`).

    A reference that gives up on an instance (too many candidate groups for ``exact``) is
    counted in ``reference_failed`` and the instance is left out of the optimality figures;
    any other reference error stops the run (it would make every row meaningless).
    """
    from kfuse.search.problem import TooManyCandidates, check_strategy

    check_strategy(strategy)  # up front: each instance would otherwise fail on its own
    check_strategy(reference)
    base = base or SynthSpec()
    rows = []
    for k in kernels:
        for a in arrays:
            row = FidelityRow(k, a)
            for spec in suite([k], [a], instances, base):
                spec = vary_spec(spec, vary)
                if on_instance:
                    on_instance(spec)
                app = synthesize(spec)
                row.instances += 1
                found, elapsed, used, why = _solve(app, model, strategy, seed,
                                                   dict(strategy_options or {}))
                row.times_s.append(elapsed)
                row.cpu_times_s.append(used)
                if found is not None:
                    row.feasible += 1
                elif why:
                    row.notes.append(f"{spec.name}: {why}")
                best, elapsed, _, why = _solve(app, model, reference, seed,
                                               dict(reference_options or {}),
                                               TooManyCandidates)
                if best is None:
                    row.reference_failed += 1
                    row.notes.append(f"{spec.name}: reference {why}")
                    continue
                row.reference_times_s.append(elapsed)
                row.compared += 1
                if found is None:
                    continue
                gap = (found.predicted_time_s - best.predicted_time_s) / best.predicted_time_s
                row.worst_gap = max(row.worst_gap, gap)
                if gap <= tolerance:
                    row.optimal += 1
                else:
                    row.notes.append(f"{spec.name}: {strategy} {gap:.2%} above {reference}")
            rows.append(row)
    return rows


def total_row(rows: Sequence[FidelityRow]) -> FidelityRow:
    """Every row summed into one (``kernels`` and ``arrays`` are 0: all cells)."""
    total = FidelityRow(0, 0)
    for row in rows:
        for name in ("instances", "feasible", "optimal", "compared", "reference_failed"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        total.worst_gap = max(total.worst_gap, row.worst_gap)
        total.times_s += row.times_s
        total.cpu_times_s += row.cpu_times_s
        total.reference_times_s += row.reference_times_s
        total.notes += row.notes
    return total


def format_table(rows: Sequence[FidelityRow], strategy: str = "gga",
                 reference: str = "exact", tolerance: float = TOLERANCE,
                 total: bool = False) -> Any:
    """A rich Table: (#K,#A), instances, % feasible, % optimal, worst gap, mean/max wall
    and CPU times of the strategy, mean/max time of the reference; ``total`` adds a row
    over every cell."""
    from rich.table import Table

    table = Table(title=f"{strategy} against {reference} (optimal: within {tolerance:.0%})")
    for column in ("(#K,#A)", "n", "feasible%", "optimal%", "worst gap",
                   f"{strategy} wall s mean/max", f"{strategy} cpu s mean/max",
                   f"{reference} s mean/max", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")

    def pair(mean: float | None, top: float | None) -> str:
        return "-" if mean is None else f"{mean:.2f}/{top:.2f}"

    shown = list(rows) + ([total_row(rows)] if total and rows else [])
    for index, row in enumerate(shown):
        optimal = "-" if row.optimal_pct is None else f"{row.optimal_pct:.1f}"
        gap = "-" if not row.compared else f"{row.worst_gap * 100:.2f}%"
        note = f"{reference} gave up on {row.reference_failed}" if row.reference_failed else ""
        cell = "all" if total and index == len(rows) else f"({row.kernels},{row.arrays})"
        table.add_row(cell, str(row.instances), f"{row.feasible_pct:.1f}", optimal, gap,
                      pair(row.mean_time_s, row.max_time_s),
                      pair(row.mean_cpu_time_s, row.max_cpu_time_s),
                      pair(row.mean_reference_time_s, row.max_reference_time_s), note)
    return table


__all__ = ["DEFAULT_ARRAYS", "DEFAULT_KERNELS", "FidelityRow", "TABLE_V", "TOLERANCE",
           "format_table", "run_fidelity", "total_row", "vary_spec"]
