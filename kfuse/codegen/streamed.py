"""Fused 2-D stencil chains walked down the rows (temporal blocking; the layout of levels,
lags and queues is :mod:`kfuse.schedule.streaming`).

A block of ``T`` threads owns ``4 T`` columns (its output columns and the chain's lateral
halo each side) and a chunk of rows. Each iteration of its loop:

1. waits for the copy of input row ``i`` (issued ``prefetch`` iterations earlier), passes
   the one barrier of the iteration, and issues the copy of row ``i + prefetch``;
2. fills the newest row of each queue: the thread's own columns (an input's from its ring
   of rows in shared memory, a member's row of the last iteration from the registers it
   was computed in) and the columns beside them from the lanes that own them, by warp
   shuffles (the warp's first and last lanes read the warps beside from shared memory;
   threads whose columns reach outside the grid map them by the readers' boundary modes,
   from shared memory): a warp reads 16-byte-strided single columns from shared memory
   four times as slowly as a shuffle delivers them;
3. computes each member at its row ``i - lag`` and the thread's 4 columns, the last member
   first (no member reads a row of the same iteration, and a row computed after its
   readers takes the registers of its queue's oldest row), every read of a level answered
   from the queues (rows near the grid's top and bottom map the row by the read's
   boundary mode and pick the queue's row that holds it; a separable stencil summed down
   its columns first, :mod:`kfuse.ir.separable`, so the thread's columns share the sums),
   writes the row to shared memory where another member reads it at a column offset (the
   warps' edge lanes only, where no thread of the block maps columns), and stores the
   group's outputs at the rows of the block's chunk;
4. moves every queue one row older.

Reads of other arrays (1-D weights, parameters) go to memory as in the other kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse import config
from kfuse.codegen.cexpr import (
    VECTOR_TYPES,
    ExprEmitter,
    c_name,
    element_store,
    format_value,
    indent,
    rounded,
    size_var,
)
from kfuse.codegen.program import GRID_LIMITS, GridAxis, KernelSource, LaunchSpec, launch_bounds
from kfuse.cuda_limits import WARP
from kfuse.ir.expr import C_TYPES, HALF_DTYPES, STORAGE_TYPES, Load
from kfuse.ir.separable import separated
from kfuse.schedule.forms import Streamed
from kfuse.schedule.streaming import (
    STREAM_COLUMNS,
    QueueSlot,
    StreamLayout,
    StreamLevel,
    stream_layout,
)

COLUMNS = STREAM_COLUMNS


def _vector(dtype: str) -> str:
    """The vector type of a thread's columns of an array of ``dtype`` as the kernel keeps
    them (two-byte floats as float: the kernel computes and keeps rows in float32; float64's
    four in :data:`DOUBLE4`, two 16-byte accesses)."""
    if dtype == "float64":
        return "kf_double4"
    return VECTOR_TYPES[("float32" if dtype in HALF_DTYPES else dtype, COLUMNS)]


# 4 float64 columns of a thread, aligned for two 16-byte accesses (CUDA's double4 is
# deprecated for its alignment), defined in a kernel that keeps float64 rows
DOUBLE4 = "struct alignas(16) kf_double4 { double x, y, z, w; };  // a thread's 4 float64 columns"



@dataclass(frozen=True)
class Queues:
    """The registers of the queues. A slot keeps its rows in ``ring(slot)`` registers (at
    least its ages, a divisor of ``period``). In a generic iteration register ``r`` holds the
    row ``r`` rows before the newest and every row moves one register on at the end; the
    ``period`` iterations unrolled as *phases* away from the grid's top and bottom leave the
    rows where they are and move the names instead: at phase ``p`` the row ``a`` rows before
    the newest is in register ``(a - p) mod ring``, so after ``period`` phases every row is
    back where a generic iteration expects it."""

    layout: StreamLayout

    @property
    def period(self) -> int:
        return max((slot.ages for slot in self.layout.held), default=1)

    def ring(self, slot: QueueSlot) -> int:
        ages = max(other.ages for other in self.together(slot))
        return min(d for d in range(ages, self.period + 1) if self.period % d == 0)

    def together(self, slot: QueueSlot) -> list[QueueSlot]:
        """The slots held in one vector register with ``slot`` (the thread's own 4 columns
        of one array under one boundary mode, loaded from shared memory at once), or
        ``slot`` alone."""
        if not 0 <= slot.column < COLUMNS:
            return [slot]
        group = [other for other in self.layout.held if other.buffer == slot.buffer and
                 other.boundary == slot.boundary and 0 <= other.column < COLUMNS]
        return group if len(group) == COLUMNS else [slot]

    def vector(self, slot: QueueSlot, age: int, phase: int | None) -> str | None:
        """The vector register holding ``slot``'s row ``age`` rows before the newest with
        the thread's other columns (None: a register of its own)."""
        if len(self.together(slot)) == 1:
            return None
        return self._register(slot, "v", age, phase)

    def name(self, slot: QueueSlot, age: int, phase: int | None) -> str:
        """The register holding ``slot``'s value ``age`` rows before the newest."""
        vector = self.vector(slot, age, phase)
        if vector:
            return f"{vector}.{'xyzw'[slot.column]}"
        column = f"{'m' if slot.column < 0 else 'c'}{abs(slot.column)}"
        return self._register(slot, column, age, phase)

    def registers(self, slot: QueueSlot, phase: int | None) -> list[str]:
        """Every register of ``slot``'s ring (its vector's, if it shares one), newest first."""
        return [self.vector(slot, age, phase) or self.name(slot, age, phase)
                for age in range(self.ring(slot))]

    def _register(self, slot: QueueSlot, column: str, age: int, phase: int | None) -> str:
        mode = "" if slot.boundary is None else f"_{slot.boundary.mode}"
        register = age if phase is None else (age - phase) % self.ring(slot)
        return f"q_{c_name(slot.buffer)}_{column}{mode}_r{register}"

    def leaders(self) -> list[QueueSlot]:
        """One slot per register ring (the first of each vector)."""
        return [slot for slot in self.layout.held if self.together(slot)[0] is slot]


