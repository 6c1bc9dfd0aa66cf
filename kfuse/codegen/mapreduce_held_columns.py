"""The "held columns" map-reduce kernel: a block walks every row of a strip of columns.

Column reductions read back at every element of their column (a column standardisation: the
mean of each column, the variance of the centred values, then the map) are complete only
once every row of the column has been folded. A block of ``C x R`` threads owns a strip of
``C x V`` columns (``V`` consecutive columns per thread, ``C x V x 4`` bytes of each row: whole
sectors) and walks all of its rows, ``R x unroll`` rows a segment, a pass per phase as rows
held in segments do (:mod:`kfuse.codegen.mapreduce_held`, whose walk this reuses): each
thread folds its rows into its ``V`` columns' accumulators, and at the end of a pass the
block combines them over its rows of threads (shuffles between lanes of the same column,
each warp's part in shared memory, one barrier), so every thread has its columns' results for
the passes after. The first segments of what later passes read again can be stashed in
shared memory. One kernel, where three read the matrix three times.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.codegen.cexpr import c_name, indent, size_var
from kfuse.codegen.mapreduce_held import HeldKernel
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid
from kfuse.codegen.program import GridAxis
from kfuse.cuda_limits import WARP
from kfuse.fusion.mapreduce import Reduce
from kfuse.ir.graph import Kernel

COLUMN_HELPER = r"""#ifndef KF_COLUMN_HELPER
#define KF_COLUMN_HELPER
// Combine a value over the lanes of a warp that hold the same column: lanes FIRST apart
// (the threads across a strip), FIRST a power of two (every such lane gets the result).
template <int OP, int FIRST, typename T>
KF_DEVICE T kf_mr_warp_reduce_columns(T v) {
  for (int d = FIRST; d < 32; d <<= 1) v = kf_combine<OP, T>(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}
#endif  // KF_COLUMN_HELPER"""


class HeldColumnsKernel(HeldKernel):
    """A block per strip of columns, walking every row of it once per phase."""

    held_kind = "col"
    walked = "the strip's segments of rows"

    @property
    def accumulation(self) -> dict[str, Accumulation]:
        return {"col": Accumulation("kf_cacc_{var}[{element}]", "identity"),
                "all": Accumulation("kf_acc_{var}")}

    def mapping_text(self) -> str:
        across, down = self.variant.threads
        return (f"a strip of {across * self.v} columns per block of {across} x {down} "
                f"threads, every row of it walked in segments of "
                f"{down * self.variant.unroll} rows, a pass per phase")

    def helpers(self) -> tuple[str, ...]:
        return (*super().helpers(), COLUMN_HELPER)

    def thread_slot(self) -> str:
        return "kf_tid"

    def accumulator_declaration(self, reduce: Reduce) -> str:
        identities = ", ".join([reduce.identity] * self.v)
        return (f"{reduce.ctype} kf_cacc_{reduce.var}[{self.v}] = {{{identities}}};  // this "
                f"thread's part of its columns' '{reduce.kernel.name}'")

    def combine(self, reductions: Sequence[Reduce]) -> tuple[list[str], dict[str, str]]:
        """The strip's column ``reductions`` over the block: every thread gets its own
        columns' results (``kf_colres_*``); stored by the first row of threads."""
        group, v = self.group, self.v
        across, down = self.variant.threads
        warps = across * down // WARP
        n_cols = size_var(group.domain[1])
        lines = []
        for reduce in reductions:
            var, ctype = reduce.var, reduce.ctype
            lines += [
                f"for (int e = 0; e < {v}; ++e) {{",
                f"  kf_cacc_{var}[e] = kf_mr_warp_reduce_columns<{reduce.code}, {across}, "
                f"{ctype}>(kf_cacc_{var}[e]);",
                f"  if (kf_lane < {across}) kf_cparts_{var}[kf_warp][kf_tx * {v} + e] = "
                f"kf_cacc_{var}[e];",
                "}"]
        lines.append("__syncthreads();  // every warp's part of its columns written" if reductions
                     else "// (no column reductions: nothing to combine)")
        for reduce in reductions:
            var, ctype = reduce.var, reduce.ctype
            lines += [
                f"{ctype} kf_colres_{var}[{v}];",
                f"for (int e = 0; e < {v}; ++e) {{",
                f"  kf_colres_{var}[e] = {reduce.identity};",
                f"  for (int w = 0; w < {warps}; ++w) kf_colres_{var}[e] = "
                f"kf_combine<{reduce.code}, {ctype}>(kf_colres_{var}[e], "
                f"kf_cparts_{var}[w][kf_tx * {v} + e]);",
                "}"]
            if reduce.kernel.output in group.outputs:
                lines.append(f"if (kf_ty == 0) for (int e = 0; e < {v} && kf_strip + kf_tx * "
                             f"{v} + e < {n_cols}; ++e) {var}[kf_strip + kf_tx * {v} + e] = "
                             f"kf_colres_{var}[e];  // one plain store per column")
        return lines, {r.kernel.output: f"kf_colres_{r.var}[{{element}}]" for r in reductions}

    def tail_point(self, element: int) -> tuple[str, str, tuple[str, ...]]:
        """The strip's first row of threads, at the thread's column ``element``."""
        column = f"kf_strip + kf_tx * {self.v} + {element}"
        return (f"kf_ty == 0 && {column} < {size_var(self.group.domain[1])}", column,
                self.group.domain[1:])

    @property
    def elements(self) -> int:
        return self.v

    @property
    def held_length(self) -> str:
        return size_var(self.group.domain[0])

    def running_value(self, var: str) -> str:
        return f"kf_cacc_{var}[{{element}}]"

    def copy_running(self, name: str, var: str, ctype: str, comment: str) -> list[str]:
        return [f"{ctype} kf_{name}_{var}[{self.v}];  // {comment}, per column",
                f"for (int e = 0; e < {self.v}; ++e) kf_{name}_{var}[e] = kf_cacc_{var}[e];"]

    def rescale_lines(self, total: str, before: str, after: str) -> list[str]:
        return [f"for (int e = 0; e < {self.v}; ++e) kf_cacc_{total}[e] *= "
                f"kf_rescale({before}[e], {after.replace('{element}', 'e')});"]

    def copy_accumulator(self, target: str, source: str) -> list[str]:
        return [f"for (int e = 0; e < {self.v}; ++e) kf_cacc_{target}[e] = "
                f"kf_cacc_{source}[e];"]

    def store_result(self, kernel: Kernel, value: str) -> list[str]:
        v, n_cols = self.v, size_var(self.group.domain[1])
        first = f"kf_strip + kf_tx * {v}"
        return ["if (kf_ty == 0) {  // one plain store per column"] + [
            f"  if ({first} + {e} < {n_cols}) {c_name(kernel.output)}[{first} + {e}] = "
            f"{value.replace('{element}', str(e))};" for e in range(v)] + ["}"]

    def body(self) -> tuple[list[str], Grid]:
        group, variant, v = self.group, self.variant, self.v
        across, down = variant.threads
        chunks = variant.unroll
        warps = across * down // WARP
        rows_symbol, cols_symbol = group.domain
        n_rows, n_cols = size_var(rows_symbol), size_var(cols_symbol)
        strip = across * v
        self.segment_extent = down * chunks  # rows a block holds at once
        self.map_chunks([f"const int iy = kf_base + kf_u * {down} + kf_ty;",
                         f"const int ix = kf_strip + kf_tx * {v};",
                         f"const int kf_cols = iy < {n_rows} && ix < {n_cols} ? "
                         f"min({v}, {n_cols} - ix) : 0;"])
        loaded, column_arrays = self.held_arrays()
        shared = [f"__shared__ {r.ctype} kf_cparts_{r.var}[{warps}][{strip}];  // "
                  f"'{r.kernel.name}': each warp's part of the strip's columns"
                  for r in group.col_reductions() + self.centring_reductions()]
        vec = self.held_vector_flag()
        body = [
            f"// held columns: the block's {across} x {down} threads own a strip of {strip} "
            f"columns ({v} per thread) and walk",
            f"// every row of it in segments of {self.segment_extent} rows, a pass per "
            "phase (the first from DRAM, the later ones again,",
            "// from the stash or L2 where the strip is still there)",
            "const int kf_tx = threadIdx.x, kf_ty = threadIdx.y;",
            f"const int kf_tid = kf_ty * {across} + kf_tx, kf_lane = kf_tid & 31, "
            "kf_warp = kf_tid >> 5;",
            "(void)kf_lane; (void)kf_warp;",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte accesses where "
            "aligned",
            f"const int kf_strip = blockIdx.x * {strip};",
            f"const int kf_segments = ({n_rows} + {self.segment_extent - 1}) / "
            f"{self.segment_extent};",
            *shared,
            *self.stash_lines(),
            *self.accumulator_lines(group.all_reductions()),
            "int kf_parity = 0;  // (one strip per block: each part is written once)",
            "(void)kf_parity;",
            "{",
            *indent(self.segmented_walk(loaded + column_arrays), 1),
            *indent(self.tail_lines(), 1),
            "}",
        ]
        self.held_values = {}
        for reduce in group.all_reductions():
            body += self.block_atomic_lines(reduce)
        grid = (GridAxis((cols_symbol,), strip), GridAxis(), GridAxis())
        return body, grid


__all__ = ["COLUMN_HELPER", "HeldColumnsKernel"]
