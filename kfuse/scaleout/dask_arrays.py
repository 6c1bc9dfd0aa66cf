"""A kfuse pipeline over chunked :mod:`dask.array` inputs: lazy, chunk by chunk, exact.

Dask schedules the chunks (threads, processes, one worker per GPU with ``dask.distributed``);
kfuse computes each chunk with the pipeline's compiled form, which is reused for every
chunk of the same shape. Each chunk is computed on the chunk grown by the pipeline's
*halo*: per axis, how far an output point's value reaches into the inputs through every
chain of stencils (:func:`halo_depths`, computed from the graph, never asked of the user).
The grown part is cropped from the result, so only points whose whole dependence lies
inside the grown chunk are kept.

Boundary modes stay exact at the array's outer edges: along an axis whose reads are all
clamped, mirrored or constant, a chunk at the edge is not grown past it, so the pipeline's
own modes apply at the array's true edge (Dask's ``boundary="none"``); along an axis read
only periodically (``repeat``), chunks at the edge are grown with the values from the far
side (Dask's ``boundary="periodic"``). An axis read under both kinds of mode is kept in one
chunk (the modes then apply where they would unchunked).

What runs chunked: pipelines whose operators all compute on the inputs' grid and read at
constant offsets (point and stencil operators), and reductions (over every axis or along
some) that are only outputs: each chunk folds its own points (not the halo's) and Dask's
reduction tree folds the chunks' values. Reductions that other operators read along some
axes (a normalisation's statistics, :func:`readback_axes`) too: the chunks keep those axes
whole, vectors along them go whole to every chunk, and maps of their results over the other
axes come back cut as the grid. Others raise :class:`ChunkingError` naming the operator.
"""

from __future__ import annotations

import hashlib
import pickle
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kfuse.dsl.pipeline import is_dask_array
from kfuse.errors import ChunkingError
from kfuse.ir.graph import Graph
from kfuse.runtime.numpy_backend import numpy_dtype

PERIODIC_MODES = frozenset({"repeat"})


def terminal_reductions(graph: Graph) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The pipeline's reductions that no operator reads (outputs only), by name, with their
    operation and axes: each chunk folds its own points along those axes, and Dask's
    reduction tree folds the chunks' results."""
    read = {access.buffer for kernel in graph.kernels for access in kernel.accesses}
    return {kernel.name: (kernel.reduction.op, kernel.reduction.axes)
            for kernel in graph.kernels
            if kernel.reduction is not None and kernel.output not in read}


def chunk_graph(graph: Graph) -> Graph:
    """``graph`` with each of its :func:`terminal_reductions` made the operator that
    computes the values it folds (written on the grid; each chunk folds its own)."""
    folded = terminal_reductions(graph)
    if not folded:
        return graph
    kernels = tuple(replace(kernel, reduction=None, kind="point" if all(
        access.is_point for access in kernel.accesses) else "local")
        if kernel.name in folded else kernel for kernel in graph.kernels)
    buffers = {name: replace(buffer, shape=graph.kernel_by_name[name].domain)
               if name in folded else buffer for name, buffer in graph.buffers.items()}
    return Graph(graph.name, buffers, kernels, graph.inputs, graph.outputs,
                 dict(graph.params)).validate()


def readback_axes(graph: Graph) -> tuple[int, ...]:
    """The grid axes that the reductions other operators read fold (a normalisation's rows:
    ``(1,)``; ``()`` where none): the chunks keep those axes whole, so each chunk computes
    such a reduction completely and the operators that read it back at their point run in
    the same chunk. A :class:`ChunkingError` names a reduction that folds other axes than
    the rest, or every axis (read back over the whole array: no chunking)."""
    terminal = terminal_reductions(graph)
    found = {kernel.name: kernel.reduction.axes for kernel in graph.kernels
             if kernel.reduction is not None and kernel.name not in terminal}
    axes = sorted(set(found.values()))
    if not axes:
        return ()
    name = next(n for n, a in found.items() if a == axes[-1])
    kernel = graph.kernel_by_name[name]
    if len(axes) > 1:
        raise ChunkingError(f"the reductions other operators read fold different axes "
                            f"({axes}): chunks keep whole the axes of one kind only",
                            operator=kernel.name, where=kernel.where)
    if len(axes[0]) == len(kernel.domain):
        raise ChunkingError("a reduction over every axis that other operators read needs the "
                            "whole array in one chunk: run it unchunked (or as a reduction "
                            "that is only an output)", operator=kernel.name, where=kernel.where)
    return axes[0]


def _check_chunkable(graph: Graph, readback: bool = True) -> tuple[str, ...]:
    """The pipeline's domain (size symbols); a :class:`ChunkingError` names an operator
    that does not compute on the inputs' grid at constant offsets. With reductions other
    operators read (``readback``; :func:`readback_axes`), operators may also compute over
    the grid's other axes (a map of a row's results) and read such results at their point,
    and inputs may be vectors along the folded axes (a gain per column, given whole to
    every chunk)."""
    if not graph.kernels:
        raise ChunkingError("the pipeline has no operators")
    domain = max((kernel.domain for kernel in graph.kernels), key=len)  # (maps of reduced
    # results have fewer axes)
    folded = terminal_reductions(graph)
    opaque = next((k for k in graph.kernels if k.kind == "opaque"), None)
    if opaque is not None:
        raise ChunkingError("a user kernel does not run chunk by chunk on Dask arrays yet "
                            "(point and stencil operators do, and reductions)",
                            operator=opaque.name, where=opaque.where)
    reduced = readback_axes(graph)
    if reduced and not readback:
        kernel = next(k for k in graph.kernels if k.reduction is not None
                      and k.name not in folded)
        raise ChunkingError("a reduction that other operators read does not run in slabs yet "
                            "(point and stencil operators do, and reductions that are only "
                            "outputs)", operator=kernel.name, where=kernel.where)
    for kernel in graph.kernels:
        axes = _grid_axes_of(kernel.domain, domain, reduced)
        if axes is None or (kernel.name in folded and axes != tuple(range(len(domain)))):
            raise ChunkingError(f"it computes over {kernel.domain}, another grid than the "
                                f"pipeline's {domain}: only pipelines on one grid (and "
                                "maps of the results of reductions along its rows or "
                                "columns) run chunked", operator=kernel.name,
                                where=kernel.where)
        for access in kernel.accesses:
            if _gathered_along_whole_axes(access, axes, domain, reduced, graph):
                continue
            at = tuple(axes[d] for d in access.dims)
            whole = at == tuple(range(len(domain)))
            kept = bool(reduced) and at == _kept(domain, reduced) and access.is_point
            along = bool(reduced) and set(at) <= set(reduced) and access.is_point \
                and access.buffer in graph.inputs
            shape = graph.buffers[access.buffer].shape
            if access.remapped or shape != tuple(domain[a] for a in at) or \
                    not (whole or kept or along):
                raise ChunkingError(f"it reads '{access.buffer}' at another resolution, at "
                                    "computed indices or along other axes: only reads at "
                                    "constant offsets on the pipeline's grid run chunked "
                                    "(and, at the point, the results of reductions along "
                                    "whole axes and input vectors along those axes)",
                                    operator=kernel.name, where=kernel.where)
    return domain


