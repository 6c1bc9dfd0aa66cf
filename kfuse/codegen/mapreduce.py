"""Fused map / reduce / nested map-reduce kernels for BLAS-1/2 groups (Filipovič et al. 2015, §5).

A *map/reduce group* (see :func:`kfuse.fusion.legality.mapreduce_shape_reason`) iterates
over a vector or a row-major matrix; its members are maps and reductions read at the point
itself (vectors broadcast along the rows or the columns of the matrix). All members share
one thread-to-data and one block-to-data mapping, which is what makes them fusible (F1):

- **vector** (or a matrix read only elementwise): each thread takes ``V`` consecutive
  elements (one 16-byte load where the pointers are aligned, ``V`` scalar loads otherwise
  and at the end), ``iters`` chunks per block (serial iterations), ``threads`` apart; a
  variant may cap the grid at what the device holds at once (a persistent grid);
- **matrix**: a block of 32 x ``by`` threads owns a column tile of ``TN = 32 V`` columns and
  walks ``iters`` tiles of ``TM`` rows (serial iterations along the rows, §5.1). Thread
  ``(tx, ty)`` owns the columns ``(bx*32 + tx)*V ..`` and the rows ``ty, ty+by, ..`` of each
  tile: every row of the matrix is read by one warp, 16 bytes per thread, coalesced.
  Vectors indexed by column are *invariant loads*, read once per block into registers;
  vectors indexed by row are read once per row.

Reductions are combined from on-chip partial results with atomics into outputs the launcher
sets to the identity first (``LaunchSpec.initial_values``), except where one warp owns whole
rows (the stream mapping without column spans): there each row's result is complete inside
the warp and is written with a plain store, and the output needs no fill:

- along a row (``A x``): the row's ``V`` values per thread, then either warp shuffles
  (``rowsum="shuffle"``) or the paper's tile in shared memory (``rowsum="smem"``: the values
  are staged in a ``32 x (TN + pad)`` tile, padded so that both the column-wise staging and
  the row-wise sums are free of bank conflicts, summed row by row; a ``by x 32`` buffer
  combines the warps); one atomic per row and column tile;
- along a column (``Aᵀ y``): accumulated in registers across all rows a thread visits (an
  *accumulated* reduction, zeroed before the loop and stored after it, §5.1), combined over
  the block's warps in shared memory, one atomic per column and block; with *whole
  columns* (a grid of column tiles, each block walking every row) one plain store per
  column and no fill;
- over everything (``dot``): a block reduction, one atomic per block.

A group may also carry an elementwise *epilogue*: maps over the reduced vector that read
the row reductions at their own row (SGEMV's ``z = alpha A x + beta y``) or the column
reductions at their own column (SGEMVT's ``x = beta Aᵀ y + z``). Only the stream mapping
without column spans serves a row epilogue, only whole columns a column epilogue
(legality: :func:`kfuse.fusion.legality.epilogue_violations`): once the warp (block) has
combined a row (column), one thread evaluates the epilogue there and stores its outputs
(and the reduction's own result only where the plan needs it in memory): one launch, no
intermediate written or read back. Members that read a row reduction at its row while
iterating over the matrix again (ATAX's ``Aᵀ (A x)``) follow it only under *held rows*
(:mod:`kfuse.codegen.mapreduce_held`): the block holds the whole row in registers, so the
row's result is complete while its values are still on chip.

Blocks take the rows, chunks or column tile of their own index (the grid covers them:
``GridAxis.covering``); only persistent grids (``gG``) loop. Where a block's whole column
tile is inside and aligned, the tile mapping reads it with straight vector loads (no masks,
``kf_full``), else every access is masked.

Shared memory is one array per kernel; elements get offsets by lifetime (interval
allocation, §3.4) and ``__syncthreads()`` goes exactly where the paper's rules B1 (a routine
reads an element written with another thread-to-data mapping) and B2 (a routine writes
storage that overlaps an element accessed since the last barrier) ask for it (§3.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kfuse.codegen.barriers import Routine, SharedAccess, place_barriers
from kfuse.codegen.cexpr import (
    EmitState,
    ExprEmitter,
    c_name,
    comment_text,
    indent,
    param_list,
    size_var,
    sizes_of,
)
from kfuse.codegen.mapreduce_held import HeldBody
from kfuse.codegen.mapreduce_stream import StreamBody
from kfuse.codegen.program import (
    GRID_LIMITS,
    GridAxis,
    KernelParam,
    KernelSource,
    LaunchSpec,
    launch_bounds,
)
from kfuse.cuda_limits import WARP
from kfuse.fusion.mapreduce import (
    MapReduceGroup,
    Reduce,
    row_padding,
)
from kfuse.ir.expr import C_TYPES, Load
from kfuse.ir.graph import Graph, Kernel
from kfuse.ir.reduce_ops import identity_value
from kfuse.schedule.forms import MapReduceVariant, is_variant_text
from kfuse.schedule.shared_memory import SharedElement

HELPERS = r"""#ifndef KF_MAPREDUCE_HELPERS
#define KF_MAPREDUCE_HELPERS
// ----- kfuse map-reduce helpers (kfuse.codegen.mapreduce) -----
// The word of one vector access of B bytes (16: uint4, 8: uint2; other sizes: none).
template <int B> struct kf_mr_word { typedef unsigned char type; static const bool ok = false; };
template <> struct kf_mr_word<16> { typedef uint4 type; static const bool ok = true; };
template <> struct kf_mr_word<8> { typedef uint2 type; static const bool ok = true; };

