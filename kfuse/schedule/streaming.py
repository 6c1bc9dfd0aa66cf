"""Temporal blocking of 2-D stencil chains by streaming along rows: which groups can, and
the lags, queues and halos their kernel keeps (the lowering is :mod:`kfuse.codegen.streamed`).

A block owns a strip of columns (its output columns grown by the chain's lateral reach)
and a chunk of rows, and walks the rows from top to bottom, one row per iteration (the
scheme of Matsumura et al. 2020's AN5D, here derived from any chain of stencils). Every
*level* of the chain advances one row per iteration: the group's inputs shaped like the
grid are copied into a ring of rows in shared memory some rows ahead; each member computes
its row ``i - lag`` from rows of its producers completed in earlier iterations. A thread
keeps, for each level, the last rows at its columns and the columns beside them in a
register *queue* (values read at other rows come from there); each level that some member
reads at a column offset writes its row to shared memory, where the threads beside read it.
A member lags each producer by the producer's readiness plus the rows below that it reads
(:func:`stream_layout`), so one barrier per iteration suffices, and no row is computed
twice: only the lateral halo (``steps x radius`` columns each side) is, once per block.
Where every read at an offset is periodic (:func:`wrapped`), rows and columns beyond the
grid's edges are computed as their wrapped copies, and no read is mapped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kfuse.cuda_limits import DYNAMIC_SHARED_LIMIT
from kfuse.ir.expr import Boundary, Coord, Load, loads
from kfuse.ir.graph import Graph

STREAM_COLUMNS = 4  # columns per thread: one 16-byte vector of 4-byte elements
# the arrays it touches (two-byte floats kept in float32, 4 columns in one 8-byte access;
# float64's 4 columns in two 16-byte accesses)
STREAM_DTYPES = ("float32", "int32", "float16", "bfloat16", "float64")
# An input read only at the point, kept for more rows than this (a late step reading it),
# stays in its ring in shared memory rather than in registers
HELD_ROWS = 3


@dataclass(frozen=True)
class StreamLevel:
    """One array the kernel walks down: an input copied from memory (``member`` None) or a
    member's result. At iteration ``i`` its row ``i - lag`` is copied or computed, and its
    rows up to ``i - ready`` can be read. ``lateral``: kept in shared memory, a row at a
    time (some member reads it at a column offset; inputs always, as their copies land
    there). ``above``/``below``: rows beyond the block's chunk it must cover."""

    buffer: str
    member: str | None
    lag: int
    ready: int
    lateral: bool
    above: int
    below: int
    item: int = 4  # bytes each of its values is kept in (float64: 8; two-byte floats: float32)


@dataclass(frozen=True)
class QueueSlot:
    """Values of ``buffer`` at column ``column`` (from the thread's first) that a thread
    keeps for its last ``ages`` rows, columns outside the grid mapped by ``boundary``
    (None: read only at the reader's own columns)."""

    buffer: str
    column: int
    boundary: Boundary | None
    ages: int
    held: bool = True  # in registers; else (an input's own columns kept for many rows)
    #                    read from its ring of rows in shared memory where used


