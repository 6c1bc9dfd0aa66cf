"""The fusion problem every search strategy solves: kernels, precedence, legality, cost.

A :class:`FusionProblem` is a set-partitioning problem (Wahib & Maruyama 2014 Fig. 4, Wahib & Maruyama 2014b Eq. 1):
split the kernels into groups, each run as one fused kernel, so that every group is legal
on its own (``group_reason``: convexity 1.3, kinship 1.5, resources 1.6/1.7 and whatever
rule the model adds), the groups can run in some order (the quotient of the order DAG is
acyclic, a rule the papers leave implicit) and the summed predicted time is least.

It knows nothing of the IR: ``problem_from_graph`` builds one from a pipeline with a
registered model (:data:`GRAPH_MODELS`), the codeless projection builds one from kernel
metadata, ``random_problem`` builds synthetic ones for tests and benchmarks. Strategies
run on it through :func:`solve` and return a :class:`SearchResult`.

Strategies work on bitmasks (kernel ``i`` of ``kernels`` is bit ``i``): a group is an
``int``; convexity is ``(∪desc) ∩ (∪anc) ⊆ S``; legality and time are memoised per mask
(:class:`Bits`). That is what makes a 1000-kernel search run in Python.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from kfuse.analysis.order import Reachability, iter_bits
from kfuse.errors import FusionError, KfuseError
from kfuse.model import qiao, roofline, wahib
from kfuse.schedule.forms import Form

GroupRule = Callable[[tuple[str, ...]], "str | None"]
MEMO_LIMIT = 200_000  # masks whose descendants/ancestors are remembered
GroupCost = Callable[[tuple[str, ...]], float]


# ------------------------------------------------------------------------------------------
# the problem
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FusionProblem:
    """A fusion (set-partitioning) problem: kernels, precedence, legality, cost.

    ``group_reason(members)`` is ``None`` when the members (in ``kernels`` order) may run
    as one fused kernel, else the reason in words; it covers convexity, kinship and every
    model or resource rule. ``group_time(members)`` is the predicted seconds of the group
    run as one kernel (a singleton is the kernel alone); ``math.inf`` marks a group the
    model cannot run. Singletons are always legal.

    Optional, for speed: ``cheap_reason`` is ``group_reason`` without its expensive rules
    (compiling a candidate); strategies then search with it and :func:`solve` checks the
    groups of the answer with ``group_reason``, excluding failures and solving again (a
    lazy constraint). ``hereditary_reason`` gives a reason only when every superset of the
    group fails too (iteration spaces, monotone resources); exact enumeration prunes with it.
    ``graph`` and ``sizes`` keep the IR a problem came from (Qiao 2021's searches read
    operator classes and windows from it).
    """

    kernels: tuple[str, ...]
    order_dag: nx.DiGraph
    sharing: nx.Graph
    group_reason: GroupRule
    group_time: GroupCost
    model: str = "roofline"
    cheap_reason: GroupRule | None = field(default=None, compare=False, repr=False)
    hereditary_reason: GroupRule | None = field(default=None, compare=False, repr=False)
    graph: Any = field(default=None, compare=False, repr=False)
    sizes: Mapping[str, int] | None = field(default=None, compare=False, repr=False)
    name: str = "problem"

    def __post_init__(self) -> None:
        kernels = tuple(self.kernels)
        object.__setattr__(self, "kernels", kernels)
        if not kernels:
            raise KfuseError("a fusion problem needs at least one kernel")
        if len(set(kernels)) != len(kernels):
            twice = sorted({k for k in kernels if kernels.count(k) > 1})
            raise KfuseError(f"kernel names must be unique; repeated: {twice}")
        known = set(kernels)
        for graph, what in ((self.order_dag, "order DAG"), (self.sharing, "sharing graph")):
            unknown = [n for n in graph.nodes if n not in known]
            if unknown:
                raise KfuseError(f"the {what} names kernels that are not in the problem: "
                                 f"{sorted(map(str, unknown))[:5]}")
        if not nx.is_directed_acyclic_graph(self.order_dag):
            cycle = nx.find_cycle(self.order_dag)
            raise KfuseError("the order DAG has a cycle: "
                             + " -> ".join(str(e[0]) for e in cycle))

    # -- the bitmask view every strategy uses ------------------------------------------------
    @cached_property
    def bits(self) -> Bits:
        """Bitmask tables and memoised legality and time (built once per problem)."""
        return Bits(self)

    # -- plan-level checks -------------------------------------------------------------------
    def plan_reason(self, groups: Sequence[Sequence[str]]) -> str | None:
        """Why ``groups`` is not a legal plan, or ``None``.

        Checks the partition (every kernel in exactly one group), every group's legality
        and that the quotient graph of the order DAG over the groups is acyclic.
        """
        groups = [tuple(g) for g in groups]
        seen: dict[str, int] = {}
        for index, group in enumerate(groups):
            if not group:
                return "partition: an empty group"
            for name in group:
                if name not in self.bits.index:
                    return f"partition: no kernel named {name!r}"
                if name in seen:
                    return f"partition: '{name}' is in two groups"
                seen[name] = index
        missing = [k for k in self.kernels if k not in seen]
        if missing:
            return f"partition: {missing} are in no group"
        bits = self.bits
        for group in groups:
            if len(group) > 1:
                reason = bits.full_reason(bits.mask(group))
                if reason:
                    return f"group {list(bits.members(bits.mask(group)))}: {reason}"
        cycle = bits.quotient_cycle([bits.mask(g) for g in groups])
        if cycle:
            names = [list(bits.members(m)) for m in cycle]
            return f"acyclic: groups {names} depend on each other in a cycle"
        return None

    def total_time(self, groups: Iterable[Sequence[str]]) -> float:
        """Predicted seconds of the plan: the sum over its groups."""
        bits = self.bits
        return sum(bits.time(bits.mask(g)) for g in groups)

    def unfused_time(self) -> float:
        """Predicted seconds with one kernel per operator."""
        return sum(self.bits.time(1 << i) for i in range(len(self.kernels)))


@dataclass
class SearchResult:
    """What a strategy found: groups (in an executable order), times, reasons, statistics."""

    groups: list[tuple[str, ...]]
    predicted_time_s: float
    unfused_predicted_time_s: float
    reasons: dict[tuple[str, str], str]
    stats: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Predicted unfused time over fused time."""
        return self.unfused_predicted_time_s / self.predicted_time_s


