"""Grouped genetic algorithm (Wahib & Maruyama 2014b, as ``notes/wahib-fusion-search.md`` §3 reads it).

- **Encoding**: an individual is a list of genes, one per group (a bitmask of kernels);
  gene order matters only to crossover.
- **Initialisation**: feasible only. Kernels in a random topological order join a random
  group they may legally join (weight 1 + shared neighbours) or, with ``new_group``
  probability, start their own.
- **Crossover** (Falkenauer, probability ``crossover``): a range of the other parent's genes
  is inserted; old genes that overlap it are dropped and their other kernels reinserted
  one by one into the legal group sharing most with them (ties: least added time), else as
  singletons. A child whose genes form a cyclic quotient becomes a copy of its parent.
- **Mutation**: split (a group of two or more, chosen by size, cut into a random connected
  part and the rest) then merge (a group and a neighbour sharing data with it), each with
  probability ``P_m(j) = P_mi + j/G (P_mf - P_mi)`` rising over the generations.
- **Selection**: static rank-based roulette ``f_i = 2 R_i / (xi (xi + 1))``; elitism keeps the
  best individual unchanged.
- **Constraint handling**: the oracle penalty of Schlüter & Gerdts on the objective
  (normalised by the unfused time) and the residual of constraint (1.1) (a fused group
  slower than its kernels apart); structural and resource rules are never broken (every
  operator keeps individuals legal).
- **Tabu restarts** (Wahib & Maruyama 2014b Algorithm 1): runs restart from a fresh random population
  of which a fraction ``proximity`` are mutants (1..``tabu_radius`` split/merge mutations)
  of the best; after ``restart_after`` runs without improvement a run's best is locally
  searched and, if that does not help, made tabu: individuals within partition distance
  ``tabu_radius`` of a tabu entry are penalised by ``tabu_penalty``.
- **Local search "in sub-solution space"** (the seed names it without defining it):
  first-improvement single-kernel moves (to a group sharing data, or alone) and merges of
  groups sharing data, then every *region* (a group and neighbouring groups, at most
  ``region_size`` kernels) is re-partitioned exactly, the rest of the plan fixed
  (branch and bound over the region's legal groups; paths through the fixed groups are
  followed so the plan stays acyclic).

kfuse additions, for speed and accuracy (Wahib & Maruyama ran C++ on 8 cores for minutes):
memoised group times and legality per bitmask; a merge partner is drawn among groups that
share data (the paper draws any group and retries, which almost never succeeds on large
instances); a child changed by crossover or mutation gets, with probability
``child_search``, a short move-based local search around the genes that changed (a
memetic step: without it runs stall in poor local optima; with it the 50-kernel random
instances of ``benchmarks/gga_scaling.py`` went from 6/10 to 10/10 optimal); each run's best
is polished by the full local search when ``polish`` is set; the first population holds
the greedy plan and the unfused plan when ``seed_greedy`` is set. A run stops after
``stall_generations`` generations without improvement; the search after ``stall_runs``
runs without improvement, ``max_runs`` runs, ``max_evaluations`` model evaluations or
``time_limit_s`` seconds (a safety net, 100 s by default: only this limit depends on the
machine, and ``stats['stopped']`` says which limit ended the search).
"""

from __future__ import annotations

import math
import random
import time
from bisect import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import accumulate

from kfuse.analysis.order import iter_bits
from kfuse.errors import KfuseError
from kfuse.search.problem import FusionProblem, enumerate_groups, popcount

SQRT3_TERM = (6 * math.sqrt(3) - 2) / (6 * math.sqrt(3))