def _signed(number: int) -> str:
    """`` + n`` or `` - n`` (nothing for 0), to follow a C operand."""
    return f" + {number}" if number > 0 else f" - {-number}" if number < 0 else ""


def _rows(level: StreamLevel) -> str:
    return f"rows_{c_name(level.buffer)}"


def _value(level: StreamLevel, column: int) -> str:
    return f"val_{c_name(level.buffer)}_{column}"


def streamed_kernel(group, form: Streamed) -> tuple[KernelSource, LaunchSpec]:
    """The kernel of ``group`` (a :class:`~kfuse.codegen.kernels.KernelGroup`) walking its
    rows with ``form``'s block, prefetch and chunks."""
    graph = group.graph
    members = [kernel.name for kernel in group.members]
    layout = stream_layout(graph, members)
    threads, prefetch = form.threads, form.prefetch
    rings = {level.buffer: layout.ring_rows(level.buffer, prefetch) for level in layout.inputs}
    span = threads * COLUMNS
    pitch = span + 2 * layout.pad
    outputs_per_block = span - 2 * layout.halo_columns
    height, width = (size_var(s) for s in group.domain)
    halo_threads = layout.halo_columns // COLUMNS
    columns = [slot.column for slot in layout.slots] or [0]
    lowest, highest = min(0, *columns), max(COLUMNS - 1, *columns)
    begin = min(level.lag - level.above for level in layout.levels)
    end = max(level.lag + level.below for level in layout.levels)
    ctype_of = {level.buffer: C_TYPES[graph.buffers[level.buffer].dtype]
                for level in layout.levels}
    halves = any(graph.buffers[level.buffer].dtype in HALF_DTYPES for level in layout.inputs)

    body = [
        "const int t = threadIdx.x;",
        f"const int chunk = ({height} + gridDim.y - 1) / gridDim.y;",
        "const int y0 = blockIdx.y * chunk;  // the block's rows: y0 .. y1 - 1",
        f"if (y0 >= {height})",
        "  return;",
        f"const int y1 = min(y0 + chunk, {height});",
        f"const int x0 = blockIdx.x * {outputs_per_block};  // its first output column",
        f"const int strip = x0 - {layout.halo_columns};  // its first column (halo included)",
        f"const int col = strip + t * {COLUMNS};  // the thread's first column",
        f"// its columns are the block's outputs (not the halo of {layout.halo_columns} "
        "columns each side)",
        f"const bool owns = t >= {halo_threads} && t < {threads - halo_threads};",
        "// every column its queues read is inside the grid (else mapped by boundary modes)",
        f"const bool inner = col + {lowest} >= 0 && col + {highest} < {width};",
        f"const bool vectors = {width} % {COLUMNS} == 0 && "
        + " && ".join(f"kf_aligned({c_name(b)}, 16)" for b in _global_arrays(group, layout))
        + ";",
        f"const bool store_whole = vectors && col + {COLUMNS} <= {width};",
        f"const int lane = t & {WARP - 1};",
    ]
    # the lanes whose rows the warps beside read: those within the farthest column beside
    beside = [_lanes_away(slot.column) for slot in layout.held
              if layout.level(slot.buffer).lateral and not 0 <= slot.column < COLUMNS]
    reach = max((abs(away) for away in beside), default=0)
    every_inner = "true;  // (periodic: no column is mapped)" if layout.wrapped else \
        f"strip + {lowest} >= 0 && strip + {span - COLUMNS}{_signed(highest)} < {width};"
    body += [
        "// no thread of the block maps its columns (else every row goes to shared memory)",
        f"const bool block_inner = {every_inner}",
        "// members' rows a thread keeps in shared memory: the lanes the warps beside read",
        f"const bool kept_in_shared = !block_inner || lane < {reach} || "
        f"lane >= {WARP - reach};",
    ]
    declarations = ["KF_DYNAMIC_SHARED(unsigned char, kf_shared);"]
    if any(level.item == 8 for level in layout.levels):
        declarations.insert(0, DOUBLE4)
    shared = 0
    for level in layout.levels:
        if level.lateral:
            count = rings[level.buffer] if level.member is None else 2
            what = (f"input rows ({prefetch} copied ahead)" if level.member is None else
                    "rows: this iteration's and the last")
            ctype = ctype_of[level.buffer]
            declarations.append(f"{ctype}* const {_rows(level)} = reinterpret_cast<{ctype}*>"
                                f"(kf_shared + {shared});  // {count} {what}")
            shared += count * pitch * level.item
    for level in layout.members:  # (each member's row, from one iteration to the next)
        values = ", ".join(f"{_value(level, j)} = 0" for j in range(COLUMNS))
        declarations.append(f"{ctype_of[level.buffer]} {values};")
    queues = Queues(layout)
    for slot in queues.leaders():
        names = queues.registers(slot, None)
        ctype = ctype_of[slot.buffer]
        if queues.vector(slot, 0, None):
            ctype = _vector(graph.buffers[slot.buffer].dtype)
        declarations.append(f"{ctype} {', '.join(f'{n} = {{}}' for n in names)};")
    body = declarations + body
    period = queues.period
    members_ = layout.members
    fast_begin = max(level.lag + layout.reach(level.member)[0] for level in members_)
    fast_end = min(level.lag - layout.reach(level.member)[1] for level in members_)

    def iteration(phase: int | None) -> list[str]:
        lines = [
            f"kf_copy_async_wait<{prefetch - 1}>();",
            "__syncthreads();",
            f"copy_rows(i + {prefetch});",
            *[f"const int ring_{c_name(level.buffer)} = ((i - i_begin) & "
              f"{rings[level.buffer] - 1}) * {pitch} + {layout.pad};  // input row i"
              for level in layout.inputs if level.lateral],
            f"const int last = ((i - i_begin) & 1 ^ 1) * {pitch} + {layout.pad};"
            "  // members' rows of the last iteration",
            f"const int here = ((i - i_begin) & 1) * {pitch} + {layout.pad};"
            "  // and of this one",
            *_fill_lines(group, layout, queues, span, phase),
        ]
        # the last member first: no member reads a row computed in the same iteration, and
        # each row computed once its readers are done with the oldest row of its queue takes
        # that row's registers (fewer registers live than in program order)
        for level in reversed(members_):
            lines += _member_lines(group, layout, queues, (rings, pitch), level, phase)
        if halves:
            lines.append("land_rows();  // (the two-byte rows fetched at its start)")
        return lines + _rotate_lines(layout, queues, phase)

    phases = []
    for phase in range(period):
        phases += [f"{{  // phase {phase}", *indent(iteration(phase), 1), "}", "++i;"]
    body += [
        f"const int i_begin = y0{_signed(begin)};",
        f"const int i_end = y1 + {end};",
        "// iterations whose members' rows are all far enough from the top and bottom rows",
        "// to read their neighbours unmapped: i in fast_begin .. fast_end - 1",
        f"const int fast_begin = {fast_begin}, "
        f"fast_end = min({height}{_signed(fast_end)}, i_end);" if not layout.wrapped else
        "const int fast_begin = i_begin, fast_end = i_end;  // (periodic: no row is mapped)",
        *_copy_function(group, layout, rings, pitch),
        f"for (int k = 0; k < {prefetch}; ++k)",
        "  copy_rows(i_begin + k);" if not halves else
        "  copy_rows(i_begin + k), land_rows();",
        "for (int i = i_begin; i < i_end;) {",
        f"  // {period} iterations at a time where they can: the queues' rows stay in their",
        "  // registers, their names move (a loop of its own, so that its registers stay put)",
        f"  for (; i >= fast_begin && i + {period} <= fast_end; ) {{",
        *indent(phases, 2),
        "  }",
        "  if (i >= i_end)",
        "    break;",
        "  {  // one iteration that may reach the top or bottom rows",
        *indent(iteration(None), 2),
        "  }",
        "  ++i;",
        "}",
        "kf_copy_async_wait<0>();",
    ]

    params = group.parameters()
    launch = LaunchSpec(group.symbol, tuple(members), params, (threads, 1, 1),
                        (GridAxis((group.domain[1],), outputs_per_block),
                         GridAxis((group.domain[0],), form.chunk_rows, GRID_LIMITS[1],
                                  least_per_block=form.least_rows),
                         GridAxis()),
                        dynamic_shared_bytes=shared, blocks_walk=True)
    preamble = [*group.describe(),
                f"//   variant: streamed down the rows ({len(layout.members)} members, "
                f"lateral halo {layout.halo_columns} columns, {prefetch} input rows ahead)"]
    return group.source(launch_bounds(threads), params, body, preamble), launch


