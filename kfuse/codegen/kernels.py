"""CUDA C kernels for groups of operators: one operator alone, or several fused.

A group's kernel evaluates its members at each point of their common iteration space.
A read of a buffer produced inside the group is answered by evaluating the producer
right there (an intermediate in a register); a read at an offset evaluates the producer
at the neighbouring point, after mapping that point with the *consumer's* boundary mode
(seed 002's index exchange), so fused results equal unfused ones at every border pixel.
Each distinct (producer, point) is evaluated once per thread (common subexpressions).

Code shapes:
- no stencil reads anywhere: a flat grid-stride loop;
- stencils or broadcast reads: 1-D, 2-D or 3-D thread tiles (32 x 8), coordinates per axis;
- a reduction over trailing axes (or all): a block per row segment, warp-shuffle block
  reduction, one atomic per block into an output set to the identity first;
- a reduction over a leading or middle axis: one thread per output element looping over
  the reduced axis (coalesced), split across ``gridDim.y`` with atomics.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.codegen.cexpr import (
    ExprEmitter,
    c_name,
    coord_names,
    indent,
    param_list,
    size_var,
    sizes_of,
)
from kfuse.codegen.program import GRID_LIMITS, GridAxis, KernelParam, LaunchSpec
from kfuse.ir.expr import C_TYPES, Coord, Load, format_value
from kfuse.ir.graph import Graph, Kernel

MAP_BLOCK_1D = 256
TILE_X, TILE_Y = 32, 8
REDUCE_BLOCK = 256
REDUCE_OP_CODE = {"sum": 0, "min": 1, "max": 2}
MAX_SYMBOL_LENGTH = 64


def identity_value(op: str, dtype: str) -> float:
    """The value a reduction output starts from."""
    if op == "sum":
        return 0
    if dtype == "int32":
        return 2**31 - 1 if op == "min" else -(2**31)
    return float("inf") if op == "min" else float("-inf")


def identity_text(op: str, dtype: str) -> str:
    if dtype == "int32" and op != "sum":
        return "KF_INT_MAX" if op == "min" else "KF_INT_MIN"
    return format_value(identity_value(op, dtype), dtype)


class KernelGroup:
    """The operators one generated kernel computes, and the buffers it writes to memory."""

    def __init__(self, graph: Graph, members: Sequence[str], outputs: Sequence[str]):
        self.graph = graph
        self.members = tuple(graph.kernel_by_name[name] for name in members)
        self.outputs = tuple(outputs)
        self.produced = {kernel.output: kernel for kernel in self.members}
        reductions = [k for k in self.members if k.reduction is not None]
        self.reduction: Kernel | None = reductions[0] if reductions else None
        self.domain = self.members[-1].domain

    @property
    def symbol(self) -> str:
        names = [k.name for k in self.members]
        text = "_".join(names)
        if len(text) > MAX_SYMBOL_LENGTH:
            text = "_".join(names[:3]) + f"_and_{len(names) - 3}_more"
        return c_name(f"{self.graph.name}_{text}")

    @property
    def reads(self) -> list[str]:
        """External buffers read by any member, in order of first use."""
        result: list[str] = []
        for kernel in self.members:
            for name in kernel.reads:
                if name not in self.produced and name not in result:
                    result.append(name)
        return result

    @property
    def params(self) -> list[str]:
        return sorted({p.name for k in self.members for p in k.params})

    @property
    def ndim(self) -> int:
        return len(self.domain)

    def is_flat(self) -> bool:
        """True if every read is at the current point of a domain-shaped or 0-d buffer."""
        identity = tuple(range(self.ndim))
        for kernel in self.members:
            for node in kernel.body.walk():  # type: ignore[union-attr]
                if isinstance(node, Coord):
                    return False
                if isinstance(node, Load) and node.dims and not (
                        node.dims == identity and node.is_centered):
                    return False
        return True

    def describe(self) -> list[str]:
        """Comment lines saying what the kernel computes and where the user wrote it."""
        fused = len(self.members) > 1
        lines = [f"// kfuse {'fused kernel' if fused else 'operator'} of pipeline "
                 f"'{self.graph.name}': {', '.join(k.name for k in self.members)}"]
        for kernel in self.members:
            prefix = f"//   [{kernel.name}] " if fused else "//   "
            lines.append(f"{prefix}{kernel.kind}" + (f", written at {kernel.where}"
                                                     if kernel.where else ""))
            for access in kernel.accesses:
                radius = kernel.halo_radius(access.buffer)
                modes = sorted({str(b) for b in access.boundaries if b is not None})
                source = "in registers" if access.buffer in self.produced else "from memory"
                detail = (f"radius {radius}, boundary {', '.join(modes)}" if any(radius)
                          else "at the point")
                lines.append(f"{prefix}  reads '{access.buffer}' {source}: {detail}")
            if kernel.reduction:
                lines.append(f"{prefix}  {kernel.reduction.op}-reduces iteration axes "
                             f"{kernel.reduction.axes}")
        lines.append(f"//   writes {', '.join(repr(o) for o in self.outputs)}")
        return lines

    def signature(self, block_threads: int) -> tuple[str, tuple[KernelParam, ...]]:
        symbols = sizes_of(self.graph, self.reads + list(self.outputs), self.domain)
        params = param_list(self.graph, self.reads, list(self.outputs), symbols, self.params)
        text = ", ".join(f"{ctype} {name}" for name, ctype, *_ in params)
        header = f"KF_KERNEL void __launch_bounds__({block_threads}) {self.symbol}({text})"
        return header, tuple(KernelParam(*p) for p in params)

    # -- evaluation -------------------------------------------------------------------------
    def emitter(self, coords: tuple[str, ...], flat_index: str | None) -> ExprEmitter:
        return ExprEmitter(self.graph, coords, self.domain, flat_index, self._answer_read)

    def _answer_read(self, load: Load, emitter: ExprEmitter) -> str | None:
        """Evaluate an intermediate of the group at the read's point (index exchange)."""
        producer = self.produced.get(load.buffer)
        if producer is None:
            return None
        coords, inside = [], []
        buffer = self.graph.buffers[load.buffer]
        for axis, offset in enumerate(load.offsets):
            index, flag = emitter.index(emitter.coords[axis], offset,
                                        size_var(buffer.shape[axis]), load)
            coords.append(index)
            if flag:
                inside.append(flag)
        target = emitter.at(tuple(coords))
        target.state.evaluated.add((producer.name, target.coords))
        value = target.emit(producer.body)  # type: ignore[arg-type]
        if not inside:
            return value
        constant = format_value(load.boundary.value, load.dtype)  # type: ignore[union-attr]
        name = emitter.fresh(f"x_{load.buffer}_")
        emitter.lines.append(f"const {C_TYPES[load.dtype]} {name} = ({' && '.join(inside)}) ? "
                             f"{value} : {constant};")
        return name

    def store_lines(self, emitter: ExprEmitter, address: str) -> list[str]:
        """Evaluate every map output at the emitter's point and store it."""
        stores = []
        for name in self.outputs:
            kernel = self.produced[name]
            if kernel is self.reduction:
                continue
            emitter.state.evaluated.add((kernel.name, emitter.coords))
            value = emitter.emit(kernel.body)  # type: ignore[arg-type]
            ctype = C_TYPES[self.graph.buffers[name].dtype]
            stores.append(f"{c_name(name)}[{address}] = ({ctype}){value};")
        return stores


