"""Reachability and convexity over an order DAG, on bit masks.

A group of kernels can become one kernel only if it is *convex*: no path of the order DAG
leaves the group and comes back (Wahib & Maruyama 2014, constraint 1.3); a kernel on such a
path would have to run both before and after the fused kernel. One implementation serves
the legality rules (:mod:`kfuse.fusion.legality`), the planners (:mod:`kfuse.search`) and
the codeless projection (:mod:`kfuse.project`): node ``i`` of the caller's numbering is bit
``i``; descendants and ancestors of every node are computed once, in topological order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from kfuse.ir.graph import Graph


def iter_bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Reachability:
    """Who is above and below whom in a DAG whose nodes are numbered by ``nodes`` (node
    ``nodes[i]`` is bit ``i``)."""

    def __init__(self, dag: nx.DiGraph, nodes: Sequence[Hashable]):
        self.nodes = tuple(nodes)
        self.index = {node: i for i, node in enumerate(self.nodes)}
        count = len(self.nodes)
        self.successors = [0] * count
        self.predecessors = [0] * count
        numbered = nx.DiGraph()
        numbered.add_nodes_from(range(count))
        for source, target in dag.edges:
            i, j = self.index[source], self.index[target]
            self.successors[i] |= 1 << j
            self.predecessors[j] |= 1 << i
            numbered.add_edge(i, j)
        # topological order, ties broken by number (so messages that name "the first" are
        # the same from run to run)
        self.topological = list(nx.lexicographical_topological_sort(numbered))
        self.rank = [0] * count
        for rank, i in enumerate(self.topological):
            self.rank[i] = rank
        self.descendants = [0] * count
        for i in reversed(self.topological):
            below = 0
            for j in iter_bits(self.successors[i]):
                below |= (1 << j) | self.descendants[j]
            self.descendants[i] = below
        self.ancestors = [0] * count
        for i in self.topological:
            above = 0
            for j in iter_bits(self.predecessors[i]):
                above |= (1 << j) | self.ancestors[j]
            self.ancestors[i] = above

    def mask(self, nodes: Iterable[Hashable]) -> int:
        """The bit mask of ``nodes``."""
        mask = 0
        for node in nodes:
            mask |= 1 << self.index[node]
        return mask

    def below(self, mask: int) -> int:
        """Every node below some member of ``mask``."""
        found = 0
        for i in iter_bits(mask):
            found |= self.descendants[i]
        return found

    def above(self, mask: int) -> int:
        """Every node above some member of ``mask``."""
        found = 0
        for i in iter_bits(mask):
            found |= self.ancestors[i]
        return found

    def between(self, mask: int) -> int:
        """The nodes outside ``mask`` on a path that leaves it and comes back (none: the
        group is convex)."""
        return self.below(mask) & self.above(mask) & ~mask

    def convex(self, mask: int) -> bool:
        """No path leaves the group and comes back."""
        return not self.between(mask)

    def first_between(self, members: Iterable[Hashable]) -> Hashable | None:
        """Of the nodes on a path that leaves ``members`` and comes back, the one numbered
        first (None: the group is convex)."""
        between = self.between(self.mask(members))
        return self.nodes[(between & -between).bit_length() - 1] if between else None



def independent_sets(dependencies: Mapping[int, set[int]], count: int) -> list[list[int]]:
    """Kernels ``0..count-1`` (``dependencies[i]``: the kernels ``i`` reads from) grouped by
    level, the longest path that reaches them: kernels of one level have no path between
    them."""
    level: dict[int, int] = {}
    for index in range(count):  # program order is a topological order
        level[index] = 1 + max((level[j] for j in dependencies.get(index, ())), default=-1)
    grouped: dict[int, list[int]] = {}
    for index, depth in level.items():
        grouped.setdefault(depth, []).append(index)
    return [grouped[depth] for depth in sorted(grouped)]


def path_between(graph: Graph, first: Sequence[str], second: Sequence[str]) -> list[str]:
    """A shortest path of ``graph``'s order DAG from a kernel of ``first`` to one of
    ``second`` or back (kernel names), or [] where there is none: two groups with no path
    between them may run at the same time, in any order."""
    dag = graph.order_dag()
    for sources, targets in ((first, second), (second, first)):
        best: list[str] = []
        for source in sources:
            lengths = nx.single_source_shortest_path(dag, source)
            for target in targets:
                if target in lengths and (not best or len(lengths[target]) < len(best)):
                    best = lengths[target]
        if best:
            return best
    return []
