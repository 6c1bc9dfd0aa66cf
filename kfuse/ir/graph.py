"""The IR: buffers, kernels and their accesses, and the graph of a whole pipeline.

Every kernel maps a function over an iteration domain (a tuple of size symbols) and
either writes one value per point or folds the values over some axes (a reduction).
Point, stencil, reduction and matrix-vector operators are all this one shape, which is
what lets the planner treat them alike. Opaque user kernels declare what they read and
write and carry their own source. The graph is immutable; derived views (dependency
graph, order DAG, sharing sets, thread load, halos) are computed from it on demand.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import networkx as nx

from kfuse.errors import CycleError, ShapeError, ValidationError
from kfuse.ir.expr import (
    ITEM_SIZE,
    Boundary,
    Expr,
    Load,
    Param,
    is_integer_scalar,
    loads,
    params,
)
from kfuse.ir.sizes import bind_derived, derived_size, describe_size, fixed_size

__all__ = ["fixed_size"]  # (kept here for the stages that import it from the graph)

KERNEL_KINDS = ("point", "local", "reduce", "opaque")
REDUCE_OPS = ("sum", "min", "max")
MEMO_ENTRIES = 256  # answers a graph keeps (Graph.remembered): plans, fitting register tiles


@dataclass(frozen=True)
class Buffer:
    """An array in device memory. ``shape`` holds size symbols bound at call time
    (a symbol that is a number, ``"9"``, is a fixed size: see :func:`fixed_size`)."""

    name: str
    dtype: str
    shape: tuple[str, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Access:
    """One read pattern of a kernel on a buffer: all constant offsets and their boundary modes."""

    buffer: str
    dims: tuple[int, ...]
    offsets: tuple[tuple[int, ...], ...]
    boundaries: tuple[Boundary | None, ...]
    scales: tuple[tuple[int, int], ...] | None = None  # a read at another resolution (Load)
    gathered: tuple[int, ...] = ()  # array axes indexed by computed values (Load.indices)

    @property
    def is_point(self) -> bool:
        return not self.remapped and all(all(o == 0 for o in offset)
                                         for offset in self.offsets)

    @property
    def remapped(self) -> bool:
        """True for reads not at the point plus offsets (scaled or data-dependent): the
        footprint of a gathered axis is the whole axis."""
        return self.scales is not None or bool(self.gathered)

    @property
    def radius(self) -> tuple[int, ...]:
        """Halo radius per array axis: the largest absolute offset."""
        if not self.offsets:
            return ()
        return tuple(max(abs(offset[k]) for offset in self.offsets)
                     for k in range(len(self.offsets[0])))

    @property
    def window(self) -> tuple[int, ...]:
        """Extent of the bounding window per array axis (3 for offsets -1..1)."""
        if not self.offsets:
            return ()
        return tuple(max(o[k] for o in self.offsets) - min(o[k] for o in self.offsets) + 1
                     for k in range(len(self.offsets[0])))


@dataclass(frozen=True)
class Reduction:
    """Fold the body's values over ``axes`` of the iteration domain with ``op``."""

    op: str
    axes: tuple[int, ...]


@dataclass(frozen=True)
class UserAccess:
    """How a user kernel reads or writes one array: ``elementwise`` (thread i touches element
    i), ``stencil`` (within ``radius`` of it, per axis) or ``whole`` (anywhere)."""

    buffer: str
    pattern: str = "whole"
    radius: tuple[int, ...] = ()
    initial: float | None = None  # a written array set to this before the kernel runs


@dataclass(frozen=True)
class UserArgument:
    """One parameter of a user kernel's function, in order: an array it reads (``input``) or
    writes (``output``), a size symbol (``size``, passed as int), a runtime parameter of the
    pipeline (``param``) or a constant (``constant``: ``ref`` is its C literal)."""

    role: str
    ref: str
    dtype: str


@dataclass(frozen=True)
class UserGridAxis:
    """Blocks along one grid axis of a user kernel: ``blocks`` (> 0) exactly, or
    ceil(product of the ``symbols``' sizes / ``per_block``)."""

    symbols: tuple[str, ...] = ()
    per_block: int = 1
    blocks: int = 0