def _gathered_along_whole_axes(access: Any, axes: tuple[int, ...], domain: tuple[str, ...],
                               reduced: tuple[int, ...], graph: Graph) -> bool:
    """Whether ``access`` reads an array of the grid at computed indices along axes that
    read-back reductions fold (whole in every chunk: a row's logit at its label) and at the
    point along the others, so that every chunk holds what it reads."""
    if not access.gathered or not reduced or access.scales is not None:
        return False
    if graph.buffers[access.buffer].shape != domain or not set(access.gathered) <= set(reduced):
        return False
    for k, dim in enumerate(access.dims):
        if k in access.gathered:
            continue
        if dim < 0 or axes[dim] != k or any(offset[k] for offset in access.offsets):
            return False
    return True


def _kept(domain: tuple[str, ...], reduced: tuple[int, ...]) -> tuple[int, ...]:
    """The grid axes a chunk cuts: those no read-back reduction folds."""
    return tuple(axis for axis in range(len(domain)) if axis not in reduced)


def _grid_axes_of(kernel_domain: tuple[str, ...], domain: tuple[str, ...],
                  reduced: tuple[int, ...]) -> tuple[int, ...] | None:
    """The grid axes of a kernel's axes: the grid's own, or (a map of reduced results)
    those the read-back reductions keep; None for another grid."""
    if kernel_domain == domain:
        return tuple(range(len(domain)))
    kept = _kept(domain, reduced)
    if reduced and kernel_domain == tuple(domain[a] for a in kept):
        return kept
    return None


def halo_depths(graph: Graph, readback: bool = True) -> list[tuple[int, int]]:
    """Per axis, how many points before and after an output point the pipeline reads its
    inputs at (the sum of the stencils' offsets along the deepest chain; none along the
    axes read-back reductions fold, which chunks keep whole)."""
    domain = _check_chunkable(graph, readback)
    ndim = len(domain)
    reduced = readback_axes(graph)
    need: dict[str, list[tuple[int, int]]] = {name: [(0, 0)] * ndim for name in graph.outputs}
    for kernel in reversed(graph.kernels):
        reach = need.get(kernel.output)
        if reach is None:
            continue
        axes = _grid_axes_of(kernel.domain, domain, reduced) or ()
        for access in kernel.accesses:
            at = [axes[d] for d in access.dims]  # (the buffer's axes on the grid)
            found = need.setdefault(access.buffer, [(0, 0)] * ndim)
            lowest, highest = [0] * ndim, [0] * ndim
            for k, axis in enumerate(at):
                lowest[axis] = min(offset[k] for offset in access.offsets)
                highest[axis] = max(offset[k] for offset in access.offsets)
            need[access.buffer] = [
                (max(found[axis][0], reach[axis][0] + max(0, -lowest[axis])),
                 max(found[axis][1], reach[axis][1] + max(0, highest[axis])))
                for axis in range(ndim)]
    depths = [(0, 0)] * ndim
    for name in graph.inputs:
        for axis, (before, after) in enumerate(need.get(name, [(0, 0)] * ndim)):
            if axis not in reduced:
                depths[axis] = (max(depths[axis][0], before), max(depths[axis][1], after))
    return depths


def axis_modes(graph: Graph, ndim: int) -> list[set[str]]:
    """Per axis, the boundary modes of the reads that step off the point along it."""
    modes: list[set[str]] = [set() for _ in range(ndim)]
    for kernel in graph.kernels:
        for access in kernel.accesses:
            if access.is_point:  # (reads of reductions' results and vectors: at the point)
                continue
            for offset, boundary in zip(access.offsets, access.boundaries, strict=True):
                for axis in range(ndim):
                    if offset[axis]:
                        modes[axis].add(boundary.mode if boundary is not None else "clamp")
    return modes


@dataclass(frozen=True)
class Pieces:
    """A pipeline checked to run piece by piece (chunks, slabs): its graph with the
    reductions that are only outputs folded per piece (:func:`chunk_graph`), the halo and
    the boundary modes per axis, those reductions, the input arrays and the parameters."""

    graph: Graph
    depths: list[tuple[int, int]]
    modes: list[set[str]]
    folded: dict[str, tuple[str, tuple[int, ...]]]
    arrays: dict[str, Any]
    params: dict[str, Any]
    # the axes read-back reductions fold (kept whole by every piece: readback_axes), the
    # inputs along some grid axes only (a gain along the folded axes, a value per row) by
    # those axes, and the outputs over the kept axes only (maps of reduced results) by theirs
    reduced: tuple[int, ...] = ()
    vector_inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    vector_outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)


