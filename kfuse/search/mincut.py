"""Min-cut search: Qiao 2021 Algorithm 2 (recursive Stoer-Wagner on benefit-weighted edges).

Each producer -> consumer edge gets the benefit of fusing that pair (Qiao 2021 §3.4, notes
``hipacc-fusion.md`` §4); illegal pairs get a tiny ``epsilon``. Starting from the whole
pipeline, a block that is legal is kept; otherwise it is split along its weak components,
or else along the minimum cut (``networkx.stoer_wagner``, vertices in program order), and
both halves go back on a FIFO worklist. Cutting only cheap edges keeps the profitable
pairs together.

Edge weights and block legality are computed here from the IR, not taken from
``kfuse.model.qiao`` (written in parallel): the weight function below implements the
notes' §4 (``t_g = 400``, ``t_s = t_g / 15``, ``c_ALU = 4``, ``c_SFU = 16`` as no value is
given, ``gamma = 0``; image sizes normalised by the largest buffer; ambiguity A1 read as
``IS (t_g - t_s)``). Block legality is L0-L4 and L5' (shared memory grows at most
``c_Mshared = 2`` times; the sum rule when a producer is inlined into a local consumer),
L6 (every internal edge's raw benefit positive) and the kfuse chain check with redundant
evaluations ``A(v) - 1``, plus the problem's own rules (``FusionProblem`` legality,
resources included) and constraint (1.1) under the problem's model (a block the chosen
model predicts slower than its kernels apart is split further); L5's occupancy ratio is
left to the resource check.

A problem without an IR graph (codeless or synthetic) is cut with weights from its own
model: the time a pair saves fused, ``epsilon`` for illegal or unprofitable pairs; a block
is then kept when it is legal and beats its kernels run apart (constraint 1.1).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from kfuse.search.problem import Bits, FusionProblem

T_GLOBAL = 400.0
T_SHARED = T_GLOBAL / 15.0
C_ALU = 4.0
C_SFU = 16.0
GAMMA = 0.0
C_MSHARED = 2.0
TILE = 16


@dataclass(frozen=True)
class HipaccParams:
    """Qiao 2021's hardware and legality constants (notes §3, §4.1)."""

    t_global: float = T_GLOBAL
    t_shared: float = T_SHARED
    c_alu: float = C_ALU
    c_sfu: float = C_SFU
    gamma: float = GAMMA
    c_mshared: float = C_MSHARED