def _domain_count(domain: tuple[str, ...]) -> str:
    if not domain:
        return "1"
    return " * ".join(["(kf_index_t)" + size_var(domain[0])] + [size_var(s) for s in domain[1:]])


def _flat_address(sizes: tuple[str, ...], coords: tuple[str, ...]) -> str:
    if len(coords) == 1:
        return coords[0]
    address = f"(kf_index_t){coords[0]}"
    for size, coord in zip(sizes[1:], coords[1:], strict=True):
        address = f"({address}) * {size} + {coord}"
    return address


def map_kernel(group: KernelGroup) -> tuple[list[str], LaunchSpec]:
    """Point and stencil operators (fused or not): one point per thread and iteration."""
    operators = tuple(k.name for k in group.members)
    if group.is_flat() or group.ndim <= 1:
        flat = group.is_flat()
        emitter = group.emitter(("i",) if group.ndim == 1 else (), "i" if flat else None)
        stores = group.store_lines(emitter, "i")
        header, params = group.signature(MAP_BLOCK_1D)
        body = [
            f"const kf_index_t count = {_domain_count(group.domain)};",
            "for (kf_index_t i = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;",
            "     i += (kf_index_t)gridDim.x * blockDim.x) {",
            *indent(emitter.lines + stores, 1),
            "}",
        ]
        launch = LaunchSpec(group.symbol, operators, params, (MAP_BLOCK_1D, 1, 1),
                            (GridAxis(group.domain, MAP_BLOCK_1D), GridAxis(), GridAxis()))
        return [*group.describe(), header, "{", *indent(body, 1), "}"], launch

    coords = coord_names(group.ndim)
    sizes = tuple(size_var(s) for s in group.domain)
    emitter = group.emitter(coords, None)
    stores = group.store_lines(emitter, _flat_address(sizes, coords))
    header, params = group.signature(TILE_X * TILE_Y)
    inner = emitter.lines + stores
    if group.ndim == 2:
        y, x = coords
        body = [
            f"const int {x} = blockIdx.x * blockDim.x + threadIdx.x;",
            f"if ({x} >= {sizes[1]}) return;",
            f"for (int {y} = blockIdx.y * blockDim.y + threadIdx.y; {y} < {sizes[0]}; "
            f"{y} += gridDim.y * blockDim.y) {{",
            *indent(inner, 1),
            "}",
        ]
        grid = (GridAxis((group.domain[1],), TILE_X),
                GridAxis((group.domain[0],), TILE_Y, GRID_LIMITS[1]), GridAxis())
    else:
        z, y, x = coords
        body = [
            f"const int {x} = blockIdx.x * blockDim.x + threadIdx.x;",
            f"if ({x} >= {sizes[2]}) return;",
            f"for (int {z} = blockIdx.z; {z} < {sizes[0]}; {z} += gridDim.z) {{",
            f"  for (int {y} = blockIdx.y * blockDim.y + threadIdx.y; {y} < {sizes[1]}; "
            f"{y} += gridDim.y * blockDim.y) {{",
            *indent(inner, 2),
            "  }",
            "}",
        ]
        grid = (GridAxis((group.domain[2],), TILE_X),
                GridAxis((group.domain[1],), TILE_Y, GRID_LIMITS[1]),
                GridAxis((group.domain[0],), 1, GRID_LIMITS[2]))
    launch = LaunchSpec(group.symbol, operators, params, (TILE_X, TILE_Y, 1), grid)
    return [*group.describe(), header, "{", *indent(body, 1), "}"], launch


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


