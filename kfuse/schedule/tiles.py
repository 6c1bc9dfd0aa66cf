"""The register tiles and thread blocks of tiled kernels, per kind of group.

A tiled kernel's thread computes a register tile of points (rows, columns; in 3-D rows,
middle, columns) and its block has ``TILED_BLOCKS`` threads. The tables hold the measured
defaults by kind (``single``: one operator, ``recompute``: a fused chain recomputing its
producers at their taps, ``arithmetic``: arithmetic-bound operators) and dimensionality; a
form of :mod:`kfuse.schedule.forms` may name its own tile and block instead, and
:mod:`kfuse.config` (``register_tile``, ``tile_block``, ``items_per_thread_special``)
changes the defaults of every kernel for a scope (what ``benchmarks/tile_sweep.py`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from kfuse import config
from kfuse.analysis.operations import operations_per_point
from kfuse.ir.graph import Kernel

TILE_X, TILE_Y = 64, 4  # measured on an H200: slightly ahead of 32 x 8 (docs/journal/benchmarks.md)
# Threads per block (x, y) of register-tiled kernels by kind (as REGISTER_TILES) and
# dimensionality; 3-D tiles run best in blocks of 128 threads (H200, benchmarks/tile_sweep.py:
# 7-point stencils 95% of copy vs 88% in blocks of 64 x 4); 2-D groups that recompute
# chained stencils in their 10 x 4 tiles run best in blocks of 64 threads (Harris 0.164 ms
# in blocks of 32 x 4, 0.157 in 32 x 2, 0.159 in 64 x 1, 0.180 in 32 x 1; Shi-Tomasi 0.170,
# 0.166, 0.168, 0.191; docs/journal/benchmarks.md, session 8).
TILED_BLOCKS: dict[tuple[str, int], tuple[int, int]] = {
    ("single", 2): (TILE_X, TILE_Y), ("recompute", 2): (32, 2), ("arithmetic", 2): (TILE_X, TILE_Y),
    ("single", 3): (32, 4), ("recompute", 3): (32, 4), ("arithmetic", 3): (32, 4),
    ("where_read", 2): (TILE_X, TILE_Y), ("where_read", 3): (32, 4),
}
# Blocks per SM that tiled kernels ask the compiler to fit (__launch_bounds__; 0: no
# request, the compiler may use up to 255 registers per thread)
TILE_MIN_BLOCKS = 0

ITEMS_PER_THREAD = 4  # points per thread of flat kernels: loads in flight
# (Flat kernels with special functions take kfuse.config's items_per_thread_special.)
# Register tiles of tiled kernels: points per thread along the outermost axis (rows of an
# image, planes of a volume), the middle axis (3-D) and the innermost axis (columns), for
# one operator alone ("single") and for groups recomputing producers at taps. The points
# of one thread share stencil taps and the intermediates of fused producers; columns make
# aligned vector loads. Chosen by benchmarks/tile_sweep.py on an H200 (docs/journal/benchmarks.md;
# recompute groups in 2-D: 10 x 4 ahead of 8, 9, 11 and 12 rows in every block shape tried,
# e.g. Harris 0.157 ms against 0.165-0.168 in blocks of 32 x 2).
REGISTER_TILES: dict[tuple[str, int], tuple[int, ...]] = {
    ("single", 2): (8, 4), ("recompute", 2): (10, 4), ("arithmetic", 2): (8, 1),
    ("single", 3): (8, 2, 4), ("recompute", 3): (8, 2, 4), ("arithmetic", 3): (8, 1, 1),
    # members evaluated where read at other points (another level, a computed index) share
    # little between a thread's points: short tiles, each point's reads of its own
    ("where_read", 2): (2, 4), ("where_read", 3): (2, 1, 4),
}
# Threads per multiprocessor a 2-D tiled kernel's grid offers at least where the GPU plans
# it (half of Hopper's 2048 resident): a pyramid's coarse levels under the default 8 x 4
# tiles ran as a few dozen blocks, 20-48 us each for megabytes (docs/journal/benchmarks.md,
# session 33)
FILL_THREADS_PER_SM = 1024
# Operators above this many operations per point (special functions weighted as in the
# roofline model) are arithmetic-bound on an H100/H200: they get the "arithmetic" tiles.
ARITHMETIC_HEAVY_OPERATIONS = 100
# Smaller register tiles for fused groups whose kernel would not fit the registers
# (ptxas decides, see kfuse.fusion.resources), in order of preference.
FALLBACK_TILES: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {
    ("recompute", 2): ((8, 4), (4, 4), (4, 2), (4, 1)),
    ("recompute", 3): ((4, 2, 4), (8, 1, 4), (4, 1, 1)),
    ("where_read", 2): ((1, 4), (1, 1)), ("where_read", 3): ((1, 1, 4), (1, 1, 1)),
}
STAGED_ROWS = 8  # points per thread along the outermost axis of staged kernels


def is_arithmetic_heavy(members: Sequence[Kernel]) -> bool:
    """True if a member does so much arithmetic per point that it, not memory, is the limit.

    Register tiles save loads, not arithmetic: such kernels get narrow tiles and keep
    their registers for the arithmetic (measured on the Night filter's bilateral passes).
    """
    return any(operations_per_point(kernel) > ARITHMETIC_HEAVY_OPERATIONS
               for kernel in members)


def tile_choices(variant: str, ndim: int) -> list[tuple[int, ...] | None]:
    """Register tiles to try for a group, best first (None: the variant has no tile)."""
    if variant not in ("recompute", "where_read") or ndim < 2:
        return [None]
    first = register_tile(variant, ndim)
    return [first, *(tile for tile in FALLBACK_TILES[(variant, ndim)] if tile != first)]


def staged_tile() -> tuple[int, int]:
    """Outputs (rows, columns) of one block of a staged (shared-memory) kernel: blocks of
    :func:`staged_block` threads, ``STAGED_ROWS`` rows per thread."""
    block_x, block_y = staged_block()
    return (block_y * STAGED_ROWS, block_x)


def staged_block() -> tuple[int, int]:
    """Threads (x, y) of a staged kernel's block where its form names none."""
    chosen = config.current().tile_block
    return (TILE_X, TILE_Y) if chosen is None else chosen[:2]


def tiled_block(variant: str, ndim: int) -> tuple[int, int]:
    """Threads (x, y) of a tiled kernel's block of this variant where its form names none."""
    chosen = config.current().tile_block
    return TILED_BLOCKS[(tile_kind(variant), ndim)] if chosen is None else chosen[:2]


def least_blocks() -> int:
    """Blocks per SM tiled kernels ask the compiler to fit (0: no request)."""
    chosen = config.current().tile_block
    return TILE_MIN_BLOCKS if chosen is None else chosen[2]


def items_per_thread(special: bool) -> int:
    """Points per thread of a flat kernel (``special``: it calls special functions)."""
    return config.current().items_per_thread_special if special else ITEMS_PER_THREAD


def register_tile(variant: str, ndim: int) -> tuple[int, ...]:
    """Points one thread computes per axis in a tiled kernel of this variant.

    (rows, columns) in 2-D, (rows, middle, columns) in 3-D; 1-D kernels are flat: (1,).
    """
    if ndim < 2:
        return (1,) * ndim
    kind = tile_kind(variant)
    chosen = config.current().register_tile
    if chosen is not None and kind != "arithmetic" and len(chosen) == ndim:
        return chosen
    return REGISTER_TILES[(kind, ndim)]

def tile_kind(variant: str) -> str:
    """The REGISTER_TILES / TILED_BLOCKS kind of a group's variant."""
    return variant if variant in ("recompute", "arithmetic", "where_read") else "single"


def filling_tile(tile: tuple[int, ...], points: int, sm_count: int) -> tuple[int, ...]:
    """``tile``, or the largest tile it halves down to (its rows first, its columns last:
    they make the vector accesses) whose grid over ``points`` gives each of ``sm_count``
    multiprocessors :data:`FILL_THREADS_PER_SM` threads: a grid of few blocks leaves the
    GPU waiting on memory latency, which more threads hide."""
    wanted = sm_count * FILL_THREADS_PER_SM
    shrunk = list(tile)
    while points < wanted * prod(shrunk) and prod(shrunk) > 1:
        axis = next(axis for axis, count in enumerate(shrunk) if count > 1)
        shrunk[axis] //= 2
    return tuple(shrunk)
