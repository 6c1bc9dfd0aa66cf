"""The "held rows" map-reduce kernel: a block holds each of its rows whole in registers.

The block's ``T`` threads load a whole row at once (``unroll`` accesses of ``V`` elements per
thread, every load in flight together), evaluate the group's core at each element, and
combine the row's reductions over the block (warp shuffles, one barrier, every thread gets
the result). The row is still in registers: the members fed by those results (ATAX's
``y = Aᵀ t`` reading ``t = A x`` at its row) go on over the same values, so ``A`` is read
once where two kernels read it twice. Each thread keeps the same columns for every row, so
column reductions accumulate in registers across all of the block's rows (a contiguous
range) and are combined over the blocks with one atomic per column and block at the end.
Part of the map-reduce generator (:mod:`kfuse.codegen.mapreduce`), written through its
skeleton (:mod:`kfuse.codegen.mapreduce_skeleton`).
"""

from __future__ import annotations

from kfuse.codegen.cexpr import c_name, indent, size_var
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid, MapReduceKernel
from kfuse.codegen.program import GridAxis
from kfuse.cuda_limits import WARP
from kfuse.fusion.mapreduce import Reduce
from kfuse.ir.expr import C_TYPES


class HeldKernel(MapReduceKernel):
    """Blocks that hold each of their rows whole in registers."""

    @property
    def accumulation(self) -> dict[str, Accumulation]:
        # (columns past the end are never stored: their accumulators need no mask)
        return {"row": Accumulation("kf_racc_{var}", "identity"),
                "col": Accumulation("kf_acc_{var}[kf_u][{element}]", "kept"),
                "all": Accumulation("kf_acc_{var}")}

    def mapping_text(self) -> str:
        variant = self.variant
        return (f"matrix rows held whole by blocks of {variant.threads[0]} threads, "
                f"{variant.unroll} x {self.v} columns per thread, contiguous rows per block "
                f"(at most {variant.blocks} blocks)")

    def body(self) -> tuple[list[str], Grid]:
        """Rows held whole by blocks: each phase (the core, then the members fed by the
        row reductions of the phases before) over the row, its row reductions combined."""
        group, variant, v = self.group, self.variant, self.v
        threads, chunks = variant.threads[0], variant.unroll
        warps = threads // WARP
        rows_symbol, cols_symbol = group.domain
        n_rows, n_cols = size_var(rows_symbol), size_var(cols_symbol)
        row_reductions = group.row_reductions()

        def coords_of(element: int) -> tuple:
            return (("iy", 0), ("ix", element))

        self.row_index, self.col_index = "[kf_u]", "[kf_u]"
        self.address = f"(kf_index_t)iy * {n_cols} + ix"
        chunk = [f"const int ix = (kf_u * {threads} + kf_tx) * {v};",
                 f"const int kf_cols = ix < {n_cols} ? min({v}, {n_cols} - ix) : 0;",
                 "(void)kf_cols;  // (unused by some groups)"]

        def over_chunks(lines: list[str]) -> list[str]:
            return ["#pragma unroll", f"for (int kf_u = 0; kf_u < {chunks}; ++kf_u) {{",
                    *indent([*chunk, *lines], 1), "}"]

        tile_types = {name: C_TYPES[group.graph.buffers[name].dtype]
                      for name in group.tile_inputs + group.col_inputs}
        invariant = [f"{tile_types[name]} kf_col_{c_name(name)}[{chunks}][{v}];"
                     for name in group.col_inputs]
        invariant += over_chunks(self.column_vector_lines("[kf_u]", "kf_cols", "kf_vec"))
        accumulators = []
        for reduce in group.col_reductions():
            accumulators += [f"{reduce.ctype} kf_acc_{reduce.var}[{chunks}][{v}];  // partial "
                             f"{reduce.op} of '{reduce.kernel.name}' at this thread's columns",
                             f"for (int kf_u = 0; kf_u < {chunks}; ++kf_u)",
                             f"  for (int e = 0; e < {v}; ++e) kf_acc_{reduce.var}[kf_u][e] = "
                             f"{reduce.identity};"]
        accumulators += self.accumulator_lines(group.all_reductions())
        shared = [f"__shared__ {r.ctype} kf_parts_{r.var}[2][{warps}];  // '{r.kernel.name}': "
                  "each warp's part of a row, two buffers (one barrier per row)"
                  for r in row_reductions]
        load_row = [f"{tile_types[name]} kf_ld_{c_name(name)}[{chunks}][{v}];"
                    for name in group.tile_inputs]
        load_row += over_chunks(self.load_lines("kf_cols", "kf_vec", declare=False))

        def combine_rows(reductions: list[Reduce]) -> list[str]:
            """The row's ``reductions`` over the block: every thread gets each result."""
            lines = []
            for reduce in reductions:
                warp_reduce = f"kf_mr_warp_reduce<{reduce.code}, {reduce.ctype}>"
                lines += [
                    f"kf_racc_{reduce.var} = {warp_reduce}(kf_racc_{reduce.var});",
                    f"if (kf_lane == 0) kf_parts_{reduce.var}[kf_parity][kf_warp] = "
                    f"kf_racc_{reduce.var};"]
            lines.append("__syncthreads();  // every warp's part written (the next row "
                         "writes the other buffer)" if reductions else
                         "// (no row reductions: nothing to combine)")
            for reduce in reductions:
                warp_reduce = f"kf_mr_warp_reduce<{reduce.code}, {reduce.ctype}>"
                lines.append(f"const {reduce.ctype} kf_row_{reduce.var} = {warp_reduce}("
                             f"kf_lane < {warps} ? kf_parts_{reduce.var}[kf_parity][kf_lane]"
                             f" : {reduce.identity});")
                if reduce.kernel.output in group.outputs:
                    lines.append(f"if (kf_tx == 0) {reduce.var}[iy] = kf_row_{reduce.var};"
                                 "  // one plain store per row: no fill, no atomic")
            return lines

        walk = [
            "// stage 1: the whole row, every load in flight together "
            f"({variant.vector_bytes}-byte loads where aligned)",
            *load_row,
        ]
        # the phase whose combine is the row's last: the next row writes the other buffers
        last_combine = max((phase for phase, kernels in enumerate(group.phases)
                            for r in row_reductions if r.kernel in kernels), default=None)
        for phase, kernels in enumerate(group.phases):
            # a phase reads the row reductions of the phases before it as the block's results
            code, values = self.evaluate(coords_of, kernels)
            reductions = [r for r in group.reductions if r.kernel in kernels]
            rows_here = [r for r in reductions if r.kind == "row"]
            stores = group.stores if phase == 0 else [
                name for name in group.fed_stores if group.produced[name] in kernels]
            names = ", ".join(f"'{k.name}'" for k in kernels)
            walk += [
                *[f"{r.ctype} kf_racc_{r.var} = {r.identity};  // this thread's part of the "
                  f"row's '{r.kernel.name}'" for r in rows_here],
                "// stage 2: the core members at each element (intermediates in registers)"
                if phase == 0 else f"// stage {2 * phase + 2}: {names} at each element of "
                "the row still held in registers",
                *over_chunks(self.element_work(code, values, reductions, "kf_cols", "kf_vec",
                                               False, stores)),
            ]
            if rows_here or phase == 0:
                walk += [
                    f"// stage {2 * phase + 3}: the row's reductions over the block: warp "
                    "shuffles, each warp's part in shared memory,",
                    "// one barrier, then every warp combines the parts (every thread gets "
                    "the row's result)",
                    *combine_rows(rows_here)]
                self.held_values.update(
                    {r.kernel.output: f"kf_row_{r.var}" for r in rows_here})
                if phase == last_combine:
                    walk.append("kf_parity ^= 1;")
        self.held_values = {}
        flush = []
        for reduce in group.col_reductions():
            flush += over_chunks([f"for (int e = 0; e < kf_cols; ++e) kf_atomic_{reduce.op}("
                                  f"&{reduce.var}[ix + e], kf_acc_{reduce.var}[kf_u][e]);"])
        for reduce in group.all_reductions():
            flush += self.block_atomic_lines(reduce)
        vec = self.aligned_flag(group.tile_inputs + group.stores + group.fed_stores
                                + group.col_inputs, n_cols)
        body = [
            f"// held rows: the block's {threads} threads hold each of its rows whole, {chunks} "
            f"x {v} column(s) per thread",
            f"// (rows of at most {threads * v * chunks} columns), and keep the same columns "
            "for every row: a contiguous range of rows per block",
            "const int kf_tx = threadIdx.x, kf_lane = kf_tx & 31, kf_warp = kf_tx >> 5;",
            "(void)kf_lane; (void)kf_warp;",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte accesses where "
            "aligned",
            *shared,
        ]
        if group.col_inputs:
            body += ["// stage 0: vectors indexed by column, loaded once per block and kept "
                     "for every row", *invariant]
        body += [
            *accumulators,
            f"const int kf_rows_per_block = ({n_rows} + gridDim.x - 1) / gridDim.x;",
            "const int kf_r0 = blockIdx.x * kf_rows_per_block;",
            f"const int kf_r1 = min({n_rows}, kf_r0 + kf_rows_per_block);",
            "int kf_parity = 0;",
            "(void)kf_parity;",
            "for (int iy = kf_r0; iy < kf_r1; ++iy) {  // the same rows for the whole block "
            "(barriers inside)",
            *indent(walk, 1),
            "}",
        ]
        if flush:
            body += ["// stage 5: combine over the blocks: one atomic per column and block "
                     "(a full reduction: per block)", *flush]
        self.size_limits = ((cols_symbol, threads * v * chunks),)
        grid = (GridAxis((rows_symbol,), 1, variant.blocks), GridAxis(), GridAxis())
        return body, grid
