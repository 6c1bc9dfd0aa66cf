"""The roofline model: a fused kernel's time from bytes, arithmetic and launches.

A group of operators costs the larger of (DRAM bytes / copy bandwidth), (operations /
arithmetic rate) and (cached loads / L1 rate), plus one launch. DRAM bytes count each
external input once and each written buffer once; operations count every evaluation of
every member, including producers recomputed at stencil taps. Rates come from the device
profile (``kfuse calibrate``); arithmetic and L1 rates are Hopper figures scaled by the
SM count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

from kfuse.analysis.operations import (
    evaluation_points,
    operations_per_point,
    remote_evaluations,
)
from kfuse.ir.expr import Load, loads
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile
from kfuse.schedule.forms import (
    Form,
    Single,
    Staged,
    Streamed,
    Tiled,
    default_form,
    staged_members,
)
from kfuse.schedule.streaming import STREAM_COLUMNS, stream_layout
from kfuse.schedule.tiles import is_arithmetic_heavy, register_tile

FP32_LANES_PER_SM = 128
# Fitted on the H200 (2026-11-22, docs/journal/benchmarks.md): median |predicted - measured| /
# measured 4.8% over the 33 unfused kernels and 6 fused kernels of the image apps.
CLOCK_HZ = 1.98e9
ARITHMETIC_EFFICIENCY = 0.8   # generated code: index math, selects, no perfect FMA pairing
L1_BYTES_PER_CLOCK_PER_SM = 16  # sustained cached-load bandwidth per SM (an eighth of peak)
SHARED_BYTES_PER_CLOCK_PER_SM = 128  # shared memory: 32 banks of 4 bytes per clock
# The streamed form's loop issues its index, copy and shared-memory work beside the
# arithmetic: measured on the H200 (docs/journal/benchmarks.md, session 26), smooth2d's
# 4-step kernel takes 1.38x the arithmetic time alone predicts
STREAMED_ISSUE_FACTOR = 1.38
STREAMED_RESIDENT_BLOCKS_PER_SM = 4  # its registers (about 100 a thread) allow four


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one kernel and what it is made of."""

    time_s: float
    dram_bytes: int
    operations: float
    cached_loads: float
    bound: str

    @property
    def breakdown(self) -> dict[str, float]:
        return {"dram_bytes": self.dram_bytes, "operations": self.operations,
                "cached_loads": self.cached_loads}


def predict_group(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                  sizes: Mapping[str, int], profile: DeviceProfile, form: Form | None = None
                  ) -> Prediction:
    """Roofline time of the kernel that computes ``members`` and writes ``outputs`` under
    ``form`` (None: the form a plan gives the group, :func:`~kfuse.schedule.default_form`)."""
    group = set(members)
    kernels = [graph.kernel_by_name[name] for name in members]
    points = prod(sizes[s] for s in kernels[-1].domain) if kernels[-1].domain else 1
    external = {b for k in kernels for b in k.reads if graph.producer.get(b) not in group}
    dram = sum(graph.nbytes(b, sizes) for b in (*external, *outputs))
    if form is None:
        form = default_form(graph, members) if len(members) > 1 else Single()
    if isinstance(form, Staged):
        return _predict_staged(graph, members, points, dram, profile, form)
    if isinstance(form, Streamed):
        return _predict_streamed(graph, members, outputs, sizes, profile, form)
    # the tile the generator uses (the form's own, else its kind's default; arithmetic-heavy
    # operators keep narrow ones)
    ndim = len(kernels[-1].domain)
    tile = form.register_tile(kernels, ndim) if isinstance(form, Tiled) else \
        register_tile("arithmetic" if is_arithmetic_heavy(kernels) else form.name, ndim)
    rows = prod(tile)  # points per thread
    evaluated = evaluation_points(graph, members, outputs, tile)
    remote = remote_evaluations(graph, members, evaluated)  # (evaluated where read)
    operations = 0.0
    cached: set[tuple] = set()
    remote_loads = 0.0
    for kernel in kernels:
        operations += (len(evaluated[kernel.name]) + remote[kernel.name]) * \
            operations_per_point(kernel) * points / rows
        for load in _distinct_loads(kernel.body):
            if graph.producer.get(load.buffer) in group:
                continue
            remote_loads += remote[kernel.name]
            for base in evaluated[kernel.name]:  # (a reduction's points have fewer axes
                cached.add((load.buffer, tuple(  # than its reads: the rest start at 0)
                    (base[d] if 0 <= d < len(base) else 0) + o
                    for d, o in zip(load.dims, load.offsets, strict=True))))
    cached_bytes = (len(cached) + remote_loads) * 4 * points / rows
    arithmetic_rate, l1_rate = _rates(profile)
    times = {"memory": dram / profile.copy_bandwidth_bytes_per_s,
             "arithmetic": operations / arithmetic_rate,
             "cache": cached_bytes / l1_rate}
    bound = max(times, key=times.__getitem__)
    return Prediction(times[bound] + profile.launch_overhead_s, dram, operations, cached_bytes,
                      bound)


def arithmetic_rate(profile: DeviceProfile) -> float:
    """Arithmetic operations per second the device sustains (the roofline's)."""
    return _rates(profile)[0]


