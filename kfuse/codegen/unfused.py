"""One CUDA C kernel per IR kernel: elementwise maps, stencils and reductions.

Shapes of the generated code:
- point kernels whose reads are all at the current point: a flat grid-stride loop;
- stencils and broadcast reads: 1-D, 2-D or 3-D thread tiles (32 x 8), coordinates per axis;
- reductions over trailing axes (or all): a block per row segment, warp-shuffle block
  reduction, one atomic per block into an output set to the identity first;
- reductions over a leading or middle axis: one thread per output element looping over
  the reduced axis (coalesced), split across ``gridDim.y`` with atomics.
"""

from __future__ import annotations

from kfuse.codegen.cexpr import (
    ExprEmitter,
    c_name,
    coord_names,
    indent,
    param_list,
    size_var,
    sizes_of,
)
from kfuse.codegen.prelude import PRELUDE
from kfuse.codegen.program import GRID_LIMITS, GridAxis, KernelParam, LaunchSpec, Program
from kfuse.ir.expr import C_TYPES, Coord, Load, format_value
from kfuse.ir.graph import Graph, Kernel

MAP_BLOCK_1D = 256
TILE_X, TILE_Y = 32, 8
REDUCE_BLOCK = 256
REDUCE_OP_CODE = {"sum": 0, "min": 1, "max": 2}


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


def kernel_symbol(graph: Graph, kernel: Kernel) -> str:
    return c_name(f"{graph.name}_{kernel.name}")


def describe(graph: Graph, kernel: Kernel) -> list[str]:
    """Comment lines that say what a kernel computes and where the user wrote it."""
    lines = [f"// kfuse operator '{kernel.name}' ({kernel.kind}) of pipeline '{graph.name}'"]
    if kernel.where:
        lines.append(f"//   written at {kernel.where}")
    for access in kernel.accesses:
        radius = kernel.halo_radius(access.buffer)
        modes = sorted({str(b) for b in access.boundaries if b is not None})
        detail = f"radius {radius}, boundary {', '.join(modes)}" if any(radius) else "point read"
        lines.append(f"//   reads '{access.buffer}': {detail}")
    if kernel.reduction:
        lines.append(f"//   {kernel.reduction.op}-reduces iteration axes {kernel.reduction.axes}")
    lines.append(f"//   writes '{kernel.output}'")
    return lines


def _signature(graph: Graph, kernel: Kernel, symbol: str, block_threads: int
               ) -> tuple[str, tuple[KernelParam, ...]]:
    symbols = sizes_of(graph, list(kernel.reads) + list(kernel.writes), kernel.domain)
    params = param_list(graph, list(kernel.reads), list(kernel.writes), symbols,
                        [p.name for p in kernel.params])
    text = ", ".join(f"{ctype} {name}" for name, ctype, *_ in params)
    header = f"KF_KERNEL void __launch_bounds__({block_threads}) {symbol}({text})"
    return header, tuple(KernelParam(*p) for p in params)


def _is_flat(kernel: Kernel) -> bool:
    """True if every read is at the current point of a domain-shaped or 0-d buffer."""
    identity = tuple(range(kernel.ndim))
    for node in kernel.body.walk():  # type: ignore[union-attr]
        if isinstance(node, Coord):
            return False
        if isinstance(node, Load) and node.dims and not (node.dims == identity and node.is_centered):
            return False
    return True


def _domain_count(kernel: Kernel) -> str:
    if not kernel.domain:
        return "1"
    return " * ".join(["(kf_index_t)" + size_var(kernel.domain[0])]
                      + [size_var(s) for s in kernel.domain[1:]])


def _flat_output_index(sizes: tuple[str, ...], coords: tuple[str, ...]) -> str:
    if len(coords) == 1:
        return coords[0]
    address = f"(kf_index_t){coords[0]}"
    for size, coord in zip(sizes[1:], coords[1:], strict=True):
        address = f"({address}) * {size} + {coord}"
    return address


