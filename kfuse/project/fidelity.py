"""Search fidelity: a heuristic strategy against the exact optimum on synthetic instances.

For every cell ``(#kernels, #arrays)`` of a grid, ``instances`` applications are drawn
with :func:`kfuse.project.synth.synthesize` (one seed each) and solved twice under the
same model: by the strategy under test (``gga`` by default) and by the reference
(``exact`` by default, set partitioning with HiGHS). As in seed 001 Table 5, an answer
is *feasible* when it is a legal plan and *optimal* when its predicted time is within
``tolerance`` (1%, seed 001's E) of the reference's. The worst relative gap and the mean
solve times complete the row. Each solve gets a fresh problem, so neither reuses the
other's memoised evaluations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kfuse.errors import KfuseError
from kfuse.project.problem import AppProblem
from kfuse.project.synth import SynthSpec, suite, synthesize

DEFAULT_KERNELS = (20, 30, 40, 50)
DEFAULT_ARRAYS = (20, 40, 60)
TOLERANCE = 0.01


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
    times_s: list[float] = field(default_factory=list)
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
        return sum(self.times_s) / len(self.times_s) if self.times_s else None

    @property
    def max_time_s(self) -> float | None:
        return max(self.times_s) if self.times_s else None

    @property
    def mean_reference_time_s(self) -> float | None:
        return sum(self.reference_times_s) / len(self.reference_times_s) \
            if self.reference_times_s else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("feasible_pct", "optimal_pct", "mean_time_s", "max_time_s",
                     "mean_reference_time_s"):
            data[name] = getattr(self, name)
        return data


def _solve(app, model: str, strategy: str, seed: int, options: dict[str, Any],
           catch: type[Exception] = KfuseError) -> tuple[Any, float, str | None]:
    """(legal result or None, seconds, why not) for one fresh problem; ``catch`` errors
    count as a failure of this instance, any other error stops the run."""
    from kfuse.search.problem import solve

    problem = AppProblem(app, model).fusion_problem()
    started = time.perf_counter()
    try:
        result = solve(problem, strategy, seed=seed, **options)
    except catch as error:
        return None, time.perf_counter() - started, f"{strategy}: {error}"
    elapsed = time.perf_counter() - started
    reason = problem.plan_reason(result.groups)
    return (result if reason is None else None), elapsed, reason


def run_fidelity(kernels: Sequence[int] = DEFAULT_KERNELS,
                 arrays: Sequence[int] = DEFAULT_ARRAYS, instances: int = 10,
                 base: SynthSpec | None = None, *, strategy: str = "gga",
                 reference: str = "exact", model: str = "wahib",
                 tolerance: float = TOLERANCE, seed: int = 0,
                 strategy_options: dict[str, Any] | None = None,
                 reference_options: dict[str, Any] | None = None,
                 on_instance: Callable[[SynthSpec], None] | None = None) -> list[FidelityRow]:
    """Compare ``strategy`` with ``reference`` over the grid; one row per cell.

    A reference that gives up on an instance (too many candidate groups for ``exact``) is
    counted in ``reference_failed`` and the instance is left out of the optimality figures;
    any other reference error stops the run (it would make every row meaningless).
    """
    from kfuse.search.problem import TooManyCandidates

    base = base or SynthSpec()
    rows = []
    for k in kernels:
        for a in arrays:
            row = FidelityRow(k, a)
            for spec in suite([k], [a], instances, base):
                if on_instance:
                    on_instance(spec)
                app = synthesize(spec)
                row.instances += 1
                found, elapsed, why = _solve(app, model, strategy, seed,
                                             dict(strategy_options or {}))
                row.times_s.append(elapsed)
                if found is not None:
                    row.feasible += 1
                elif why:
                    row.notes.append(f"{spec.name}: {why}")
                best, elapsed, why = _solve(app, model, reference, seed,
                                            dict(reference_options or {}), TooManyCandidates)
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
            rows.append(row)
    return rows


def format_table(rows: Sequence[FidelityRow], strategy: str = "gga",
                 reference: str = "exact") -> Any:
    """A rich Table: (#K,#A), instances, % feasible, % optimal, worst gap, mean/max times."""
    from rich.table import Table

    table = Table(title=f"{strategy} against {reference} (optimal: within {TOLERANCE:.0%})")
    for column in ("(#K,#A)", "n", "feasible%", "optimal%", "worst gap",
                   f"{strategy} s mean/max", f"{reference} s", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    for row in rows:
        optimal = "-" if row.optimal_pct is None else f"{row.optimal_pct:.1f}"
        gap = "-" if not row.compared else f"{row.worst_gap * 100:.2f}%"
        mean = "-" if row.mean_time_s is None else \
            f"{row.mean_time_s:.2f}/{row.max_time_s:.2f}"
        ref = "-" if row.mean_reference_time_s is None else f"{row.mean_reference_time_s:.2f}"
        note = f"{reference} gave up on {row.reference_failed}" if row.reference_failed else ""
        table.add_row(f"({row.kernels},{row.arrays})", str(row.instances),
                      f"{row.feasible_pct:.1f}", optimal, gap, mean, ref, note)
    return table


__all__ = ["DEFAULT_ARRAYS", "DEFAULT_KERNELS", "FidelityRow", "TOLERANCE", "format_table",
           "run_fidelity"]
