"""Greedy fusion: merge the pair of groups along a data edge that saves the most time.

Starts from one group per operator; at each step tries every edge between two groups,
keeps the legal merges, predicts each with the model and applies the best one whose gain
is positive (or a near tie, see ``TIE_TOLERANCE``); stops when no merge helps. Every
rejected edge keeps its reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from kfuse.fusion.legality import group_violations
from kfuse.fusion.plan import (
    GROWING_VARIANTS,
    FusionPlan,
    check_groups,
    group_outputs,
    group_variant,
    make_plan,
)
from kfuse.fusion.resources import group_resource_violation
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile
from kfuse.model.roofline import predict_group

# A merge predicted within this fraction of the unmerged time still happens: the model is
# not that precise, and fewer kernels also mean fewer launches and less memory traffic.
TIE_TOLERANCE = 0.02


def greedy(graph: Graph, sizes: Mapping[str, int], profile: DeviceProfile) -> FusionPlan:
    """A plan built by repeatedly applying the most profitable legal merge."""
    groups: list[tuple[str, ...]] = [(k.name,) for k in graph.kernels]
    cache: dict[frozenset, float] = {}

    def cost(members: tuple[str, ...]) -> float:
        key = frozenset(members)
        if key not in cache:
            cache[key] = predict_group(graph, members, group_outputs(graph, members), sizes,
                                       profile).time_s
        return cache[key]

    position = {k.name: i for i, k in enumerate(graph.kernels)}
    reasons: dict[tuple[str, str], str] = {}
    too_big: dict[frozenset, str] = {}  # merges whose kernel exceeds the device (ptxas)
    while True:
        best = None
        index = {name: i for i, g in enumerate(groups) for name in g}
        for source, target in graph.order_dag().edges:
            a, b = index[source], index[target]
            if a == b:
                continue
            merged = tuple(sorted(set(groups[a]) | set(groups[b]), key=position.__getitem__))
            violations = group_violations(graph, merged)
            if not violations:
                trial = [g for i, g in enumerate(groups) if i not in (a, b)] + [merged]
                violations = check_groups(graph, trial)
            if violations:
                reasons[(source, target)] = f"illegal: {violations[0]}"
                continue
            if frozenset(merged) in too_big:
                reasons[(source, target)] = f"illegal: {too_big[frozenset(merged)]}"
                continue
            apart, together = cost(groups[a]) + cost(groups[b]), cost(merged)
            gain = apart - together
            if gain <= -TIE_TOLERANCE * apart:
                reasons[(source, target)] = (
                    f"unprofitable: predicted {together * 1e3:.3f} ms fused vs "
                    f"{apart * 1e3:.3f} ms apart")
                continue
            if best is None or gain > best[0]:
                best = (gain, a, b, merged)
        if best is None:
            break
        _, a, b, merged = best
        variant = group_variant(graph, merged)
        if variant in GROWING_VARIANTS:
            violation = group_resource_violation(graph, merged, group_outputs(graph, merged),
                                                 variant)
            if violation:
                too_big[frozenset(merged)] = str(violation)
                continue
        groups = [g for i, g in enumerate(groups) if i not in (a, b)] + [merged]
    predicted = sum(cost(g) for g in groups)
    unfused = sum(cost((k.name,)) for k in graph.kernels)
    return make_plan(graph, groups, strategy="greedy", model="roofline", reasons=reasons,
                     predicted_time_s=predicted, unfused_predicted_time_s=unfused,
                     check_resources=False)
