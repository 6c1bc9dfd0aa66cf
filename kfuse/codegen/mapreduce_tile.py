"""The tile map-reduce form: a matrix walked in column tiles (Filipovič et al. 2015, §5.1).

A block of 32 x ``by`` threads owns a column tile of ``TN = 32 V`` columns and walks ``iters``
tiles of ``TM`` rows (serial iterations along the rows). Thread ``(tx, ty)`` owns the columns
``(bx*32 + tx)*V ..`` and the rows ``ty, ty+by, ..`` of each tile: every row of the matrix is
read by one warp, 16 bytes per thread, coalesced. Vectors indexed by column are *invariant
loads*, read once per block into registers; vectors indexed by row are read once per row.

Row reductions are combined per tile by warp shuffles (``rowsum="shuffle"``) or in the
paper's padded tile in shared memory (``rowsum="smem"``), one atomic per row and tile;
column reductions accumulate in registers over every row the thread visits, are combined
over the block's warps in shared memory and added with one atomic per column and block, or,
with *whole columns* (each block walks every row), stored once, with the column epilogue.
Shared memory is one array; elements get offsets by lifetime (interval allocation, §3.4)
and ``__syncthreads()`` goes where the paper's rules B1 and B2 ask for it (§3.3,
:mod:`kfuse.codegen.barriers`). Part of the map-reduce generator
(:mod:`kfuse.codegen.mapreduce`).
"""

from __future__ import annotations

from kfuse.codegen.barriers import Routine, SharedAccess, place_barriers
from kfuse.codegen.cexpr import c_name, indent, size_var
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid, MapReduceKernel, inside_item
from kfuse.codegen.program import GRID_LIMITS, GridAxis
from kfuse.cuda_limits import WARP
from kfuse.fusion.mapreduce import Reduce, row_padding
from kfuse.ir.expr import C_TYPES
from kfuse.schedule.shared_memory import SharedElement


def tile_mapping_text(kernel: MapReduceKernel) -> str:
    """How a matrix form walks its tiles, as the kernel's comment says it."""
    group, variant = kernel.group, kernel.variant
    tm, tn = group.tile(variant)
    walk = "every row of its columns" if variant.whole_columns else f"{variant.iters}"
    rowsum = f"; row reductions by {variant.rowsum}" if group.row_reductions() else ""
    return (f"matrix tiles of {tm} x {tn}, {walk} per block of {variant.threads[0]} x "
            f"{variant.threads[1]} threads{' (whole columns)' if variant.whole_columns else ''}"
            f"{rowsum}")