def pieces_of(pipeline: Any, plan: Any, arrays_and_params: Mapping[str, Any],
              accepts: Callable[[Any], bool], kind: str, hint: str,
              readback: bool = False) -> Pieces:
    """The pipeline and its arguments checked to run in pieces: every input given, each
    one of ``kind`` (``accepts`` says; ``hint`` follows the refusal), all of one shape with
    the pipeline's axes (but vectors along the axes read-back reductions fold, where
    ``readback`` lets pieces keep those axes whole); a plan made for the whole pipeline
    refused where pieces fold reductions themselves. A :class:`ChunkingError` names what
    does not hold."""
    graph = pipeline.graph()
    depths = halo_depths(graph, readback)  # (the graph checked to run in pieces)
    folded = terminal_reductions(graph)
    if folded and not isinstance(plan, str):
        raise ChunkingError(f"a plan made for the whole pipeline does not apply to its pieces, "
                            f"which fold the reductions {sorted(folded)} themselves: give "
                            "plan='auto' or 'unfused'")
    pieces_graph = chunk_graph(graph)
    arrays = {name: value for name, value in arrays_and_params.items()
              if name in pieces_graph.inputs}
    params = {name: value for name, value in arrays_and_params.items() if name not in arrays}
    missing = [name for name in pieces_graph.inputs if name not in arrays]
    if missing:
        raise ChunkingError(f"missing inputs {missing} (the pipeline reads "
                            f"{list(pieces_graph.inputs)})")
    refused = [name for name, value in arrays.items() if not accepts(value)]
    if refused:
        raise ChunkingError(f"inputs {refused} are not {kind}: {hint}")
    # every input's shape as the pipeline declares it (a ShapeError names the input)
    pieces_graph.bind_shapes({name: tuple(value.shape) for name, value in arrays.items()})
    reduced = readback_axes(graph) if readback else ()
    domain = _check_chunkable(graph, readback)
    vector_inputs = {name: axes for name in pieces_graph.inputs
                     if (axes := _input_axes(graph, name, domain, reduced))
                     != tuple(range(len(depths)))}
    shapes = {tuple(value.shape) for name, value in arrays.items() if name not in vector_inputs}
    if len(shapes) > 1:
        raise ChunkingError(f"the inputs' shapes differ ({sorted(shapes)}): a pipeline in "
                            "pieces takes inputs of one shape")
    ndim = len(shapes.pop()) if shapes else 0
    if ndim != len(depths):
        raise ChunkingError(f"the inputs have {ndim} axes, the pipeline's operators "
                            f"{len(depths)}")
    # (by the output's own axes: a reduction read back and stored, a row's statistics, lies
    # along the axes it keeps, though its operator iterates over the grid)
    vector_outputs = {name: axes for name in pieces_graph.outputs
                      if (axes := _grid_axes_of(graph.buffers[name].shape, domain, reduced))
                      != tuple(range(ndim)) and name not in folded}
    return Pieces(pieces_graph, depths, axis_modes(graph, len(depths)), folded, arrays, params,
                  reduced, vector_inputs, vector_outputs)


def _input_axes(graph: Graph, name: str, domain: tuple[str, ...],
                reduced: tuple[int, ...]) -> tuple[int, ...]:
    """The grid axes an input lies along (all, but for a vector along some: a gain along
    the folded axes, a value per row)."""
    for kernel in graph.kernels:
        for access in kernel.accesses:
            if access.buffer == name:
                axes = _grid_axes_of(kernel.domain, domain, reduced) or ()
                return tuple(axes[d] for d in access.dims)
    return ()


