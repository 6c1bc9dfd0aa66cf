"""Basic search along edges: Qiao 2021 Algorithm 1, with the gaps the notes fix (§5.1).

Only producer -> consumer edges where the producer has a single consumer (``deg+ = 1``,
a pipeline output counting as one) and the consumer reads a single image (``deg- = 1``,
pipeline inputs included) qualify (Eq. 3.15), neither end a global operator; they chain
into linear lists. Each list is split where a consecutive pair cannot fuse (granularity
and the other pair rules), then the tail kernel is dropped until the list is legal
(resources); a dropped tail of two or more becomes a new list (the worklist the printed
algorithm lacks). kfuse reading: a pair whose Qiao 2021 benefit is not positive does not
qualify either (L6), which is what keeps Night's Atrous0 -> Atrous1 apart as in the thesis,
and a list the problem's own model predicts slower than its kernels apart (1.1) loses its
tail like an illegal one.

Without an IR graph the degrees come from the order DAG and the benefit from the
problem's model (the time a pair saves).
"""

from __future__ import annotations

from collections import deque

from kfuse.search.mincut import Hipacc, HipaccParams
from kfuse.search.problem import FusionProblem


def _degrees(hipacc: Hipacc) -> tuple[dict[str, int], dict[str, int]]:
    problem = hipacc.problem
    dag = problem.order_dag
    graph = hipacc.graph
    out_degree: dict[str, int] = {}
    in_degree: dict[str, int] = {}
    for name in problem.kernels:
        if graph is None:
            out_degree[name] = dag.out_degree(name) if name in dag else 0
            in_degree[name] = dag.in_degree(name) if name in dag else 0
            continue
        kernel = graph.kernel_by_name[name]
        consumers = {c for w in kernel.writes for c in graph.consumers.get(w, ())}
        out_degree[name] = len(consumers) + sum(w in graph.outputs for w in kernel.writes)
        in_degree[name] = len(kernel.reads)
    return out_degree, in_degree


def _chains(pairs: list[tuple[str, str]], position: dict[str, int]) -> list[list[str]]:
    """Link (p, q), (q, r) into [p, q, r]; each kernel has at most one chained successor
    and predecessor, so the lists are disjoint paths."""
    after = dict(pairs)
    before = {t: s for s, t in pairs}
    lists = []
    for start in sorted(after, key=position.__getitem__):
        if start in before:
            continue
        chain = [start]
        while chain[-1] in after:
            chain.append(after[chain[-1]])
        lists.append(chain)
    return lists


def edges_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
                 params: HipaccParams | None = None
                 ) -> tuple[list[tuple[str, ...]], dict, dict]:
    """Qiao 2021's basic search; deterministic (``seed`` is unused)."""
    del seed, progress
    hipacc = Hipacc(problem, params)
    bits = problem.bits
    position = bits.index
    out_degree, in_degree = _degrees(hipacc)
    reasons: dict[tuple[str, str], str] = {}
    pairs = []
    for s, t in problem.order_dag.edges:
        if out_degree[s] != 1 or in_degree[t] != 1:
            reasons[(s, t)] = (f"not a linear chain (Eq. 3.15): '{s}' has {out_degree[s]} "
                               f"consumers, '{t}' reads {in_degree[t]} images")
        elif "G" in (hipacc.kind(s), hipacc.kind(t)) or "X" in (hipacc.kind(s),
                                                                 hipacc.kind(t)):
            reasons[(s, t)] = "a global or opaque operator does not fuse"
        elif hipacc.raw_benefit(s, t) <= 0:
            reasons[(s, t)] = (f"unprofitable: Qiao 2021 benefit "
                               f"{hipacc.raw_benefit(s, t):.1f} (L6)")
        else:
            pairs.append((s, t))
    work = deque(_chains(pairs, position))
    found: list[list[str]] = []
    while work:
        chain = work.popleft()
        parts = [[chain[0]]]
        for s, t in zip(chain, chain[1:], strict=False):
            why = hipacc.block_reason((s, t), profitability=False)
            if why is None:
                parts[-1].append(t)
            else:
                reasons[(s, t)] = f"illegal: {why}"
                parts.append([t])
        for part in parts:
            kept, dropped = list(part), []
            while len(kept) >= 2 and (why := hipacc.block_reason(kept, profitability=False)
                                      or hipacc.model_reason(kept)):
                reasons[(kept[-2], kept[-1])] = (
                    f"{'unprofitable' if why.startswith('(1.1)') else 'illegal'}: {why}")
                dropped.insert(0, kept.pop())
            if len(kept) >= 2:
                found.append(kept)
            if len(dropped) >= 2:
                work.append(dropped)
    listed = {k for chain in found for k in chain}
    groups = [tuple(chain) for chain in found] + [(k,) for k in problem.kernels
                                                    if k not in listed]
    masks = [bits.mask(g) for g in groups]
    while (cycle := bits.quotient_cycle(masks)) is not None:  # cannot happen on IR chains
        largest = max(cycle, key=lambda m: bin(m).count("1"))
        masks.remove(largest)
        masks.extend(1 << i for i in range(bits.n) if largest >> i & 1)
    return [bits.members(m) for m in masks], reasons, {"chains": len(found),
                                                       "optimal": False}
