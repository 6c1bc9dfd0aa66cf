"""The "stream" map-reduce kernels: each warp (or whole block) walks along its own rows.

Every load of a step is issued before its arithmetic, row results stay in registers until
the end of the walk, and a warp that owns whole rows stores each result (and the
elementwise epilogue that reads it) without atomics or a zero-fill. *Block rows* (``T x 1``
threads) put a whole block on each row: the row's results are combined over the block's
warps at the end (:func:`row_total`). Part of the map-reduce generator
(:mod:`kfuse.codegen.mapreduce`), written through its skeleton
(:mod:`kfuse.codegen.mapreduce_skeleton`).
"""

from __future__ import annotations

from kfuse.codegen.cexpr import c_name, indent, size_var
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid, MapReduceKernel
from kfuse.codegen.mapreduce_tile import tile_mapping_text
from kfuse.codegen.program import GRID_LIMITS, GridAxis
from kfuse.fusion.mapreduce import Reduce
from kfuse.ir.expr import C_TYPES


def row_total(reduce: Reduce, unroll: int, target: str, comment: str = "",
              block: bool = False) -> list[str]:
    """Lines that combine a row's ``unroll`` partials of ``reduce`` (``kf_racc_*[kf_k][*]``)
    and then the warp's lanes into ``target``: the row's result, in every lane. ``block``
    (block rows): over the whole block instead, the result in thread 0 (every thread of the
    block must run these lines: they hold barriers)."""
    combine = f"kf_combine<{reduce.code}, {reduce.ctype}>"
    partials = f"kf_racc_{reduce.var}[kf_k]"
    over = (f"kf_block_reduce<{reduce.code}, {reduce.ctype}>({target}, {reduce.identity});"
            "  // over the block's warps: valid in thread 0" if block else
            f"kf_mr_warp_reduce<{reduce.code}, {reduce.ctype}>({target});")
    return [f"{reduce.ctype} {target} = {partials}[0];{comment}",
            "#pragma unroll",
            f"for (int kf_u = 1; kf_u < {unroll}; ++kf_u) {target} = {combine}({target}, "
            f"{partials}[kf_u]);",
            f"{target} = {over}"]


