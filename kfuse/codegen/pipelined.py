"""Register-tiled 2-D stencil kernels fed through shared memory by asynchronous copies.

A block walks down a strip of columns a chunk of rows at a time. While its threads compute
one chunk (each a register tile, as in :mod:`kfuse.codegen.kernels`), the copy engine
(``cp.async``) brings the next chunk's rows of every input read at an offset, halo
included, into the other of two shared-memory buffers: the loads are in flight during the
arithmetic without holding registers, and the tile reads them back as aligned vectors.
Chunks whose rows or columns, halo included, leave the image take the register-tile code
on global memory, which applies the boundary modes.
"""

from __future__ import annotations

from kfuse.codegen.cexpr import indent, size_var
from kfuse.codegen.program import GRID_LIMITS, GridAxis, LaunchSpec
from kfuse.ir.expr import ITEM_SIZE

PIPELINE_BLOCK = (64, 2)  # threads per block along columns and rows
CHUNKS_PER_BLOCK = 16  # chunks of rows one block walks (its grid row takes every gridDim.y-th)
SHARED_LIMIT = 48 * 1024  # both buffers of every staged input, without the opt-in


def staged_inputs(group, tile: tuple[int, ...]) -> list[str]:
    """External inputs the pipelined kernel copies to shared memory: 2-D float32 buffers
    shaped like the domain that some member reads at an offset."""
    names = []
    for kernel in group.members:
        for access in kernel.accesses:
            buffer = group.graph.buffers[access.buffer]
            if (access.buffer in group.produced or access.is_point or buffer.ndim != 2
                    or buffer.shape != group.domain or buffer.dtype != "float32"):
                continue
            if access.buffer not in names:
                names.append(access.buffer)
    return names


def shared_bytes(group, tile: tuple[int, ...]) -> int:
    """Dynamic shared memory of the pipelined kernel (both buffers)."""
    from kfuse.codegen.kernels import _reach, vector_reach

    rows, columns = tile
    up, down = _reach(group, tile, 0)
    left, right = vector_reach(group, tile)
    vectors = (PIPELINE_BLOCK[0] * columns + left + right) // columns
    chunk_rows = rows * PIPELINE_BLOCK[1] + up + down
    return 2 * len(staged_inputs(group, tile)) * chunk_rows * vectors * columns * ITEM_SIZE[
        "float32"]


def can_pipeline(group, tile: tuple[int, ...]) -> bool:
    """True if the group is a 2-D stencil group this kernel shape computes."""
    from kfuse.codegen.kernels import _vector_condition

    return (group.ndim == 2 and len(tile) == 2 and tile[-1] == 4
            and bool(staged_inputs(group, tile))
            and _vector_condition(group, tile[-1]) is not None
            and shared_bytes(group, tile) <= SHARED_LIMIT)