def run_on_dask_arrays(pipeline: Any, backend: str, plan: Any,
                       arrays_and_params: Mapping[str, Any], *, repeat: int = 1,
                       feedback: Mapping[str, str] | None = None,
                       patch_edges: bool | None = None) -> dict[str, Any]:
    """The pipeline's outputs, by name, as lazy :class:`dask.array.Array` computed chunk by
    chunk on ``backend`` (:meth:`kfuse.Pipeline.run` calls this where an input is a Dask
    array). Every input array must be a Dask array of the same shape; parameters are
    scalars. The chunks of the first input are kept (an axis read under both periodic and
    other modes is made one chunk; chunks smaller than the halo are merged by Dask).

    Where a ``dask.distributed`` client holds every chunk of the inputs (persisted: one
    worker per GPU, say), each chunk's task is submitted at once to the worker holding the
    chunk, and the outputs are Dask arrays of those tasks' futures (:func:`_submitted`).

    ``repeat`` calls of the pipeline in each chunk's task, each call's outputs named in
    ``feedback`` (output -> input) the next call's inputs (:func:`iterate`): the chunk is
    grown by ``repeat`` times the halo, once. ``patch_edges``: whether such a task computes
    a chunk grown along one axis as it lies and patches its edge rows from strips
    (:meth:`ChunkTask.patched`) instead of joining it with its halos; None: on the cuda
    backend, where joining copies the chunk through device memory (the cpu backend's
    extra launches cost more than its copies)."""
    import dask.array as da
    from dask.array.overlap import ensure_minimum_chunksize
    from dask.array.utils import meta_from_array

    pieces = pieces_of(pipeline, plan, arrays_and_params, is_dask_array, "Dask arrays",
                       "give every input as a dask.array (da.from_array) or none",
                       readback=True)
    graph, depths, modes, folded = pieces.graph, pieces.depths, pieces.modes, pieces.folded
    arrays, params = pieces.arrays, pieces.params
    first = arrays[next(name for name in graph.inputs if name not in pieces.vector_inputs)]
    ndim = first.ndim
    chunks = list(first.chunks)
    depth: dict[int, int] = {}
    boundary: dict[int, str] = {}
    for axis in range(ndim):
        grown = max(depths[axis]) * repeat
        periodic = modes[axis] & PERIODIC_MODES
        if (grown and periodic and modes[axis] - PERIODIC_MODES) or axis in pieces.reduced:
            # periodic and other modes, or folded by a reduction read back: one chunk
            chunks[axis] = (first.shape[axis],)
            grown = 0
        depth[axis] = grown
        boundary[axis] = "periodic" if periodic else "none"
        if grown:
            chunks[axis] = ensure_minimum_chunksize(grown, tuple(chunks[axis]))
    chunks_tuple = tuple(tuple(c) for c in chunks)
    if isinstance(plan, str) and plan == "auto":  # one plan, made for the largest grown
        # chunk, for every chunk: one program per chunk shape (sizes compiled in), else one
        largest = tuple(max(c) + 2 * depth[axis] for axis, c in enumerate(chunks_tuple))
        plan = planned_once(graph, largest, {name: tuple(largest[a] for a in axes)
                                             for name, axes in pieces.vector_inputs.items()})
    compute = ChunkTask(graph, backend, plan, params, depth,
                         {axis: kind == "periodic" for axis, kind in boundary.items()},
                         [len(c) for c in chunks_tuple], folded, repeat, feedback or {},
                         (backend == "cuda" if patch_edges is None else patch_edges)
                         and not pieces.reduced, pieces.vector_inputs, pieces.vector_outputs)
    vectors = pieces.vector_inputs
    if pieces.reduced:  # (rows whole in every chunk: each computes on its own rows)
        if all(arrays[name].npartitions == 1 or (
                tuple(arrays[name].chunks) == tuple(chunks_tuple[a] for a in axes)
                and not any(depth[a] for a in axes)) for name, axes in vectors.items()):
            # vectors whole (a gain along the folded axes) or cut as the chunks are (a value
            # per row, no halo along it): chunks held on a cluster run where they lie, each
            # task given the vector whole or its own part
            inputs = [arrays[name] if name in vectors else arrays[name].rechunk(chunks_tuple)
                      for name in graph.inputs]
            held = _held_chunks(inputs)
            if held is not None:
                return _submitted(compute, inputs, held, chunks_tuple,
                                  meta_of=lambda dtype, rank=ndim: meta_from_array(
                                      first, rank, dtype))
        grown_inputs = [da.overlap.overlap(
            _on_grid(arrays[name], vectors[name], chunks_tuple) if name in vectors
            else arrays[name].rechunk(chunks_tuple), depth=depth, boundary=boundary)
            for name in graph.inputs]
    else:
        inputs = [arrays[name].rechunk(chunks_tuple) for name in graph.inputs]
        held = _held_chunks(inputs)
        if held is not None:  # on a cluster that holds every chunk: each runs where it lies
            return _submitted(compute, inputs, held, chunks_tuple,
                              meta_of=lambda dtype, rank=ndim: meta_from_array(first, rank,
                                                                                dtype))
        grown_inputs = [da.overlap.overlap(array, depth=depth, boundary=boundary)
                        for array in inputs]
    # one task per chunk computes every output (a tuple); each output takes its item
    # (a stable key prefix: Dask learns the tasks' durations across calls, and its
    # dashboard names the pipeline)
    together = da.map_blocks(compute, *grown_inputs, chunks=chunks_tuple, dtype=object,
                             meta=np.empty((0,) * ndim, dtype=object),
                             token=f"kfuse-{graph.name}")
    result = {}
    for index, name in enumerate(graph.outputs):
        dtype = numpy_dtype(graph.buffers[name].dtype)
        meta = meta_from_array(first, ndim, dtype)
        if name in folded:  # one value per chunk along the axes, folded by Dask's tree
            op, axes = folded[name]
            partial = da.map_blocks(_item, together, index, dtype=dtype, meta=meta,
                                    chunks=tuple((1,) * len(c) if axis in axes else c
                                                 for axis, c in enumerate(chunks_tuple)))
            result[name] = _folded_by_dask(partial, op, axes, dtype)
            continue
        if name in pieces.vector_outputs:  # (over the axes the chunks cut: a row's result, taken
            # with one point along the others, which are then dropped)
            kept = pieces.vector_outputs[name]
            dropped = tuple(a for a in range(ndim) if a not in kept)
            on_grid = da.map_blocks(_item_on_grid, together, index, dropped, dtype=dtype,
                                    meta=meta, chunks=tuple(
                                        chunks_tuple[a] if a in kept else (1,)
                                        for a in range(ndim)))
            result[name] = on_grid.squeeze(axis=dropped)
            continue
        result[name] = da.map_blocks(_item, together, index, chunks=chunks_tuple, dtype=dtype,
                                     meta=meta)
    return result


def _on_grid(array: Any, axes: tuple[int, ...], chunks: tuple[tuple[int, ...], ...]) -> Any:
    """An input along some grid ``axes`` (a gain along the folded axes, a value per row)
    shaped for the grid, one point along the other axes, chunked as the grid along its
    own: Dask gives every chunk's task its part (the whole of it along the folded axes,
    which are one chunk), and the task takes the other axes away again."""
    if list(axes) != sorted(axes):
        raise ChunkingError("an input vector along the grid's axes in another order than the "
                            "grid's does not run chunked")
    shape = [1] * len(chunks)
    for k, axis in enumerate(axes):
        shape[axis] = array.shape[k]
    return array.reshape(tuple(shape)).rechunk(
        tuple(chunks[a] if a in axes else (1,) for a in range(len(chunks))))


def _item(outputs: tuple[Any, ...], index: int) -> Any:
    return outputs[index]


def _item_on_grid(outputs: tuple[Any, ...], index: int, dropped: tuple[int, ...]) -> Any:
    """An output over some grid axes, with one point along the ``dropped`` others."""
    value = outputs[index]
    shape = list(value.shape)
    for axis in dropped:
        shape.insert(axis, 1)
    return value.reshape(shape)


def _folded_by_dask(partial: Any, op: str, axes: tuple[int, ...], dtype: Any) -> Any:
    """The chunks' folds of a reduction (one value per chunk along ``axes``) folded by
    Dask's reduction tree."""
    fold = getattr(partial, op)
    return fold(axis=axes, dtype=dtype) if op == "sum" else fold(axis=axes)


def _sliced(block: Any, cut: tuple[slice, ...], device_links: bool = False) -> Any:
    """A neighbour's halo slice, cut on the neighbour's worker (for another GPU of the host,
    in an allocation sent device to device: :class:`~kfuse.scaleout.device_halos.DeviceHalo`;
    a chunk in host memory, NumPy's, travels as Dask moves it)."""
    if device_links and hasattr(block, "__cuda_array_interface__"):
        from kfuse.scaleout.device_halos import DeviceHalo
        return DeviceHalo(block[cut])
    return block[cut]


