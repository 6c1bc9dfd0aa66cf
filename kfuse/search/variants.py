"""The implementation space of Filipovič et al. 2015 (§2.4, §4): fusions x variants, ranked by prediction.

For a pipeline of map/reduce operators (BLAS-1/2 sequences):

1. **fusions**: every legal subset of operators (rules F1-F5 of :mod:`kfuse.fusion.legality`:
   connected through data or shared inputs, convex, no reduction consumed in its own
   kernel, equal nesting depth), singletons included; plus a row (column) reduction with
   the elementwise epilogue that reads it at the same row (column), whose implementations
   are only the whole-row stream (whole-column) variants (the one exception to F2: a warp
   or block owns the whole row, a block the whole column), and a row reduction with members
   over the same matrix reading it at their row (ATAX), implemented only by held rows;
2. **implementations of a fusion**: every :class:`~kfuse.schedule.forms.MapReduceVariant`
   (block size, tile shape, serial iterations, 16-byte accesses, how row reductions are
   combined, calling order; vector kernels also a persistent grid sized to the device),
   pruned as the paper says: duplicates, variants that cannot run
   (shared memory), and variants *dominated* by one identical except for its calling order
   that uses no more on-chip memory; the general templates' own kernel (``auto``) is one
   more implementation where they can run the group. Plain maps get only one vector per
   thread (``MAP_VARIANTS``) beside the templates; matrix rows also *block rows*
   (``BLOCK_ROW_THREADS`` threads along each row with 8-byte accesses); a column reduction
   feeding an epilogue *whole columns* (``WHOLE_COLUMN_FORMS``: a grid of column tiles, each
   block walking every row). Other block rows, whole columns and 8-byte accesses run and
   are predicted when a plan names them but are not enumerated: which of them is fast
   depends on the registers ptxas gives them, which the model does not follow
   (docs/journal/benchmarks.md, sessions 9 and 10);
3. **combinations**: exact covers of the operators by fusions with an acyclic quotient
   graph, each fusion with one implementation, enumerated best-first by the predicted sum
   (k-best; nothing is thrown away: low-ranked implementations appear in later ones).

The prediction is analytic (:func:`predict_variant`): DRAM bytes at the calibrated copy
bandwidth, derated by how many bytes a variant keeps in flight (Little's law with the
occupancy its block size, shared memory and registers allow) and by the last wave's tail;
the L2 traffic of re-read vectors; arithmetic; plus what streaming does not hide: the atomics
that combine partial reductions (in part), the serialised atomics on one address, each
block's fixed prologue and epilogue (not for plain maps, whose short blocks hide each
other's: ``MAP_THREAD_BYTES`` ranks their equal predictions), one launch and one fill per
atomically combined output (the outputs are set to the identity first; rows a warp owns
whole are stored plainly and need no fill). Held rows add each row's combine over the block
to the block's fixed work. :func:`autotune` times the top ``k`` on the device and keeps the
fastest.

The stream mapping of matrix kernels (:func:`_matrix_efficiency`) uses a finer Little's law
than vector kernels and the tile mapping (whose model and choices were checked on an H200 and
are kept; moving them onto this model changed their measured-good choices):

- only *loads* must be in flight (stores are posted): the reads of a kernel that also writes
  need a proportionally smaller share of ``bandwidth x latency``;
- registers come from an estimate fitted to ptxas (sm_90, the generated kernels: about 1.5
  registers per matrix element a thread keeps in flight), rounded to the allocation unit;
  they bound the resident warps and so the bytes in flight;
- the drawn bandwidth approaches the copy bandwidth with a soft knee,
  ``x / (1 + x^4)^(1/4)`` for ``x`` = bytes in flight / bytes needed, instead of
  ``min(1, x)``: near saturation queueing raises the loaded latency, so more bytes in flight
  still help a little (H200, 16384^2 SGEMV: 114 KB per SM 0.2436 ms, 65 KB 0.2446 ms,
  74 KB on 4-warp blocks 0.2463 ms);
- waves: the full waves run at the resident bytes in flight, the last partial wave at its
  share of them (a kernel of 1.55 waves of few long blocks was measured 1.8% slower than
  one of 3.9 waves of short ones at equal bytes in flight);
- a block's fixed prologue and epilogue (index math, barriers, flushes) cost only the bytes
  that block does not keep in flight meanwhile (other blocks stream on): its duty cycle
  scales its bytes in flight, rather than adding its cycles to the time;
- DRAM row-buffer locality: every matrix row read at once is a separate stream of pages,
  and the more streams the more row-buffer misses; the time grows by ``ROW_STREAM_COST`` per
  concurrently read row (fitted on an H200 at 16384^2: 32x4 stream r4:u2 SGEMV keeps about
  10,500 rows open and was 1.8% slower than the shared-memory tile, which keeps about 300;
  GESUMMV stream r2:u2, 12,700 rows, 2% slower than r1:u8, 3,200). This is why one row
  per warp with more loads per row beats several rows per warp at equal bytes in flight.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kfuse.cuda_limits import MAX_REGISTERS_PER_THREAD, WARP
from kfuse.errors import FusionError, KfuseError
from kfuse.fusion.legality import (
    epilogue_kind,
    epilogue_violations,
    group_violations,
    is_epilogue_group,
    plan_violations,
    segment_reason,
)
from kfuse.fusion.mapreduce import MapReduceGroup, claims, mapreduce_group_reason
from kfuse.fusion.plan import FusionPlan, group_outputs, make_plan
from kfuse.ir.expr import HALF_DTYPES, ITEM_SIZE, count_operations
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile, current_profile
from kfuse.schedule.forms import MapReduceVariant, is_variant_text

# The searched ranges (Filipovič et al. 2015 §7.5 adopts iterations {1, 2, 4, 8, 16}).
VECTOR_THREADS = (128, 256, 512)
MATRIX_THREADS_Y = (4, 8, 16)          # blocks of 32 x y threads
MATRIX_ROWS = (1, 2, 4)                # rows per thread and tile (shuffle row sums)
ITERATIONS = (1, 2, 4, 8, 16)
PERSISTENT_ITERATIONS = (1, 4)         # chunks per loop step of a persistent vector grid
# Plain maps (no reduction): beside the general templates (``auto``), one vector of 16 or 8
# bytes per thread and input, one chunk per block (torch.compile's pointwise shape). Measured
# on an H200 (2^27-2^28 elements, docs/journal/benchmarks.md session 9): these are the fastest of
# this module's vector kernels (VADD 128 x 8 bytes 0.4802 ms, SSCAL 128 x 16 bytes 0.2546,
# the templates 0.4822 / 0.2559); persistent grids and more chunks per block, which the
# model ranks first for their fewer blocks, were 2-8% slower.
MAP_VARIANTS = ((128, 16), (128, 8), (256, 16), (256, 8), (512, 16),
                (512, 8))   # (threads, vector bytes)
# Their blocks' fixed work is hidden by the other resident blocks (128 threads x 8 bytes:
# four times the blocks of the templates, measured no slower), so they predict equal times,
# and among equal predictions the narrowest access whose bytes over all inputs reach
# MAP_THREAD_BYTES per thread ranks first, then the block the device streamed fastest with
# (its profile's map_block_threads, which ``kfuse calibrate`` measures), then the fewest
# threads. Measured on H200s (sessions 7, 11 and 17, alternating rounds, docs/journal/benchmarks.md):
# 8 bytes for VADD (three inputs: 0.4835 ms against 0.4852 for 16 bytes; torch.compile
# 0.4834), MADD (two: 0.7324 against 0.7364; 0.7308) and WAXPBY (two: 0.3692 against 0.3708;
# 0.3677), and 16 bytes for SSCAL (one: 0.2537 against 0.3224 for 8 bytes; 0.2536); on the
# same buffers 256 threads 0.8% and 512 threads 3.7% slower than 128 for MADD and WAXPBY. On
# an H100 512 threads ran every one of them 0.2-1.0% faster than 128 (session 17).
MAP_THREAD_BYTES = 16
STREAM_THREADS_Y = (4, 8)              # stream mapping: warps per block, one row group each
STREAM_ROWS = (1, 2, 4)                # rows per warp walked together
STREAM_UNROLL = (2, 4, 8, 16)          # 16-byte loads per row, thread and step
STREAM_SPANS = (0, 4096)               # columns per block (0: whole rows)
STREAM_MAX_LOADS = 16                  # rows x unroll x matrices per thread (registers)
# Block rows (T x 1 stream blocks, the whole block along one row: torch.compile's GEMV shape)
# enumerated with 512 or 1024 threads, 8-byte accesses, whole rows, and like warp rows at
# most STREAM_MAX_LOADS matrix loads per thread and step. Measured on H200s at 16384^2
# (docs/journal/benchmarks.md, sessions 9 and 10): GESUMMV 512 x 8 bytes x 16 0.4708 / 0.4612 ms on
# two machines against 0.4740 / 0.4650 for the best warp rows (torch.compile 0.4705 /
# 0.4611), and 1024 x 8 bytes x 8 (16 loads of its two matrices) 0.4698 against 0.4706 for
# 512 x 8 bytes x 16 (32 loads; torch.compile 0.4706); SGEMV 512 x 16 0.2369, 1024 x 8 0.2439;
# 16-byte accesses were up to 3% slower in some apps.
# Since session 19 16-byte block rows too: an H100 ran GESUMMV and SGEMV fastest in 1024 x 16
# bytes x 2, and which form is fastest differs between devices: ``kfuse calibrate`` measures
# it (row_block_forms), and among equal predictions the nearest form ranks first.
BLOCK_ROW_THREADS = (512, 1024)
BLOCK_ROW_VECTOR_BYTES = (8, 16)
# Whole columns (one block walks every row of its column tile: column reductions stored
# plainly, with no fill or atomics, and a column epilogue in the same kernel; torch.compile's
# column sums) as (warps per block, rows per thread, vector bytes), enumerated only for a
# column reduction feeding an epilogue, which only they can fuse. Measured on an H200 at
# 16384^2 (docs/journal/benchmarks.md, session 10): SGEMVT 32 x 4 x 16 bytes 0.4870 ms, 32 x 2 x 8
# 0.4880, against 0.4884 for atomics plus an epilogue kernel; 16 warps or 4-byte accesses
# 0.4926-0.5564. Where no epilogue needs them atomics were as fast or faster (ATAX's y 0.6%,
# BiCGK, whose row reductions then take fewer, longer blocks, 27%).
WHOLE_COLUMN_FORMS = ((32, 4, 16), (32, 2, 8))
# Held rows (a block holds each whole row in registers: a row reduction feeds members over
# the same row, ATAX's Aᵀ (A x) in one pass over A; row and column reductions side by side,
# BiCGK's, read A once too) as (threads, vector bytes); the accesses per thread follow from
# the row's length, and a form is enumerated while the words a thread holds (its share of
# the row, of column vectors and of column accumulators) fit in the registers a block of
# that many threads may take, less HELD_BASE_REGISTERS. Measured on an H200 at 16384^2
# (generated, one block per SM, docs/journal/benchmarks.md session 11), ATAX / BiCGK: 1024 threads
# x 8 x 8 bytes 0.2470 / 0.2493 ms, 1024 x 4 x 16 bytes 0.2519 / 0.2531, 512 x 8 x 16 bytes
# 0.2591; two blocks per SM (two waves) 7-10% slower, 256 threads 12-16% slower; ATAX as two
# kernels 0.4843, BiCGK's shared-memory tile 0.2648, torch.compile 0.476.
HELD_ROW_FORMS = ((1024, 8), (1024, 16), (512, 16))
# Held rows with one block per row (the grid as many blocks as rows: no block walks rows, so
# no row's combine waits with no loads of its block in flight, and finished blocks make room
# for new ones) where the group keeps no column accumulators (one atomic per column and row
# would be too many): the normalisations, which then take only these forms. Measured on an
# H200 (docs/journal/benchmarks.md, session 25): rows of 4096 float32, 256 threads x 16 bytes
# 0.1222-0.1317 ms against 0.1430-0.1721 for grids of resident blocks walking contiguous rows
# (RMSNorm, LayerNorm, cross-entropy); rows of 32 K, 1024 x 16 bytes 0.2673 against 0.2852;
# 128 or 512 threads, or 8-byte accesses, up to 20% slower than these two.
HELD_ROW_PER_ROW_FORMS = ((256, 16), (1024, 16))
# Rows of two-byte floats (float16, bfloat16): a held row keeps them widened to float, so a
# block keeps twice the registers per byte of row it read and a multiprocessor holds few
# rows at once; each block's loads wait for its combine. Read in segments of
# HALF_ROW_SEGMENT_UNROLL accesses a thread, the passes after the first again from L2 (the
# shape of Inductor's looped reductions: 32 registers, every thread slot filled), with the
# fewest threads that cut the row into at most HALF_ROW_SEGMENTS segments, they ran faster
# on an H200 (docs/journal/benchmarks.md, session 39; ms, held row / segments): float16 in,
# float32 out (8-byte accesses of the halves), RMSNorm 16384 x 4096 0.1392 / 0.1192,
# LayerNorm 0.1559 / 0.1320, log-softmax 4096 x 32768 0.3564 / 0.2648; every array two
# bytes (16-byte accesses), log-softmax 4096 x 32768 0.261 / 0.194, cross-entropy 16384 x
# 4096 (row results only stored) 0.1164 / 0.1088, log-sum-exp 0.067 / 0.0637. Rows of every
# array two bytes, written back, that 256 threads hold in HALF_ROW_HELD_ACCESSES 16-byte
# accesses each stay held: at 16384 x 4096 the two forms were
# within 10% either way (RMSNorm after a residual add 0.161 / 0.176, softmax 0.098 / 0.108,
# LayerNorm 0.115 / 0.112). Rows of float32 keep their held forms (segments 1-48% slower
# there); rows longer than 1024 threads cut so take the segment forms of any row
# (HELD_SEGMENT_FORMS).
# ... and where 128 or 256 threads of one access each cut the row into at most four segments
# (eight where only row results are stored), one (session 41, H200, 16384 x 4096, ms, 128
# threads x 2 / 256 x 1 / 128 x 1; 512 x 1 slower than all three): LayerNorm float16 0.1345 / 0.1206 / 0.1257, bfloat16 0.1397 / 0.1208 /
# 0.1264, a bfloat16 LayerNorm with gain and bias in bfloat16 0.1401 / 0.1213, RMSNorm
# 0.1186 / 0.1128, log-softmax 0.1224 / 0.1186 / 0.1249; cross-entropy (row results only)
# float16 0.1095 / 0.1108 / 0.0949, bfloat16 0.1103 / 0.1130 / 0.0979.
HALF_ROW_SEGMENT_UNROLL = 2
HALF_ROW_SEGMENTS = 4
HALF_ROW_THREADS = (128, 256, 512, 1024)
HALF_ROW_HELD_ACCESSES = 2
# Held rows in segments: rows longer than those forms hold, in a group without column
# reductions, one block per row holding a segment of T x V x unroll columns at a time, as
# (threads, vector bytes, largest unroll; fewer where the words a thread keeps do not fit).
# Measured (docs/journal/benchmarks.md, session 27), RMSNorm 1024 x 65536 and log-softmax
# 512 x 131072 on an H200: 1024 x 16 bytes x 2 0.171-0.186 / 0.188-0.197 ms, x 4
# 0.174-0.186 / 0.192-0.213, 512 threads 0.186-0.232 / 0.194-0.257, 256 threads 0.199-0.384
# / 0.202-0.417; on an H100, RMSNorm and LayerNorm 1024 x 65536: 1024 x 16 bytes x 2 with
# 224 KB stashed 0.2165 / 0.2470 (torch.compile 0.2179 / 0.2398), 96 KB 0.2299 / 0.2717,
# none 0.2592 / 0.2681; 512 or 256 threads 0.243-0.467.
HELD_SEGMENT_FORMS = ((1024, 16, 2),)
# registers besides the segment's words (more than held rows keep: the passes, the segment's
# addresses; ptxas spilled LayerNorm's 1024 x 16 bytes x 4 segment at 16 + 48)
SEGMENT_BASE_REGISTERS = 24
# ... for rows in segments read again from L2 (no stash; the loads with L2 priorities), where
# the column vectors are loaded in the last pass only: ptxas held LayerNorm's 1024 x 16 bytes
# x 4 (its row, gamma and beta: 48 words) in 64 registers without spilling, 0.1773 ms at
# 1024 x 65536 on an H200 against 0.1885 for the x 3 that 24 gave (session 36)
ROWS_FROM_L2_BASE_REGISTERS = 16
# shared memory a stash of segments may take: about all a block may. Measured above, the H100
# (50 MB of L2) ran 6-10% faster with 224 KB than with 96; the H200 (60 MB, whose L2 serves
# more of the passes read again) 4% slower (RMSNorm 0.1772 against 0.1709 ms, log-softmax
# 0.1964 against 0.1882): the smaller loss.
STASH_LIMIT = 224 * 1024
# With the rows read again carrying L2 eviction priorities (kept by the first pass, let go by
# the last: kfuse.codegen.mapreduce_held), a device whose L2 holds at least this much reads
# them again from L2 faster than from a stash: on an H200 (60 MiB; session 35), 1024 x 16
# bytes x 4 with no stash RMSNorm 1024 x 65536 0.1676 ms against 0.1790 stashed 224 KB,
# LayerNorm 0.1802 / 0.1983, log-softmax 512 x 131072 0.1915 / 0.1948 (no stash x 2
# 0.1856 / 0.1890 / 0.1988). Smaller L2s keep the stash (the H100 measured above, without
# the priorities).
ROWS_FROM_L2_BYTES = 60 * 2**20
ROWS_FROM_L2_UNROLL = 4
# Held columns (a column reduction read back at every element of its column): a block per
# strip of columns walking every row of it, a pass per phase, as (threads across the strip,
# threads down it). Measured on an H100 (docs/journal/benchmarks.md, session 27), column
# standardisation: 16384 x 4096, 8 x 64 threads (strips of 32 columns) x 8 rows per segment
# 0.364 ms (three kernels 0.372, torch.compile 0.370), 8 x 64 x 4 0.366, other strips and
# threads 0.37-0.69, stashing no faster; 2048 x 32768, the strip's columns whole in registers
# (2 x 256 x 8 rows: read once) 0.239 (three kernels 0.374, torch.compile 0.245), segments
# with a stash 0.27-0.35. So: the column whole in registers where it fits
# (HELD_COLUMN_WHOLE_FORMS, at most HELD_COLUMN_WHOLE_UNROLL rows a thread), else segments.
HELD_COLUMN_WHOLE_FORMS = ((2, 256), (4, 128), (8, 64))
HELD_COLUMN_WHOLE_UNROLL = 16
HELD_COLUMN_SEGMENT_FORM = (8, 64, 8)
FEW_ROWS_DOWN = 16  # (few_row_forms: at most 512 threads a block)
# ... and for columns of two-byte floats (kept widened to float, as rows above): measured on
# an H200 (session 39), float16 column standardisation 16384 x 4096, 4 x 128 threads x 4
# rows 0.2292 ms, x 2 0.2289 (which the model, counting its rows in flight, ranks below two
# kernels for a column softmax), 2 x 128 0.245-0.246, 8 x 64 x 8 0.3295 (stashing slower).
HALF_COLUMN_SEGMENT_FORM = (4, 128, 4)
HELD_BASE_REGISTERS = 16
HELD_ROW_CYCLES = 300                  # a row's combine over the block (shuffles, a barrier)
MAX_EXHAUSTIVE_KERNELS = 12            # fusions are all subsets up to this many operators
RANK_RESOLUTION = 0.002                # predictions closer than this rank as equal
# A block-row form that ``kfuse calibrate`` measured fastest on the device ranks as if
# predicted this much faster: the model's knee of bytes in flight is not that fine (an H100
# ran SGEMV in 1024 x 16 bytes x 2 0.5% faster than x 4, which it predicts 0.5% slower;
# docs/journal/benchmarks.md, session 19).
MEASURED_FORM_CREDIT = 0.01
# Rows of a matrix tile that also writes the matrix (a rank-1 update beside a column
# reduction, GEMVER's B + x_prod). Measured on an H200 at 16384^2, which the model does not
# predict: tiles of 16 rows 0.529-0.538 ms, 32 rows 0.594-0.606, 64 rows 0.60-0.80.
MAX_STORED_TILE_ROWS = 16

# Model constants (Hopper-class GPUs; the copy bandwidth and launch cost come from the profile).
MEMORY_LATENCY_S = 800e-9              # loaded DRAM latency: bytes in flight = bandwidth x this
L2_BANDWIDTH_FACTOR = 2.5              # L2 hits stream this many times faster than DRAM
ATOMIC_RATE_PER_S = 2.0e11             # distinct-address reductions (red.global) per second
SAME_ADDRESS_RATE_PER_S = 1.0e9        # atomics on one address serialise in its L2 slice
CLOCK_HZ = 1.755e9
FP_OPS_PER_SM_PER_S = 128 * CLOCK_HZ * 0.5
ATOMIC_EXPOSED = 0.5                   # share of the atomics' time streaming does not hide
BLOCK_CYCLES = 400                     # fixed cost of a block: index math, invariant loads
EPILOGUE_CYCLES = 800                  # barriers and flushes of partial reductions
BASE_REGISTERS = 32
# ptxas gives plain maps (no reduction) far fewer: 12-16 registers for MADD, WAXPBY and VADD
# compiled for aligned arrays, 16-20 testing their pointers (sessions 16-17), so their blocks
# of 128-512 threads all fill the multiprocessor.
PLAIN_MAP_BASE_REGISTERS = 16
MAX_BLOCKS_PER_SM = 32
# Matrix kernels (fitted to ptxas -v, sm_90, on the generated kernels; rms 9 registers):
STREAM_BASE_REGISTERS = 20
REGISTERS_PER_MATRIX_WORD = 1.5        # 32-bit words of a matrix a thread keeps in flight
REGISTERS_PER_VECTOR_WORD = 0.85       # words of column vectors kept per step chunk
BLOCK_ROW_BASE_REGISTERS = 28          # block rows (fitted to ptxas -v, CUDA 13, sm_90,
BLOCK_ROW_REGISTERS_PER_WORD = 0.04    # 8-byte accesses): per word a thread loads per step
KNEE = 4.0                             # soft knee of the drawn bandwidth vs bytes in flight
ROW_STREAM_COST = 1.7e-6               # DRAM time per matrix row read concurrently (H200 fit)


# ---------------------------------------------------------------------------------------------
# Variants of one fusion
# ---------------------------------------------------------------------------------------------

def _auto_equivalent(group: MapReduceGroup) -> MapReduceVariant:
    """The general templates' kernel described as a variant, so that one model ranks both."""
    if group.flat:
        return MapReduceVariant((256, 1), 1, 4, False, "shuffle")
    return MapReduceVariant((32, 8), 4, 1, False, "shuffle")


