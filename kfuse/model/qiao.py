"""Qiao 2021's benefit model: edge weights of producer -> consumer fusions (§3.4).

Each edge's benefit is what fusing it saves minus the redundant computation it costs:

=====================  ===========================================================
P->P, L->P             ``delta_reg(i) = IS(i) * t_g``
P->L                   ``delta_reg(i) - cost_op(v_s) * IS_vs * sz(v_d)``
L->L                   ``delta_shared(i) - cost_op(v_s) * IS_vs * g(sz(v_s), sz(v_d))``
global consumer        ``eps``
=====================  ===========================================================

with ``delta_shared = IS * (t_g - t_s)`` (note A1; ``ratio=True`` gives the printed
``IS * t_g / t_s``), ``IS_vs`` the summed sizes of the producer's inputs, and the fused
window ``g(a, b) = (sqrt(b) + 2*floor(sqrt(a)/2))**2``. The thesis counts cycles with
``t_g = 400``; kfuse prices an edge in seconds (note §9): ``t_g`` is one write and one read
of an intermediate element at the measured copy bandwidth, ``t_s = t_g / 15`` (shared
memory about 15x faster, Ch. 2) and an operation costs one arithmetic slot of the device.

A group's time is the sum of its members' unfused times minus the weights of its internal
edges and the launches it saves (``gamma``); it never drops below its own DRAM floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfuse.model.device import DeviceProfile

SCENARIOS = ("register", "recompute", "shared", "none")
SHARED_SPEEDUP = 15.0


@dataclass(frozen=True)
class QiaoParameters:
    """Costs of the benefit model, in one unit (thesis: cycles; kfuse: seconds).

    ``t_g``: one pixel of an intermediate through global memory; ``t_s``: through shared
    memory; ``c_op``: one producer operation; ``gamma``: saved launch per fused edge
    group; ``epsilon``: the weight of an illegal or useless edge (min-cut needs w > 0).
    """

    t_g: float = 400.0
    t_s: float = 400.0 / SHARED_SPEEDUP
    c_op: float = 4.0
    gamma: float = 0.0
    epsilon: float = 1e-9
    ratio: bool = False

    @classmethod
    def for_device(cls, profile: DeviceProfile, element_bytes: int = 4) -> QiaoParameters:
        """Seconds-based parameters from a device profile (note §9)."""
        from kfuse.model.roofline import _rates
        t_g = 2 * element_bytes / profile.copy_bandwidth_bytes_per_s
        arithmetic, _ = _rates(profile)
        return cls(t_g=t_g, t_s=t_g / SHARED_SPEEDUP, c_op=1.0 / arithmetic,
                   gamma=profile.launch_overhead_s, epsilon=1e-15)


def fused_window(source_size: float, destination_size: float) -> float:
    """g(sz_s, sz_d) = (sqrt(sz_d) + 2*floor(sqrt(sz_s)/2))**2 (square masks, Eq. 3.12)."""
    return (math.sqrt(destination_size) + 2 * math.floor(math.sqrt(source_size) / 2)) ** 2


def fused_window_rect(source: Sequence[int], destination: Sequence[int]) -> int:
    """g for rectangular windows: prod(w_d + 2*floor(w_s/2)) per axis."""
    axes = max(len(source), len(destination))
    source = tuple(source) + (1,) * (axes - len(source))
    destination = tuple(destination) + (1,) * (axes - len(destination))
    return math.prod(d + 2 * (s // 2) for s, d in zip(source, destination, strict=True))


def scenario(consumer_thread_load: float, producer_local: bool, consumer_global: bool = False
             ) -> str:
    """Which row of the table applies: register, recompute (P->L), shared (L->L) or none."""
    if consumer_global:
        return "none"
    if consumer_thread_load <= 1:
        return "register"
    return "shared" if producer_local else "recompute"


def raw_benefit(kind: str, intermediate_size: float, cost_op: float, producer_inputs_size: float,
                window: float, params: QiaoParameters) -> float:
    """Benefit ``w`` of one edge before ``gamma`` and ``epsilon`` (Eqs. 3.6, 3.7, 3.10, 3.13).

    ``window`` is ``sz(v_d)`` for recompute and ``g(sz(v_s), sz(v_d))`` for shared.
    """
    if kind == "none":
        return params.epsilon
    delta_reg = intermediate_size * params.t_g
    if kind == "register":
        return delta_reg
    phi = cost_op * params.c_op * producer_inputs_size * window
    if kind == "recompute":
        return delta_reg - phi
    if params.ratio:
        delta_shared = intermediate_size * params.t_g / params.t_s
    else:
        delta_shared = intermediate_size * (params.t_g - params.t_s)
    return delta_shared - phi


def edge_weight(benefit: float, params: QiaoParameters) -> float:
    """Final weight ``max(w + gamma, eps)`` (positive, as min-cut needs)."""
    return max(benefit + params.gamma, params.epsilon)


@dataclass(frozen=True)
class QiaoPrediction:
    """A group's time under the benefit model and the benefit of each internal edge."""

    time_s: float
    unfused_s: float
    edges: dict[tuple[str, str, str], float]
    launches_saved_s: float
    floor_s: float

    @property
    def breakdown(self) -> dict[str, float]:
        return {"unfused_s": self.unfused_s, "edge_benefit_s": sum(self.edges.values()),
                "launches_saved_s": self.launches_saved_s, "floor_s": self.floor_s}


