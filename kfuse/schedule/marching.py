"""When a fused 3-D stencil chain's threads march along z (the lowering is
:mod:`kfuse.codegen.marching`): which groups can, and on which devices and volumes it pays.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse import config
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import Form, Recompute, reads_only_at_points, remote_reason
from kfuse.schedule.tiles import is_arithmetic_heavy

# Whether 3-D recompute groups march: kfuse.config's ``march`` (None: per device, the cuda
# backend asks :func:`pays_on`).
# Marching trades instructions for DRAM efficiency: it issues fewer instructions per point
# than the register tiles but reaches a smaller share of the copy bandwidth (73% against
# 84% in diffusion3d), so it wins where the tiles are limited by instruction issue, i.e. on
# devices with much DRAM bandwidth per multiprocessor cycle. Measured (docs/journal/benchmarks.md,
# session 14): H200 (18 bytes per SM cycle) 0.342-0.345 ms against 0.37-0.39 for the tiles;
# H100 SXM (13) 0.484 against 0.425.
MIN_BYTES_PER_SM_CYCLE = 15.0
# ... and only on volumes that one wave of blocks covers in long chunks (fills_device):
# measured on an H200 (session 14), marching 7% slower than the tiles at 256^3 (chunks of
# 32 planes) and 384^3 (216 blocks for 264 places), 1% faster at 128 x 512^2 (64 planes),
# 12% at 512^3 and 20% at 512 x 1024^2
MIN_CHUNK_PLANES = 128
MIN_WAVE_FILL = 0.9
RESIDENT_BLOCKS_PER_SM = 2  # the marching kernel's registers (about 245 a thread) allow two
MARCH_ROWS = 4  # rows per thread (the thread's 4 columns in each)
MARCH_THREADS_X = 32  # threads per block along x (along y: kfuse.config's march_block_rows)
# Planes per block (a chunk) where the device's resident blocks are not known, and the
# fewest on the GPU: kfuse.config's ``march_planes`` and ``march_least_planes``; planes
# copied ahead of the plane a step computes: ``march_prefetch``.
MARCH_COLUMNS = 4  # columns per thread: one aligned 16-byte vector per row
# Intermediates computed on their newest plane only, then carried: kfuse.config's
# ``march_newest_planes_only``; bytes of staged planes per block: ``march_shared_bytes``.


def pays_on(peak_bandwidth_bytes_per_s: float, multiprocessors: int, clock_hz: float) -> bool:
    """Whether marching beats the register tiles on a device with this peak DRAM bandwidth,
    multiprocessor count and SM clock (see ``MIN_BYTES_PER_SM_CYCLE``)."""
    if multiprocessors <= 0 or clock_hz <= 0:
        return False
    return peak_bandwidth_bytes_per_s / (multiprocessors * clock_hz) >= MIN_BYTES_PER_SM_CYCLE


def fills_device(depth: int, height: int, width: int, multiprocessors: int) -> bool:
    """Whether one wave of marching blocks covers a volume of these sizes in long chunks on
    a device with this many multiprocessors (two blocks each): chunks of at least
    ``MIN_CHUNK_PLANES`` planes and at least ``MIN_WAVE_FILL`` of the wave's places taken,
    or more blocks of rows and columns than one wave holds. Short chunks spend their time on
    the planes at the volume's ends and on each chunk's first plane; a wave partly filled
    leaves multiprocessors idle."""
    resident = RESIDENT_BLOCKS_PER_SM * multiprocessors
    block_rows = MARCH_ROWS * config.current().march_block_rows
    block_columns = MARCH_COLUMNS * MARCH_THREADS_X
    row_column_blocks = -(-height // block_rows) * -(-width // block_columns)
    if row_column_blocks >= resident:
        return True
    chunks = resident // row_column_blocks
    return -(-depth // chunks) >= MIN_CHUNK_PLANES and \
        row_column_blocks * chunks >= MIN_WAVE_FILL * resident


def staged_inputs(graph: Graph, members: Sequence[str]) -> list[str]:
    """External inputs shaped like the iteration space and read point for point along its
    axes (the ones worth staging plane by plane)."""
    kernels = [graph.kernel_by_name[name] for name in members]
    produced = {kernel.output for kernel in kernels}
    domain = kernels[-1].domain
    identity = tuple(range(len(domain)))
    names = []
    for kernel in kernels:
        for access in kernel.accesses:
            buffer = graph.buffers[access.buffer]
            if access.buffer not in produced and access.dims == identity and \
                    not access.remapped and buffer.shape == domain and \
                    access.buffer not in names:
                names.append(access.buffer)
    return names


def march_reasons(graph: Graph, members: Sequence[str], outputs: Sequence[str]) -> str | None:
    """Why the group's threads cannot march along z, or ``None`` if they can."""
    kernels = [graph.kernel_by_name[name] for name in members]
    if len(kernels[-1].domain) != 3 or any(k.reduction is not None for k in kernels):
        return "only 3-D map and stencil groups march along z"
    if is_arithmetic_heavy(kernels):
        return "arithmetic-heavy operators keep narrow register tiles"
    remote = remote_reason(graph, members, "marching")
    if remote:
        return remote
    names = staged_inputs(graph, members)
    if not names:
        return "no input is read plane by plane"
    buffers = [*names, *outputs]
    if any(graph.buffers[name].dtype not in ("float32", "int32") for name in buffers):
        return "staged rows are vectors of four 4-byte elements"
    for kernel in kernels:
        for access in kernel.accesses:
            for offset, boundary in zip(access.offsets, access.boundaries, strict=True):
                periodic = boundary is not None and boundary.mode == "repeat"
                if periodic and any(o for o, axis in zip(offset, access.dims, strict=True)
                                    if axis > 0):
                    return ("a periodic (repeat) read along rows or columns reaches the far "
                            "side, outside the staged planes")
    return None


def marches(graph: Graph, members: Sequence[str], outputs: Sequence[str],
            form: Form | None) -> bool:
    """Whether the group's kernel can have its threads march along z where asked to (a 3-D
    :class:`~kfuse.schedule.forms.Recompute` form whose register tile and block have the
    marching kernel's columns; the tile serves the sizes marching does not take)."""
    kernels = [graph.kernel_by_name[name] for name in members]
    if not isinstance(form, Recompute) or len(kernels[-1].domain) != 3 or \
            reads_only_at_points(graph, members) or is_arithmetic_heavy(kernels):
        return False
    tile, block = form.shape(kernels, 3)
    return block[0] == MARCH_THREADS_X and tile[-1] == MARCH_COLUMNS and \
        march_reasons(graph, members, outputs) is None
