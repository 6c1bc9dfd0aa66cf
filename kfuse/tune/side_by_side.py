"""Horizontal fusion measured instead of predicted: HFuse's own search (Li et al. 2022,
§III-D). For each pair of groups of a plan with no path between them, every candidate of
:func:`kfuse.search.hfuse.candidates` (splits in steps of 128 threads, with and without the
register cap) is compiled and timed beside the two kernels apart (one after another and on
two streams, as the runtime would run them), in alternating rounds; the fastest is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

from kfuse.errors import KfuseError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile, current_profile
from kfuse.runtime.binding import bind
from kfuse.runtime.compiled import CompiledPipeline
from kfuse.schedule.forms import HorizontalSchedule
from kfuse.search.hfuse import candidates, part_shape
from kfuse.tune import timing


@dataclass(frozen=True)
class MeasuredPair:
    """The timings of one pair: apart (one after another, two streams) and each candidate
    side by side, in milliseconds by label; and the label kept."""

    parts: tuple[str, str]
    milliseconds: dict[str, float]
    kept: str


def autotune_side_by_side(graph: Graph, given: Mapping[str, Any], plan: FusionPlan, *,
                          backend: str = "cuda", profile: DeviceProfile | None = None,
                          rounds: int = 3, repeat: int = 10, warmup: int = 3
                          ) -> tuple[FusionPlan, list[MeasuredPair]]:
    """``plan`` with each pair of its independent groups side by side at the candidate
    measured fastest, where that is faster than both ways apart (the best pair first, each
    group in one pair at most); and what was measured. ``given``: inputs and parameters
    (device arrays for ``cuda``; ``cpu`` exercises the code path, timed by the wall clock)."""
    if backend not in ("cuda", "cpu"):
        raise KfuseError(f"autotuning times compiled kernels: cuda or cpu, not {backend!r}")
    profile = profile or current_profile()
    sizes = bind(graph, given).sizes
    timer = timing.time_gpu if backend == "cuda" else timing.time_host
    apart = replace(plan, side_by_side=(), apart=())
    measured: list[MeasuredPair] = []
    for level in apart.independent_groups:
        for first, second in combinations(level, 2):
            parts = (apart.groups[first].schedule, apart.groups[second].schedule)
            if HorizontalSchedule(parts).why_not(graph):
                continue
            names = (apart.groups[first].members[0], apart.groups[second].members[0])
            runs = {"one after another": CompiledPipeline(graph, backend, apart, streams=False),
                    "two streams": CompiledPipeline(graph, backend, apart, streams=True)}
            shapes = [part_shape(graph, part, sizes, profile) for part in parts]
            for candidate in candidates(graph, parts, shapes, profile):
                label = "/".join(str(t or s.threads) for t, s in
                                 zip(candidate.threads, shapes, strict=True)) + (
                    f" cap {candidate.least_blocks}" if candidate.least_blocks else "")
                try:
                    fused = apart.run_side_by_side(*names, threads=candidate.threads,
                                                   least_blocks=candidate.least_blocks)
                    runs[label] = CompiledPipeline(graph, backend, fused, streams=False)
                    runs[label](**given)  # compiled here: a candidate that fails is left out
                except KfuseError:
                    runs.pop(label, None)
            times = timing.time_alternating(
                {label: (lambda run=run: run(**given)) for label, run in runs.items()},
                rounds, repeat=repeat, warmup=warmup, timer=timer)
            medians = {label: sorted(values)[len(values) // 2]
                       for label, values in times.items()}
            kept = min(medians, key=medians.__getitem__)
            measured.append(MeasuredPair(names, medians, kept))
    chosen = sorted((m for m in measured
                     if m.kept not in ("one after another", "two streams")),
                    key=lambda m: m.milliseconds[m.kept]
                    - min(m.milliseconds["one after another"], m.milliseconds["two streams"]))
    result, used = apart, set()
    for pair in chosen:
        if used & set(pair.parts):
            continue
        used.update(pair.parts)
        split, _, cap = pair.kept.partition(" cap ")
        threads = tuple(int(t) for t in split.split("/"))
        own = [part_shape(graph, result.group_of(name).schedule, sizes, profile).threads
               for name in pair.parts]
        best_apart = min(pair.milliseconds["one after another"], pair.milliseconds["two streams"])
        result = result.run_side_by_side(
            *pair.parts, threads=tuple(None if t == o else t
                                       for t, o in zip(threads, own, strict=True)),
            least_blocks=int(cap or 0),
            reason=f"measured {pair.milliseconds[pair.kept]:.4f} ms side by side ({pair.kept} "
                   f"threads) against {best_apart:.4f} ms apart (autotuned)")
    return result, measured


__all__ = ["MeasuredPair", "autotune_side_by_side"]
