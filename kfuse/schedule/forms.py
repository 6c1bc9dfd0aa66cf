"""How a group of a fusion plan is implemented: one frozen, typed form per kernel shape.

A :class:`~kfuse.fusion.plan.FusionPlan` says which operators share a kernel; a *form*
says how that kernel is written (as Halide separates an algorithm from its schedule):

- :class:`Single` — one operator alone: flat (point operators) or register-tiled;
- :class:`Registers` — a fused group whose internal reads are all at the point itself;
- :class:`Recompute` — a fused stencil chain whose producers are evaluated again at each
  tap of their consumers, in registers (register tiles; marching planes along z in 3-D
  on devices where that pays);
- :class:`WhereRead` — a fused group whose members read at another resolution, at computed
  indices or through a broadcast are evaluated where read (Halide's inlining), in registers;
- :class:`Staged` — a fused 2-D stencil chain whose read-at-an-offset intermediates are
  computed once per block into shared memory, halo included;
- :class:`MapReduceVariant` — a map/reduce group (Filipovič et al. 2015): one point of
  the implementation space of block shape, serial iterations and thread-to-data mapping.

Each form says why it cannot implement a group (:meth:`Form.why_not`, ``None`` where it
can). Its prediction lives with the cost models (:func:`kfuse.model.roofline.predict_group`)
and its lowering with code generation (:func:`kfuse.codegen.generate.generate`), both
dispatching on the form's type. A plan's groups carry their forms
(:class:`GroupSchedule`); :func:`default_form` chooses one where the plan names none, and
:func:`parse_form` reads a form's :meth:`~Form.text` back (plans stored as JSON, ``variants``
given by name).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import Any, ClassVar

from kfuse.analysis.operations import aligned_read, evaluation_points
from kfuse.cuda_limits import STATIC_SHARED_LIMIT, WARP
from kfuse.errors import FusionError
from kfuse.ir.expr import ITEM_SIZE, Coord, Load
from kfuse.ir.graph import Graph
from kfuse.schedule import streaming, tiles

VARIANT_PREFIX = "mapreduce"
# a tiled kernel's border handling (Tiled.borders; Membarth 2013, ch. 5): ``edge_test``
# applies the modes on every axis except along the rows of warps away from the left and
# right edges; ``partitioned`` splits the iteration space into an interior region (threads
# whose every read is inside the arrays, boundary modes left out on every axis) and the
# border region, which keeps the edge test
BORDERS = ("edge_test", "partitioned")
ROWSUM_MODES = ("shuffle", "smem", "stream")
VECTOR_BYTES = (8, 16)       # one vector access: two or four 32-bit words
# Stage a stencil chain in shared memory where recomputing it would evaluate its producers
# more than this many times per output point on average (:func:`default_form`).
STAGE_ABOVE_EVALUATIONS = 2.0


@dataclass(frozen=True)
class Form:
    """How one group's kernel is written. ``name``: the form's name in plans;
    ``grows``: its registers or shared memory can exceed those of its largest member
    (the plan checks such kernels compiled, and fits their register tile)."""

    name: ClassVar[str] = "auto"
    grows: ClassVar[bool] = False

    def text(self) -> str:
        """The form as a plan names it (:func:`parse_form` reads it back)."""
        return self.name

    def why_not(self, graph: Graph, members: Sequence[str]) -> str | None:
        """Why this form cannot implement the group ``members`` of ``graph`` (None: it can)."""
        return None


@dataclass(frozen=True)
class Tiled(Form):
    """A kernel whose thread computes a register tile of points (flat where the group
    reads only at the point). ``tile``: points per thread per axis, ``block``: threads per
    block (x, y); None takes the defaults of :mod:`kfuse.schedule.tiles` for the form's
    kind and the group's dimensionality (arithmetic-bound operators always keep the narrow
    ``arithmetic`` tiles)."""

    tile: tuple[int, ...] | None = None
    block: tuple[int, int] | None = None
    # how a stencil kernel's threads apply the boundary modes (:data:`BORDERS`,
    # :mod:`kfuse.schedule.borders`); None: the edge test
    borders: str | None = None

    def __post_init__(self) -> None:
        if self.borders is not None and self.borders not in BORDERS:
            raise FusionError(f"form '{self.name}': borders {self.borders!r} is not one of "
                              f"{', '.join(BORDERS)}")

    @property
    def kind(self) -> str:
        """The kind under which :mod:`kfuse.schedule.tiles` lists its defaults."""
        return tiles.tile_kind(self.name)

    def text(self) -> str:
        return self.name if self.borders is None else f"{self.name}:{self.borders}"

    def register_tile(self, kernels: Sequence[Any], ndim: int) -> tuple[int, ...]:
        """The register tile of this form's kernel computing ``kernels`` over ``ndim``
        axes: its own, else the default (arithmetic-bound operators always keep the
        ``arithmetic`` tiles)."""
        if tiles.is_arithmetic_heavy(kernels):
            return tiles.register_tile("arithmetic", ndim)
        return self.tile or tiles.register_tile(self.kind, ndim)

    def shape(self, kernels: Sequence[Any], ndim: int) -> tuple[tuple[int, ...],
                                                                tuple[int, int]]:
        """(:meth:`register_tile`, block) of this form's kernel computing ``kernels`` over
        ``ndim`` axes (2 or 3): its own block, else the default."""
        kind = "arithmetic" if tiles.is_arithmetic_heavy(kernels) else self.kind
        return self.register_tile(kernels, ndim), self.block or tiles.tiled_block(kind, ndim)


@dataclass(frozen=True)
class Single(Tiled):
    """One operator alone."""

    name: ClassVar[str] = "single"


@dataclass(frozen=True)
class Registers(Tiled):
    """Fused operators whose internal reads are all at the point: every intermediate is one
    register."""

    name: ClassVar[str] = "registers"


@dataclass(frozen=True)
class Recompute(Tiled):
    """A fused stencil chain: producers evaluated again at every tap of their consumers
    inside the group (each distinct point once per thread), in registers."""

    name: ClassVar[str] = "recompute"
    grows: ClassVar[bool] = True


@dataclass(frozen=True)
class WhereRead(Tiled):
    """A fused group with members evaluated where read at other points than the kernel's
    own (:func:`evaluated_where_read`: a level read by a coarser or finer one, a plane
    chosen by a computed index), each at the point its consumer's read lands on, in
    registers; short register tiles (a thread's points share little)."""

    name: ClassVar[str] = "where_read"
    grows: ClassVar[bool] = True


@dataclass(frozen=True)
class Staged(Form):
    """A fused 2-D stencil chain through shared memory: each intermediate read at an offset
    is computed once per block over the output tile grown by its halo. ``rows``: output
    rows per thread; ``block``: threads per block (x, y); None takes
    :data:`~kfuse.schedule.tiles.STAGED_ROWS` and :func:`~kfuse.schedule.tiles.staged_block`."""

    name: ClassVar[str] = "staged"
    grows: ClassVar[bool] = True

    rows: int | None = None
    block: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows per thread, threads along x, threads along y), defaults filled in."""
        block_x, block_y = self.block or tiles.staged_block()
        return (self.rows or tiles.STAGED_ROWS, block_x, block_y)

    @property
    def outputs_per_block(self) -> tuple[int, int]:
        """Output points (rows, columns) one block computes."""
        rows, block_x, block_y = self.shape
        return (block_y * rows, block_x)

    def why_not(self, graph: Graph, members: Sequence[str]) -> str | None:
        remote = remote_reason(graph, members, self.name)
        if remote:
            return remote
        if any(ITEM_SIZE[graph.buffers[name].dtype] < 4 for name in touched(graph, members)):
            return (f"the {self.name} implementation cannot compute it: it keeps values of "
                    "4 and 8 bytes in shared memory")
        reason = can_stage(graph, tuple(members), self.outputs_per_block)
        return f"the {self.name} implementation cannot compute it: {reason}" if reason \
            else None


@dataclass(frozen=True)
class Streamed(Form):
    """A fused 2-D stencil chain whose blocks walk down the rows, every member advancing a
    row per step (temporal blocking without recomputing rows: :mod:`kfuse.schedule.streaming`).
    ``threads``: threads per block (each 4 columns); ``prefetch``: input rows copied ahead;
    ``chunk_rows``: rows per block where the device's resident blocks are not known
    (elsewhere the rows split among as many blocks as fill one wave, chunks of at least
    ``least_rows``)."""

    name: ClassVar[str] = "streamed"
    grows: ClassVar[bool] = True

    threads: int = 128
    prefetch: int = 2
    chunk_rows: int = 64
    least_rows: int = 32

    def __post_init__(self) -> None:
        if self.threads < WARP or self.threads > 1024 or self.threads % WARP:
            raise FusionError(f"streamed: {self.threads} threads is not a whole number of "
                              "warps up to 1024")
        if self.prefetch < 1 or self.chunk_rows < 1 or self.least_rows < 1:
            raise FusionError("streamed: prefetch, chunk_rows and least_rows must be positive")

    def text(self) -> str:
        """``streamed``, then the fields that differ from the defaults (``streamed:t256:p8``)."""
        defaults = Streamed()
        parts = [self.name] + [f"{key}{getattr(self, field)}"
                               for field, key in _STREAMED_KEYS.items()
                               if getattr(self, field) != getattr(defaults, field)]
        return ":".join(parts)

    @classmethod
    def parse(cls, text: str) -> Streamed:
        """Read :meth:`text` back; a :class:`FusionError` names what is malformed."""
        fields = {}
        keys = {key: field for field, key in _STREAMED_KEYS.items()}
        for part in text.split(":")[1:]:
            match = re.fullmatch(r"([a-z])(\d+)", part)
            if not match or match.group(1) not in keys:
                raise FusionError(f"malformed streamed form {text!r}: its fields are "
                                  + ", ".join(f"{k}<n> ({f})" for k, f in keys.items()))
            fields[keys[match.group(1)]] = int(match.group(2))
        return cls(**fields)

    def why_not(self, graph: Graph, members: Sequence[str]) -> str | None:
        remote = remote_reason(graph, members, self.name)
        if remote:
            return remote
        reason = streaming.stream_reasons(graph, members)
        if reason is None:
            layout = streaming.stream_layout(graph, members)
            registers = streaming.queue_registers(layout)
            if registers > streaming.QUEUE_REGISTERS:
                reason = (f"its rows kept in registers take {registers} a thread (at most "
                          f"{streaming.QUEUE_REGISTERS}): fewer steps per kernel fit")
            elif 2 * layout.halo_columns >= self.threads * streaming.STREAM_COLUMNS:
                reason = (f"its lateral halo of {layout.halo_columns} columns each side "
                          f"leaves no output columns to a block of {self.threads} threads")
            else:
                reason = streaming.shared_reason(layout, self.threads, self.prefetch)
        return f"the {self.name} implementation cannot compute it: {reason}" if reason \
            else None


_STREAMED_KEYS = {"threads": "t", "prefetch": "p", "chunk_rows": "r", "least_rows": "l"}


@dataclass(frozen=True)
class MapReduceVariant(Form):
    """One implementation of a map/reduce group (Filipovič et al. 2015 §4, the implementation space).

    ``threads``: (x, y) threads per block (matrices: x is 32, one warp per row);
    ``rows``: rows per thread per tile (tile height ``threads[1] * rows``; matrices only);
    ``iters``: serial iterations, tiles (matrices) or chunks (vectors) per block;
    ``wide``: 16-byte loads and stores where aligned; ``rowsum``: how row reductions
    combine the values of a row (``shuffle`` or ``smem``, the padded tile);
    ``order``: calling order of the row reductions' sums (``smem`` only); ``blocks``: at
    most this many blocks, each looping over the chunks (a persistent grid sized to the
    device: no last-wave tail, fewer partial results; vector kernels and the stream mapping;
    0: one block per ``iters`` chunks).

    ``rowsum="stream"`` is another thread-to-data mapping for matrix groups without column
    reductions (``A x``, maps, dots): warp ``ty`` owns ``rows`` consecutive rows and walks
    along them, ``unroll`` coalesced vector loads per row and thread in flight per step
    (``32 * V * unroll`` columns), partial row results kept in registers across the whole
    walk and combined over the warp once at the end; ``span``: columns per block (0: whole
    rows, one plain store per row and no fill of the output; else a multiple of the step, one
    atomic per row and span); ``iters``: groups of ``threads[1] * rows`` rows per block;
    ``blocks``: a persistent grid of at most this many blocks looping over the row groups.
    With ``threads = (T, 1)``, ``T`` a power of two above 32, the whole block walks its rows
    together (*block rows*: ``T * V * unroll`` columns per step, each row combined over the
    block's warps at the end; torch.compile's GEMV shape).

    ``vector_bytes``: the size of one vector access when ``wide`` (16, or 8: two floats).

    ``whole_columns`` (the tile mapping only): one block walks every row of its column tile
    (a grid of column tiles only), so its column reductions are complete in the block:
    stored plainly (no fill, no atomics), and an elementwise epilogue over the reduced vector
    can follow in the same kernel (SGEMVT's ``x = beta Aᵀ y + z``; torch.compile's shape for
    column sums). ``iters`` is then 1.

    ``held_rows`` (block rows only): the block's ``T`` threads hold each of its rows whole in
    registers, ``unroll`` accesses of ``V`` elements per thread (rows of at most
    ``T x V x unroll`` columns: larger ones are refused at launch), so a row's reductions
    are complete while the row is still on chip and members that read them at that row go
    on over the same values (ATAX's ``Aᵀ (A x)`` in one pass over ``A``); column reductions
    accumulate in registers over all the block's rows (each thread keeps its own columns),
    one atomic per column and block at the end. Blocks take contiguous row ranges of a grid
    of at most ``blocks`` blocks.

    ``segmented`` (held rows only): rows of any length, held a segment of ``T x V x unroll``
    columns at a time. Each phase of the group is a pass over the row's segments (the
    first from DRAM, later ones read again, mostly from L2, walking back so that a pass
    starts on the segment still in registers); a sum of exponentials past a row maximum
    goes in the maximum's pass by online rescaling (Milakov and Gimelshein 2018). Groups
    without column reductions (whose accumulators keep fixed columns). ``stash``: the first
    this many segments of each input a later pass reads again are kept in (dynamic) shared
    memory by the pass that first reads them, each thread its own elements (no barrier):
    with the segment in registers, a row of ``stash + 1`` segments is read from DRAM once.

    ``held_columns``: the same along the columns (a column reduction read back at every
    element of its column): each block owns a strip of ``threads[0] x V`` columns and walks
    every row of it in segments of ``threads[1] x unroll`` rows, a pass per phase, its
    column reductions combined over the block's rows of threads at the end of each pass
    (``threads[0]`` a power of two up to 32); ``stash`` as for rows.
    """

    name: ClassVar[str] = VARIANT_PREFIX

    threads: tuple[int, int] = (256, 1)
    rows: int = 1
    iters: int = 1
    wide: bool = True
    rowsum: str = "shuffle"
    order: tuple[str, ...] = ()
    blocks: int = 0
    unroll: int = 1
    span: int = 0
    vector_bytes: int = 16
    whole_columns: bool = False
    held_rows: bool = False
    segmented: bool = False
    stash: int = 0
    held_columns: bool = False

    def __post_init__(self) -> None:
        bx, by = self.threads
        if bx < 1 or by < 1 or bx * by > 1024 or (bx * by) % WARP:
            raise FusionError(f"variant: {bx}x{by} threads is not a whole number of warps "
                              "up to 1024")
        if self.rows < 1 or self.iters < 1:
            raise FusionError("variant: rows and iters must be positive")
        if self.rowsum not in ROWSUM_MODES:
            raise FusionError(f"variant: rowsum must be one of {ROWSUM_MODES}")
        if self.blocks < 0:
            raise FusionError("variant: blocks must be 0 (as many as needed) or positive")
        if self.unroll < 1 or self.span < 0:
            raise FusionError("variant: unroll must be positive and span 0 (whole rows) or "
                              "positive")
        if self.rowsum != "stream" and (self.unroll != 1 and not self.held_columns
                                        or self.span):
            raise FusionError("variant: unroll belongs to the stream mapping and held "
                              "columns, span to the stream mapping")
        if self.vector_bytes not in VECTOR_BYTES:
            raise FusionError(f"variant: vector accesses are of {VECTOR_BYTES} bytes")
        if self.whole_columns and self.rowsum == "stream":
            raise FusionError("variant: whole columns belong to the tile mapping (the stream "
                              "mapping walks along rows)")
        if self.rowsum == "stream" and bx != WARP and (by != 1 or bx & (bx - 1)):
            raise FusionError(f"variant: a stream block of {bx}x{by} threads: warps walk rows "
                              "in 32 x N blocks, whole blocks in T x 1 (T a power of two)")
        if self.held_rows and (not self.block_rows or self.span):
            raise FusionError("variant: held rows are block rows (stream, T x 1 threads, T a "
                              "power of two above 32) without column spans")
        if self.segmented and not self.held_rows:
            raise FusionError("variant: segments belong to held rows (':hr:sg')")
        if self.stash < 0 or (self.stash and not (self.segmented or self.held_columns)):
            raise FusionError("variant: a stash of segments belongs to rows held in segments "
                              "(':hr:sg:stN', N >= 0) and held columns (':hc:stN')")
        if self.held_columns and (bx > WARP or bx & (bx - 1) or self.held_rows
                                  or self.rowsum != "shuffle" or self.whole_columns):
            raise FusionError(f"variant: held columns take {bx}x{by} threads: the first a "
                              "power of two up to 32 (threads across the strip), the "
                              "mapping 'shuffle', no held rows or whole columns")

    def text(self) -> str:
        """The variant as a plan's variant string (``mapreduce:32x8:r4:i8:w:shuffle``)."""
        access = ("w" if self.vector_bytes == 16 else f"w{self.vector_bytes}") if self.wide \
            else "s"
        parts = [VARIANT_PREFIX, f"{self.threads[0]}x{self.threads[1]}", f"r{self.rows}",
                 f"i{self.iters}", access, self.rowsum]
        if self.blocks:
            parts.append(f"g{self.blocks}")
        if self.unroll != 1:
            parts.append(f"u{self.unroll}")
        if self.span:
            parts.append(f"c{self.span}")
        if self.whole_columns:
            parts.append("wc")
        if self.held_rows:
            parts.append("hr")
        if self.segmented:
            parts.append("sg")
        if self.held_columns:
            parts.append("hc")
        if self.stash:
            parts.append(f"st{self.stash}")
        if self.order:
            parts.append("o=" + ",".join(self.order))
        return ":".join(parts)

    __str__ = text

    @property
    def whole_rows(self) -> bool:
        """One warp (or block) owns whole rows (the stream mapping without column spans): a
        row's reduction is complete inside it."""
        return self.rowsum == "stream" and not self.span

    @property
    def block_rows(self) -> bool:
        """The stream mapping with the whole block along its rows (``T x 1`` threads)."""
        return self.rowsum == "stream" and self.threads[0] != WARP

    @classmethod
    def parse(cls, text: str) -> MapReduceVariant:
        """Read :meth:`text` back; a :class:`FusionError` names what is malformed."""
        parts = text.split(":")
        if parts[0] != VARIANT_PREFIX or len(parts) < 6:
            raise FusionError(f"not a map-reduce variant: {text!r}")
        match = re.fullmatch(r"(\d+)x(\d+)", parts[1])
        rows = re.fullmatch(r"r(\d+)", parts[2])
        iters = re.fullmatch(r"i(\d+)", parts[3])
        access = re.fullmatch(r"w(8|16)?|s", parts[4])
        if not (match and rows and iters and access):
            raise FusionError(f"malformed map-reduce variant {text!r}")
        order: tuple[str, ...] = ()
        blocks, unroll, span, whole_columns, held_rows = 0, 1, 0, False, False
        segmented, stash, held_columns = False, 0, False
        for extra in parts[6:]:
            if extra == "wc":
                whole_columns = True
            elif extra == "hr":
                held_rows = True
            elif extra == "sg":
                segmented = True
            elif extra == "hc":
                held_columns = True
            elif re.fullmatch(r"st\d+", extra):
                stash = int(extra[2:])
            elif extra.startswith("o="):
                order = tuple(n for n in extra[2:].split(",") if n)
            elif re.fullmatch(r"g\d+", extra):
                blocks = int(extra[1:])
            elif re.fullmatch(r"u\d+", extra):
                unroll = int(extra[1:])
            elif re.fullmatch(r"c\d+", extra):
                span = int(extra[1:])
            else:
                raise FusionError(f"malformed map-reduce variant {text!r}")
        return cls((int(match.group(1)), int(match.group(2))), int(rows.group(1)),
                   int(iters.group(1)), parts[4] != "s", parts[5], order, blocks, unroll,
                   span, int(access.group(1) or 16), whole_columns, held_rows, segmented,
                   stash, held_columns)

    def why_not(self, graph: Graph, members: Sequence[str]) -> str | None:
        return remote_reason(graph, members, "map-reduce")

    def width(self, item_size: int | None) -> int:
        """Elements per thread and access: ``vector_bytes``' worth when wide, else 1."""
        if not self.wide or item_size not in (2, 4, 8):
            return 1
        return max(1, self.vector_bytes // item_size)


def _extents(graph: Graph, members: tuple[str, ...]
             ) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """(extent of each member, members read at an offset).

    A member is evaluated over the extent its consumers need: the output tile for the
    outputs, grown by each consumer's reach for the producers it reads.
    """
    group = set(members)
    extent = {name: (0, 0) for name in members}
    staged = set()
    for name in reversed(members):  # consumers before their producers
        own = extent[name]
        for access in graph.kernel_by_name[name].accesses:
            if len(access.dims) != 2:
                continue
            reach = tuple(max(abs(o[axis]) for o in access.offsets) for axis in range(2))
            need = (own[0] + reach[0], own[1] + reach[1])
            producer = graph.producer.get(access.buffer)
            if producer in group:
                extent[producer] = (max(extent[producer][0], need[0]),
                                    max(extent[producer][1], need[1]))
                if not access.is_point:
                    staged.add(producer)
    return extent, staged


def staged_members(graph: Graph, members: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Members some other member reads at an offset, with the halo (y, x) each must cover."""
    extent, staged = _extents(graph, members)
    return {name: extent[name] for name in members if name in staged}


def can_stage(graph: Graph, members: tuple[str, ...], tile: tuple[int, int]) -> str | None:
    """Why the staged variant cannot compute this group, or ``None`` if it can."""
    kernels = [graph.kernel_by_name[m] for m in members]
    if kernels[0].ndim != 2:
        return "the staged variant is written for 2-D groups"
    if any(k.reduction is not None for k in kernels):
        return "the group holds a reduction"
    halos = staged_members(graph, members)
    if not halos:
        return "nothing is read at an offset"
    group = set(members)
    for kernel in kernels:
        for access in kernel.accesses:
            staged = graph.producer.get(access.buffer) in group
            if staged and not access.is_point and any(
                    b is not None and b.mode == "repeat" for b in access.boundaries):
                return f"'{kernel.name}' reads '{access.buffer}' with periodic boundaries"
            if access.dims != (0, 1) and graph.buffers[access.buffer].ndim != 0:
                return f"'{kernel.name}' reads '{access.buffer}' through a broadcast index"
    shared = sum((tile[0] + 2 * h[0]) * (tile[1] + 2 * h[1]) * 4
                 for h in halos.values())
    if shared > STATIC_SHARED_LIMIT:
        return f"needs {shared} bytes of shared memory per block"
    return None


def is_variant_text(variant: object) -> bool:
    """Whether ``variant`` is a map-reduce form's text (``mapreduce:...``)."""
    return isinstance(variant, str) and variant.startswith(VARIANT_PREFIX + ":")


FORMS: dict[str, type[Form]] = {form.name: form for form in (Single, Registers, Recompute,
                                                              WhereRead, Staged, Streamed)}


def parse_form(text: str) -> Form | None:
    """The form a plan names by ``text`` (``auto``: None, the default form); a
    :class:`FusionError` names an unknown one."""
    if text == "auto":
        return None
    if is_variant_text(text) or text == VARIANT_PREFIX:
        return MapReduceVariant.parse(text)
    if text.startswith(Streamed.name + ":"):
        return Streamed.parse(text)
    name, _, borders = text.partition(":")
    form = FORMS.get(name)
    if form is not None and borders:
        if not issubclass(form, Tiled):
            raise FusionError(f"form '{name}' takes no borders (only the tiled forms do)")
        return form(borders=borders)
    if form is None:
        raise FusionError(f"unknown implementation {text!r}: the forms are "
                          f"{', '.join(sorted(FORMS))} and map-reduce variants "
                          f"('{VARIANT_PREFIX}:...'), or 'auto'")
    return form()


def as_form(form: Form | str | None) -> Form | None:
    """A form given as a form, by its text, or None (the default)."""
    if form is None or isinstance(form, Form):
        return form
    if not isinstance(form, str):
        raise FusionError(f"an implementation is a form of kfuse.schedule.forms or its "
                          f"name, not {type(form).__name__}")
    return parse_form(form)


def form_name(form: Form | None) -> str:
    """The text a plan shows for ``form`` (``auto`` for the default)."""
    return "auto" if form is None else form.text()


@dataclass(frozen=True)
class GroupSchedule:
    """One kernel of a program: the operators it computes (in order), the buffers it writes
    to memory and its form (None: the default form, chosen where it is lowered)."""

    members: tuple[str, ...]
    outputs: tuple[str, ...]
    form: Form | None = None

    @property
    def tile(self) -> tuple[int, ...] | None:
        """The register tile the form names (None: the default, or no tile)."""
        return getattr(self.form, "tile", None)

    def with_tile(self, tile: tuple[int, ...] | None) -> GroupSchedule:
        """The same group with register tile ``tile`` (its form must be a tiled one)."""
        form = self.form if isinstance(self.form, Tiled) else Single()
        return replace(self, form=replace(form, tile=tile))


MAX_PARTS = 15  # named barriers 1..15 (0 is __syncthreads)


@dataclass(frozen=True)
class HorizontalSchedule:
    """Kernels with no path between them run side by side in one block (horizontal
    fusion; Li et al. 2022, HFuse): part k takes the next ``threads[k]`` threads of the
    block as a block of its own shape, synchronises on barrier k + 1 over them, and runs
    on as many blocks as its own grid has (the launch has as many as the largest).
    ``threads``: per part, the threads it takes (None: its own block's); a different count
    resizes a part that allows it (a tiled form keeps its rows of threads, a user kernel
    declared ``any_block`` takes a 1-D block). ``least_blocks``: blocks per multiprocessor
    the compiler must fit (``__launch_bounds__``: HFuse's register cap; 0: none)."""

    parts: tuple[GroupSchedule, ...]
    threads: tuple[int | None, ...] = ()
    least_blocks: int = 0

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m for part in self.parts for m in part.members)

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o for part in self.parts for o in part.outputs)

    def part_threads(self, index: int) -> int | None:
        return self.threads[index] if index < len(self.threads) else None

    def text(self) -> str:
        split = "/".join(str(t) if t else "own" for t in
                         (self.part_threads(i) for i in range(len(self.parts))))
        cap = f", {self.least_blocks} blocks per SM" if self.least_blocks else ""
        return f"horizontal {split}{cap}"

    def why_not(self, graph: Graph) -> str | None:
        """Why these parts cannot run side by side (None: they can): fewer than two or more
        than :data:`MAX_PARTS`, parts of broken warps, a streamed part, or a path between two
        of them (two parts never write one buffer: a buffer has one producer)."""
        if not 2 <= len(self.parts) <= MAX_PARTS:
            return f"horizontal fusion takes 2 to {MAX_PARTS} kernels, not {len(self.parts)}"
        for index, threads in enumerate(self.threads):
            if threads is not None and (threads <= 0 or threads % WARP):
                return (f"part {index} takes {threads} threads: a part takes whole warps "
                        "(a multiple of 32)")
        for part in self.parts:
            if isinstance(part.form, Streamed):
                return (f"[{' + '.join(part.members)}] is streamed: its blocks walk their rows "
                        "in chunks of a grid that fills one wave of its own blocks")
        from kfuse.analysis.order import path_between
        for first in range(len(self.parts)):
            for second in range(first + 1, len(self.parts)):
                path = path_between(graph, self.parts[first].members,
                                    self.parts[second].members)
                if path:
                    return (f"[{' + '.join(self.parts[first].members)}] and "
                            f"[{' + '.join(self.parts[second].members)}] depend on each "
                            f"other: {' -> '.join(path)}")
        return None


