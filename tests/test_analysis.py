"""kfuse.analysis: reachability and convexity on bit masks, against networkx on random DAGs."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest

from kfuse.analysis import Reachability


def random_dag(seed: int, count: int = 9) -> nx.DiGraph:
    rng = random.Random(seed)
    dag = nx.DiGraph()
    names = [f"k{i}" for i in rng.sample(range(100), count)]  # numbering != order
    dag.add_nodes_from(names)
    for a, b in itertools.combinations(names, 2):
        if rng.random() < 0.3:
            dag.add_edge(a, b)
    return dag


@pytest.mark.parametrize("seed", range(12))
def test_convexity_matches_the_definition(seed):
    dag = random_dag(seed)
    nodes = sorted(dag.nodes)  # the caller's numbering
    reach = Reachability(dag, nodes)
    rng = random.Random(seed)
    for _ in range(60):
        group = set(rng.sample(nodes, rng.randint(1, 5)))
        above = set().union(*(nx.ancestors(dag, n) for n in group))
        below = set().union(*(nx.descendants(dag, n) for n in group))
        between = (above & below) - group
        mask = reach.mask(group)
        assert reach.convex(mask) == (not between)
        assert {nodes[i] for i in range(len(nodes)) if reach.between(mask) >> i & 1} == between
        expected = min(between, key=nodes.index) if between else None
        assert reach.first_between(group) == expected
    for node in nodes:
        i = reach.index[node]
        assert reach.descendants[i] == reach.mask(nx.descendants(dag, node))
        assert reach.ancestors[i] == reach.mask(nx.ancestors(dag, node))
        assert all(reach.rank[reach.index[a]] < reach.rank[reach.index[b]]
                   for a, b in dag.edges)