def combine(unfused_s: float, edges: Mapping[tuple[str, str, str], float], members: int,
            launch_s: float, floor_s: float) -> QiaoPrediction:
    """Group time = unfused sum - edge benefits - saved launches, at least the floor."""
    saved = launch_s * (members - 1)
    time_s = max(unfused_s - sum(edges.values()) - saved, floor_s)
    return QiaoPrediction(time_s, unfused_s, dict(edges), saved, floor_s)


# ---------------------------------------------------------------------------------------------
# IR graphs
# ---------------------------------------------------------------------------------------------

def _window(kernel, buffer: str) -> tuple[int, ...]:
    windows = [a.window for a in kernel.accesses if a.buffer == buffer and a.window]
    if not windows:
        return ()
    return tuple(max(w[k] for w in windows) for k in range(len(windows[0])))


def _widest_window(kernel) -> tuple[int, ...]:
    widest: tuple[int, ...] = ()
    for buffer in kernel.reads:
        window = _window(kernel, buffer)
        if math.prod(window or (1,)) > math.prod(widest or (1,)):
            widest = window
    return widest


def graph_edge_benefit(graph, producer: str, consumer: str, buffer: str,
                       sizes: Mapping[str, int], params: QiaoParameters) -> tuple[str, float]:
    """(scenario, raw benefit) of fusing ``producer -> consumer`` along ``buffer``."""
    from kfuse.analysis.operations import SFU_WEIGHT
    from kfuse.ir.expr import count_operations

    source = graph.kernel_by_name[producer]
    target = graph.kernel_by_name[consumer]

    def numel(name: str) -> int:
        return math.prod(graph.shape_of(name, sizes))

    if target.reduction is not None or source.reduction is not None \
            or "opaque" in (source.kind, target.kind):
        return "none", params.epsilon
    load = target.thread_load(buffer)
    local = any(not a.is_point for a in source.accesses)
    kind = scenario(load, local)
    counts = count_operations(source.body) if source.body is not None else {"alu": 0, "sfu": 0}
    cost = counts["alu"] + SFU_WEIGHT * counts["sfu"]
    inputs = sum(numel(b) for b in source.reads)
    consumer_window = _window(target, buffer) or (1,)
    if kind == "shared":
        window = fused_window_rect(_widest_window(source) or (1,), consumer_window)
    else:
        window = math.prod(consumer_window)
    return kind, raw_benefit(kind, numel(buffer), cost, inputs, window, params)


def predict_group(graph, members: Sequence[str], outputs: Sequence[str],
                  sizes: Mapping[str, int], profile: DeviceProfile) -> QiaoPrediction:
    """The benefit model's time of an IR group; members' unfused times from the roofline."""
    from kfuse.ir.expr import ITEM_SIZE
    from kfuse.model.roofline import predict_group as roofline

    group = set(members)
    unfused = sum(roofline(graph, (m,), (graph.kernel_by_name[m].output,), sizes,
                           profile).time_s for m in members)
    if len(members) == 1:
        return QiaoPrediction(unfused, unfused, {}, 0.0, 0.0)
    edges: dict[tuple[str, str, str], float] = {}
    for consumer in members:
        for buffer in graph.kernel_by_name[consumer].reads:
            producer = graph.producer.get(buffer)
            if producer in group:
                params = QiaoParameters.for_device(profile, ITEM_SIZE[graph.buffers[buffer].dtype])
                _, benefit = graph_edge_benefit(graph, producer, consumer, buffer, sizes, params)
                edges[(producer, consumer, buffer)] = benefit
    fused = roofline(graph, members, outputs, sizes, profile)
    floor = fused.dram_bytes / profile.copy_bandwidth_bytes_per_s + profile.launch_overhead_s
    return combine(unfused, edges, len(members), profile.launch_overhead_s, floor)


def graph_group_time(graph, members: Sequence[str], outputs: Sequence[str],
                     sizes: Mapping[str, int], profile: DeviceProfile) -> float:
    """``qiao`` for IR graphs (the :data:`GRAPH_MODELS` signature)."""
    return predict_group(graph, members, outputs, sizes, profile).time_s


__all__ = ["QiaoParameters", "QiaoPrediction", "SCENARIOS", "combine", "edge_weight",
           "fused_window", "fused_window_rect", "graph_edge_benefit", "graph_group_time",
           "predict_group", "raw_benefit", "scenario"]