@dataclass
class GGAConfig:
    """Parameters (names after Wahib & Maruyama 2014b Table 2; defaults are kfuse's, see the notes §3.9)."""

    population: int = 40            # P
    generations: int = 300          # G (per run)
    stall_generations: int = 25     # M_G: a run ends after this many without improvement
    crossover: float = 0.15         # P_c
    mutation_initial: float = 0.1   # P_mi
    mutation_final: float = 0.3     # P_mf
    new_group: float = 0.3          # chance a kernel starts its own group at initialisation
    oracle: float = 1e6             # initial Omega
    residual_tolerance: float = 0.01  # E_p
    restart_after: int = 8          # M_r
    tabu_length: int = 30           # Q
    tabu_radius: int = 4            # N
    tabu_penalty: float = 0.7       # P_con
    proximity: float = 0.1          # Pr
    max_runs: int = 30000           # R
    stall_runs: int = 12            # kfuse: stop after this many runs without improvement
    max_evaluations: int = 100_000_000  # M_f
    time_limit_s: float | None = 100.0  # M_t (a safety net; see the module notes)
    polish: bool = True
    child_search: float = 0.2       # chance a changed child gets a short local search
    region_size: int = 16           # kernels re-partitioned exactly by the sub-solution search
    region_nodes: int = 20000       # branch-and-bound nodes per region (then the best so far)
    seed_greedy: bool = True
    split_tries: int = 10
    merge_tries: int = 10


class _Individual:
    """A partition: genes (group masks), each kernel's gene index, objective, residual."""

    __slots__ = ("groups", "gid", "f", "res", "key", "pen", "pen_tag")

    def __init__(self, groups: list[int], gid: list[int]) -> None:
        self.groups = groups
        self.gid = gid
        self.f = math.nan
        self.res = math.nan
        self.key: frozenset[int] | None = None
        self.pen = 0.0
        self.pen_tag = -1

    def copy(self) -> _Individual:
        twin = _Individual(list(self.groups), list(self.gid))
        twin.f, twin.res, twin.key = self.f, self.res, self.key
        return twin

    def frozen(self) -> frozenset[int]:
        if self.key is None:
            self.key = frozenset(self.groups)
        return self.key

    # -- edits (they invalidate the cached objective) --------------------------------------------
    def touch(self) -> None:
        self.f = math.nan
        self.key = None
        self.pen_tag = -1

    def set_group(self, g: int, mask: int) -> None:
        self.groups[g] = mask
        for i in iter_bits(mask):
            self.gid[i] = g

    def add_group(self, mask: int) -> int:
        self.groups.append(mask)
        g = len(self.groups) - 1
        for i in iter_bits(mask):
            self.gid[i] = g
        return g

    def remove_group(self, g: int) -> None:
        """Drop gene ``g`` (its kernels must already belong elsewhere)."""
        last = len(self.groups) - 1
        if g != last:
            self.set_group(g, self.groups[last])
        self.groups.pop()