@dataclass(frozen=True)
class OpaqueSpec:
    """A user CUDA kernel: its source, entry point, parameters, declared reads and writes,
    launch shape and cost; ``reference`` computes its writes with NumPy (the truth the
    ``numpy`` backend runs; not part of what the kernel is)."""

    source: str
    entry: str
    arguments: tuple[UserArgument, ...]
    reads: tuple[UserAccess, ...]
    writes: tuple[UserAccess, ...]
    block: tuple[int, int, int] = (256, 1, 1)
    grid: tuple[UserGridAxis, UserGridAxis, UserGridAxis] = (
        UserGridAxis(), UserGridAxis(), UserGridAxis())
    dynamic_shared_bytes: int = 0
    any_block: bool = False  # correct at any 1-D block of whole warps (HFuse's "tunable")
    operations_per_thread: float = 0.0  # arithmetic per thread, for the cost models
    reference: Callable[..., Any] | None = field(default=None, compare=False)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def with_sizes_named(self, name: Callable[[str], str]) -> OpaqueSpec:
        """The same kernel with every size symbol it names replaced by ``name(symbol)`` (the
        DSL's symbols once unified with others)."""
        from dataclasses import replace

        def rename(symbols: str) -> str:
            return "*".join(name(s) for s in symbols.split("*")) if symbols != "1" else symbols

        arguments = tuple(replace(a, ref=rename(a.ref)) if a.role == "size" else a
                          for a in self.arguments)
        grid = tuple(replace(axis, symbols=tuple(name(s) for s in axis.symbols))
                     for axis in self.grid)
        return replace(self, arguments=arguments, grid=grid)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Kernel:
    """One operator of the pipeline.

    ``domain`` is the iteration space as size symbols; ``body`` is evaluated at each point;
    ``reduction`` (if any) folds it over some axes; ``writes`` are the buffers it produces.
    ``where`` is the user's source line that created it, for error messages.
    """

    name: str
    kind: str
    domain: tuple[str, ...]
    body: Expr | None
    writes: tuple[str, ...]
    reduction: Reduction | None = None
    opaque: OpaqueSpec | None = None
    where: str | None = None

    @property
    def output(self) -> str:
        return self.writes[0]

    @property
    def ndim(self) -> int:
        return len(self.domain)

    @cached_property
    def accesses(self) -> tuple[Access, ...]:
        """Reads grouped per (buffer, dims), in order of first appearance."""
        if self.body is None:
            assert self.opaque is not None
            return tuple(Access(access.buffer, (), ((),), (None,))
                         for access in self.opaque.reads)
        grouped: dict[tuple, list[Load]] = {}
        for load in loads(self.body):
            gathered = tuple(axis for axis, index in enumerate(load.indices or ())
                             if index is not None)
            grouped.setdefault((load.buffer, load.dims, load.scales, gathered),
                               []).append(load)
        result = []
        for (name, dims, scales, gathered), group in grouped.items():
            unique: dict[tuple, Load] = {}
            for load in group:
                unique.setdefault((load.offsets, load.boundary), load)
            result.append(Access(name, dims, tuple(k[0] for k in unique),
                                 tuple(k[1] for k in unique), scales, gathered))
        return tuple(result)

    @cached_property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(access.buffer for access in self.accesses))

    @cached_property
    def params(self) -> tuple[Param, ...]:
        if self.body is None:
            assert self.opaque is not None
            return tuple(Param(argument.ref, argument.dtype)
                         for argument in self.opaque.arguments if argument.role == "param")
        unique = {p.name: p for p in params(self.body)}
        return tuple(unique[name] for name in sorted(unique))

    def halo_radius(self, buffer: str) -> tuple[int, ...]:
        """Largest offset per array axis with which this kernel reads ``buffer``."""
        radii = [a.radius for a in self.accesses if a.buffer == buffer and a.radius]
        if not radii:
            return ()
        return tuple(max(r[k] for r in radii) for k in range(len(radii[0])))

    def thread_load(self, buffer: str) -> int:
        """How many threads read one element of ``buffer``: 1 for point, the window size else."""
        return max((len(a.offsets) for a in self.accesses if a.buffer == buffer), default=0)