def enumerate_variants(group: MapReduceGroup, profile: DeviceProfile | None = None,
                       sizes: Mapping[str, int] | None = None) -> list[MapReduceVariant]:
    """Every implementation of a map/reduce group, before pruning (normalised, may repeat).

    With a device ``profile``, vector kernels also get persistent grids: as many blocks as
    the device holds at once, each looping over the chunks; with ``sizes`` too, a row
    reduction feeding members over the same row gets the held-row forms that hold its rows.
    """
    result: list[MapReduceVariant] = []
    held = profile is not None and sizes is not None
    if group.epilogue_kind == "held":  # held rows: the only legal implementations
        return held_row_variants(group, profile, sizes[group.domain[1]],
                                 sizes[group.domain[0]]) if held else []
    if group.epilogue_kind == "held_col":  # held columns: likewise
        return held_column_variants(group, profile, sizes[group.domain[0]] if sizes else None)
    if held and not group.flat and not group.epilogue and not group.stores \
            and group.row_reductions() and group.col_reductions():  # (BiCGK: A once)
        result += held_row_variants(group, profile, sizes[group.domain[1]])
    wides = (True, False) if group.item_size in (2, 4, 8) else (False,)
    if group.flat and not group.reductions:  # plain maps (see MAP_VARIANTS)
        for threads, size in MAP_VARIANTS:
            result.append(MapReduceVariant((threads, 1), 1, 1, wides[0], "shuffle",
                                           vector_bytes=size))
        return result
    if group.flat:
        for threads, iters, wide in itertools.product(VECTOR_THREADS, ITERATIONS, wides):
            result.append(MapReduceVariant((threads, 1), 1, iters, wide, "shuffle"))
            if profile is not None and iters in PERSISTENT_ITERATIONS:
                resident = min(MAX_BLOCKS_PER_SM, profile.max_threads_per_sm // threads)
                result.append(MapReduceVariant((threads, 1), 1, iters, wide, "shuffle", (),
                                               resident * profile.sm_count))
        return result
    row_names = [r.kernel.name for r in group.row_reductions()]
    if not group.col_reductions():  # the stream mapping: warps walk along their rows
        inputs = max(1, len(group.tile_inputs))
        for by, rows, unroll, span in itertools.product(STREAM_THREADS_Y, STREAM_ROWS,
                                                        STREAM_UNROLL, STREAM_SPANS):
            if rows * unroll * inputs <= STREAM_MAX_LOADS and rows * inputs <= 4:
                result.append(MapReduceVariant((32, by), rows, 1, wides[0], "stream", (), 0,
                                               unroll, span))
        if wides[0]:  # block rows
            for threads, size, unroll in itertools.product(
                    BLOCK_ROW_THREADS, BLOCK_ROW_VECTOR_BYTES, STREAM_UNROLL):
                if unroll * inputs <= STREAM_MAX_LOADS:
                    result.append(MapReduceVariant((threads, 1), 1, 1, True, "stream", (), 0,
                                                   unroll, 0, size))
    if group.epilogue_kind == "col":  # whole columns: the only legal implementations
        for by, rows, size in WHOLE_COLUMN_FORMS:
            result.append(MapReduceVariant((32, by), rows, 1, wides[0], "shuffle",
                                           vector_bytes=size, whole_columns=True))
    for by, iters, wide in itertools.product(MATRIX_THREADS_Y, ITERATIONS, wides):
        for rows in MATRIX_ROWS:
            result.append(MapReduceVariant((32, by), rows, iters, wide, "shuffle"))
        if row_names:
            for order in itertools.permutations(row_names):
                result.append(MapReduceVariant((32, by), 32 // by, iters, wide, "smem",
                                               tuple(order)))
    return result


def held_words(group: MapReduceGroup, variant: MapReduceVariant) -> int:
    """32-bit words a thread of a held-row variant keeps: its share of the row of each
    matrix, of each column vector and of each column accumulator (held columns: its rows
    of each matrix and column vector, one accumulator per column and reduction)."""
    words = (group.item_size or 4) // 4 or 1
    if variant.held_columns:
        loaded = len(group.tile_inputs) + len(group.col_inputs)
        return group.width(variant) * words * (variant.unroll * max(loaded, 1)
                                               + len(group.col_reductions()))
    kept = len(group.tile_inputs) + len(group.col_inputs) + len(group.col_reductions())
    return group.width(variant) * variant.unroll * words * max(kept, 1)


def _held_probes(group: MapReduceGroup, rows: int | None
                 ) -> list[tuple[MapReduceVariant, bool]]:
    """(a held-row form with one access per thread, whether its grid has one block per row):
    given the ``rows`` where the group keeps no column accumulators,
    ``HELD_ROW_PER_ROW_FORMS``; else ``HELD_ROW_FORMS``."""
    per_row = rows is not None and not group.col_reductions()
    forms = HELD_ROW_PER_ROW_FORMS if per_row else HELD_ROW_FORMS
    return [(MapReduceVariant((threads, 1), 1, 1, True, "stream", (), 1, 1, 0, size,
                              held_rows=True), per_row) for threads, size in forms]


def _held_register_budget(threads: int, profile: DeviceProfile) -> int:
    """Registers a thread of a block of ``threads`` may take."""
    return min(MAX_REGISTERS_PER_THREAD, profile.registers_per_sm // threads)


def held_row_variants(group: MapReduceGroup, profile: DeviceProfile, columns: int,
                      rows: int | None = None) -> list[MapReduceVariant]:
    """The held-row forms (:func:`_held_probes`) that hold rows of ``columns`` in registers,
    with one block per row or a grid of as many blocks as the device holds at once."""
    half = half_row_segments(group, profile, columns, rows)
    if half is not None:
        return [half]
    result = []
    probes = _held_probes(group, rows)
    # a block whose one access per thread already spans more than a row leaves threads idle
    spanning = [(probe, per_row) for probe, per_row in probes
                if probe.threads[0] * group.width(probe) <= columns]
    for probe, per_row in spanning or probes:
        threads = probe.threads[0]
        unroll = max(1, -(-columns // (threads * group.width(probe))))
        variant = replace(probe, unroll=unroll)
        registers = HELD_BASE_REGISTERS + held_words(group, variant)
        if registers > _held_register_budget(threads, profile):
            continue  # the row does not fit in the registers of such a block
        resident = max(1, _register_blocks(registers, threads, profile))
        result.append(replace(variant, blocks=rows if per_row else resident * profile.sm_count))
    if not result and rows is not None and segment_reason(
            group.graph, [k.name for k in group.members]) is None:
        result = held_segment_variants(group, profile, rows, columns)
    return result


def half_row_segments(group: MapReduceGroup, profile: DeviceProfile, columns: int,
                      rows: int | None) -> MapReduceVariant | None:
    """Rows of two-byte floats held in segments read again from L2 (one block per row, one
    access a thread where 128 or 256 threads cut the row into at most
    :data:`HALF_ROW_SEGMENTS` segments, twice as many where only row results are stored;
    else :data:`HALF_ROW_SEGMENT_UNROLL` accesses a thread, 16 bytes of the group's widest
    array each, the fewest threads of
    :data:`HALF_ROW_THREADS` cutting the row into at most :data:`HALF_ROW_SEGMENTS`), where
    the group reads its rows in two-byte floats and may hold them in segments and such a
    block cuts them so, but for rows of 16-byte accesses, written back, that 256 threads
    hold in :data:`HALF_ROW_HELD_ACCESSES` accesses each; else None."""
    if rows is None or not any(group.graph.buffers[name].dtype in HALF_DTYPES
                               for name in group.tile_inputs):
        return None
    if group.col_reductions() or segment_reason(
            group.graph, [k.name for k in group.members]) is not None:
        return None
    if group.item_size == 2 and (group.stores or group.fed_stores) \
            and columns <= 256 * (16 // 2) * HALF_ROW_HELD_ACCESSES:
        return None  # (every array two bytes: 16-byte accesses of halves; written back: held)
    # one access a thread where 128 or 256 threads cut the row so (into at most four
    # segments where the group writes rows back, eight where it stores only row results),
    # else HALF_ROW_SEGMENT_UNROLL
    stored = bool(group.stores or group.fed_stores)
    for unroll, most, counts in (
            (1, HALF_ROW_SEGMENTS * (1 if stored else 2), HALF_ROW_THREADS[:2]),
            (HALF_ROW_SEGMENT_UNROLL, HALF_ROW_SEGMENTS, HALF_ROW_THREADS)):
        for threads in counts:
            variant = MapReduceVariant((threads, 1), 1, 1, True, "stream", (), rows, unroll,
                                       0, 16, held_rows=True, segmented=True)
            if math.ceil(columns / group.step(variant)) > most:
                continue  # (longer rows: the segment forms of any row)
            fits = ROWS_FROM_L2_BASE_REGISTERS + held_words(group, variant) \
                <= _held_register_budget(threads, profile)
            return variant if fits else None
    return None


def held_column_variants(group: MapReduceGroup, profile: DeviceProfile | None,
                         rows: int | None) -> list[MapReduceVariant]:
    """The held-column form: for ``rows`` known, the first of
    :data:`HELD_COLUMN_WHOLE_FORMS` holding a whole column of the strip in registers (read
    once) where one fits, else :data:`HELD_COLUMN_SEGMENT_FORM` (segments of rows, a pass
    per phase; :data:`HALF_COLUMN_SEGMENT_FORM` for columns of two-byte floats)."""
    def variant(across: int, down: int, unroll: int) -> MapReduceVariant | None:
        probe = MapReduceVariant((across, down), 1, 1, True, "shuffle", unroll=unroll,
                                 held_columns=True)
        budget = _held_register_budget(across * down, profile) if profile is not None \
            else MAX_REGISTERS_PER_THREAD
        fits = SEGMENT_BASE_REGISTERS + held_words(group, probe) <= budget
        return probe if fits else None

    for across, down in few_row_forms(rows) if rows is not None else ():
        unroll = math.ceil(rows / down)
        found = variant(across, down, unroll) if unroll <= HELD_COLUMN_WHOLE_UNROLL else None
        if found:
            return [found]  # (the first that fits: in the order measured fastest)
    halves = any(group.graph.buffers[name].dtype in HALF_DTYPES for name in group.tile_inputs)
    found = variant(*(HALF_COLUMN_SEGMENT_FORM if halves else HELD_COLUMN_SEGMENT_FORM))
    return [found] if found else []


def few_row_forms(rows: int) -> tuple[tuple[int, int], ...]:
    """The held-column forms (threads across, down) for columns of ``rows``: with fewer rows
    than the forms' blocks are deep (statistics over a batch of 8, say), a warp across and
    a quarter of the rows (their next power of two) down, at most :data:`FEW_ROWS_DOWN`,
    so that each thread holds about four rows of its columns and none idles; else
    :data:`HELD_COLUMN_WHOLE_FORMS`. Measured on an H200 (session 41), a centring over a
    batch of 8 rows of 8 M columns: 32 x 2 threads (4 rows each) 0.1325 ms, 32 x 4 0.1327,
    16 x 4 0.1326, 32 x 1 0.1332, 16 x 8 0.1342, 32 x 8 0.1509, the 2 x 256 block (31 of
    32 threads idle) beside two kernels' 0.2826 planned as two (floor 0.1256)."""
    deepest = max(down for _, down in HELD_COLUMN_WHOLE_FORMS)
    if rows >= deepest:
        return HELD_COLUMN_WHOLE_FORMS
    down = min(FEW_ROWS_DOWN, max(1, (1 << max(0, rows - 1).bit_length()) // 4))
    return ((WARP, down),)


def held_segment_variants(group: MapReduceGroup, profile: DeviceProfile, rows: int,
                          columns: int) -> list[MapReduceVariant]:
    """The forms of :data:`HELD_SEGMENT_FORMS` whose segments fit a thread's registers, each
    with as many of the row's segments stashed in shared memory as fit (none, and up to
    :data:`ROWS_FROM_L2_UNROLL` accesses per segment, where the L2 holds
    :data:`ROWS_FROM_L2_BYTES`)."""
    result = []
    from_l2 = profile.l2_bytes >= ROWS_FROM_L2_BYTES
    for threads, size, most in HELD_SEGMENT_FORMS:
        most = ROWS_FROM_L2_UNROLL if from_l2 else most
        probe = MapReduceVariant((threads, 1), 1, 1, True, "stream", (), rows, 1, 0, size,
                                 held_rows=True, segmented=True)
        room = _held_register_budget(threads, profile) - (
            ROWS_FROM_L2_BASE_REGISTERS if from_l2 else SEGMENT_BASE_REGISTERS)
        unroll = min(most, room // held_words(group, probe))
        if unroll < 1:
            continue
        variant = replace(probe, unroll=unroll)
        per_segment = group.stash_bytes(variant, 1)
        if per_segment and not from_l2:
            segments = math.ceil(columns / group.step(variant))
            variant = replace(variant, stash=min(segments, STASH_LIMIT // per_segment))
        result.append(variant)
    return result


def held_row_reason(group: MapReduceGroup, profile: DeviceProfile,
                    sizes: Mapping[str, int] | None) -> str | None:
    """Why no held-row form implements ``group`` (a row reduction read back across its row)
    at ``sizes``; None where one does or the group needs none."""
    if group.epilogue_kind != "held":
        return None
    if sizes is None:
        return ("held rows hold rows of one known length: planned only for given sizes "
                "(p.plan(sizes=...), or a call with arrays)")
    rows, columns = (sizes[symbol] for symbol in group.domain)
    if held_row_variants(group, profile, columns, rows):
        return None
    longest = 0
    for probe, _ in _held_probes(group, rows):  # (a probe holds one access of each)
        threads = probe.threads[0]
        accesses = (_held_register_budget(threads, profile) - HELD_BASE_REGISTERS) \
            // held_words(group, probe)
        longest = max(longest, threads * group.width(probe) * max(0, accesses))
    segments = segment_reason(group.graph, [k.name for k in group.members])
    segments = f"; {segments}" if segments else ""
    return (f"rows of {columns} columns do not fit a block's registers (held rows hold at "
            f"most {longest}{segments}): the row's reductions are complete only in another "
            "kernel")


def prune_variants(group: MapReduceGroup, variants: Sequence[MapReduceVariant]
                   ) -> list[MapReduceVariant]:
    """Drop duplicates, variants that cannot run, and dominated ones (Filipovič et al. 2015 §4).

    Dominance (§7.10 of the notes): among implementations identical except for the calling
    order, keep one using the least on-chip memory (the first in program order on ties).
    Tiles that also store the matrix keep at most ``MAX_STORED_TILE_ROWS`` rows.
    """
    kept: dict[tuple, tuple[int, MapReduceVariant]] = {}
    for variant in variants:
        try:
            normal = group.normalize(variant)
        except FusionError:
            continue  # e.g. more shared memory than a block may use
        if group.stores and normal.rowsum != "stream" and not group.flat \
                and group.tile(normal)[0] > MAX_STORED_TILE_ROWS:
            continue  # measured slow (MAX_STORED_TILE_ROWS)
        key = replace(normal, order=()).text()
        memory = group.shared_bytes(normal)
        if key not in kept or memory < kept[key][0]:
            kept[key] = (memory, normal)
    return [variant for _, variant in kept.values()]


def group_variants(graph: Graph, members: Sequence[str],
                   outputs: Sequence[str] | None = None,
                   profile: DeviceProfile | None = None,
                   sizes: Mapping[str, int] | None = None,
                   group: MapReduceGroup | None = None) -> list[str]:
    """The implementations of one fusion as plan variant strings (``"auto"``: the templates).

    A group the map-reduce generator does not serve has the one implementation ``auto``;
    ``profile`` adds the device-sized persistent grids, ``profile`` and ``sizes`` the
    held-row forms (which depend on the rows' length). ``group``: the members' map/reduce
    group, when the caller built it already.
    """
    if group is None:
        if mapreduce_group_reason(graph, members) is not None:
            return ["auto"]
        outputs = tuple(outputs) if outputs is not None else group_outputs(graph, members)
        group = MapReduceGroup(graph, members, outputs)
    texts = [v.text() for v in prune_variants(group, enumerate_variants(group, profile,
                                                                        sizes))]
    if not claims(graph, members, "auto"):
        texts.append("auto")  # the general templates run it too
    return texts


# ---------------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VariantPrediction:
    """Predicted time of one implementation of one fusion, and what it is made of."""

    time_s: float
    dram_bytes: float
    l2_bytes: float
    atomics: float
    operations: float
    efficiency: float        # fraction of the copy bandwidth the variant can draw
    blocks: int
    blocks_per_sm: int
    shared_bytes: int
    launches: int
    bound: str
    # plain maps: bytes one thread loads per access of each input, and of all inputs, and
    # whether the block has the threads the device streamed fastest with (its profile's
    # map_block_threads, else the fewest)
    access_bytes: int = 0
    thread_bytes: int = 0
    device_block: bool = False
    # stream-mapped matrices: how far the variant is from the block-row form the device
    # streamed its matrices fastest with (0: that form; None: none measured, or held rows;
    # row_form_distance)
    device_form: float | None = None


def predict_variant(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                    variant: str, sizes: Mapping[str, int],
                    profile: DeviceProfile | None = None,
                    group: MapReduceGroup | None = None) -> VariantPrediction:
    """Predicted time of ``members`` run as ``variant`` at ``sizes`` on ``profile``
    (``group``: the members' map/reduce group, when the caller built it already)."""
    profile = profile or current_profile()
    if group is None:
        if mapreduce_group_reason(graph, members) is not None:
            return _roofline(graph, members, outputs, sizes, profile)
        group = MapReduceGroup(graph, members, outputs)
    if is_variant_text(variant):
        chosen = group.normalize(MapReduceVariant.parse(variant))
    elif claims(graph, members, variant):
        chosen = group.normalize(group.default_variant())
    else:
        chosen = group.normalize(_auto_equivalent(group))
    return _predict(group, chosen, sizes, profile)


def _roofline(graph: Graph, members: Sequence[str], outputs: Sequence[str],
              sizes: Mapping[str, int], profile: DeviceProfile) -> VariantPrediction:
    from kfuse.model.roofline import predict_group
    found = predict_group(graph, members, outputs, sizes, profile)
    return VariantPrediction(found.time_s, found.dram_bytes, 0.0, 0.0, found.operations, 1.0,
                             0, 0, 0, 1, found.bound)


def _predict(group: MapReduceGroup, variant: MapReduceVariant, sizes: Mapping[str, int],
             profile: DeviceProfile) -> VariantPrediction:
    graph = group.graph
    v = group.width(variant)
    item = group.item_size or 4
    threads = variant.threads[0] * variant.threads[1]
    points = math.prod(sizes[s] for s in group.domain)
    tile_rows, tile_cols = group.tile(variant)
    stream = variant.rowsum == "stream" and not group.flat
    if group.flat:
        blocks = max(1, math.ceil(points / (tile_cols * variant.iters)))
        if variant.blocks:
            blocks = min(blocks, variant.blocks)
        col_blocks, row_blocks = blocks, 1
    else:
        rows, cols = (sizes[s] for s in group.domain)
        col_blocks = math.ceil(cols / tile_cols)
        row_blocks = 1 if variant.whole_columns or variant.held_columns \
            else math.ceil(rows / (tile_rows * variant.iters))
        if stream:  # one block per row group and span; a step of columns per iteration
            col_blocks = math.ceil(cols / variant.span) if variant.span else 1
        blocks = col_blocks * row_blocks
        if stream and variant.blocks:  # a persistent grid loops over the row groups
            blocks = min(blocks, variant.blocks)
    dram = sum(graph.nbytes(b, sizes) for b in (*group.reads, *group.outputs))
    l2 = 0.0
    atomics = 0.0
    serial = 0.0
    if not group.flat:
        for kernel in group.members:  # vectors along the rows: once per row and tile or span
            for access in kernel.accesses:
                if access.dims == (0,) and access.buffer not in group.produced:
                    l2 += sizes[group.domain[0]] * 4 * col_blocks
    if stream and variant.held_rows:
        # column vectors once per block; columns combined over blocks, one atomic per block
        for name in group.col_inputs:
            l2 += graph.nbytes(name, sizes) * blocks
        atomics += sizes[group.domain[1]] * blocks * len(group.col_reductions())
    elif stream:
        # each warp re-reads the column vectors once per its rows (L1 shares them in part)
        warps_rows = sizes[group.domain[0]] / variant.rows
        for name in group.col_inputs:
            l2 += graph.nbytes(name, sizes) * warps_rows / variant.threads[1]
        if not group.stored_rows(variant):  # whole rows are stored plainly
            atomics += sizes[group.domain[0]] * col_blocks * len(group.row_reductions())
    elif not group.flat:
        for name in group.col_inputs:  # each block re-reads its slice of the vector
            l2 += graph.nbytes(name, sizes) * row_blocks
        atomics += sizes[group.domain[0]] * col_blocks * len(group.row_reductions())
        if not group.stored_columns(variant):  # whole columns are stored plainly
            atomics += sizes[group.domain[1]] * row_blocks * len(group.col_reductions())
    serial += blocks * len(group.all_reductions())
    # occupancy: threads, shared memory, registers
    shared = group.shared_bytes(variant) + group.stash_bytes(variant)
    per_sm = min(MAX_BLOCKS_PER_SM, profile.max_threads_per_sm // threads)
    if shared:
        per_sm = min(per_sm, profile.shared_memory_per_sm // (shared + 1024))
    tile_inputs = len(group.tile_inputs)
    if not stream:  # vectors and the tile mapping (their choices were checked on an H200)
        rows_in_flight = variant.rows if not group.flat else min(variant.iters, 4)
        if variant.held_columns:
            rows_in_flight = variant.unroll
        base = PLAIN_MAP_BASE_REGISTERS if group.flat and not group.reductions \
            else BASE_REGISTERS
        registers = (base + v * rows_in_flight * (tile_inputs + len(group.stores))
                     + v * (len(group.col_inputs) + len(group.col_reductions())))
        per_sm = max(1, min(per_sm, profile.registers_per_sm // (registers * threads)))
        resident = min(blocks, per_sm * profile.sm_count)
        in_flight = resident * threads * v * item * max(tile_inputs, 1) * rows_in_flight
        needed = profile.copy_bandwidth_bytes_per_s * MEMORY_LATENCY_S
        efficiency = min(1.0, in_flight / needed) if needed > 0 else 1.0
        waves = blocks / (per_sm * profile.sm_count)
        if 1 <= waves < 8:  # the last wave leaves slots idle (below one wave: bytes in flight)
            efficiency *= waves / math.ceil(waves)
        efficiency = max(efficiency, 1e-3)
    else:  # the stream mapping: registers fitted to ptxas, efficiency further down
        registers = matrix_registers(group, variant)
        per_sm = max(1, min(per_sm, _register_blocks(registers, threads, profile)))
    if variant.segmented or variant.held_columns:  # passes after the first read again,
        again, hit = _segment_rereads(group, variant, sizes, profile,  # from L2 where they are
                                      per_sm * profile.sm_count)
        dram += again * (1.0 - hit)
        l2 += again * hit
    operations = 0.0
    for kernel in group.members:
        counts = count_operations(kernel.body) if kernel.body is not None else {"alu": 0,
                                                                                 "sfu": 0}
        # a map over the reduced vector runs once per row (column); the rest per point
        at = sizes[group.domain[1 if group.epilogue_kind in ("col", "held_col") else 0]] \
            if kernel in group.tail else points
        operations += (counts["alu"] + 4 * counts["sfu"] + (1 if kernel.reduction else 0)) \
            * at
    if variant.rowsum == "shuffle":
        operations += 2 * 5 * points / v * len(group.row_reductions())
    elif stream:  # one warp reduction per row and span
        operations += 2 * 5 * sizes[group.domain[0]] * col_blocks * WARP \
            * len(group.row_reductions())
    cycles = BLOCK_CYCLES + (EPILOGUE_CYCLES if group.reductions or shared else 0)
    if variant.held_rows:  # each row's combine over the block, with no loads in flight
        cycles += HELD_ROW_CYCLES * math.ceil(sizes[group.domain[0]] / blocks)
    if stream:
        reads = sum(graph.nbytes(b, sizes) for b in group.tile_inputs)
        chunk_in_flight = threads * v * item * max(tile_inputs, 1) * variant.rows

        def drawn(chunks: int) -> float:
            return _matrix_efficiency(
                blocks=blocks, per_sm=per_sm, profile=profile,
                block_in_flight=chunk_in_flight * chunks,
                read_share=reads / dram if dram else 1.0, block_bytes=dram / blocks,
                fixed_s=cycles / CLOCK_HZ)

        efficiency = drawn(variant.unroll)
        # block rows: the columns past the whole steps, one chunk at a time (held rows
        # hold the whole row in one step)
        if variant.block_rows and not variant.held_rows:
            cols = variant.span or sizes[group.domain[1]]
            rest = (cols % group.step(variant)) / cols if cols else 0.0
            efficiency = 1.0 / ((1.0 - rest) / efficiency + rest / drawn(1))
        efficiency /= 1.0 + ROW_STREAM_COST * _concurrent_rows(
            group, variant, blocks, per_sm * profile.sm_count)
    times = {
        "memory": dram / (profile.copy_bandwidth_bytes_per_s * efficiency),
        "l2": l2 / (profile.copy_bandwidth_bytes_per_s * L2_BANDWIDTH_FACTOR),
        "arithmetic": operations / (FP_OPS_PER_SM_PER_S * profile.sm_count),
    }
    bound = max(times, key=times.__getitem__)
    # the kernel and one fill per atomically combined output (rows stored plainly need none)
    launches = 1 + len(group.atomic_reductions(variant))
    # What streaming does not hide: half the atomics' time, the atomics on one address, and
    # each block's fixed work per resident slot (the stream mapping counts that work in its
    # duty cycle instead: _matrix_efficiency).
    exposed = ATOMIC_EXPOSED * atomics / ATOMIC_RATE_PER_S + serial / SAME_ADDRESS_RATE_PER_S
    plain_map = group.flat and not group.reductions
    if not stream and not plain_map:  # (a plain map's blocks hide each other's: MAP_VARIANTS)
        exposed += blocks * cycles / CLOCK_HZ / (per_sm * profile.sm_count)
    total = times[bound] + exposed + launches * profile.launch_overhead_s
    access = v * item if plain_map else 0
    return VariantPrediction(total, dram, l2, atomics + serial, operations, efficiency, blocks,
                             per_sm, shared, launches, bound, access,
                             access * max(tile_inputs, 1),
                             plain_map and threads == profile.map_block_threads,
                             row_form_distance(group, variant, profile) if stream else None)


def _segment_rereads(group: MapReduceGroup, variant: MapReduceVariant,
                     sizes: Mapping[str, int], profile: DeviceProfile, resident: int
                     ) -> tuple[float, float]:
    """(bytes the passes after the first read again, the share of them L2 serves) for rows
    held in segments: a pass reads again what an earlier one read, but for the segment still
    in registers where the pass just before read it too; L2
    keeps the rows of the resident blocks while they fit half of it."""
    rows, columns = (sizes[s] for s in group.domain)
    if variant.held_columns:  # (a strip of columns walked along its rows)
        strip = group.tile(variant)[1]
        segments = max(1, math.ceil(rows / group.tile(variant)[0]))
        units, unit_elements = math.ceil(columns / strip), rows * strip
    else:
        segments = max(1, math.ceil(columns / group.step(variant)))
        units, unit_elements = rows, columns
    stashed = min(variant.stash, segments)
    again = 0.0
    read: set[str] = set()
    kept: list[str] = []  # (what the pass before loaded: its last segment is in registers)
    for kernels in group.segment_phases:
        inputs = [name for name in group.phase_inputs(kernels) if name in group.tile_inputs]
        for name in inputs:
            if name in read:  # the segments neither stashed nor still in registers
                on_chip = stashed if name in group.stashed_inputs() else 0
                on_chip += name in kept and on_chip < segments
                again += rows * columns * ITEM_SIZE[group.graph.buffers[name].dtype] \
                    * (segments - on_chip) / segments
        read.update(inputs)
        kept = inputs
    unit_bytes = unit_elements * (group.item_size or 4) * max(1, len(group.tile_inputs))
    hit = min(1.0, profile.l2_bytes / 2 / max(1.0, min(units, resident) * unit_bytes))
    return again, hit


OTHER_STREAM_FORM = 100.0  # warp rows, where the device measured a block-row form


def row_form_distance(group: MapReduceGroup, variant: MapReduceVariant,
                      profile: DeviceProfile) -> float | None:
    """How far a stream-mapped variant is from the block-row form that ``kfuse calibrate``
    measured fastest on the device for as many matrices per row (or the most it measured):
    0 for that form, else 4 for other threads per block, 1 for another access width, and
    the log2 of the ratio of bytes each thread keeps in flight per matrix; warp rows
    :data:`OTHER_STREAM_FORM`; None where none was measured or the variant holds rows."""
    forms = profile.row_block_forms
    if not forms or variant.held_rows:
        return None
    if not variant.block_rows:
        return OTHER_STREAM_FORM
    matrices = max(1, len(group.tile_inputs))
    measured = {form[0]: form[1:] for form in forms}
    key = max((k for k in measured if k <= matrices), default=min(measured))
    threads, access, unroll = measured[key]
    width = group.width(variant) * (group.item_size or 4)
    return (4.0 * (variant.threads[0] != threads) + 1.0 * (width != access)
            + abs(math.log2(width * variant.unroll / (access * unroll))))


def matrix_registers(group: MapReduceGroup, variant: MapReduceVariant) -> int:
    """Registers per thread of a stream-mapped matrix kernel, estimated (fitted to ptxas on
    sm_90): about 1.5 per 32-bit word of the matrices a thread keeps in flight (the value
    and its share of addresses and masks), 0.85 per word of column vectors per step chunk,
    one per row accumulator. Block rows: one partial sum per row, so ptxas interleaves a
    step's loads with their arithmetic rather than keeping all in flight (CUDA 13, 256-1024
    threads per row, 8-byte accesses, 32-192 words per step: 31-40 registers; 16-byte
    accesses take up to 50, which this fit does not follow)."""
    v = group.width(variant)
    words = (group.item_size or 4) // 4 or 1
    matrices = max(1, len(group.tile_inputs)) + len(group.stores)
    chunks = variant.unroll
    if variant.held_rows:  # the row, column vectors and accumulators, all kept
        base = SEGMENT_BASE_REGISTERS if variant.segmented else HELD_BASE_REGISTERS
        return min(MAX_REGISTERS_PER_THREAD, base + held_words(group, variant))
    if variant.block_rows:
        loaded = chunks * v * words * (variant.rows * matrices + len(group.col_inputs))
        return min(MAX_REGISTERS_PER_THREAD, int(math.ceil(BLOCK_ROW_BASE_REGISTERS
                                                + BLOCK_ROW_REGISTERS_PER_WORD * loaded)))
    estimate = (STREAM_BASE_REGISTERS
                + REGISTERS_PER_MATRIX_WORD * chunks * v * variant.rows * matrices * words
                + REGISTERS_PER_VECTOR_WORD * chunks * v * len(group.col_inputs) * words
                + 0.4 * chunks * variant.rows * len(group.row_reductions())
                + variant.rows * matrices)
    return min(MAX_REGISTERS_PER_THREAD, int(math.ceil(estimate)))


def _register_blocks(registers: float, threads: int, profile: DeviceProfile) -> int:
    """Blocks per SM that the device holds by its register file and threads (the occupancy
    calculation, :mod:`kfuse.model.occupancy`)."""
    from kfuse.model.occupancy import blocks_per_multiprocessor

    return blocks_per_multiprocessor(registers, threads, limits={
        "MaxRegistersPerMultiprocessor": profile.registers_per_sm,
        "MaxThreadsPerMultiProcessor": profile.max_threads_per_sm})


def _concurrent_rows(group: MapReduceGroup, variant: MapReduceVariant, blocks: int,
                     slots: int) -> int:
    """Matrix rows the resident blocks of a stream-mapped kernel read at once (each a
    separate DRAM stream): every resident warp walks ``rows`` rows of each matrix."""
    matrices = max(1, len(group.tile_inputs))
    return min(blocks, slots) * variant.threads[1] * variant.rows * matrices


def knee(x: float) -> float:
    """Share of the copy bandwidth drawn with ``x`` times the bytes in flight that Little's
    law asks for: ``min(1, x)`` with a soft knee (queueing near saturation)."""
    if x <= 0:
        return 0.0
    return x / (1.0 + x ** KNEE) ** (1.0 / KNEE)


def _matrix_efficiency(*, blocks: int, per_sm: int, profile: DeviceProfile,
                       block_in_flight: float, read_share: float, block_bytes: float,
                       fixed_s: float) -> float:
    """Share of the copy bandwidth a matrix kernel draws (see the module's notes).

    ``block_in_flight``: bytes of loads one block keeps in flight while it streams;
    ``read_share``: loads' share of the kernel's DRAM bytes; ``block_bytes``: DRAM bytes
    per block; ``fixed_s``: a block's prologue and epilogue.
    """
    bandwidth = profile.copy_bandwidth_bytes_per_s
    slots = per_sm * profile.sm_count
    needed = bandwidth * max(read_share, 0.05) * MEMORY_LATENCY_S
    if needed <= 0 or block_in_flight <= 0:
        return 1.0
    # a block streams block_bytes at its share of the bandwidth, then pays its fixed work
    streaming = block_bytes * min(blocks, slots) / bandwidth
    duty = streaming / (streaming + fixed_s) if streaming + fixed_s > 0 else 1.0
    full = slots * block_in_flight * duty / needed
    waves = blocks / slots
    if waves <= 1:
        return max(knee(waves * full), 1e-3)
    whole, tail = math.floor(waves), waves - math.floor(waves)
    seconds = whole / knee(full) + (tail / knee(tail * full) if tail > 1e-9 else 0.0)
    return max(waves / seconds, 1e-3)


# ---------------------------------------------------------------------------------------------
# Fusions and combinations
# ---------------------------------------------------------------------------------------------

def fusible_groups(graph: Graph) -> list[tuple[str, ...]]:
    """Every legal fusion (rules F1-F5), singletons included, members in program order.

    Also a row (column) reduction with an elementwise epilogue reading its rows (columns),
    the exception to F2 (:func:`kfuse.fusion.legality.epilogue_violations`): such a
    fusion's implementations are only the whole-row stream (whole-column) variants, which
    is what makes it legal.
    """
    names = [k.name for k in graph.kernels]
    if len(names) > MAX_EXHAUSTIVE_KERNELS:
        raise KfuseError(f"the implementation space enumerates fusions of at most "
                         f"{MAX_EXHAUSTIVE_KERNELS} operators; '{graph.name}' has {len(names)}")
    result = []
    for size in range(1, len(names) + 1):
        for members in itertools.combinations(names, size):
            if size == 1 or not group_violations(graph, list(members)):
                result.append(members)
            elif is_epilogue_group(graph, members) \
                    and not epilogue_violations(graph, members, None):
                result.append(members)
    return result


def covers(graph: Graph, groups: Sequence[tuple[str, ...]]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Exact covers of the operators by ``groups`` whose quotient graph is acyclic."""
    names = [k.name for k in graph.kernels]
    containing: dict[str, list[tuple[str, ...]]] = {n: [] for n in names}
    for group in groups:
        containing[group[0]].append(group)  # a cover picks each group at its first member

    def extend(covered: frozenset[str], chosen: list[tuple[str, ...]]
               ) -> Iterator[tuple[tuple[str, ...], ...]]:
        missing = [n for n in names if n not in covered]
        if not missing:
            if not plan_violations(graph, chosen):
                yield tuple(chosen)
            return
        first = missing[0]
        for group in containing[first]:
            if covered.isdisjoint(group):
                yield from extend(covered | set(group), [*chosen, group])

    yield from extend(frozenset(), [])


@dataclass(frozen=True)
class GroupChoice:
    """One fusion with one implementation and its prediction."""

    members: tuple[str, ...]
    outputs: tuple[str, ...]
    variant: str
    prediction: VariantPrediction


@dataclass(frozen=True)
class Implementation:
    """A combination: every operator covered once, each fusion with an implementation."""

    choices: tuple[GroupChoice, ...]
    predicted_s: float
    # what combinations rank by: the sum of each choice's cluster time (see rank_choices)
    ranked_s: float = field(default=0.0, compare=False)

    def describe(self) -> str:
        return " | ".join(f"[{'+'.join(c.members)}] {c.variant}" for c in self.choices)

    def plan(self, graph: Graph, *, unfused_predicted_time_s: float | None = None,
             reasons: Mapping[tuple[str, str], str] | None = None) -> FusionPlan:
        """The fusion plan of this combination (variants set per group); ``reasons``: why
        edges were left unfused, where the space knows better than legality."""
        groups = [list(choice.members) for choice in self.choices]
        variants = {frozenset(c.members): c.variant for c in self.choices
                    if is_variant_text(c.variant)}  # (an epilogue is legal only under one)
        plan = make_plan(graph, groups, strategy="variants", model="mapreduce",
                         predicted_time_s=self.predicted_s,
                         unfused_predicted_time_s=unfused_predicted_time_s,
                         check_resources=False, variants=variants,
                         reasons=dict(reasons or {}))
        chosen = {frozenset(c.members): c for c in self.choices}
        new_groups = []
        for group in plan.groups:
            choice = chosen.get(frozenset(group.members))
            if choice is not None and is_variant_text(choice.variant):
                found = choice.prediction
                reason = (f"predicted {found.time_s * 1e3:.3f} ms ({found.bound}-bound, "
                          f"{found.efficiency:.0%} of the copy bandwidth drawn)")
                group = replace(group, reason=group.reason or reason)
            new_groups.append(group)
        return replace(plan, groups=tuple(new_groups))


def rank_choices(choices: Sequence[GroupChoice]) -> list[GroupChoice]:
    """Best first: by predicted time, where predictions within ``RANK_RESOLUTION`` of the
    fastest of their cluster count as equal (the model is not finer), ties broken toward
    fewer rows per warp and more loads in flight per thread: the stream variants that
    saturate DRAM predict equal times, and on an H200 one row per warp with more loads per
    row measured fastest (fewer rows open at once, see ROW_STREAM_COST; 16384^2 SGEMV
    r1:u16 0.2396 ms, r1:u8 0.2446 ms, predicted 0.02% apart). Clusters, not fixed buckets
    of the time axis: two predictions 0.02% apart never fall on either side of a boundary."""
    return [choice for _, choice in _clustered(choices)]


def ranking_time(prediction: VariantPrediction) -> float:
    """The predicted time, less :data:`MEASURED_FORM_CREDIT` for the block-row form the
    device measured fastest (the model's knee of bytes in flight is not finer)."""
    if prediction.device_form == 0.0:
        return prediction.time_s / (1.0 + MEASURED_FORM_CREDIT)
    return prediction.time_s


def _clustered(choices: Sequence[GroupChoice]) -> list[tuple[float, GroupChoice]]:
    """(the ranking time of its cluster's fastest member, choice) in :func:`rank_choices`
    order: the time a choice ranks by."""
    ordered = sorted(choices, key=lambda choice: ranking_time(choice.prediction))
    cluster, cluster_start, keyed = -1, -math.inf, []
    for choice in ordered:
        time_s = ranking_time(choice.prediction)
        if time_s > cluster_start * (1 + RANK_RESOLUTION):
            cluster, cluster_start = cluster + 1, time_s
        keyed.append(((cluster, *_tie_key(choice)), cluster_start, choice))
    return [(start, choice) for _, start, choice in sorted(keyed, key=lambda item: item[0])]


def _tie_key(choice: GroupChoice) -> tuple:
    """Among equal predictions: fewer rows per warp, then the block-row form nearest the one
    the device measured fastest (:func:`row_form_distance`), then more loads in flight (held
    rows: more accesses per row; plain maps: MAP_THREAD_BYTES), then name."""
    found = choice.prediction
    if found.access_bytes:  # plain maps (MAP_VARIANTS): the narrowest access that reaches
        short = found.thread_bytes < MAP_THREAD_BYTES  # the bytes per thread, then the
        threads = MapReduceVariant.parse(choice.variant).threads[0] \
            if is_variant_text(choice.variant) else 0  # device's block, the fewest threads
        return (short, found.access_bytes, not found.device_block, threads, choice.variant)
    rows, loads = 0, 0
    if is_variant_text(choice.variant):
        variant = MapReduceVariant.parse(choice.variant)
        rows, loads = variant.rows, variant.rows * variant.unroll
        if variant.held_rows:  # the whole row is in flight either way: more accesses
            loads = variant.threads[0] * variant.unroll  # first (HELD_ROW_FORMS)
    return (rows, found.device_form or 0.0, -loads, choice.variant)


class ImplementationSpace:
    """Fusions, their implementations and the combinations of one graph at given sizes.

    Without ``sizes`` the model predicts at nominal sizes, and the held-row forms (which
    hold rows of one length) are left out, so that the plan runs at any size.
    """

    def __init__(self, graph: Graph, sizes: Mapping[str, int] | None = None,
                 profile: DeviceProfile | None = None):
        from kfuse.model.roofline import nominal_sizes
        self.graph = graph
        self.sized = bool(sizes)  # (held rows only for sizes known)
        self.sizes = dict(sizes) if sizes else nominal_sizes(graph)
        self.profile = profile or current_profile()
        self.fusions = fusible_groups(graph)
        self._ranked: dict[tuple[str, ...], list[tuple[float, GroupChoice]]] = {}

    def unimplemented_reasons(self) -> dict[tuple[str, str], str]:
        """Why each edge inside a legal fusion that has no implementation at these sizes
        (a held-row group whose rows are too long) was left unfused, keyed by (producer,
        consumer)."""
        reasons: dict[tuple[str, str], str] = {}
        for members in sorted(self.fusions, key=len, reverse=True):
            if len(members) < 2 or epilogue_kind(self.graph, members) != "held" \
                    or mapreduce_group_reason(self.graph, members) is not None:
                continue  # (only held rows depend on the sizes)
            group = MapReduceGroup(self.graph, members, group_outputs(self.graph, members))
            reason = held_row_reason(group, self.profile, self.sizes if self.sized else None)
            if reason is None:
                continue
            for name in members:
                for buffer in self.graph.kernel_by_name[name].reads:
                    producer = self.graph.producer.get(buffer)
                    if producer in members:
                        reasons.setdefault((producer, name), f"no implementation: {reason}")
        return reasons

    def choices(self, members: tuple[str, ...]) -> list[GroupChoice]:
        """The fusion's implementations, best predicted first."""
        return [choice for _, choice in self._clustered_choices(members)]

    def _clustered_choices(self, members: tuple[str, ...]) -> list[tuple[float, GroupChoice]]:
        """(time ranked by, choice) of the fusion's implementations, best first (cached)."""
        if members not in self._ranked:
            outputs = group_outputs(self.graph, members)
            group = None if mapreduce_group_reason(self.graph, members) is not None \
                else MapReduceGroup(self.graph, members, outputs)  # shared by the variants
            found = []
            for variant in group_variants(self.graph, members, outputs, self.profile,
                                          self.sizes if self.sized else None, group):
                prediction = predict_variant(self.graph, members, outputs, variant,
                                             self.sizes, self.profile, group)
                found.append(GroupChoice(members, outputs, variant, prediction))
            self._ranked[members] = _clustered(found)
        return self._ranked[members]

    def covers(self) -> list[tuple[tuple[str, ...], ...]]:
        return list(covers(self.graph, self.fusions))

    def count(self) -> int:
        """How many implementations (combinations) the space holds after pruning."""
        return sum(math.prod(len(self.choices(g)) for g in cover) for cover in self.covers())

    def unfused_time(self) -> float:
        return sum(self.choices((k.name,))[0].prediction.time_s for k in self.graph.kernels)

    def ranked(self, limit: int | None = None) -> list[Implementation]:
        """Combinations best-first by predicted time (k-best over covers and variants)."""
        streams = [self._cover_stream(cover) for cover in self.covers()]
        merged = heapq.merge(*streams, key=lambda item: item.ranked_s)
        return list(itertools.islice(merged, limit))

    def best(self) -> Implementation:
        return self.ranked(1)[0]

    def _cover_stream(self, cover: tuple[tuple[str, ...], ...]) -> Iterator[Implementation]:
        """One cover's combinations in ascending ranked time (lazy k-best of sums)."""
        lists = [self._clustered_choices(group) for group in cover]  # (time, choice) pairs
        if not all(lists):  # a fusion whose every implementation was pruned
            return
        start = (0,) * len(lists)

        def total(index: tuple[int, ...]) -> float:
            return sum(lists[g][i][0] for g, i in enumerate(index))

        heap = [(total(start), start)]
        seen = {start}
        while heap:
            ranked_s, index = heapq.heappop(heap)
            picks = tuple(lists[g][i][1] for g, i in enumerate(index))
            yield Implementation(picks, sum(c.prediction.time_s for c in picks), ranked_s)
            for g in range(len(lists)):
                if index[g] + 1 < len(lists[g]):
                    following = index[:g] + (index[g] + 1,) + index[g + 1:]
                    if following not in seen:
                        seen.add(following)
                        heapq.heappush(heap, (total(following), following))


def best_plan(graph: Graph, sizes: Mapping[str, int] | None = None,
              profile: DeviceProfile | None = None) -> FusionPlan:
    """The predicted-best combination of the implementation space, as a fusion plan."""
    space = ImplementationSpace(graph, sizes, profile)
    return space.best().plan(graph, unfused_predicted_time_s=space.unfused_time(),
                             reasons=space.unimplemented_reasons())


__all__ = ["GroupChoice", "Implementation", "ImplementationSpace", "VariantPrediction",
           "best_plan", "covers", "enumerate_variants", "fusible_groups", "group_variants",
           "predict_variant", "prune_variants"]