class _GGA:
    def __init__(self, problem: FusionProblem, seed: int, config: GGAConfig,
                 report: Callable[[str], None] | None) -> None:
        self.problem = problem
        self.bits = problem.bits
        self.rng = random.Random(seed)
        self.cfg = config
        self.report = report
        self.n = self.bits.n
        self.unfused = problem.unfused_time() or 1.0
        self.single = [self.bits.time(1 << i) for i in range(self.n)]
        self._res: dict[int, float] = {}
        self.started = time.perf_counter()
        self.stopped = ""
        self.tabu: deque[tuple[frozenset[int], int]] = deque(maxlen=config.tabu_length)
        self.tabu_version = 0
        self.omega = config.oracle
        self.generations = 0
        self.regions_done: set[tuple[int, ...]] = set()

    # -- objective -------------------------------------------------------------------------------
    def group_residual(self, mask: int) -> float:
        """Constraint (1.1): a fused group must beat its kernels run apart (relative excess)."""
        found = self._res.get(mask)
        if found is None:
            if mask & (mask - 1) == 0:
                found = 0.0
            else:
                apart = sum(self.single[i] for i in iter_bits(mask))
                found = max(0.0, self.bits.time(mask) - apart) / apart if apart > 0 else 0.0
            self._res[mask] = found
        return found

    def evaluate(self, ind: _Individual) -> _Individual:
        if math.isnan(ind.f):
            time_of = self.bits.time
            ind.f = sum(time_of(m) for m in ind.groups)
            ind.res = sum(self.group_residual(m) for m in ind.groups)
        return ind

    def feasible(self, ind: _Individual) -> bool:
        return self.evaluate(ind).res <= self.cfg.residual_tolerance

    def penalty(self, ind: _Individual) -> float:
        """Oracle penalty (lower is better), plus the tabu surcharge."""
        tag = self.tabu_version
        if ind.pen_tag == tag:
            return ind.pen
        self.evaluate(ind)
        f = ind.f / self.unfused
        res = ind.res if ind.res > self.cfg.residual_tolerance else 0.0
        delta = abs(f - self.omega)
        if f <= self.omega and res == 0.0:
            p = -delta
        elif f <= self.omega:
            p = res
        else:
            if res < delta / 3:
                alpha = (delta * SQRT3_TERM - res) / (delta - res)
            elif res <= delta:
                alpha = 1 - 1 / (2 * math.sqrt(delta / res))
            else:
                alpha = 0.5 * math.sqrt(delta / res)
            p = alpha * delta + (1 - alpha) * res
        if self.tabu and self.is_tabu(ind):
            p += self.cfg.tabu_penalty * abs(p)
        ind.pen, ind.pen_tag = p, tag
        return p

    def better(self, a: _Individual, b: _Individual | None) -> bool:
        """``a`` is feasible and strictly better than ``b`` (which may be None)."""
        if not self.feasible(a):
            return False
        if b is None:
            return True
        return a.f < b.f * (1 - 1e-12)

    # -- tabu ------------------------------------------------------------------------------------
    def is_tabu(self, ind: _Individual) -> bool:
        key = ind.frozen()
        radius = self.cfg.tabu_radius
        for entry, count in self.tabu:
            if abs(count - len(key)) > radius:
                continue
            if _distance_at_most(key, entry, radius):
                return True
        return False

    # -- construction ----------------------------------------------------------------------------
    def from_groups(self, groups: list[int]) -> _Individual:
        gid = [-1] * self.n
        for g, mask in enumerate(groups):
            for i in iter_bits(mask):
                gid[i] = g
        return _Individual(list(groups), gid)

    def random_topological_order(self) -> list[int]:
        bits = self.bits
        indegree = [popcount(bits.pred[i]) for i in range(self.n)]
        ready = [i for i in range(self.n) if indegree[i] == 0]
        order = []
        rng = self.rng
        while ready:
            pick = rng.randrange(len(ready))
            ready[pick], ready[-1] = ready[-1], ready[pick]
            k = ready.pop()
            order.append(k)
            for j in bits.succ_list[k]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    ready.append(j)
        return order

    def init_individual(self) -> _Individual:
        """Kernels in a random topological order each join a random group they may
        legally join (weight 1 + members sharing data with it) or start their own.
        Candidates are drawn by weight and checked until one is valid, which is the
        weighted choice among the valid ones with far fewer checks."""
        bits = self.bits
        nbr_list = bits.nbr_list
        rng = self.rng
        ind = _Individual([], [-1] * self.n)
        placed = 0
        for k in self.random_topological_order():
            here = 1 << k
            placed |= here
            if rng.random() < self.cfg.new_group:
                ind.add_group(here)
                continue
            gid = ind.gid
            options = sorted({gid[j] for j in nbr_list[k] if placed >> j & 1})
            near = bits.nbr[k]
            weights = [1 + (near & ind.groups[g]).bit_count() for g in options]
            joined = False
            while options:
                pick = _weighted(rng, weights)
                g = options[pick]
                z = ind.groups[g] | here
                if bits.legal(z) and bits.merge_ok(ind.gid, ind.groups, z, (g,), placed):
                    ind.set_group(g, z)
                    joined = True
                    break
                del options[pick], weights[pick]
            if not joined:
                ind.add_group(here)
        return ind

    # -- crossover -------------------------------------------------------------------------------
    def crossover(self, a: _Individual, b: _Individual) -> tuple[_Individual, _Individual]:
        rng = self.rng
        a1 = rng.randrange(len(a.groups))
        a2 = rng.randint(a1 + 1, len(a.groups))
        b1 = rng.randrange(len(b.groups))
        b2 = rng.randint(b1 + 1, len(b.groups))
        return (self.inject(a, b.groups[b1:b2], a1), self.inject(b, a.groups[a1:a2], b1))

    def inject(self, parent: _Individual, inserted: list[int], position: int) -> _Individual:
        """``parent`` with ``inserted`` genes put before ``position``; overlapping genes
        dropped and their remaining kernels reinserted."""
        bits = self.bits
        covered = 0
        for mask in inserted:
            covered |= mask
        head = [m for m in parent.groups[:position] if not m & covered]
        tail = [m for m in parent.groups[position:] if not m & covered]
        dropped = 0
        for mask in parent.groups:
            if mask & covered:
                dropped |= mask
        missing = dropped & ~covered
        if not missing and head + tail and len(head) + len(tail) + len(inserted) == len(
                parent.groups) and set(inserted) <= set(parent.groups):
            return parent
        singles = [1 << i for i in iter_bits(missing)]
        child = self.from_groups(head + list(inserted) + tail + singles)
        if not bits.acyclic(child.groups):
            return parent
        pending = missing
        for k in iter_bits(missing):
            pending &= ~(1 << k)
            self.reinsert(child, k, pending)
        child.touch()
        return child

    def reinsert(self, child: _Individual, k: int, pending: int) -> None:
        """Move singleton ``k`` into the legal group sharing most data with it (Wahib & Maruyama 2014b's
        reinsertion by kernel pivot; ties by the least added time). Kernels in ``pending``
        wait for their own turn: their singletons are not groups yet."""
        bits = self.bits
        here = 1 << k
        own = child.gid[k]
        options = []
        near = {child.gid[j] for j in bits.nbr_list[k] if not pending >> j & 1}
        near.discard(own)
        for g in sorted(near):
            z = child.groups[g] | here
            if bits.legal(z):
                shared = popcount(bits.nbr[k] & child.groups[g])
                added = bits.time(z) - bits.time(child.groups[g])
                options.append((-shared, added, g, z))
        options.sort()
        for _, _, g, z in options:
            if bits.merge_ok(child.gid, child.groups, z, (g, own)):
                child.set_group(g, z)
                child.remove_group(own)
                return

    # -- mutation --------------------------------------------------------------------------------
    def split(self, parent: _Individual) -> _Individual:
        bits = self.bits
        rng = self.rng
        choices = [(g, popcount(m)) for g, m in enumerate(parent.groups) if m & (m - 1)]
        if not choices:
            return parent
        g = rng.choices([c[0] for c in choices], [c[1] for c in choices])[0]
        group = parent.groups[g]
        members = list(iter_bits(group))
        for _ in range(self.cfg.split_tries):
            target = rng.randint(1, len(members) - 1)
            part = 1 << rng.choice(members)
            while popcount(part) < target:
                reachable = [j for j in iter_bits(group & ~part)
                             if bits.nbr[j] & part]
                if not reachable:
                    break
                part |= 1 << rng.choice(reachable)
            rest = group & ~part
            if not bits.legal(part) or not bits.legal(rest):
                continue
            if _succ(bits, part) & rest and _succ(bits, rest) & part:
                continue
            child = parent.copy()
            child.set_group(g, part)
            child.add_group(rest)
            child.touch()
            return child
        return parent

    def merge(self, parent: _Individual) -> _Individual:
        bits = self.bits
        rng = self.rng
        groups = parent.groups
        if len(groups) < 2:
            return parent
        sizes = [popcount(m) for m in groups]
        for _ in range(self.cfg.merge_tries):
            g = rng.choices(range(len(groups)), sizes)[0]
            mask = groups[g]
            partners = sorted({parent.gid[j] for j in bits.bits_of(bits.around(mask) & ~mask)})
            if not partners:
                continue
            h = rng.choices(partners, [sizes[p] for p in partners])[0]
            z = mask | groups[h]
            if bits.legal(z) and bits.merge_ok(parent.gid, groups, z, (g, h)):
                child = parent.copy()
                child.set_group(g, z)
                for i in iter_bits(groups[h]):
                    child.gid[i] = g
                child.remove_group(h)
                child.touch()
                return child
        return parent

    # -- local search ----------------------------------------------------------------------------
    def local_search(self, start: _Individual, max_passes: int = 50,
                     regions: bool = True, focus: int | None = None) -> _Individual:
        """Wahib & Maruyama 2014b's local search "in sub-solution space": first improvement over
        single-kernel moves (to a neighbouring group or alone) and merges of groups sharing
        data, then exact re-partitioning of small regions, until none improves."""
        bits = self.bits
        time_of = bits.time
        legal, known = bits.legal, bits._legal.get  # the memo first: most checks hit it
        nbr_list = bits.nbr_list
        ind = start.copy()
        rng = self.rng
        eps = 1e-12 * self.unfused
        for _ in range(max_passes):
            if not self.budget_left():
                break
            improved = False
            order = list(range(self.n)) if focus is None else list(iter_bits(focus))
            rng.shuffle(order)
            gid = ind.gid
            for k in order:
                here = 1 << k
                g = gid[k]
                group = ind.groups[g]
                rest = group & ~here
                alone = not rest
                if not alone:
                    fine = known(rest)
                    if not (legal(rest) if fine is None else fine):
                        continue
                base = time_of(group)
                targets = {gid[j] for j in nbr_list[k]}
                targets.discard(g)
                moved = False
                for h in sorted(targets):
                    other = ind.groups[h]
                    z = other | here
                    fine = known(z)
                    # legality first: models may not price illegal groups
                    if not (legal(z) if fine is None else fine):
                        continue
                    new = (time_of(rest) if rest else 0.0) + time_of(z)
                    if new >= base + time_of(other) - eps:
                        continue
                    if alone:
                        ok = bits.merge_ok(ind.gid, ind.groups, z, (g, h))
                    else:
                        if _succ(bits, rest) & here and bits.succ[k] & rest:
                            continue
                        ind.groups[g] = rest
                        ind.gid[k] = -1
                        ok = bits.merge_ok(ind.gid, ind.groups, z, (h,))
                        ind.groups[g] = group
                        ind.gid[k] = g
                    if ok:
                        if alone:
                            ind.set_group(h, z)
                            ind.remove_group(g)
                        else:
                            ind.groups[g] = rest
                            ind.set_group(h, z)
                        moved = True
                        break
                if not moved and not alone:
                    if time_of(rest) + time_of(here) < base - eps and not (
                            _succ(bits, rest) & here and bits.succ[k] & rest):
                        ind.groups[g] = rest
                        ind.add_group(here)
                        moved = True
                improved |= moved
            g = 0
            while g < len(ind.groups):
                mask = ind.groups[g]
                if focus is not None and not mask & focus:
                    g += 1
                    continue
                around = bits.around(mask)
                merged = False
                for h in sorted({gid[j] for j in bits.bits_of(around & ~mask)}):
                    z = mask | ind.groups[h]
                    fine = known(z)
                    if not (legal(z) if fine is None else fine):
                        continue
                    if time_of(z) >= time_of(mask) + time_of(ind.groups[h]) - eps:
                        continue
                    if bits.merge_ok(ind.gid, ind.groups, z, (g, h)):
                        ind.set_group(g, z)
                        for i in iter_bits(ind.groups[h]):
                            ind.gid[i] = g
                        ind.remove_group(h)
                        merged = improved = True
                        break
                if not merged:
                    g += 1
            if not improved and regions and self.cfg.region_size > 1:
                ind.touch()
                improved = self.region_sweep(ind)
            if not improved:
                break
        ind.touch()
        return self.evaluate(ind)

    # -- sub-solution space: re-partition a small region exactly ---------------------------------
    def region_sweep(self, ind: _Individual) -> bool:
        """Re-optimise every region (a group and neighbouring groups, at most
        ``region_size`` kernels) exactly with the rest of the plan fixed; True if improved."""
        bits = self.bits
        rng = self.rng
        improved = False
        order = list(ind.groups)
        rng.shuffle(order)
        for seed_mask in order:
            if not self.budget_left():
                break
            if seed_mask not in ind.frozen():
                continue
            g = ind.groups.index(seed_mask)
            region = ind.groups[g]
            members = [g]
            frontier = [g]
            while frontier and popcount(region) < self.cfg.region_size:
                around = 0
                for h in frontier:
                    for i in iter_bits(ind.groups[h]):
                        around |= bits.nbr[i]
                nxt = sorted({ind.gid[j] for j in iter_bits(around & ~region)})
                rng.shuffle(nxt)
                frontier = []
                for h in nxt:
                    if popcount(region | ind.groups[h]) <= self.cfg.region_size:
                        region |= ind.groups[h]
                        members.append(h)
                        frontier.append(h)
            if len(members) < 2 and not ind.groups[g] & (ind.groups[g] - 1):
                continue
            key = tuple(sorted(ind.groups[h] for h in members))
            if key in self.regions_done:
                continue
            if self.region_optimise(ind, members):
                improved = True
            else:
                self.regions_done.add(key)
        return improved

    def region_optimise(self, ind: _Individual, members: list[int]) -> bool:
        """Best partition of the kernels of genes ``members``, the other genes fixed."""
        bits = self.bits
        region = 0
        for g in members:
            region |= ind.groups[g]
        kernels = list(iter_bits(region))
        m = len(kernels)
        local = {k: i for i, k in enumerate(kernels)}

        def to_local(mask: int) -> int:
            out = 0
            for k in iter_bits(mask & region):
                out |= 1 << local[k]
            return out

        # via[i]: region kernels reachable from kernel i through fixed genes (group-level)
        outside = set(members)
        via = []
        gid, groups, bits_of_mask, out_of = ind.gid, ind.groups, bits.bits_of, bits.out
        for k in kernels:
            hits = 0
            frontier = bits.succ[k] & ~region
            visited = frontier
            seen: set[int] = set()
            while frontier:
                new = 0
                for x in bits_of_mask(frontier):
                    h = gid[x]
                    if h in seen or h in outside:
                        continue
                    seen.add(h)
                    new |= groups[h] | out_of(groups[h])
                hits |= new & region
                new &= ~region & ~visited
                visited |= new
                frontier = new
            via.append(to_local(hits))
        reach = [to_local(bits.succ[k]) | via[i] for i, k in enumerate(kernels)]
        time_of = bits.time

        # legal groups of the region, by lowest local kernel, cheapest per kernel first
        bits_of = bits.bits_of  # (a pure function of the mask: local masks share the memo)
        raw: list[list[tuple[float, int, float, int]]] = [[] for _ in range(m)]
        cost_bound = [math.inf] * m
        candidates, _ = enumerate_groups(self.problem, within=region, remember=True)
        for glob in candidates:
            sub = to_local(glob)
            if sub & (sub - 1) and _loops_back(sub, reach, via):
                continue
            t = time_of(glob)
            share = t / popcount(sub)
            out = 0
            for i in bits_of(sub):
                out |= reach[i]
                if share < cost_bound[i]:
                    cost_bound[i] = share
            raw[(sub & -sub).bit_length() - 1].append((share, sub, t, out))
        heads = []
        for entries in raw:
            entries.sort(key=lambda e: (e[0], e[1]))
            heads.append([(sub, t, out, sum(cost_bound[i] for i in bits_of(sub)))
                          for _, sub, t, out in entries])
        current = sum(time_of(ind.groups[g]) for g in members)
        best = [current * (1 - 1e-9), None]
        chosen: list[int] = []
        chosen_out: list[int] = []
        owner = [-1] * m

        def cycle_free(sub: int, out: int) -> bool:
            frontier = out & ~sub
            reached = 0
            while frontier:
                reached |= frontier
                new = 0
                for i in bits_of(frontier):
                    o = owner[i]
                    new |= chosen_out[o] if o >= 0 else reach[i]
                if new & sub:
                    return False
                frontier = new & ~reached
            return True

        nodes = [0]

        def place(unplaced: int, total: float, rest: float) -> None:
            nodes[0] += 1
            if nodes[0] > self.cfg.region_nodes:
                return
            if not unplaced:
                if total < best[0]:
                    best[0], best[1] = total, list(chosen)
                return
            if total + rest >= best[0]:
                return
            head = (unplaced & -unplaced).bit_length() - 1
            for sub, t, out, bound in heads[head]:
                if sub & ~unplaced or total + t + rest - bound >= best[0]:
                    continue
                if sub & (sub - 1) and not cycle_free(sub, out):
                    continue
                index = len(chosen)
                chosen.append(sub)
                chosen_out.append(out | sub)
                for i in bits_of(sub):
                    owner[i] = index
                place(unplaced & ~sub, total + t, rest - bound)
                for i in bits_of(sub):
                    owner[i] = -1
                chosen.pop()
                chosen_out.pop()

        place((1 << m) - 1, 0.0, sum(cost_bound))
        if best[1] is None:
            return False
        for g in sorted(members, reverse=True):
            ind.remove_group(g)
        for sub in best[1]:
            glob = 0
            for i in iter_bits(sub):
                glob |= 1 << kernels[i]
            ind.add_group(glob)
        ind.touch()
        return True

    # -- one GGA run -----------------------------------------------------------------------------
    def budget_left(self) -> bool:
        cfg = self.cfg
        if self.bits.evaluations >= cfg.max_evaluations:
            self.stopped = "evaluations"
            return False
        if cfg.time_limit_s is not None and time.perf_counter() - self.started >= cfg.time_limit_s:
            self.stopped = "time"
            return False
        return True

    def run(self, seeds: list[_Individual]) -> _Individual:
        cfg = self.cfg
        rng = self.rng
        size = max(2, cfg.population)
        population = [self.evaluate(s) for s in seeds[:size]]
        while len(population) < size:
            population.append(self.evaluate(self.init_individual()))
        best = None
        for ind in population:
            if self.better(ind, best):
                best = ind
        stall = 0
        weights = [2 * (size - r) / (size * (size + 1)) for r in range(size)]
        for generation in range(cfg.generations):
            if not self.budget_left():
                break
            self.generations += 1
            ranked = sorted(population, key=self.penalty)
            children = [ranked[0]]
            rate = cfg.mutation_initial + generation / cfg.generations * (
                cfg.mutation_final - cfg.mutation_initial)
            while len(children) < size:
                first, second = rng.choices(range(size), weights, k=2)
                while second == first:
                    second = rng.choices(range(size), weights)[0]
                pair = (ranked[first], ranked[second])
                if rng.random() < cfg.crossover:
                    pair = self.crossover(*pair)
                for parent, child in zip((ranked[first], ranked[second]), pair, strict=True):
                    if rng.random() < rate:
                        child = self.split(child)
                    if rng.random() < rate:
                        child = self.merge(child)
                    if child is not parent and rng.random() < cfg.child_search:
                        changed = 0
                        for mask in set(child.groups) - set(parent.groups):
                            changed |= mask
                        around = changed
                        for i in iter_bits(changed):
                            around |= self.bits.nbr[i]
                        child = self.local_search(child, max_passes=3, regions=False,
                                                  focus=around)
                    children.append(self.evaluate(child))
            population = children[:size]
            improved = False
            for ind in population:
                if self.better(ind, best):
                    best, improved = ind, True
            stall = 0 if improved else stall + 1
            if stall >= cfg.stall_generations:
                break
        if best is None:  # no feasible individual: take the least penalised
            best = min(population, key=self.penalty)
        if cfg.polish:
            polished = self.local_search(best)
            if self.better(polished, best):
                best = polished
        return best

    def mutant(self, ind: _Individual) -> _Individual:
        child = ind
        for _ in range(self.rng.randint(1, self.cfg.tabu_radius)):
            child = self.split(child) if self.rng.random() < 0.5 else self.merge(child)
        return child

    # -- the restart loop (Wahib & Maruyama 2014b Algorithm 1) -------------------------------------------------
    def search(self, seeds: list[_Individual]) -> tuple[_Individual, dict]:
        cfg = self.cfg
        best: _Individual | None = None
        for seed in seeds:
            if self.better(seed, best):
                best = seed
        counter = 0
        stall = 0
        runs = 0
        tabu_pushes = 0
        while runs < cfg.max_runs and self.budget_left():
            if best is not None and runs > 0:
                seeds = [self.mutant(best)
                         for _ in range(max(1, int(cfg.proximity * cfg.population)))]
            run_best = self.run(seeds)
            runs += 1
            if self.better(run_best, best):
                best = run_best
                self.omega = best.f / self.unfused
                self.tabu_version += 1
                counter = stall = 0
            else:
                counter += 1
                stall += 1
                if counter > cfg.restart_after:
                    improved = self.local_search(run_best)
                    if self.better(improved, best):
                        best = improved
                        self.omega = best.f / self.unfused
                        self.tabu_version += 1
                        counter = stall = 0
                    else:
                        self.tabu.append((run_best.frozen(), len(run_best.groups)))
                        self.tabu_version += 1
                        tabu_pushes += 1
            if self.report is not None and best is not None:
                self.report(f"run {runs}: best {best.f * 1e3:.4f} ms "
                            f"({self.unfused / best.f:.3f}x), {self.bits.evaluations} "
                            f"evaluations")
            if stall >= cfg.stall_runs:
                self.stopped = self.stopped or "stall"
                break
        else:
            self.stopped = self.stopped or "runs"
        assert best is not None
        stats = {"runs": runs, "generations": self.generations, "tabu_pushes": tabu_pushes,
                 "stopped": self.stopped or "runs", "optimal": False}
        return best, stats