class StreamKernel(MapReduceKernel):
    """Warps (block rows: blocks) that walk along their own rows."""

    @property
    def accumulation(self) -> dict[str, Accumulation]:
        # partial row results per thread: one per chunk of a step (independent chains), or
        # for block rows one per row (ptxas then interleaves the step's loads with their
        # arithmetic in few registers, as in torch.compile's GEMV: more blocks per SM)
        slot = "0" if self.variant.block_rows else "kf_u"
        return {"row": Accumulation(f"kf_racc_{{var}}[kf_k][{slot}]", "identity"),
                "all": Accumulation("kf_acc_{var}")}

    def mapping_text(self) -> str:
        return tile_mapping_text(self)

    def body(self) -> tuple[list[str], Grid]:
        """Warps walk along their rows: every load of a step in flight, row results in
        registers until the end of the walk (no column reductions in such a group)."""
        group, variant, v = self.group, self.variant, self.v
        bx, by = variant.threads
        rows, unroll, iters = variant.rows, variant.unroll, variant.iters
        owner = "block" if variant.block_rows else "warp"
        partials = 1 if variant.block_rows else unroll  # (see accumulation)
        step = group.step(variant)
        rows_symbol, cols_symbol = group.domain
        n_rows, n_cols = size_var(rows_symbol), size_var(cols_symbol)

        def coords_of(element: int) -> tuple:
            return (("iy", 0), ("ix", element))

        self.row_index, self.col_index = "[kf_k][kf_u]", "[kf_u]"
        self.address = f"(kf_index_t)iy * {n_cols} + ix"
        code, values = self.evaluate(coords_of)
        row_reductions, all_reductions = group.row_reductions(), group.all_reductions()
        # a row past the end must not store, nor read a vector by row, nor feed a dot
        guarded = bool(group.stores or group.generic or all_reductions)

        def step_lines(full: bool, unroll: int = unroll) -> list[str]:
            """One step: ``unroll`` chunks of V columns of each of the warp's rows. ``full``:
            every chunk inside and aligned (straight vector loads, no masks)."""
            vec = "true" if full else "kf_vec"
            cols = (f"const int kf_cols = {v};" if full else
                    f"const int kf_cols = ix < kf_c1 ? min({v}, kf_c1 - ix) : 0;")
            chunk = [f"const int ix = kf_cs + (kf_u * {bx} + kf_tx) * {v};", cols]
            loads = [f"{C_TYPES[group.graph.buffers[name].dtype]} kf_ld_{c_name(name)}"
                     f"[{rows}][{unroll}][{v}];" for name in group.tile_inputs]
            loads += [f"{C_TYPES[group.graph.buffers[name].dtype]} kf_col_{c_name(name)}"
                      f"[{unroll}][{v}];" for name in group.col_inputs]
            loads += ["#pragma unroll", f"for (int kf_u = 0; kf_u < {unroll}; ++kf_u) {{",
                      *indent(chunk, 1)]
            vectors = indent(self.column_vector_lines("[kf_u]", "kf_cols", vec), 1)
            matrices = ["  #pragma unroll", f"  for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                        f"    const int iy = min(kf_row0 + kf_k, {n_rows} - 1);  // clamped: "
                        "loads stay inside",
                        *indent(self.load_lines("kf_cols", vec, declare=False), 2),
                        "  }"] if group.tile_inputs else []
            loads += [*vectors, *matrices]
            loads.append("}")
            work = self.element_work(code, values, row_reductions + all_reductions,
                                     "kf_cols", vec, full)
            if guarded:
                work = [f"if (iy < {n_rows}) {{  // the same for the whole {owner}: a "
                        f"{owner} owns its rows", *indent(work, 1), "}"]
            else:  # rows past the end only feed accumulators that are never flushed
                work = ["// (no stores or row-indexed reads: rows past the end are computed "
                        "on clamped loads, never flushed)", *work]
            compute = [
                "#pragma unroll", f"for (int kf_u = 0; kf_u < {unroll}; ++kf_u) {{",
                *indent(chunk, 1), "  (void)ix; (void)kf_cols;  // (unused by some groups)",
                "  #pragma unroll", f"  for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                "    const int iy = kf_row0 + kf_k;" if guarded else "",
                *indent(work, 2), "  }", "}"]
            compute = [line for line in compute if line]
            return ["// stage 1: every load of the step first (in flight together)", *loads,
                    "// stage 2: every member at each element, row results accumulated",
                    *compute]

        accumulators = [f"{r.ctype} kf_racc_{r.var}[{rows}][{partials}];  // partial {r.op} of "
                        f"'{r.kernel.name}' per row" + (" and chunk" if partials > 1 else "")
                        for r in row_reductions]
        if row_reductions:
            accumulators += [
                "#pragma unroll", f"for (int kf_k = 0; kf_k < {rows}; ++kf_k)",
                "  #pragma unroll", f"  for (int kf_u = 0; kf_u < {partials}; ++kf_u) {{",
                *[f"    kf_racc_{r.var}[kf_k][kf_u] = {r.identity};" for r in row_reductions],
                "  }"]
        flush = []
        stored = group.stored_rows(variant)
        if group.epilogue:  # (normalize: whole rows) results, then the epilogue, per row
            flush = self.epilogue_flush(rows, partials, n_rows)
        for reduce in row_reductions if not group.epilogue else ():
            if stored:  # the warp owns whole rows: its result is the row's, no atomic
                write = (f"  if (kf_tx == 0 && kf_row0 + kf_k < {n_rows}) "
                         f"{reduce.var}[kf_row0 + kf_k] = kf_part;")
                how = (f"one plain store per row (the {owner} owns whole rows: no fill, no "
                       "atomic)")
            else:
                write = (f"  if (kf_tx == 0 && kf_row0 + kf_k < {n_rows}) kf_atomic_{reduce.op}("
                         f"&{reduce.var}[kf_row0 + kf_k], kf_part);")
                how = "one atomic per row and span"
            flush += [
                "#pragma unroll",
                f"for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{  // '{reduce.kernel.name}': "
                f"each row over the {owner}, {how}",
                *indent(row_total(reduce, partials, "kf_part", block=variant.block_rows), 1),
                write,
                "}"]
        rest = [f"for (; kf_cs < kf_c1; kf_cs += {step}) {{  // the rest: masked (and "
                "unaligned)", *indent(step_lines(False), 1), "}"]
        if variant.block_rows:
            # One chunk per iteration, not unrolled: ptxas sizes the registers for the
            # heaviest path, and a rest unrolled like the steps (masked loads all in flight)
            # would take registers, hence resident blocks, from the whole-step path.
            rest = ["#pragma unroll 1",
                    f"for (; kf_cs < kf_c1; kf_cs += {bx * v}) {{  // the rest: one masked "
                    "chunk per thread and iteration (and unaligned)",
                    *indent(step_lines(False, 1), 1), "}"]
        walk = [
            f"for (int kf_it = 0; kf_it < {iters}; ++kf_it) {{  // serial iterations: row groups",
            f"  const int kf_row0 = (kf_by * {iters} + kf_it) * {by * rows} + kf_ty * {rows};",
            f"  if (kf_row0 >= {n_rows}) break;  // the same for the whole {owner}"
            + (" (no barrier inside)" if owner == "warp" else ""),
            *indent(accumulators, 1),
            "  int kf_cs = kf_c0;",
            f"  if (kf_vec) {{  // whole aligned steps: straight {variant.vector_bytes}-byte loads",
            f"    for (; kf_cs + {step} <= kf_c1; kf_cs += {step}) {{",
            *indent(step_lines(True), 3),
            "    }",
            "  }",
            *indent(rest, 1),
            *indent(flush, 1),
            "}",
        ]
        inner = [*self.accumulator_lines(all_reductions), *walk]
        for reduce in all_reductions:
            inner += self.block_atomic_lines(reduce)
        vec = self.aligned_flag(group.tile_inputs + group.stores + group.col_inputs, n_cols)
        span = variant.span
        spans = [f"const int kf_spans = ({n_cols} + {span} - 1) / {span};",
                 "for (int kf_bs = blockIdx.y; kf_bs < kf_spans; "
                 "kf_bs += gridDim.y) {",
                 f"  const int kf_c0 = kf_bs * {span};",
                 f"  const int kf_c1 = min({n_cols}, kf_c0 + {span});"]
        if not variant.span:
            spans = ["{  // one span: whole rows", "  const int kf_c0 = 0;",
                     f"  const int kf_c1 = {n_cols};"]
        mapping = (f"// stream mapping: warp ty owns rows row0 + ty * {rows} .. +{rows - 1} "
                   f"and walks along them, {unroll} x {v} column(s) per row, thread and step")
        if variant.block_rows:
            mapping = (f"// stream mapping, block rows: the block's {bx} threads own rows row0 .. "
                       f"+{rows - 1} and walk along them, {unroll} x {v} column(s) per row, "
                       "thread and step")
        body = [
            mapping,
            "const int kf_tx = threadIdx.x, kf_ty = threadIdx.y;",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte accesses where "
            "aligned",
            *(["{  const int kf_by = blockIdx.x;  // the grid has one block per row group"]
              if not variant.blocks else  # (a grid-stride loop measured 1% slower on SGEMV)
              [f"const int kf_row_blocks = ({n_rows} + {by * rows * iters - 1}) / "
               f"{by * rows * iters};",
               "for (int kf_by = blockIdx.x; kf_by < kf_row_blocks; kf_by += gridDim.x) {"]),
            *indent(spans, 1),
            *indent(inner, 2),
            "  }",
            "}",
        ]
        # a persistent grid loops over the row groups; else one block per row group, no loop
        grid = (GridAxis((rows_symbol,), by * rows * iters, variant.blocks) if variant.blocks
                else GridAxis((rows_symbol,), by * rows * iters, covering=True),
                GridAxis((cols_symbol,), variant.span, GRID_LIMITS[1]) if variant.span
                else GridAxis(), GridAxis())
        return body, grid

    def epilogue_flush(self, rows: int, unroll: int, n_rows: str) -> list[str]:
        """Whole rows: each row's reductions over the warp, then lane 0 evaluates the epilogue
        at that row and stores what must reach memory (the epilogue's outputs; a reduction's
        own result only when read outside the group or returned)."""
        group = self.group
        results = {r.kernel.output: f"kf_row_{r.var}" for r in group.row_reductions()}
        lines = []
        owner = "block" if self.variant.block_rows else "warp"
        for reduce in group.row_reductions():
            lines += row_total(reduce, unroll, f"kf_row_{reduce.var}",
                               f"  // '{reduce.kernel.name}': the row over the {owner} (the "
                               f"{owner} owns it whole)", block=self.variant.block_rows)

        names = ", ".join(f"'{k.name}'" for k in group.epilogue)
        lines += [f"if (kf_tx == 0 && kf_row0 + kf_k < {n_rows}) {{  // epilogue {names} at "
                  "this row: one plain store per row and output, no fill, no atomic",
                  "  const int iy = kf_row0 + kf_k;",
                  *indent(self.epilogue_lines(results, "iy", group.domain[:1]), 1), "}"]
        return ["#pragma unroll", f"for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                *indent(lines, 1), "}"]