def pipelined_kernel(group, tile: tuple[int, ...]) -> tuple[list[str], LaunchSpec]:
    """The kernel (see the module): register tiles on chunks copied ahead asynchronously."""
    from kfuse.codegen.kernels import (
        _first_column,
        _items_code,
        _reach,
        _tile_points,
        _vector_condition,
        tile_code,
        vector_reach,
    )

    rows, columns = tile
    block_x, block_y = PIPELINE_BLOCK
    threads = block_x * block_y
    sizes = tuple(size_var(s) for s in group.domain)
    height, width = sizes
    up, down = _reach(group, tile, 0)
    left, right = vector_reach(group, tile)
    chunk_rows = rows * block_y
    staged_rows = chunk_rows + up + down
    vectors = (block_x * columns + left + right) // columns  # per staged row
    plane = staged_rows * vectors
    inputs = staged_inputs(group, tile)
    aligned = _vector_condition(group, columns)
    staged = {name: (f"kf_stage_{name}", "kf_row0", f"(kf_col0 - {left})", vectors)
              for name in inputs}
    in_range = {"iy": (-up, rows - 1 + down), "ix": (-left, columns - 1 + right)}
    points = _tile_points(group, rows, 1, columns)
    from_shared = _items_code(group, points, sizes, in_range, columns, staged)
    copies = []
    for position, name in enumerate(inputs):
        copies += [
            f"  kf_copy_async16(&kf_stage[(buffer * {len(inputs)} + {position}) * {plane} + i],",
            f"                  &{name}[(kf_index_t)(first + row) * {width} + "
            f"kf_col0 - {left} + (i - row * {vectors}) * {columns}]);",
        ]
    pointers = [f"const float4* const kf_stage_{name} = kf_stage + (kf_buffer * {len(inputs)} "
                f"+ {position}) * {plane};" for position, name in enumerate(inputs)]
    body = [
        "KF_DYNAMIC_SHARED(float4, kf_stage);  // [2 buffers][inputs][rows][vectors]",
        f"const int kf_col0 = blockIdx.x * blockDim.x * {columns};  // the block's columns",
        f"const int ix = {_first_column(columns)};",
        "const int kf_thread = threadIdx.y * blockDim.x + threadIdx.x;",
        f"const int kf_chunks = ({height} + {chunk_rows - 1}) / {chunk_rows};",
        f"const bool kf_columns_inside = {aligned} && kf_col0 >= {left} && "
        f"kf_col0 + {block_x * columns + right} <= {width};",
        "// a chunk is copied to shared memory if its rows and halo are inside the image",
        "auto kf_staged = [&](int chunk) {",
        f"  return kf_columns_inside && chunk * {chunk_rows} >= {up} && "
        f"chunk * {chunk_rows} + {chunk_rows + down} <= {height};",
        "};",
        "auto kf_copy_chunk = [&](int chunk, int buffer) {  // issue, do not wait",
        f"  const int first = chunk * {chunk_rows} - {up};",
        f"  for (int i = kf_thread; i < {plane}; i += {threads}) {{",
        f"    const int row = i / {vectors};",
        *copies,
        "  }",
        "};",
        "int kf_chunk = blockIdx.y;",
        "if (kf_chunk < kf_chunks && kf_staged(kf_chunk)) kf_copy_chunk(kf_chunk, 0);",
        "kf_copy_commit();",
        "for (int kf_step = 0; kf_chunk < kf_chunks; kf_chunk += gridDim.y, ++kf_step) {",
        "  const int kf_buffer = kf_step & 1;",
        "  const int kf_next = kf_chunk + gridDim.y;  // copied while this chunk computes",
        "  if (kf_next < kf_chunks && kf_staged(kf_next)) kf_copy_chunk(kf_next, kf_buffer ^ 1);",
        "  kf_copy_commit();",
        f"  const int iy = kf_chunk * {chunk_rows} + threadIdx.y * {rows};",
        "  if (kf_staged(kf_chunk)) {",
        "    kf_copy_wait<1>();  // this chunk's copies (the next chunk's may still fly)",
        "    __syncthreads();",
        f"    const int kf_row0 = kf_chunk * {chunk_rows} - {up};",
        *indent(pointers, 2),
        f"    // a {rows} x {columns} register tile read from the shared copy",
        *indent(from_shared, 2),
        f"  }} else if (ix < {width}) {{",
        *indent(tile_code(group, tile), 2),
        "  }",
        "  __syncthreads();  // every thread is done with the buffer the next copy refills",
        "}",
    ]
    header, params = group.signature(threads)
    grid = (GridAxis((group.domain[1],), block_x * columns),
            GridAxis((group.domain[0],), chunk_rows * CHUNKS_PER_BLOCK, GRID_LIMITS[1]),
            GridAxis())
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (block_x, block_y, 1), grid,
                        dynamic_shared_bytes=shared_bytes(group, tile))
    comment = [f"//   pipelined: chunks of {chunk_rows} rows, {', '.join(inputs)} copied one "
               f"chunk ahead (cp.async) into shared memory"]
    return [*group.describe(), *comment, header, "{", *indent(body, 1), "}"], launch