@dataclass(frozen=True)
class Graph:
    """A whole pipeline: buffers, kernels in program order, named inputs, outputs, parameters."""

    name: str
    buffers: Mapping[str, Buffer]
    kernels: tuple[Kernel, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, str] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its fields only: what later stages cached on the graph (compiled
        programs hold handles that do not pickle) is worked out again where unpickled."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    # -- lookups -----------------------------------------------------------------------------
    @cached_property
    def memo(self) -> OrderedDict[tuple, Any]:
        """Answers that later stages worked out for this graph (plans at given sizes, the
        register tiles that fit), by key, the latest used last: kept with the graph, so that a
        pipeline run again on arrays of the same shapes is not planned again, at most
        :data:`MEMO_ENTRIES` of them (see :meth:`remembered`)."""
        return OrderedDict()

    @cached_property
    def fingerprint(self) -> str:
        """A digest of what the graph computes (:mod:`kfuse.ir.fingerprint`): equal for
        pipelines built alike, in any process; the key of kfuse's persistent caches."""
        from kfuse.ir.fingerprint import digest

        return digest(self)

    def remembered(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, worked out once per ``key`` for this graph (:attr:`memo`); the answer
        used longest ago is let go past :data:`MEMO_ENTRIES` (a pipeline run on very many
        shapes would keep a plan for each)."""
        if key in self.memo:
            self.memo.move_to_end(key)
            return self.memo[key]
        answer = make()
        self.memo[key] = answer
        while len(self.memo) > MEMO_ENTRIES:
            self.memo.popitem(last=False)
        return answer

    @cached_property
    def kernel_by_name(self) -> dict[str, Kernel]:
        return {kernel.name: kernel for kernel in self.kernels}

    @cached_property
    def _position(self) -> dict[str, int]:
        return {kernel.name: index for index, kernel in enumerate(self.kernels)}

    def in_program_order(self, names: Iterable[str]) -> tuple[str, ...]:
        """Operators ``names`` in the order the pipeline runs them (producers first)."""
        return tuple(sorted(names, key=self._position.__getitem__))

    @cached_property
    def producer(self) -> dict[str, str]:
        """Buffer name -> the kernel that writes it."""
        return {name: kernel.name for kernel in self.kernels for name in kernel.writes}

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        """Buffer name -> the kernels that read it, in program order."""
        result: dict[str, list[str]] = {name: [] for name in self.buffers}
        for kernel in self.kernels:
            for name in kernel.reads:
                result.setdefault(name, []).append(kernel.name)
        return {name: tuple(names) for name, names in result.items()}

    @property
    def intermediates(self) -> tuple[str, ...]:
        """Buffers written by a kernel and not returned to the user."""
        return tuple(n for n in self.producer if n not in self.outputs)

    # -- derived views -----------------------------------------------------------------------
    def dependency_graph(self) -> nx.DiGraph:
        """Bipartite data-dependency graph: buffer -> kernel (read), kernel -> buffer (write)."""
        graph = nx.DiGraph()
        for name, buffer in self.buffers.items():
            graph.add_node(("buffer", name), kind="buffer", dtype=buffer.dtype,
                           input=name in self.inputs, output=name in self.outputs)
        for kernel in self.kernels:
            graph.add_node(("kernel", kernel.name), kind=kernel.kind)
            for access in kernel.accesses:
                graph.add_edge(("buffer", access.buffer), ("kernel", kernel.name),
                               thread_load=kernel.thread_load(access.buffer),
                               radius=kernel.halo_radius(access.buffer))
            for name in kernel.writes:
                graph.add_edge(("kernel", kernel.name), ("buffer", name))
        return graph

    def order_dag(self) -> nx.DiGraph:
        """Kernel order DAG: an edge u -> v when v reads a buffer u writes (labelled with it)."""
        dag = nx.DiGraph()
        for kernel in self.kernels:
            dag.add_node(kernel.name, kind=kernel.kind)
        for kernel in self.kernels:
            for name in kernel.reads:
                if name in self.producer:
                    source = self.producer[name]
                    if dag.has_edge(source, kernel.name):
                        dag.edges[source, kernel.name]["buffers"].append(name)
                    else:
                        dag.add_edge(source, kernel.name, buffers=[name])
        return dag

    def sharing_set(self, buffer: str) -> tuple[str, ...]:
        """Kernels that access ``buffer`` (read or write), in program order."""
        return tuple(k.name for k in self.kernels if buffer in k.reads or buffer in k.writes)

    def sharing_sets(self) -> dict[str, tuple[str, ...]]:
        return {name: self.sharing_set(name) for name in self.buffers}

    def thread_load(self, kernel: str, buffer: str) -> int:
        return self.kernel_by_name[kernel].thread_load(buffer)

    def topological_kernels(self) -> list[Kernel]:
        order = list(nx.lexicographical_topological_sort(
            self.order_dag(), key=lambda n: self.kernels.index(self.kernel_by_name[n])))
        return [self.kernel_by_name[name] for name in order]

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> Graph:
        """Check the graph's structure; raise a named :class:`ValidationError` on the first fault."""
        names = [k.name for k in self.kernels]
        for name in names:
            if names.count(name) > 1:
                raise ValidationError(f"two operators are named '{name}'", operator=name)
        for name in self.inputs:
            if name not in self.buffers:
                raise ValidationError(f"input '{name}' is declared but has no buffer")
            if name in self.producer:
                raise ValidationError(f"input '{name}' is also written by "
                                      f"'{self.producer[name]}'", operator=self.producer[name])
        for kernel in self.kernels:
            for name in kernel.reads + kernel.writes:
                if name not in self.buffers:
                    raise ValidationError(f"reads or writes an undefined array '{name}'",
                                          operator=kernel.name, where=kernel.where)
            for name in kernel.reads:
                if name not in self.inputs and name not in self.producer:
                    raise ValidationError(f"reads '{name}', which is neither a pipeline input "
                                          "nor written by any operator",
                                          operator=kernel.name, where=kernel.where)
            for param in kernel.params:
                if param.name not in self.params:
                    raise ValidationError(f"uses undeclared parameter '{param.name}'",
                                          operator=kernel.name, where=kernel.where)
            self._validate_kernel_shapes(kernel)
        dag = self.order_dag()
        try:
            cycle = nx.find_cycle(dag)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
            raise CycleError(f"the pipeline's data dependencies form a cycle: {path}")
        if not self.outputs:
            raise ValidationError(f"pipeline '{self.name}' has no outputs")
        for name in self.outputs:
            if name not in self.producer and name not in self.inputs:
                raise ValidationError(f"output '{name}' is not produced by any operator")
        for name in self.inputs:
            if not self.consumers.get(name) and name not in self.outputs:
                raise ValidationError(f"input '{name}' is declared but never used")
        needed = self._needed_kernels()
        for kernel in self.kernels:
            if kernel.name not in needed:
                raise ValidationError("its result is used by no output; return it with "
                                      "pipeline.output() or remove it",
                                      operator=kernel.name, where=kernel.where)
        return self

    def _needed_kernels(self) -> set[str]:
        needed: set[str] = set()
        stack = [self.producer[n] for n in self.outputs if n in self.producer]
        while stack:
            name = stack.pop()
            if name in needed:
                continue
            needed.add(name)
            stack.extend(self.producer[b] for b in self.kernel_by_name[name].reads
                         if b in self.producer)
        return needed

    def _validate_kernel_shapes(self, kernel: Kernel) -> None:
        for access in kernel.accesses:
            if kernel.body is None:
                continue
            buffer = self.buffers[access.buffer]
            if len(access.dims) != buffer.ndim:
                raise ShapeError(f"reads {buffer.ndim}-D array '{buffer.name}' with "
                                 f"{len(access.dims)} indices", operator=kernel.name,
                                 where=kernel.where)
            for axis, dim in enumerate(access.dims):
                if axis in access.gathered:
                    continue  # (any index of the axis, through the read's mode)
                if dim >= kernel.ndim:
                    raise ShapeError(f"indexes array '{buffer.name}' by axis {dim} of a "
                                     f"{kernel.ndim}-D iteration space",
                                     operator=kernel.name, where=kernel.where)
                if buffer.shape[axis] != kernel.domain[dim] and (
                        access.scales is None or access.scales[axis] == (1, 1)):
                    raise ShapeError(
                        f"array '{buffer.name}' axis {axis} has size {buffer.shape[axis]} but "
                        f"the iteration space has {kernel.domain[dim]} there",
                        operator=kernel.name, where=kernel.where)

    # -- shapes at call time -----------------------------------------------------------------
    @cached_property
    def size_symbols(self) -> tuple[str, ...]:
        """Every size symbol of the graph's buffers and iteration spaces, in first use order."""
        symbols = [s for buffer in self.buffers.values() for s in buffer.shape]
        symbols += [s for kernel in self.kernels for s in kernel.domain]
        return tuple(dict.fromkeys(symbols))

    @cached_property
    def fixed_sizes(self) -> dict[str, int]:
        """The size symbols that are numbers (``shape=(9, n)``), with their sizes: bound as
        they are wherever sizes are."""
        return {symbol: fixed for symbol in self.size_symbols
                if (fixed := fixed_size(symbol)) is not None}

    def bind_shapes(self, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """Bind every size symbol from the shapes of the given input arrays.

        Fixed sizes (``shape=(9, n)``) are checked against the arrays and bound as they are.
        """
        sizes: dict[str, int] = {}
        for name in self.inputs:
            buffer = self.buffers[name]
            shape = tuple(input_shapes[name])
            if len(shape) != buffer.ndim:
                raise ShapeError(f"input '{name}' must be {buffer.ndim}-D, got shape {shape}")
            for axis, (symbol, size) in enumerate(zip(buffer.shape, shape, strict=True)):
                if size <= 0:
                    raise ShapeError(f"input '{name}' has an empty axis (shape {shape})")
                fixed = fixed_size(symbol)
                if fixed is not None and size != fixed:
                    raise ShapeError(f"input '{name}' must have {fixed} elements along axis "
                                     f"{axis} (a fixed size: given in its shape=, or that of "
                                     f"an array an operator combines it with), but the array "
                                     f"has {size} (shape {shape})")
                if sizes.setdefault(symbol, size) != size:
                    holders = [n for n in self.inputs if symbol in self.buffers[n].shape]
                    raise ShapeError(
                        f"inputs {', '.join(repr(h) for h in holders)} must agree in size "
                        f"'{symbol}': got {sizes[symbol]} and {size}")
        for symbol, fixed in self.fixed_sizes.items():
            sizes.setdefault(symbol, fixed)
        for symbol, given, derived in bind_derived(self.size_symbols, sizes):
            holders = [n for n in self.inputs if symbol in self.buffers[n].shape]
            raise ShapeError(
                f"input {', '.join(repr(h) for h in holders)} must have {derived} elements "
                f"along its axis of size {describe_size(symbol)} (a level of the pyramid of "
                f"the arrays it is combined with), but has {given}")
        for kernel in self.kernels:
            for symbol in kernel.domain:
                if symbol not in sizes:
                    raise ShapeError(f"size '{symbol}' is not given by any input",
                                     operator=kernel.name, where=kernel.where)
            self._check_offsets(kernel, sizes)
        return sizes

    def check_sizes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Sizes given by name for planning (``pipeline.plan(sizes=...)``), checked: every
        key a size symbol of the graph, every symbol given (fixed sizes may be left out)."""
        symbols = self.size_symbols
        listed = ", ".join(repr(s) for s in symbols)
        unknown = [key for key in sizes if key not in symbols]
        if unknown:
            raise ShapeError(f"pipeline '{self.name}' has no size named "
                             f"{', '.join(repr(u) for u in unknown)}; its sizes are {listed}")
        for symbol, size in sizes.items():
            if not is_integer_scalar(size) or size <= 0:
                raise ShapeError(f"size '{symbol}' must be a positive integer, got {size!r}")
        derived = {symbol: int(size) for symbol, size in sizes.items()}
        for symbol, given, value in bind_derived(symbols, derived):
            raise ShapeError(f"size '{symbol}' is {describe_size(symbol)} = {value} at these "
                             f"sizes, not {given}")
        checked: dict[str, int] = {}
        for symbol in symbols:
            fixed = self.fixed_sizes.get(symbol)
            size = derived.get(symbol, fixed)
            if size is None:
                missing = [s for s in symbols if s not in derived and s not in self.fixed_sizes
                           and derived_size(s) is None]
                raise ShapeError(f"sizes must give {', '.join(repr(m) for m in missing)} "
                                 f"(pipeline '{self.name}' has sizes {listed})")
            if fixed is not None and size != fixed:
                raise ShapeError(f"size '{symbol}' is fixed at {fixed}, not {size}")
            checked[symbol] = int(size)
        return checked

    def _check_offsets(self, kernel: Kernel, sizes: Mapping[str, int]) -> None:
        for access in kernel.accesses:
            if access.remapped:  # (any distance outside follows the mode)
                continue
            buffer = self.buffers[access.buffer]
            for axis, radius in enumerate(access.radius):
                size = sizes[buffer.shape[axis]]
                if radius >= size:
                    raise ShapeError(
                        f"reads '{buffer.name}' at offset {radius} along axis {axis}, but that "
                        f"axis has only {size} elements", operator=kernel.name,
                        where=kernel.where)

    def shape_of(self, buffer: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(sizes[symbol] for symbol in self.buffers[buffer].shape)

    def nbytes(self, buffer: str, sizes: Mapping[str, int]) -> int:
        """Bytes of ``buffer`` at these sizes (its elements times its dtype's size)."""
        return math.prod(self.shape_of(buffer, sizes)) * ITEM_SIZE[self.buffers[buffer].dtype]
