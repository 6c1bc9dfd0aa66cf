"""Greedy fusion: merge the pair of groups along a data edge that saves the most time.

Starts from one group per operator; at each step tries every order-DAG edge between two
groups, keeps the legal merges, predicts each with the model and applies the best one
whose gain is positive (or a near tie, see ``TIE_TOLERANCE``); stops when no merge helps.
Every rejected edge keeps its reason. The expensive legality rules (compiling a group to
see its registers and shared memory) are checked only on the merge about to be applied.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from kfuse.analysis.order import iter_bits
from kfuse.fusion.plan import FusionPlan, make_plan
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile
from kfuse.search.problem import FusionProblem, problem_from_graph, solve

# A merge predicted within this fraction of the unmerged time still happens: the model is
# not that precise, and fewer kernels also mean fewer launches and less memory traffic.
TIE_TOLERANCE = 0.02


def greedy_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
                  tie_tolerance: float = TIE_TOLERANCE
                  ) -> tuple[list[tuple[str, ...]], dict[tuple[str, str], str], dict]:
    """Groups built by repeatedly applying the most profitable legal merge.

    Deterministic (``seed`` is unused): of equal gains, the merge along the earliest
    order-DAG edge wins. Candidate merges wait in a heap keyed by gain: a pair's gain and
    its structural legality never change, and a merge that would make the quotient
    cyclic stays cyclic as other groups merge (coarsening keeps every path), so popping
    the best and discarding it when it has become cyclic picks exactly what a full scan
    of all edges at every step would pick, in O(E log E) instead of O(E^2).
    """
    del seed, progress
    bits = problem.bits
    n = bits.n
    edges = [(s, t, bits.index[s], bits.index[t]) for s, t in problem.order_dag.edges]
    incident: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e, (_, _, i, j) in enumerate(edges):
        incident[i].append((e, j))
        incident[j].append((e, i))
    masks: list[int] = [1 << i for i in range(n)]  # by label; kernel i starts in label i
    gid = list(range(n))
    order = list(range(n))  # alive labels in the order the original list kept them
    alive = set(order)
    heap: list[tuple[float, int, int, int, int]] = []

    def offer(a: int, b: int, first: int) -> None:
        merged = masks[a] | masks[b]
        if not bits.legal(merged) and merged not in bits.banned:
            return
        apart = bits.time(masks[a]) + bits.time(masks[b])
        gain = apart - bits.time(merged)
        if gain <= -tie_tolerance * apart:
            return
        heapq.heappush(heap, (-gain, first, a, b, merged))

    def neighbours(label: int) -> dict[int, int]:
        """Other groups linked to ``label`` by an edge, with the first such edge."""
        linked: dict[int, int] = {}
        for i in iter_bits(masks[label]):
            for e, j in incident[i]:
                other = gid[j]
                if other != label and e < linked.get(other, len(edges)):
                    linked[other] = e
        return linked

    firsts: dict[tuple[int, int], int] = {}
    for e, (_, _, i, j) in enumerate(edges):
        key = (min(i, j), max(i, j))
        if i != j and key not in firsts:
            firsts[key] = e
    for (a, b), e in firsts.items():
        offer(a, b, e)
    merges = 0
    while heap:
        _, _, a, b, merged = heapq.heappop(heap)
        if a not in alive or b not in alive:
            continue
        if merged in bits.banned or not bits.merge_ok(gid, masks, merged, (a, b)):
            continue
        violation = bits.full_reason(merged)
        if violation:
            bits.ban(merged, violation)
            continue
        label = len(masks)
        masks.append(merged)
        for i in iter_bits(merged):
            gid[i] = label
        alive -= {a, b}
        alive.add(label)
        order = [g for g in order if g not in (a, b)] + [label]
        merges += 1
        for other, e in neighbours(label).items():
            offer(min(label, other), max(label, other), e)
    reasons = _reasons(problem, edges, masks, gid, order, tie_tolerance)
    return [bits.members(masks[g]) for g in order], reasons, {"merges": merges,
                                                              "optimal": False}


def _reasons(problem: FusionProblem, edges: list[tuple[str, str, int, int]], masks: list[int],
             gid: list[int], order: list[int], tie_tolerance: float
             ) -> dict[tuple[str, str], str]:
    """Why each edge left between two groups was not merged (as the last scan saw it)."""
    bits = problem.bits
    reasons: dict[tuple[str, str], str] = {}
    for source, target, i, j in edges:
        a, b = gid[i], gid[j]
        if a == b:
            continue
        merged = masks[a] | masks[b]
        reason = bits.reason(merged) if merged not in bits.banned else None
        if reason is None and not bits.merge_ok(gid, masks, merged, (a, b)):
            if bits.n <= 300:
                trial = [masks[g] for g in order if g not in (a, b)] + [merged]
                cycle = bits.quotient_cycle(trial) or []
                reason = ("acyclic: groups "
                          f"{[list(bits.members(m)) for m in cycle]} depend on each "
                          "other in a cycle")
            else:
                reason = "acyclic: the merged groups would depend on each other in a cycle"
        if reason is None and merged in bits.banned:
            reason = bits.banned[merged]
        if reason is not None:
            reasons[(source, target)] = f"illegal: {reason}"
            continue
        apart = bits.time(masks[a]) + bits.time(masks[b])
        together = bits.time(merged)
        reasons[(source, target)] = (f"unprofitable: predicted {together * 1e3:.3f} ms fused "
                                     f"vs {apart * 1e3:.3f} ms apart")
    return reasons


def greedy(graph: Graph, sizes: Mapping[str, int], profile: DeviceProfile,
           model: str = "roofline", **options: Any) -> FusionPlan:
    """A plan built by repeatedly applying the most profitable legal merge."""
    problem = problem_from_graph(graph, model, sizes, profile)
    result = solve(problem, "greedy", **options)
    return make_plan(graph, result.groups, strategy="greedy", model=model,
                     reasons=result.reasons, predicted_time_s=result.predicted_time_s,
                     unfused_predicted_time_s=result.unfused_predicted_time_s,
                     check_resources=False, sizes=sizes)