@dataclass(frozen=True)
class StreamLayout:
    """What the streamed kernel of a group keeps: its levels (inputs first, then the
    members in order), the queue slots, the lateral halo of the block's strip (columns each
    side, whole vectors), and the padding beside each shared row (whole vectors)."""

    levels: tuple[StreamLevel, ...]
    slots: tuple[QueueSlot, ...]
    halo_columns: int
    pad: int
    wrapped: bool = False  # every read at an offset is periodic: rows and columns beyond the
    #                        grid's edges are computed as their wrapped copies
    # per member, its reads of the levels (:func:`staged_reads`); the rest read memory
    reads: Mapping[str, tuple[Load, ...]] = field(default_factory=dict, compare=False)

    def level(self, buffer: str) -> StreamLevel:
        return next(level for level in self.levels if level.buffer == buffer)

    def staged(self, member: str, load: Load) -> bool:
        """Whether ``member``'s read ``load`` (or one equal to it) is of a level."""
        return any(read_key(load) == read_key(read) for read in self.reads[member])

    def reach(self, member: str) -> tuple[int, int]:
        """Rows above and below its own that ``member`` reads of the levels."""
        rows = [load.offsets[0] for load in self.reads[member]]
        return max([-dy for dy in rows if dy < 0], default=0), \
            max([dy for dy in rows if dy > 0], default=0)

    @property
    def held(self) -> tuple[QueueSlot, ...]:
        """The slots kept in registers."""
        return tuple(slot for slot in self.slots if slot.held)

    def ring_rows(self, buffer: str, prefetch: int) -> int:
        """Rows of an input's ring in shared memory: the rows in flight, the newest and the
        older ones read there, rounded up to a power of two (a slot is then a mask of the
        iteration)."""
        oldest = max([slot.ages - 1 for slot in self.slots
                      if slot.buffer == buffer and not slot.held] + [0])
        return 1 << (prefetch + oldest).bit_length()

    def slot_of(self, load: Load, column: int) -> QueueSlot:
        """The slot a read of ``load`` by a thread's column ``column`` takes."""
        wanted = column + load.offsets[1]
        candidates = [s for s in self.slots if s.buffer == load.buffer and s.column == wanted]
        if load.offsets[1]:
            return next(s for s in candidates if s.boundary == _boundary(load))
        return candidates[0]

    @property
    def inputs(self) -> tuple[StreamLevel, ...]:
        return tuple(level for level in self.levels if level.member is None)

    @property
    def members(self) -> tuple[StreamLevel, ...]:
        return tuple(level for level in self.levels if level.member is not None)


def _boundary(load: Load) -> Boundary:
    return load.boundary or Boundary("clamp")


def read_key(load: Load) -> tuple:
    """What makes two reads the same read (code generation may rebuild a body's nodes)."""
    return load.read_key


def wrapped(graph: Graph, members: Sequence[str]) -> bool:
    """Whether every read of the group at an offset is periodic (and there is one): its
    blocks then compute the rows and columns beyond the grid's edges as their wrapped
    copies, and no read needs mapping."""
    offsets = [load for name in members for load in loads(graph.kernel_by_name[name].body)
               if any(load.offsets) or load.is_remapped]
    return bool(offsets) and all(periodic(load) and not load.is_remapped for load in offsets)


def staged_reads(graph: Graph, members: Sequence[str]) -> dict[str, list[Load]]:
    """Per member, its reads of arrays the kernel walks down: the group's results and its
    inputs shaped like the grid, read along the grid's axes (but for an input's periodic
    reads at an offset, which reach the far side of the grid, where the group's other reads
    are not all periodic: those read memory)."""
    group = set(members)
    domain = graph.kernel_by_name[members[-1]].domain
    wraps = wrapped(graph, members)
    reads = {}
    for name in members:
        kernel = graph.kernel_by_name[name]
        reads[name] = [load for load in loads(kernel.body) if load.dims == (0, 1) and not
                       load.is_remapped and (graph.producer.get(load.buffer) in group or (
                graph.buffers[load.buffer].shape == domain and (wraps or not periodic(load))))]
    return reads


def periodic(load: Load) -> bool:
    """A read at an offset with periodic boundaries (it reaches the far side of the grid)."""
    return _boundary(load).mode == "repeat" and any(load.offsets)