def _global_arrays(group, layout: StreamLayout) -> list[str]:
    """Arrays accessed a vector at a time: the copied inputs and the stored outputs."""
    return [level.buffer for level in layout.inputs] + list(group.outputs)


def _copy_function(group, layout: StreamLayout, rings: dict[str, int], pitch: int
                   ) -> list[str]:
    """``copy_rows(row)``: the thread's 4 columns of each input's row ``row`` into its ring
    slot (16-byte copies where whole and aligned, else element by element), one group.
    Inputs of two-byte floats cannot be copied as they are kept (in float): ``copy_rows``
    loads their 4 columns into registers (8 bytes), and ``land_rows()``, at the end of the
    iteration, converts them into the ring slot, which no thread reads before the next
    iteration's barrier (the slot a copy issued at the iteration's start could land in)."""
    height, width = (size_var(s) for s in group.domain)
    lines = [f"const bool copy_whole = vectors && col >= 0 && col + {COLUMNS} <= {width};"]
    wraps = layout.wrapped
    halves = [level for level in layout.inputs
              if group.graph.buffers[level.buffer].dtype in HALF_DTYPES]
    for level in layout.inputs:
        name = c_name(level.buffer)
        first, end = f"y0 - {level.above}", f"y1 + {level.below}"
        if not wraps:
            first, end = f"max({first}, 0)", f"min({end}, {height})"
        lines.append(f"const int {name}_first = {first}, {name}_end = {end};"
                     "  // its rows copied" + (" (beyond the edges: wrapped)" if wraps else ""))
    for level in halves:
        name = c_name(level.buffer)
        lines.append(f"uint2 fetched_{name} = {{}};  // its 4 columns of the row fetched last "
                     f"(two-byte floats), landed at slot at_{name} (-1: none)")
        lines.append(f"int at_{name} = -1;")
    lines.append("const auto copy_rows = [&](int row) {")
    source_row = f"(row % {height} + {height}) % {height}" if wraps else "row"
    for level in layout.inputs:
        rows, name = _rows(level), c_name(level.buffer)
        slot = (f"((row - i_begin) & {rings[level.buffer] - 1}) * {pitch} + {layout.pad} + "
                f"t * {COLUMNS}")
        column = (f"((col + j) % {width} + {width}) % {width}" if wraps else "col + j")
        inside = [] if wraps else [f"        if (col + j >= 0 && col + j < {width})"]
        step = " " * (10 if inside else 8)  # (each column's copy, under its test if any)
        if level in halves:
            lines += [
                f"  at_{name} = -1;",
                f"  if (row >= {name}_first && row < {name}_end) {{",
                f"    at_{name} = {slot};",
                f"    const kf_index_t from = (kf_index_t)({source_row}) * {width};",
                "    if (copy_whole) {",
                f"      fetched_{name} = *reinterpret_cast<const uint2*>(&{name}[from + col]);",
                "    } else {",
                f"      fetched_{name} = uint2{{0u, 0u}};",
                f"      for (int j = 0; j < {COLUMNS}; ++j)",
                *inside,
                f"          (j < 2 ? fetched_{name}.x : fetched_{name}.y) |= "
                f"(unsigned){name}[from + {column}].bits << (16 * (j & 1));",
                "    }",
                "  }",
            ]
            continue
        if level.item == 8:  # (float64: 16 bytes two columns, 4 bytes half a column)
            whole = [f"      kf_copy_async16(to, &{name}[from + col]);",
                     f"      kf_copy_async16(to + 2, &{name}[from + col + 2]);"]
            elements = [f"{step}for (int h = 0; h < 2; ++h)",
                        f"{step}  kf_copy_async4(reinterpret_cast<float*>(to + j) + h, "
                        f"reinterpret_cast<const float*>(&{name}[from + {column}]) + h);"]
        else:
            whole = [f"      kf_copy_async16(to, &{name}[from + col]);"]
            elements = [f"{step}kf_copy_async4(to + j, &{name}[from + {column}]);"]
        lines += [
            f"  if (row >= {name}_first && row < {name}_end) {{",
            f"    {C_TYPES[group.graph.buffers[level.buffer].dtype]}* to = &{rows}[{slot}];",
            f"    const kf_index_t from = (kf_index_t)({source_row}) * {width};",
            "    if (copy_whole) {",
            *whole,
            "    } else {",
            f"      for (int j = 0; j < {COLUMNS}; ++j)",
            *inside, *elements,
            "    }",
            "  }",
        ]
    lines += ["  kf_copy_async_commit();", "};"]
    if not halves:
        return lines
    lines.append("const auto land_rows = [&]() {")
    for level in halves:
        name, rows = c_name(level.buffer), _rows(level)
        kind = STORAGE_TYPES[group.graph.buffers[level.buffer].dtype]
        words = [f"fetched_{name}.{'xy'[j // 2]}" for j in range(COLUMNS)]
        lines += [
            f"  if (at_{name} >= 0)",
            f"    *reinterpret_cast<float4*>(&{rows}[at_{name}]) = float4{{"
            + ", ".join(f"kf_value({kind}{{(unsigned short)({word} >> {16 * (j & 1)})}})"
                        for j, word in enumerate(words)) + "};",
        ]
    return [*lines, "};"]


