"""CUDA C kernels for groups of operators: one operator alone, or several fused.

A group's kernel evaluates its members at each point of their common iteration space.
A read of a buffer produced inside the group is answered by evaluating the producer
right there (an intermediate in a register); a read at an offset evaluates the producer
at the neighbouring point, after mapping that point with the *consumer's* boundary mode
(Qiao 2021's index exchange), so fused results equal unfused ones at every border pixel.
Each distinct (producer, point) is evaluated once per thread (common subexpressions).

Code shapes:
- no stencil reads anywhere: a flat grid-stride loop;
- stencils or broadcast reads: 2-D or 3-D thread tiles (64 x 4), several points per thread
  along the outermost axis sharing their loads and intermediates;
- a reduction over trailing axes (or all): a block per row segment, warp-shuffle block
  reduction, one atomic per block into an output set to the identity first;
- a reduction over a leading or middle axis: one thread per output element looping over
  the reduced axis (coalesced), split across ``gridDim.y`` with atomics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kfuse.analysis.operations import tile_reach
from kfuse.codegen import marching
from kfuse.codegen.cexpr import (
    VECTOR_TYPES,
    Coordinate,
    ExprEmitter,
    c_name,
    comment_text,
    coordinate_text,
    element_store,
    indent,
    param_list,
    size_var,
    sizes_of,
)
from kfuse.codegen.program import (
    GRID_LIMITS,
    GridAxis,
    KernelParam,
    KernelSource,
    LaunchSpec,
    launch_bounds,
)
from kfuse.codegen.scales import Scaled, factor_out_constants, materialise
from kfuse.errors import FusionError
from kfuse.ir.cnames import GroupNames
from kfuse.ir.expr import C_TYPES, ITEM_SIZE, Expr, Load, count_operations, format_value
from kfuse.ir.graph import Graph, Kernel
from kfuse.ir.reduce_ops import REDUCE_OP_CODE, identity_text, identity_value
from kfuse.schedule import tiles
from kfuse.schedule.forms import Form, Single, Staged, Streamed, Tiled, reads_only_at_points
from kfuse.schedule.marching import marches

MAP_BLOCK_1D = 256
REDUCE_BLOCK = 256
REDUCE_COORDS = {0: (), 1: ("ix",), 2: ("iy", "ix"), 3: ("iz", "iy", "ix")}


class KernelGroup(GroupNames):
    """The operators one generated kernel computes, and the buffers it writes to memory."""

    def __init__(self, graph: Graph, members: Sequence[str], outputs: Sequence[str]):
        self.graph = graph
        self.members = tuple(graph.kernel_by_name[name] for name in members)
        self.outputs = tuple(outputs)
        self.produced = {name: kernel for kernel in self.members for name in kernel.writes}
        reductions = [k for k in self.members if k.reduction is not None]
        self.reduction: Kernel | None = reductions[0] if reductions else None
        self.domain = self.members[-1].domain
        # map output buffer -> the expression stored (its member's body unless that leaves
        # out a constant factor: kfuse.codegen.scales)
        self.stored: dict[str, Expr] = {name: self.produced[name].body  # type: ignore[misc]
                                        for name in self.outputs
                                        if self.produced[name] is not self.reduction}

    def without_constant_factors(self) -> KernelGroup:
        """The same group computing its intermediates without their constant factors, each
        output's factor multiplied in where it is stored (:mod:`kfuse.codegen.scales`)."""
        names = [kernel.name for kernel in self.members]
        graph, factors = factor_out_constants(self.graph, names)
        group = KernelGroup(graph, names, self.outputs)
        group.stored = {name: body if factors[name] == 1.0 else
                        materialise(Scaled(factors[name], body), body.dtype)
                        for name, body in group.stored.items()}
        return group


    @property
    def ndim(self) -> int:
        return len(self.domain)

    def is_flat(self) -> bool:
        """True if every read is at the current point of a domain-shaped or 0-d buffer."""
        return reads_only_at_points(self.graph, [kernel.name for kernel in self.members])

    def describe(self) -> list[str]:
        """Comment lines saying what the kernel computes and where the user wrote it."""
        fused = len(self.members) > 1
        lines = [f"// kfuse {'fused kernel' if fused else 'operator'} of pipeline "
                 f"'{self.graph.name}': {', '.join(k.name for k in self.members)}"]
        for kernel in self.members:
            prefix = f"//   [{kernel.name}] " if fused else "//   "
            lines.append(f"{prefix}{kernel.kind}" + (f", written at {comment_text(kernel.where)}"
                                                     if kernel.where else ""))
            for access in kernel.accesses:
                radius = access.radius if access.remapped else \
                    kernel.halo_radius(access.buffer)
                modes = sorted({str(b) for b in access.boundaries if b is not None})
                source = "in registers" if access.buffer in self.produced else "from memory"
                detail = (f"radius {radius}, boundary {', '.join(modes)}" if any(radius)
                          else "at the point")
                if access.remapped:
                    scales = access.scales or ((1, 1),) * len(access.dims)
                    points = ", ".join("a value" if axis in access.gathered else "p" if
                                       scale == (1, 1) else f"{scale[0]}p" if
                                       scale[1] == 1 else f"p/{scale[1]}"
                                       for axis, scale in enumerate(scales))
                    detail = f"at ({points}) of its grid, " + (
                        detail if any(radius) else f"boundary {', '.join(modes)}")
                lines.append(f"{prefix}  reads '{access.buffer}' {source}: {detail}")
            if kernel.reduction:
                lines.append(f"{prefix}  {kernel.reduction.op}-reduces iteration axes "
                             f"{kernel.reduction.axes}")
        lines.append(f"//   writes {', '.join(repr(o) for o in self.outputs)}")
        return lines

    def parameters(self) -> tuple[KernelParam, ...]:
        """The kernel's arguments: buffers, sizes and runtime parameters."""
        # (an intermediate evaluated where read at another resolution or a computed index
        # maps the read by its own sizes)
        symbols = sizes_of(self.graph, self.reads + list(self.outputs) + list(self.produced),
                           self.domain)
        params = param_list(self.graph, self.reads, list(self.outputs), symbols, self.params)
        return tuple(KernelParam(*p) for p in params)

    def source(self, bounds: str, params: tuple[KernelParam, ...], body: list[str],
               preamble: list[str] | None = None) -> KernelSource:
        """The group's kernel: ``body`` (unindented) under its description (or ``preamble``)."""
        return KernelSource(tuple(self.describe() if preamble is None else preamble),
                            self.symbol, bounds, params, tuple(indent(body, 1)))

    # -- evaluation -------------------------------------------------------------------------
    def emitter(self, coords: tuple[Coordinate, ...], flat_index: str | None) -> ExprEmitter:
        return ExprEmitter(self.graph, coords, self.domain, flat_index, self.answer_read)

    def answer_read(self, load: Load, emitter: ExprEmitter) -> str | None:
        """Evaluate an intermediate of the group at the read's point (index exchange)."""
        producer = self.produced.get(load.buffer)
        if producer is None:
            return None
        dtype = producer.body.dtype  # type: ignore[union-attr]
        # (a producer never has fewer axes than its reader in a group: an identity read is
        # at the reader's own point, which flat kernels address by one flat index)
        here = load.is_centered and load.dims == tuple(range(len(load.dims)))
        if not here:  # the producer where the read's boundary mode puts it
            coords, inside = self.mapped_point(load, emitter)
            emitter = emitter.at(coords)
        emitter.state.evaluated.add((producer.name, emitter.coords))
        value = emitter.emit(producer.body)  # type: ignore[arg-type]
        value = emitter.state.formed(value, dtype)
        return value if here else self.guarded(load, emitter, value, inside)

    def mapped_point(self, load: Load, emitter: ExprEmitter
                     ) -> tuple[tuple[Coordinate, ...], list[str]]:
        """The read's point on its producer's axes, mapped by the read's boundary mode (index
        exchange), and the inside flags that constant mode needs. An axis read at an offset
        stays a shift of the reader's coordinate where the kernel knows it inside; one read
        at another resolution or at a computed index (the producer evaluated where read)
        becomes an index variable."""
        coords, inside = [], []
        buffer = self.graph.buffers[load.buffer]
        computed = iter(load.children())
        for axis, (dim, offset) in enumerate(zip(load.dims, load.offsets, strict=True)):
            size = size_var(buffer.shape[axis])
            if load.indices is not None and load.indices[axis] is not None:
                index, flag = emitter.computed_index(emitter.emit(next(computed)), offset, size,
                                                     load)
                coord: Coordinate = (index, 0)
            elif load.scale(axis) != (1, 1):
                index, flag = emitter.scaled_index(emitter.coords[dim], load.scale(axis),
                                                   offset, size, load)
                coord = (index, 0)
            else:
                coord, flag = emitter.shifted(emitter.coords[dim], offset, size, load)
            coords.append(coord)
            if flag:
                inside.append(flag)
        return tuple(coords), inside

    @staticmethod
    def guarded(load: Load, emitter: ExprEmitter, value: str, inside: list[str]) -> str:
        """``value``, or the constant of a constant-mode read whose point is outside."""
        if not inside:
            return value
        constant = format_value(load.boundary.value, load.dtype)  # type: ignore[union-attr]
        ref_of = emitter.state.ref_of
        return emitter.define(load.dtype, f"({' && '.join(inside)}) ? {value} : {constant}",
                              prefix=f"x_{load.buffer}_",
                              key=("inside", ref_of(value), constant,
                                   *(ref_of(flag) for flag in inside)),
                              refs=emitter.state.reads_of(value, *inside))

    def store_values(self, emitter: ExprEmitter) -> list[tuple[str, str]]:
        """Evaluate every map output at the emitter's point: (buffer, C value) pairs."""
        values = []
        for name, body in self.stored.items():
            emitter.state.evaluated.add((self.produced[name].name, emitter.coords))
            values.append((name, emitter.emit(body)))
        return values

    def store_lines(self, emitter: ExprEmitter, address: str) -> list[str]:
        """Evaluate every map output at the emitter's point and store it."""
        return [self.store_line(name, value, address)
                for name, value in self.store_values(emitter)]

    def store_line(self, name: str, value: str, address: str) -> str:
        """The statement storing ``value`` at ``address`` of the output ``name``."""
        return f"{c_name(name)}[{address}] = {element_store(value, self.graph.buffers[name].dtype)};"


