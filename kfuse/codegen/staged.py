"""Fused stencil chains through shared memory (temporal blocking), 2-D.

A block owns an output tile. Every intermediate that some member of the group reads at
an offset is computed once per block over the tile grown by its halo and kept in shared
memory; a barrier separates the stages; the last stage computes the outputs, several
rows per thread, reading the staged values (rows shared between a thread's points are
read once). A read of a staged intermediate first maps its point with the consumer's
boundary mode (Qiao 2021's index exchange), so borders equal the unfused result; mirror
and clamp keep the mapped point inside the staged halo, which is why groups with
periodic (repeat) reads of an intermediate use the recompute variant instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse.codegen.cexpr import ExprEmitter, c_name, coordinate_text, indent, size_var
from kfuse.codegen.program import GRID_LIMITS, GridAxis, KernelSource, LaunchSpec, launch_bounds
from kfuse.ir.expr import C_TYPES, Load
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import staged_members


@dataclass(frozen=True)
class Stage:
    """Intermediates computed together over the output tile grown by ``halo`` (y, x)."""

    members: tuple[str, ...]
    halo: tuple[int, int]


def staged_kernel(group, rows: int, tile_x: int, tile_y: int) -> tuple[KernelSource, LaunchSpec]:
    """The kernel of ``group`` (a :class:`~kfuse.codegen.kernels.KernelGroup`) with stages."""
    from kfuse.codegen.kernels import _flat_address

    graph = group.graph
    members = tuple(k.name for k in group.members)
    tile = (tile_y * rows, tile_x)  # output points per block (y, x)
    halos = staged_members(graph, members)
    order = [m for m in members if m in halos]
    stages: list[Stage] = []
    for name in order:  # members with the same halo and no dependency between them share a stage
        placed = False
        for index, stage in enumerate(stages):
            if stage.halo == halos[name] and not _reads_any(graph, name, stage.members):
                stages[index] = Stage((*stage.members, name), stage.halo)
                placed = True
                break
        if not placed:
            stages.append(Stage((name,), halos[name]))
    sizes = tuple(size_var(s) for s in group.domain)
    rows_n, cols_n = sizes
    # shared tiles by buffer name: intermediates (by their producer)
    tile_halo = {graph.kernel_by_name[name].output: halos[name] for name in order}
    regions = {buffer: (tile[0] + 2 * h[0], tile[1] + 2 * h[1]) for buffer, h in tile_halo.items()}

    def smem(name: str) -> str:
        buffer = graph.kernel_by_name[name].output if name in graph.kernel_by_name else name
        return f"tile_{c_name(buffer)}"

    def staged_read(load: Load, emitter: ExprEmitter, ready: set[str]) -> str | None:
        producer = group.produced.get(load.buffer)
        if producer is None or producer.name not in ready:
            return group.answer_read(load, emitter)
        coords, inside = group.mapped_point(load, emitter)
        indices = [coordinate_text(coord) for coord in coords]
        height, width = regions[load.buffer]
        halo_y, halo_x = tile_halo[load.buffer]
        value = emitter.define(load.dtype, f"{smem(load.buffer)}[({indices[0]} - (y0 - "
                               f"{halo_y})) * {width} + ({indices[1]} - (x0 - {halo_x}))]",
                               prefix=f"s_{load.buffer}_")
        return group.guarded(load, emitter, value, inside)

    body = ["const int x0 = blockIdx.x * " + str(tile[1]) + ";",
            "const int y0 = tile_row * " + str(tile[0]) + ";",
            "const int tid = threadIdx.y * blockDim.x + threadIdx.x;",
            "const int threads = blockDim.x * blockDim.y;"]
    declarations = []
    ready: set[str] = set()
    for number, stage in enumerate(stages, start=1):
        halo_y, halo_x = stage.halo
        height, width = tile[0] + 2 * halo_y, tile[1] + 2 * halo_x
        for name in stage.members:
            ctype = C_TYPES[graph.kernel_by_name[name].body.dtype]  # type: ignore[union-attr]
            declarations.append(f"__shared__ {ctype} {smem(name)}[{height * width}];")
        emitter = ExprEmitter(graph, (("gy", 0), ("gx", 0)), group.domain,
                              load_hook=lambda ld, em, r=frozenset(ready): staged_read(ld, em, r))
        values = []
        for name in stage.members:
            emitter.state.evaluated.add((name, emitter.coords))
            values.append((name, emitter.emit(graph.kernel_by_name[name].body)))
        stores = [f"{smem(name)}[e] = {value};" for name, value in values]
        body += [
            f"// stage {number}: {', '.join(stage.members)} over the tile and a halo of "
            f"{halo_y} x {halo_x}",
            f"for (int e = tid; e < {height * width}; e += threads) {{",
            f"  const int gy = y0 - {halo_y} + e / {width};",
            f"  const int gx = x0 - {halo_x} + e % {width};",
            f"  if (gy >= 0 && gy < {rows_n} && gx >= 0 && gx < {cols_n}) {{",
            *indent(emitter.lines + stores, 2),
            "  }",
            "}",
            "__syncthreads();",
        ]
        ready |= set(stage.members)

    def final_code(points) -> list[str]:
        emitter = ExprEmitter(graph, points[0], group.domain,
                              load_hook=lambda ld, em: staged_read(ld, em, ready))
        emitter.state.in_range.update({"iy": (0, rows - 1)})
        stores = []
        for coords in points:
            point = emitter.at(coords)
            stores += group.store_lines(point, _flat_address(sizes, coords))
        return emitter.lines + stores

    fast = final_code([(("iy", k), ("ix", 0)) for k in range(rows)])
    single = final_code([(("iy_k", 0), ("ix", 0))])
    body += [
        f"// outputs: {rows} consecutive rows per thread, staged values read from shared memory",
        "const int ix = x0 + threadIdx.x;",
        f"const int iy = y0 + threadIdx.y * {rows};",
        f"if (ix < {cols_n} && iy < {rows_n}) {{",
        f"  if (iy + {rows - 1} < {rows_n}) {{",
        *indent(fast, 2),
        "  } else {",
        f"    for (int iy_k = iy; iy_k < {rows_n}; ++iy_k) {{",
        *indent(single, 3),
        "    }",
        "  }",
        "}",
        "__syncthreads();  // the next tile reuses the shared memory",
    ]
    tiles = f"({rows_n} + {tile[0] - 1}) / {tile[0]}"
    body = [f"for (int tile_row = blockIdx.y; tile_row < {tiles}; tile_row += gridDim.y) {{",
            *indent(body, 1), "}"]
    params = group.parameters()
    launch = LaunchSpec(group.symbol, members, params, (tile_x, tile_y, 1),
                        (GridAxis((group.domain[1],), tile[1]),
                         GridAxis((group.domain[0],), tile[0], GRID_LIMITS[1]), GridAxis()))
    preamble = [*group.describe(), f"//   variant: staged in shared memory ({len(stages)} stages)"]
    return group.source(launch_bounds(tile_x * tile_y), params, declarations + body,
                        preamble), launch


def _reads_any(graph: Graph, name: str, others: tuple[str, ...]) -> bool:
    """True if ``name`` depends (directly or not) on any of ``others``."""
    import networkx as nx
    ancestors = nx.ancestors(graph.order_dag(), name)
    return any(other in ancestors for other in others)
