"""Border handling of tiled stencil kernels: the edge test or a partitioned iteration space.

A stencil's reads near the arrays' edges go through their boundary modes (clamped, mirrored,
wrapped indices; constant mode also selects). Today's tiled kernels apply the modes on every
axis, except that warps whose columns and halo lie inside the rows read them unchecked (the
*edge test*, :func:`kfuse.codegen.kernels._warp_edge_test`). Membarth (2013, ch. 5) partitions
the iteration space instead: an interior region whose reads are all inside the arrays runs
with no boundary handling at all, the border regions with it, one kernel switching by region.
Here the switch is per thread (uniform across a warp where blocks are 32 threads wide): a
thread whose tile and halo lie inside on every axis takes the interior path, every other
thread today's edge test.

:func:`estimate` is the thesis's benefit model (Eqs. 5.3-5.9, with the corrections of
``shared/notes/hipacc-concurrency-borders-reductions.md`` §6.2): instructions per thread
under each form, from the kernel's operations per point, the boundary checks the interior
path leaves out and the share of threads in the interior; ``G`` (Eq. 5.10) is their ratio.
The occupancy ratio of Eq. 5.10 is taken as 1: the region switch's registers are known only
after compiling, where the plan's resource checks see them.

The model does not choose by default: on an H200 its G (1.000-1.003 on the stencil apps)
did not tell the kernels that partitioning made faster (Harris, Shi-Tomasi, Night: 2-5%)
from those it made slower (Unsharp: 3%), so kernels keep the edge test unless their form
asks for ``partitioned`` (docs/journal/benchmarks.md, session 32).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import ceil, prod

from kfuse.analysis.operations import evaluation_points, tile_reach
from kfuse.cuda_limits import WARP
from kfuse.ir.expr import count_operations
from kfuse.ir.graph import Graph

# instructions to apply a boundary mode to one index on sm_90 (our reading of the SASS of
# kf_clamp, kf_mirror, kf_repeat and constant's inside flag); constant mode also selects
# once per read outside the thread's own points
CHECK_INSTRUCTIONS = {"clamp": 2, "mirror": 4, "repeat": 3, "constant": 3}
SELECT_INSTRUCTIONS = 1
# the region test: two comparisons per axis with a halo
SWITCH_INSTRUCTIONS_PER_AXIS = 2
# partition where the model's gain G exceeds 1 by this much (the thesis: G > 1)
PARTITION_ABOVE_GAIN = 1.0


@dataclass(frozen=True)
class BorderEstimate:
    """Instructions per thread (averaged over the grid's threads) under each border
    handling, and the share of threads in the interior region."""

    edge_test: float
    partitioned: float
    interior_share: float
    checks_left_out: float  # per interior thread

    @property
    def gain(self) -> float:
        """The thesis's G (Eq. 5.10, occupancy ratio 1): > 1 where partitioning pays."""
        return self.edge_test / self.partitioned if self.partitioned else 1.0


def _interior_count(extent: int, span: int, before: int, after: int) -> int:
    """How many of the spans ``[0, span), [span, 2 span), ...`` covering ``extent`` points
    have ``before`` points before them and ``after`` after them inside ``[0, extent)``."""
    spans = ceil(extent / span)
    first = ceil(before / span)
    last = (extent - after - span) // span  # start + span - 1 + after < extent
    return max(0, min(spans - 1, last) - first + 1)


def estimate(graph: Graph, members: Sequence[str], outputs: Sequence[str],
             tile: tuple[int, ...], block: tuple[int, int], sizes: Mapping[str, int]
             ) -> BorderEstimate | None:
    """The benefit model for the tiled kernel of ``members`` at ``sizes`` (None where its
    threads read nothing beyond their own points: there is no border to partition)."""
    members = tuple(members)
    ndim = len(tile)
    reach = tile_reach(graph, members, outputs, tile)
    if not any(before or after for before, after in reach):
        return None
    domain = graph.kernel_by_name[members[-1]].domain
    extents = [sizes[symbol] for symbol in domain]
    points = evaluation_points(graph, members, outputs, tile)
    work = 0.0
    modes: set[str] = set()
    selects = 0
    for name in members:
        kernel = graph.kernel_by_name[name]
        evaluated = points[name]
        if kernel.body is not None:
            work += sum(count_operations(kernel.body).values()) * len(evaluated)
        for access in kernel.accesses:
            if graph.producer.get(access.buffer) in members or access.remapped:
                continue
            for point in evaluated:
                for offset, boundary in zip(access.offsets, access.boundaries, strict=True):
                    mode = boundary.mode if boundary is not None else "clamp"
                    read = list(point)
                    for position, axis in enumerate(access.dims):
                        read[axis] += offset[position]
                    work += 1  # the load
                    if any(not 0 <= read[axis] < tile[axis] for axis in range(ndim)):
                        modes.add(mode)
                        selects += mode == "constant"
    # the interior path leaves out the checks of every index outside the thread's points:
    # the edge test already leaves them out along the rows (x, 2-D) of interior warps
    checked_axes = range(ndim - 1) if ndim == 2 else range(ndim)
    per_index = max((CHECK_INSTRUCTIONS[m] for m in modes), default=0)
    checks = sum(reach[axis][0] + reach[axis][1] for axis in checked_axes) * per_index \
        + selects * SELECT_INSTRUCTIONS
    switch = SWITCH_INSTRUCTIONS_PER_AXIS * sum(1 for r in reach if r[0] or r[1])
    # threads in the interior: along x by warps (the test is warp-uniform), else by tiles
    columns = tile[-1]
    warp_columns = (WARP if block[0] % WARP == 0 else block[0]) * columns
    shares = []
    for axis in range(ndim):
        before, after = reach[axis]
        span = warp_columns if axis == ndim - 1 else tile[axis]
        total = ceil(extents[axis] / span)
        inside = _interior_count(extents[axis], span, before, after)
        shares.append(inside / total if total else 0.0)
    interior = prod(shares)
    edge_test = work + checks
    partitioned = interior * (work + switch) + (1 - interior) * (edge_test + switch)
    return BorderEstimate(edge_test, partitioned, interior, checks)


def why_not_partition(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                      tile: tuple[int, ...], block: tuple[int, int],
                      sizes: Mapping[str, int]) -> str | None:
    """Why the kernel keeps the edge test rather than a partitioned iteration space at
    ``sizes`` (None: partitioning pays by the benefit model)."""
    found = estimate(graph, members, outputs, tile, block, sizes)
    if found is None:
        return "its threads read nothing beyond their own points"
    if found.gain <= PARTITION_ABOVE_GAIN:
        return (f"the benefit model predicts no gain (G = {found.gain:.3f}: "
                f"{found.checks_left_out:.0f} checks left out per interior thread, "
                f"{found.interior_share:.0%} of threads interior)")
    return None