def reduce_kernel(group: KernelGroup) -> tuple[list[str], LaunchSpec]:
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
    coords = coord_names(group.ndim)
    sizes = tuple(size_var(s) for s in domain)
    kept = [axis for axis in range(group.ndim) if axis not in axes]
    header, params = group.signature(REDUCE_BLOCK)
    initial = ((kernel.output, identity_value(op, dtype_name)),)
    trailing = list(axes) == list(range(group.ndim - len(axes), group.ndim))
    if trailing:
        flat = not kept and group.is_flat()
        emitter = group.emitter(coords, "r" if flat else None)
        emitter.state.evaluated.add((kernel.name, emitter.coords))
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        stores = group.store_lines(emitter, "r" if flat else _flat_address(sizes, coords))
        decode_row = _decode("row", kept, domain, coords) if kept else []
        decode_r = [] if flat else _decode("r", list(axes), domain, coords)
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
        decode = _decode("j", before + after, domain, coords)
        size = size_var(domain[axis])
        body = [
            f"const kf_index_t outputs = {_product(domain, before + after)};",
            "const kf_index_t j = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x;",
            "if (j >= outputs) return;",
            *decode,
            f"{ctype} acc = {identity};",
            f"for (int {coords[axis]} = blockIdx.y; {coords[axis]} < {size}; "
            f"{coords[axis]} += gridDim.y) {{",
            *indent(emitter.lines + stores, 1),
            f"  acc = kf_combine<{code}, {ctype}>(acc, ({ctype}){value});",
            "}",
            f"kf_atomic_{op}(&{output}[j], acc);",
        ]
        grid = (GridAxis(tuple(domain[a] for a in before + after), REDUCE_BLOCK),
                GridAxis((domain[axis],), 64, 1024), GridAxis())
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (REDUCE_BLOCK, 1, 1), grid, initial, uses_block_sync=trailing)
    return [*group.describe(), header, "{", *indent(body, 1), "}"], launch


def group_kernel(group: KernelGroup) -> tuple[list[str], LaunchSpec]:
    """The kernel of one group: a reduction template if it holds a reduction, else a map."""
    if any(k.kind == "opaque" for k in group.members):
        raise NotImplementedError("opaque user kernels arrive with the BLAS issue")
    return reduce_kernel(group) if group.reduction is not None else map_kernel(group)