def _domain_count(domain: tuple[str, ...]) -> str:
    if not domain:
        return "1"
    return " * ".join(["(kf_index_t)" + size_var(domain[0])] + [size_var(s) for s in domain[1:]])


def _flat_address(sizes: tuple[str, ...], coords: tuple[Coordinate, ...]) -> str:
    texts = [coordinate_text(c) for c in coords]
    if len(texts) == 1:
        return texts[0]
    address = f"(kf_index_t){texts[0]}"
    for size, text in zip(sizes[1:], texts[1:], strict=True):
        address = f"({address}) * {size} + {text}"
    return address


def _items_code(group: KernelGroup, points: list[tuple[tuple[Coordinate, ...], str | None]],
                sizes: tuple[str, ...], in_range: dict[str, tuple[int, int]],
                vector_columns: int = 0, multiples: Mapping[str, int] | None = None
                ) -> list[str]:
    """Straight-line code computing the group's outputs at several points of one thread.

    Every point's loads and arithmetic come first and the stores last, so independent loads
    are in flight together; values shared between points (rows of a stencil) are computed
    once. With ``vector_columns`` (points in rows of that many consecutive columns, from
    ``ix``, alignment checked by the caller) each row of an input is one vector load and
    each row of an output one vector store. ``multiples``: base coordinates known to be
    multiples of a number (a tile's origin), which reads at another resolution exploit.
    """
    emitter, stores, _ = items_emitted(group, points, sizes, in_range, vector_columns,
                                       multiples=multiples)
    return emitter.lines + stores