// Load V consecutive elements: one 16-byte (or 8-byte) load when allowed and all V exist,
// else 'count' scalar loads (the rest read as 0: callers mask them).
template <int V, typename T>
KF_DEVICE void kf_mr_load(const T* p, int count, bool vec, T (&v)[V]) {
  typedef kf_mr_word<int(V * sizeof(T))> Word;
  typedef typename Word::type W;
  if constexpr (V > 1 && Word::ok) {
    if (vec && count == V) {
      union { W w; T e[V]; } u;
      u.w = *reinterpret_cast<const W*>(p);
      for (int k = 0; k < V; ++k) v[k] = u.e[k];
      return;
    }
  }
  for (int k = 0; k < V; ++k) v[k] = k < count ? p[k] : T(0);
}

// Store the first 'count' of V consecutive elements (one 16-byte or 8-byte store when
// allowed).
template <int V, typename T>
KF_DEVICE void kf_mr_store(T* p, int count, bool vec, const T (&v)[V]) {
  typedef kf_mr_word<int(V * sizeof(T))> Word;
  typedef typename Word::type W;
  if constexpr (V > 1 && Word::ok) {
    if (vec && count == V) {
      union { W w; T e[V]; } u;
      for (int k = 0; k < V; ++k) u.e[k] = v[k];
      *reinterpret_cast<W*>(p) = u.w;
      return;
    }
  }
  for (int k = 0; k < V; ++k) if (k < count) p[k] = v[k];
}