def _weighted(rng: random.Random, weights: list[int]) -> int:
    """``rng.choices(range(len(weights)), weights)[0]`` without its overhead (the same
    draw from the same random number, so runs do not change)."""
    cumulative = list(accumulate(weights))
    return bisect(cumulative, rng.random() * cumulative[-1], 0, len(weights) - 1)


def _loops_back(sub: int, reach: list[int], via: list[int]) -> bool:
    """Some path leaves region group ``sub`` (through fixed genes or other region kernels
    taken as singletons) and comes back into it."""
    frontier = 0
    for i in iter_bits(sub):
        if via[i] & sub:
            return True
        frontier |= reach[i]
    frontier &= ~sub
    reached = frontier
    while frontier:
        new = 0
        for i in iter_bits(frontier):
            new |= reach[i]
        if new & sub:
            return True
        frontier = new & ~reached
        reached |= frontier
    return False


def _succ(bits, mask: int) -> int:
    acc = 0
    for i in iter_bits(mask):
        acc |= bits.succ[i]
    return acc


def _distance_at_most(a: frozenset[int], b: frozenset[int], radius: int) -> bool:
    """Partition distance (fewest kernels to move to turn one into the other) <= radius."""
    only_a = a - b
    only_b = b - a
    if len(only_a) > 2 * radius or len(only_b) > 2 * radius:
        return False
    moved = 0
    for mask in only_a:
        moved |= mask
    total = popcount(moved)
    if total <= radius:
        return True
    rows = list(only_a)
    cols = list(only_b)
    best: dict[int, int] = {0: 0}
    for row in rows:
        step = dict(best)
        for used, value in best.items():
            for c, col in enumerate(cols):
                if not used >> c & 1:
                    overlap = popcount(row & col)
                    if overlap:
                        key = used | (1 << c)
                        if step.get(key, -1) < value + overlap:
                            step[key] = value + overlap
        best = step
    return total - max(best.values()) <= radius


