"""The "held rows" map-reduce kernel: a block holds each of its rows whole in registers.

The block's ``T`` threads load a whole row at once (``unroll`` accesses of ``V`` elements per
thread, every load in flight together), evaluate the group's core at each element, and
combine the row's reductions over the block (warp shuffles, one barrier, every thread gets
the result). The row is still in registers: the members fed by those results (ATAX's
``y = Aᵀ t`` reading ``t = A x`` at its row) go on over the same values, so ``A`` is read
once where two kernels read it twice. Each thread keeps the same columns for every row, so
column reductions accumulate in registers across all of the block's rows (a contiguous
range) and are combined over the blocks with one atomic per column and block at the end.
Rows longer than a block holds go in *segments* (``segmented`` variants): each phase is a
pass over the row, a segment at a time (the first pass from DRAM, the later ones again,
mostly from L2, each walking back from the segment still in registers); a sum of
exponentials past a row maximum goes in the maximum's pass, its thread's part rescaled
whenever the running maximum grows (Milakov and Gimelshein 2018's online normaliser).
Maps of the row's results alone (the group's *tail*: a log-sum-exp ``m + log s``, a standard
deviation) are evaluated after the last phase by the row's first thread, one store per row.
Part of the map-reduce generator (:mod:`kfuse.codegen.mapreduce`), written through its
skeleton (:mod:`kfuse.codegen.mapreduce_skeleton`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kfuse.codegen.cexpr import c_name, indent, size_var, structural_key
from kfuse.codegen.mapreduce_skeleton import Accumulation, Grid, MapReduceKernel
from kfuse.codegen.program import GridAxis
from kfuse.cuda_limits import WARP
from kfuse.fusion.mapreduce import Reduce
from kfuse.ir.expr import (
    C_TYPES,
    SPECIAL_FUNCTIONS,
    VALUE_SIZE,
    Binary,
    Expr,
    Load,
    Unary,
    with_children,
)
from kfuse.ir.graph import Kernel

RESCALE_HELPER = r"""#ifndef KF_RESCALE_HELPER
#define KF_RESCALE_HELPER
// The factor that moves a sum of exp(e - from) to exp(e - to), to >= from (1 where equal:
// a running maximum still at the identity).
template <typename T> KF_DEVICE T kf_rescale(T from, T to) {
  return from == to ? T(1) : T(exp(from - to));
}
#endif  // KF_RESCALE_HELPER"""


L2_LOAD_HELPER = r"""#ifndef KF_L2_LOAD_HELPER
#define KF_L2_LOAD_HELPER
// kf_mr_load with an L2 eviction priority, on 16-byte loads (POLICY 1: evict_last, for a row
// a later pass reads again from L2; 0: evict_first, for its last read), as torch.compile's
// reductions that read a row twice emit them; the host compiler loads plainly.
template <int V, int POLICY, typename S, typename T>
KF_DEVICE void kf_mr_load_l2(const S* p, int count, bool vec, T (&v)[V]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (V * sizeof(S) == 16) {
    if (vec && count == V) {
      unsigned long long policy;
      if (POLICY) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
      else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
      union { unsigned w[4]; S e[V]; } u;
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3])
                   : "l"(p), "l"(policy));
      for (int k = 0; k < V; ++k) v[k] = kf_mr_value(u.e[k]);
      return;
    }
  }
#endif
  kf_mr_load<V>(p, count, vec, v);
}
#endif  // KF_L2_LOAD_HELPER"""


def tree_keys(body: Expr) -> dict[int, tuple]:
    """A hashable key of every node of ``body`` (by ``id``), equal for the same value: the
    structure, with the boundary modes of reads at offset 0 left out (no read at the point
    itself goes outside its array, whatever mode its operator gave it)."""
    keys: dict[int, tuple] = {}
    for node in body.walk():
        plain = replace(node, boundary=None) if isinstance(node, Load) and \
            not any(node.offsets) and node.scales is None and node.indices is None else node
        keys[id(node)] = structural_key(plain, tuple(keys[id(c)] for c in node.children()))
    return keys