def items_emitted(group: KernelGroup, points: list[tuple[tuple[Coordinate, ...], str | None]],
                  sizes: tuple[str, ...], in_range: dict[str, tuple[int, int]],
                  vector_columns: int = 0, staged: frozenset[str] = frozenset(),
                  multiples: Mapping[str, int] | None = None
                  ) -> tuple[ExprEmitter, list[str], list[str]]:
    """(emitter holding the value statements, store lines, the values they store) of
    :func:`_items_code`; reads of ``staged`` buffers are left as address markers
    (:mod:`kfuse.codegen.marching`)."""
    emitter = group.emitter(points[0][0], points[0][1])
    emitter.state.in_range.update(in_range)
    emitter.state.vector_columns = vector_columns
    emitter.state.staged = staged
    emitter.state.multiples.update(multiples or {})
    stores, stored = [], []
    rows: dict[tuple, dict[str, list[str]]] = {}
    for coords, flat in points:
        point = emitter.at(coords, flat)
        address = flat if flat else _flat_address(sizes, coords)
        for name, value in group.store_values(point):
            stored.append(value)
            if vector_columns:
                rows.setdefault(coords[:-1], {}).setdefault(name, []).append(value)
            else:
                stores.append(group.store_line(name, value, address))
    for row, outputs in rows.items():
        address = _flat_address(sizes, (*row, ("ix", 0)))
        for name, values in outputs.items():
            dtype = group.graph.buffers[name].dtype
            vector_type = VECTOR_TYPES[(dtype, vector_columns)]
            cast = ", ".join(f"({C_TYPES[dtype]}){v}" for v in values)
            stores.append(f"*reinterpret_cast<{vector_type}*>(&{c_name(name)}[{address}]) = "
                          f"{vector_type}{{{cast}}};")
    return emitter, stores, stored