def group_schedule(group: GroupSchedule | Sequence[Any]) -> GroupSchedule:
    """A :class:`GroupSchedule`, or one written as a tuple (members, written buffers[, form
    or its text[, register tile]])."""
    if isinstance(group, GroupSchedule):
        return group
    members, outputs, *how = group
    form = as_form(how[0]) if how else None
    if len(how) > 1 and how[1] is not None:
        if form is None:
            form = Single()
        if not isinstance(form, Tiled):
            raise FusionError(f"group {list(members)}: the {form.text()} form has no "
                              "register tile")
        form = replace(form, tile=tuple(how[1]))
    return GroupSchedule(tuple(members), tuple(outputs), form)


def group_outputs(graph: Graph, members: Iterable[str]) -> tuple[str, ...]:
    """Buffers of the group that must reach memory: read outside it or returned to the user."""
    group = set(members)
    written = []
    for name in members:
        kernel = graph.kernel_by_name[name]
        if kernel.kind == "opaque":  # a user kernel writes all it declares, in memory
            written.extend(kernel.writes)
            continue
        buffer = kernel.output
        outside = [c for c in graph.consumers.get(buffer, ()) if c not in group]
        if outside or buffer in graph.outputs:
            written.append(buffer)
    return tuple(written)


def group_ndim(graph: Graph, members: Sequence[str]) -> int:
    """Axes of the group's kernel's iteration space: its last operator's in program order
    (a member evaluated where read may have others, :func:`evaluated_where_read`)."""
    return graph.kernel_by_name[graph.in_program_order(members)[-1]].ndim


