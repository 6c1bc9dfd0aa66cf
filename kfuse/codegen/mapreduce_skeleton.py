"""The one skeleton of every map-reduce kernel: load, evaluate, store, reduce, combine.

Every form of a map/reduce group (:mod:`kfuse.codegen.mapreduce` lists them) writes its kernel
through :class:`MapReduceKernel`. The skeleton owns what all forms share:

- the kernel around the body: the comment that describes the group, the parameters, the
  launch (which outputs are filled with the identity first, how the grid is walked);
- **load**: a thread's ``V`` consecutive elements of each matrix (or vector) read at the point,
  one 16-byte access where aligned (:meth:`MapReduceKernel.load_lines`);
- **evaluate**: every member at each of the ``V`` elements, intermediates in registers
  (:meth:`MapReduceKernel.evaluate`);
- **store and reduce**: the maps stored, each reduction combined into the accumulator its
  form keeps for its kind (:class:`Accumulation`), elements past the end kept out by a
  guard or by the identity (:meth:`MapReduceKernel.element_work`);
- **combine**: a full reduction over the block and one atomic per block, the elementwise
  epilogue at a reduced row or column (:meth:`MapReduceKernel.epilogue_lines`).

A form (a subclass) says only how threads and blocks map to the data: which loops a thread's
items take, where its accumulators live (``accumulation``), how rows and columns are combined
at the end, and the grid (:meth:`MapReduceKernel.body`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kfuse.codegen.cexpr import (
    EmitState,
    ExprEmitter,
    c_name,
    comment_text,
    element_store,
    indent,
    param_list,
    sizes_of,
)
from kfuse.codegen.program import GridAxis, KernelParam, KernelSource, LaunchSpec, launch_bounds
from kfuse.fusion.mapreduce import MapReduceGroup, Reduce
from kfuse.ir.expr import C_TYPES, STORAGE_TYPES, Expr, Load
from kfuse.ir.graph import Kernel
from kfuse.ir.reduce_ops import identity_value
from kfuse.schedule.forms import MapReduceVariant

Grid = tuple[GridAxis, GridAxis, GridAxis]

HELPERS = r"""#ifndef KF_MAPREDUCE_HELPERS
#define KF_MAPREDUCE_HELPERS
// ----- kfuse map-reduce helpers (kfuse.codegen.mapreduce) -----
// The word of one vector access of B bytes (16: uint4, 8: uint2; other sizes: none).
template <int B> struct kf_mr_word { typedef unsigned char type; static const bool ok = false; };
template <> struct kf_mr_word<16> { typedef uint4 type; static const bool ok = true; };
template <> struct kf_mr_word<8> { typedef uint2 type; static const bool ok = true; };

// An element's value: itself, or a two-byte float's as float.
template <typename T> KF_DEVICE T kf_mr_value(T e) { return e; }
KF_DEVICE float kf_mr_value(kf_half e) { return kf_value(e); }
KF_DEVICE float kf_mr_value(kf_bfloat16 e) { return kf_value(e); }