def map_kernel(graph: Graph, kernel: Kernel) -> tuple[list[str], LaunchSpec]:
    """A point or stencil kernel: one output element per thread and iteration."""
    symbol = kernel_symbol(graph, kernel)
    output = c_name(kernel.output)
    dtype = C_TYPES[graph.buffers[kernel.output].dtype]
    flat = _is_flat(kernel)
    if flat or kernel.ndim <= 1:
        coords = ("i",) if kernel.ndim == 1 else ()
        emitter = ExprEmitter(graph, coords, kernel.domain, flat_index="i" if flat else None)
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        header, params = _signature(graph, kernel, symbol, MAP_BLOCK_1D)
        body = [
            f"const kf_index_t count = {_domain_count(kernel)};",
            "for (kf_index_t i = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;",
            "     i += (kf_index_t)gridDim.x * blockDim.x) {",
            *indent(emitter.lines, 1),
            f"  {output}[i] = ({dtype}){value};",
            "}",
        ]
        launch = LaunchSpec(symbol, (kernel.name,), params, (MAP_BLOCK_1D, 1, 1),
                            (GridAxis(kernel.domain, MAP_BLOCK_1D), GridAxis(), GridAxis()))
        return [*describe(graph, kernel), header, "{", *indent(body, 1), "}"], launch

    coords = coord_names(kernel.ndim)
    sizes = tuple(size_var(s) for s in kernel.domain)
    emitter = ExprEmitter(graph, coords, kernel.domain)
    value = emitter.emit(kernel.body)  # type: ignore[arg-type]
    header, params = _signature(graph, kernel, symbol, TILE_X * TILE_Y)
    inner = [*emitter.lines,
             f"{output}[{_flat_output_index(sizes, coords)}] = ({dtype}){value};"]
    if kernel.ndim == 2:
        y, x = coords
        body = [
            f"const int {x} = blockIdx.x * blockDim.x + threadIdx.x;",
            f"if ({x} >= {sizes[1]}) return;",
            f"for (int {y} = blockIdx.y * blockDim.y + threadIdx.y; {y} < {sizes[0]}; "
            f"{y} += gridDim.y * blockDim.y) {{",
            *indent(inner, 1),
            "}",
        ]
        grid = (GridAxis((kernel.domain[1],), TILE_X), GridAxis((kernel.domain[0],), TILE_Y,
                                                                GRID_LIMITS[1]), GridAxis())
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
        grid = (GridAxis((kernel.domain[2],), TILE_X),
                GridAxis((kernel.domain[1],), TILE_Y, GRID_LIMITS[1]),
                GridAxis((kernel.domain[0],), 1, GRID_LIMITS[2]))
    launch = LaunchSpec(symbol, (kernel.name,), params, (TILE_X, TILE_Y, 1), grid)
    return [*describe(graph, kernel), header, "{", *indent(body, 1), "}"], launch


def _decode(flat: str, axes: list[int], kernel: Kernel, coords: tuple[str, ...]) -> list[str]:
    """Statements that split a row-major flat index over ``axes`` into coordinates."""
    lines = []
    rest = flat
    for position, axis in enumerate(reversed(axes)):
        size = size_var(kernel.domain[axis])
        if position == len(axes) - 1:
            lines.append(f"const int {coords[axis]} = (int)({rest});")
        else:
            lines.append(f"const int {coords[axis]} = (int)({rest} % {size});")
            rest = f"({rest} / {size})"
    return lines


