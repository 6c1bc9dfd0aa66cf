"""Fused 3-D stencil chains whose threads march along z, input planes staged in shared memory.

The register-tiled kernel (kfuse.codegen.kernels) gives a thread a tile of 8 planes and
reads, for it, the planes the chain reaches above and below (two steps of a 7-point
stencil: 12 input planes and the intermediate on 10, for 8 output planes). Here a block of
threads owns a column of the volume (``MARCH_ROWS`` rows x 4 columns per thread) and walks
a chunk of its planes, one output plane per step (the planes split among as many blocks
along z as fill one wave of the device, beside the blocks of rows and columns):

- the values a step computes that the next step needs one plane lower (input taps and
  intermediates) stay in registers: the step's code is the register tile's code for one
  plane, less every value whose counterpart one plane higher the same code computes
  (found on the emitted statements' keys, :class:`~kfuse.codegen.cexpr.Statement`: the
  value whose key is this value's key with every plane index one plane higher is its
  next-step copy); each intermediate is
  computed on its newest plane only, over every row and column the step reads it at
  (``march_newest_planes_only`` of :mod:`kfuse.config`), and carried below;
- the input planes the step still reads come from shared memory (the emitter leaves each
  read of a staged input as a marker it records with its buffer and indices, which this
  kernel renders as a global or a shared-memory address), where the block copies
  each plane (its rows and columns grown by the chain's reach) ``march_prefetch`` planes
  ahead with asynchronous copies (cp.async), so that the loads of many planes are in
  flight while the threads compute;
- rows and columns outside the volume keep the boundary modes (index exchange), through
  indices computed once per thread; planes within the chain's reach of the volume's first
  and last plane are computed one point at a time, as the register tile's edge path does.

Measured (docs/journal/benchmarks.md, session 14): on an H200 0.342-0.345 ms for diffusion3d at
512^3 against 0.37-0.39 for the register tiles (a hand-written kernel of the same plan,
experiments/march3d_probe.py, 0.333-0.342); on an H100 SXM slower than the tiles (0.484
against 0.425), so the cuda backend marches only on devices like the first
(:func:`pays_on`) and on volumes that one wave of blocks covers in long chunks
(:func:`fills_device`; at 256^3 and 384^3 the tiles are 7% faster on an H200). The kernel keeps the register-tiled code for sizes and pointers the
marching path does not take (width not a multiple of 4, rows not a multiple of
``MARCH_ROWS``, unaligned arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse import config
from kfuse.codegen.cexpr import (
    EmitState,
    Statement,
    c_name,
    indent,
    moved_key,
    plus_constant,
    row_major_address,
    size_var,
)
from kfuse.codegen.program import GRID_LIMITS, GridAxis, KernelSource, LaunchSpec, launch_bounds
from kfuse.ir.expr import C_TYPES, ITEM_SIZE
from kfuse.schedule.marching import MARCH_COLUMNS, MARCH_ROWS, MARCH_THREADS_X, staged_inputs


@dataclass(frozen=True)
class Staging:
    """How the staged inputs' planes are held: the block's rows and columns grown by the
    chain's reach (the same for every staged input, so one slot index serves them all)."""

    buffers: tuple[str, ...]
    rows: int  # halo rows above and below the block's rows
    columns: int  # halo columns left and right (a multiple of 4: whole vectors)

    @property
    def pitch(self) -> int:
        return MARCH_COLUMNS * MARCH_THREADS_X + 2 * self.columns

    @property
    def halo_rows(self) -> int:
        return MARCH_ROWS * config.current().march_block_rows + 2 * self.rows

    @property
    def plane_elements(self) -> int:
        return self.halo_rows * self.pitch


