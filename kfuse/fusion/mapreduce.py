"""The map-reduce group as planning sees it: its members, reductions and reads, the
variant of the map-reduce form that implements it (:class:`~kfuse.schedule.forms.MapReduceVariant`,
adjusted to the group), its tiles and its shared memory. Code generation
(:mod:`kfuse.codegen.mapreduce`) writes the kernel from it; the implementation space
(:mod:`kfuse.search.variants`) enumerates and predicts its variants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kfuse.cuda_limits import DYNAMIC_SHARED_LIMIT, STATIC_SHARED_LIMIT, WARP
from kfuse.errors import FusionError
from kfuse.fusion.legality import (
    epilogue_kind,
    epilogue_variant_reason,
    epilogue_violations,
    held_row_phases,
    is_epilogue_group,
    mapreduce_shape_reason,
    online_centred_sums,
    online_rescaled_sums,
    segment_reason,
    split_epilogue,
    split_tail,
)
from kfuse.ir.cnames import GroupNames, c_name
from kfuse.ir.expr import C_TYPES, ITEM_SIZE, VALUE_SIZE, Coord, Load
from kfuse.ir.graph import Graph, Kernel
from kfuse.ir.reduce_ops import REDUCE_OP_CODE, identity_text
from kfuse.schedule.forms import MapReduceVariant, is_variant_text
from kfuse.schedule.shared_memory import SharedElement

SMEM_TILE_ROWS = 32          # rowsum="smem": lane tx sums row tx of the tile


def mapreduce_group_reason(graph: Graph, members: Sequence[str]) -> str | None:
    """Why this module cannot generate ``members`` as one kernel under some variant; ``None``
    for a map/reduce group, or one plus an elementwise epilogue of its row (column)
    reductions (then only whole-row stream (whole-column) variants apply:
    :meth:`MapReduceGroup.normalize`)."""
    if is_epilogue_group(graph, members):
        found = epilogue_violations(graph, members, None)
        return str(found[0]) if found else None
    return mapreduce_shape_reason(graph, members)


@dataclass
class Reduce:
    """One reduction of the group: its kernel, where it folds and its C type."""

    kernel: Kernel
    kind: str  # "row" (over the columns), "col" (over the rows), "all"
    op: str
    dtype: str

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def code(self) -> int:
        return REDUCE_OP_CODE[self.op]

    @property
    def identity(self) -> str:
        return identity_text(self.op, self.dtype)

    @property
    def var(self) -> str:
        return c_name(self.kernel.output)


class MapReduceGroup(GroupNames):
    """The members of one map/reduce kernel and how each read is served.

    ``tile_inputs`` are read at the point itself (matrices in a matrix group, vectors in a
    vector group); ``col_inputs`` are vectors read along the columns of a matrix (loaded
    once per block); every other read (a vector along the rows, a 0-d value, a transposed
    matrix) is an ordinary load.
    """

    def __init__(self, graph: Graph, members: Sequence[str], outputs: Sequence[str]):
        reason = mapreduce_group_reason(graph, members)
        if reason is not None:
            raise FusionError(f"group {list(members)} is not a map/reduce group: {reason}")
        core, epilogue = split_epilogue(graph, members)
        self.graph = graph
        self.members = tuple(graph.kernel_by_name[name] for name in members)
        # the maps over the reduced vector that consume row reductions (whole-row stream
        # variants only: evaluated by the warp owning the row once its results are complete)
        # or column reductions (whole-column variants: by the block owning the columns)
        self.epilogue = tuple(graph.kernel_by_name[name] for name in epilogue)
        self.epilogue_kind = epilogue_kind(graph, members) if epilogue else None
        self.core = tuple(graph.kernel_by_name[name] for name in core)
        # held rows: the epilogue goes on over the matrix (maps, row, column and full
        # reductions reading the row reductions at their row), its values per point, in
        # phases: each phase reads the row reductions of the phases before it
        fed, tail = split_tail(graph, members)
        self.fed = tuple(graph.kernel_by_name[name] for name in fed) \
            if self.epilogue_kind in ("held", "held_col") else ()
        # the maps over the reduced vector (every epilogue member of a row or column
        # epilogue; a held group's tail, after its last phase), one value per row (column)
        self.tail = tuple(graph.kernel_by_name[name] for name in tail)
        self.phases = self._phases(held_row_phases(graph, members) if self.fed else {})
        # rows held in segments: each phase a pass over the row, a sum of exponentials past a
        # row maximum in the maximum's pass (online rescaling)
        # (and a sum of squares centred by another sum in that sum's pass: online centring)
        self.online = online_rescaled_sums(graph, members) if self.fed else {}
        self.centred = online_centred_sums(graph, members) if self.fed else {}
        merged = {**self.online, **{name: c.total for name, c in self.centred.items()}}
        phase_of = held_row_phases(graph, members, merged) if self.fed else {}
        # (merged only where nothing else puts the sum in a later pass)
        self.online = {name: top for name, top in self.online.items()
                       if phase_of[name] == phase_of[top]}
        self.centred = {name: c for name, c in self.centred.items()
                        if phase_of[name] == phase_of[c.total]}
        self.segment_phases = self._phases(phase_of)
        self.outputs = tuple(outputs)
        self.produced = {kernel.output: kernel for kernel in self.members}
        self.domain = self.core[0].domain
        self.ndim = len(self.domain)
        self.reductions: list[Reduce] = []
        for kernel in (*self.core, *self.fed):
            if kernel.reduction is None:
                continue
            axes = kernel.reduction.axes
            if len(axes) == self.ndim:
                kind = "all"
            else:
                kind = "row" if axes == (1,) else "col"
            self.reductions.append(Reduce(kernel, kind, kernel.reduction.op,
                                          graph.buffers[kernel.output].dtype))
        for reduce in self.reductions:
            readers = [k.name for k in self.core if reduce.kernel.output in k.reads]
            if readers:
                raise FusionError(f"'{readers[0]}' reads the reduction "
                                  f"'{reduce.kernel.name}' inside its own kernel")
        epilogue_outputs = {k.output for k in self.epilogue}
        # maps of the matrix stored per point (the epilogue's outputs are stored per row or
        # column; a held-row group's second phase stores its maps per point too)
        self.stores = [name for name in self.outputs
                       if self.produced[name].reduction is None
                       and name not in epilogue_outputs]
        tail_outputs = {k.output for k in self.tail}
        self.fed_stores = [name for name in self.outputs if name in epilogue_outputs
                           and self.produced[name].reduction is None and self.fed
                           and name not in tail_outputs]
        self.epilogue_stores = [name for name in self.outputs if name in tail_outputs]
        identity = tuple(range(self.ndim))
        self.tile_inputs: list[str] = []
        self.col_inputs: list[str] = []
        self.generic = False
        for kernel in (*self.core, *self.fed):
            for node in kernel.body.walk():  # type: ignore[union-attr]
                if isinstance(node, Coord):
                    self.generic = True
                if not isinstance(node, Load) or node.buffer in self.produced:
                    continue
                if node.is_remapped:
                    self.generic = True  # scaled or data-dependent: read where it is
                elif node.dims == identity:
                    if node.buffer not in self.tile_inputs:
                        self.tile_inputs.append(node.buffer)
                elif self.ndim == 2 and node.dims == (1,):
                    if node.buffer not in self.col_inputs:
                        self.col_inputs.append(node.buffer)
                elif node.dims:
                    self.generic = True  # a vector along the rows, or a transposed read
        kinds = {r.kind for r in self.reductions}
        # A matrix read only elementwise (no row or column reduction, no broadcast) is a
        # long vector: the vector kernel serves it over rows * cols elements.
        self.flat = self.ndim == 1 or (not self.generic and not self.col_inputs
                                       and kinds <= {"all"})
        sized = self.tile_inputs + self.col_inputs + self.stores + self.fed_stores
        sizes = {ITEM_SIZE[graph.buffers[name].dtype] for name in sized}
        # V elements of the widest array fill one vector access; an array of half its size
        # moves its V in an access of half the bytes, so such sizes share V
        self.item_size = max(sizes) if sizes and max(sizes) <= 2 * min(sizes) else None

    def _phases(self, phase_of: dict[str, int]) -> tuple[tuple[Kernel, ...], ...]:
        """The members over the matrix by phase (``phase_of``: each member's; absent: 0),
        the core first (a tail, after the last phase, makes no phase of its own)."""
        over = (*self.core, *self.fed)
        return tuple(
            tuple(k for k in over if phase_of.get(k.name, 0) == phase)
            for phase in range(max((phase_of.get(k.name, 0) for k in over), default=0) + 1))

    def phase_inputs(self, kernels: Sequence[Kernel]) -> list[str]:
        """The matrices and column vectors ``kernels`` read at the point, directly or
        through maps of the group (a reduction of the group is read as its result): what a
        pass of rows held in segments loads."""
        found: set[str] = set()
        seen: set[str] = set()
        stack = [k.body for k in kernels]
        while stack:
            for node in stack.pop().walk():  # type: ignore[union-attr]
                if not isinstance(node, Load):
                    continue
                producer = self.produced.get(node.buffer)
                if producer is None:
                    found.add(node.buffer)
                elif producer.reduction is None and producer.name not in seen:
                    seen.add(producer.name)
                    stack.append(producer.body)
        return [name for name in self.tile_inputs + self.col_inputs if name in found]

    def stashed_inputs(self) -> list[str]:
        """The matrices more than one pass over rows held in segments reads (what a stash
        keeps in shared memory)."""
        passes = [self.phase_inputs(kernels) for kernels in self.segment_phases]
        return [name for name in self.tile_inputs
                if sum(name in inputs for inputs in passes) > 1]

    def stash_bytes(self, variant: MapReduceVariant, segments: int | None = None) -> int:
        """Shared memory of ``segments`` (default: the variant's stash) of the stashed
        inputs."""
        count = variant.stash if segments is None else segments
        per_segment = self.segment_elements(variant) * sum(  # (kept as values)
            VALUE_SIZE[self.graph.buffers[name].dtype] for name in self.stashed_inputs())
        return count * per_segment

    def segment_elements(self, variant: MapReduceVariant) -> int:
        """Elements of one matrix a block holds at once, held in segments (rows: a segment
        of a row; columns: a segment of rows of the strip)."""
        threads = variant.threads[0] * variant.threads[1]
        return threads * self.width(variant) * variant.unroll

    # -- naming -------------------------------------------------------------------------------

    def row_reductions(self) -> list[Reduce]:
        return [r for r in self.reductions if r.kind == "row"]

    def col_reductions(self) -> list[Reduce]:
        return [r for r in self.reductions if r.kind == "col"]

    def all_reductions(self) -> list[Reduce]:
        return [r for r in self.reductions if r.kind == "all"]

    # -- variants -----------------------------------------------------------------------------
    def default_variant(self) -> MapReduceVariant:
        """The variant used when a plan names none (a good choice on Hopper at large sizes)."""
        if self.epilogue_kind == "held":  # measured best at 16384^2 (rows of up to 16384
            # columns), one block per SM of a 132-SM H100/H200
            return MapReduceVariant((1024, 1), 1, 1, True, "stream", (), 132, 8, 0, 8,
                                    held_rows=True)
        if self.epilogue_kind == "held_col":  # a block per strip of 16 columns
            return MapReduceVariant((4, 64), 1, 1, True, "shuffle", unroll=8,
                                    held_columns=True)
        if self.epilogue_kind == "col":  # only blocks owning whole columns
            return MapReduceVariant((32, 16), 2, 1, True, "shuffle", vector_bytes=8,
                                    whole_columns=True)
        if self.epilogue:  # only warps owning whole rows can go on to the epilogue
            return MapReduceVariant((32, 8), 1, 1, True, "stream", (), 0, 8)
        if self.flat:
            return MapReduceVariant((256, 1), 1, 4, True, "shuffle")
        return MapReduceVariant((32, 8), 4, 8, True, "shuffle")

    def normalize(self, variant: MapReduceVariant) -> MapReduceVariant:
        """The variant adjusted to this group (or a FusionError saying why it cannot apply)."""
        bx, by = variant.threads
        if self.flat:
            if by != 1:
                raise FusionError(f"variant {variant}: a vector kernel takes N x 1 threads")
            if variant.whole_columns or variant.held_rows:
                raise FusionError(f"variant {variant}: whole columns and held rows belong to "
                                  "matrix kernels")
            return replace(variant, rows=1, rowsum="shuffle", order=(), unroll=1, span=0)
        if variant.held_columns:
            return self._normalize_held_columns(variant)
        if bx != WARP and variant.rowsum != "stream":
            raise FusionError(f"variant {variant}: a matrix kernel takes 32 x N threads (T x 1 "
                              "only in the stream mapping)")
        if self.epilogue:
            reason = epilogue_variant_reason(variant, self.epilogue_kind or "row")
            if reason:
                names = [k.name for k in self.epilogue]
                what = "column" if self.epilogue_kind == "col" else "row"
                raise FusionError(f"a {what} reduction feeds the epilogue {names} in its own "
                                  f"kernel: {reason}")
        if variant.held_rows:
            return self._normalize_held(variant)
        if variant.rowsum == "stream":
            return self._normalize_stream(variant)
        if variant.blocks:
            raise FusionError(f"variant {variant}: a persistent grid is for vector kernels "
                              "and the stream mapping")
        rows = variant.rows
        order: tuple[str, ...] = ()
        rowsum = variant.rowsum if self.row_reductions() else "shuffle"
        if rowsum == "smem":
            if SMEM_TILE_ROWS % by:
                raise FusionError(f"variant {variant}: the 32-row tile needs a divisor of 32 "
                                  "as threads in y")
            rows = SMEM_TILE_ROWS // by
            names = [r.kernel.name for r in self.row_reductions()]
            order = tuple(variant.order) or tuple(names)
            if sorted(order) != sorted(names):
                raise FusionError(f"variant {variant}: the order must name the row "
                                  f"reductions {names}")
        iters = 1 if variant.whole_columns else variant.iters  # one block walks every row
        result = replace(variant, rows=rows, iters=iters, rowsum=rowsum, order=order)
        if self.shared_bytes(result) > STATIC_SHARED_LIMIT:
            raise FusionError(f"variant {result}: needs {self.shared_bytes(result)} bytes of "
                              f"shared memory, more than {STATIC_SHARED_LIMIT}")
        return result

    def _normalize_held(self, variant: MapReduceVariant) -> MapReduceVariant:
        """Held rows: one row per block and step (its rows a contiguous range of a grid of at
        most ``blocks`` blocks); no epilogue over the reduced vector."""
        if self.epilogue and self.epilogue_kind != "held":
            raise FusionError(f"variant {variant}: held rows go on over the matrix, not over "
                              "the reduced vector (an epilogue of rows or columns)")
        if not variant.blocks:
            raise FusionError(f"variant {variant}: held rows need a grid of at most B blocks "
                              "(':gB'), each taking a contiguous range of rows")
        reason = segment_reason(self.graph, [k.name for k in self.members]) \
            if variant.segmented else None
        if reason:
            raise FusionError(f"variant {variant}: {reason}")
        self._check_stash(variant)
        return replace(variant, rows=1, iters=1, order=(), span=0)

    def _normalize_held_columns(self, variant: MapReduceVariant) -> MapReduceVariant:
        """Held columns: a block per strip of columns walking all of its rows; only for a
        group whose members read its column reductions back (and no row reductions)."""
        if self.epilogue_kind != "held_col":
            raise FusionError(f"variant {variant}: held columns are for column reductions "
                              "read back at every element of their column")
        self._check_stash(variant)
        return replace(variant, rows=1, iters=1, order=(), span=0, blocks=0)

    def _check_stash(self, variant: MapReduceVariant) -> None:
        """A FusionError where the variant's stash of segments exceeds a block's shared
        memory."""
        if self.stash_bytes(variant) > DYNAMIC_SHARED_LIMIT:
            raise FusionError(f"variant {variant}: its stash takes {self.stash_bytes(variant)} "
                              f"bytes of shared memory, more than {DYNAMIC_SHARED_LIMIT}")

    def _normalize_stream(self, variant: MapReduceVariant) -> MapReduceVariant:
        """The stream mapping: no column reductions (a warp walks along its rows, so no
        thread keeps a column); the span rounded up to a whole number of steps."""
        if self.col_reductions():
            names = [r.kernel.name for r in self.col_reductions()]
            raise FusionError(f"variant {variant}: the stream mapping walks along rows and "
                              f"cannot keep the column reductions {names}")
        step = self.step(variant)
        span = -(-variant.span // step) * step if variant.span else 0
        return replace(variant, order=(), span=span)

    def width(self, variant: MapReduceVariant) -> int:
        return variant.width(self.item_size)

    def stored_rows(self, variant: MapReduceVariant) -> bool:
        """True when the row reductions are written with plain stores: one warp owns whole
        rows (the stream mapping without column spans), so a row's result is complete in
        the warp and its output needs neither atomics nor a fill before the launch."""
        return not self.flat and variant.whole_rows

    def stored_columns(self, variant: MapReduceVariant) -> bool:
        """True when the column reductions are written with plain stores: one block walks
        every row of its columns (a whole-column variant)."""
        return not self.flat and (variant.whole_columns or variant.held_columns)

    def atomic_reductions(self, variant: MapReduceVariant) -> list[Reduce]:
        """The reductions combined with atomics (their outputs are filled first)."""
        stored = {"row"} if self.stored_rows(variant) else set()
        if self.stored_columns(variant):
            stored.add("col")
        return [r for r in self.reductions if r.kind not in stored]

    def step(self, variant: MapReduceVariant) -> int:
        """Columns a warp (block rows: a block) covers per step of the stream mapping
        (32 x V x unroll; T x V x unroll)."""
        return variant.threads[0] * self.width(variant) * variant.unroll

    def tile(self, variant: MapReduceVariant) -> tuple[int, int]:
        """(rows, columns) of one tile of a matrix kernel; (1, elements) of a vector chunk.

        Stream mapping: the rows of one iteration and the columns of one step."""
        v = self.width(variant)
        if self.flat:
            return (1, variant.threads[0] * v)
        if variant.rowsum == "stream":
            return (variant.threads[1] * variant.rows, self.step(variant))
        if variant.held_columns:  # a segment of the strip
            return (variant.threads[1] * variant.unroll, variant.threads[0] * v)
        return (variant.threads[1] * variant.rows, WARP * v)

    # -- shared memory (interval allocation, Filipovič et al. 2015 §3.4) --------------------------------------
    def shared_layout(self, variant: MapReduceVariant) -> dict[str, SharedElement]:
        """Offsets of the shared elements: loop-time tiles first, end-time buffers reuse them."""
        if self.flat or variant.rowsum == "stream":
            return {}
        v = self.width(variant)
        if variant.held_columns:  # each warp's part of the strip's column results
            across, down = variant.threads
            layout = {}
            for index, reduce in enumerate(self.col_reductions()):
                size = across * down // WARP * across * v * ITEM_SIZE[reduce.dtype]
                layout[f"cparts_{reduce.var}"] = SharedElement(f"cparts_{reduce.var}",
                                                               _align(size) * index, size)
            return layout
        bx, by = variant.threads
        tm, tn = self.tile(variant)
        layout: dict[str, SharedElement] = {}
        offset = 0
        if variant.rowsum == "smem":
            for reduce in self.row_reductions():
                size = ITEM_SIZE[reduce.dtype]
                tile_bytes = tm * (tn + row_padding(v)) * size
                layout[f"tile_{reduce.var}"] = SharedElement(f"tile_{reduce.var}", offset,
                                                             tile_bytes)
                offset = _align(offset + tile_bytes)
                part_bytes = by * WARP * size
                layout[f"rowpart_{reduce.var}"] = SharedElement(f"rowpart_{reduce.var}",
                                                                offset, part_bytes)
                offset = _align(offset + part_bytes)
        offset = 0  # buffers of the end live after the loop: they reuse the loop's storage
        if by > 1:
            for reduce in self.col_reductions():
                size = ITEM_SIZE[reduce.dtype]
                layout[f"colpart_{reduce.var}"] = SharedElement(f"colpart_{reduce.var}",
                                                                offset, by * tn * size)
                offset = _align(offset + by * tn * size)
        return layout

    def shared_bytes(self, variant: MapReduceVariant) -> int:
        layout = self.shared_layout(variant)
        return max((e.offset + e.size for e in layout.values()), default=0)


def row_padding(v: int) -> int:
    """Row padding of a shared tile, in elements: one 16-byte vector (one element if V=1)."""
    return v


def _align(offset: int) -> int:
    return (offset + 15) // 16 * 16


def claims(graph: Graph, members: Sequence[str], variant: object = None) -> bool:
    """True when this module generates the group's kernel.

    Always under a map-reduce variant (plain maps too: a plan that names a variant runs
    it); under any other form or none (the default) never for plain maps, and for groups with a reduction
    when the general templates do not cover them well: a vector reduction, a matrix reduced
    along one axis, or several reductions.
    """
    kernels = [graph.kernel_by_name[name] for name in members]
    reductions = [k for k in kernels if k.reduction is not None]
    if reductions and is_epilogue_group(graph, members):
        return True  # a reduction and its epilogue: only this module fuses them
    if isinstance(variant, MapReduceVariant) or is_variant_text(variant):
        return mapreduce_group_reason(graph, members) is None  # a named variant is honoured
    if not reductions:
        # plain maps: the general templates by default; the implementation space offers this
        # module's map variants beside them (kfuse.search.variants.MAP_VARIANTS)
        return False
    if mapreduce_group_reason(graph, members) is not None:  # (the shape)
        return False
    if len(reductions) > 1 or kernels[0].ndim == 1:
        return True
    return any(len(k.reduction.axes) == 1 for k in reductions)  # type: ignore[union-attr]