# ------------------------------------------------------------------------------------------
# bitmask machinery shared by the strategies
# ------------------------------------------------------------------------------------------

def popcount(mask: int) -> int:
    return mask.bit_count()


class Bits:
    """Bitmask tables of a problem and memoised legality and time per group mask.

    Kernel ``i`` (of ``problem.kernels``) is bit ``i``. ``desc``/``anc`` are transitive,
    ``succ``/``pred`` direct, ``nbr`` the sharing neighbours. ``banned`` holds groups that
    failed the expensive rules (see ``FusionProblem.cheap_reason``).
    """

    def __init__(self, problem: FusionProblem) -> None:
        self.problem = problem
        self.names = problem.kernels
        self.n = len(self.names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.full = (1 << self.n) - 1
        n = self.n
        reach = Reachability(problem.order_dag, self.names)  # convexity (kfuse.analysis)
        self.succ, self.pred = reach.successors, reach.predecessors
        self.edges = [(self.index[source], self.index[target])
                      for source, target in problem.order_dag.edges]
        self.nbr = [0] * n
        for a, b in problem.sharing.edges:
            if a != b:
                i, j = self.index[a], self.index[b]
                self.nbr[i] |= 1 << j
                self.nbr[j] |= 1 << i
        self.topo, self.topo_rank = reach.topological, reach.rank
        self.desc, self.anc = reach.descendants, reach.ancestors
        self.nbr_list = [tuple(iter_bits(m)) for m in self.nbr]  # sharing neighbours
        self.succ_list = [tuple(iter_bits(m)) for m in self.succ]
        self._out: dict[int, int] = {}
        self._bits_memo: dict[int, tuple[int, ...]] = {}
        self._around: dict[int, int] = {}
        self._legal: dict[int, bool] = {}
        self._reason: dict[int, str | None] = {}
        self._full: dict[int, str | None] = {}
        self._time: dict[int, float] = {}
        self.banned: dict[int, str] = {}
        self.dead_cache: dict[int, bool] = {}  # hereditary failures (enumeration pruning)
        self._down: dict[int, int] = {}
        self._up: dict[int, int] = {}
        self.evaluations = 0

    # -- conversions ---------------------------------------------------------------------------
    def mask(self, names: Iterable[str]) -> int:
        m = 0
        for name in names:
            m |= 1 << self.index[name]
        return m

    def members(self, mask: int) -> tuple[str, ...]:
        """Kernel names of a mask, in ``kernels`` order."""
        return tuple(self.names[i] for i in iter_bits(mask))

    def bits_of(self, mask: int) -> tuple[int, ...]:
        """``tuple(iter_bits(mask))``, memoised (groups recur; hot loops iterate them)."""
        found = self._bits_memo.get(mask)
        if found is None:
            found = tuple(iter_bits(mask))
            if len(self._bits_memo) < MEMO_LIMIT:
                self._bits_memo[mask] = found
        return found

    # -- structure -----------------------------------------------------------------------------
    def around(self, mask: int) -> int:
        """The sharing neighbours of the members (members included when they share),
        memoised."""
        return self._union_of_rows(mask, self.nbr, self._around)

    def out(self, mask: int) -> int:
        """The direct successors of the members (members included when they follow one
        another), memoised."""
        return self._union_of_rows(mask, self.succ, self._out)

    def _union_of_rows(self, mask: int, rows: list[int], memo: dict[int, int]) -> int:
        """The union of ``rows[i]`` over the members ``i`` of ``mask``, memoised in ``memo``."""
        found = memo.get(mask)
        if found is None:
            found = 0
            for i in self.bits_of(mask):
                found |= rows[i]
            if len(memo) < MEMO_LIMIT:
                memo[mask] = found
        return found

    def down(self, mask: int) -> int:
        """Every kernel below some member (memoised)."""
        return self._union_of_rows(mask, self.desc, self._down)

    def up(self, mask: int) -> int:
        """Every kernel above some member (memoised)."""
        return self._union_of_rows(mask, self.anc, self._up)

    def convex(self, mask: int) -> bool:
        """No order-DAG path leaves the group and comes back (Wahib & Maruyama 2014 constraint 1.3)."""
        return not (self.down(mask) & self.up(mask) & ~mask)

    def connected(self, mask: int) -> bool:
        """Members linked through shared arrays (degree of kinship > 0, constraint 1.5)."""
        start = mask & -mask
        reached = start
        frontier = start
        nbr = self.nbr
        while frontier:
            new = 0
            for i in iter_bits(frontier):
                new |= nbr[i]
            new &= mask & ~reached
            reached |= new
            frontier = new
        return reached == mask

    # -- legality and time, memoised -----------------------------------------------------------
    def legal(self, mask: int, remember: bool = True) -> bool:
        """The group may be fused (cheap rules plus groups already found illegal).

        ``remember=False`` keeps an illegal answer out of the memo (enumeration looks at
        each set once; remembering millions of rejects only costs memory)."""
        found = self._legal.get(mask)
        if found is None:
            if mask & (mask - 1) == 0:
                found = True
            elif mask in self.banned or not self.convex(mask) or not self.connected(mask):
                found = False
            else:
                found = self._rule(mask) is None and not math.isinf(self.time(mask))
            if remember or found:
                self._legal[mask] = found
        return found

    def reason(self, mask: int) -> str | None:
        """Why the group may not be fused under the cheap rules, or ``None``."""
        if self.legal(mask):
            return None
        if mask not in self._reason:
            if mask in self.banned:
                text = self.banned[mask]
            else:
                text = self._rule(mask)
                if text is None and (not self.convex(mask) or not self.connected(mask)):
                    text = self._structural_text(mask)
                if text is None:
                    text = f"model: the {self.problem.model} model cannot run this group"
            self._reason[mask] = text
        return self._reason[mask]

    def _rule(self, mask: int) -> str | None:
        rule = self.problem.cheap_reason or self.problem.group_reason
        return rule(self.members(mask))

    def full_reason(self, mask: int) -> str | None:
        """``group_reason`` itself (expensive rules included), memoised."""
        if mask & (mask - 1) == 0:
            return None
        if mask not in self._full:
            cheap = self.reason(mask)
            if cheap is not None:
                self._full[mask] = cheap
            elif self.problem.cheap_reason is None:
                self._full[mask] = None
            else:
                self._full[mask] = self.problem.group_reason(self.members(mask))
        return self._full[mask]

    def ban(self, mask: int, reason: str) -> None:
        """Mark a group illegal (it failed an expensive rule)."""
        self.banned[mask] = reason
        self._reason[mask] = reason
        self._legal[mask] = False

    def _structural_text(self, mask: int) -> str:
        if not self.convex(mask):
            between = self.down(mask) & self.up(mask) & ~mask
            first = self.names[min(iter_bits(between), key=self.topo_rank.__getitem__)]
            return (f"convex: not convex: '{first}' depends on the group and the group "
                    f"depends on it")
        return "connected: members share no data (degree of kinship 0)"

    def time(self, mask: int) -> float:
        """Predicted seconds of the group as one kernel (memoised)."""
        found = self._time.get(mask)
        if found is None:
            self.evaluations += 1
            found = float(self.problem.group_time(self.members(mask)))
            self._time[mask] = found
        return found

    # -- plans ---------------------------------------------------------------------------------
    def _acyclic_gid(self, groups: Sequence[int]) -> tuple[bool, list[int]]:
        gid = [-1] * self.n
        for g, m in enumerate(groups):
            for i in iter_bits(m):
                gid[i] = g
        out: list[set[int]] = [set() for _ in groups]
        for i, j in self.edges:
            a, b = gid[i], gid[j]
            if a != b and a >= 0 and b >= 0:
                out[a].add(b)
        indegree = [0] * len(groups)
        for targets in out:
            for b in targets:
                indegree[b] += 1
        ready = [g for g, d in enumerate(indegree) if d == 0]
        done = 0
        while ready:
            g = ready.pop()
            done += 1
            for b in out[g]:
                indegree[b] -= 1
                if indegree[b] == 0:
                    ready.append(b)
        return done == len(groups), gid

    def acyclic(self, groups: Sequence[int]) -> bool:
        """The quotient of the order DAG over ``groups`` (masks) has no cycle."""
        return self._acyclic_gid(groups)[0]

    def quotient_cycle(self, groups: Sequence[int]) -> list[int] | None:
        """Groups (masks) forming a cycle of the quotient graph, or ``None`` if acyclic
        (the cycle ``networkx.find_cycle`` gives on the quotient built in edge order, as
        :func:`kfuse.fusion.legality.plan_violations` reports it)."""
        fine, gid = self._acyclic_gid(groups)
        if fine:
            return None
        quotient = nx.DiGraph()
        quotient.add_nodes_from(range(len(groups)))
        for i, j in self.edges:
            if gid[i] != gid[j] and gid[i] >= 0 and gid[j] >= 0:
                quotient.add_edge(gid[i], gid[j])
        cycle = nx.find_cycle(quotient)
        return [groups[edge[0]] for edge in cycle]

    def merge_ok(self, gid: Sequence[int], groups: Sequence[int], z: int,
                 skip: Iterable[int] = (), within: int | None = None) -> bool:
        """Can group ``z`` replace the groups ``skip`` of a partition and keep it acyclic?

        ``gid[i]`` is kernel ``i``'s group index in ``groups`` or -1 for a kernel not
        placed yet (it counts as a singleton). The partition without ``skip`` must be
        acyclic already; then a new cycle passes through ``z``: follow group-level
        descendants of ``z`` and fail if they lead back into it. Kernel-level convexity
        is checked first (it catches paths through unplaced kernels). ``within`` limits the
        search to those kernels: valid when no path from outside them leads back into
        ``z`` (e.g. kernels placed in topological order, the rest all later).
        """
        down = self.down(z)
        if down & self.up(z) & ~z:
            return False
        seen = set(skip)
        frontier = down & ~z
        if within is not None:
            frontier &= within
        reached = frontier
        down_of = self.down
        while frontier:
            new = 0
            for i in iter_bits(frontier):
                g = gid[i]
                if g >= 0 and g not in seen:
                    seen.add(g)
                    m = groups[g]
                    new |= m | down_of(m)
            if new & z:
                return False
            new &= ~reached
            if within is not None:
                new &= within
            reached |= new
            frontier = new
        return True

    def order(self, groups: Sequence[int]) -> list[int]:
        """Groups (masks) in an executable order: topological on the quotient, ties by the
        position of each group's first kernel."""
        gid = [-1] * self.n
        for g, m in enumerate(groups):
            for i in iter_bits(m):
                gid[i] = g
        quotient = nx.DiGraph()
        quotient.add_nodes_from(range(len(groups)))
        for i, j in self.edges:
            if gid[i] != gid[j]:
                quotient.add_edge(gid[i], gid[j])
        first = [min(iter_bits(m)) for m in groups]
        return [groups[g] for g in nx.lexicographical_topological_sort(
            quotient, key=first.__getitem__)]


# ------------------------------------------------------------------------------------------
# candidate groups (exhaustive and exact)
# ------------------------------------------------------------------------------------------

class TooManyCandidates(KfuseError):
    """The exact search gave up on an instance: too many candidate groups, or its time
    limit passed before it proved an optimum."""


def enumerate_groups(problem: FusionProblem, max_size: int | None = None,
                     max_candidates: int = 200_000, max_visits: int = 5_000_000,
                     within: int | None = None, remember: bool = False,
                     deadline: float | None = None) -> tuple[list[int], dict]:
    """Every legal group (as masks), singletons included, and enumeration statistics.

    Only convex sets are generated: from a set ``S`` (lowest kernel ``v``) grow
    ``hull(S + w)`` for each sharing neighbour ``w > v``, once per distinct set. Every
    legal group ``C`` is reached, since each step stays inside ``C`` (``C`` is convex and
    connected through shared arrays). A set is not grown further when its hull holds a
    kernel below ``v``, exceeds ``max_size`` or fails ``hereditary_reason`` (no superset
    can be legal then). Raises :class:`TooManyCandidates` past ``max_candidates`` legal
    groups or ``max_visits`` convex sets looked at. ``stats['size_capped']`` tells whether
    ``max_size`` cut off some set that could have grown into a legal group. ``within``
    restricts groups to the kernels of that mask; ``remember`` keeps rejected sets in the
    legality memo (worth it when the same region is enumerated again). Past ``deadline``
    (a ``time.perf_counter()`` value) it raises :class:`TooManyCandidates` too.
    """
    bits = problem.bits
    hereditary = problem.hereditary_reason
    nbr, desc, anc = bits.nbr, bits.desc, bits.anc
    region = bits.full if within is None else within
    result = [1 << i for i in iter_bits(region)]
    visits = 0
    capped = False
    dead_cache = bits.dead_cache

    def dead(mask: int) -> bool:
        if hereditary is None:
            return False
        found = dead_cache.get(mask)
        if found is None:
            found = hereditary(bits.members(mask)) is not None
            if len(dead_cache) < MEMO_LIMIT:
                dead_cache[mask] = found
        return found

    for v in iter_bits(region):
        below = ((1 << v) - 1) | (bits.full & ~region)
        seen: set[int] = set()
        stack = [(1 << v, desc[v], anc[v], nbr[v])]
        while stack:
            subset, down, up, around = stack.pop()
            for w in iter_bits(around & ~subset & ~below & ~(1 << v)):
                grown_down = down | desc[w]
                grown_up = up | anc[w]
                grown = subset | (1 << w) | (grown_down & grown_up)
                if grown & below or grown in seen:
                    continue
                seen.add(grown)
                visits += 1
                if visits > max_visits:
                    raise TooManyCandidates(
                        f"more than {max_visits} convex kernel sets to look at; limit the "
                        "group size (max_group_size) or use the gga strategy")
                if deadline is not None and visits % 256 == 0 and time.perf_counter() > deadline:
                    raise TooManyCandidates(
                        f"ran out of time enumerating candidate groups ({visits} convex sets "
                        f"looked at, {len(result)} legal); use the gga strategy")
                if max_size is not None and popcount(grown) > max_size:
                    capped = capped or not dead(grown)
                    continue
                if dead(grown):
                    continue
                if bits.legal(grown, remember):
                    result.append(grown)
                    if len(result) > max_candidates:
                        raise TooManyCandidates(
                            f"more than {max_candidates} legal candidate groups; limit the "
                            "group size (max_group_size) or use the gga strategy")
                extra = grown & ~subset
                widened = around
                for i in iter_bits(extra):
                    widened |= nbr[i]
                stack.append((grown, grown_down, grown_up, widened))
    return result, {"candidates": len(result), "visited_sets": visits, "size_capped": capped}


# ------------------------------------------------------------------------------------------
# explanations
# ------------------------------------------------------------------------------------------

def edge_reasons(problem: FusionProblem, groups: Sequence[Sequence[str]]
                 ) -> dict[tuple[str, str], str]:
    """Why each order-DAG edge between two different groups of the plan was not fused."""
    bits = problem.bits
    masks = [bits.mask(g) for g in groups]
    gid = {name: g for g, group in enumerate(groups) for name in group}
    index_gid = [gid[name] for name in bits.names]
    reasons: dict[tuple[str, str], str] = {}
    for source, target in problem.order_dag.edges:
        a, b = gid[source], gid[target]
        if a == b:
            continue
        merged = masks[a] | masks[b]
        reason = bits.reason(merged)
        if reason is None and not bits.merge_ok(index_gid, masks, merged, (a, b)):
            reason = "acyclic: the two groups would depend on each other in a cycle"
            if bits.n <= 300:
                trial = [m for g, m in enumerate(masks) if g not in (a, b)] + [merged]
                cycle = bits.quotient_cycle(trial) or []
                reason = ("acyclic: groups "
                          f"{[list(bits.members(m)) for m in cycle]} would depend on each "
                          "other in a cycle")
        if reason is not None:
            reasons[(source, target)] = f"illegal: {reason}"
            continue
        apart = bits.time(masks[a]) + bits.time(masks[b])
        together = bits.time(merged)
        if together >= apart:
            reasons[(source, target)] = (f"unprofitable: predicted {together * 1e3:.3f} ms "
                                         f"fused vs {apart * 1e3:.3f} ms apart")
        else:
            reasons[(source, target)] = (
                f"not chosen: merging the two kernels alone saves "
                f"{(apart - together) * 1e6:.2f} us but the plan as a whole does better")
    return reasons


# ------------------------------------------------------------------------------------------
# problems from the IR
# ------------------------------------------------------------------------------------------

GraphModel = Callable[[Any, Sequence[str], Sequence[str], Mapping[str, int], Any], float]


def _roofline(graph: Any, members: Sequence[str], outputs: Sequence[str],
              sizes: Mapping[str, int], profile: Any) -> float:
    return roofline.predict_group(graph, members, outputs, sizes, profile).time_s


# Models a pipeline can be planned with: name -> f(graph, members, outputs, sizes, profile)
# giving seconds. A model may return math.inf, or raise FusionError with the reason, for a
# group it cannot run; the group is then illegal. (``measured``, which times groups on the
# GPU, joins from kfuse.tune.)
GRAPH_MODELS: dict[str, GraphModel] = {
    "roofline": _roofline,
    "wahib": wahib.graph_group_time,
    "wahib-norm": wahib.graph_group_time_normalized,
    "qiao": qiao.graph_group_time,
}


# Rules of kfuse.fusion.legality that a superset of a failing group fails too (the failing
# members, or their pair, are still there); only those of GROUP_RULES are used for pruning.
HEREDITARY_GRAPH_RULES = frozenset({
    "rule_no_opaque", "rule_no_reduction_consumed_inside", "rule_reductions_fusible",
    "rule_same_nesting_depth"})


def problem_from_graph(graph: Any, model: str = "roofline",
                       sizes: Mapping[str, int] | None = None, profile: Any = None,
                       check_resources: bool = True) -> FusionProblem:
    """The fusion problem of an IR graph under a registered model.

    Legality is :func:`kfuse.fusion.legality.group_violations` plus, for groups whose
    registers or shared memory can grow (recompute, staged), the compiled resource check
    (``check_resources``; needs nvcc): that one is the expensive rule, checked lazily.
    """
    from kfuse.fusion.legality import group_violations
    from kfuse.fusion.plan import group_outputs
    from kfuse.model.device import current_profile
    from kfuse.model.roofline import nominal_sizes
    from kfuse.schedule.forms import default_form

    if model not in GRAPH_MODELS:
        raise KfuseError(f"unknown model {model!r}; available: {', '.join(GRAPH_MODELS)}")
    predict = GRAPH_MODELS[model]
    given_sizes = dict(sizes) if sizes else None  # kernels checked compiled for these
    sizes = given_sizes or nominal_sizes(graph)
    profile = profile or current_profile()
    order = graph.order_dag()
    dag = nx.DiGraph()
    dag.add_nodes_from(k.name for k in graph.kernels)
    dag.add_edges_from(order.edges(data=True))
    sharing = nx.Graph()
    sharing.add_nodes_from(k.name for k in graph.kernels)
    touched = [(k.name, set(k.reads) | set(k.writes)) for k in graph.kernels]
    for index, (first, arrays) in enumerate(touched):
        for second, others in touched[index + 1:]:
            if arrays & others:
                sharing.add_edge(first, second)
    model_reasons: dict[tuple[str, ...], str] = {}

    def group_time(members: tuple[str, ...]) -> float:
        try:
            return float(predict(graph, members, group_outputs(graph, members), sizes, profile))
        except FusionError as error:
            model_reasons[members] = f"model: {error}"
            return math.inf

    def cheap_reason(members: tuple[str, ...]) -> str | None:
        violations = group_violations(graph, list(members))
        if violations:
            return str(violations[0])
        return model_reasons.get(members)

    from kfuse.fusion import legality
    inherited = [rule for rule in legality.GROUP_RULES
                 if rule.__name__ in HEREDITARY_GRAPH_RULES]

    def hereditary_reason(members: tuple[str, ...]) -> str | None:
        if len(members) < 2:
            return None
        for rule in inherited:
            reason = rule(graph, members)
            if reason:
                return reason
        return None

    # groups whose kernel fits no register tile, by form: a group of the same form
    # holding one of them computes all it computes, at more points, so it does not fit
    # either (not compiled: a long chain's kernel takes minutes)
    too_large: dict[Form, list[tuple[frozenset[str], str]]] = {}

    def resource_reason(members: tuple[str, ...]) -> str | None:
        form = default_form(graph, members)
        if not form.grows:
            return None
        held = frozenset(members)
        for part, reason in too_large.get(form, ()):
            if part <= held:
                return f"{reason} (as its part {sorted(part)})"
        from kfuse.fusion.resources import group_resource_violation
        violation = group_resource_violation(graph, members, group_outputs(graph, members),
                                             form, given_sizes)
        if violation is None:
            return None
        too_large.setdefault(form, []).append((held, str(violation)))
        return str(violation)

    def group_reason(members: tuple[str, ...]) -> str | None:
        reason = cheap_reason(members)
        if reason is None and len(members) > 1 and math.isinf(group_time(members)):
            reason = model_reasons.get(members, f"model: the {model} model cannot run it")
        if reason is None and check_resources and len(members) > 1:
            return resource_reason(members)
        return reason

    return FusionProblem(kernels=tuple(k.name for k in graph.kernels), order_dag=dag,
                         sharing=sharing, group_reason=group_reason, group_time=group_time,
                         model=model, cheap_reason=cheap_reason,
                         hereditary_reason=hereditary_reason, graph=graph, sizes=sizes,
                         name=graph.name)


# ------------------------------------------------------------------------------------------
# solving
# ------------------------------------------------------------------------------------------

STRATEGY_NAMES = ("exhaustive", "exact", "greedy", "edges", "mincut", "gga")


def check_strategy(strategy: str, names: Sequence[str] = STRATEGY_NAMES) -> str:
    """``strategy`` when it is one of ``names``; else a :class:`KfuseError` listing them
    all (the one source of the "unknown search strategy" message)."""
    if strategy not in names:
        raise KfuseError(f"unknown search strategy {strategy!r}; available: "
                         f"{', '.join(names)}")
    return strategy


def _strategies() -> dict[str, Callable[..., list[tuple[str, ...]] | tuple]]:
    from kfuse.search.edges import edges_search
    from kfuse.search.exact import exact_search
    from kfuse.search.exhaustive import exhaustive_search
    from kfuse.search.gga import gga_search
    from kfuse.search.greedy import greedy_search
    from kfuse.search.mincut import mincut_search
    return {"exhaustive": exhaustive_search, "exact": exact_search, "greedy": greedy_search,
            "edges": edges_search, "mincut": mincut_search, "gga": gga_search}


def solve(problem: FusionProblem, strategy: str, seed: int = 0, progress: bool = False,
          **options: Any) -> SearchResult:
    """Run ``strategy`` on ``problem``; the result is a legal plan (checked), groups in an
    executable order, with a reason for every order-DAG edge left unfused.

    Strategies search with the cheap rules; the groups of their answer are then checked
    with ``group_reason`` and any that fail are excluded before solving again (at most
    ``max_resolves`` times, default 20).
    """
    run_strategy = _strategies()[check_strategy(strategy)]
    bits = problem.bits
    max_resolves = int(options.pop("max_resolves", 20))
    started = time.perf_counter()
    banned_now = 0
    for _attempt in range(max_resolves + 1):
        answer = run_strategy(problem, seed=seed, progress=progress, **options)
        groups, reasons, stats = answer
        failing = [(m, r) for m in (bits.mask(g) for g in groups)
                   if (r := bits.full_reason(m)) is not None]
        if not failing:
            break
        for mask, reason in failing:
            bits.ban(mask, reason)
            banned_now += 1
    else:
        raise KfuseError(f"strategy {strategy!r} kept proposing groups that fail the "
                         f"expensive legality rules ({banned_now} excluded); giving up")
    reason = problem.plan_reason(groups)
    if reason is not None:
        raise KfuseError(f"internal error: strategy {strategy!r} returned an illegal plan: "
                         f"{reason}")
    ordered = [bits.members(m) for m in bits.order([bits.mask(g) for g in groups])]
    all_reasons = edge_reasons(problem, ordered)
    all_reasons.update(reasons or {})
    stats = dict(stats)
    stats.setdefault("seconds", time.perf_counter() - started)
    stats["excluded_groups"] = banned_now
    stats["evaluations"] = bits.evaluations
    return SearchResult(groups=ordered, predicted_time_s=problem.total_time(ordered),
                        unfused_predicted_time_s=problem.unfused_time(),
                        reasons=all_reasons, stats=stats)


# ------------------------------------------------------------------------------------------
# synthetic problems (tests, benchmarks)
# ------------------------------------------------------------------------------------------

def random_problem(n: int, seed: int = 0, window: int = 6, max_reads: int = 3,
                   stencil_fraction: float = 0.4, inputs: int | None = None,
                   stage_limit: int = 4, elements: int = 1 << 20,
                   bandwidth: float = 3.0e12, flop_rate: float = 2.0e13,
                   launch_s: float = 3.0e-6) -> FusionProblem:
    """A random dataflow problem with a roofline-like cost (for tests and benchmarks).

    Kernel ``k{i}`` writes array ``a{i}`` and reads 1..``max_reads`` arrays written within
    the ``window`` kernels before it, or pipeline inputs; each read is pointwise or a
    stencil (thread load 5 or 9). A group's time is ``max(bytes / bandwidth, flops /
    flop_rate) + launch``: bytes are the arrays read from outside the group plus those
    written and needed outside; a producer read through a stencil inside the group is
    recomputed at each tap (flops multiply along the chain). A group staging more than
    ``stage_limit`` distinct arrays read through stencils is illegal (a monotone
    shared-memory rule). The kinship, convexity and resource rules are the real ones.
    """
    if n < 1:
        raise KfuseError("a random problem needs at least one kernel")
    rng = random.Random(seed)
    inputs = inputs if inputs is not None else max(1, n // 6)
    names = tuple(f"k{i}" for i in range(n))
    reads: list[dict[str, int]] = []
    flops: list[float] = []
    for i in range(n):
        choices = [f"a{j}" for j in range(max(0, i - window), i)]
        start = rng.randrange(inputs)
        choices += [f"in{start}"] if not choices or rng.random() < 0.3 else []
        count = rng.randint(1, min(max_reads, len(choices)))
        chosen = rng.sample(choices, count)
        if i > 0 and not any(c.startswith("a") for c in chosen) and rng.random() < 0.8:
            chosen[0] = f"a{rng.randrange(max(0, i - window), i)}"
            chosen = list(dict.fromkeys(chosen))
        reads.append({a: (rng.choice((5, 9)) if rng.random() < stencil_fraction else 1)
                      for a in chosen})
        flops.append(float(rng.randint(4, 40)))
    readers: dict[str, list[int]] = {}
    for i, r in enumerate(reads):
        for a in r:
            readers.setdefault(a, []).append(i)
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    for i, r in enumerate(reads):
        for a in r:
            if a.startswith("a"):
                dag.add_edge(f"k{a[1:]}", names[i])
    sharing = nx.Graph()
    sharing.add_nodes_from(names)
    for a, who in readers.items():
        members = list(who) + ([int(a[1:])] if a.startswith("a") else [])
        for x in members:
            for y in members:
                if x < y:
                    sharing.add_edge(names[x], names[y])
    index = {name: i for i, name in enumerate(names)}
    nbytes = 4.0 * elements

    def staged(members: tuple[str, ...]) -> int:
        return len({a for m in members for a, load in reads[index[m]].items() if load > 1})

    def hereditary(members: tuple[str, ...]) -> str | None:
        count = staged(members)
        if count > stage_limit:
            return (f"resources: stages {count} stencil arrays in shared memory, the "
                    f"limit is {stage_limit}")
        return None

    def reason(members: tuple[str, ...]) -> str | None:
        mask = problem.bits.mask(members)
        bits = problem.bits
        if len(members) > 1 and not bits.convex(mask):
            return "convex: a path leaves the group and comes back"
        if len(members) > 1 and not bits.connected(mask):
            return "connected: members share no array (degree of kinship 0)"
        return hereditary(members)

    def group_time(members: tuple[str, ...]) -> float:
        inside = {index[m] for m in members}
        external = {a for i in inside for a in reads[i]
                    if not (a.startswith("a") and int(a[1:]) in inside)}
        written = [i for i in inside
                   if not readers.get(f"a{i}") or any(r not in inside
                                                      for r in readers[f"a{i}"])]
        factor = {}
        for i in sorted(inside, reverse=True):
            factor[i] = max([1.0] + [factor[r] * reads[r][f"a{i}"]
                                     for r in readers.get(f"a{i}", ()) if r in inside])
        work = sum(flops[i] * factor[i] for i in inside) * elements
        moved = (len(external) + len(written)) * nbytes
        return max(moved / bandwidth, work / flop_rate) + launch_s

    problem = FusionProblem(kernels=names, order_dag=dag, sharing=sharing,
                            group_reason=reason, group_time=group_time, model="synthetic",
                            hereditary_reason=hereditary, name=f"random{n}-s{seed}")
    return problem


__all__ = ["GRAPH_MODELS", "STRATEGY_NAMES", "Bits", "FusionProblem", "SearchResult",
           "check_strategy", "edge_reasons", "enumerate_groups", "problem_from_graph",
           "random_problem", "solve"]