def staging(group) -> Staging:
    """How the group's staged inputs' planes are held (from the chain's reach)."""
    from kfuse.codegen.kernels import reach

    reached = reach(group, (1, MARCH_ROWS, MARCH_COLUMNS))
    columns = -(-max(reached[2]) // MARCH_COLUMNS) * MARCH_COLUMNS
    return Staging(tuple(staged_inputs(group.graph, [k.name for k in group.members])),
                   max(reached[1]), columns)


@dataclass
class _Step:
    """The emitted code of one plane, split for marching."""

    z_indices: list[str]  # plane indices (iz + k): every step
    thread_indices: list[str]  # row and column indices: once per thread
    values: list[Statement]  # in order
    carried: dict[str, str]  # value -> the value that becomes it one step later
    needed: set[str]  # values a marching step reads (carried) or computes


def _plane_text(offset: int) -> str:
    return plus_constant("iz", offset)


def _split_step(state: EmitState, stored: list[str]) -> _Step:
    """Split one plane's statements into plane indices, per-thread indices and values, and
    find which values the next step takes over: a value whose key, moved one plane up, is
    another value's key (see the module's docstring)."""
    z_indices, thread_indices, values = [], [], []
    for statement in state.statements:
        if statement.key[0] == "index":
            (z_indices if statement.key[1] == "iz" else thread_indices).append(statement.line)
        else:
            values.append(statement)
    value_names = {statement.name for statement in values}
    upper: dict[str, str] = {}  # value -> its copy one plane higher (computed by the step)
    for statement in values:
        moved = moved_key(statement.key, "iz", 1, upper.get)
        other = None if moved is None else state.named.get(moved)
        if other is not None and other != statement.name and other in value_names:
            upper[statement.name] = other
    needed = _needed(values, upper, stored)
    carried = {name: source for name, source in upper.items() if name in needed}
    return _Step(z_indices, thread_indices, values, carried, needed)


def _needed(values: list[Statement], upper: dict[str, str], stored: list[str]) -> set[str]:
    """The values a marching step reads, computes or hands on: the stored values, the
    operands of each value it computes, and the next-step copy of each value it carries
    (a value with a copy one plane higher is carried, not computed)."""
    operands = {statement.name: statement.refs for statement in values}
    needed: set[str] = set()
    pending = [name for name in stored if name in operands]
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        if name in upper:
            pending.append(upper[name])
        else:
            pending += [t for t in operands[name] if t in operands]
    return needed


def _carry_order(carried: dict[str, str]) -> list[str]:
    """Carried values in an order that reads each source before it is overwritten: a value
    whose source is itself carried comes before that source."""
    def depth(name: str) -> int:
        return 0 if carried[name] not in carried else 1 + depth(carried[name])
    return sorted(carried, key=depth, reverse=True)


def _newest_planes_only(group, emitter) -> None:
    """Evaluate each intermediate one plane higher wherever the step evaluates it below its
    highest plane, until every point it evaluates below the highest has its copy one plane
    higher: then a marching step computes each intermediate on its newest plane only (over
    all the rows and columns it is read at) and carries the planes below."""
    kernels = {kernel.name: kernel for kernel in group.members}
    evaluated = emitter.state.evaluated
    highest: dict[str, int] = {}
    for name, coords in evaluated:
        if coords[0][0] == "iz":
            highest[name] = max(highest.get(name, coords[0][1]), coords[0][1])
    while True:
        missing = sorted({(name, (("iz", coords[0][1] + 1), *coords[1:]))
                          for name, coords in evaluated
                          if coords[0][0] == "iz" and coords[0][1] < highest[name]}
                         - evaluated)
        if not missing:
            return
        for name, coords in missing:
            evaluated.add((name, coords))
            emitter.at(coords).emit(kernels[name].body)


def _plane_of(state: EmitState, index: str) -> int:
    """The offset from ``iz`` of the plane index ``index`` (``iz_m2``: -2)."""
    key = state.keys.get(index, ())
    if key[:2] != ("index", "iz") or len(key) != 3:
        raise ValueError(f"marching: a staged read at a plane the step does not index "
                         f"({index})")
    return key[2]


def _rendered(statement: Statement, state: EmitState, graph, plane_slot: dict[int, str] | None,
              staged: Staging) -> str:
    """The statement's text with its reads of staged buffers from global memory
    (``plane_slot`` None) or from the staged planes (``plane_slot``: the slot of each
    plane offset)."""
    text = statement.text
    for access in statement.accesses:
        name, indices = state.accesses[access]
        if plane_slot is None:
            element = f"{c_name(name)}[{row_major_address(graph, name, list(indices))}]"
        else:
            element = (f"kf_staged_{c_name(name)}[{plane_slot[_plane_of(state, indices[0])]} + "
                       f"({indices[1]} - kf_row0) * {staged.pitch} + "
                       f"({indices[2]} - kf_column0)]")
        text = text.replace(access, element)
    return text


def marching_kernel(group, fallback: list[str]) -> tuple[KernelSource, LaunchSpec] | None:
    """The group's kernel marching along z; ``fallback`` (the register-tiled kernel's body
    statements) runs where the marching path does not apply. ``None`` where the planes a
    step reads would take more than ``march_shared_bytes`` (:mod:`kfuse.config`) of shared
    memory."""
    from kfuse.codegen.kernels import _items_code, _vector_condition, items_emitted, reach

    graph = group.graph
    block_x, block_y = MARCH_THREADS_X, config.current().march_block_rows
    prefetch = config.current().march_prefetch
    rows, columns = MARCH_ROWS, MARCH_COLUMNS
    sizes = tuple(size_var(s) for s in group.domain)
    depth_size, height, width = sizes
    below, above = reach(group, (1, rows, columns))[0]
    staged = staging(group)
    points = [((("iz", 0), ("iy", m), ("ix", c)), None) for m in range(rows)
              for c in range(columns)]
    emitter, stores, stored = items_emitted(
        group, points, sizes, {"iz": (-below, above), "iy": (0, rows - 1),
                               "ix": (0, columns - 1)}, columns, frozenset(staged.buffers))
    if config.current().march_newest_planes_only:
        _newest_planes_only(group, emitter)
    state = emitter.state
    step = _split_step(state, stored)
    carried = step.carried
    # plane offsets the marching step still reads from the staged planes
    computed = [statement for statement in step.values
                if statement.name in step.needed and statement.name not in carried]
    plane_offsets = sorted({_plane_of(state, state.accesses[access][1][0])
                            for statement in computed for access in statement.accesses})
    lowest, highest = (plane_offsets[0], plane_offsets[-1]) if plane_offsets else (0, 0)
    planes = highest - lowest + 1 + prefetch
    plane_bytes = [staged.plane_elements * ITEM_SIZE[graph.buffers[name].dtype]
                   for name in staged.buffers]
    if planes * sum(plane_bytes) > config.current().march_shared_bytes:
        return None
    threads = block_x * block_y
    elements, pitch = staged.plane_elements, staged.pitch

    # -- shared memory: each staged input's planes, slot = plane % planes ----------------
    vectors = pitch // columns
    shared_lines = [
        "KF_DYNAMIC_SHARED(unsigned char, kf_shared);",
        f"// staged planes: {planes} of {staged.halo_rows} rows x {pitch} columns per input "
        f"(the block's, {staged.rows} rows and {staged.columns} columns beyond each side)",
        f"const int kf_row0 = kf_y0 - {staged.rows}, kf_column0 = kf_x0 - {staged.columns};",
    ]
    copies, offset = [], 0
    for name, size in zip(staged.buffers, plane_bytes, strict=True):
        ctype = C_TYPES[graph.buffers[name].dtype]
        shared_lines.append(f"{ctype}* const kf_staged_{c_name(name)} = "
                            f"reinterpret_cast<{ctype}*>(kf_shared + {offset});")
        copies.append(f"kf_copy_async16(&kf_staged_{c_name(name)}[kf_to], "
                      f"&{c_name(name)}[kf_from]);")
        offset += planes * size
    total = staged.halo_rows * vectors
    per_thread = -(-total // threads)
    stage = [
        "// the 16-byte pieces of a staged plane this thread copies, found once: offsets in a",
        "// plane of the volume and in a slot (-1: none, or outside the volume)",
        f"kf_index_t kf_copy_from[{per_thread}];",
        f"int kf_copy_to[{per_thread}];",
        "#pragma unroll",
        f"for (int kf_i = 0; kf_i < {per_thread}; ++kf_i) {{",
        f"  const int kf_c = kf_thread + kf_i * {threads};",
        f"  const int kf_row = kf_row0 + kf_c / {vectors}, "
        f"kf_column = kf_column0 + kf_c % {vectors} * {columns};",
        f"  const bool kf_copied = kf_c < {total} && kf_row >= 0 && kf_row < {height} && "
        f"kf_column >= 0 && kf_column < {width};",
        f"  kf_copy_from[kf_i] = (kf_index_t)kf_row * {width} + kf_column;",
        f"  kf_copy_to[kf_i] = kf_copied ? (kf_row - kf_row0) * {pitch} + kf_column - "
        "kf_column0 : -1;",
        "}",
        "// copy plane kf_plane of each staged input into its slot (one group)",
        "const auto kf_stage = [&](int kf_plane, bool kf_needed) {",
        "  if (kf_needed) {",
        f"    const kf_index_t kf_plane_start = (kf_index_t)kf_plane * {height} * {width};",
        f"    const int kf_slot = kf_plane % {planes} * {elements};",
        "    #pragma unroll",
        f"    for (int kf_i = 0; kf_i < {per_thread}; ++kf_i) {{",
        "      if (kf_copy_to[kf_i] < 0)",
        "        continue;",
        "      const int kf_to = kf_slot + kf_copy_to[kf_i];",
        "      const kf_index_t kf_from = kf_plane_start + kf_copy_from[kf_i];",
        *indent(copies, 3),
        "    }",
        "  }",
        "  kf_copy_async_commit();",
        "};"]

    # -- one step: the first of a chunk from global memory, the others marching ----------
    declared = [f"{v.ctype} {v.name};" for v in step.values if v.name in carried]
    carry = [f"{name} = {carried[name]};" for name in _carry_order(carried)]
    first_values = [(f"{v.name} = " if v.name in carried else f"const {v.ctype} {v.name} = ")
                    + _rendered(v, state, graph, None, staged) + ";" for v in step.values]
    slots = {k: f"kf_slot_{'p' if k >= 0 else 'm'}{abs(k)}" for k in plane_offsets}
    slot_lines = [f"const int {slots[k]} = ({_plane_text(k)}) % {planes} * {elements};"
                  for k in plane_offsets]
    marching_values = [f"const {v.ctype} {v.name} = "
                       + _rendered(v, state, graph, slots, staged) + ";" for v in computed]

    single_point = [((("iz_k", 0), ("iy_k", 0), ("ix_k", 0)), None)]
    single = _items_code(group, single_point, sizes, {})
    aligned = _vector_condition(group, columns)
    condition = " && ".join([aligned or "false", f"{height} % {rows} == 0",
                             f"(long long)gridDim.y * {rows * block_y} >= {height}"])
    body = [
        f"// threads march along z: planes in registers, input planes staged {prefetch}"
        " ahead in shared memory",
        f"if (!({condition})) {{",
        "  // sizes or pointers the marching path does not take: register tiles",
        *indent(fallback, 1),
        "  return;",
        "}",
        f"const int kf_thread = threadIdx.y * {block_x} + threadIdx.x;",
        f"const int kf_x0 = blockIdx.x * {block_x * columns}, "
        f"kf_y0 = blockIdx.y * {block_y * rows};",
        *shared_lines,
        f"const int ix = kf_x0 + threadIdx.x * {columns}, iy = kf_y0 + threadIdx.y * {rows};",
        f"const bool kf_active = ix < {width} && iy < {height};",
        *stage,
        "// row and column indices (boundary modes applied): the same on every plane",
        *step.thread_indices,
        "// values one step hands to the next (each one plane lower there)",
        *declared,
        "// the planes split into one chunk per block along z (as many blocks as the device",
        "// holds at once, beside the blocks of rows and columns)",
        f"const int kf_planes = ({depth_size} + gridDim.z - 1) / gridDim.z;",
        f"for (int kf_first = blockIdx.z * kf_planes; kf_first < {depth_size}; "
        "kf_first += gridDim.z * kf_planes) {",
        f"  const int kf_end = min(kf_first + kf_planes, {depth_size});",
        f"  // planes within the chain's reach ({below} below, {above} above) of the volume's "
        "first and last: one point at a time",
        f"  const int kf_march_first = max(kf_first, {below});",
        f"  const int kf_march_end = max(kf_march_first, min(kf_end, {depth_size} - {above}));",
        "  if (kf_active) {",
        "    for (int iz_k = kf_first; iz_k < kf_end; ++iz_k) {",
        "      if (iz_k >= kf_march_first && iz_k < kf_march_end) continue;",
        f"      for (int iy_k = iy; iy_k < iy + {rows}; ++iy_k)",
        f"      for (int ix_k = ix; ix_k < ix + {columns}; ++ix_k) {{",
        *indent(single, 4),
        "      }",
        "    }",
        "  }",
        "  if (kf_march_first >= kf_march_end) continue;",
        f"  // the planes the second step reads, then {prefetch - 1} more ahead",
        f"  for (int kf_plane = kf_march_first + 1 + {lowest}; "
        f"kf_plane <= kf_march_first + 1 + {highest}; ++kf_plane)",
        "    kf_stage(kf_plane, kf_march_first + 1 < kf_march_end);",
        f"  for (int kf_ahead = 1; kf_ahead < {prefetch}; ++kf_ahead)",
        f"    kf_stage(kf_march_first + 1 + {highest} + kf_ahead, "
        f"kf_march_first + 1 + kf_ahead < kf_march_end);",
        "  {",
        "    // the chunk's first plane: every value from global memory",
        "    const int iz = kf_march_first;",
        "    if (kf_active) {",
        *indent(step.z_indices, 3),
        *indent(first_values, 3),
        *indent(stores, 3),
        *indent(carry, 3),
        "    }",
        "  }",
        "  for (int iz = kf_march_first + 1; iz < kf_march_end; ++iz) {",
        f"    kf_copy_async_wait<{prefetch - 1}>();",
        f"    __syncthreads();  // planes iz{lowest:+d} .. iz{highest:+d} staged; the slot "
        "the next copy fills read by every thread",
        f"    kf_stage(iz + {highest} + {prefetch}, iz + {prefetch} < kf_march_end);",
        "    if (kf_active) {",
        *indent(slot_lines, 3),
        *indent(step.z_indices, 3),
        *indent(marching_values, 3),
        *indent(stores, 3),
        *indent(carry, 3),
        "    }",
        "  }",
        "  kf_copy_async_wait<0>();",
        "  __syncthreads();  // the next chunk reuses the slots",
        "}",
    ]
    params = group.parameters()
    grid = (GridAxis((group.domain[2],), block_x * columns),
            GridAxis((group.domain[1],), block_y * rows, GRID_LIMITS[1]),
            GridAxis((group.domain[0],), config.current().march_planes, GRID_LIMITS[2],
                     least_per_block=config.current().march_least_planes))
    launch = LaunchSpec(group.symbol, tuple(k.name for k in group.members), params,
                        (block_x, block_y, 1), grid, dynamic_shared_bytes=offset,
                        blocks_walk=True)
    return group.source(launch_bounds(threads), params, body), launch