def evaluated_where_read(graph: Graph, members: Sequence[str]) -> tuple[str, ...]:
    """Members the group's kernel evaluates only where its members read them at other
    points than the kernel's own: at another resolution, at computed indices or through a
    broadcast index (a pyramid level's producer, a lookup's source: Halide's inlining,
    Ragan-Kelley et al. 2013). Every other member is evaluated at the kernel's points or at
    offsets from them, and shares its iteration space (:func:`kfuse.fusion.legality.rule_same_iteration_space`).
    In program order."""
    group = set(members)
    ordered = graph.in_program_order(group)
    written = set(group_outputs(graph, ordered))
    # (a reduction is never evaluated where read: its result is complete only once its
    # kernel has folded every point, which map-reduce forms arrange for their epilogues)
    aligned = {name for name in ordered if set(graph.kernel_by_name[name].writes) & written
               or graph.kernel_by_name[name].reduction is not None}
    for name in reversed(ordered):
        if name not in aligned:
            continue
        kernel = graph.kernel_by_name[name]
        for access in kernel.accesses:
            producer = graph.producer.get(access.buffer)
            if producer in group and aligned_read(kernel, access):
                aligned.add(producer)
    return tuple(name for name in ordered if name not in aligned)


def remote_reason(graph: Graph, members: Sequence[str], form: str) -> str | None:
    """Why a form that keeps intermediates at the kernel's own points (shared memory,
    planes, rows) cannot compute a group with members evaluated where read (None: none)."""
    remote = evaluated_where_read(graph, members)
    if remote:
        return (f"the {form} implementation cannot compute it: '{remote[0]}' is read at "
                "other points than the kernel's own (another resolution, computed indices "
                "or a broadcast) and is evaluated where read, in registers")
    return None