def joined_pieces(pieces: Any, axis: int) -> Any:
    """The array ``pieces`` (nested lists, one level per axis) make, joined axis by axis
    (NumPy's concatenate; CuPy chunks dispatch it to CuPy's); a piece is an array, or an
    (array, cut) pair whose cut is made here."""
    from kfuse.scaleout.device_halos import plain

    if isinstance(pieces, tuple):
        values, cut = pieces
        values = plain(values)
        return values if cut is None else values[cut]
    if not isinstance(pieces, list):
        return plain(pieces)
    parts = [joined_pieces(piece, axis + 1) for piece in pieces]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def _held_chunks(inputs: list[Any]) -> tuple[Any, list[dict[tuple[int, ...], Any]],
                                             list[dict[tuple[int, ...], str]]] | None:
    """(the ``dask.distributed`` client, per input its chunks' futures by location, per
    input the worker holding each chunk) where every chunk of every input is held by one
    running client (persisted: the client the chunks' futures belong to, not Dask's default
    one; the call waits for chunks still computing that kfuse did not place); else None (the
    chunks then run lazily, where Dask's scheduler places them)."""
    try:
        from distributed import futures_of
    except ImportError:  # no distributed: nothing is held
        return None
    futures = []
    for array in inputs:
        found = {tuple(future.key[1:]): future for future in futures_of(array)
                 if isinstance(future.key, tuple) and future.key[0] == array.name}
        if len(found) != array.npartitions:
            return None
        futures.append(found)
    clients = {id(future.client): future.client for found in futures
               for future in found.values()}
    if len(clients) != 1:
        return None  # (chunks of several clients: run lazily)
    (client,) = clients.values()
    if client.status != "running":
        return None
    # where kfuse placed a chunk (a call's outputs, perhaps still computing; an input
    # persisted in bands), else where the scheduler says it lies (one request), once it
    # lies somewhere (an input persisted just before the call may still be computing)
    unplaced = [future for found in futures for future in found.values()
                if future.key not in _PLACED]
    if any(future.status == "pending" for future in unplaced):
        from distributed import wait
        with client.as_current():  # (wait asks the current client)
            wait(unplaced)
    holders = client.who_has(unplaced) if unplaced else {}
    owners = []
    for found in futures:
        owner = {}
        for location, future in found.items():
            workers = holders.get(future.key) or holders.get(str(future.key))
            placed = _PLACED.get(future.key)
            if not workers and placed is None:
                return None
            owner[location] = placed if placed is not None else sorted(workers)[0]
        owners.append(owner)
    return client, futures, owners


# the worker kfuse restricted each chunk's task to, by key (the last _PLACED_KEPT): a call's
# outputs fed to the next call (iterate) are placed before they are computed
_PLACED: dict[Any, str] = {}
_PLACED_KEPT = 1 << 14


def _place(placed: Mapping[Any, str]) -> None:
    _PLACED.update(placed)
    while len(_PLACED) > _PLACED_KEPT:  # (the oldest go first)
        _PLACED.pop(next(iter(_PLACED)))