def _replaced(body: Expr, found: dict[int, int]) -> Expr:
    """``body`` with its nodes ``found`` (by ``id``: the index of a kept value) read from
    the kept value's registers; top-down, so a kept value's own parts are not visited."""
    if id(body) in found:
        return Load(f"kf_keep_{found[id(body)]}", body.dtype, (), ())
    children = body.children()
    if not children:
        return body
    return with_children(body, tuple(_replaced(child, found) for child in children))


def at(template: str, element: int) -> str:
    """A value template's C value at the thread's element ``element``."""
    return template.replace("{element}", str(element))


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
        held = "in segments" if variant.segmented else "whole"
        return (f"matrix rows held {held} by blocks of {variant.threads[0]} threads, "
                f"{variant.unroll} x {self.v} columns per thread, contiguous rows per block "
                f"(at most {variant.blocks} blocks)")

    def helpers(self) -> tuple[str, ...]:
        helpers = super().helpers()
        if self.variant.segmented and self.held_kind == "row":
            helpers = (*helpers, L2_LOAD_HELPER)
        return (*helpers, RESCALE_HELPER) if self.group.online and (
            self.variant.segmented or self.variant.held_columns) else helpers

    def body(self) -> tuple[list[str], Grid]:
        """Rows held whole by blocks: each phase (the core, then the members fed by the
        row reductions of the phases before) over the row, its row reductions combined."""
        group, variant, v = self.group, self.variant, self.v
        threads, chunks = variant.threads[0], variant.unroll
        warps = threads // WARP
        rows_symbol, cols_symbol = group.domain
        n_rows, n_cols = size_var(rows_symbol), size_var(cols_symbol)
        row_reductions = group.row_reductions()
        segmented = variant.segmented
        segment = threads * v * chunks  # columns a block holds at once
        self.segment_extent = segment

        first = f"kf_base + (kf_u * {threads} + kf_tx) * {v}" if segmented \
            else f"(kf_u * {threads} + kf_tx) * {v}"
        self.map_chunks([f"const int ix = {first};",
                         f"const int kf_cols = ix < {n_cols} ? min({v}, {n_cols} - ix) : 0;"])
        loaded, column_arrays = self.held_arrays()
        invariant = [*column_arrays, *self.over_chunks(
            self.column_vector_lines("[kf_u]", "kf_cols", "kf_vec"))]
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
                  for r in row_reductions + self.centring_reductions()]
        walk = self.segmented_walk(loaded + column_arrays) if segmented \
            else self.held_walk(loaded)
        walk += self.tail_lines()
        self.held_values = {}
        flush = []
        for reduce in group.col_reductions():
            flush += self.over_chunks([f"for (int e = 0; e < kf_cols; ++e) kf_atomic_{reduce.op}("
                                       f"&{reduce.var}[ix + e], kf_acc_{reduce.var}[kf_u][e]);"])
        for reduce in group.all_reductions():
            flush += self.block_atomic_lines(reduce)
        vec = self.held_vector_flag()
        body = [
            f"// held rows: the block's {threads} threads hold each of its rows whole, {chunks} "
            f"x {v} column(s) per thread",
            f"// (rows of at most {segment} columns), and keep the same columns "
            "for every row: a contiguous range of rows per block",
        ] if not segmented else [
            f"// held rows in segments: the block's {threads} threads hold {segment} columns "
            f"of a row at a time ({chunks} x {v} per thread);",
            "// each phase is a pass over the row's segments (the first from DRAM, the later "
            "ones again, from L2",
            "// where the row is still there), a contiguous range of rows per block",
        ]
        body += [
            "const int kf_tx = threadIdx.x, kf_lane = kf_tx & 31, kf_warp = kf_tx >> 5;",
            "(void)kf_lane; (void)kf_warp;",
            f"const bool kf_vec = {vec};  // {variant.vector_bytes}-byte accesses where "
            "aligned",
            *shared,
        ]
        if group.col_inputs and not segmented:
            body += ["// stage 0: vectors indexed by column, loaded once per block and kept "
                     "for every row", *invariant]
        if segmented:
            body.append(f"const int kf_segments = ({n_cols} + {segment - 1}) / {segment};")
            body += self.stash_lines()
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
        if not segmented:
            self.size_limits = ((cols_symbol, segment),)
        grid = (GridAxis((rows_symbol,), 1, variant.blocks), GridAxis(), GridAxis())
        return body, grid

    def tail_lines(self) -> list[str]:
        """The tail (maps over the reduced vector) at each of the thread's results
        (:meth:`tail_point`), from the results it holds after the last phase."""
        group = self.group
        if not group.tail:
            return []
        names = ", ".join(f"'{k.name}'" for k in group.tail)
        lines = [f"// the tail {names}, from the results: one plain store per result and output"]
        for element in range(self.elements):
            condition, index, domain = self.tail_point(element)
            results = {name: at(value, element) for name, value in self.held_values.items()}
            lines += [f"if ({condition}) {{", f"  const int kf_at = {index};",
                      *indent(self.epilogue_lines(results, "kf_at", domain, stored=True), 1),
                      "}"]
        return lines

    def tail_point(self, element: int) -> tuple[str, str, tuple[str, ...]]:
        """(which thread evaluates the tail at its result ``element``, the C index of that
        point of the reduced vector, the vector's domain): the row's first thread, at row
        ``iy``."""
        return "kf_tx == 0", "iy", self.group.domain[:1]

    # -- pieces of the walk -----------------------------------------------------------------
    def map_chunks(self, chunk: list[str]) -> None:
        """The thread's chunk ``kf_u`` at row ``iy``, columns from ``ix`` (``chunk``: the lines
        that set them and ``kf_cols``, the columns inside); matrices row-major."""
        self.row_index, self.col_index = "[kf_u]", "[kf_u]"
        self.address = f"(kf_index_t)iy * {size_var(self.group.domain[1])} + ix"
        self.chunk = [*chunk, "(void)kf_cols;  // (unused by some groups)"]

    def held_vector_flag(self) -> str:
        """C condition for vector accesses to every matrix and column vector the kernel
        reads or stores (pointers aligned, rows a whole number of vectors)."""
        group = self.group
        return self.aligned_flag(group.tile_inputs + group.stores + group.fed_stores
                                 + group.col_inputs, size_var(group.domain[1]))

    def held_arrays(self) -> tuple[list[str], list[str]]:
        """Declarations of the registers a thread keeps its chunks in: of each matrix read at
        the point (``kf_ld_*``), and of each vector read along the columns (``kf_col_*``)."""
        group, v, chunks = self.group, self.v, self.variant.unroll

        def arrays(prefix: str, names: list[str]) -> list[str]:
            return [f"{C_TYPES[group.graph.buffers[name].dtype]} {prefix}{c_name(name)}"
                    f"[{chunks}][{v}];" for name in names]

        return arrays("kf_ld_", group.tile_inputs), arrays("kf_col_", group.col_inputs)

    def over_chunks(self, lines: list[str]) -> list[str]:
        """``lines`` at each of the thread's chunks of the row (``ix``: its first column)."""
        return ["#pragma unroll", f"for (int kf_u = 0; kf_u < {self.variant.unroll}; ++kf_u) {{",
                *indent([*self.chunk, *lines], 1), "}"]

    def evaluate_at_row(self, kernels: Sequence[Kernel]) -> tuple[list[str], dict]:
        """Code and values of ``kernels`` at the thread's elements of row ``iy``."""
        return self.evaluate(lambda element: (("iy", 0), ("ix", element)), kernels)

    def phase_stores(self, phase: int, kernels: Sequence[Kernel]) -> list[str]:
        """The maps ``kernels`` store (the core's stored maps in phase 0)."""
        group = self.group
        return group.stores if phase == 0 else [
            name for name in group.fed_stores if group.produced[name] in kernels]

    # -- what rows and columns held in segments differ in -----------------------------------
    held_kind = "row"  # the kind of reduction a pass completes and later passes read
    walked = "the row's segments"  # what a pass walks

    def thread_slot(self) -> str:
        """The C index of the thread in its block (its elements' place in the stash)."""
        return "kf_tx"

    def accumulator_declaration(self, reduce: Reduce) -> str:
        return (f"{reduce.ctype} kf_racc_{reduce.var} = {reduce.identity};  // this thread's "
                f"part of the row's '{reduce.kernel.name}'")

    def combine(self, reductions: Sequence[Reduce]) -> tuple[list[str], dict[str, str]]:
        """Lines combining ``reductions`` over the block, and the C value (``{element}``: of
        the thread's element) of each result the later passes read."""
        return self.combine_rows(reductions), {r.kernel.output: f"kf_row_{r.var}"
                                               for r in reductions}

    def combine_rows(self, reductions: Sequence[Reduce]) -> list[str]:
        """The row's ``reductions`` over the block: every thread gets each result."""
        group = self.group
        warps = self.variant.threads[0] // WARP
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

    def kept_values(self) -> list[tuple[int, Expr]]:
        """Values a later phase would compute again from the row in registers: (the phase
        that computes them first, the expression as it computes it), kept in registers from
        there on. Only the largest such expressions with a special function (an
        exponential, an error function) whose row values no later phase reads otherwise,
        so keeping them takes the registers of the values they are made from: a softmax's
        ``exp(x - m)`` computed once, not in the sum's phase and again in the map's; a
        layer norm of a GELU keeps the GELU from the mean's phase and the centred value
        from the variance's."""
        group = self.group
        phases = [[k.body for k in kernels] for kernels in group.phases]
        keyed = [[(body, tree_keys(body)) for body in bodies]  # type: ignore[arg-type]
                 for bodies in phases]
        first: dict[tuple, tuple[int, Expr]] = {}  # by tree key: (phase, the node there)
        inside: dict[tuple, set[tuple]] = {}  # by tree key: the keys of its subtree
        for phase, bodies in enumerate(keyed):
            for body, keys in bodies:
                for node in body.walk():  # type: ignore[union-attr]
                    key = keys[id(node)]
                    first.setdefault(key, (phase, node))
                    inside.setdefault(key, {keys[id(n)] for n in node.walk()})
        kept: dict[tuple, tuple[int, Expr]] = {}
        for phase, bodies in enumerate(keyed):
            for body, keys in bodies:
                for node in body.walk():  # type: ignore[union-attr]
                    key = keys[id(node)]
                    if first[key][0] < phase and not isinstance(node, Load) and any(
                            isinstance(n, Unary) and n.op in SPECIAL_FUNCTIONS
                            for n in node.walk()) and \
                            not any(key in inside[other] and first[key][0] >= found[0]
                                    for other, found in kept.items()):
                        # (a part kept from an earlier phase stays: the phase that
                        # computes the larger value reads it)
                        kept = {k: v for k, v in kept.items()
                                if not (k in inside[key] and v[0] >= first[key][0])}
                        kept[key] = first[key]
        if not kept:
            return []
        chosen = list(kept.values())
        later = [self.with_kept(body, chosen, len(phases))  # type: ignore[arg-type]
                 for bodies in phases[1:] for body in bodies]
        rows = {load.buffer for body in later for load in body.walk()
                if isinstance(load, Load) and load.buffer in group.tile_inputs}
        made_of = {load.buffer for _, node in chosen for load in node.walk()
                   if isinstance(load, Load) and load.buffer in group.tile_inputs}
        return chosen if not rows & made_of else []

    @staticmethod
    def with_kept(body: Expr, kept: list[tuple[int, Expr]], phase: int) -> Expr:
        """``body`` of ``phase`` reading each value kept from an earlier phase from its
        registers (a read of ``kf_keep_<i>``)."""
        index = {tree_keys(node)[id(node)]: i for i, (first, node) in enumerate(kept)
                 if first < phase}
        if not index:
            return body
        keys = tree_keys(body)
        found = {id(node): index[keys[id(node)]] for node in body.walk()
                 if keys[id(node)] in index}
        return _replaced(body, found) if found else body

    # -- a running maximum's sums (online rescaling), per thread ------------------------------
    def running_value(self, var: str) -> str:
        """The C value of the thread's running maximum ``var`` (``{element}``: at the
        thread's element, where it has one per element)."""
        return f"kf_racc_{var}"

    def copy_running(self, name: str, var: str, ctype: str, comment: str) -> list[str]:
        """``kf_<name>_<var>``: a copy of the thread's running maximum ``var``."""
        return [f"const {ctype} kf_{name}_{var} = kf_racc_{var};  // {comment}"]

    def rescale_lines(self, total: str, before: str, after: str) -> list[str]:
        """The thread's sum ``total`` moved from the maximum ``before`` (a copy made by
        :meth:`copy_running`) to ``after`` (a C value, ``{element}`` where per element)."""
        return [f"kf_racc_{total} *= kf_rescale({before}, {at(after, 0)});"]

    def held_walk(self, loaded: list[str]) -> list[str]:
        """One row held whole: loaded once, then each phase over the values in registers."""
        group, variant = self.group, self.variant
        row_reductions = group.row_reductions()
        kept = self.kept_values()
        walk = [
            "// stage 1: the whole row, every load in flight together "
            f"({variant.vector_bytes}-byte loads where aligned)",
            *loaded,
            *self.over_chunks(self.load_lines("kf_cols", "kf_vec", declare=False)),
            *[f"{C_TYPES[node.dtype]} kf_keep_{i}[{variant.unroll}][{self.v}];  // a value "
              f"phase {first} computes and later phases read again" for i, (first, node)
              in enumerate(kept)],
        ]
        # the phase whose combine is the row's last: the next row writes the other buffers
        last_combine = max((phase for phase, kernels in enumerate(group.phases)
                            for r in row_reductions if r.kernel in kernels), default=None)
        for phase, kernels in enumerate(group.phases):
            # a phase reads the row reductions of the phases before it as the block's results
            # (and the values kept from the phases before from their registers)
            keep_here = {f"kf_keep_{i}": self.with_kept(node, kept, phase)
                         for i, (first, node) in enumerate(kept) if first == phase}
            evaluated = [replace(k, body=self.with_kept(k.body, kept, phase))  # type: ignore
                         for k in kernels] if kept else kernels
            code, values = self.evaluate(lambda element: (("iy", 0), ("ix", element)),
                                         evaluated, keep_here)
            keeping = [f"{name}[kf_u][{element}] = {value};" for name in keep_here
                       for element, value in enumerate(values.pop(name))]
            self.held_values.update({name: f"{name}[kf_u][{{element}}]" for name in keep_here})
            reductions = [r for r in group.reductions if r.kernel in kernels]
            rows_here = [r for r in reductions if r.kind == self.held_kind]
            names = ", ".join(f"'{k.name}'" for k in kernels)
            walk += [
                *[f"{r.ctype} kf_racc_{r.var} = {r.identity};  // this thread's part of the "
                  f"row's '{r.kernel.name}'" for r in rows_here],
                "// stage 2: the core members at each element (intermediates in registers)"
                if phase == 0 else f"// stage {2 * phase + 2}: {names} at each element of "
                "the row still held in registers",
                *self.over_chunks(self.element_work(code, values, reductions, "kf_cols",
                                                    "kf_vec", False,
                                                    self.phase_stores(phase, kernels))
                                  + keeping),
            ]
            if rows_here or phase == 0:
                walk += [
                    f"// stage {2 * phase + 3}: the row's reductions over the block: warp "
                    "shuffles, each warp's part in shared memory,",
                    "// one barrier, then every warp combines the parts (every thread gets "
                    "the row's result)",
                    *self.combine_rows(rows_here)]
                self.held_values.update(
                    {r.kernel.output: f"kf_row_{r.var}" for r in rows_here})
                if phase == last_combine:
                    walk.append("kf_parity ^= 1;")
        for i in range(len(kept)):  # (read in the phases only: the tail reads results)
            self.held_values.pop(f"kf_keep_{i}", None)
        return walk

    def stash_lines(self) -> list[str]:
        """The stash's pointers into dynamic shared memory, one region per stashed input."""
        group, variant = self.group, self.variant
        if not variant.stash:
            return []
        lines = ["KF_DYNAMIC_SHARED(unsigned char, kf_shared);"]
        offset = 0
        for name in group.stashed_inputs():
            ctype = C_TYPES[group.graph.buffers[name].dtype]
            lines.append(f"{ctype}* const kf_stash_{c_name(name)} = reinterpret_cast<{ctype}*>("
                         f"kf_shared + {offset});  // the first {variant.stash} segments of "
                         f"'{name}' (each thread its own elements), for the later passes")
            offset += variant.stash * group.segment_elements(variant) \
                * VALUE_SIZE[group.graph.buffers[name].dtype]
        self.dynamic_shared_bytes = offset
        return lines

    def input_loads(self, inputs: Sequence[str], kept: Sequence[str], first: set[str],
                    last: set[str]) -> list[str]:
        """The loads of a pass's ``inputs`` at the thread's chunk ``kf_u`` of segment
        ``kf_s``: from the stash where a pass before kept it there (``first``: the inputs
        this pass reads first, and stashes), none where it is the segment in registers
        (``kept``: the inputs the pass before loaded). Rows that passes read again from L2
        carry its eviction priorities: kept by their first pass, let go by their last
        (``last``: the inputs this pass reads for the last time)."""
        group, variant, v = self.group, self.variant, self.v
        stashed = group.stashed_inputs() if variant.stash else []
        threads, chunks = variant.threads[0] * variant.threads[1], variant.unroll
        slot = f"((kf_s * {chunks} + kf_u) * {threads} + {self.thread_slot()}) * {v}"
        lines = []
        for name in inputs:
            var = c_name(name)
            column = name not in group.tile_inputs
            target = f"kf_col_{var}[kf_u]" if column else f"kf_ld_{var}[kf_u]"
            address = "ix" if column else self.address
            hinted = not column and self.held_kind == "row" and (name in first) != (
                name in last)  # (read by one pass only: no hint)
            loader = f"kf_mr_load_l2<{v}, {int(name in first)}>" if hinted \
                else f"kf_mr_load<{v}>"
            load = [f"{loader}({var} + {address}, kf_cols, kf_vec, {target});"]
            if name in stashed and name in first:
                load.append(f"if (kf_s < {variant.stash}) kf_mr_store<{v}>(kf_stash_{var} + "
                            f"{slot}, {v}, true, {target});  // kept for the later passes")
            elif name in stashed:
                load = [f"if (kf_s < {variant.stash}) kf_mr_load<{v}>(kf_stash_{var} + "
                        f"{slot}, {v}, true, {target});  // from the stash",
                        f"else {load[0]}"]
            lines += ["if (kf_s != kf_kept) {  // (the segment still in registers: no load)",
                      *indent(load, 1), "}"] if name in kept else load
        return lines

    def segmented_walk(self, loaded: list[str]) -> list[str]:
        """One row in segments: each phase a pass over them, a sum of exponentials past a
        row maximum in the maximum's pass, rescaled as the thread's maximum grows."""
        group = self.group
        graph = group.graph
        phases = group.segment_phases
        held = [r for r in group.reductions if r.kind == self.held_kind]
        last_combine = max((phase for phase, kernels in enumerate(phases)
                            for r in held if r.kernel in kernels), default=None)
        walk = [*loaded, "int kf_kept = -1;  // the segment whose values are in registers",
                "(void)kf_kept;"]
        kept: list[str] = []  # the inputs the previous pass loaded
        read: set[str] = set()  # the inputs the passes so far loaded
        for phase, kernels in enumerate(phases):
            rescaled = [k for k in kernels if k.name in group.online]
            centred = [k for k in kernels if k.name in group.centred]
            plain = [k for k in kernels
                     if k.name not in group.online and k.name not in group.centred]
            reductions = [r for r in group.reductions if r.kernel in plain]
            sums = [r for r in group.reductions if r.kernel in rescaled]
            maxima = {k.name: graph.kernel_by_name[group.online[k.name]] for k in rescaled}
            running = {c_name(m.output): m for m in maxima.values()}  # (each maximum once)
            rows_here = [r for r in reductions if r.kind == self.held_kind]
            inputs = group.phase_inputs(kernels)
            backward = phase % 2 == 1
            names = ", ".join(f"'{k.name}'" for k in kernels)
            later = {name for kernels_after in phases[phase + 1:]
                     for name in group.phase_inputs(kernels_after)}
            loads = self.input_loads(inputs, kept, set(inputs) - read, set(inputs) - later)
            read.update(inputs)
            code, values = self.evaluate_at_row(plain)
            work = self.element_work(code, values, reductions, "kf_cols", "kf_vec", False,
                                     self.phase_stores(phase, plain))
            segment_lines = [
                f"const int kf_s = {'kf_segments - 1 - kf_k' if backward else 'kf_k'};",
                f"const int kf_base = kf_s * {self.segment_extent};",
                *[line for var, m in running.items() for line in self.copy_running(
                    "prev", var, self._ctype(m), "the thread's maximum before this segment")],
                "// the segment's loads, all in flight together",
                *self.over_chunks(loads),
                *self.over_chunks(work),
            ]
            if rescaled:
                # the sums read the thread's running maximum, not the block's
                self.held_values.update({m.output: self.running_value(var)
                                         for var, m in running.items()})
                code, values = self.evaluate_at_row(rescaled)
                segment_lines += [
                    "// the sums of exponentials past the running maximum: rescaled where "
                    "it grew, then this segment's terms",
                    *[line for r in sums for line in self.rescale_lines(
                        r.var, f"kf_prev_{c_name(maxima[r.kernel.name].output)}",
                        self.running_value(c_name(maxima[r.kernel.name].output)))],
                    *self.over_chunks(self.element_work(code, values, sums, "kf_cols",
                                                        "kf_vec", False, [])),
                ]
                for m in running.values():  # (read as the block's result hereafter)
                    del self.held_values[m.output]
            folds = {k.name: self.centring_folds(k) for k in centred}
            if centred:
                segment_lines += self.centred_segment_lines(centred, folds)
            walk += [
                *[self.accumulator_declaration(r) for r in rows_here + sums],
                *[line for k in centred for line in self.centring_declarations(k, folds)],
                f"// pass {phase + 1}: {names} over {self.walked} ("
                + ("last to first: the last is still in registers)" if backward
                   else "first to last)"),
                "for (int kf_k = 0; kf_k < kf_segments; ++kf_k) {",
                *indent(segment_lines, 1),
                "}",
                f"kf_kept = {'0' if backward else 'kf_segments - 1'};",
            ]
            kept = inputs
            if rows_here or sums or phase == 0:
                walk += [
                    f"// pass {phase + 1}'s {'row' if self.held_kind == 'row' else 'column'} "
                    "reductions over the block (warp shuffles, each warp's part in shared "
                    "memory, one barrier)",
                    *[line for var, m in running.items() for line in self.copy_running(
                        "own", var, self._ctype(m), "this thread's maximum, before the "
                        "block's")]]
                squares = [folds[k.name][1] for k in centred]  # (with them: one barrier)
                lines, results = self.combine(rows_here + squares)
                walk += lines
                self.held_values.update(results)
                if sums:
                    walk += [
                        "// each thread's sum moved to the block's maximum, then combined",
                        *[line for r in sums for line in self.rescale_lines(
                            r.var, f"kf_own_{c_name(maxima[r.kernel.name].output)}",
                            results[maxima[r.kernel.name].output])]]
                    lines, totals = self.combine(sums)
                    walk += lines
                    self.held_values.update(totals)
                if centred:
                    walk += self.centred_results(centred, folds, results)
                if phase == last_combine:
                    walk.append("kf_parity ^= 1;")
        return walk

    # -- online centring ---------------------------------------------------------------------
    def centring_folds(self, kernel: Kernel) -> tuple[Reduce, Reduce]:
        """The two block-wide sums a centred sum of squares ``kernel`` takes: its total over
        the first segment (for the shift), and the squares about the shift."""
        group = self.group
        total = group.graph.kernel_by_name[group.centred[kernel.name].total]
        dtype = group.graph.buffers[kernel.output].dtype
        shift = replace(total, name=f"{total.name}_shift", writes=(f"{total.output}_shift",))
        squares = replace(kernel, name=f"{kernel.name}_squares",
                          writes=(f"{kernel.output}_squares",))
        return (Reduce(shift, self.held_kind, "sum", dtype),
                Reduce(squares, self.held_kind, "sum", dtype))

    def centring_reductions(self) -> list[Reduce]:
        """Every block-wide sum the group's centred sums take (their shared parts)."""
        if not (self.variant.segmented or self.variant.held_columns):
            return []
        group = self.group
        return [fold for name in group.centred
                for fold in self.centring_folds(group.graph.kernel_by_name[name])]

    @property
    def elements(self) -> int:
        """Results a thread keeps per reduction (one per row; one per column of its own)."""
        return 1

    def shift_value(self, kernel: Kernel) -> str:
        """The C value of ``kernel``'s shift at the thread's element ``{element}``."""
        return f"kf_shift_{c_name(kernel.output)}" + ("[{element}]" if self.elements > 1
                                                        else "")

    def centring_declarations(self, kernel: Kernel, folds: dict) -> list[str]:
        size = f"[{self.elements}]" if self.elements > 1 else ""
        return [f"{self._ctype(kernel)} kf_shift_{c_name(kernel.output)}{size};  // the "
                f"first segment's mean: '{kernel.name}' sums the squares about it",
                *[self.accumulator_declaration(fold) for fold in folds[kernel.name]]]

    def centred_segment_lines(self, centred: Sequence[Kernel], folds: dict) -> list[str]:
        """In each segment of the pass: at the first, the shifts (the block's means of the
        values over it); then the squares of the values about them."""
        group = self.group
        count = f"min({self.segment_extent}, {self.held_length})"
        lines = ["if (kf_k == 0) {  // the shifts: the first segment's means (a branch every "
                 "thread of the block takes)"]
        for kernel in centred:
            shift = folds[kernel.name][0]
            total = group.graph.kernel_by_name[group.centred[kernel.name].total]
            combined, results = self.combine([shift])
            means = [f"{at(self.shift_value(kernel), e)} = "
                     f"{at(results[shift.kernel.output], e)} / ({shift.ctype}){count};"
                     for e in range(self.elements)]
            lines += indent([*self.copy_accumulator(shift.var, c_name(total.output)),
                             *combined, *means], 1)
        lines.append("}")
        squared = []
        for kernel in centred:
            marker = f"{kernel.output} shift"  # (no array of a pipeline has such a name)
            self.held_values[marker] = self.shift_value(kernel)
            dtype = group.graph.buffers[kernel.output].dtype
            difference = Binary("sub", group.centred[kernel.name].value,
                                Load(marker, dtype, (0,) * group.ndim, (0,)), dtype)
            squared.append(replace(folds[kernel.name][1].kernel,
                                   body=Binary("mul", difference, difference, dtype)))
        code, values = self.evaluate_at_row(squared)
        for kernel in centred:
            del self.held_values[f"{kernel.output} shift"]
        return [*lines, "// the squares about the shifts",
                *self.over_chunks(self.element_work(
                    code, values, [folds[k.name][1] for k in centred], "kf_cols", "kf_vec",
                    False, []))]

    def centred_results(self, centred: Sequence[Kernel], folds: dict,
                        results: dict[str, str]) -> list[str]:
        """After the pass (the squares about the shifts combined over the block, their
        ``results``): each sum of squares moved to its centre, ``b + 2 (k - c)(s - n k) +
        n (k - c)²``."""
        group = self.group
        lines = ["// the sums of squares about the shifts, moved to their centres"]
        code, values = self.evaluate_at_row(
            [replace(k, body=group.centred[k.name].centre) for k in centred])
        finals = []
        for kernel in centred:
            var, ctype = c_name(kernel.output), self._ctype(kernel)
            n = f"({ctype}){self.held_length}"
            total = group.graph.kernel_by_name[group.centred[kernel.name].total]
            lines.append(f"{ctype} kf_centred_{var}[{self.elements}];")
            for e in range(self.elements):
                k = at(self.shift_value(kernel), e)
                b = at(results[folds[kernel.name][1].kernel.output], e)
                s = at(self.held_values[total.output], e)
                c = values[kernel.output][e]
                finals.append(f"kf_centred_{var}[{e}] = {b} + 2 * ({k} - {c}) * ({s} - {n} * "
                              f"{k}) + {n} * ({k} - {c}) * ({k} - {c});")
        lines += ["{", *indent([*code, *finals], 1), "}"]
        for kernel in centred:
            value = f"kf_centred_{c_name(kernel.output)}" + (
                "[{element}]" if self.elements > 1 else "[0]")
            self.held_values[kernel.output] = value
            if kernel.output in group.outputs:
                lines += self.store_result(kernel, value)
        return lines

    def copy_accumulator(self, target: str, source: str) -> list[str]:
        return [f"kf_racc_{target} = kf_racc_{source};"]

    @property
    def held_length(self) -> str:
        """The C length of what a pass walks (a row's columns)."""
        return size_var(self.group.domain[1])

    def store_result(self, kernel: Kernel, value: str) -> list[str]:
        return [f"if (kf_tx == 0) {c_name(kernel.output)}[iy] = {value};  // one plain "
                "store per row"]

    def _ctype(self, kernel: Kernel) -> str:
        return C_TYPES[self.group.graph.buffers[kernel.output].dtype]