def map_kernel(group: KernelGroup, form: Tiled, march: bool = False
               ) -> tuple[KernelSource, LaunchSpec]:
    """Point and stencil operators (fused or not): several points per thread (``form``'s
    register tile and block, the defaults of :mod:`kfuse.schedule.tiles` where it names
    none); with ``march``, 3-D recompute groups have their threads march along z where they
    can (:func:`kfuse.schedule.marching.marches`)."""
    if group.is_flat() or group.ndim <= 1:
        return _linear_kernel(group, form.block[0] * form.block[1] if form.block
                              else MAP_BLOCK_1D)
    tile, block = form.shape(group.members, group.ndim)
    kernel, launch = _tiled_kernel(group, tile, block, form.borders == "partitioned")
    if march and marches(group.graph, [k.name for k in group.members], group.outputs, form):
        # 3-D chains march along z; the register tiles serve the sizes marching does not
        fallback = [line[2:] for line in kernel.body]
        return marching.marching_kernel(group, fallback) or (kernel, launch)
    return kernel, launch


def _linear_kernel(group: KernelGroup, threads: int = 0) -> tuple[KernelSource, LaunchSpec]:
    """A flat grid-stride loop in blocks of ``threads`` (0: :data:`MAP_BLOCK_1D`); each
    thread takes points ``blockDim.x`` apart (coalesced)."""
    threads = threads or MAP_BLOCK_1D
    flat = group.is_flat()
    special = any(count_operations(k.body)["sfu"] for k in group.members if k.body is not None)
    items = tiles.items_per_thread(special)
    sizes = tuple(size_var(s) for s in group.domain)
    fast_points = [(((f"i{k}", 0),), f"i{k}" if flat else None) for k in range(items)]
    fast = [f"const kf_index_t i{k} = base + {k} * (kf_index_t)blockDim.x;" for k in range(items)]
    fast += _items_code(group, fast_points, sizes, {})
    single = _items_code(group, [((("i", 0),), "i" if flat else None)], sizes, {})
    params = group.parameters()
    body = [
        f"const kf_index_t count = {_domain_count(group.domain)};",
        f"const kf_index_t step = (kf_index_t)gridDim.x * blockDim.x * {items};",
        f"for (kf_index_t base = (kf_index_t)blockIdx.x * blockDim.x * {items} + threadIdx.x;",
        "     base < count; base += step) {",
        f"  if (base + {items - 1} * (kf_index_t)blockDim.x < count) {{",
        f"    // {items} points per thread, all loads issued before the stores",
        *indent(fast, 2),
        "  } else {",
        "    for (kf_index_t i = base; i < count; i += blockDim.x) {",
        *indent(single, 3),
        "    }",
        "  }",
        "}",
    ]
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (threads, 1, 1),
                        (GridAxis(group.domain, threads * items), GridAxis(), GridAxis()))
    return group.source(launch_bounds(threads), params, body), launch