class Hipacc:
    """Qiao 2021's view of a problem: operator classes, edge benefits and block legality."""

    def __init__(self, problem: FusionProblem, params: HipaccParams | None = None) -> None:
        self.problem = problem
        self.bits: Bits = problem.bits
        self.params = params or HipaccParams()
        self.graph = problem.graph
        self.edges = [(s, t) for s, t in problem.order_dag.edges]
        self._raw = {(s, t): self._raw_benefit(s, t) for s, t in self.edges}
        legal = [self._raw[e] for e in self.edges if self._raw[e] > 0 and self.pair_legal(*e)]
        smallest = min(legal) if legal else 1.0
        self.epsilon = smallest / (len(self.edges) + 2) / 1000.0
        self.weights = {e: (max(self._raw[e], self.epsilon) if self.pair_legal(*e)
                            else self.epsilon) for e in self.edges}

    # -- IR facts ----------------------------------------------------------------------------
    def kind(self, name: str) -> str:
        """'P', 'L', 'G' (reduction) or 'X' (opaque user kernel)."""
        if self.graph is None:
            return "P"
        kind = self.graph.kernel_by_name[name].kind
        return {"point": "P", "local": "L", "reduce": "G"}.get(kind, "X")

    def _image_size(self, buffer: str) -> float:
        sizes = self.problem.sizes or {}
        shape = self.graph.buffers[buffer].shape
        largest = max((math.prod(sizes.get(s, 1) for s in b.shape)
                       for b in self.graph.buffers.values()), default=1)
        return math.prod(sizes.get(s, 1) for s in shape) / largest

    def _window(self, consumer: str, buffer: str | None = None) -> tuple[int, ...]:
        kernel = self.graph.kernel_by_name[consumer]
        windows = [a.window for a in kernel.accesses
                   if a.window and (buffer is None or a.buffer == buffer)]
        if not windows:
            return (1,) * kernel.ndim
        size = max(len(w) for w in windows)
        return tuple(max(w[k] if k < len(w) else 1 for w in windows) for k in range(size))

    def _cost_op(self, name: str) -> float:
        from kfuse.ir.expr import count_operations
        kernel = self.graph.kernel_by_name[name]
        counts = count_operations(kernel.body) if kernel.body is not None else {"alu": 0,
                                                                                "sfu": 0}
        return self.params.c_alu * counts["alu"] + self.params.c_sfu * counts["sfu"]

    def _inputs_size(self, name: str) -> float:
        return sum(self._image_size(b) for b in self.graph.kernel_by_name[name].reads)

    def _edge_buffer(self, source: str, target: str) -> str:
        buffers = self.problem.order_dag.edges[source, target].get("buffers")
        if buffers:
            return buffers[0]
        return self.graph.kernel_by_name[source].output

    # -- benefits (notes §4.3) ---------------------------------------------------------------
    def _raw_benefit(self, source: str, target: str) -> float:
        """Cycles saved by fusing the pair, before the context check (``w + gamma``)."""
        p = self.params
        if self.graph is None:
            bits = self.bits
            pair = bits.mask((source, target))
            apart = bits.time(1 << bits.index[source]) + bits.time(1 << bits.index[target])
            return apart - bits.time(pair) if bits.legal(pair) else -1.0
        ks, kt = self.kind(source), self.kind(target)
        if "G" in (ks, kt) or "X" in (ks, kt):
            return -1.0
        buffer = self._edge_buffer(source, target)
        size = self._image_size(buffer)
        if kt == "P":
            return size * p.t_global + p.gamma
        recompute = self._cost_op(source) * self._inputs_size(source)
        consumer_window = self._window(target, buffer)
        if ks == "P":
            return size * p.t_global - recompute * math.prod(consumer_window) + p.gamma
        producer_window = self._window(source)
        fused = math.prod(wd + 2 * (ws // 2) for wd, ws in zip(
            consumer_window, producer_window + (1,) * len(consumer_window), strict=False))
        return size * (p.t_global - p.t_shared) - recompute * fused + p.gamma

    def raw_benefit(self, source: str, target: str) -> float:
        return self._raw[(source, target)]

    # -- legality (notes §3) -----------------------------------------------------------------
    def pair_legal(self, source: str, target: str) -> bool:
        return self.block_reason((source, target), profitability=False) is None

    def block_reason(self, block: Iterable[str], profitability: bool = True) -> str | None:
        """Why ``block`` may not be one fused kernel under Qiao 2021's rules, or None."""
        members = set(block)
        if len(members) < 2:
            return None
        bits = self.bits
        mask = bits.mask(members)
        if not bits.legal(mask):
            return bits.reason(mask) or "illegal"
        inner = [(s, t) for s, t in self.edges if s in members and t in members]
        if self.graph is None:
            if profitability:
                apart = sum(bits.time(1 << bits.index[m]) for m in members)
                if bits.time(mask) >= apart:
                    return "unprofitable: not faster than its kernels apart (1.1)"
            return None
        dag = nx.DiGraph()
        dag.add_nodes_from(members)
        dag.add_edges_from(inner)
        if not nx.is_weakly_connected(dag):
            return "L0: not connected by data edges"
        kinds = {m: self.kind(m) for m in members}
        if any(k in ("G", "X") for k in kinds.values()):
            return "L3: global or opaque operator"
        graph = self.graph
        exits = []
        for m in members:
            kernel = graph.kernel_by_name[m]
            outside = any(c not in members for w in kernel.writes
                          for c in graph.consumers.get(w, ()))
            if outside or any(w in graph.outputs for w in kernel.writes):
                exits.append(m)
        if len(exits) != 1:
            return f"L1: {len(exits)} kernels have consumers outside the block"
        sources = [m for m in members if dag.in_degree(m) == 0]
        source_reads = {b for m in sources for b in graph.kernel_by_name[m].reads}
        produced = {w for m in members for w in graph.kernel_by_name[m].writes}
        for m in members:
            if m in sources:
                continue
            for b in graph.kernel_by_name[m].reads:
                if b not in produced and b not in source_reads:
                    return f"L2: '{m}' reads '{b}', which no source of the block reads"
        smem = {m: self._staging(m) for m in members}
        largest = max(smem.values())
        inlined = any(kinds[t] == "L" for _, t in inner)
        used = sum(smem.values()) if inlined else largest
        if largest > 0 and used / largest > self.params.c_mshared:
            return (f"L5': shared memory grows {used / largest:.1f} times "
                    f"(limit {self.params.c_mshared:g})")
        if profitability:
            for s, t in inner:
                if self._raw[(s, t)] <= 0:
                    return f"L6: fusing {s} -> {t} costs more than it saves"
            if self._chain_gain(members, inner, exits[0]) <= 0:
                return "L6: recomputation along the chain outweighs the saved traffic"
            return self.model_reason(members)
        return None

    def model_reason(self, members: Iterable[str]) -> str | None:
        """Constraint (1.1) under the problem's own model: the block must not be slower
        than its kernels apart (kfuse: the plan is priced with the model the user chose)."""
        bits = self.bits
        mask = bits.mask(members)
        if mask & (mask - 1) == 0:
            return None
        apart = sum(bits.time(1 << i) for i in range(bits.n) if mask >> i & 1)
        together = bits.time(mask)
        if together >= apart:
            return (f"(1.1): the {self.problem.model} model predicts {together * 1e3:.3f} ms "
                    f"fused vs {apart * 1e3:.3f} ms apart")
        return None

    def _staging(self, name: str) -> float:
        if self.kind(name) != "L":
            return 0.0
        return float(math.prod(TILE + w - 1 for w in self._window(name)))

    def _chain_gain(self, members: set[str], inner: list[tuple[str, str]], sink: str) -> float:
        """Saved traffic minus redundant evaluations along composed windows (notes §5.2)."""
        gain = 0.0
        for s, t in inner:
            size = self._image_size(self._edge_buffer(s, t))
            gain += size * (self.params.t_global if self.kind(t) == "P" or self.kind(s) == "P"
                            else self.params.t_global - self.params.t_shared)
        extent: dict[str, tuple[int, ...]] = {}
        order = [n for n in reversed(list(nx.topological_sort(
            self.problem.order_dag.subgraph(members))))]
        for name in order:
            if name == sink:
                extent[name] = (1,) * self.graph.kernel_by_name[name].ndim
                continue
            best: tuple[int, ...] | None = None
            for s, t in inner:
                if s != name or t not in extent:
                    continue
                window = self._window(t, self._edge_buffer(s, t))
                grown = tuple(e + w - 1 for e, w in zip(extent[t], window, strict=False))
                best = grown if best is None else tuple(map(max, best, grown))
            extent[name] = best or (1,)
            redundant = math.prod(extent[name]) - 1
            gain -= self._cost_op(name) * self._inputs_size(name) * redundant
        return gain