def reduce_kernel(graph: Graph, kernel: Kernel) -> tuple[list[str], LaunchSpec]:
    """A reduction: map the body over the domain and fold it over the reduced axes."""
    assert kernel.reduction is not None
    symbol = kernel_symbol(graph, kernel)
    op, axes = kernel.reduction.op, kernel.reduction.axes
    dtype_name = graph.buffers[kernel.output].dtype
    ctype = C_TYPES[dtype_name]
    output = c_name(kernel.output)
    code = REDUCE_OP_CODE[op]
    identity = identity_text(op, dtype_name)
    coords = coord_names(kernel.ndim)
    kept = [axis for axis in range(kernel.ndim) if axis not in axes]
    header, params = _signature(graph, kernel, symbol, REDUCE_BLOCK)
    initial = ((kernel.output, identity_value(op, dtype_name)),)

    def product(axis_list: list[int]) -> str:
        if not axis_list:
            return "1"
        return " * ".join(["(kf_index_t)" + size_var(kernel.domain[axis_list[0]])]
                          + [size_var(kernel.domain[a]) for a in axis_list[1:]])

    trailing = list(axes) == list(range(kernel.ndim - len(axes), kernel.ndim))
    if trailing:
        flat = not kept and _is_flat(kernel)
        emitter = ExprEmitter(graph, coords, kernel.domain, flat_index="r" if flat else None)
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        decode_row = _decode("row", kept, kernel, coords) if kept else []
        decode_r = [] if flat else _decode("r", list(axes), kernel, coords)
        body = [
            f"const kf_index_t rows = {product(kept)};",
            f"const kf_index_t length = {product(list(axes))};",
            "for (kf_index_t row = blockIdx.y; row < rows; row += gridDim.y) {",
            *indent(decode_row, 1),
            f"  {ctype} acc = {identity};",
            "  for (kf_index_t r = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x; r < length;",
            "       r += (kf_index_t)gridDim.x * blockDim.x) {",
            *indent(decode_r + emitter.lines, 2),
            f"    acc = kf_combine<{code}, {ctype}>(acc, ({ctype}){value});",
            "  }",
            f"  acc = kf_block_reduce<{code}, {ctype}>(acc, {identity});",
            f"  if (threadIdx.x == 0) kf_atomic_{op}(&{output}[row], acc);",
            "}",
        ]
        reduced = tuple(kernel.domain[a] for a in axes)
        grid = (GridAxis(reduced, REDUCE_BLOCK * 8, 1024 if not kept else 32),
                GridAxis(tuple(kernel.domain[a] for a in kept), 1, GRID_LIMITS[1]), GridAxis())
    else:
        (axis,) = axes
        before, after = list(range(axis)), list(range(axis + 1, kernel.ndim))
        emitter = ExprEmitter(graph, coords, kernel.domain)
        value = emitter.emit(kernel.body)  # type: ignore[arg-type]
        decode = _decode("j", before + after, kernel, coords)
        size = size_var(kernel.domain[axis])
        body = [
            f"const kf_index_t outputs = {product(before + after)};",
            "const kf_index_t j = (kf_index_t)blockIdx.x * blockDim.x + threadIdx.x;",
            "if (j >= outputs) return;",
            *decode,
            f"{ctype} acc = {identity};",
            f"for (int {coords[axis]} = blockIdx.y; {coords[axis]} < {size}; "
            f"{coords[axis]} += gridDim.y) {{",
            *indent(emitter.lines, 1),
            f"  acc = kf_combine<{code}, {ctype}>(acc, ({ctype}){value});",
            "}",
            f"kf_atomic_{op}(&{output}[j], acc);",
        ]
        grid = (GridAxis(tuple(kernel.domain[a] for a in before + after), REDUCE_BLOCK),
                GridAxis((kernel.domain[axis],), 64, 1024), GridAxis())
    launch = LaunchSpec(symbol, (kernel.name,), params, (REDUCE_BLOCK, 1, 1), grid, initial,
                        uses_block_sync=trailing)
    return [*describe(graph, kernel), header, "{", *indent(body, 1), "}"], launch


def generate_unfused(graph: Graph, *, wide_index: bool = False) -> Program:
    """CUDA C for ``graph`` with one kernel per operator, in execution order."""
    parts = [PRELUDE, f"// Pipeline '{graph.name}': {len(graph.kernels)} kernels, unfused.",
             f"typedef {'long long' if wide_index else 'int'} kf_index_t;", ""]
    launches = []
    for kernel in graph.topological_kernels():
        if kernel.kind == "opaque":
            raise NotImplementedError("opaque user kernels arrive with the BLAS issue")
        emit = reduce_kernel if kernel.reduction is not None else map_kernel
        lines, launch = emit(graph, kernel)
        parts.extend([*lines, ""])
        launches.append(launch)
    return Program(graph.name, "\n".join(parts), tuple(launches), wide_index)