def touched(graph: Graph, members: Sequence[str]) -> set[str]:
    """Every buffer the group reads or writes."""
    return {name for member in members for name in
            (*graph.kernel_by_name[member].reads, *graph.kernel_by_name[member].writes)}


def reads_only_at_points(graph: Graph, members: Sequence[str]) -> bool:
    """True if every read of the group is at the current point of a domain-shaped or 0-d
    buffer (its kernel is flat: no register tile)."""
    kernels = [graph.kernel_by_name[name] for name in members]
    identity = tuple(range(len(kernels[-1].domain)))
    for kernel in kernels:
        for node in kernel.body.walk():  # type: ignore[union-attr]
            if isinstance(node, Coord):
                return False
            if isinstance(node, Load) and node.dims and not (
                    node.dims == identity and node.is_centered):
                return False
    return True


def default_form(graph: Graph, members: Sequence[str]) -> Form:
    """How a group keeps its intermediates where its plan does not say (a cost estimate
    picks recompute, or else streamed where it applies, staged otherwise).

    Recomputing a producer at every tap costs its evaluations per output point (shared
    between the consecutive rows a thread computes); staging costs one evaluation per
    point plus the halo, and shared-memory traffic; streaming down the rows (2-D chains)
    one evaluation per point, the lateral halo and the lags. Keep when recomputation would
    evaluate producers more than :data:`STAGE_ABOVE_EVALUATIONS` times per output point
    on average.
    """
    if len(members) == 1:
        return Single()
    if evaluated_where_read(graph, members):
        return WhereRead()
    group = set(members)
    stencil_inside = any(graph.producer.get(access.buffer) in group and not access.is_point
                         for name in members for access in graph.kernel_by_name[name].accesses)
    if not stencil_inside:
        return Registers()
    keeping = [form for form in (Streamed(), Staged()) if form.why_not(graph, members) is None]
    if not keeping:
        return Recompute()
    outputs = group_outputs(graph, members)
    tile = tiles.register_tile("recompute", group_ndim(graph, members))
    points = evaluation_points(graph, members, outputs, tile)
    per_output = sum(len(p) for p in points.values()) / (prod(tile) * len(members))
    return keeping[0] if per_output > STAGE_ABOVE_EVALUATIONS else Recompute()
