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

Every form is written through one skeleton (:mod:`kfuse.codegen.mapreduce_skeleton`: load,
evaluate, store, reduce, combine); a form says only how threads map to the data:
:mod:`~kfuse.codegen.mapreduce_flat` (vectors), :mod:`~kfuse.codegen.mapreduce_tile`
(column tiles), :mod:`~kfuse.codegen.mapreduce_stream` (warps or blocks walking their rows)
and :mod:`~kfuse.codegen.mapreduce_held` (rows held whole).

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

from collections.abc import Sequence

from kfuse.codegen.mapreduce_flat import FlatKernel
from kfuse.codegen.mapreduce_held import HeldKernel
from kfuse.codegen.mapreduce_held_columns import HeldColumnsKernel
from kfuse.codegen.mapreduce_skeleton import HELPERS, MapReduceKernel
from kfuse.codegen.mapreduce_stream import StreamKernel
from kfuse.codegen.mapreduce_tile import TileKernel
from kfuse.codegen.program import KernelSource, LaunchSpec
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import MapReduceVariant, is_variant_text


def form_of(group: MapReduceGroup, variant: MapReduceVariant) -> type[MapReduceKernel]:
    """The form that writes ``group`` under ``variant`` (normalised)."""
    if group.flat:
        return FlatKernel
    if variant.held_rows:
        return HeldKernel
    if variant.held_columns:
        return HeldColumnsKernel
    if variant.rowsum == "stream":
        return StreamKernel
    return TileKernel


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
    return form_of(group, chosen)(group, chosen).build()


__all__ = ["HELPERS", "form_of", "group_kernel"]
