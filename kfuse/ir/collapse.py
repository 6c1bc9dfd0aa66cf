"""Adjacent axes that every operator reads at its own point, merged into one.

A normalisation of activations written over ``(batch, seq, hidden)`` folds the last axis and
reads the first two only at the point itself: as far as any operator can tell, those two are
one axis of ``batch * seq`` rows, and the pipeline is the matrix pipeline the map-reduce
forms (rows held whole, in segments, columns) plan as one kernel. Merging axes before
planning is what Inductor's loop simplification does for the same reason (PyTorch's
``SizeVarAllocator``/``_simplify_loops``); the arrays, C-contiguous, are the same memory
reshaped.

Two grid axes ``i, i + 1`` merge when every operator's domain, every reduction's axes and
every array have both or neither, in that order, and every read of both is at offset 0,
neither scaled nor at a computed index, and no operator reads the coordinate along either.
Only pipelines of three or more axes are merged (a 2-D pipeline is already a matrix); sizes
must be plain symbols bound from the inputs (no fixed or derived ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kfuse.errors import CompileError, KfuseError
from kfuse.ir.expr import Coord, Expr, Load, transform
from kfuse.ir.graph import Buffer, Graph, Reduction
from kfuse.ir.sizes import derived_size, fixed_size
from kfuse.log import LOG

# the symbol of merged axes: the axes' symbols joined (no size parser reads it as derived)
JOIN = "&"


@dataclass(frozen=True)
class AxisCollapse:
    """``graph`` with runs of adjacent axes merged (:attr:`merged`: the runs, by the symbols
    of the original grid); :meth:`inputs` and :meth:`outputs` reshape arrays between the
    two. ``sources`` gives each original symbol's (input, axis), where its size is read."""

    original: Graph
    graph: Graph
    merged: tuple[tuple[str, ...], ...]
    sources: Mapping[str, tuple[str, int]]
    # the reshapes of a call, by its inputs' shapes: (each input's merged shape, each
    # output's original shape), worked out once per shapes (a call pays two lookups)
    _reshapes: dict[tuple, tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]] = \
        field(default_factory=dict, compare=False, repr=False)

    def reshapes(self, given: Mapping[str, Any]
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """(each input's shape in the merged graph, each output's in the original) for a
        call on ``given``'s inputs."""
        inputs = self.original.inputs
        key = tuple(given[name].shape for name in inputs)
        found = self._reshapes.get(key)
        if found is None:
            if len(self._reshapes) >= 64:
                self._reshapes.clear()
            shapes = dict(zip(inputs, key, strict=True))
            found = self._reshapes[key] = (
                {name: _sizes_of(tuple(shapes[name]), self.original.buffers[name].shape,
                                 self.merged) for name in inputs},
                {name: tuple(int(shapes[source][axis]) for source, axis in (
                    self.sources[symbol] for symbol in self.original.buffers[name].shape))
                 for name in self.original.outputs})
        return found

    def inputs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs (and parameters, unchanged) as the merged graph takes them: each
        array reshaped (a view of a C-contiguous one)."""
        result = dict(given)
        for name, shape in self.reshapes(given)[0].items():
            result[name] = given[name].reshape(shape)
        return result

    def outputs(self, results: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """The merged graph's outputs reshaped to the original graph's shapes (views)."""
        shapes = self.reshapes(given)[1]
        return {name: value.reshape(shapes[name]) for name, value in results.items()}

    def sizes(self, symbols: Mapping[str, int]) -> dict[str, int]:
        """The merged graph's sizes from the original's (``symbols``: size by symbol; a
        run's size is its axes' product, where every one is given)."""
        result = {symbol: size for symbol, size in symbols.items()
                  if not any(symbol in run for run in self.merged)}
        for run in self.merged:
            if all(symbol in symbols for symbol in run):
                product = 1
                for symbol in run:
                    product *= int(symbols[symbol])
                result[JOIN.join(run)] = product
        return result

    def input_sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The merged graph's sizes bound from the inputs' original ``shapes``."""
        return self.sizes(self.original.bind_shapes(shapes))

    def out_arrays(self, out: Mapping[str, Any]) -> dict[str, Any] | None:
        """``out=`` arrays reshaped as the merged graph writes them, or None where one is
        not C-contiguous (a reshape would copy it: the call then runs unmerged)."""
        result = {}
        for name, value in out.items():
            if not _c_contiguous(value):
                return None
            result[name] = value.reshape(_sizes_of(value.shape,
                                                   self.original.buffers[name].shape,
                                                   self.merged))
        return result


# axes a compiled kernel iterates over at most (the code generators' 1-, 2- and 3-D forms)
COMPILED_AXES = 3


def check_compiled_axes(graph: Graph) -> None:
    """Raise :class:`CompileError` naming the first operator over more axes than compiled
    kernels take. Calls and plans merge axes first (:func:`axis_collapse`), so a pipeline
    over (N, C, H, W) whose (H, W) every operator reads at its own point compiles."""
    for kernel in graph.kernels:
        if kernel.ndim > COMPILED_AXES:
            raise CompileError(
                f"iterates over {kernel.ndim} axes ({', '.join(kernel.domain)}) that do not "
                f"merge into {COMPILED_AXES} or fewer: compiled kernels take at most "
                f"{COMPILED_AXES} (adjacent axes merge where every operator reads them at its "
                "own point, kfuse.ir.collapse); run it on the numpy backend",
                operator=kernel.name, where=kernel.where)


def axis_collapse(graph: Graph) -> AxisCollapse | None:
    """The pipeline with its mergeable adjacent axes merged, or None where none merge (or
    the pipeline has fewer than three axes, or operators the merge does not rewrite)."""
    return graph.remembered(("axis collapse",), lambda: _collapse(graph))


def _collapse(graph: Graph) -> AxisCollapse | None:
    if any(kernel.body is None for kernel in graph.kernels):
        return None  # (a user kernel indexes its arrays itself)
    grid = max((kernel.domain for kernel in graph.kernels), key=len, default=())
    if len(grid) < 3 or len(set(grid)) != len(grid):
        return None
    if any(fixed_size(s) is not None or derived_size(s) is not None for s in grid):
        return None
    position = {symbol: axis for axis, symbol in enumerate(grid)}
    if any(symbol not in position for kernel in graph.kernels for symbol in kernel.domain):
        return None
    if any(s not in position for buffer in graph.buffers.values() for s in buffer.shape):
        return None
    pairs = [(grid[i], grid[i + 1]) for i in range(len(grid) - 1)
             if _mergeable(graph, grid[i], grid[i + 1])]
    if not pairs:
        return None
    runs: list[list[str]] = []
    for first, second in pairs:
        if runs and runs[-1][-1] == first:
            runs[-1].append(second)
        else:
            runs.append([first, second])
    merged = tuple(tuple(run) for run in runs)
    sources = {}
    for name in graph.inputs:
        for axis, symbol in enumerate(graph.buffers[name].shape):
            sources.setdefault(symbol, (name, axis))
    if any(symbol not in sources for run in merged for symbol in run) or any(
            symbol not in sources for name in graph.outputs
            for symbol in graph.buffers[name].shape):
        return None
    try:
        merged_graph = _merged_graph(graph, merged)
    except KfuseError as error:  # (a merge the graph's own checks refuse: run unmerged)
        LOG.debug("pipeline '%s': axes %s not merged: %s", graph.name, merged, error)
        return None
    return AxisCollapse(graph, merged_graph, merged, sources)


def _mergeable(graph: Graph, first: str, second: str) -> bool:
    """Whether the grid axes of symbols ``first`` and ``second`` (adjacent) merge."""
    pair = (first, second)
    for buffer in graph.buffers.values():
        if not _both_or_neither(buffer.shape, pair):
            return False
    for kernel in graph.kernels:
        if not _both_or_neither(kernel.domain, pair):
            return False
        if first not in kernel.domain:
            continue
        axes = (kernel.domain.index(first), kernel.domain.index(second))
        if kernel.reduction is not None and \
                (axes[0] in kernel.reduction.axes) != (axes[1] in kernel.reduction.axes):
            return False
        for node in kernel.body.walk():  # type: ignore[union-attr]
            if isinstance(node, Coord) and node.axis in axes:
                return False
            if isinstance(node, Load) and not _plain_read_of_both(node, axes):
                return False
    return True


def _both_or_neither(symbols: tuple[str, ...], pair: tuple[str, str]) -> bool:
    first, second = pair
    if (first in symbols) != (second in symbols):
        return False
    return first not in symbols or symbols.index(second) == symbols.index(first) + 1


def _plain_read_of_both(load: Load, axes: tuple[int, int]) -> bool:
    """Whether ``load`` reads both iteration ``axes`` along adjacent array axes at offset 0
    (neither scaled nor computed), or neither."""
    dims = load.dims or ()
    if (axes[0] in dims) != (axes[1] in dims):
        return False
    if axes[0] not in dims:
        return True
    k = dims.index(axes[0])
    if k + 1 >= len(dims) or dims[k + 1] != axes[1]:
        return False
    for axis in (k, k + 1):
        if load.offsets[axis] != 0 or (load.scales and load.scales[axis] not in (None, (1, 1))) \
                or (load.indices and load.indices[axis] is not None):
            return False
    return True


def _merged_shape(shape: tuple[str, ...], merged: tuple[tuple[str, ...], ...]
                  ) -> tuple[str, ...]:
    result: list[str] = []
    skip = 0
    for symbol in shape:
        if skip:
            skip -= 1
            continue
        run = next((run for run in merged if run[0] == symbol), None)
        if run is None:
            result.append(symbol)
        else:
            result.append(JOIN.join(run))
            skip = len(run) - 1
    return tuple(result)


def _sizes_of(sizes: tuple[int, ...], shape: tuple[str, ...],
              merged: tuple[tuple[str, ...], ...]) -> tuple[int, ...]:
    """An array's sizes with its runs of merged axes multiplied together."""
    result: list[int] = []
    k = 0
    while k < len(shape):
        run = next((run for run in merged if run[0] == shape[k]), None)
        if run is None:
            result.append(int(sizes[k]))
            k += 1
        else:
            product = 1
            for size in sizes[k:k + len(run)]:
                product *= int(size)
            result.append(product)
            k += len(run)
    return tuple(result)


def _axis_map(domain: tuple[str, ...], merged: tuple[tuple[str, ...], ...]) -> list[int]:
    """For each axis of ``domain``, its axis in the merged domain."""
    result = []
    index = -1
    for symbol in domain:
        inside = next((run for run in merged if symbol in run), None)
        if inside is None or inside[0] == symbol:
            index += 1
        result.append(index)
    return result


def _merged_load(load: Load, axis_of: list[int]) -> Load:
    """``load`` over the merged iteration axes (``axis_of``: old -> new); the array axes of
    a merged run (reads at offset 0) become one."""
    dims = load.dims or ()
    keep = [k for k in range(len(dims))
            if k == 0 or dims[k] < 0 or dims[k - 1] < 0 or axis_of[dims[k]] != axis_of[dims[k - 1]]]
    return Load(load.buffer, load.dtype, tuple(load.offsets[k] for k in keep),
                tuple(dims[k] if dims[k] < 0 else axis_of[dims[k]] for k in keep),
                load.boundary, load.origin,
                None if load.scales is None else tuple(load.scales[k] for k in keep),
                None if load.indices is None else tuple(load.indices[k] for k in keep))


def _merged_graph(graph: Graph, merged: tuple[tuple[str, ...], ...]) -> Graph:
    buffers = {name: Buffer(name, buffer.dtype, _merged_shape(buffer.shape, merged))
               for name, buffer in graph.buffers.items()}
    kernels = []
    for kernel in graph.kernels:
        axis_of = _axis_map(kernel.domain, merged)

        def rewrite(node: Expr, axis_of: list[int] = axis_of) -> Expr | None:
            if isinstance(node, Load):
                return _merged_load(node, axis_of)
            if isinstance(node, Coord):
                return replace(node, axis=axis_of[node.axis])
            return None

        reduction = kernel.reduction
        if reduction is not None:
            reduction = Reduction(reduction.op, tuple(sorted({axis_of[a] for a in reduction.axes})))
        kernels.append(replace(kernel, domain=_merged_shape(kernel.domain, merged),
                               body=transform(kernel.body, rewrite),  # type: ignore[arg-type]
                               reduction=reduction))
    return Graph(graph.name, buffers, tuple(kernels), graph.inputs, graph.outputs,
                 dict(graph.params)).validate()


def _c_contiguous(array: Any) -> bool:
    flags = getattr(array, "flags", None)
    if flags is not None:
        return bool(flags.c_contiguous if hasattr(flags, "c_contiguous")
                    else flags["C_CONTIGUOUS"])
    is_contiguous = getattr(array, "is_contiguous", None)  # (a torch tensor)
    return bool(is_contiguous()) if callable(is_contiguous) else False


__all__ = ["JOIN", "AxisCollapse", "axis_collapse"]