// Load the values of V consecutive elements: one 16-byte (or 8-byte) load when allowed and
// all V exist, else 'count' scalar loads (the rest read as 0: callers mask them).
template <int V, typename S, typename T>
KF_DEVICE void kf_mr_load(const S* p, int count, bool vec, T (&v)[V]) {
  typedef kf_mr_word<int(V * sizeof(S))> Word;
  typedef typename Word::type W;
  if constexpr (V > 1 && Word::ok) {
    if (vec && count == V) {
      union { W w; S e[V]; } u;
      u.w = *reinterpret_cast<const W*>(p);
      for (int k = 0; k < V; ++k) v[k] = kf_mr_value(u.e[k]);
      return;
    }
  }
  for (int k = 0; k < V; ++k) v[k] = k < count ? kf_mr_value(p[k]) : T(0);
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


def inside_item(reduce: Reduce, element: int, value: str, count: str | None) -> str:
    """``value`` (element ``element`` of the thread's ``V``) as the reduction's type, or its
    identity where the element is past the end (``count``: the C count of elements inside;
    ``None`` where all are)."""
    item = f"({reduce.ctype}){value}"
    return item if count is None else f"{element} < {count} ? {item} : {reduce.identity}"


@dataclass(frozen=True)
class Accumulation:
    """Where a form accumulates one kind of reduction, and how it keeps elements past the
    end out of it.

    ``target``: the accumulator as a C lvalue (``{var}``: the reduction's variable,
    ``{element}``: the element of the thread's ``V``). ``past_end``: ``"identity"`` (the
    element's value replaced by the reduction's identity), ``"guard"`` (the update skipped),
    or ``"kept"`` (nothing to do: the accumulator of such an element is never stored).
    ``first_inside``: element 0 is always inside (a vector chunk that runs has one).
    """

    target: str
    past_end: str = "guard"
    first_inside: bool = False

    def update(self, reduce: Reduce, element: int, value: str, count: str | None) -> str:
        """The statement folding ``value`` (element ``element``) into the accumulator;
        ``count``: the C count of elements inside (``None``: all are)."""
        target = self.target.format(var=reduce.var, element=element)
        inside = count is None or self.past_end == "kept" or (self.first_inside and not element)
        item = inside_item(reduce, element, value, None if inside or self.past_end != "identity"
                           else count)
        statement = f"{target} = kf_combine<{reduce.code}, {reduce.ctype}>({target}, {item});"
        return statement if inside or self.past_end == "identity" else \
            f"if ({element} < {count}) {statement}"


class MapReduceKernel:
    """The skeleton: a subclass is one form, given by ``accumulation`` and :meth:`body`."""

    def __init__(self, group: MapReduceGroup, variant: MapReduceVariant):
        self.group = group
        self.variant = variant
        self.row_index = ""  # matrices: tile loads are kept per row of the thread ("[kf_k]")
        self.col_index = ""  # column vectors kept per chunk of the thread ("[kf_u]")
        self.names_used = 0  # C names the point code took (the epilogue's continue after them)
        # held rows (columns): C values answering reads of the row (column) reductions in the
        # later phases ("{element}": the thread's element)
        self.held_values: dict[str, str] = {}
        # (size symbol, largest value) the kernel can run at (held rows: the row's columns)
        self.size_limits: tuple[tuple[str, int], ...] = ()
        self.address = "i"  # the C offset of the thread's first element in a matrix (vector)
        self.dynamic_shared_bytes = 0  # (held rows in segments: their stash)

    # -- the form ---------------------------------------------------------------------------
    @property
    def accumulation(self) -> dict[str, Accumulation]:
        """Per reduction kind ("row", "col", "all"), where the form accumulates it."""
        raise NotImplementedError(type(self).__name__)

    def body(self) -> tuple[list[str], Grid]:
        """The kernel's statements and its grid: how the form maps threads to the data."""
        raise NotImplementedError(type(self).__name__)

    def mapping_text(self) -> str:
        """One comment line (without ``//``) saying how the form maps blocks to the data."""
        raise NotImplementedError(type(self).__name__)

    # -- the kernel around the body ---------------------------------------------------------
    @property
    def v(self) -> int:
        """Consecutive elements per thread and access."""
        return self.group.width(self.variant)

    def build(self) -> tuple[KernelSource, LaunchSpec]:
        """The kernel (helpers and comments before it) and its launch."""
        params = self.parameters()
        body, grid = self.body()
        threads = self.variant.threads[0] * self.variant.threads[1]
        kernel = KernelSource((*self.helpers(), "", *self.describe()), self.group.symbol,
                              launch_bounds(threads), params, tuple(indent(body, 1)))
        return kernel, self.launch(params, grid)

    def helpers(self) -> tuple[str, ...]:
        """The device helpers the kernel calls, written before it."""
        return (HELPERS,)

    def describe(self) -> list[str]:
        """The comment before the kernel: the members, their roles and the form."""
        group, variant = self.group, self.variant
        kinds = {"row": "along each row (A x)", "col": "along each column (A^T y)",
                 "all": "over all elements"}
        fused = len(group.members) > 1
        lines = [f"// kfuse {'fused ' if fused else ''}map-reduce kernel of pipeline "
                 f"'{group.graph.name}': {', '.join(k.name for k in group.members)}"]
        for kernel in group.members:
            prefix = f"//   [{kernel.name}] " if fused else "//   "
            role = (f"epilogue map over the reduced "
                    f"{'columns' if group.epilogue_kind in ('col', 'held_col') else 'rows'}"
                    if kernel in group.epilogue else "map")
            for reduce in group.reductions:
                if reduce.kernel is kernel:
                    role = f"{reduce.op}-reduction {kinds[reduce.kind]}"
            if kernel in group.fed:
                fed_by = ("the column reductions at its column (held columns)"
                          if group.epilogue_kind == "held_col"
                          else "the row reductions at its row (held rows)")
                role = f"{'map' if kernel.reduction is None else role}, fed by {fed_by}"
            lines.append(f"{prefix}{role}" + (f", written at {comment_text(kernel.where)}"
                                              if kernel.where else ""))
        lines.append(f"//   {self.mapping_text()}")
        lines.append(f"//   variant {variant}; writes {', '.join(repr(o) for o in group.outputs)}")
        return lines

    def parameters(self) -> tuple[KernelParam, ...]:
        """The kernel's arguments: buffers, sizes and runtime parameters."""
        group = self.group
        symbols = sizes_of(group.graph, group.reads + list(group.outputs), group.domain)
        params = param_list(group.graph, group.reads, list(group.outputs), symbols,
                            group.params)
        return tuple(KernelParam(*p) for p in params)

    def launch(self, params: tuple[KernelParam, ...], grid: Grid) -> LaunchSpec:
        """Block shape and grid; the outputs combined with atomics are filled first."""
        group = self.group
        initial = tuple((r.kernel.output, identity_value(r.op, r.dtype))
                        for r in group.atomic_reductions(self.variant))
        return LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                          (self.variant.threads[0], self.variant.threads[1], 1), grid, initial,
                          size_limits=self.size_limits,
                          blocks_walk=bool(self.variant.blocks) or self.variant.whole_columns,
                          dynamic_shared_bytes=self.dynamic_shared_bytes)

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

    # -- load -------------------------------------------------------------------------------
    def load_lines(self, count: str, vec: str, declare: bool = True) -> list[str]:
        """The thread's ``V`` elements of each input read at the point (``kf_ld_*``)."""
        lines = []
        for name in self.group.tile_inputs:
            ctype = C_TYPES[self.group.graph.buffers[name].dtype]
            var = c_name(name)
            prefix = f"{ctype} kf_ld_{var}[{self.v}]; " if declare else ""
            lines.append(f"{prefix}kf_mr_load<{self.v}>({var} + {self.address}, {count}, "
                         f"{vec}, kf_ld_{var}{self.row_index});")
        return lines

    def column_vector_lines(self, index: str, count: str, vec: str) -> list[str]:
        """Loads of the vectors indexed by column (``kf_col_*``), ``V`` elements at ``ix``;
        ``index``: the C index of the thread's copy (``""`` for one)."""
        return [f"kf_mr_load<{self.v}>({c_name(name)} + ix, {count}, {vec}, "
                f"kf_col_{c_name(name)}{index});" for name in self.group.col_inputs]

    # -- evaluate ---------------------------------------------------------------------------
    def hook(self, load: Load, emitter: ExprEmitter) -> str | None:
        """Answer a read: intermediates evaluated in registers, tiles and invariants loaded."""
        group = self.group
        element = emitter.coords[-1][1]
        if load.buffer in self.held_values:  # ({element}: a result per column of the thread)
            return self.held_values[load.buffer].replace("{element}", str(element))
        producer = group.produced.get(load.buffer)
        if producer is not None:
            emitter.state.evaluated.add((producer.name, emitter.coords))
            return emitter.state.formed(emitter.emit(producer.body),  # type: ignore[arg-type]
                                        producer.body.dtype)  # type: ignore[union-attr]
        if load.is_remapped:
            return None  # (read where it is, through its boundary mode)
        if load.dims == tuple(range(group.ndim)) and load.buffer in group.tile_inputs:
            return f"kf_ld_{c_name(load.buffer)}{self.row_index}[{element}]"
        if group.ndim == 2 and load.dims == (1,) and load.buffer in group.col_inputs \
                and not group.flat:
            return f"kf_col_{c_name(load.buffer)}{self.col_index}[{element}]"
        return None

    def evaluate(self, coords_of: Callable[[int], tuple], kernels: Sequence[Kernel] | None = None,
                 extra: Mapping[str, Expr] | None = None
                 ) -> tuple[list[str], dict[str, list[str]]]:
        """Straight-line code evaluating every stored map and reduction of ``kernels`` (the
        core by default) at the V points.

        ``coords_of(e)`` gives the emitter coordinates of element ``e``. Returns the lines
        and, per output buffer, the C variable of its value at each element; ``extra``:
        expressions whose values are wanted too, by a name of their own (those the kernels
        computed already are not computed again).
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
            for name, node in (extra or {}).items():
                values.setdefault(name, []).append(point.emit(node))
        self.names_used = emitter.state.counter
        return emitter.lines, values

    # -- store and reduce -------------------------------------------------------------------
    def store_lines(self, values: dict[str, list[str]], count: str, vec: str,
                    names: Sequence[str] | None = None) -> list[str]:
        """Stores of the maps ``names`` (the core's stored maps by default)."""
        lines = []
        for name in self.group.stores if names is None else names:
            dtype = self.group.graph.buffers[name].dtype
            items = ", ".join(element_store(value, dtype) for value in values[name])
            lines.append(f"{{ const {STORAGE_TYPES[dtype]} kf_st[{self.v}] = {{{items}}}; "
                         f"kf_mr_store<{self.v}>({c_name(name)} + {self.address}, {count}, "
                         f"{vec}, kf_st); }}")
        return lines

    def accumulate(self, values: dict[str, list[str]], reductions: Sequence[Reduce],
                   count: str | None) -> list[str]:
        """Each of ``reductions`` folded into its accumulator at the thread's elements
        (``count``: the C count of elements inside, ``None`` where all are)."""
        return [self.accumulation[reduce.kind].update(reduce, element, value, count)
                for reduce in reductions
                for element, value in enumerate(values[reduce.kernel.output])]

    def element_work(self, code: list[str], values: dict[str, list[str]],
                     reductions: Sequence[Reduce], count: str, vec: str, full: bool,
                     stores: Sequence[str] | None = None) -> list[str]:
        """Evaluate, store, reduce at the thread's ``V`` elements (``code`` and ``values``
        from :meth:`evaluate`); ``full``: every element inside (no masks)."""
        results = [*self.store_lines(values, count, vec, stores),
                   *self.accumulate(values, reductions, None if full else count)]
        evaluated = ["// every member at each element (intermediates stay in registers)",
                     *code] if code else []
        return [*evaluated, "// store the maps, accumulate the reductions", *results]

    def accumulator_lines(self, reductions: Sequence[Reduce]) -> list[str]:
        """Scalar accumulators set to the identity (the full reductions of every form)."""
        return [f"{r.ctype} kf_acc_{r.var} = {r.identity};  // partial {r.op} of "
                f"'{r.kernel.name}'" for r in reductions]

    # -- combine ----------------------------------------------------------------------------
    @staticmethod
    def block_atomic_lines(reduce: Reduce) -> list[str]:
        """A full reduction's partials combined over the block, one atomic per block (every
        thread of the block runs these lines: they hold barriers)."""
        return [f"// '{reduce.kernel.name}': combine over the block, one atomic per block",
                f"kf_acc_{reduce.var} = kf_block_reduce<{reduce.code}, {reduce.ctype}>("
                f"kf_acc_{reduce.var}, {reduce.identity});",
                f"if (threadIdx.x == 0 && threadIdx.y == 0) kf_atomic_{reduce.op}("
                f"&{reduce.var}[0], kf_acc_{reduce.var});"]

    def epilogue_lines(self, results: dict[str, str], index: str,
                       domain: tuple[str, ...], stored: bool = False) -> list[str]:
        """Statements evaluating the epilogue at point ``index`` (a C variable) of the reduced
        vector over ``domain`` and storing what must reach memory: the epilogue's outputs,
        and a reduction's own result (``results``: C expressions) only where the plan needs
        it and it is not ``stored`` already. Reads of other epilogue members are evaluated
        in registers."""
        group = self.group

        def hook(load: Load, emitter: ExprEmitter) -> str | None:
            if load.buffer in results:
                return results[load.buffer]
            producer = group.produced.get(load.buffer)
            if producer is not None:  # another epilogue member, evaluated in registers
                return emitter.state.formed(emitter.emit(producer.body),  # type: ignore[arg-type]
                                            producer.body.dtype)  # type: ignore[union-attr]
            return None

        emitter = ExprEmitter(group.graph, ((index, 0),), domain, None, hook,
                              EmitState(counter=self.names_used))
        values = {k.output: emitter.emit(k.body)  # type: ignore[arg-type]
                  for k in group.tail if k.output in group.epilogue_stores}
        stores = [f"{c_name(name)}[{index}] = {results[name]};" for name in group.outputs
                  if name in results and not stored]
        stores += [f"{c_name(name)}[{index}] = "
                   f"{element_store(values[name], group.graph.buffers[name].dtype)};"
                   for name in group.epilogue_stores]
        return [*emitter.lines, *stores]


__all__ = ["HELPERS", "Accumulation", "Grid", "MapReduceKernel", "inside_item"]