def _lanes_away(column: int) -> int:
    """How many threads (lanes) further along a thread's column ``column`` (counted from its
    first) is its owner's: -1 for the columns just before, 1 for those just after."""
    return column // COLUMNS


def _beside_lines(group, level: StreamLevel, columns: list[int], base: str
                  ) -> tuple[list[str], str, dict[int, str]]:
    """Every lane's own 4 columns of ``level``'s newest row (``kf_own_*``: an input's from its
    ring in shared memory, a member's from the registers it computed them in) and the
    ``columns`` beside them from the lanes that own them, by warp shuffles (the warp's first
    and last lanes read those of the warps beside from shared memory): (lines run by every
    thread of the block, the own columns' vector, the C value of each column). Shuffles replace the shared-memory
    reads of the columns beside, which a warp reads four times as slowly (threads 16 bytes
    apart meet in the same banks)."""
    rows, name = _rows(level), c_name(level.buffer)
    dtype = group.graph.buffers[level.buffer].dtype
    vector = _vector(dtype)
    own = f"kf_own_{name}"
    source = (f"*reinterpret_cast<const {vector}*>(&{rows}[{base} + t * {COLUMNS}])"
              if level.member is None else
              f"{vector}{{{', '.join(_value(level, j) for j in range(COLUMNS))}}}")
    lines = [f"const {vector} {own} = {source};  // the thread's own columns"]
    values = {}
    for column in columns:
        away = _lanes_away(column)
        side = f"kf_beside_{name}_{'m' if column < 0 else 'c'}{abs(column)}"
        element = f"{own}.{'xyzw'[column % COLUMNS]}"
        if away < 0:
            shuffle, edge = f"__shfl_up_sync(0xffffffffu, {element}, {-away})", \
                f"lane < {-away}"
        else:
            shuffle, edge = f"__shfl_down_sync(0xffffffffu, {element}, {away})", \
                f"lane >= {WARP - away}"
        lines += [f"{C_TYPES[dtype]} {side} = {shuffle};",
                  f"if ({edge}) {side} = {rows}[{base} + t * {COLUMNS}{_signed(column)}];"
                  "  // (another warp's)"]
        values[column] = side
    return lines, own, values


