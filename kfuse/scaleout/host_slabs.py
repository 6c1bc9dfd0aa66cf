"""A pipeline over arrays larger than the GPU: streamed through it slab by slab from host
memory, the copies overlapped with the computation.

The host arrays are cut into *slabs* along their first axis; each slab is copied to the
device grown by the pipeline's halo along that axis (:func:`~kfuse.scaleout.halo_depths`:
rows above and below that its outputs read through every chain of stencils), computed with
the pipeline's compiled form (one per slab shape), and only its own rows are copied back.
Boundary modes stay exact as in :mod:`kfuse.scaleout.dask_arrays`: slabs are not grown
past the array's first or last row where reads along that axis clamp, mirror or read a
constant (the pipeline applies its modes at the true edge), and grown with the rows from
the far side where every such read is periodic. Reductions that are only outputs fold per
slab, then across the slabs on the host.

On the cuda backend the slabs go round ``streams`` CUDA streams: while one slab computes,
the next is copied in and the one before copied out (the host arrays are page-locked in
place for the call, so the copies run asynchronously at the link's bandwidth, and outputs
are written to page-locked host arrays). A host array the driver will not page-lock (one
larger than the memory it lets a process lock, say) goes through *staging buffers*: each
stream has page-locked buffers of a slab's rows, which the host fills from the array (and
empties into it) while the other streams' slabs copy and compute. On the cpu backend the
same slabs run one after another (what the tests check against the one-shot run).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kfuse.errors import ChunkingError
from kfuse.ir.graph import Graph
from kfuse.runtime.numpy_backend import numpy_dtype
from kfuse.scaleout.dask_arrays import (
    PERIODIC_MODES,
    compiled_once,
    halo_depths,
    pieces_of,
    planned_once,
    readback_axes,
)

# device memory a call may hold per stream of slabs (its inputs, intermediates and
# outputs), as a fraction of what is free when the call starts
SLAB_MEMORY_SHARE = 0.6
CPU_SLAB_BYTES = 1 << 28  # the cpu backend's default slab (all its arrays together)
# slabs a call makes at least: with few, the first slab's copy in and the last one's copy
# out run alone (two slabs of a 2048-plane volume took 6x as long as eight, on an H200)
LEAST_SLABS = 8


@dataclass(frozen=True)
class Slab:
    """Rows ``start:stop`` of the outputs, computed from the input rows ``rows`` (the slab
    grown by the halo; wrapped indices where the axis is periodic); the slab's own rows are
    ``crop`` of the grown result."""

    start: int
    stop: int
    rows: np.ndarray
    crop: slice


def plan_slabs(length: int, slab_rows: int, before: int, after: int,
               periodic: bool) -> list[Slab]:
    """The slabs of an axis of ``length`` rows, ``slab_rows`` each (the last may be
    shorter), grown by at least ``before`` and ``after`` rows (wrapped where ``periodic``,
    else not past the ends). Every slab's grown rows are as many (where the array has
    them): a slab at an end, or the last and shorter one, takes more rows on its other side
    instead. So the pipeline runs at one shape, compiled once, with one set of buffers a
    stream (three shapes of a 65536-row Harris in 8192-row slabs took 30 times as long)."""
    slabs = []
    grown = slab_rows + before + after
    for start in range(0, length, slab_rows):
        stop = min(start + slab_rows, length)
        if periodic:  # (the last slab's window reaches further back)
            low = start - before - (slab_rows - (stop - start))
            high = low + grown
        else:
            size = min(length, grown)
            low = max(0, min(start - before, length - size))
            high = low + size
        rows = np.arange(low, high) % length
        slabs.append(Slab(start, stop, rows, slice(start - low, stop - low)))
    return slabs


def run_in_slabs(pipeline: Any, *, backend: str = "cuda", slab_rows: int | None = None,
                 plan: Any = "auto", streams: int = 3,
                 out: Mapping[str, np.ndarray] | None = None, staged: bool | None = None,
                 **arrays_and_params: Any) -> dict[str, np.ndarray]:
    """The pipeline's outputs (NumPy arrays in host memory) for host arrays of any size,
    computed ``slab_rows`` rows at a time (default: as many as fit in the device's free
    memory, ``streams`` slabs at once). Every input is a NumPy array of one shape;
    parameters are scalars; ``out`` may give host arrays for outputs on the grid (on the
    cuda backend page-locked ones, e.g. from ``cupyx.empty_pinned``, spare locking them
    at each call). ``staged`` (cuda): None page-locks pageable host arrays in place and
    stages only those the driver refuses; True stages every pageable one; False stages
    none (a refused array's copies then wait for the host). What cannot run in slabs
    raises :class:`ChunkingError`."""
    pieces = pieces_of(pipeline, plan, arrays_and_params,
                       lambda value: isinstance(value, np.ndarray), "NumPy arrays",
                       "slabs stream from host memory (give device arrays to Pipeline.run)",
                       readback=True)
    graph, folded, params = pieces.graph, pieces.folded, pieces.params
    if 0 in pieces.reduced:
        raise ChunkingError("a reduction that other operators read folds the first axis, "
                            "which slabs cut (a column's statistics need every row): run it "
                            "whole, or with the axes swapped")
    # inputs along some grid axes only: along the first (a value per row) cut with the
    # slabs' rows, else (a gain along the rows' other axes) whole to every slab
    whole = {name for name, axes in pieces.vector_inputs.items() if 0 not in axes}
    before, after = pieces.depths[0]
    modes = pieces.modes[0]
    periodic = bool(modes & PERIODIC_MODES)
    if (before or after) and periodic and modes - PERIODIC_MODES:
        raise ChunkingError("the first axis is read both periodically and under other "
                            f"modes ({sorted(modes)}): it cannot be cut into slabs")
    for name, value in pieces.arrays.items():
        want = numpy_dtype(graph.buffers[name].dtype)
        if value.dtype != want:
            raise ChunkingError(f"input '{name}' is {value.dtype}, the pipeline reads {want}")
    arrays = {name: np.ascontiguousarray(value) for name, value in pieces.arrays.items()}
    shape = next(value.shape for name, value in arrays.items()
                 if name not in pieces.vector_inputs)
    if backend == "auto":  # (the slabs' streams and copies are the GPU's)
        from kfuse.runtime import get_backend
        backend = get_backend(backend).name
    if staged not in (None, True, False):
        raise ChunkingError(f"staged must be None, True or False, got {staged!r}")
    for name, value in (("streams", streams), ("slab_rows", slab_rows)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ChunkingError(f"{name} must be a positive integer, got {value!r}")
    slab_rows = slab_rows or default_slab_rows(graph, shape, backend, streams)
    slabs = plan_slabs(shape[0], slab_rows, before, after, periodic)
    # planned once for the largest slab, compiled once per process
    largest = (max(len(slab.rows) for slab in slabs), *shape[1:])
    if isinstance(plan, str) and plan == "auto":
        plan = planned_once(graph, largest, {
            name: tuple(largest[a] for a in axes) for name, axes in pieces.vector_inputs.items()})
    run = compiled_once(graph, backend, plan)
    on_device = backend == "cuda"
    outputs = _outputs(graph, {name: tuple(shape[a] for a in pieces.vector_outputs.get(
        name, range(len(shape)))) for name in graph.outputs}, folded, out,
        on_device and staged is not True)
    partials: dict[str, list[Any]] = {name: [] for name in folded}
    cut = {name: value for name, value in arrays.items() if name not in whole}
    if not on_device:
        for slab in slabs:
            results = run(**{name: value[slab.rows] for name, value in cut.items()},
                          **{name: arrays[name] for name in whole}, **params)
            _keep(results, slab, outputs, partials, folded, _store_on_host)
        return outputs | _fold(partials, folded, graph)
    import cupy

    whole_on_device = {name: cupy.asarray(arrays[name]) for name in whole}  # (once a call)

    lanes = _lanes(cupy.cuda.runtime.getDevice(), streams)
    host_arrays = list(cut.values()) + list(outputs.values())
    locked = [] if staged else _page_lock(host_arrays)
    staged_arrays = set() if staged is False else {  # (the host arrays still pageable)
        name for name, value in (cut | outputs).items() if not _is_page_locked(value)}
    stages = [_Stage(lane) for lane in lanes]
    try:
        for index, slab in enumerate(slabs):
            stage = stages[index % streams]
            stage.finish()  # (this stream's slab before: its copies done, its outputs home)
            with stage.lane:
                results = run(**{name: stage.copied_in(name, value, slab,
                                                       name in staged_arrays)
                                 for name, value in cut.items()}, **whole_on_device,
                              **params)
                _keep(results, slab, outputs, partials, folded,
                      lambda name, own, host, stage=stage: stage.copy_out(
                          own, host, name in staged_arrays))
        for stage in stages:
            stage.finish()
    finally:
        for pointer in locked:
            cupy.cuda.runtime.hostUnregister(pointer)
    return outputs | _fold(partials, folded, graph)


class _Stage:
    """A stream of slabs and its page-locked staging buffers (by input or output and shape,
    made at first use, kept for the call): a pageable host array's rows are copied into a
    buffer on the host and from it to the device on the stream (and back the other way),
    so the stream's copies stay asynchronous."""

    def __init__(self, lane: Any):
        self.lane = lane
        self.buffers: dict[tuple, np.ndarray] = {}
        self.homeward: list[tuple[np.ndarray, np.ndarray]] = []  # (buffer, host rows)

    def buffer(self, key: tuple, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        import cupyx
        found = self.buffers.get(key)
        if found is None or found.shape != shape:
            found = self.buffers[key] = cupyx.empty_pinned(shape, dtype=dtype)
        return found

    def copied_in(self, name: str, value: np.ndarray, slab: Slab, pageable: bool) -> Any:
        """The slab's grown rows of ``value`` on the device (through a staging buffer
        where ``value`` is pageable)."""
        if not pageable:
            return _copied_in(value, slab, self.lane)
        import cupy
        staging = self.buffer(("in", name), (len(slab.rows), *value.shape[1:]), value.dtype)
        _copy_rows(staging, _host_rows(value, slab))
        device = cupy.empty(staging.shape, dtype=staging.dtype)
        device.set(staging, stream=self.lane)
        return device

    def copy_out(self, own: Any, host: np.ndarray, pageable: bool) -> None:
        """Copy a slab's rows ``own`` of an output to ``host`` (through a staging buffer,
        emptied at :meth:`finish`, where ``host`` is pageable)."""
        if not pageable:
            own.get(stream=self.lane, out=host)
            return
        staging = self.buffer(("out", len(self.homeward)), host.shape, host.dtype)
        own.get(stream=self.lane, out=staging)
        self.homeward.append((staging, host))

    def finish(self) -> None:
        """Wait for the stream's slab, then move its staged outputs to their host rows."""
        self.lane.synchronize()
        for staging, host in self.homeward:
            _copy_rows(host, staging)
        self.homeward.clear()


def _copy_rows(target: np.ndarray, source: np.ndarray) -> None:
    """``target[...] = source`` on several host threads (a slab is megabytes to gigabytes;
    one thread copies at a fraction of the host link's bandwidth)."""
    parts = min(_COPY_THREADS, max(1, source.nbytes >> 24), len(source))
    if parts == 1:
        np.copyto(target, source)
        return
    bounds = np.linspace(0, len(source), parts + 1).astype(int)
    list(_copy_pool().map(lambda low, high: np.copyto(target[low:high], source[low:high]),
                          bounds[:-1], bounds[1:]))


_COPY_THREADS = 8


@functools.cache
def _copy_pool() -> Any:
    from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="kfuse-staging")


@functools.cache
def _lanes(device: int, count: int) -> list[Any]:
    """``count`` non-blocking streams of ``device``, the same for every call: a compiled
    call keeps its workspace (argument blocks, CUDA graphs) per stream, so new streams at
    each call would make and capture them again."""
    import cupy
    with cupy.cuda.Device(device):
        return [cupy.cuda.Stream(non_blocking=True) for _ in range(count)]


def _is_page_locked(value: np.ndarray) -> bool:
    """Whether the CUDA runtime knows ``value``'s memory as page-locked host memory."""
    import cupy
    runtime = cupy.cuda.runtime
    try:
        return runtime.pointerGetAttributes(value.ctypes.data).type == runtime.memoryTypeHost
    except runtime.CUDARuntimeError:
        return False


def slab_reason(graph: Graph, backend: str, arrays_and_params: Mapping[str, Any],
                free_bytes: int | None = None) -> str | None:
    """Why a call should stream its host arrays through the GPU in slabs, or None: on the
    cuda backend (named, or ``auto`` where CuPy sees a GPU), every input a NumPy array (of
    the grid's shape, or a vector along some of its axes), the pipeline's arrays (inputs,
    intermediates, outputs) larger than :data:`SLAB_MEMORY_SHARE` of the device's free
    memory (``free_bytes``: as measured), and the pipeline runnable in slabs (reductions
    that other operators read not along the first axis; else the call runs whole, as it
    would)."""
    if backend not in ("cuda", "auto"):
        return None
    inputs = [arrays_and_params.get(name) for name in graph.inputs]
    if not inputs or not all(isinstance(value, np.ndarray) for value in inputs):
        return None
    rank = max(value.ndim for value in inputs)  # (the grid's; vectors have fewer axes)
    grid = [value for value in inputs if value.ndim == rank]
    if len({value.shape for value in grid}) != 1:
        return None
    needed = bytes_per_point(graph) * grid[0].size
    if free_bytes is None:
        free_bytes = device_free_bytes()
    if free_bytes is None or needed <= free_bytes * SLAB_MEMORY_SHARE:
        return None
    try:  # (the graph asked only of calls too large: a call with host arrays asks every time)
        if len(halo_depths(graph, readback=True)) != rank or 0 in readback_axes(graph):
            return None
    except ChunkingError:
        return None
    return (f"its arrays need up to {needed / 1e6:,.0f} MB on the device, where "
            f"{free_bytes / 1e6:,.0f} MB are free: streamed through it in slabs")


def bytes_per_point(graph: Graph) -> int:
    """Bytes of every array the pipeline's program holds (inputs, intermediates, outputs)
    per point of its grid (an upper bound: every array counted on the grid), worked out
    once per graph (a call with host arrays asks at every call)."""
    return graph.remembered(("bytes per point",), lambda: sum(
        np.dtype(numpy_dtype(buffer.dtype)).itemsize for buffer in graph.buffers.values()))


def device_free_bytes() -> int | None:
    """Free memory of the current GPU for CuPy's arrays: the driver's free memory and the
    blocks CuPy's memory pool holds free (arrays of an earlier call, freed into the pool, are
    not free to the driver: a slab sized by the driver's count alone came out tiny after a
    call over the whole array, and thousands of slabs took 30 times as long); None where
    there is no GPU."""
    runtime = _cuda_runtime()
    if runtime is None:
        return None
    try:
        import cupy
        return int(runtime.memGetInfo()[0]) + int(cupy.get_default_memory_pool().free_bytes())
    except Exception:  # noqa: BLE001 - no GPU usable: calls run whole, as they would
        return None


@functools.cache
def _cuda_runtime() -> Any:
    """CuPy's CUDA runtime module, or None where CuPy is not installed (looked up once: a
    call with host arrays asks at every call)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy.cuda.runtime


def default_slab_rows(graph: Graph, shape: tuple[int, ...], backend: str,
                       streams: int) -> int:
    """Rows per slab: at least :data:`LEAST_SLABS` slabs (copies overlap computation only
    from the second slab on), and ``streams`` slabs of every array the program holds
    (inputs, intermediates, outputs) within :data:`SLAB_MEMORY_SHARE` of the device's free
    memory (:data:`CPU_SLAB_BYTES` on the host)."""
    free = device_free_bytes() if backend == "cuda" else None
    budget = CPU_SLAB_BYTES if free is None else int(free * SLAB_MEMORY_SHARE) // streams
    row_bytes = bytes_per_point(graph) * int(np.prod(shape[1:], dtype=np.int64))
    return max(1, min(-(-shape[0] // LEAST_SLABS), budget // max(1, row_bytes)))


def _outputs(graph: Graph, shapes: Mapping[str, tuple[int, ...]], folded: Mapping[str, Any],
             given: Mapping[str, np.ndarray] | None, page_locked: bool
             ) -> dict[str, np.ndarray]:
    """The host arrays of the outputs on the grid (of ``shapes``: a result per row along
    the first axis only): ``given`` ones (checked), else new ones (page-locked for the
    device's copies)."""
    given = dict(given or {})
    outputs = {}
    for name in graph.outputs:
        if name in folded:
            continue
        shape = shapes[name]
        dtype = numpy_dtype(graph.buffers[name].dtype)
        array = given.pop(name, None)
        if array is None:
            array = _page_locked_or_pageable(shape, dtype) if page_locked else \
                np.empty(shape, dtype=dtype)
        elif not isinstance(array, np.ndarray) or array.shape != shape or \
                array.dtype != dtype or not array.flags.c_contiguous:
            raise ChunkingError(f"out['{name}'] must be a C-contiguous NumPy array of shape "
                                f"{shape} and dtype {dtype}", operator=name)
        outputs[name] = array
    if given:
        raise ChunkingError(f"out names {sorted(given)}, which are not outputs on the grid "
                            f"(those are {sorted(outputs)})")
    return outputs


def _page_locked_or_pageable(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new page-locked host array, or a pageable one where the driver will not lock that
    much (its slabs are then staged)."""
    import cupy
    import cupyx
    try:
        return cupyx.empty_pinned(shape, dtype=dtype)
    except cupy.cuda.runtime.CUDARuntimeError:
        return np.empty(shape, dtype=dtype)


def _store_on_host(name: str, own: np.ndarray, host: np.ndarray) -> None:
    host[...] = own


def _keep(results: Mapping[str, Any], slab: Slab, outputs: dict[str, np.ndarray],
          partials: dict[str, list[Any]], folded: Mapping[str, tuple[str, tuple[int, ...]]],
          store: Any) -> None:
    """``store`` (name, rows, host rows) a slab's own rows of each output in its rows of
    the host array; fold each
    folded reduction over them."""
    for name, values in results.items():
        own = values[slab.crop]
        if name in folded:
            op, axes = folded[name]
            partials[name].append(getattr(own, op)(axis=axes, keepdims=True))
        else:
            store(name, own, outputs[name][slab.start:slab.stop])


def _fold(partials: Mapping[str, list[Any]], folded: Mapping[str, tuple[str, tuple[int, ...]]],
          graph: Graph) -> dict[str, np.ndarray]:
    """Each folded reduction's slabs combined: folded again along the first axis where the
    reduction runs along it, else the slabs' rows one after another."""
    result = {}
    for name, pieces in partials.items():
        op, axes = folded[name]
        joined = np.concatenate([piece.get() if hasattr(piece, "get") else piece
                                 for piece in pieces], axis=0)
        if 0 in axes:
            joined = getattr(joined, op)(axis=0, keepdims=True)
        result[name] = np.squeeze(joined, axis=axes).astype(
            numpy_dtype(graph.buffers[name].dtype), copy=False)
    return result


def _host_rows(value: np.ndarray, slab: Slab) -> np.ndarray:
    """The slab's grown rows of a host array: a view, or a copy where they wrap (a periodic
    axis)."""
    first, count = int(slab.rows[0]), len(slab.rows)
    return value[first:first + count] if int(slab.rows[-1]) == first + count - 1 \
        else np.ascontiguousarray(value[slab.rows])


def _copied_in(value: np.ndarray, slab: Slab, lane: Any) -> Any:
    """The slab's grown rows of a host array in a new device array, copied on ``lane``."""
    import cupy

    host = _host_rows(value, slab)
    device = cupy.empty(host.shape, dtype=host.dtype)
    device.set(host, stream=lane)
    return device


def _page_lock(values: list[np.ndarray]) -> list[int]:
    """Page-lock the host arrays not locked already, in place, for the call (asynchronous
    copies need it); the pointers locked. An array the driver refuses stays pageable (its
    copies then wait for the host)."""
    import cupy

    runtime = cupy.cuda.runtime
    locked = []
    for value in values:
        pointer = value.ctypes.data
        if _is_page_locked(value):
            continue  # page-locked already (cupyx.empty_pinned)
        try:
            runtime.hostRegister(pointer, value.nbytes, 0)
        except runtime.CUDARuntimeError:
            continue
        locked.append(pointer)
    return locked
