"""Problem definition on kernel metadata (Wahib & Maruyama 2014 §II, notes §2) and its FusionProblem.

From a codeless application (:mod:`kfuse.project.metadata`) this module derives:

- **array categories**: read-only (no kernel writes it), write-only (no kernel reads it),
  strict read-write (one writer) and expandable read-write (several writers; renamed to a
  fresh version per write, which removes the false WAR/WAW order, unless renaming is off);
- the **order-of-execution DAG** on kernels: RAW edges writer -> readers of its version,
  WAR and WAW edges on arrays that are not renamed, host<->device copies (every earlier
  kernel touching the array before every later one) and explicit ``after`` order;
- the **sharing graph** (kernels touching a common array version, one of them reading
  it), **sharing sets** and the **degree of kinship** (shortest sharing chain);
- **thread load** per kernel and array;
- constraints (1.1)-(1.7) of Wahib & Maruyama 2014, plus the launch-shape header rule of Qiao 2021 and
  the acyclic quotient, each returned as a :class:`~kfuse.fusion.legality.Violation`
  saying why it fails.

:meth:`AppProblem.fusion_problem` hands the search strategies a
:class:`~kfuse.search.problem.FusionProblem` under one of :data:`PROJECT_MODELS`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import networkx as nx

from kfuse.analysis.order import Reachability
from kfuse.errors import KfuseError
from kfuse.fusion.legality import Violation
from kfuse.model import qiao
from kfuse.model.wahib import (
    KernelMetadata,
    Projection,
    WahibOptions,
    halo_per_thread,
    project_group,
    registers_needed,
    shared_bytes_used,
    shared_memory_blocks,
)
from kfuse.project.metadata import AppMetadata, KernelSpec

CATEGORIES = ("read-only", "strict read-write", "expandable read-write", "write-only")
C_OCC = 0.5      # Qiao 2021 L5: the fused kernel keeps at least half the best occupancy
C_SHARED = 2.0   # Qiao 2021 L5': shared memory grows at most twofold
PROJECT_MODELS = ("wahib", "wahib-norm", "qiao", "roofline")
VERSION_SEPARATOR = "#"


@dataclass(frozen=True)
class ArrayInfo:
    """What the kernels do to one array: its category, writers, readers and versions."""

    name: str
    category: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    renamed: bool
    versions: tuple[str, ...]
    sharing_set: tuple[str, ...] = ()  # the kernels touching it, in call order (K(d))


def _uses(app: AppMetadata) -> dict[str, list[tuple[str, Any]]]:
    """Array -> [(kernel, access)] in call order (one pass over the kernels)."""
    uses: dict[str, list[tuple[str, Any]]] = {a.name: [] for a in app.arrays}
    for kernel in app.kernels:
        for access in kernel.accesses:
            uses.setdefault(access.array, []).append((kernel.name, access))
    return uses


def classify_arrays(app: AppMetadata) -> dict[str, ArrayInfo]:
    """Category, writers, readers and version names of every array of the application."""
    result: dict[str, ArrayInfo] = {}
    uses = _uses(app)
    for array in app.arrays:
        writers = tuple(k for k, a in uses[array.name] if a.writes)
        readers = tuple(k for k, a in uses[array.name] if a.reads)
        if not writers:
            category = "read-only"
        elif not readers:
            category = "write-only"
        elif len(writers) >= 2:
            category = "expandable read-write"
        else:
            category = "strict read-write"
        renamed = category == "expandable read-write" and app.rename and array.expandable
        versions = (array.name,) + tuple(f"{array.name}{VERSION_SEPARATOR}{i}"
                                         for i in range(1, len(writers) + 1)) if renamed \
            else (array.name,)
        touching = tuple(dict.fromkeys(k for k, _ in uses[array.name]))
        result[array.name] = ArrayInfo(array.name, category, writers, readers, renamed,
                                       versions, touching)
    return result


def versioned_accesses(app: AppMetadata, arrays: dict[str, ArrayInfo] | None = None
                       ) -> dict[str, tuple[dict[str, float], tuple[str, ...]]]:
    """Per kernel: (array version read -> thread load, array versions written).

    A renamed array gets a fresh version at each write; a read-write access reads the
    version before and writes the next one. Arrays that are not renamed keep their name.
    """
    arrays = arrays or classify_arrays(app)
    current = {name: name for name in arrays}
    count = dict.fromkeys(arrays, 0)
    result: dict[str, tuple[dict[str, float], tuple[str, ...]]] = {}
    for kernel in app.kernels:
        reads: dict[str, float] = {}
        writes: list[str] = []
        for access in kernel.accesses:
            info = arrays[access.array]
            if access.reads:
                reads[current[access.array]] = access.thread_load
            if access.writes:
                if info.renamed:
                    count[access.array] += 1
                    current[access.array] = f"{access.array}{VERSION_SEPARATOR}" \
                                            f"{count[access.array]}"
                writes.append(current[access.array])
        result[kernel.name] = (reads, tuple(writes))
    return result


def base_array(version: str) -> str:
    """The array a version belongs to (``u#2`` -> ``u``)."""
    return version.split(VERSION_SEPARATOR, 1)[0]


def _add_edge(dag: nx.DiGraph, source: str, target: str, why: str, array: str | None = None
              ) -> None:
    if source == target:
        return
    if not dag.has_edge(source, target):
        dag.add_edge(source, target, why=set(), buffers=[])
    data = dag.edges[source, target]
    data["why"].add(why)
    if array is not None and why.startswith("RAW") and array not in data["buffers"]:
        data["buffers"].append(array)


def order_graph(app: AppMetadata) -> nx.DiGraph:
    """The order-of-execution graph (note §2.2): RAW, WAR, WAW, copy and ``after`` edges.

    Edges carry ``why`` (a set such as ``{"RAW u", "WAR v"}``) and ``buffers`` (the array
    versions a RAW edge carries). The graph is a DAG unless ``after`` contradicts the data
    (the loader reports that as an error).
    """
    arrays = classify_arrays(app)
    accesses = versioned_accesses(app, arrays)
    uses = _uses(app)
    dag = nx.DiGraph()
    dag.add_nodes_from(k.name for k in app.kernels)
    for name, info in arrays.items():
        last_writer: str | None = None
        writer_of: dict[str, str] = {}
        readers_since: list[str] = []
        for kernel, access in uses[name]:
            reads, writes = accesses[kernel]
            if access.reads:
                version = next(v for v in reads if base_array(v) == name)
                source = writer_of.get(version) if info.renamed else last_writer
                if source is not None:
                    _add_edge(dag, source, kernel, f"RAW {name}", version)
                readers_since.append(kernel)
            if access.writes:
                version = next(v for v in writes if base_array(v) == name)
                if not info.renamed:
                    for reader in readers_since:
                        _add_edge(dag, reader, kernel, f"WAR {name}")
                    if last_writer is not None:
                        _add_edge(dag, last_writer, kernel, f"WAW {name}")
                writer_of[version] = kernel
                last_writer = kernel
                readers_since = []
    position = {k.name: i for i, k in enumerate(app.kernels)}
    for copy in app.copies:
        cut = position[copy.after]
        touching = list(dict.fromkeys(k for k, _ in uses[copy.array]))
        before = [k for k in touching if position[k] <= cut]
        after = [k for k in touching if position[k] > cut]
        for source in before:
            for target in after:
                _add_edge(dag, source, target, f"copy {copy.array}")
    for kernel in app.kernels:
        for other in kernel.after:
            _add_edge(dag, other, kernel.name, "after")
    return dag


def version_touches(app: AppMetadata) -> dict[str, dict[str, bool]]:
    """Array version -> the kernels touching it, each with whether it reads it."""
    accesses = versioned_accesses(app)
    touch: dict[str, dict[str, bool]] = {}
    for kernel in app.kernels:
        reads, writes = accesses[kernel.name]
        for version in writes:
            touch.setdefault(version, {})[kernel.name] = False
        for version in reads:
            touch.setdefault(version, {})[kernel.name] = True
    return touch


def sharing_graph(app: AppMetadata) -> nx.Graph:
    """Kernels linked when they touch a common array version and one of them reads it."""
    graph = nx.Graph()
    graph.add_nodes_from(k.name for k in app.kernels)
    for version, kernels in version_touches(app).items():
        names = list(kernels)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if kernels[a] or kernels[b]:
                    if not graph.has_edge(a, b):
                        graph.add_edge(a, b, arrays=[])
                    graph.edges[a, b]["arrays"].append(version)
    return graph


def sharing_adjacency(app: AppMetadata) -> list[int]:
    """:func:`sharing_graph` as bitsets, kernel by kernel in the application's order (bit j
    of entry i: kernels i and j share), without the arrays of each edge: what shortest
    sharing chains need, built fast enough to be rebuilt many times."""
    position = {kernel.name: index for index, kernel in enumerate(app.kernels)}
    adjacency = [0] * len(app.kernels)
    for touching in version_touches(app).values():
        kernels = {position[name]: reads for name, reads in touching.items()}
        readers = 0
        every = 0
        for index, reads in kernels.items():
            every |= 1 << index
            if reads:
                readers |= 1 << index
        for index, reads in kernels.items():  # a pair shares where one of them reads
            adjacency[index] |= (every if reads else readers) & ~(1 << index)
    return adjacency


def _halo_sites(threads: int, radius: int) -> int:
    """Halo sites of a square 2-D block of ``threads`` threads with stencil ``radius``."""
    side = math.sqrt(threads)
    return int(round((side + 2 * radius) ** 2 - threads))


def _radius_from_load(load: float) -> int:
    """Radius of a 2-D star stencil with ``load`` points (5 -> 1, 9 -> 2, 13 -> 3)."""
    return max(1, math.ceil((load - 1) / 4))


class AppProblem:
    """The fusion problem of a codeless application: structure, constraints and models."""

    def __init__(self, app: AppMetadata, model: str = "wahib", *,
                 literal_halo: bool = False, seed002_rules: bool | None = None) -> None:
        if model not in PROJECT_MODELS:
            raise KfuseError(f"unknown projection model {model!r}; choose one of "
                             f"{', '.join(PROJECT_MODELS)}")
        self.app = app
        self.model = model
        # Qiao 2021's legality goes with its benefit model unless asked otherwise
        self.seed002_rules = model == "qiao" if seed002_rules is None else seed002_rules
        self.arch = app.device
        self.options = WahibOptions(literal_halo=literal_halo,
                                    normalized=model == "wahib-norm",
                                    precision_bytes=app.precision_bytes)
        self.kernels = tuple(k.name for k in app.kernels)
        self.index = {name: i for i, name in enumerate(self.kernels)}
        self.arrays = classify_arrays(app)
        self.accesses = versioned_accesses(app, self.arrays)
        self.order_dag = order_graph(app)
        self.sharing = sharing_graph(app)
        if not nx.is_directed_acyclic_graph(self.order_dag):
            raise KfuseError(f"{app.source}: the kernels' order has a cycle")
        n = len(self.kernels)
        reach = Reachability(self.order_dag, self.kernels)  # convexity (kfuse.analysis)
        self._reach = reach
        self._desc, self._anc = reach.descendants, reach.ancestors
        self._neighbours = [0] * n
        for a, b in self.sharing.edges:
            self._neighbours[self.index[a]] |= 1 << self.index[b]
            self._neighbours[self.index[b]] |= 1 << self.index[a]
        self._projections: dict[tuple[str, ...], Projection] = {}
        self._times: dict[tuple[str, ...], float] = {}

    # -- the problem's structure ---------------------------------------------------------------
    def category(self, array: str) -> str:
        """read-only, strict read-write, expandable read-write or write-only."""
        return self.arrays[array].category

    def sharing_sets(self) -> dict[str, tuple[str, ...]]:
        """Array -> the kernels that touch it (all versions), in call order."""
        return {name: info.sharing_set for name, info in self.arrays.items()}

    def shared_arrays(self) -> list[str]:
        """Arrays touched by at least two kernels."""
        return [name for name, kernels in self.sharing_sets().items() if len(kernels) >= 2]

    def thread_load(self, kernel: str, array: str) -> float:
        """ThrLD: threads of a block of ``kernel`` that read one element of ``array`` (0: none)."""
        access = self.app.kernel_by_name[kernel].access(base_array(array))
        return access.thread_load if access is not None and access.reads else 0.0

    def degree_of_kinship(self, a: str, b: str, within: Iterable[str] | None = None) -> int:
        """DegKin (note §6.1): the shortest sharing chain from ``a`` to ``b``, 0 if none.

        ``within`` restricts the chain to those kernels (a group), as constraint (1.5) reads.
        """
        if a == b:
            return 0
        graph = self.sharing if within is None else self.sharing.subgraph(set(within) | {a, b})
        try:
            return nx.shortest_path_length(graph, a, b)
        except nx.NetworkXNoPath:
            return 0

    # -- per-kernel metadata for the models ------------------------------------------------------
    @cached_property
    def metadata(self) -> dict[str, KernelMetadata]:
        """Table III metadata of every kernel, missing fields derived (docs/projection.md)."""
        return {spec.name: self._kernel_metadata(spec) for spec in self.app.kernels}

    def _kernel_metadata(self, spec: KernelSpec) -> KernelMetadata:
        app, arch = self.app, self.arch
        reads, writes = self.accesses[spec.name]
        element = {v: app.array_by_name[base_array(v)].element_bytes
                   for v in list(reads) + list(writes)}
        nbytes = {v: float(element[v] * app.array_elements(base_array(v))) for v in element}
        thr = spec.threads_per_block
        staged = tuple(v for v, load in reads.items() if load > 1)
        halo = spec.halo
        if halo is None:
            radii = []
            for access in spec.accesses:
                if access.reads and access.thread_load > 1:
                    radii.append(access.radius if access.radius is not None
                                 else _radius_from_load(access.thread_load))
            halo = _halo_sites(thr, max(radii)) if radii else 0
        shared = spec.shared_memory
        if shared is None:
            shared = (thr + halo) * sum(element[v] for v in staged)
        blocks_per_sm = spec.active_blocks_per_sm
        if blocks_per_sm is None:
            limits = [arch.max_blocks_per_sm, arch.max_threads_per_sm // thr,
                      arch.registers_per_sm // (thr * spec.registers)]
            if shared:
                limits.append(arch.shared_memory_per_sm // shared)
            blocks_per_sm = max(1, min(limits))
        flops = spec.flops
        if flops is None:
            flops = float(spec.sites * sum(reads.values()))
        array_flops = {}
        for access in spec.accesses:
            if access.writes and access.flops is not None:
                version = next(v for v in writes if base_array(v) == access.array)
                array_flops[version] = access.flops
        return KernelMetadata(
            name=spec.name, threads_per_block=thr, blocks=spec.blocks,
            active_threads_per_block=spec.active_threads_per_block or thr,
            active_blocks_per_sm=blocks_per_sm, registers=spec.registers, flops=flops,
            reads=dict(reads), writes=writes, address_registers=spec.address_registers,
            halo=halo, array_flops=array_flops, shared_arrays=staged, element_size=element,
            array_bytes=nbytes, runtime_s=spec.runtime_s)

    # -- groups ----------------------------------------------------------------------------------
    def _ordered(self, members: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(members, key=self.index.__getitem__))

    def _mask(self, members: Iterable[str]) -> int:
        mask = 0
        for name in members:
            mask |= 1 << self.index[name]
        return mask

    def projection(self, members: Iterable[str]) -> Projection:
        """Wahib & Maruyama 2014's projection of the group (Eqs. 2-10), memoised; resources included."""
        key = self._ordered(members)
        if key not in self._projections:
            options = self.options if self.model in ("wahib", "wahib-norm") else \
                replace(self.options, normalized=False)
            stored = None
            if self.model != "wahib":  # the literal model has no use for DRAM bytes
                inside = set(key)
                stored = [v for m in key for v in self._outside_needs(m, inside)]
            self._projections[key] = project_group([self.metadata[k] for k in key], self.arch,
                                                   options, stored)
        return self._projections[key]

    def variant(self, members: Iterable[str]) -> str:
        """``single``; ``simple`` (no precedence inside); ``complex`` (a RAW inside: barrier,
        and halo recomputation when read through a stencil), as Wahib & Maruyama 2014 §III.D names them."""
        key = self._ordered(members)
        if len(key) == 1:
            return "single"
        inside = set(key)
        for a in key:
            for b in self.order_dag.successors(a):
                if b in inside and any(w.startswith("RAW") for w in
                                       self.order_dag.edges[a, b]["why"]):
                    return "complex"
        return "simple"

    def original_sum(self, members: Iterable[str]) -> float:
        """F^Sigma: the summed measured runtimes."""
        return sum(self.app.kernel_by_name[k].runtime_s for k in members)

    def violations(self, members: Iterable[str], *, stop_at_first: bool = False
                   ) -> list[Violation]:
        """Every constraint the group breaks, each with the reason in words.

        Checked in this order: known kernels, header (one launch shape, Qiao 2021 Eq. 3.3),
        (1.3) convexity, (1.5) degree of kinship, (1.7) registers, (1.6) on-chip memory,
        Qiao 2021's L1, L2, L5, L5' and L6 when ``seed002_rules`` is on, and (1.1) projected
        time below the original sum. Singletons break nothing.
        """
        members = list(members)
        found: list[Violation] = []

        def add(rule: str, reason: str) -> bool:
            found.append(Violation(rule, reason))
            return stop_at_first

        unknown = [m for m in members if m not in self.index]
        if unknown:
            add("known kernels", f"no kernel named {unknown[0]!r}")
            return found
        key = self._ordered(set(members))
        if len(key) < 2:
            return found
        reason = self.header_reason(key)
        if reason and add("header", reason):
            return found
        mask = self._mask(key)
        between = self._reach.between(mask)
        if between:
            inside = [self.kernels[i] for i in range(len(self.kernels)) if between >> i & 1]
            first = inside[0]
            source = next(k for k in key if self._desc[self.index[k]] >> self.index[first] & 1)
            target = next(k for k in reversed(key)
                          if self._anc[self.index[k]] >> self.index[first] & 1)
            if add("1.3", f"not convex: '{first}' lies on a path from '{source}' to "
                          f"'{target}' but is not in the group"):
                return found
        parts = self._sharing_components(mask)
        if len(parts) > 1:
            a, b = parts[0][0], parts[1][0]
            if add("1.5", f"degree of kinship of '{a}' and '{b}' is 0: no chain of shared "
                          f"arrays links {parts[0]} and {parts[1]} inside the group"):
                return found
        projection = self.projection(key)
        if projection.reason is not None:
            if add(projection.constraint or "resources", projection.reason):
                return found
        if self.seed002_rules:
            for rule, reason in self.seed002_violations(key, projection):
                if add(rule, reason):
                    return found
        if projection.reason is None:
            time_s = self.group_time(key)
            original = self.original_sum(key)
            if not time_s < original:
                add("1.1", f"projected {time_s * 1e6:.1f} us ({self.model}) is not below "
                           f"the original sum {original * 1e6:.1f} us")
        return found

    @cached_property
    def _readers(self) -> dict[str, frozenset[str]]:
        """Array version -> the kernels that read it."""
        readers: dict[str, set[str]] = {}
        for kernel, (reads, _) in self.accesses.items():
            for version in reads:
                readers.setdefault(version, set()).add(kernel)
        return {v: frozenset(k) for v, k in readers.items()}

    def _outside_needs(self, member: str, inside: set[str]) -> list[str]:
        """Versions ``member`` writes that something outside the group needs: a reader
        outside, the host (``output: true``), or nobody at all (so the host must)."""
        needed = []
        arrays = self.app.array_by_name
        for version in self.metadata[member].writes:
            readers = self._readers.get(version, frozenset())
            if not readers or not readers <= inside or arrays[base_array(version)].output:
                needed.append(version)
        return needed

    def seed002_violations(self, key: tuple[str, ...], projection: Projection
                           ) -> list[tuple[str, str]]:
        """Qiao 2021's rules on metadata (Hipacc notes §3): L1 single exit, L2 external inputs
        only at entry, L5 occupancy ratio >= C_OCC, L5' shared-memory growth <= C_SHARED,
        L6 every internal edge profitable."""
        found: list[tuple[str, str]] = []
        inside = set(key)
        exits = [m for m in key if self._outside_needs(m, inside)]
        if len(exits) > 1:
            found.append(("L1", f"several kernels write data needed outside the group "
                                f"({', '.join(repr(e) for e in exits[:3])}); a fused kernel "
                                "keeps only its sink's output"))
        raw_inside = {b for a in key for b in self.order_dag.successors(a) if b in inside
                      and any(w.startswith("RAW") for w in self.order_dag.edges[a, b]["why"])}
        sources = [m for m in key if m not in raw_inside]
        produced = {v for m in key for v in self.metadata[m].writes}
        entry = {v for m in sources for v in self.metadata[m].reads}
        for member in key:
            if member in sources:
                continue
            late = [v for v in self.metadata[member].reads if v not in produced
                    and v not in entry]
            if late:
                found.append(("L2", f"'{member}' reads '{late[0]}' from outside the group, "
                                    "which no source kernel of the group reads"))
                break
        if projection.reason is None:
            best = max(self.metadata[m].active_blocks_per_sm for m in key)
            if projection.blocks_per_sm < C_OCC * best:
                found.append(("L5", f"occupancy falls to {projection.blocks_per_sm} blocks per "
                                    f"SM from {best} (below {C_OCC:.0%}, Qiao 2021 Eq. 3.2)"))
            element: dict[str, int] = {}
            for member in key:
                element.update(self.metadata[member].element_size)
            own = max(sum(element.get(v, 8) for v in self.metadata[m].shared_arrays)
                      for m in key)
            fused = sum(element.get(v, 8) for v in projection.shared_list)
            if own and fused > C_SHARED * own:
                found.append(("L5'", f"shared memory per site grows {fused / own:.1f}x "
                                     f"(limit {C_SHARED:g}x)"))
        for producer, consumer, version, benefit in self.edge_benefits(key):
            if benefit + self.qiao_parameters(8).gamma <= 0:
                found.append(("L6", f"fusing '{producer}' -> '{consumer}' ('{version}') costs "
                                    f"more recomputation than it saves "
                                    f"({benefit * 1e6:.1f} us)"))
                break
        return found

    def header_reason(self, members: Sequence[str]) -> str | None:
        """All members launch the same shape (Wahib & Maruyama 2014's common Thr/B; Qiao 2021 L4)."""
        specs = [self.app.kernel_by_name[m] for m in members]
        shape = (specs[0].threads_per_block, specs[0].blocks)
        for spec in specs[1:]:
            if (spec.threads_per_block, spec.blocks) != shape:
                return (f"launch shapes differ: '{specs[0].name}' runs {shape[1]} blocks of "
                        f"{shape[0]} threads, '{spec.name}' {spec.blocks} of "
                        f"{spec.threads_per_block}")
        return None

    def _sharing_components(self, mask: int) -> list[list[str]]:
        parts = []
        left = mask
        while left:
            start = left & -left
            reached = frontier = start
            while frontier:
                new = 0
                bit = frontier
                while bit:
                    low = bit & -bit
                    new |= self._neighbours[low.bit_length() - 1]
                    bit ^= low
                new &= mask & ~reached
                reached |= new
                frontier = new
            parts.append([self.kernels[i] for i in range(len(self.kernels)) if reached >> i & 1])
            left &= ~reached
        return parts

    def group_reason(self, members: Sequence[str]) -> str | None:
        """``None`` if the group may be fused, else the first failed constraint and why."""
        found = self.violations(members, stop_at_first=True)
        if not found:
            return None
        first = found[0]
        label = f"({first.rule})" if first.rule[:1].isdigit() else f"{first.rule}:"
        return f"{label} {first.reason}"

    def plan_violations(self, groups: Sequence[Sequence[str]]) -> list[Violation]:
        """(1.2) every kernel in exactly one group, (1.4) known kernels and non-empty groups,
        every group's constraints, and an acyclic quotient of the order DAG."""
        found: list[Violation] = []
        seen: dict[str, int] = {}
        for index, group in enumerate(groups):
            if not group:
                found.append(Violation("1.4", f"group #{index + 1} is empty"))
            for name in group:
                if name not in self.index:
                    found.append(Violation("1.4", f"no kernel named {name!r}"))
                elif name in seen:
                    found.append(Violation("1.2", f"'{name}' is in two groups"))
                seen[name] = index
        missing = [k for k in self.kernels if k not in seen]
        if missing:
            found.append(Violation("1.2", f"{missing} are in no group"))
        if found:
            return found
        for group in groups:
            for violation in self.violations(group):
                found.append(Violation(violation.rule, f"group {list(group)}: "
                                                       f"{violation.reason}"))
        quotient = nx.DiGraph()
        quotient.add_nodes_from(range(len(groups)))
        for a, b in self.order_dag.edges:
            if seen[a] != seen[b]:
                quotient.add_edge(seen[a], seen[b])
        try:
            cycle = nx.find_cycle(quotient)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            names = [list(groups[edge[0]]) for edge in cycle]
            found.append(Violation("acyclic", f"groups {names} depend on each other in a "
                                              "cycle"))
        return found

    # -- time --------------------------------------------------------------------------------
    def group_time(self, members: Sequence[str]) -> float:
        """Seconds of the group as one kernel: measured P_i alone, the model when fused."""
        key = self._ordered(members)
        found = self._times.get(key)
        if found is None:
            found = self._time(key)
            self._times[key] = found
        return found

    def _time(self, key: tuple[str, ...]) -> float:
        if len(key) == 1:
            return self.app.kernel_by_name[key[0]].runtime_s
        projection = self.projection(key)
        if projection.reason is not None:
            return math.inf
        if self.model in ("wahib", "wahib-norm"):
            return projection.time_s
        if self.model == "roofline":
            return self._simple_time(key, projection)
        return self._qiao_time(key, projection)

    def _simple_time(self, key: tuple[str, ...], projection: Projection) -> float:
        """Wahib & Maruyama 2014's "simple model": the original sum less the traffic fusion removes.

        The group's DRAM bytes are priced at the members' own effective bandwidth (their
        bytes over their measured time), bounded below by FLOPs at the device's peak; each
        fused member saves one launch.
        """
        members = [self.metadata[k] for k in key]
        unfused_bytes = sum(k.bytes_moved() for k in members)
        original = self.original_sum(key)
        time_s = original * projection.dram_bytes / unfused_bytes if unfused_bytes else original
        if self.arch.peak_gflops:
            time_s = max(time_s, 1e-9 * projection.flops / self.arch.peak_gflops)
        return max(time_s - self.arch.launch_overhead_s * (len(key) - 1), 1e-12)

    def _qiao_time(self, key: tuple[str, ...], projection: Projection) -> float:
        """Qiao 2021's benefit model on metadata: original sum less the internal edges' weights."""
        edges = {}
        for a, b, version, benefit in self.edge_benefits(key):
            edges[(a, b, version)] = benefit
        floor = projection.dram_bytes / (self.arch.bandwidth_gbps * 1e9)
        return qiao.combine(self.original_sum(key), edges, len(key),
                            self.arch.launch_overhead_s, floor).time_s

    def qiao_parameters(self, element_bytes: int) -> qiao.QiaoParameters:
        """Seconds-based benefit parameters for this device (note §9 of the Hipacc notes)."""
        t_g = 2 * element_bytes / (self.arch.bandwidth_gbps * 1e9)
        peak = self.arch.peak_gflops or self.arch.sm_count * 128 * 1.755 * 0.5
        return qiao.QiaoParameters(t_g=t_g, t_s=t_g / qiao.SHARED_SPEEDUP,
                                   c_op=1.0 / (peak * 1e9),
                                   gamma=self.arch.launch_overhead_s, epsilon=1e-15)

    def edge_benefits(self, members: Sequence[str]) -> list[tuple[str, str, str, float]]:
        """(producer, consumer, array version, benefit in seconds) of each internal RAW edge."""
        inside = set(members)
        result = []
        for consumer in self._ordered(inside):
            reads = self.metadata[consumer].reads
            for version, load in reads.items():
                producer = next((p for p in self.order_dag.predecessors(consumer)
                                 if p in inside and version in
                                 self.order_dag.edges[p, consumer]["buffers"]), None)
                if producer is None:
                    continue
                source = self.metadata[producer]
                local = any(v > 1 for v in source.reads.values())
                kind = qiao.scenario(load, local)
                elements = self.app.array_elements(base_array(version))
                produced = sum(self.app.array_elements(base_array(v)) for v in source.writes)
                cost = source.flops / max(1, produced)  # operations per produced element
                inputs = sum(self.app.array_elements(base_array(v)) for v in source.reads)
                if kind == "shared":
                    window = qiao.fused_window(max(source.reads.values()), load)
                else:
                    window = load
                params = self.qiao_parameters(source.element_size.get(version, 8))
                result.append((producer, consumer, version,
                               qiao.raw_benefit(kind, elements, cost, inputs, window, params)))
        return result

    def unfused_time(self) -> float:
        """The summed measured runtimes of all kernels."""
        return self.original_sum(self.kernels)

    # -- for the search strategies -----------------------------------------------------------
    def fusion_problem(self) -> Any:
        """The :class:`~kfuse.search.problem.FusionProblem` the strategies solve."""
        from kfuse.search.problem import FusionProblem

        return FusionProblem(kernels=self.kernels, order_dag=self.order_dag,
                             sharing=self.sharing, group_reason=self.group_reason,
                             group_time=self.group_time, model=self.model,
                             hereditary_reason=self.hereditary_reason, name=self.app.name)

    def hereditary_reason(self, members: Sequence[str]) -> str | None:
        """Why the group *and every superset of it* fail, or ``None`` (enumeration pruning).

        The exact search's candidate enumeration stops growing a set for which this gives
        a reason, so it may only name rules that no added kernel can repair. Each rule
        below is monotone in the member set (``G ⊇ F`` below; Thr and B are common to
        both, by the header rule, so they are constants):

        - **header** (Qiao 2021 L4 / Wahib & Maruyama 2014's common Thr and B): two members with different
          launch shapes stay in every superset.
        - **registers (1.7)**: R_need of Eq. (6) grows with the pivot (arrays touched by two
          members: only grows), the largest thread load over it (a max over more reads),
          ``c`` (a RAW read through a stencil inside the group stays inside), H_TH (from the
          widest halo: a max) and RAdr (a max); the fused RT is the max of that and the
          members' RT. So ``RT > R_Max``, and one block's ``Thr * RT`` above the SM's
          register file (Eq. 3: no block fits), hold for every superset.
        - **shared memory (1.6)**: one block needs ``(1 + c*H_TH) * TB * S_bytes`` plus
          padding (Eq. 7); ``c``, H_TH and ``S_bytes`` (ShrLst: the members' own staged
          arrays plus pivots read through a stencil) only grow, but TB is a *min* over the
          members and can fall. The test therefore uses the smallest TB of any kernel with
          the same launch shape (every superset's TB is at least that): if even that block
          does not fit, no superset's does.
        - **profit (1.1), literal ``wahib`` model only**: Eq. (10) is
          ``T(G) = rate(G) * (FLOPs + halo FLOPs)`` with ``rate = 1e-9 * precision * Thr * B
          * (1 + c*H_TH) * max(1, |ShrLst|) / (TB * BlocksSMX * SMX * BW)``. ``rate`` only
          grows with the group: precision (widest element, a max), ``1 + c*H_TH`` and
          ``|ShrLst|`` as above, and ``TB * BlocksSMX`` only falls (TB is a min;
          BlocksSMX is at most the members' least active blocks, the register limit of
          Eq. 3, the hardware limits and, bounded with the smallest TB as above, the
          shared-memory limit of Eq. 7; the bound is that product). Halo FLOPs are >= 0,
          so (1.1) for ``G`` needs ``Σ_{i∈G} (rate(G) * Fl_i - P_i) < 0``. With
          ``rate(G) >= rate(F)`` for the members of ``F`` and ``rate(G) >= rate(F + j)``
          for each kernel ``j`` added, the members' terms plus the negative terms
          ``rate(F + j) * Fl_j - P_j`` of all kernels outside ``F`` bound that sum from
          below; when the bound is >= 0 no superset is profitable. The other models' times
          (DRAM bytes that drop when an intermediate becomes internal, Qiao 2021's edge
          benefits) are not monotone and get no such rule.

        Not hereditary, hence not here: convexity (1.3) and kinship (1.5), which a kernel
        in between can repair; Qiao 2021's L1/L2/L5/L6 (exits, entry reads, occupancy and
        edge benefits move both ways). ``tests/test_project.py`` checks on synthetic
        instances that enumeration with and without this pruning finds the same groups.
        """
        key = self._ordered(members)
        if len(key) < 2:
            return None
        reason = self.header_reason(key)
        if reason:
            return f"header: {reason}"
        return self._bounds.reason(self._mask(key))

    @cached_property
    def _bounds(self) -> _MonotoneBounds:
        return _MonotoneBounds(self)


class _MonotoneBounds:
    """Bitmask evaluation of the monotone quantities of Wahib & Maruyama 2014's projection (registers,
    one block's shared memory, the Eq. (10) rate) for :meth:`AppProblem.hereditary_reason`.

    It mirrors :func:`kfuse.model.wahib.aggregate` and :func:`~kfuse.model.wahib.project_group`
    on masks of kernels and array versions, so that pruning a candidate costs microseconds
    instead of a full projection. Groups must share one launch shape (checked before).
    """

    def __init__(self, problem: AppProblem) -> None:
        self.problem = problem
        self.arch = problem.arch
        meta = [problem.metadata[name] for name in problem.kernels]
        versions: dict[str, int] = {}

        def bits_of(names: Iterable[str]) -> int:
            mask = 0
            for name in names:
                mask |= 1 << versions.setdefault(name, len(versions))
            return mask

        self.touched = [bits_of(list(k.reads) + list(k.writes)) for k in meta]
        self.writes = [bits_of(k.writes) for k in meta]
        self.stencil = [bits_of(v for v, load in k.reads.items() if load > 1) for k in meta]
        self.own = [bits_of(k.shared_arrays) for k in meta]
        self.loads = [[(1 << versions[v], load) for v, load in k.reads.items() if load > 1]
                      for k in meta]
        element = dict.fromkeys(versions, 8)
        for k in meta:
            element.update(k.element_size)
        self.element = [0] * len(versions)
        for name, bit in versions.items():
            self.element[bit] = element[name]
        self.uniform = self.element[0] if len(set(self.element)) == 1 else 0
        self._smem: dict[tuple[int, bool, int, int], int] = {}
        self.halo = [k.halo for k in meta]
        self.h_th = [halo_per_thread(k.halo, k.threads_per_block) for k in meta]
        self.registers = [k.registers for k in meta]
        self.address = [k.address_registers for k in meta]
        self.threads = [k.active_threads_per_block for k in meta]
        self.blocks = [k.active_blocks_per_sm for k in meta]
        self.widest = [k.widest_element for k in meta]
        self.flops = [float(k.flops) for k in meta]
        self.runtime = [float(k.runtime_s or 0.0) for k in meta]
        self.thr = [k.threads_per_block for k in meta]
        self.grid = [k.blocks for k in meta]
        shapes: dict[tuple[int, int], int] = {}
        for k in meta:
            shape = (k.threads_per_block, k.blocks)
            shapes[shape] = min(shapes.get(shape, k.active_threads_per_block),
                                k.active_threads_per_block)
        self.smallest = [shapes[(k.threads_per_block, k.blocks)] for k in meta]
        same: dict[tuple[int, int], int] = {}
        for i, k in enumerate(meta):
            same[(k.threads_per_block, k.blocks)] = same.get((k.threads_per_block, k.blocks),
                                                             0) | 1 << i
        self.shape_mask = [same[(k.threads_per_block, k.blocks)] for k in meta]
        # P_j / Fl_j: a kernel lowers a group's excess only while the rate is below it
        self.ratio = [r / f if f > 0 else math.inf for r, f in zip(self.runtime, self.flops,
                                                                   strict=True)]
        ordered = sorted(range(len(meta)), key=lambda j: (-self.ratio[j], j))
        self.by_ratio = [[j for j in ordered if self.shape_mask[i] >> j & 1]
                         for i in range(len(meta))]
        self.literal = problem.model == "wahib"
        self.precision = problem.options.precision_bytes

    def _rate(self, precision: int, thr: int, grid: int, complex_fusion: bool, h_th: int,
              count: int, threads: int, blocks: int, registers: int, smallest: int,
              site_bytes: int) -> float | None:
        """Eq. (10)'s seconds per FLOP with BlocksSMX bounded as the docstring of
        :meth:`AppProblem.hereditary_reason` says; ``None`` when no block can run."""
        arch = self.arch
        key = (smallest, complex_fusion, h_th, site_bytes)
        smem = self._smem.get(key)
        if smem is None:
            smem = self._smem[key] = shared_memory_blocks(smallest, complex_fusion, h_th,
                                                          site_bytes, arch,
                                                          arch.max_blocks_per_sm)
        limit = min(blocks, arch.registers_per_sm // (thr * registers), arch.max_blocks_per_sm,
                    arch.max_threads_per_sm // thr, smem)
        occupancy = threads * max(0, limit)
        if occupancy <= 0:
            return None
        return (1e-9 * precision * thr * grid * (1 + int(complex_fusion) * h_th)
                * max(1, count) / (occupancy * arch.sm_count * arch.bandwidth_gbps))

    def _site_bytes(self, shared: int) -> tuple[int, int]:
        """(bytes per site, count) of the staged array versions in ``shared``."""
        if self.uniform:
            count = shared.bit_count()
            return count * self.uniform, count
        site_bytes = count = 0
        while shared:
            low = shared & -shared
            site_bytes += self.element[low.bit_length() - 1]
            count += 1
            shared ^= low
        return site_bytes, count

    def reason(self, mask: int) -> str | None:
        """The monotone failure of the group (a mask of kernels of one launch shape)."""
        arch = self.arch
        seen1 = seen2 = written = stencil = own = 0
        complex_fusion = False
        halo = registers = address = widest = 0
        threads = blocks = 1 << 62
        members = []
        bits = mask
        while bits:
            low = bits & -bits
            i = low.bit_length() - 1
            bits ^= low
            members.append(i)
            touched = self.touched[i]
            seen2 |= seen1 & touched
            seen1 |= touched
            if self.stencil[i] & written:
                complex_fusion = True
            written |= self.writes[i]
            stencil |= self.stencil[i]
            own |= self.own[i]
            # (conditional expressions: this loop runs for every candidate set)
            value = self.halo[i]
            halo = value if value > halo else halo
            value = self.registers[i]
            registers = value if value > registers else registers
            value = self.address[i]
            address = value if value > address else address
            value = self.widest[i]
            widest = value if value > widest else widest
            value = self.threads[i]
            threads = value if value < threads else threads
            value = self.blocks[i]
            blocks = value if value < blocks else blocks
        first = members[0]
        thr, grid, smallest = self.thr[first], self.grid[first], self.smallest[first]
        load = 1.0
        for i in members:
            for bit, value in self.loads[i]:
                if bit & seen2 and value > load:
                    load = value
        h_th = halo_per_thread(halo, thr)
        need = registers_needed(load, complex_fusion, h_th, address, arch.reg_fac)
        granule = max(1, arch.register_granularity)
        registers = max(registers, math.floor(need) + 1)
        registers = -(-registers // granule) * granule
        if registers > arch.max_registers_per_thread:
            return (f"(1.7) needs {registers} registers per thread, above R_Max = "
                    f"{arch.max_registers_per_thread} (so does every larger group)")
        if thr * registers > arch.registers_per_sm:
            return (f"(1.7) one block of {thr} threads at {registers} registers exceeds the "
                    f"SM's {arch.registers_per_sm} registers (so does every larger group)")
        site_bytes, count = self._site_bytes(own | (seen2 & stencil))
        if site_bytes:
            one = shared_bytes_used(smallest, 1, complex_fusion, h_th, site_bytes,
                                    arch.bank_padding)
            if one > arch.shared_memory_per_sm:
                return (f"(1.6) one block needs at least {one} bytes of shared memory "
                        f"({count} staged arrays, halo factor "
                        f"{1 + int(complex_fusion) * h_th}), capacity "
                        f"{arch.shared_memory_per_sm} (so does every larger group)")
        if not self.literal:
            return None
        precision = self.precision or widest
        rate = self._rate(precision, thr, grid, complex_fusion, h_th, count, threads, blocks,
                          registers, smallest, site_bytes)
        if rate is None:
            return None  # the projection's own (1.6)/(1.7) reason applies to this group
        flops, runtime = self.flops, self.runtime
        inside = sum(rate * flops[i] - runtime[i] for i in members)
        if inside < 0:
            return None
        # kernels that could lower the sum: same launch shape, not members, and
        # ``P_j / Fl_j`` above F's rate (the order list is sorted by that ratio, descending)
        helpers = []
        weak = inside  # every helper at F's own rate: a cheaper, weaker bound first
        for j in self.by_ratio[first]:
            if self.ratio[j] <= rate:
                break
            if not mask >> j & 1:
                helpers.append(j)
                weak += rate * flops[j] - runtime[j]
        if weak >= 0:
            return self._unprofitable(inside)
        # each helper j at a lower bound of rate(F + j): exact ShrLst, c, H_TH, TB,
        # precision and active blocks; registers without j's growth of R_need (fewer
        # registers only raise BlocksSMX, so the rate stays a lower bound)
        best = inside
        # prefix writes / suffix stencil reads of the members, for c of F + j
        cumulative_writes = [0]
        for i in members:
            cumulative_writes.append(cumulative_writes[-1] | self.writes[i])
        suffix_stencil = [0] * (len(members) + 1)
        for position in range(len(members) - 1, -1, -1):
            suffix_stencil[position] = suffix_stencil[position + 1] | self.stencil[members[position]]
        touched_of, own_of, stencil_of = self.touched, self.own, self.stencil
        uniform = self.uniform
        smem_cache = self._smem
        register_file = arch.registers_per_sm
        hardware = min(arch.max_blocks_per_sm, arch.max_threads_per_sm // thr)
        constant = 1e-9 * thr * grid / (arch.sm_count * arch.bandwidth_gbps)
        for j in helpers:
            shared_j = own | own_of[j] | ((seen2 | (seen1 & touched_of[j]))
                                          & (stencil | stencil_of[j]))
            if uniform:
                grown_count = shared_j.bit_count()
                grown_bytes = grown_count * uniform
            else:
                grown_bytes, grown_count = self._site_bytes(shared_j)
            grown_complex = complex_fusion
            if not grown_complex:
                position = bisect_left(members, j)
                grown_complex = bool(stencil_of[j] & cumulative_writes[position]
                                     or self.writes[j] & suffix_stencil[position])
            grown_h = self.h_th[j]
            grown_h = h_th if h_th > grown_h else grown_h  # (H_TH of the widest halo)
            key = (smallest, grown_complex, grown_h, grown_bytes)
            smem = smem_cache.get(key)
            if smem is None:
                smem = smem_cache[key] = shared_memory_blocks(
                    smallest, grown_complex, grown_h, grown_bytes, arch, arch.max_blocks_per_sm)
            value = self.registers[j]
            limit = register_file // (thr * (value if value > registers else registers))
            value = self.blocks[j]
            value = value if value < blocks else blocks
            limit = value if value < limit else limit
            limit = smem if smem < limit else limit
            limit = hardware if hardware < limit else limit
            if limit <= 0:
                continue  # no block of F + j fits: no group holding both can run
            value = self.precision or self.widest[j]
            grown_precision = value if value > precision else precision
            value = self.threads[j]
            grown_threads = value if value < threads else threads
            grown = (constant * grown_precision * (1 + grown_h if grown_complex else 1)
                     * (grown_count if grown_count > 1 else 1) / (grown_threads * limit))
            if grown * flops[j] < runtime[j]:
                best += grown * flops[j] - runtime[j]
                if best < 0:
                    return None
        return self._unprofitable(inside)

    def _unprofitable(self, excess: float) -> str:
        return (f"(1.1) no group holding these kernels can be faster than its original sum "
                f"under the {self.problem.model} model: the fused rate alone costs "
                f"{excess * 1e6:.1f} us more than their measured time and no other kernel "
                "makes up for it")


def app_problem(app: AppMetadata, model: str = "wahib") -> AppProblem:
    """Shorthand for :class:`AppProblem`."""
    return AppProblem(app, model)


__all__ = ["AppProblem", "ArrayInfo", "CATEGORIES", "PROJECT_MODELS", "app_problem",
           "base_array", "classify_arrays", "order_graph", "sharing_graph",
           "versioned_accesses"]