def gga_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
               **options: object) -> tuple[list[tuple[str, ...]], dict, dict]:
    """Wahib & Maruyama 2014b's grouped genetic algorithm; options are :class:`GGAConfig` fields."""
    known = set(GGAConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise KfuseError(f"unknown gga option(s) {unknown}; known: {sorted(known)}")
    config = GGAConfig(**options)  # type: ignore[arg-type]
    bits = problem.bits
    started = time.perf_counter()
    if bits.n == 1:
        return [problem.kernels], {}, {"runs": 0, "generations": 0, "optimal": True}

    def run(report: Callable[[str], None] | None) -> tuple[_Individual, dict]:
        engine = _GGA(problem, seed, config, report)
        seeds = [engine.from_groups([1 << i for i in range(bits.n)])]
        if config.seed_greedy:
            from kfuse.search.greedy import greedy_search
            groups, _, _ = greedy_search(problem)
            seeds.insert(0, engine.from_groups([bits.mask(g) for g in groups]))
        return engine.search(seeds)

    if progress:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        with Progress(SpinnerColumn(), TextColumn("gga {task.description}"),
                      TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task("starting", total=None)
            best, stats = run(lambda text: bar.update(task, description=text))
    else:
        best, stats = run(None)
    stats.update(seconds=time.perf_counter() - started, config=asdict(config))
    return [bits.members(m) for m in best.groups], {}, stats