def stream_reasons(graph: Graph, members: Sequence[str]) -> str | None:
    """Why the streamed kernel cannot compute the group ``members``, or None if it can."""
    kernels = [graph.kernel_by_name[name] for name in members]
    if len(kernels[-1].domain) != 2 or any(len(k.domain) != 2 for k in kernels):
        return "the streamed kernel walks the rows of 2-D groups"
    if any(k.reduction is not None for k in kernels):
        return "the group holds a reduction"
    reads = staged_reads(graph, members)
    if not any(load.offsets[0] for group_reads in reads.values() for load in group_reads):
        return "nothing is read at another row"
    group = set(members)
    touched = {load.buffer for group_reads in reads.values() for load in group_reads} | \
        {k.output for k in kernels}
    for name in sorted(touched):  # (two-byte floats: kept in float32, as they are computed)
        if graph.buffers[name].dtype not in STREAM_DTYPES:
            return (f"it keeps rows of float32, float64, int32, float16 and bfloat16 values in "
                    f"shared memory and registers, not '{name}' ({graph.buffers[name].dtype})")
    wraps = wrapped(graph, members)
    for name, group_reads in reads.items():
        if wraps and any(isinstance(node, Coord) or (isinstance(node, Load) and node.dims and
                                                     not any(node is r for r in group_reads))
                         for node in graph.kernel_by_name[name].body.walk()):
            return (f"'{name}' reads a coordinate or an array along the grid's axes: with "
                    "periodic boundaries the blocks compute the points beyond the edges as "
                    "wrapped copies, where those would differ")
        for producer in ({load.buffer for load in group_reads} if not wraps else ()):
            taps = [load for load in group_reads if load.buffer == producer]
            if any(periodic(t) for t in taps):
                return (f"'{name}' reads '{producer}' with periodic boundaries, which reach the "
                        "far side of the grid, outside the rows and columns a block keeps")
            rows = [t.offsets[0] for t in taps]
            low, high = min(rows), max(rows)
            modes = {_boundary(t).mode for t in taps if t.offsets[0]}
            if ("clamp" in modes and not low <= 0 <= high) or \
                    ("mirror" in modes and abs(low + high) > 1):
                return (f"'{name}' reads '{producer}' at rows {low}..{high}: a mirrored or "
                        "clamped row outside the grid falls outside the rows it keeps")
        domain = kernels[-1].domain
        for load in loads(graph.kernel_by_name[name].body):
            external = graph.producer.get(load.buffer) not in group
            if not any(load is read for read in group_reads) and (
                    not external or (graph.buffers[load.buffer].shape == domain and not (
                        load.dims == (0, 1) and periodic(load)))):
                return (f"'{name}' reads '{load.buffer}' through a transposed or broadcast "
                        "index")
    return None


def oldest_age(load: Load, base: int) -> int:
    """The oldest row of its queue a read needs when its reader's rows are ``base`` rows
    behind the producer's newest: its own row, or, where a clamped or mirrored row near the
    top or bottom maps to any row within ``|dy|`` of the reader's, the oldest of those."""
    dy = load.offsets[0]
    if dy and _boundary(load).mode in ("clamp", "mirror"):
        return base + abs(dy)
    return base - dy