def _fill_lines(group, layout: StreamLayout, queues: Queues, span: int, phase: int | None
                ) -> list[str]:
    """Age 0 of every queue: inputs' row ``i`` (from their rings in shared memory), members'
    rows of the last iteration (the thread's own columns from its registers), the columns
    beside from the lanes that own them; threads whose columns reach outside the grid map
    them, reading shared memory."""
    width = size_var(group.domain[1])
    kept = [level for level in layout.levels if level.lateral and
            any(slot.buffer == level.buffer for slot in layout.held)]
    if not kept:
        return []
    every, fast, mapped = [], [], []
    for level in kept:
        rows = _rows(level)
        base = f"ring_{c_name(level.buffer)}" if level.member is None else "last"
        slots = [slot for slot in layout.held if slot.buffer == level.buffer]
        columns = sorted({slot.column for slot in slots if not 0 <= slot.column < COLUMNS})
        lines, own_vector, beside = _beside_lines(group, level, columns, base)
        every += lines
        for slot in slots:
            newest = queues.name(slot, 0, phase)
            own_index = f"{rows}[{base} + t * {COLUMNS}{_signed(slot.column)}]"
            whole = queues.vector(slot, 0, phase)
            if whole and slot.column == 0:  # the thread's 4 columns at once
                fast.append(f"{whole} = {own_vector};")
            elif not whole:
                fast.append(f"{newest} = " + (beside[slot.column] if slot.column in beside
                                              else f"{own_vector}.{'xyzw'[slot.column]}")
                            + ";")
            own = f"col{_signed(slot.column)}"
            mode = None if slot.boundary is None else slot.boundary.mode
            if mode in ("clamp", "mirror"):
                index = f"min(max(kf_{mode}({own}, {width}) - strip, 0), {span - 1})"
                mapped.append(f"{newest} = {rows}[{base} + {index}];")
            elif mode == "constant":
                constant = format_value(slot.boundary.value,  # type: ignore[union-attr]
                                        group.graph.buffers[level.buffer].dtype)
                mapped.append(f"{newest} = kf_inside({own}, {width}) ? {own_index} : "
                              f"{constant};")
            else:
                mapped.append(f"{newest} = {own_index};")
    head = ["// the newest row of each queue: the thread's columns and those beside (every "
            "lane: shuffles)", *every]
    if layout.wrapped:  # (columns beyond the edges hold their wrapped copies)
        return [*head, *fast]
    return [*head, "if (inner) {", *indent(fast, 1), "} else {  // (mapped: from shared memory)",
            *indent(mapped, 1), "}"]