def _undirected(hipacc: Hipacc, block: list[str]) -> nx.Graph:
    members = set(block)
    graph = nx.Graph()
    graph.add_nodes_from(block)
    for (s, t), w in hipacc.weights.items():
        if s in members and t in members:
            if graph.has_edge(s, t):
                graph.edges[s, t]["weight"] += w
            else:
                graph.add_edge(s, t, weight=w)
    if hipacc.graph is None:  # kernels sharing data without an order edge may fuse too
        bits = hipacc.bits
        for a, b in hipacc.problem.sharing.subgraph(block).edges:
            if not graph.has_edge(a, b):
                pair = bits.mask((a, b))
                saved = (bits.time(1 << bits.index[a]) + bits.time(1 << bits.index[b])
                         - bits.time(pair)) if bits.legal(pair) else 0.0
                graph.add_edge(a, b, weight=max(saved, hipacc.epsilon))
    return graph


def mincut_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
                  params: HipaccParams | None = None
                  ) -> tuple[list[tuple[str, ...]], dict, dict]:
    """Qiao 2021 Algorithm 2 with the notes' fixes (worklist, fixed vertex order, L6,
    components split); deterministic (``seed`` is unused)."""
    del seed, progress
    hipacc = Hipacc(problem, params)
    bits = problem.bits
    position = bits.index
    ready: list[tuple[str, ...]] = []
    work: deque[tuple[str, ...]] = deque([problem.kernels])
    cuts = 0
    reasons: dict[tuple[str, str], str] = {}
    forced: set[tuple[str, ...]] = set()
    while True:
        while work:
            block = work.popleft()
            if len(block) == 1 or (block not in forced and hipacc.block_reason(block) is None):
                ready.append(block)
                continue
            graph = _undirected(hipacc, list(block))
            parts = [tuple(sorted(c, key=position.__getitem__))
                     for c in nx.connected_components(graph)]
            if len(parts) > 1:
                work.extend(sorted(parts, key=lambda p: position[p[0]]))
                continue
            value, (left, right) = nx.stoer_wagner(graph)
            cuts += 1
            for part in (left, right):
                work.append(tuple(sorted(part, key=position.__getitem__)))
        cycle = bits.quotient_cycle([bits.mask(b) for b in ready])
        if cycle is None:
            break
        # a cyclic plan (possible only without the IR's single-exit rule): split the
        # largest block of the cycle further
        largest = max((bits.members(m) for m in cycle), key=len)
        ready.remove(largest)
        forced.add(largest)
        work.append(largest)
    for s, t in problem.order_dag.edges:
        if not any(s in b and t in b for b in ready):
            w = hipacc.raw_benefit(s, t)
            if not hipacc.pair_legal(s, t):
                why = hipacc.block_reason((s, t), profitability=False)
                reasons[(s, t)] = f"illegal (Qiao 2021 rules): {why}"
            elif w <= 0:
                reasons[(s, t)] = f"unprofitable: Qiao 2021 benefit {w:.1f} cycles per pixel"
            else:
                reasons[(s, t)] = (f"cut by the min-cut search (benefit {w:.1f}); the block "
                                   "around it was illegal as a whole")
    return ready, reasons, {"cuts": cuts, "epsilon": hipacc.epsilon, "optimal": False}