def _submitted(compute: ChunkTask, inputs: list[Any], held: Any,
               chunks: tuple[tuple[int, ...], ...], meta_of: Any) -> dict[str, Any]:
    """The outputs as Dask arrays of futures: each chunk's task submitted to the worker
    holding the chunk, restricted to it (the chunk is there; were the worker lost, so would
    the chunk be). Its arguments are the chunk and its neighbours' halos: a neighbour on the
    same worker whole (cut in the task: no task of its own), one elsewhere as a halo slice
    cut on the neighbour's worker (device to device between the GPUs of one host,
    :mod:`kfuse.scaleout.device_halos`). A pipeline of one output makes no task beyond the
    chunks' own. Left to its scheduler, Dask moved whole chunks between workers to balance
    its queues (docs/journal/benchmarks.md, session 33)."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    from kfuse.scaleout.device_halos import links_of

    client, futures, holders = held
    graph = compute.graph
    # inputs along some grid axes only (a gain along the folded axes, whole; a value per row,
    # cut as the rows are), by index: their grid axes
    vectors = {index: compute.vector_inputs[name] for index, name in enumerate(graph.inputs)
               if name in compute.vector_inputs}
    on_grid = [held_by for index, held_by in enumerate(holders) if index not in vectors]
    # each chunk's task where most of its inputs' chunks lie (the first input's on a tie)
    owners = {location: max(on_grid, key=lambda owner, location=location: sum(
        held_by[location] == owner[location] for held_by in on_grid))[location]
        for location in on_grid[0]}
    device_links = compute.backend == "cuda" and links_of(
        client, {worker for held_by in holders for worker in held_by.values()})
    run_chunk = _scattered(client, compute)  # (sent once, not pickled with every task)
    # (a key of its own per call: its halo slices are new tasks at every call)
    token = tokenize(compute.digest, [array.name for array in inputs], uuid.uuid4().hex)
    grid = tuple(len(c) for c in chunks)
    halos: dict[tuple, tuple[str, tuple[Any, ...]]] = {}  # (worker, arguments) by cut
    sliced: dict[tuple, Any] = {}  # their futures, once submitted

    def piece(input_index: int, at: tuple[int, ...], cut: tuple[slice, ...],
              reader: str) -> tuple[Any, tuple[slice, ...] | None]:
        """(a future, the cut the reading task makes of it or None)."""
        source, holder = futures[input_index][at], holders[input_index][at]
        if holder == reader or all(c == slice(None) for c in cut):
            return source, cut
        # cut where the neighbour lies: only the halo moves
        key = (input_index, at, tuple((c.start, c.stop) for c in cut))
        halos.setdefault(key, (holder, (source, cut, device_links)))
        return sliced.get(key), None

    def vector_piece(index: int, location: tuple[int, ...]) -> tuple[Any, None]:
        """A vector input's part for the chunk at ``location``: the whole of it (one
        chunk) or its chunk along its axes (cut as the grid's)."""
        found = futures[index]
        if len(found) == 1:
            return next(iter(found.values())), None
        return found[tuple(location[a] for a in vectors[index])], None

    def grown_of(location: tuple[int, ...]) -> list[Any]:
        reader = owners[location]
        return [vector_piece(i, location) if i in vectors else
                grown_pieces(lambda at, cut, i=i: piece(i, at, cut, reader), grid, location,
                             compute.depth, compute.periodic) for i in range(len(inputs))]

    for location in np.ndindex(grid):  # the halo slices every chunk reads, submitted first
        grown_of(location)
    halo_names = {key: f"kfuse-halo-{token}-{index}" for index, key in enumerate(halos)}
    submitted = _mapped(client, _sliced, {halo_names[key]: call for key, call in halos.items()})
    sliced.update({key: submitted[name] for key, name in halo_names.items()})
    single = len(graph.outputs) == 1 and not compute.folded and not compute.vector_outputs
    prefix = f"kfuse-{graph.name}-{graph.outputs[0]}" if single else f"kfuse-{graph.name}"
    chunk_calls = {}
    for location in np.ndindex(grid):
        # (a pipeline of one output: the task's result is the output's chunk, its key the
        # array's key for that chunk)
        key = ((f"{prefix}-{token}", *location) if single else
               f"{prefix}-{token}-" + "-".join(map(str, location)))
        chunk_calls[key] = (owners[location], (run_chunk, location, single,
                                               *grown_of(location)))
    tasks = dict(zip(np.ndindex(grid), _mapped(client, _from_pieces, chunk_calls).values(),
                     strict=True))
    result = {}
    for index, name in enumerate(graph.outputs):
        dtype = numpy_dtype(graph.buffers[name].dtype)
        axes = compute.folded[name][1] if name in compute.folded else ()
        # an output over some grid axes (a row's result) lies along those (the others, folded,
        # are one chunk: its chunks are the grid's along its axes)
        kept = compute.vector_outputs.get(name, tuple(range(len(chunks))))
        # the array's chunks are the futures themselves (as a persisted array's are): no
        # task stands between them and the array that Dask could place elsewhere
        array_name = f"kfuse-{graph.name}-{name}-{token}"
        placed = {(array_name, *(location[a] for a in kept)): location for location in tasks}
        layer = dict(zip(placed, tasks.values(), strict=True)) if single else _mapped(
            client, _item, {key: (owners[location], (tasks[location], index))
                            for key, location in placed.items()})
        _place({key: owners[placed[key]] for key in layer})
        array = da.Array(HighLevelGraph.from_collections(array_name, layer, dependencies=()),
                         array_name, tuple((1,) * len(chunks[a]) if a in axes else chunks[a]
                                           for a in kept),
                         meta=meta_of(dtype, len(kept)))
        if name in compute.folded:  # one value per chunk along the axes, folded by Dask
            array = _folded_by_dask(array, compute.folded[name][0], axes, dtype)
        result[name] = array
    return result


def _mapped(client: Any, function: Callable[..., Any],
            calls: Mapping[Any, tuple[str, tuple[Any, ...]]]) -> dict[Any, Any]:
    """Futures of ``function`` over ``calls`` (key: (worker, arguments)), each restricted to
    its worker, submitted in one message per worker (``Client.map``; a submission per task
    costs the client a message each)."""
    by_worker: dict[str, list[Any]] = {}
    for key, (worker, _) in calls.items():
        by_worker.setdefault(worker, []).append(key)
    futures = {}
    for worker, keys in by_worker.items():
        columns = list(zip(*(calls[key][1] for key in keys), strict=True))
        futures.update(zip(keys, client.map(function, *columns, key=keys, workers=[worker],
                                            allow_other_workers=False, pure=False),
                           strict=True))
    return {key: futures[key] for key in calls}


_SCATTERED: dict[tuple[int, str], Any] = {}


def _scattered(client: Any, compute: ChunkTask) -> Any:
    """``compute`` as a future on every worker, scattered once per client and digest (the
    chunk tasks of every call then carry its key, not the pickled graph and plan)."""
    key = (id(client), compute.digest)
    future = _SCATTERED.get(key)
    if future is None or future.status != "finished" or future.client is not client:
        while len(_SCATTERED) >= 64:  # (the oldest goes first)
            _SCATTERED.pop(next(iter(_SCATTERED)))
        future = _SCATTERED[key] = client.scatter(compute, broadcast=True, hash=False)
    return future


def _from_pieces(compute: ChunkTask, location: tuple[int, ...], single: bool,
                 *grown: Any) -> Any:
    return compute.from_pieces(location, single, *grown)


def persist_in_bands(array: Any, client: Any = None) -> Any:
    """``array`` persisted on ``client``'s workers (the default client) in bands along its
    first axis: the workers, in order, each hold an equal run of consecutive block rows, so
    that a chunk's neighbours lie on its own worker but at a band's two edges (a domain
    decomposition). Persisted as Dask places them, neighbouring chunks mostly lie on
    different workers and every halo crosses between them. The result is a Dask array of
    the same chunks, which :meth:`kfuse.Pipeline.run` computes where each chunk lies."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from distributed import default_client, futures_of

    if not is_dask_array(array):
        raise ChunkingError(f"persist_in_bands takes a dask.array, got {type(array).__name__}")
    client = client or default_client()
    if client.status != "running":  # (a client closed since it became the current one)
        raise ChunkingError(f"persist_in_bands: the Dask client is {client.status}, not "
                            "running (pass the running one as client=)")
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if not workers:
        raise ChunkingError("persist_in_bands: the client has no workers")
    rows = array.numblocks[0]
    name = f"banded-{tokenize(array.name, workers)}"
    layer, placed = {}, {}
    for location in np.ndindex(array.numblocks):
        key = (name, *location)
        worker = placed[key] = workers[location[0] * len(workers) // rows]
        block = client.persist(array.blocks[location], workers=[worker],
                               allow_other_workers=False)
        (future,) = futures_of(block)
        # (the array's own key for the chunk: what Pipeline.run finds held)
        layer[key] = client.submit(_same, future, key=key, workers=[worker],
                                   allow_other_workers=False)
    _place(placed)
    return da.Array(HighLevelGraph.from_collections(name, layer, dependencies=()), name,
                    array.chunks, meta=array._meta)


def _same(values: Any) -> Any:
    return values


def grown_pieces(piece: Any, grid: tuple[int, ...], location: tuple[int, ...],
                  depth: Mapping[int, int], periodic: Mapping[int, bool]) -> Any:
    """The pieces of the chunk at ``location`` grown by ``depth`` along each axis, nested
    one list per axis (as ``np.block`` takes them): ``piece(at, cut)`` of the neighbours
    before and after (wrapped where ``periodic``; none past an edge otherwise) around the
    chunk itself."""
    def pieces(axis: int, at: tuple[int, ...], cut: tuple[slice, ...]) -> Any:
        if axis == len(location):
            return piece(at, cut)
        grown, count = depth.get(axis, 0), grid[axis]
        parts = []
        for step, part in ((-1, slice(-grown, None)), (0, slice(None)), (1, slice(0, grown))):
            neighbour = location[axis] + step
            if step and (not grown or (not periodic.get(axis) and not 0 <= neighbour < count)):
                continue
            parts.append(pieces(axis + 1, (*at, neighbour % count), (*cut, part)))
        return parts

    return pieces(0, (), ())


# compiled pipelines of this process, by the digest of their graph, backend and plan: every
# chunk a worker computes reuses the one compiled pipeline (its programs per chunk shape)
_COMPILED: dict[str, Any] = {}
_PLANS: dict[str, Any] = {}  # default plans of this process, by graph and shape


def planned_once(graph: Graph, shape: tuple[int, ...],
                 whole: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """The default plan of ``graph`` for inputs of ``shape`` (``whole``: the inputs of
    other shapes, given whole to every chunk, by name), made once per process (a chunked
    call plans for its largest chunk; the next calls reuse the plan)."""
    shapes = dict.fromkeys(graph.inputs, shape) | dict(whole or {})
    key = hashlib.sha256(pickle.dumps((graph, sorted(shapes.items())))).hexdigest()
    plan = _PLANS.get(key)
    if plan is None:
        from kfuse.ir.collapse import axis_collapse
        from kfuse.search import plan_for

        collapse = axis_collapse(graph)  # (planned as calls run it: axes merged)
        planned_graph, sizes = (graph, graph.bind_shapes(shapes)) if collapse is None else \
            (collapse.graph, collapse.input_sizes(shapes))
        plan = _PLANS.setdefault(key, plan_for(planned_graph, "auto", "roofline", sizes))
    return plan


def compiled_pipelines() -> list[Any]:
    """The compiled pipelines this process's chunks and slabs ran (their ``cache_info()``
    says what calls built and reused)."""
    return list(_COMPILED.values())


def program_key(graph: Graph, backend: str, plan: Any) -> str:
    """The digest :func:`compiled_once` keeps a compiled pipeline under."""
    return hashlib.sha256(pickle.dumps((graph, backend, plan))).hexdigest()


def compiled_once(graph: Graph, backend: str, plan: Any, shape: tuple[int, ...] | None = None,
                  key: str | None = None) -> Any:
    """The process's compiled pipeline of ``graph`` on ``backend`` under ``plan`` (``"auto"``
    with ``shape``: :func:`planned_once` for inputs of that shape), made at the first call;
    ``key``: its :func:`program_key`, where the caller keeps it (a chunk task is called once
    per chunk)."""
    if shape is not None and isinstance(plan, str) and plan == "auto":
        plan = planned_once(graph, shape)
    key = key or program_key(graph, backend, plan)
    run = _COMPILED.get(key)
    if run is None:
        from kfuse.runtime.compiled import CompiledPipeline
        run = _COMPILED.setdefault(key, CompiledPipeline(graph, backend, plan))
    return run


class ChunkTask:
    """Computes the pipeline on one grown chunk and crops what the halo grew (picklable:
    sent to Dask's workers, which compile the pipeline once each)."""

    def __init__(self, graph: Graph, backend: str, plan: Any, params: Mapping[str, Any],
                 depth: Mapping[int, int], periodic: Mapping[int, bool], counts: list[int],
                 folded: Mapping[str, tuple[str, tuple[int, ...]]], repeat: int = 1,
                 feedback: Mapping[str, str] | None = None, patch_edges: bool = False,
                 vector_inputs: Mapping[str, tuple[int, ...]] | None = None,
                 vector_outputs: Mapping[str, tuple[int, ...]] | None = None):
        self.graph, self.backend, self.plan, self.folded = graph, backend, plan, dict(folded)
        # inputs along some grid axes (by those axes: each arrives shaped for the grid, one
        # point along the others) and outputs over some grid axes only (cropped along those)
        self.vector_inputs = dict(vector_inputs or {})
        self.vector_outputs = dict(vector_outputs or {})
        self.params, self.depth, self.periodic, self.counts = dict(params), dict(depth), \
            dict(periodic), counts
        self.repeat, self.feedback, self.patch_edges = repeat, dict(feedback or {}), \
            patch_edges
        self.program = program_key(graph, backend, plan)  # (worked out once, not per chunk)
        self.digest = hashlib.sha256(pickle.dumps((
            self.program, sorted(self.params.items()), sorted(self.depth.items()),
            sorted(self.periodic.items()), counts, sorted(self.folded.items()), repeat,
            sorted(self.feedback.items()), patch_edges, sorted(self.vector_inputs.items()),
            sorted(self.vector_outputs.items())))).hexdigest()

    def __call__(self, *blocks: Any, block_info: Any = None) -> tuple[Any, ...]:
        return self.outputs(block_info[0]["chunk-location"], blocks)

    def from_pieces(self, location: tuple[int, ...], single: bool, *grown: Any) -> Any:
        """:meth:`outputs` from each input's pieces (:func:`grown_pieces`: the chunk and
        its neighbours' halos); ``single``: the one output itself. With
        :attr:`patch_edges`, where the chunk grows along one axis only, it is computed as it
        lies and its rows near each neighbour are patched from a thin strip joined with that
        neighbour's halo (:meth:`patched`); otherwise the pieces are joined into the grown
        chunk (a copy of the whole chunk)."""
        # (an axis of one chunk is grown only where periodic: by its own far side)
        grown_axes = [axis for axis, depth in self.depth.items()
                      if depth and (self.counts[axis] > 1 or self.periodic[axis])]
        if self.patch_edges and len(grown_axes) == 1:
            outputs = self.patched(location, grown_axes[0], grown)
        else:
            outputs = self.outputs(location, [joined_pieces(pieces, 0) for pieces in grown])
        return outputs[0] if single else outputs

    def computed(self, given: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's outputs on ``given`` inputs: :attr:`repeat` calls, each feeding
        its :attr:`feedback` outputs to the next call."""
        run = compiled_once(self.graph, self.backend, self.plan, key=self.program)
        given = dict(given)
        for call in range(self.repeat):  # (each call's rim of wrong values, one halo deep
            # more than the last, lies in what the chunk was grown by: cropped or patched)
            outputs = run(**given, **self.params)
            if call + 1 < self.repeat:
                given.update({self.feedback[name]: outputs[name] for name in self.feedback})
        return outputs

    def finished(self, outputs: Mapping[str, Any], crop: tuple[slice, ...]) -> tuple[Any, ...]:
        """Each output cropped to the chunk's own points (a folded reduction: its fold
        along its axes, shaped as a block)."""
        results = []
        for name in self.graph.outputs:
            kept = self.vector_outputs.get(name)
            values = outputs[name][crop if kept is None else tuple(crop[a] for a in kept)]
            if name in self.folded:
                op, axes = self.folded[name]
                values = getattr(values, op)(axis=axes, keepdims=True)
            results.append(values)
        return tuple(results)

    def outputs(self, location: tuple[int, ...], blocks: Any) -> tuple[Any, ...]:
        """Every output of the chunk at ``location`` (an item each; a folded reduction's
        fold along its axes) from the inputs' grown ``blocks``."""
        crop = []
        for axis, grown in self.depth.items():
            inner_before = self.periodic[axis] or location[axis] > 0
            inner_after = self.periodic[axis] or location[axis] < self.counts[axis] - 1
            crop.append(slice(grown if grown and inner_before else 0,
                              -grown if grown and inner_after else None))
        # (a vector arrives shaped for the grid from Dask's blockwise map, as it is from a
        # task given it whole)
        given = {name: block.reshape(tuple(block.shape[a] for a in self.vector_inputs[name]))
                 if name in self.vector_inputs and block.ndim != len(self.vector_inputs[name])
                 else block for name, block in zip(self.graph.inputs, blocks, strict=True)}
        return self.finished(self.computed(given), tuple(crop))

    def patched(self, location: tuple[int, ...], axis: int, grown: Any) -> tuple[Any, ...]:
        """The chunk's outputs computed on the chunk as it lies (no copy of it), its rows
        within the halo depth D of a neighbour (wrong there: the pipeline's modes stood in
        for the neighbour) replaced by rows D..2D of the outputs of a strip of 3D rows: the
        neighbour's halo of D rows and the chunk's first (or last) 2D rows. A chunk shorter
        than 2D rows is joined whole instead."""
        depth = self.depth[axis]
        parts = [_parts_along(pieces, 0, axis) for pieces in grown]
        has_before = self.periodic[axis] or location[axis] > 0
        has_after = self.periodic[axis] or location[axis] < self.counts[axis] - 1
        chunks = [inputs[1 if has_before else 0] for inputs in parts]
        length = chunks[0].shape[axis]
        if length < 2 * depth:
            return self.outputs(location, [joined_pieces(pieces, 0) for pieces in grown])

        def rows(values: Any, low: int | None, high: int | None) -> Any:
            return values[(slice(None),) * axis + (slice(low, high),)]

        outputs = self.computed(dict(zip(self.graph.inputs, chunks, strict=True)))
        sides = []
        if has_before:
            sides.append((0, [np.concatenate([inputs[0], rows(chunk, None, 2 * depth)], axis)
                              for inputs, chunk in zip(parts, chunks, strict=True)]))
        if has_after:
            sides.append((length - depth, [
                np.concatenate([rows(chunk, length - 2 * depth, None), inputs[-1]], axis)
                for inputs, chunk in zip(parts, chunks, strict=True)]))
        for start, strips in sides:
            near = self.computed(dict(zip(self.graph.inputs, strips, strict=True)))
            for name in self.graph.outputs:
                rows(outputs[name], start, start + depth)[...] = rows(near[name], depth,
                                                                      2 * depth)
        return self.finished(outputs, (slice(None),) * len(self.depth))


def _parts_along(pieces: Any, at: int, axis: int) -> list[Any]:
    """The arrays along ``axis`` in ``pieces`` (nested lists, one level per axis, one part
    along every other axis): the halo before (if any), the chunk, the halo after (if
    any)."""
    if at == axis:
        return [joined_pieces(part, at + 1) for part in pieces]
    (only,) = pieces
    return _parts_along(only, at + 1, axis)


def iterate(pipeline: Any, calls: int, feedback: Mapping[str, str], *, backend: str = "cpu",
            plan: Any = "auto", calls_per_exchange: int = 1,
            **arrays_and_params: Any) -> dict[str, Any]:
    """Run ``pipeline`` ``calls`` times over Dask arrays, each call's outputs named in
    ``feedback`` (output -> input) becoming the next call's inputs; the last call's
    outputs. A pipeline of k time steps then exchanges halos once per k steps, as deep as
    its k steps reach (:func:`halo_depths`), not once per step; ``calls_per_exchange`` = m
    runs m calls in each chunk's task on a chunk grown m times as deep, exchanging halos
    once per m calls (more recomputed at the chunk's edges, m times fewer tasks and halo
    exchanges: what pays where a call's work is small against a task's cost)."""
    for name, value in (("calls", calls), ("calls_per_exchange", calls_per_exchange)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ChunkingError(f"{name} must be a positive integer, got {value!r}")
    graph = pipeline.graph()
    unknown = [f"{out} -> {inp}" for out, inp in feedback.items()
               if out not in graph.outputs or inp not in graph.inputs]
    if unknown or not feedback:
        raise ChunkingError(f"feedback maps outputs {list(graph.outputs)} to inputs "
                            f"{list(graph.inputs)}; got {unknown or 'nothing'}")
    reduced = sorted(set(feedback) & set(terminal_reductions(graph)))
    if reduced and calls_per_exchange > 1:
        raise ChunkingError(f"feedback of the reductions {reduced} (not on the grid) cannot "
                            "run several calls per exchange", operator=reduced[0])
    given = dict(arrays_and_params)
    outputs: dict[str, Any] = {}
    done = 0
    while done < calls:
        repeat = min(calls_per_exchange, calls - done)
        outputs = pipeline.run(backend=backend, plan=plan, **given) if repeat == 1 else \
            run_on_dask_arrays(pipeline, backend, plan, given, repeat=repeat,
                               feedback=feedback)
        given.update({feedback[name]: outputs[name] for name in feedback})
        done += repeat
    return outputs