def _member_lines(group, layout: StreamLayout, queues: Queues,
                  ring: tuple[dict[str, int], int],
                  level: StreamLevel, phase: int | None) -> list[str]:
    """One member's row ``i - lag`` at the thread's columns: computed, kept in shared memory
    where read at column offsets, stored where it is an output. ``phase`` None: a generic
    iteration (rows outside the grid skipped, rows near its top and bottom mapped); else an
    unrolled one, every row read inside the grid."""
    graph = group.graph
    kernel = graph.kernel_by_name[level.member]
    height, width = (size_var(s) for s in group.domain)
    row = f"row_{c_name(level.buffer)}"
    values = [_value(level, j) for j in range(COLUMNS)]
    up, down = layout.reach(level.member)
    # a separable stencil summed down its columns first: the thread's 4 columns share them
    body = kernel.body if not config.current().separable_sums \
        else separated(kernel.body, inner_axis=0)  # type: ignore[arg-type]

    def code(edge: bool) -> list[str]:
        emitter = ExprEmitter(graph, ((row, 0), ("col", 0)), group.domain,
                              load_hook=lambda load, em: _queue_read(
                                  layout, queues, ring, level, load, em, edge, phase))
        emitter.state.in_range["col"] = (1, 0)  # a thread's columns may be outside: map all
        results = []
        dtype = graph.buffers[level.buffer].dtype
        for j in range(COLUMNS):  # (a two-byte float's rounded, as its unfused kernel stores it)
            point = emitter.at(((row, 0), ("col", j)))
            results.append(rounded(point.emit(body), dtype))
        return emitter.lines + [f"{v} = {r};" for v, r in zip(values, results, strict=True)]

    lines = [f"// {level.member}: row i{_signed(-level.lag)}", "{",
             f"  const int {row} = i{_signed(-level.lag)};"]
    guarded = phase is None and not layout.wrapped  # (wrapped: rows beyond, copies)
    if not guarded:
        lines += indent(code(False), 1)
    else:
        lines.append(f"  if ({row} >= 0 && {row} < {height}) {{")
        if up or down:
            lines += [f"    if ({row} >= {up} && {row} < {height}{_signed(-down)}) {{",
                      *indent(code(False), 3),
                      "    } else {  // rows near the top or bottom: mapped by the reads' modes",
                      *indent(code(True), 3),
                      "    }"]
        else:
            lines += indent(code(False), 2)
    if level.buffer in group.outputs:
        name = c_name(level.buffer)
        dtype = graph.buffers[level.buffer].dtype
        address = f"(kf_index_t){row} * {width} + col"
        if dtype in HALF_DTYPES:  # four two-byte floats in one 8-byte store
            halves = [f"{element_store(v, dtype)}.bits" for v in values]
            whole = (f"    *reinterpret_cast<uint2*>(&{name}[{address}]) = uint2{{"
                     f"{halves[0]} | ((unsigned){halves[1]} << 16), "
                     f"{halves[2]} | ((unsigned){halves[3]} << 16)}};")
        else:
            vector = _vector(dtype)
            whole = (f"    *reinterpret_cast<{vector}*>(&{name}[{address}]) = "
                     f"{vector}{{{', '.join(values)}}};")
        lines += indent([
            f"if (owns && {row} >= y0 && {row} < y1) {{  // an output: the block's rows",
            "  if (store_whole) {",
            whole,
            "  } else {",
            *[f"    if (col + {j} < {width}) {name}[{address} + {j}] = "
              + (f"{element_store(values[j], dtype)};" if dtype in HALF_DTYPES
                 else f"{values[j]};") for j in range(COLUMNS)],
            "  }",
            "}",
        ], 2 if guarded else 1)
    if guarded:
        lines.append("  }")
    if level.lateral:
        vector = _vector(graph.buffers[level.buffer].dtype)
        lines += ["  if (kept_in_shared)  // read by the warps beside (or mapped) next iteration",
                  f"    *reinterpret_cast<{vector}*>(&{_rows(level)}[here + t * {COLUMNS}]) = "
                  f"{vector}{{{', '.join(values)}}};"]
    lines.append("}")
    reset = [f"{', '.join(f'{v} = 0' for v in values)};  // (kept to the next iteration)"]
    return reset + lines