def stream_layout(graph: Graph, members: Sequence[str]) -> StreamLayout:
    """The levels, lags and queues of the streamed kernel of ``members`` (which
    :func:`stream_reasons` accepts)."""
    reads = staged_reads(graph, members)
    produced = {graph.kernel_by_name[name].output: name for name in members}
    inputs = list(dict.fromkeys(load.buffer for name in members for load in reads[name]
                                if load.buffer not in produced))
    lag: dict[str, int] = {buffer: 0 for buffer in inputs}
    ready: dict[str, int] = {buffer: 0 for buffer in inputs}
    for name in members:
        buffer = graph.kernel_by_name[name].output
        lag[buffer] = max((ready[load.buffer] + load.offsets[0] for load in reads[name]),
                          default=0)
        ready[buffer] = lag[buffer] + 1
    # rows above and below the chunk, and columns beside the strip, each level must cover
    buffers = [*inputs, *produced]
    above = dict.fromkeys(buffers, 0)
    below = dict.fromkeys(buffers, 0)
    beside = dict.fromkeys(buffers, 0)
    for name in reversed(members):
        own = graph.kernel_by_name[name].output
        for load in reads[name]:
            dy, dx = load.offsets
            above[load.buffer] = max(above[load.buffer], above[own] + max(-dy, 0))
            below[load.buffer] = max(below[load.buffer], below[own] + max(dy, 0))
            beside[load.buffer] = max(beside[load.buffer], beside[own] + abs(dx))
    lateral = {load.buffer for name in members for load in reads[name] if load.offsets[1]}
    # queue slots: (buffer, column, column boundary) -> rows kept
    ages: dict[tuple[str, int, Boundary | None], int] = {}
    point_reads = []
    for name in members:
        own = graph.kernel_by_name[name].output
        for load in reads[name]:
            age = oldest_age(load, lag[own] - ready[load.buffer])
            for column in range(STREAM_COLUMNS):
                if load.offsets[1]:
                    key = (load.buffer, column + load.offsets[1], _boundary(load))
                    ages[key] = max(ages.get(key, 0), age + 1)
                else:
                    point_reads.append((load.buffer, column, age))
    for buffer, column, age in point_reads:  # a point read shares a slot of its column
        key = next((k for k in ages if k[:2] == (buffer, column)), (buffer, column, None))
        ages[key] = max(ages.get(key, 0), age + 1)
    # an input's own columns kept for many rows stay in its ring in shared memory
    long_kept = {(buffer, boundary) for (buffer, column, boundary), count in ages.items()
                 if buffer not in produced and boundary is None and
                 0 <= column < STREAM_COLUMNS and count > HELD_ROWS}
    slots = tuple(QueueSlot(buffer, column, boundary, count,
                            not (0 <= column < STREAM_COLUMNS and (buffer, boundary) in long_kept))
                  for (buffer, column, boundary), count in ages.items())
    levels = tuple(StreamLevel(buffer, produced.get(buffer), lag[buffer], ready[buffer],
                               buffer in lateral or buffer not in produced, above[buffer],
                               below[buffer], kept_item(graph.buffers[buffer].dtype))
                   for buffer in buffers)
    vector = STREAM_COLUMNS
    halo = -(-max(beside.values(), default=0) // vector) * vector
    widest = max((abs(load.offsets[1]) for name in members for load in reads[name]), default=0)
    pad = -(-widest // vector) * vector
    return StreamLayout(levels, slots, halo, pad, wrapped(graph, members),
                        {name: tuple(found) for name, found in reads.items()})


def shared_bytes(layout: StreamLayout, threads: int, prefetch: int) -> int:
    """Shared memory of one block: a ring of rows per input (:meth:`StreamLayout.ring_rows`),
    two rows per other level kept there."""
    pitch = threads * STREAM_COLUMNS + 2 * layout.pad
    return sum((layout.ring_rows(level.buffer, prefetch) if level.member is None else 2)
               * pitch * level.item for level in layout.levels if level.lateral)


def kept_item(dtype: str) -> int:
    """Bytes a value of ``dtype`` is kept in by the streamed kernel (two-byte floats as
    float32)."""
    return 8 if dtype == "float64" else 4


# Registers a thread may give its queues: beyond, the kernel spills (a 4-step chain of 3x3
# stencils keeps 72, four 5x5 steps 160)
QUEUE_REGISTERS = 128


def queue_registers(layout: StreamLayout) -> int:
    """Registers the queues of a thread take (each held slot's rows, two registers for a
    float64 value)."""
    return sum(slot.ages * layout.level(slot.buffer).item // 4 for slot in layout.held)


def shared_reason(layout: StreamLayout, threads: int, prefetch: int) -> str | None:
    """Why a block's rows do not fit its shared memory (None: they do)."""
    needed = shared_bytes(layout, threads, prefetch)
    if needed > DYNAMIC_SHARED_LIMIT:
        return f"its rows need {needed} bytes of shared memory per block"
    return None