def _rates(profile: DeviceProfile) -> tuple[float, float]:
    """(arithmetic operations per second, cached-load bytes per second) of the device."""
    arithmetic = profile.sm_count * FP32_LANES_PER_SM * CLOCK_HZ * ARITHMETIC_EFFICIENCY
    return arithmetic, profile.sm_count * L1_BYTES_PER_CLOCK_PER_SM * CLOCK_HZ


def _predict_staged(graph: Graph, members: Sequence[str], points: int, dram: int,
                    profile: DeviceProfile, form: Staged) -> Prediction:
    """Staged variant: each member once per point of its tile and halo, taps from shared memory.

    Staged intermediates are read by their consumers' taps from shared memory, a thread's
    consecutive rows sharing the rows of the window.
    """
    staged_rows = form.shape[0]
    tile = form.outputs_per_block
    halos = staged_members(graph, tuple(members))
    widest = max(halos.values(), key=lambda h: (tile[0] + 2 * h[0]) * (tile[1] + 2 * h[1]))
    overhead = (tile[0] + 2 * widest[0]) * (tile[1] + 2 * widest[1]) / (tile[0] * tile[1])
    group = set(members)
    operations = 0.0
    cached = 0.0
    shared = 0.0
    for name in members:
        kernel = graph.kernel_by_name[name]
        factor = overhead if name in halos else 1.0
        operations += operations_per_point(kernel) * points * factor
        for access in kernel.accesses:
            if graph.producer.get(access.buffer) in group and not access.is_point:
                rows = {o[0] for o in access.offsets}
                columns = {o[1] for o in access.offsets}
                taps = (staged_rows + len(rows) - 1) * len(columns) / staged_rows
                shared += taps * 4 * points
            elif graph.producer.get(access.buffer) not in group:
                cached += len(access.offsets) * 4 * points * factor
    arithmetic_rate, cache_rate = _rates(profile)
    shared_rate = profile.sm_count * SHARED_BYTES_PER_CLOCK_PER_SM * CLOCK_HZ
    times = {"memory": dram / profile.copy_bandwidth_bytes_per_s,
             "arithmetic": operations / arithmetic_rate,
             "cache": cached / cache_rate + shared / shared_rate}
    bound = max(times, key=times.__getitem__)
    return Prediction(times[bound] + profile.launch_overhead_s, dram, operations,
                      cached + shared, bound)


def _predict_streamed(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                      sizes: Mapping[str, int], profile: DeviceProfile, form: Streamed
                      ) -> Prediction:
    """Streamed form: each member once per point of the block's strip (its outputs and the
    lateral halo) and per row of the chunk's walk (its rows and the lags); each input read
    once and again for the rows above and below a chunk; a row of each level read beside
    from shared memory. Chunks: as many blocks along the rows as fill one wave."""
    layout = stream_layout(graph, members)
    kernels = [graph.kernel_by_name[name] for name in members]
    rows, columns = (sizes[s] for s in kernels[-1].domain)
    points = rows * columns
    span = form.threads * STREAM_COLUMNS
    strip = span - 2 * layout.halo_columns
    across = -(-columns // strip)
    resident = STREAMED_RESIDENT_BLOCKS_PER_SM * profile.sm_count
    chunks = max(1, min(-(-rows // form.least_rows), resident // across))
    chunk = rows / chunks
    walk = (chunk + max(lv.lag + lv.below for lv in layout.levels) -
            min(lv.lag - lv.above for lv in layout.levels)) / chunk
    dram = sum(graph.nbytes(level.buffer, sizes) * (chunk + level.above + level.below) / chunk
               for level in layout.inputs)
    dram += sum(graph.nbytes(name, sizes) for name in outputs)
    operations = sum(operations_per_point(k) for k in kernels) * points * span / strip * walk
    lateral = sum(1 for level in layout.levels if level.lateral)
    shared = lateral * points * walk * 4 * (2 + (STREAM_COLUMNS + 2) / STREAM_COLUMNS)
    arithmetic_rate, _ = _rates(profile)
    shared_rate = profile.sm_count * SHARED_BYTES_PER_CLOCK_PER_SM * CLOCK_HZ
    times = {"memory": dram / profile.copy_bandwidth_bytes_per_s,
             "arithmetic": operations * STREAMED_ISSUE_FACTOR / arithmetic_rate,
             "cache": shared / shared_rate}
    bound = max(times, key=times.__getitem__)
    return Prediction(times[bound] + profile.launch_overhead_s, int(dram), operations, shared,
                      bound)


def _distinct_loads(body) -> list[Load]:
    if body is None:
        return []
    unique = {ld.read_key: ld for ld in loads(body)}
    return list(unique.values())


def nominal_sizes(graph: Graph) -> dict[str, int]:
    """Sizes to plan with when none are given: 4096 per axis up to 2-D, 256 per axis in 3-D
    (fixed sizes, ``shape=(9, n)``, as they are)."""
    sizes = dict(graph.fixed_sizes)
    for name in graph.inputs:
        buffer = graph.buffers[name]
        for symbol in buffer.shape:
            sizes.setdefault(symbol, 256 if buffer.ndim == 3 else 4096)
    return sizes