def _queue_read(layout: StreamLayout, queues: Queues, ring: tuple[dict[str, int], int],
                level: StreamLevel, load: Load, emitter: ExprEmitter, edge: bool,
                phase: int | None) -> str | None:
    """The C value of a read of a level from the queues, or from an input's ring (``ring``:
    its rows and their pitch) for the rows not held in registers (None: not a level, read
    from memory). ``edge``: the row may be outside the grid, mapped by the read's mode to
    the row that holds it."""
    if not layout.staged(level.member, load):  # (an input's far side, a 1-D array...)
        return None
    producer = layout.level(load.buffer)
    row, _ = emitter.coords[0]
    column = emitter.coords[1][1]
    slot = layout.slot_of(load, column)
    dy = load.offsets[0]
    age = level.lag - producer.ready - dy

    def value(at_age: int | str) -> str:
        if slot.held:
            return queues.name(slot, at_age, phase)  # type: ignore[arg-type]
        rings, pitch = ring  # the thread's 4 columns of the ring's row at_age before the newest
        rows = rings[producer.buffer]
        vector = _vector(load.dtype)
        text = (f"*reinterpret_cast<const {vector}*>(&{_rows(producer)}[((i - i_begin - "
                f"{at_age}) & {rows - 1}) * {pitch} + {layout.pad} + t * {COLUMNS}])")
        state = emitter.state
        if (vector, text) not in state.texts:
            state.texts[(vector, text)] = state.declare(vector, emitter.fresh("kept_"), text,
                                                        ("text", vector, text))
        return f"{state.texts[(vector, text)]}.{'xyzw'[slot.column]}"

    if not edge or dy == 0:
        return value(age)
    mode = (load.boundary.mode if load.boundary else "clamp")
    height = size_var(emitter.domain[0])
    shifted = f"{row}{_signed(dy)}"
    dtype = load.dtype
    if mode == "constant":
        constant = format_value(load.boundary.value, dtype)  # type: ignore[union-attr]
        return emitter.define(dtype, f"kf_inside({shifted}, {height}) ? "
                              f"{value(age)} : {constant}", prefix="edge_")
    # the mapped row's age: rows within |dy| of the reader's are ages base - |dy| .. base + |dy|
    base = level.lag - producer.ready
    age_name = emitter.define("int32", f"{base} + {row} - kf_{mode}({shifted}, {height})",
                              prefix="age_")
    if not slot.held:
        return value(age_name)
    ages = range(max(0, base - abs(dy)), base + abs(dy) + 1)
    chosen = queues.name(slot, ages[-1], phase)
    for candidate in reversed(ages[:-1]):
        chosen = f"{age_name} == {candidate} ? {queues.name(slot, candidate, phase)} : ({chosen})"
    return emitter.define(dtype, chosen, prefix="edge_")


def _rotate_lines(layout: StreamLayout, queues: Queues, phase: int | None) -> list[str]:
    """Generic iterations: every queue one row older (members kept in registers only take
    this row as the newest). Phases: only those members' rows, into the register the next
    phase names newest."""
    lines = []
    if phase is None:
        for slot in queues.leaders():
            registers = queues.registers(slot, None)
            for age in range(len(registers) - 1, 0, -1):
                lines.append(f"{registers[age]} = {registers[age - 1]};")
    for slot in layout.held:
        level = layout.level(slot.buffer)
        if level.member is not None and not level.lateral:
            following = None if phase is None else phase + 1
            lines.append(f"{queues.name(slot, 0, following)} = {_value(level, slot.column)};")
    return (["// every queue one row older"] if phase is None and lines else []) + lines
