"""Search strategies: legal plans, agreement on the optimum, Qiao 2021's partitions, errors."""

from __future__ import annotations

import math
import random

import networkx as nx
import pytest

from kfuse.apps import get_app, list_apps
from kfuse.errors import KfuseError
from kfuse.fusion.plan import check_groups
from kfuse.search import MODELS, search
from kfuse.search.exhaustive import exhaustive_search
from kfuse.search.problem import (
    GRAPH_MODELS,
    STRATEGY_NAMES,
    FusionProblem,
    TooManyCandidates,
    enumerate_groups,
    problem_from_graph,
    random_problem,
    solve,
)

HARRIS_PARTITION = {("dx",), ("dy",), ("sx", "gx"), ("sy", "gy"), ("sxy", "gxy"), ("hc",)}


def _partition(groups) -> set[tuple[str, ...]]:
    return {tuple(g) for g in groups}


# -- the problem ---------------------------------------------------------------------------------

def toy_problem(times: dict[frozenset, float], edges, sharing, names="abcd",
                reason=None) -> FusionProblem:
    """A problem with explicit group times (missing groups: the sum of members plus 1)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    dag.add_edges_from(edges)
    share = nx.Graph()
    share.add_nodes_from(names)
    share.add_edges_from(sharing)

    def group_time(members):
        key = frozenset(members)
        if key in times:
            return times[key]
        return sum(times.get(frozenset([m]), 1.0) for m in members) + 1.0

    def group_reason(members):
        if len(members) < 2:
            return None
        bits = problem.bits
        mask = bits.mask(members)
        if not bits.convex(mask):
            return "not convex"
        if not bits.connected(mask):
            return "no shared array"
        return reason(members) if reason else None

    problem = FusionProblem(kernels=tuple(names), order_dag=dag, sharing=share,
                            group_reason=group_reason, group_time=group_time, model="toy")
    return problem


def cyclic_trap() -> FusionProblem:
    """{a,d} and {b,c} are each convex and very profitable, but together cyclic
    (a -> b, c -> d): the optimum must give up one of them."""
    times = {frozenset("a"): 1.0, frozenset("b"): 1.0, frozenset("c"): 1.0,
             frozenset("d"): 1.0, frozenset("ad"): 0.5, frozenset("bc"): 0.6}
    return toy_problem(times, [("a", "b"), ("c", "d")], [("a", "d"), ("b", "c"),
                                                         ("a", "b"), ("c", "d")])


def test_plan_reason_catches_every_fault():
    problem = cyclic_trap()
    assert problem.plan_reason([("a",), ("b",), ("c",), ("d",)]) is None
    assert "cycle" in problem.plan_reason([("a", "d"), ("b", "c")])
    assert "in no group" in problem.plan_reason([("a",), ("b",), ("c",)])
    assert "in two groups" in problem.plan_reason([("a", "b"), ("b",), ("c",), ("d",)])
    assert "no kernel named" in problem.plan_reason([("a",), ("b",), ("c",), ("d",), ("e",)])
    assert "no shared array" in problem.plan_reason([("b", "d"), ("a",), ("c",)])
    chain = toy_problem({}, [("a", "b"), ("b", "c")], [("a", "b"), ("b", "c"), ("a", "c")],
                        names="abc")
    assert "not convex" in chain.plan_reason([("a", "c"), ("b",)])


def test_problem_rejects_bad_graphs():
    dag = nx.DiGraph([("a", "b"), ("b", "a")])
    with pytest.raises(KfuseError, match="cycle"):
        FusionProblem(("a", "b"), dag, nx.Graph(), lambda m: None, lambda m: 1.0)
    with pytest.raises(KfuseError, match="not in the problem"):
        FusionProblem(("a",), nx.DiGraph([("a", "z")]), nx.Graph(), lambda m: None,
                      lambda m: 1.0)
    with pytest.raises(KfuseError, match="unique"):
        FusionProblem(("a", "a"), nx.DiGraph(), nx.Graph(), lambda m: None, lambda m: 1.0)


def test_enumeration_matches_brute_force():
    problem = random_problem(9, seed=4)
    bits = problem.bits
    found, _ = enumerate_groups(problem)
    brute = [m for m in range(1, bits.full + 1) if bits.legal(m)]
    assert sorted(found) == sorted(brute)


def test_merge_ok_agrees_with_full_check():
    rng = random.Random(1)
    for seed in range(20):
        problem = random_problem(10, seed=seed)
        bits = problem.bits
        groups = [1 << i for i in range(bits.n)]
        gid = list(range(bits.n))
        for _ in range(15):
            a, b = rng.sample(range(len(groups)), 2)
            merged = groups[a] | groups[b]
            trial = [m for g, m in enumerate(groups) if g not in (a, b)] + [merged]
            expected = bits.convex(merged) and bits.acyclic(trial)
            assert bits.merge_ok(gid, groups, merged, (a, b)) == expected
            if expected and bits.legal(merged):
                groups = trial
                gid = [0] * bits.n
                for g, m in enumerate(groups):
                    for i in range(bits.n):
                        if m >> i & 1:
                            gid[i] = g


# -- every strategy gives a legal plan -----------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_strategies_legal_on_apps(strategy):
    for app in list_apps():
        graph = app.build().graph()
        problem = problem_from_graph(graph, check_resources=False)
        result = solve(problem, strategy, seed=3)
        assert problem.plan_reason(result.groups) is None, (app.name, result.groups)
        assert not check_groups(graph, result.groups), (app.name, result.groups)
        assert result.predicted_time_s <= result.unfused_predicted_time_s * 1.02 + 1e-12
        assert math.isclose(result.predicted_time_s, problem.total_time(result.groups))
        fused = {(s, t) for g in result.groups for s in g for t in g}
        for edge in problem.order_dag.edges:
            assert edge in fused or edge in result.reasons, (app.name, edge)


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_search_returns_plans(strategy):
    graph = get_app("harris").build().graph()
    plan = search(graph, strategy, seed=1)
    assert plan.strategy == strategy and plan.model == "roofline"
    assert sorted(m for g in plan.groups for m in g.members) == sorted(
        k.name for k in graph.kernels)
    assert plan.predicted_time_s is not None


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_strategies_legal_on_random_problems(strategy):
    for n, seed in [(1, 0), (2, 1), (5, 2), (7, 3), (9, 4), (11, 5), (12, 6)]:
        problem = random_problem(n, seed=seed, window=4)
        result = solve(problem, strategy, seed=seed, **(
            {"stall_runs": 4} if strategy == "gga" else {}))
        assert problem.plan_reason(result.groups) is None
        assert sorted(k for g in result.groups for k in g) == sorted(problem.kernels)


def _full_scan_greedy(problem, tie_tolerance=0.02):
    """The greedy as first written: rescan every edge after each merge."""
    bits = problem.bits
    groups = [1 << i for i in range(bits.n)]
    while True:
        best = None
        index = {i: g for g, m in enumerate(groups) for i in range(bits.n) if m >> i & 1}
        for s, t in problem.order_dag.edges:
            a, b = index[bits.index[s]], index[bits.index[t]]
            if a == b:
                continue
            merged = groups[a] | groups[b]
            trial = [m for g, m in enumerate(groups) if g not in (a, b)] + [merged]
            if not bits.legal(merged) or not bits.acyclic(trial):
                continue
            apart = bits.time(groups[a]) + bits.time(groups[b])
            gain = apart - bits.time(merged)
            if gain > -tie_tolerance * apart and (best is None or gain > best[0]):
                best = (gain, a, b, merged)
        if best is None:
            return sorted(bits.members(m) for m in groups)
        _, a, b, merged = best
        groups = [m for g, m in enumerate(groups) if g not in (a, b)] + [merged]


def test_greedy_heap_matches_full_scan():
    for n, seed in [(8, 0), (15, 1), (25, 2), (40, 3), (60, 4)]:
        expected = _full_scan_greedy(random_problem(n, seed=seed))
        assert sorted(solve(random_problem(n, seed=seed), "greedy").groups) == expected


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_models_are_never_asked_about_illegal_groups(strategy):
    import dataclasses
    base = random_problem(10, seed=8)

    def strict_time(members):
        assert len(members) == 1 or base.group_reason(members) is None, members
        return base.group_time(members)

    problem = dataclasses.replace(base, group_time=strict_time)
    assert problem.plan_reason(solve(problem, strategy).groups) is None


# -- the optimum ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,seed", [(6, 0), (8, 1), (9, 2), (10, 3), (10, 4), (11, 5)])
def test_exhaustive_exact_gga_agree(n, seed):
    values = {}
    for strategy in ("exhaustive", "exact", "gga"):
        result = solve(random_problem(n, seed=seed), strategy, seed=seed)
        values[strategy] = result.predicted_time_s
    assert values["exact"] == pytest.approx(values["exhaustive"], rel=1e-12)
    assert values["gga"] == pytest.approx(values["exhaustive"], rel=1e-12)
    greedy = solve(random_problem(n, seed=seed), "greedy").predicted_time_s
    assert greedy >= values["exhaustive"] * (1 - 1e-12)


def test_optimum_respects_acyclic_quotient():
    for strategy in ("exhaustive", "exact", "gga"):
        problem = cyclic_trap()
        result = solve(problem, strategy)
        assert problem.plan_reason(result.groups) is None
        assert _partition(result.groups) == {("a", "d"), ("b",), ("c",)}
        assert result.predicted_time_s == pytest.approx(2.5)
    assert solve(cyclic_trap(), "exact").stats["cycle_cuts"] >= 1


def test_exact_beats_or_matches_heuristics_at_30_kernels():
    exact = solve(random_problem(30, seed=7), "exact")
    assert exact.stats["optimal"]
    for strategy in ("greedy", "edges", "mincut", "gga"):
        other = solve(random_problem(30, seed=7), strategy, seed=7)
        assert other.predicted_time_s >= exact.predicted_time_s * (1 - 1e-12), strategy


def test_gga_is_deterministic_under_a_seed():
    first = solve(random_problem(25, seed=3), "gga", seed=11)
    second = solve(random_problem(25, seed=3), "gga", seed=11)
    assert first.groups == second.groups
    assert first.stats["runs"] == second.stats["runs"]
    assert first.stats["generations"] == second.stats["generations"]


def test_gga_progress_bar_and_options():
    result = solve(random_problem(12, seed=2), "gga", progress=True, population=10,
                   stall_runs=2)
    assert result.stats["config"]["population"] == 10
    with pytest.raises(KfuseError, match="unknown gga option"):
        solve(random_problem(5), "gga", populaton=3)


# -- Qiao 2021 ------------------------------------------------------------------------------------

def test_mincut_reproduces_harris_partition():
    plan = search(get_app("harris").build().graph(), "mincut")
    assert _partition(g.members for g in plan.groups) == HARRIS_PARTITION


def test_mincut_and_edges_on_the_thesis_apps():
    expected_mincut = {"sobel": {("dx", "dy", "mag")},
                       "unsharp": {("blur", "sharp", "ratio", "unsharp")},
                       "night": {("atrous0",), ("atrous1", "scoto")}}
    for name, partition in expected_mincut.items():
        problem = problem_from_graph(get_app(name).build().graph(), check_resources=False)
        assert _partition(solve(problem, "mincut").groups) == partition, name
    edges = {"harris": HARRIS_PARTITION,
             "sobel": {("dx",), ("dy",), ("mag",)},
             "night": {("atrous0",), ("atrous1", "scoto")}}
    for name, partition in edges.items():
        problem = problem_from_graph(get_app(name).build().graph(), check_resources=False)
        assert _partition(solve(problem, "edges").groups) == partition, name


def test_mincut_harris_weights_follow_the_thesis():
    from kfuse.search.mincut import Hipacc
    hipacc = Hipacc(problem_from_graph(get_app("harris").build().graph(),
                                       check_resources=False))
    legal = {e for e, w in hipacc.weights.items() if w > hipacc.epsilon}
    assert legal == {("sx", "gx"), ("sy", "gy"), ("sxy", "gxy")}
    # P -> L: 400 - c_ALU * n_ALU * IS_in * 9; sxy reads two images
    assert hipacc.weights[("sx", "gx")] == pytest.approx(400 - 4 * 1 * 1 * 9)
    assert hipacc.weights[("sxy", "gxy")] == pytest.approx(400 - 4 * 1 * 2 * 9)
    assert "L5'" in hipacc.block_reason(problem_from_graph(
        get_app("harris").build().graph(), check_resources=False).kernels)


# -- models, laziness, errors --------------------------------------------------------------------

def test_unknown_strategy_and_model():
    graph = get_app("sobel").build().graph()
    with pytest.raises(KfuseError, match="unknown search strategy 'annealing'.*gga"):
        search(graph, "annealing")
    with pytest.raises(KfuseError, match="unknown model 'nope'.*roofline"):
        search(graph, "greedy", model="nope")
    with pytest.raises(KfuseError, match="unknown search strategy"):
        solve(random_problem(4), "annealing")


def test_registered_models_are_used(monkeypatch):
    graph = get_app("sobel").build().graph()
    assert "roofline" in GRAPH_MODELS and MODELS is GRAPH_MODELS

    def apart_is_better(graph, members, outputs, sizes, profile):
        return 1.0 if len(members) == 1 else math.inf

    monkeypatch.setitem(GRAPH_MODELS, "never", apart_is_better)
    plan = search(graph, "exact", model="never")
    assert plan.model == "never"
    assert all(len(g.members) == 1 for g in plan.groups)
    assert any("model" in d.reason for d in plan.decisions)


def test_expensive_rule_is_checked_lazily():
    times = {frozenset("a"): 1.0, frozenset("b"): 1.0, frozenset("c"): 1.0,
             frozenset("d"): 1.0, frozenset("abcd"): 1.0}
    problem = toy_problem(times, [("a", "b"), ("b", "c"), ("c", "d")],
                          [("a", "b"), ("b", "c"), ("c", "d")])
    calls = []

    def expensive(members):
        calls.append(members)
        return "resources: too big" if len(members) == 4 else problem.group_reason(members)

    import dataclasses
    lazy = dataclasses.replace(problem, group_reason=expensive,
                               cheap_reason=problem.group_reason)
    result = solve(lazy, "exact")
    assert ("a", "b", "c", "d") not in result.groups
    assert result.stats["excluded_groups"] == 1
    assert lazy.plan_reason(result.groups) is None
    assert len(calls) < 10  # only the groups of proposed answers were checked


def test_limits_raise_clear_errors():
    with pytest.raises(KfuseError, match="limited to 12 kernels"):
        exhaustive_search(random_problem(13))
    with pytest.raises(TooManyCandidates, match="gga"):
        solve(random_problem(30, seed=1), "exact", max_candidates=20)
    capped = solve(random_problem(20, seed=2), "exact", max_group_size=2)
    assert all(len(g) <= 2 for g in capped.groups)
    assert capped.stats["optimal"] is False


# -- kfuse plan: seed, strategies and models from the command line --------------------------------

def _plan_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from kfuse.cli.main import main
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_passes_the_seed_to_the_search(capsys, monkeypatch):
    import kfuse.search

    seen = {}
    real = kfuse.search.search

    def spy(graph, strategy="greedy", model="roofline", **options):
        seen.update(strategy=strategy, model=model, seed=options.get("seed"))
        return real(graph, strategy, model, **options)

    monkeypatch.setattr(kfuse.search, "search", spy)
    code, _, _ = _plan_cli(capsys, "sobel", "--strategy", "greedy", "--seed", "7")
    assert code == 0 and seen == {"strategy": "greedy", "model": "roofline", "seed": 7}


def test_plan_gga_is_deterministic_under_a_seed(capsys):
    code, first, _ = _plan_cli(capsys, "unsharp", "--strategy", "gga", "--model", "wahib",
                               "--seed", "5", "--json")
    assert code == 0
    code, second, _ = _plan_cli(capsys, "unsharp", "--strategy", "gga", "--model", "wahib",
                                "--seed", "5", "--json")
    assert code == 0 and first == second
    import json
    plan = json.loads(first)
    assert plan["strategy"] == "gga" and plan["model"] == "wahib"


def _cuda_usable() -> bool:
    from kfuse.runtime.cuda_backend import CudaBackend
    return CudaBackend.available()


@pytest.mark.skipif(_cuda_usable(), reason="checks the message on a machine without a GPU")
def test_plan_with_the_measured_model_says_it_needs_a_gpu(capsys):
    code, out, err = _plan_cli(capsys, "sobel", "--model", "measured")
    assert code == 2 and not out
    assert "measuring needs the cuda backend" in err and "Traceback" not in err
