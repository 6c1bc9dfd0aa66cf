"""Empirical search over Filipovič et al. 2015's implementation space: compile
and time the best-predicted implementations of :mod:`kfuse.search.variants` on the device
and keep the fastest (``--autotune``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfuse.errors import KfuseError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile
from kfuse.runtime import get_backend
from kfuse.runtime.backend import CompiledBackend
from kfuse.runtime.binding import bind
from kfuse.search.variants import Implementation, ImplementationSpace
from kfuse.tune import timing


@dataclass(frozen=True)
class Measured:
    """One timed implementation: its predicted rank, prediction and measured time.

    Rank 0 is the combination assembled from the fastest variant of each group, each group
    timed on its own (see :func:`autotune`).
    """

    rank: int
    implementation: Implementation
    measured_s: float


@dataclass(frozen=True)
class AutotuneResult:
    """The top-k implementations timed on the device; ``plan`` is the fastest."""

    plan: FusionPlan
    measured: tuple[Measured, ...]
    count: int  # implementations in the whole space

    @property
    def best(self) -> Measured:
        return min(self.measured, key=lambda m: m.measured_s)

    def table(self) -> list[dict[str, Any]]:
        return [{"rank": m.rank, "predicted_ms": m.implementation.predicted_s * 1e3,
                 "measured_ms": m.measured_s * 1e3, "implementation": m.implementation.describe()}
                for m in self.measured]


def autotune(graph: Graph, given: Mapping[str, Any], k: int, *, backend: str = "cuda",
             sizes: Mapping[str, int] | None = None, profile: DeviceProfile | None = None,
             warmup: int = 3, repeat: int = 10, rounds: int = 3,
             space: ImplementationSpace | None = None, per_group: bool = True
             ) -> AutotuneResult:
    """Compile and time the ``k`` best-predicted implementations; keep the fastest.

    With ``per_group`` the fastest one's groups are then tuned one at a time: the ``k``
    best-predicted variants of each group are timed on their own (the other groups as
    chosen so far) and the fastest kept. The groups of a plan are separate kernels, so this
    finds the best variant of every group with ``k`` trials per group, where the k best
    whole combinations mostly vary the cheap groups. The assembled combination (rank 0) is
    timed whole beside the fastest and kept only if it is faster.

    Candidates are compared as they would be run: on the very same buffers (where a
    streaming kernel's output lies moves its time by up to 0.6% on an H200), in ``rounds``
    alternating rounds of ``repeat`` runs each (the median of the rounds' medians), so that
    neither placement nor drift decides between near-equal ones.

    ``given`` holds the inputs and parameters (device arrays for ``cuda``). On ``cuda`` the
    time is measured with CUDA events, on ``cpu`` with the wall clock (which says nothing
    about the GPU: use it to exercise the code path).
    """
    if k < 1:
        raise KfuseError(f"--autotune takes a positive number of implementations, got {k}")
    chosen = get_backend(backend)
    if not isinstance(chosen, CompiledBackend):
        raise KfuseError(f"autotuning times compiled kernels, which the {chosen.name} backend "
                         "does not run; use cuda (or cpu, to exercise the code path)")
    if space is None:
        if sizes is None:
            sizes = bind(graph, given).sizes
        space = ImplementationSpace(graph, sizes, profile)
    timer = timing.time_gpu if chosen.name == "cuda" else timing.time_host
    shared: list[Any] = []  # the first executable: every other one runs on its buffers

    def prepared(implementation: Implementation) -> Any:
        executable = chosen.prepare(graph, given, plan=implementation.plan(graph),
                                    buffers_of=shared[0] if shared else None)
        if not shared:
            shared.append(executable)
        return executable

    def in_turn(launches: Sequence[Callable[[], object]]) -> list[float]:
        return timing.time_in_turn(launches, rounds=rounds, warmup=warmup, repeat=repeat,
                                   timer=timer)

    ranked = space.ranked(k)
    times = in_turn([prepared(implementation).launch_all for implementation in ranked])
    measured = [Measured(rank, implementation, time_s) for rank, (implementation, time_s)
                in enumerate(zip(ranked, times, strict=True), start=1)]
    fastest = min(measured, key=lambda m: m.measured_s)
    if per_group:
        def group_launch(implementation: Implementation, members: tuple[str, ...]
                         ) -> Callable[[], None]:
            executable = prepared(implementation)
            specs = [spec for spec in executable.program.launches
                     if set(spec.operators) <= set(members)]
            executable.launch_all()  # the outputs of earlier groups in place

            def launch() -> None:
                for spec in specs:
                    executable.launch_one(spec)
            return launch

        assembled = _tune_groups(fastest.implementation, space, k, group_launch, in_turn)
        if assembled.choices != fastest.implementation.choices:
            again, whole = in_turn([prepared(fastest.implementation).launch_all,
                                    prepared(assembled).launch_all])
            measured[measured.index(fastest)] = fastest = Measured(
                fastest.rank, fastest.implementation, again)
            measured.append(Measured(0, assembled, whole))
            fastest = min(measured, key=lambda m: m.measured_s)
    plan = fastest.implementation.plan(graph, unfused_predicted_time_s=space.unfused_time())
    return AutotuneResult(plan, tuple(measured), space.count())


def _tune_groups(start: Implementation, space: ImplementationSpace, k: int,
                 group_launch: Callable[[Implementation, tuple[str, ...]], Callable[[], None]],
                 in_turn: Callable[[Sequence[Callable[[], object]]], list[float]]
                 ) -> Implementation:
    """``start`` with each group's variant replaced by the fastest of its ``k`` best-predicted
    ones, each group timed on its own (the options of one group in turn)."""
    choices = list(start.choices)
    for position, current in enumerate(start.choices):
        options = space.choices(current.members)[:k]
        if current not in options:
            options.append(current)
        if len(options) < 2:
            continue
        trials = [Implementation(tuple([*choices[:position], option,
                                        *choices[position + 1:]]), start.predicted_s)
                  for option in options]
        times = in_turn([group_launch(trial, option.members)
                         for trial, option in zip(trials, options, strict=True)])
        choices[position] = options[times.index(min(times))]
    return Implementation(tuple(choices), sum(c.prediction.time_s for c in choices))


__all__ = ["AutotuneResult", "Measured", "autotune"]