def _tiled_kernel(group: KernelGroup, tile: tuple[int, ...], block: tuple[int, int],
                  partitioned: bool = False) -> tuple[KernelSource, LaunchSpec]:
    """2-D/3-D blocks of ``block`` (x, y) threads over the two innermost axes.

    Each thread computes a register tile of points: ``tile[0]`` consecutive points along
    the outermost axis (rows of an image, planes of a volume), ``tile[-1]`` along the
    innermost axis and, in 3-D, ``tile[1]`` along the middle axis. The stencil taps and
    intermediates its points share are loaded or computed once and kept in registers.
    ``partitioned``: threads whose tile and halo lie inside on every axis read with no
    boundary handling (:mod:`kfuse.schedule.borders`); the others keep the edge test.
    """
    rows, columns = tile[0], tile[-1]
    block_x, block_y = block
    middle_count = tile[1] if group.ndim == 3 else 1
    sizes = tuple(size_var(s) for s in group.domain)
    outer = "iz" if group.ndim == 3 else "iy"
    fast_points = [(((outer, k), *((("iy", m),) if group.ndim == 3 else ()), ("ix", c)), None)
                   for k in range(rows) for m in range(middle_count) for c in range(columns)]
    middle = (("iy_k", 0),) if group.ndim == 3 else ()
    single_point = (((f"{outer}_k", 0), *middle, ("ix_k", 0)), None)
    in_range = {outer: (0, rows - 1), "ix": (0, columns - 1)}
    # the tile's origin: rows, (middle points,) columns per thread from 0
    multiples = {outer: rows, "ix": columns}
    if group.ndim == 3:
        in_range["iy"] = (0, middle_count - 1)
        multiples["iy"] = middle_count
    fast = _items_code(group, fast_points, sizes, in_range, multiples=multiples)
    aligned = _vector_condition(group, columns)
    edge_lines: list[str] = []
    reached = reach(group, tile) if aligned or partitioned else []
    if aligned:
        # in 2-D, warps away from the left and right edges read their halo columns as whole
        # aligned vectors too, with no boundary mode to apply along the rows (in 3-D rows
        # are short: two of the four warps of a 512-wide row would take the other path;
        # measured 4% slower for diffusion3d, docs/journal/benchmarks.md, session 12)
        left, right = _whole_vectors(reached[-1], columns) if group.ndim == 2 else (0, 0)
        edge_lines, interior = _warp_edge_test(block_x, columns, left, right, sizes[-1])
        vector = _items_code(group, fast_points, sizes,
                             in_range | {"ix": (-left, columns - 1 + right)}, columns,
                             multiples)
        fast = [f"if ({' && '.join([aligned, *interior])}) {{",
                f"  // rows of {columns} columns: one aligned vector load or store each",
                *indent(vector, 1), "} else {", *indent(fast, 1), "}"]
    if partitioned:
        # the interior region first: the thread's tile and every point it reads inside on
        # every axis (along x by warps), no boundary modes; the rest as above
        left, right = _whole_vectors(reached[-1], columns) if aligned else reached[-1]
        warp_lines, interior = _warp_edge_test(block_x, columns, left, right, sizes[-1])
        edge_lines = edge_lines or warp_lines
        inside_ranges = in_range | {"ix": (-left, columns - 1 + right)}
        for axis, base in enumerate([outer, "iy"][:group.ndim - 1]):
            before, after = reached[axis]
            inside_ranges[base] = (-before, tile[axis] - 1 + after)
            interior += ([f"{base} >= {before}"] if before else []) + (
                [f"{base} + {tile[axis] - 1 + after} < {sizes[axis]}"] if after else [])
        conditions = [aligned] if aligned else []
        conditions += interior
        if conditions:
            inside = _items_code(group, fast_points, sizes, inside_ranges,
                                 columns if aligned else 0, multiples)
            fast = [f"if ({' && '.join(conditions)}) {{",
                    "  // tile and halo inside on every axis: no boundary modes"
                    + (f"; rows of {columns} columns as aligned vectors" if aligned else ""),
                    *indent(inside, 1), "} else {", *indent(fast, 1), "}"]
    single = _items_code(group, [single_point], sizes, {})
    extent, width = sizes[0], sizes[-1]
    block_index = "blockIdx.y" if group.ndim == 2 else "blockIdx.z"
    block_count = "gridDim.y" if group.ndim == 2 else "gridDim.z"
    thread = " * blockDim.y + threadIdx.y" if group.ndim == 2 else ""
    step = f"{block_count} * blockDim.y * {rows}" if group.ndim == 2 \
        else f"{block_count} * {rows}"
    last_column = f"ix + {columns - 1}" if columns > 1 else "ix"
    inside = f"{outer} + {rows - 1} < {extent} && {last_column} < {width}"
    middle_loop = []
    if group.ndim == 3:
        inside += f" && iy + {middle_count - 1} < {sizes[1]}"
        middle_loop = [f"    for (int iy_k = iy; iy_k < {sizes[1]} && iy_k < iy + "
                       f"{middle_count}; ++iy_k)"]
    shape = " x ".join(str(n) for n in (rows, *([middle_count] if group.ndim == 3 else []),
                                          columns))
    outer_loop = [
        f"for (int {outer} = ({block_index}{thread}) * {rows}; {outer} < {extent};",
        f"     {outer} += {step}) {{",
        f"  if ({inside}) {{",
        f"    // a {shape} register tile: points share taps and intermediates",
        *indent(fast, 2),
        "  } else {",
        f"    for (int {outer}_k = {outer}; {outer}_k < {extent} && {outer}_k < {outer} + {rows};"
        f" ++{outer}_k)",
        *middle_loop,
        f"    for (int ix_k = ix; ix_k < {width} && ix_k < ix + {columns}; ++ix_k) {{",
        *indent(single, 3),
        "    }",
        "  }",
        "}",
    ]
    params = group.parameters()
    first_column = f"(blockIdx.x * blockDim.x + threadIdx.x) * {columns}" if columns > 1 \
        else "blockIdx.x * blockDim.x + threadIdx.x"
    body = [f"const int ix = {first_column};", f"if (ix >= {width}) return;", *edge_lines]
    if group.ndim == 2:
        body += outer_loop
        grid = (GridAxis((group.domain[1],), block_x * columns),
                GridAxis((group.domain[0],), block_y * rows, GRID_LIMITS[1]), GridAxis())
    else:
        first_row = "(blockIdx.y * blockDim.y + threadIdx.y)" + (
            f" * {middle_count}" if middle_count > 1 else "")
        body += [f"for (int iy = {first_row}; iy < {sizes[1]}; "
                 f"iy += gridDim.y * blockDim.y * {middle_count}) {{",
                 *indent(outer_loop, 1), "}"]
        grid = (GridAxis((group.domain[2],), block_x * columns),
                GridAxis((group.domain[1],), block_y * middle_count, GRID_LIMITS[1]),
                GridAxis((group.domain[0],), rows, GRID_LIMITS[2]))
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (block_x, block_y, 1), grid)
    return group.source(launch_bounds(block_x * block_y, tiles.least_blocks()), params, body), launch