class TileKernel(MapReduceKernel):
    """Column tiles of ``TM x 32 V``, ``iters`` per block (or every row: whole columns)."""

    @property
    def accumulation(self) -> dict[str, Accumulation]:
        return {"col": Accumulation("kf_acc_{var}[{element}]"),
                "all": Accumulation("kf_acc_{var}")}

    def mapping_text(self) -> str:
        return tile_mapping_text(self)

    def body(self) -> tuple[list[str], Grid]:
        group, variant, v = self.group, self.variant, self.v
        bx, by = variant.threads
        tm, tn = group.tile(variant)
        iters, rows = variant.iters, variant.rows
        rows_symbol, cols_symbol = group.domain
        n_rows, n_cols = size_var(rows_symbol), size_var(cols_symbol)
        layout = group.shared_layout(variant)

        def coords_of(element: int) -> tuple:
            return (("iy", 0), ("ix", element))

        self.row_index = "[kf_k]"
        self.address = f"(kf_index_t)iy * {n_cols} + ix"
        code, values = self.evaluate(coords_of)
        declarations = [f"{C_TYPES[group.graph.buffers[name].dtype]} kf_ld_{c_name(name)}"
                        f"[{rows}][{v}];" for name in group.tile_inputs]

        def tile_pass(full: bool) -> tuple[list[str], object]:
            """The lines of one pass over a tile (and the barrier state after it). ``full``:
            the block's whole column tile is inside and aligned (straight vector accesses,
            no masks); else every access masked by ``kf_cols``."""
            count, vec = (str(v), "true") if full else ("kf_cols", "kf_vec")
            load_rows = [
                "// stage 1: the elements of all this thread's rows of the tile first (loads "
                "in",
                f"// flight together; {variant.vector_bytes}-byte loads where aligned)",
                *declarations,
                "#pragma unroll",
                f"for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                f"  const int iy = kf_row0 + kf_ty + kf_k * {by};",
                f"  if (iy < {n_rows}) {{",
                *indent(self.load_lines(count, vec, declare=False), 2),
                "  }",
                "}",
            ] if group.tile_inputs else []
            row_lines = [
                *self.element_work(code, values, group.col_reductions() + group.all_reductions(),
                                   count, vec, full),
            ]
            for reduce in group.row_reductions():
                masked = [inside_item(reduce, element, value, None if full else "kf_cols")
                          for element, value in enumerate(values[reduce.kernel.output])]
                if variant.rowsum == "shuffle":
                    row_lines.append(f"{{  // '{reduce.kernel.name}': this row's values over "
                                     "the warp (shuffles), one atomic per row and tile")
                    row_lines.append(f"  {reduce.ctype} kf_part = {masked[0]};")
                    for item in masked[1:]:
                        row_lines.append(f"  kf_part = kf_combine<{reduce.code}, "
                                         f"{reduce.ctype}>(kf_part, {item});")
                    row_lines += [f"  kf_part = kf_mr_warp_reduce<{reduce.code}, "
                                  f"{reduce.ctype}>(kf_part);",
                                  f"  if (kf_tx == 0) kf_atomic_{reduce.op}(&{reduce.var}[iy], "
                                  "kf_part);", "}"]
                else:
                    ld = tn + row_padding(v)
                    items = ", ".join(masked)
                    row_lines.append(f"{{ const {reduce.ctype} kf_st[{v}] = {{{items}}};  // "
                                     f"stage '{reduce.kernel.name}' in its tile")
                    row_lines.append(f"  kf_mr_store<{v}>(kf_tile_{reduce.var} + (kf_ty + kf_k "
                                     f"* {by}) * {ld} + kf_tx * {v}, {v}, true, kf_st); }}")
            compute_accesses = tuple(
                SharedAccess(layout[f"tile_{r.var}"], True, "column")
                for r in group.row_reductions() if variant.rowsum == "smem")
            compute = Routine("compute", [
                *load_rows,
                "#pragma unroll",
                f"for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                f"  const int iy = kf_row0 + kf_ty + kf_k * {by};",
                f"  if (iy < {n_rows}) {{  // the same for the whole warp: a warp owns one row",
                *indent(row_lines, 2),
                "  }",
                "}",
            ], compute_accesses)
            loop_routines = [compute]
            if variant.rowsum == "smem":
                by_name = {r.kernel.name: r for r in group.row_reductions()}
                for name in variant.order:
                    loop_routines += self.smem_row_sum(by_name[name], layout, tn)
            return place_barriers(loop_routines, loop=True)

        full_lines, _ = tile_pass(True)
        loop_lines, state = tile_pass(False)
        end_routines = self.column_flush(layout) + self.all_flush()
        end_lines, _ = place_barriers(end_routines, entry=state)

        smem = group.shared_bytes(variant)
        accumulators = []
        for reduce in group.col_reductions():
            accumulators.append(f"{reduce.ctype} kf_acc_{reduce.var}[{v}];  // accumulated "
                                f"partial {reduce.op} of '{reduce.kernel.name}' (per column)")
            accumulators.append(f"for (int e = 0; e < {v}; ++e) kf_acc_{reduce.var}[e] = "
                                f"{reduce.identity};")
        accumulators += self.accumulator_lines(group.all_reductions())
        invariant = []
        for name in group.col_inputs:
            ctype = C_TYPES[group.graph.buffers[name].dtype]
            var = c_name(name)
            flag = self.aligned_flag([name], None)
            invariant.append(f"{ctype} kf_col_{var}[{v}]; kf_mr_load<{v}>({var} + ix, kf_cols, "
                             f"{flag}, kf_col_{var});")
        body = [
            "// thread-to-data mapping shared by every member (Filipovič et al. 2015 F1): thread (tx, ty)",
            f"// owns columns (bx*32 + tx)*{v} .. +{v - 1} and rows ty, ty+{by}, .. of each "
            f"{tm}-row tile",
            "const int kf_tx = threadIdx.x, kf_ty = threadIdx.y;",
            f"const bool kf_vec = {self.aligned_flag(group.tile_inputs + group.stores, n_cols)};"
            f"  // {variant.vector_bytes}-byte accesses where aligned",
            f"const int kf_row_blocks = ({n_rows} + {tm * iters - 1}) / {tm * iters};",
        ]
        if smem:
            body.append(f"__shared__ __align__(16) unsigned char kf_smem[{smem}];  // one array, "
                        "elements at offsets (interval allocation)")
            for element in layout.values():
                ctype = self.shared_ctype(element.name)
                body.append(f"{ctype}* const kf_{element.name} = ({ctype}*)(kf_smem + "
                            f"{element.offset});  // {element.size} bytes")
        body += [
            "{  const int kf_bx = blockIdx.x;  // the grid has one block per column tile",
            f"  const int ix = (kf_bx * {WARP} + kf_tx) * {v};",
            f"  const int kf_cols = ix < {n_cols} ? min({v}, {n_cols} - ix) : 0;",
            f"  const bool kf_full = {'kf_vec && ' if v > 1 else ''}(kf_bx + 1) * {tn} <= "
            f"{n_cols};  // the same for the whole block",
        ]
        if invariant:
            body += ["  // stage 0: invariant loads (vectors indexed by column: once per block)",
                     *indent(invariant, 1)]
        whole = variant.whole_columns  # one block walks every row (grid: column tiles only)
        by_loop = [
            "for (int kf_by = blockIdx.y; kf_by < kf_row_blocks; kf_by += gridDim.y) {"
            + ("  // every row block: the grid has one block per column tile" if whole
               else ""),
        ]
        if smem and not whole:  # (whole columns flush once, after every row block)
            by_loop.append("  __syncthreads();  // B2: a new block of tiles reuses shared "
                           "storage")
        by_loop += indent(accumulators, 1) if not whole else []
        by_loop += [
            f"  for (int kf_it = 0; kf_it < {iters}; ++kf_it) {{  // serial iterations",
            f"    const int kf_row0 = (kf_by * {iters} + kf_it) * {tm};",
            f"    if (kf_row0 >= {n_rows}) break;  // the same for the whole block",
            "    if (kf_full) {  // the block's whole column tile inside and aligned: no masks",
            *indent(full_lines, 3),
            "    } else {",
            *indent(loop_lines, 3),
            "    }",
            "  }",
            *(indent(end_lines, 1) if not whole else []),
            "}",
        ]
        if whole:  # partial results accumulate over every row, flushed once at the end
            by_loop = [*accumulators, *by_loop, *end_lines]
        body += [*indent(by_loop, 1), "}"]
        rows_axis = GridAxis() if whole else GridAxis((rows_symbol,), tm * iters,
                                                      GRID_LIMITS[1])
        grid = (GridAxis((cols_symbol,), tn, covering=True), rows_axis, GridAxis())
        return body, grid

    def shared_ctype(self, element: str) -> str:
        for reduce in self.group.reductions:
            if element.endswith("_" + reduce.var) and element.split("_", 1)[1] == reduce.var:
                return reduce.ctype
        return "float"

    def smem_row_sum(self, reduce: Reduce, layout: dict[str, SharedElement], tn: int
                     ) -> list[Routine]:
        """The row reduction's tile summed row by row (lane tx: row tx), then one atomic."""
        v, by = self.v, self.variant.threads[1]
        ld = tn + row_padding(v)
        tile = layout[f"tile_{reduce.var}"]
        part = layout[f"rowpart_{reduce.var}"]
        n_rows = size_var(self.group.domain[0])
        combine = f"kf_combine<{reduce.code}, {reduce.ctype}>"
        total = [f"{reduce.ctype} kf_total = kf_rowpart_{reduce.var}[kf_tx];"]
        if by > 1:
            total.append(f"for (int j = 1; j < {by}; ++j) kf_total = {combine}(kf_total, "
                         f"kf_rowpart_{reduce.var}[j * {WARP} + kf_tx]);")
        sum_lines = [
            f"{{  // '{reduce.kernel.name}': lane tx sums row tx of the tile (padded rows: no "
            "bank conflicts), warps split the columns",
            f"  {reduce.ctype} kf_part = {reduce.identity};",
            f"  for (int c = kf_ty; c < {WARP}; c += {by}) {{",
            f"    {reduce.ctype} kf_w[{v}]; kf_mr_load<{v}>(kf_tile_{reduce.var} + kf_tx * "
            f"{ld} + c * {v}, {v}, true, kf_w);",
            f"    for (int e = 0; e < {v}; ++e) kf_part = {combine}(kf_part, kf_w[e]);",
            "  }",
            f"  kf_rowpart_{reduce.var}[kf_ty * {WARP} + kf_tx] = kf_part;",
            "}",
        ]
        flush_lines = [
            f"if (kf_ty == 0) {{  // '{reduce.kernel.name}': combine the warps, one atomic "
            "per row and tile",
            *indent(total, 1),
            "  const int iy = kf_row0 + kf_tx;",
            f"  if (iy < {n_rows}) kf_atomic_{reduce.op}(&{reduce.var}[iy], kf_total);",
            "}",
        ]
        return [
            Routine(f"sum {reduce.kernel.name}", sum_lines,
                    (SharedAccess(tile, False, "row"), SharedAccess(part, True, "row"))),
            Routine(f"store {reduce.kernel.name}", flush_lines,
                    (SharedAccess(part, False, "lane"),)),
        ]

    def column_flush(self, layout: dict[str, SharedElement]) -> list[Routine]:
        """Column reductions: each warp's partial results staged per column and combined by
        warp 0, column by column, then one atomic per column and block, or, with whole
        columns (the block walked every row: the results are complete), one plain store
        where the result must reach memory and the column epilogue there (no fill, no
        atomic)."""
        group, v, by = self.group, self.v, self.variant.threads[1]
        tn = group.tile(self.variant)[1]
        reductions = group.col_reductions()
        if not reductions:
            return []
        routines, reads, totals = [], [], []
        for reduce in reductions:
            total = f"kf_sum_{reduce.var}"
            if by == 1:  # one warp: the thread's partial results are the columns' results
                totals.append(f"const {reduce.ctype} {total} = kf_acc_{reduce.var}[e];")
                continue
            element = layout[f"colpart_{reduce.var}"]
            reads.append(SharedAccess(element, False, "lane"))
            routines.append(Routine(f"stage {reduce.kernel.name}", [
                f"// '{reduce.kernel.name}': each warp's partial results per column",
                f"kf_mr_store<{v}>(kf_colpart_{reduce.var} + kf_ty * {tn} + kf_tx * {v}, {v}, "
                f"true, kf_acc_{reduce.var});"],
                (SharedAccess(element, True, "column"),)))
            totals += [
                f"{reduce.ctype} {total} = kf_colpart_{reduce.var}[kf_tx * {v} + e];  // "
                f"'{reduce.kernel.name}': the warps combined",
                f"for (int j = 1; j < {by}; ++j) {total} = kf_combine<{reduce.code}, "
                f"{reduce.ctype}>({total}, kf_colpart_{reduce.var}[j * {tn} + kf_tx * {v} + e]);"]
        if self.variant.whole_columns:
            results = {r.kernel.output: f"kf_sum_{r.var}" for r in reductions}
            names = ", ".join(f"'{k.name}'" for k in group.epilogue)
            how = ((f"the epilogue {names} at each column, " if names else "")
                   + "one plain store per column and output (no fill, no atomic)")
            write = self.epilogue_lines(results, "jx", group.domain[1:])
        else:
            how = "one atomic per column and block"
            write = [f"kf_atomic_{r.op}(&{r.var}[jx], kf_sum_{r.var});" for r in reductions]
        lines = [
            "if (kf_ty == 0) {  // warp 0 combines the warps' results, column by column",
            f"  for (int e = 0; e < {v}; ++e) {{  // {how}",
            *indent(totals, 2),
            "    const int jx = ix + e;",
            "    if (e < kf_cols) {",
            *indent(write, 3),
            "    }",
            "  }",
            "}"]
        routines.append(Routine("store columns", lines, tuple(reads)))
        return routines

    def all_flush(self) -> list[Routine]:
        """Full reductions: over the block, one atomic per block (barriers inside)."""
        return [Routine(f"store {reduce.kernel.name}", self.block_atomic_lines(reduce),
                        barrier_inside=True) for reduce in self.group.all_reductions()]