// Combine a value over the 32 lanes of a warp (every lane gets the result).
template <int OP, typename T>
KF_DEVICE T kf_mr_warp_reduce(T v) {
  for (int d = 16; d > 0; d >>= 1) v = kf_combine<OP, T>(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}
#endif  // KF_MAPREDUCE_HELPERS"""


# ---------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Code generation
# ---------------------------------------------------------------------------------------------

def group_kernel(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                 variant: object = None) -> tuple[KernelSource, LaunchSpec]:
    """The kernel (helpers and comments before it) and the launch of one map/reduce group."""
    group = MapReduceGroup(graph, members, outputs)
    if isinstance(variant, MapReduceVariant):
        chosen = variant
    elif is_variant_text(variant):
        chosen = MapReduceVariant.parse(variant)
    else:
        chosen = group.default_variant()
    chosen = group.normalize(chosen)
    builder = _Builder(group, chosen)
    return builder.build()


@dataclass
class _Builder(StreamBody, HeldBody):
    group: MapReduceGroup
    variant: MapReduceVariant
    row_index: str = ""  # matrices: tile loads are kept per row of the thread ("[kf_k]")
    col_index: str = ""  # stream mapping: column vectors are kept per step chunk ("[kf_u]")
    names_used: int = 0  # C names the point code took (the epilogue's continue after them)
    # held rows: C values answering reads of the row reductions (the fed members' phase)
    held_values: dict[str, str] = field(default_factory=dict)
    # (size symbol, largest value) the kernel can run at (held rows: the row's columns)
    size_limits: tuple[tuple[str, int], ...] = ()

    # -- shared pieces --------------------------------------------------------------------------
    @property
    def v(self) -> int:
        return self.group.width(self.variant)

    def describe(self) -> list[str]:
        group, variant = self.group, self.variant
        tm, tn = group.tile(variant)
        kinds = {"row": "along each row (A x)", "col": "along each column (A^T y)",
                 "all": "over all elements"}
        fused = len(group.members) > 1
        lines = [f"// kfuse {'fused ' if fused else ''}map-reduce kernel of pipeline "
                 f"'{group.graph.name}': {', '.join(k.name for k in group.members)}"]
        for kernel in group.members:
            prefix = f"//   [{kernel.name}] " if fused else "//   "
            role = (f"epilogue map over the reduced "
                    f"{'columns' if group.epilogue_kind == 'col' else 'rows'}"
                    if kernel in group.epilogue else "map")
            for reduce in group.reductions:
                if reduce.kernel is kernel:
                    role = f"{reduce.op}-reduction {kinds[reduce.kind]}"
            if kernel in group.fed:
                role = (f"{'map' if kernel.reduction is None else role}, fed by the row "
                        "reductions at its row (held rows)")
            lines.append(f"{prefix}{role}" + (f", written at {comment_text(kernel.where)}"
                                              if kernel.where else ""))
        shape = "vector" if group.ndim == 1 else "matrix"
        if group.flat:
            lines.append(f"//   {shape} of {' x '.join(group.domain)}: {self.v} elements per "
                         f"thread, {variant.iters} chunk(s) per block of {variant.threads[0]}"
                         " threads")
        elif variant.held_rows:
            lines.append(f"//   matrix rows held whole by blocks of {variant.threads[0]} "
                         f"threads, {variant.unroll} x {self.v} columns per thread, contiguous "
                         f"rows per block (at most {variant.blocks} blocks)")
        else:
            walk = ("every row of its columns" if variant.whole_columns
                    else f"{variant.iters}")
            rowsum = f"; row reductions by {variant.rowsum}" if group.row_reductions() else ""
            lines.append(f"//   matrix tiles of {tm} x {tn}, {walk} per block of "
                         f"{variant.threads[0]} x {variant.threads[1]} threads"
                         f"{' (whole columns)' if variant.whole_columns else ''}{rowsum}")
        lines.append(f"//   variant {variant}; writes {', '.join(repr(o) for o in group.outputs)}")
        return lines

    def parameters(self) -> tuple[KernelParam, ...]:
        """The kernel's arguments: buffers, sizes and runtime parameters."""
        group = self.group
        symbols = sizes_of(group.graph, group.reads + list(group.outputs), group.domain)
        params = param_list(group.graph, group.reads, list(group.outputs), symbols,
                            group.params)
        return tuple(KernelParam(*p) for p in params)

    def aligned_flag(self, buffers: Sequence[str], stride: str | None,
                     known: bool = False) -> str:
        """C condition for vector accesses: pointers aligned (and rows a whole number of V).
        ``known``: the test compiles away in programs for aligned arrays (``kf_aligned``).
        Only the 1-D chunks take it: on an H200 it made MADD and WAXPBY 0.2% faster, but
        BiCGK's held rows 0.75% and GESUMMV's streamed rows 0.3% slower (ptxas schedules the
        straight pass differently; docs/journal/benchmarks.md, session 16)."""
        if self.v == 1 or not buffers:
            return "false"
        size = self.variant.vector_bytes
        test = "kf_aligned" if known else "kf_pointer_aligned"
        terms = [f"({stride} % {self.v} == 0)"] if stride else []
        terms += [f"{test}({c_name(name)}, {size})" for name in buffers]
        return " && ".join(terms)

    def hook(self, load: Load, emitter: ExprEmitter) -> str | None:
        """Answer a read: intermediates evaluated in registers, tiles and invariants loaded."""
        group = self.group
        if load.buffer in self.held_values:
            return self.held_values[load.buffer]
        producer = group.produced.get(load.buffer)
        if producer is not None:
            emitter.state.evaluated.add((producer.name, emitter.coords))
            return emitter.emit(producer.body)  # type: ignore[arg-type]
        element = emitter.coords[-1][1]
        if load.dims == tuple(range(group.ndim)) and load.buffer in group.tile_inputs:
            return f"kf_ld_{c_name(load.buffer)}{self.row_index}[{element}]"
        if group.ndim == 2 and load.dims == (1,) and load.buffer in group.col_inputs \
                and not group.flat:
            return f"kf_col_{c_name(load.buffer)}{self.col_index}[{element}]"
        return None

    def points(self, coords_of: Callable[[int], tuple], kernels: Sequence[Kernel] | None = None
               ) -> tuple[list[str], dict[str, list[str]]]:
        """Straight-line code evaluating every stored map and reduction of ``kernels`` (the
        core by default) at the V points.

        ``coords_of(e)`` gives the emitter coordinates of element ``e``. Returns the lines
        and, per output buffer, the C variable of its value at each element.
        """
        group = self.group
        emitter = ExprEmitter(group.graph, coords_of(0), group.domain, None, self.hook)
        values: dict[str, list[str]] = {}
        for element in range(self.v):
            point = emitter.at(coords_of(element))
            for kernel in group.core if kernels is None else kernels:
                # (a reduction only an epilogue reads is still accumulated)
                if kernel.output not in group.outputs and kernel.reduction is None:
                    continue
                point.state.evaluated.add((kernel.name, point.coords))
                values.setdefault(kernel.output, []).append(
                    point.emit(kernel.body))  # type: ignore[arg-type]
        self.names_used = emitter.state.counter
        return emitter.lines, values

    @staticmethod
    def block_atomic_lines(reduce: Reduce) -> list[str]:
        """A full reduction's partials combined over the block, one atomic per block (every
        thread of the block runs these lines: they hold barriers)."""
        return [f"// '{reduce.kernel.name}': combine over the block, one atomic per block",
                f"kf_acc_{reduce.var} = kf_block_reduce<{reduce.code}, {reduce.ctype}>("
                f"kf_acc_{reduce.var}, {reduce.identity});",
                f"if (threadIdx.x == 0 && threadIdx.y == 0) kf_atomic_{reduce.op}("
                f"&{reduce.var}[0], kf_acc_{reduce.var});"]

    def store_lines(self, values: dict[str, list[str]], address: str, count: str,
                    vec: str, names: Sequence[str] | None = None) -> list[str]:
        """Stores of the maps ``names`` (the core's stored maps by default) at ``address``."""
        lines = []
        for name in self.group.stores if names is None else names:
            ctype = C_TYPES[self.group.graph.buffers[name].dtype]
            items = ", ".join(f"({ctype}){value}" for value in values[name])
            lines.append(f"{{ const {ctype} kf_st[{self.v}] = {{{items}}}; "
                         f"kf_mr_store<{self.v}>({c_name(name)} + {address}, {count}, {vec}, "
                         "kf_st); }")
        return lines

    def tile_loads(self, address: str, count: str, vec: str, declare: bool = True
                   ) -> list[str]:
        lines = []
        for name in self.group.tile_inputs:
            ctype = C_TYPES[self.group.graph.buffers[name].dtype]
            var = c_name(name)
            prefix = f"{ctype} kf_ld_{var}[{self.v}]; " if declare else ""
            lines.append(f"{prefix}kf_mr_load<{self.v}>({var} + {address}, {count}, {vec}, "
                         f"kf_ld_{var}{self.row_index});")
        return lines

    def launch(self, params: tuple[KernelParam, ...], grid: tuple[GridAxis, GridAxis, GridAxis]
               ) -> LaunchSpec:
        group = self.group
        initial = tuple((r.kernel.output, identity_value(r.op, r.dtype))
                        for r in group.atomic_reductions(self.variant))
        return LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                          (self.variant.threads[0], self.variant.threads[1], 1), grid, initial,
                          size_limits=self.size_limits,
                          blocks_walk=bool(self.variant.blocks) or self.variant.whole_columns)

    def build(self) -> tuple[KernelSource, LaunchSpec]:
        params = self.parameters()
        if self.group.flat:
            body, grid = self.vector_body()
        elif self.variant.held_rows:
            body, grid = self.held_body()
        elif self.variant.rowsum == "stream":
            body, grid = self.stream_body()
        else:
            body, grid = self.matrix_body()
        threads = self.variant.threads[0] * self.variant.threads[1]
        kernel = KernelSource((HELPERS, "", *self.describe()), self.group.symbol,
                              launch_bounds(threads), params, tuple(indent(body, 1)))
        return kernel, self.launch(params, grid)

    # -- vectors (and matrices read elementwise) --------------------------------------------------
    def vector_body(self) -> tuple[list[str], tuple[GridAxis, GridAxis, GridAxis]]:
        group, variant, v = self.group, self.variant, self.v
        bx, iters = variant.threads[0], variant.iters
        count = " * ".join(["(kf_index_t)" + size_var(group.domain[0])]
                           + [size_var(s) for s in group.domain[1:]])
        coords = tuple((name, 0) for name in ("iy", "ix")[-group.ndim:])

        def coords_of(element: int) -> tuple:
            return coords[:-1] + (("i", element),)

        code, values = self.points(coords_of)
        reductions = group.all_reductions()

        def chunk_lines(full: bool) -> list[str]:
            """One chunk of the thread: loads, every member, stores and partial results.
            ``full``: every element inside and aligned (straight accesses, no masks)."""
            count, vec = (str(v), "true") if full else ("kf_count", "kf_vec")
            accumulate = []
            for reduce in reductions:
                for element, value in enumerate(values[reduce.kernel.output]):
                    guard = f"if ({element} < kf_count) " if element and not full else ""
                    accumulate.append(f"{guard}kf_acc_{reduce.var} = kf_combine<{reduce.code}, "
                                      f"{reduce.ctype}>(kf_acc_{reduce.var}, "
                                      f"({reduce.ctype}){value});")
            return ["// stage 1: load", *self.tile_loads("i", count, vec),
                    "// stage 2: compute every member at each element", *code,
                    "// stage 3: store the maps, accumulate the reductions",
                    *self.store_lines(values, "i", count, vec), *accumulate]

        vec = self.aligned_flag(group.tile_inputs + group.stores, None, known=True)
        body = [
            "// thread-to-data mapping shared by every member (Filipovič et al. 2015 F1): thread t of a",
            f"// block takes {v} consecutive element(s) of each of {iters} chunk(s) of "
            f"{bx * v}",
            f"const kf_index_t kf_n = {count};",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte loads and stores where "
            "aligned",
            f"const kf_index_t kf_chunk = (kf_index_t){bx * v};",
        ]
        if variant.blocks:  # a persistent grid: each block loops over the chunk groups
            body += [f"const kf_index_t kf_blocks = (kf_n + kf_chunk * {iters} - 1) / "
                     f"(kf_chunk * {iters});",
                     "for (kf_index_t kf_b = blockIdx.x; kf_b < kf_blocks; kf_b += gridDim.x) {"]
        else:
            body.append("{  const kf_index_t kf_b = blockIdx.x;  // the grid has one block per "
                        "chunk group")
        inner = [f"{r.ctype} kf_acc_{r.var} = {r.identity};  // partial {r.op} of "
                 f"'{r.kernel.name}'" for r in reductions]
        aligned = "kf_vec && " if v > 1 else ""
        inner += [  # (a size compiled in that is a whole number of blocks folds the test)
            f"const bool kf_full = {aligned}(kf_n % {bx * v * iters} == 0 || "
            f"(kf_b + 1) * kf_chunk * {iters} <= kf_n);  // the same for the whole block",
            f"for (int kf_it = 0; kf_it < {iters}; ++kf_it) {{",
            f"  const kf_index_t i = (kf_b * {iters} + kf_it) * kf_chunk + "
            f"(kf_index_t)threadIdx.x * {v};",
            "  if (kf_full) {  // the block's chunks inside and aligned: straight accesses, no "
            "masks",
            *indent(chunk_lines(True), 2),
            "  } else {",
            f"    const int kf_count = i < kf_n ? (int)(kf_n - i < {v} ? kf_n - i : {v}) : 0;",
            "    if (kf_count > 0) {",
            *indent(chunk_lines(False), 3),
            "    }",
            "  }",
            "}",
        ]
        for reduce in reductions:
            inner += self.block_atomic_lines(reduce)
        body += [*indent(inner, 1), "}"]
        # a persistent grid loops over the chunks; else one block per chunk group, no loop
        grid = (GridAxis(group.domain, bx * v * iters, variant.blocks) if variant.blocks
                else GridAxis(group.domain, bx * v * iters, covering=True),
                GridAxis(), GridAxis())
        return body, grid

    # -- matrices ------------------------------------------------------------------------------
    def matrix_body(self) -> tuple[list[str], tuple[GridAxis, GridAxis, GridAxis]]:
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
        code, values = self.points(coords_of)
        address = f"(kf_index_t)iy * {n_cols} + ix"
        declarations = [f"{C_TYPES[group.graph.buffers[name].dtype]} kf_ld_{c_name(name)}"
                        f"[{rows}][{v}];" for name in group.tile_inputs]

        def tile_pass(full: bool) -> tuple[list[str], object]:
            """The lines of one pass over a tile (and the barrier state after it). ``full``:
            the block's whole column tile is inside and aligned (straight vector accesses,
            no masks); else every access masked by ``kf_cols``."""
            count, vec = (str(v), "true") if full else ("kf_cols", "kf_vec")

            def guard(element: int) -> str:
                return "" if full else f"if ({element} < kf_cols) "

            load_rows = [
                "// stage 1: the elements of all this thread's rows of the tile first (loads "
                "in",
                f"// flight together; {variant.vector_bytes}-byte loads where aligned)",
                *declarations,
                "#pragma unroll",
                f"for (int kf_k = 0; kf_k < {rows}; ++kf_k) {{",
                f"  const int iy = kf_row0 + kf_ty + kf_k * {by};",
                f"  if (iy < {n_rows}) {{",
                *indent(self.tile_loads(address, count, vec, declare=False), 2),
                "  }",
                "}",
            ] if group.tile_inputs else []
            row_lines = [
                "// stage 2: every member at each element (intermediates stay in registers)",
                *code,
                "// stage 3: store the maps, accumulate the reductions",
                *self.store_lines(values, address, count, vec),
            ]
            for reduce in group.col_reductions():
                for element, value in enumerate(values[reduce.kernel.output]):
                    row_lines.append(f"{guard(element)}kf_acc_{reduce.var}[{element}] = "
                                     f"kf_combine<{reduce.code}, {reduce.ctype}>("
                                     f"kf_acc_{reduce.var}[{element}], ({reduce.ctype}){value});")
            for reduce in group.all_reductions():
                for element, value in enumerate(values[reduce.kernel.output]):
                    row_lines.append(f"{guard(element)}kf_acc_{reduce.var} = "
                                     f"kf_combine<{reduce.code}, {reduce.ctype}>("
                                     f"kf_acc_{reduce.var}, ({reduce.ctype}){value});")
            for reduce in group.row_reductions():
                masked = [f"({reduce.ctype}){value}" if full else
                          f"{element} < kf_cols ? ({reduce.ctype}){value} : {reduce.identity}"
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
        for reduce in group.all_reductions():
            accumulators.append(f"{reduce.ctype} kf_acc_{reduce.var} = {reduce.identity};")
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

    # -- matrices, the stream mapping -----------------------------------------------------------
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

    def epilogue_lines(self, results: dict[str, str], index: str,
                       domain: tuple[str, ...]) -> list[str]:
        """Statements evaluating the epilogue at point ``index`` (a C variable) of the reduced
        vector over ``domain`` and storing what must reach memory: the epilogue's outputs,
        and a reduction's own result (``results``: C expressions) only where the plan needs
        it. Reads of other epilogue members are evaluated in registers."""
        group = self.group

        def hook(load: Load, emitter: ExprEmitter) -> str | None:
            if load.buffer in results:
                return results[load.buffer]
            producer = group.produced.get(load.buffer)
            if producer is not None:  # another epilogue member, evaluated in registers
                return emitter.emit(producer.body)  # type: ignore[arg-type]
            return None

        emitter = ExprEmitter(group.graph, ((index, 0),), domain, None, hook,
                              EmitState(counter=self.names_used))
        values = {k.output: emitter.emit(k.body)  # type: ignore[arg-type]
                  for k in group.epilogue if k.output in group.epilogue_stores}
        stores = [f"{c_name(name)}[{index}] = {results[name]};" for name in group.outputs
                  if name in results]
        stores += [f"{c_name(name)}[{index}] = ({C_TYPES[group.graph.buffers[name].dtype]})"
                   f"{values[name]};" for name in group.epilogue_stores]
        return [*emitter.lines, *stores]

    def all_flush(self) -> list[Routine]:
        routines = []
        for reduce in self.group.all_reductions():
            routines.append(Routine(f"store {reduce.kernel.name}", [
                f"// '{reduce.kernel.name}': combine over the block, one atomic per block",
                f"kf_acc_{reduce.var} = kf_block_reduce<{reduce.code}, {reduce.ctype}>("
                f"kf_acc_{reduce.var}, {reduce.identity});",
                f"if (kf_tx == 0 && kf_ty == 0) kf_atomic_{reduce.op}(&{reduce.var}[0], "
                f"kf_acc_{reduce.var});"], barrier_inside=True))
        return routines


__all__ = ["HELPERS", "group_kernel"]