def _whole_vectors(reach: tuple[int, int], columns: int) -> tuple[int, int]:
    """Columns left and right of a thread's own that its aligned vector loads of
    ``columns`` take to cover ``reach``."""
    return tuple(-(-side // columns) * columns for side in reach)  # type: ignore[return-value]


def _warp_edge_test(block_x: int, columns: int, left: int, right: int, width: str
                    ) -> tuple[list[str], list[str]]:
    """(statements, conditions): whether a thread's whole warp is ``left`` columns or more
    from the image's left edge and ``right`` from its right edge.

    The test is the warp's, not the thread's: a warp with one thread at an edge would
    otherwise run both the vector path and the edge path, one after the other (the edge
    warps of Shi-Tomasi at 8192² ran 3.5% of all its instructions on one thread). A warp
    holds 32 consecutive threads along x where blocks are a multiple of 32 wide; otherwise
    the block's columns are taken, which contain the warp's.
    """
    if not left and not right:
        return [], []
    # the warp's first column as ix less the lane's columns (from blockIdx it took Sobel's
    # kernel 8 registers more, nvcc 13 for sm_90)
    if block_x % 32 == 0:
        before, last = "threadIdx.x & 31u", 31
    else:
        before, last = "threadIdx.x", block_x - 1
    lines = ["// the first columns of the first and last threads of this thread's warp: the",
             "// warp takes one path, interior or edge, as a whole",
             f"const int warp_ix = ix - (int)({before}) * {columns};",
             f"const int warp_ix_last = warp_ix + {last * columns};"]
    conditions = [f"warp_ix >= {left}"] if left else []
    conditions += [f"warp_ix_last + {columns + right} <= {width}"] if right else []
    return lines, conditions


def reach(group: KernelGroup, tile: tuple[int, ...]) -> list[tuple[int, int]]:
    """Per axis, how many points before a thread's first and after its last point (of a
    register tile ``tile``) the thread evaluates a member at or loads an input from."""
    return tile_reach(group.graph, tuple(k.name for k in group.members), group.outputs, tile)


def _vector_condition(group: KernelGroup, columns: int) -> str | None:
    """C condition under which a thread's columns of every domain-shaped buffer it reads or
    writes are one aligned vector (None where vectors do not apply)."""
    buffers = [name for name in [*group.reads, *group.outputs]
               if group.graph.buffers[name].shape == group.domain]
    dtypes = {group.graph.buffers[name].dtype for name in buffers}
    if not buffers or any((dtype, columns) not in VECTOR_TYPES for dtype in dtypes):
        return None
    width = size_var(group.domain[-1])
    terms = [f"{width} % {columns} == 0"]
    for name in buffers:
        vector_bytes = columns * ITEM_SIZE[group.graph.buffers[name].dtype]
        terms.append(f"kf_pointer_aligned({c_name(name)}, {vector_bytes})")
    return " && ".join(terms)


def _decode(flat: str, axes: list[int], domain: tuple[str, ...], coords: tuple[str, ...]
            ) -> list[str]:
    """Statements that split a row-major flat index over ``axes`` into coordinates."""
    lines = []
    rest = flat
    for position, axis in enumerate(reversed(axes)):
        size = size_var(domain[axis])
        if position == len(axes) - 1:
            lines.append(f"const int {coords[axis]} = (int)({rest});")
        else:
            lines.append(f"const int {coords[axis]} = (int)({rest} % {size});")
            rest = f"({rest} / {size})"
    return lines


def _product(domain: tuple[str, ...], axes: list[int]) -> str:
    if not axes:
        return "1"
    return " * ".join(["(kf_index_t)" + size_var(domain[axes[0]])]
                      + [size_var(domain[a]) for a in axes[1:]])


def reduce_kernel(group: KernelGroup) -> tuple[KernelSource, LaunchSpec]:
    """A reduction, with the map operators it reads fused into its loop."""
    kernel = group.reduction
    assert kernel is not None and kernel.reduction is not None
    graph, domain = group.graph, group.domain
    op, axes = kernel.reduction.op, kernel.reduction.axes
    dtype_name = graph.buffers[kernel.output].dtype
    ctype = C_TYPES[dtype_name]
    output = c_name(kernel.output)
    code = REDUCE_OP_CODE[op]
    identity = identity_text(op, dtype_name)
    names = REDUCE_COORDS[group.ndim]
    coords = tuple((name, 0) for name in names)
    sizes = tuple(size_var(s) for s in domain)
    kept = [axis for axis in range(group.ndim) if axis not in axes]
    params = group.parameters()
    initial = ((kernel.output, identity_value(op, dtype_name)),)
    trailing = list(axes) == list(range(group.ndim - len(axes), group.ndim))
    if trailing:
        flat = not kept and group.is_flat()
        emitter = group.emitter(coords, "r" if flat else None)
        emitter.state.evaluated.add((kernel.name, emitter.coords))
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        stores = group.store_lines(emitter, "r" if flat else _flat_address(sizes, coords))
        decode_row = _decode("row", kept, domain, names) if kept else []
        decode_r = [] if flat else _decode("r", list(axes), domain, names)
        body = [
            f"const kf_index_t rows = {_product(domain, kept)};",
            f"const kf_index_t length = {_product(domain, list(axes))};",
            "for (kf_index_t row = blockIdx.y; row < rows; row += gridDim.y) {",
            *indent(decode_row, 1),
            f"  {ctype} acc = {identity};",
            "  for (kf_index_t r = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x; r < length;",
            "       r += (kf_index_t)gridDim.x * blockDim.x) {",
            *indent(decode_r + emitter.lines + stores, 2),
            f"    acc = kf_combine<{code}, {ctype}>(acc, ({ctype}){value});",
            "  }",
            f"  acc = kf_block_reduce<{code}, {ctype}>(acc, {identity});",
            f"  if (threadIdx.x == 0) kf_atomic_{op}(&{output}[row], acc);",
            "}",
        ]
        reduced = tuple(domain[a] for a in axes)
        grid = (GridAxis(reduced, REDUCE_BLOCK * 8, 1024 if not kept else 32),
                GridAxis(tuple(domain[a] for a in kept), 1, GRID_LIMITS[1]), GridAxis())
    else:
        (axis,) = axes
        before, after = list(range(axis)), list(range(axis + 1, group.ndim))
        emitter = group.emitter(coords, None)
        emitter.state.evaluated.add((kernel.name, emitter.coords))
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        stores = group.store_lines(emitter, _flat_address(sizes, coords))
        decode = _decode("j", before + after, domain, names)
        size = size_var(domain[axis])
        body = [
            f"const kf_index_t outputs = {_product(domain, before + after)};",
            "const kf_index_t j = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x;",
            "if (j >= outputs) return;",
            *decode,
            f"{ctype} acc = {identity};",
            f"for (int {names[axis]} = blockIdx.y; {names[axis]} < {size}; "
            f"{names[axis]} += gridDim.y) {{",
            *indent(emitter.lines + stores, 1),
            f"  acc = kf_combine<{code}, {ctype}>(acc, ({ctype}){value});",
            "}",
            f"kf_atomic_{op}(&{output}[j], acc);",
        ]
        grid = (GridAxis(tuple(domain[a] for a in before + after), REDUCE_BLOCK),
                GridAxis((domain[axis],), 64, 1024), GridAxis())
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (REDUCE_BLOCK, 1, 1), grid, initial, blocks_walk=True)
    return group.source(launch_bounds(REDUCE_BLOCK), params, body), launch


def group_kernel(group: KernelGroup, form: Form | None = None, march: bool = False
                 ) -> tuple[KernelSource, LaunchSpec]:
    """The kernel of one group under ``form`` (None: the default, :class:`Single`'s
    tiles): reduction, staged (shared memory) or map template (``march``: 3-D recompute
    groups march along z where they can)."""
    if any(k.kind == "opaque" for k in group.members):
        raise NotImplementedError("opaque user kernels arrive with the BLAS issue")
    if group.reduction is not None:
        return reduce_kernel(group)
    if isinstance(form, (Staged, Streamed)):  # (forms that keep intermediates on chip)
        reason = form.why_not(group.graph, [k.name for k in group.members])
        if reason:
            raise FusionError(f"group {[k.name for k in group.members]}: {reason}")
    if isinstance(form, Staged):
        from kfuse.codegen.staged import staged_kernel
        rows, block_x, block_y = form.shape
        return staged_kernel(group, rows, block_x, block_y)
    if isinstance(form, Streamed):
        from kfuse.codegen.streamed import streamed_kernel
        return streamed_kernel(group, form)
    if form is not None and not isinstance(form, Tiled):
        raise FusionError(f"group {[k.name for k in group.members]}: the {form.text()} form "
                          "is not a map or stencil kernel's")
    if len(group.members) > 1:
        group = group.without_constant_factors()
    return map_kernel(group, form or Single(), march)
