"""When kernels side by side in one block pay (horizontal fusion; Li et al. 2022, HFuse).

HFuse profiles every split; it explains its gains by the parts' bottlenecks and occupancy
(§IV of the paper, ``shared/notes/hfuse-horizontal-fusion.md``): a memory-bound kernel
beside an arithmetic-bound one overlaps its memory stalls with the other's arithmetic, and
a kernel that leaves the GPU partly idle (too few bytes in flight, too few threads) gets
more of it beside another. This model predicts the three ways of running independent
kernels from the same facts, with the device profile:

- each part alone (:func:`part_time`): its DRAM time at :data:`ALONE_STREAM_EFFICIENCY` of
  the copy bandwidth, stretched where its resident threads keep fewer bytes in flight than
  keep DRAM busy (:data:`BYTES_IN_FLIGHT_PER_SM`), and its arithmetic time, stretched where
  they are too few to keep the units busy; the larger of the two;
- one after another: the sum (one launch: the next overlaps the kernel before it); on two
  streams: the wave model (:mod:`kfuse.model.waves`); neither below a call's host time;
- side by side: the parts share DRAM and the arithmetic units, so the fused kernel takes at
  least the sum of the times they hold DRAM (:func:`dram_held_s`) and the sum of their
  arithmetic, at the threads and bytes in flight the fused block keeps resident, and at
  least each part's own time at the threads it keeps resident for it (fewer where the fused
  block's registers or size allow fewer blocks than the part had alone: the occupancy
  HFuse's register cap would restore); memory-bound parts of balanced grids interleave their
  DRAM phases (:func:`side_by_side_efficiency`).

Measured against it: docs/journal/benchmarks.md, session 28 (``benchmarks/hfuse_bench.py``,
``experiments/hfuse_model_check.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.model.device import DeviceProfile
from kfuse.model.occupancy import blocks_per_multiprocessor
from kfuse.model.waves import KernelShape, decide

# Bytes a multiprocessor must have asked of DRAM and not yet received to keep DRAM busy:
# bandwidth x latency per multiprocessor (an H200: 4.8 TB/s x about 0.65 us / 132 SMs)
BYTES_IN_FLIGHT_PER_SM = 24 * 1024
# Resident threads per multiprocessor whose independent arithmetic keeps its units busy
ARITHMETIC_SATURATING_THREADS = 512
# What a compiled call costs the host at least (session 24: 8-14 us on an H200's host): a
# call whose kernels take less is no faster for fewer of them
CALL_FLOOR_S = 10e-6
# The share of the copy bandwidth a memory-bound kernel reaches alone (kfuse's stencil apps
# run at 1.05-1.1x their DRAM floor: docs/journal/benchmarks.md), and how unequal the grids
# of kernels side by side may be for their DRAM phases to interleave all through the kernel
# (two memory-bound kernels of equal grids ran 3-10% faster side by side, session 28; a
# pyramid's levels, 4x apart, 4.6% slower)
ALONE_STREAM_EFFICIENCY = 0.9
BALANCED_GRIDS = 1.25
# a part overlaps another's DRAM traffic with its arithmetic only with this much more
# arithmetic than DRAM time (a degree-32 polynomial, 1.3x, ran slower side by side)
SPARE_ARITHMETIC = 2.0
PAYS_MARGIN = 0.05  # side by side is chosen where predicted at least this much faster
REGISTER_GRANULE = 8  # registers per thread are allocated in steps of 8 (256 per warp)


@dataclass(frozen=True)
class PartShape:
    """One kernel as the model sees it: its launch (blocks, threads per block, registers
    per thread, shared bytes per block) and its DRAM and arithmetic times at the device's
    full rates."""

    name: str
    blocks: int
    threads: int
    registers: int
    shared_bytes: int
    memory_s: float
    arithmetic_s: float
    bytes_in_flight: float = 64.0  # per thread: what it asks of DRAM before it waits
    static_shared_bytes: int = 0  # of shared_bytes, what the compiler reported (not launched)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.arithmetic_s else "arithmetic"


@dataclass(frozen=True)
class SideBySidePrediction:
    """Predicted seconds of the parts one after another, on separate streams and side by
    side (with ``threads`` per part and ``least_blocks``), and the reason in words."""

    sequential_s: float
    streams_s: float
    fused_s: float
    threads: tuple[int, ...]
    least_blocks: int
    reason: str

    @property
    def best_apart_s(self) -> float:
        return min(self.sequential_s, self.streams_s)

    @property
    def pays(self) -> bool:
        return self.fused_s < self.best_apart_s * (1.0 - PAYS_MARGIN)


def resident_blocks(threads: int, registers: int, shared_bytes: int,
                    profile: DeviceProfile) -> int:
    """Blocks of this shape one multiprocessor holds (at least one)."""
    return max(1, blocks_per_multiprocessor(
        registers, threads, shared_bytes,
        {"MaxRegistersPerMultiprocessor": profile.registers_per_sm,
         "MaxThreadsPerMultiProcessor": profile.max_threads_per_sm,
         "MaxSharedMemoryPerMultiprocessor": profile.shared_memory_per_sm}))


def part_time(part: PartShape, resident_threads: float,
              efficiency: float = ALONE_STREAM_EFFICIENCY) -> float:
    """A part's time with ``resident_threads`` of its threads per multiprocessor on average:
    its DRAM time at ``efficiency`` of the copy bandwidth, stretched where they keep too few
    bytes in flight, its arithmetic time where they are too few to keep the units busy; the
    larger of the two."""
    memory_busy = min(1.0, resident_threads * part.bytes_in_flight / BYTES_IN_FLIGHT_PER_SM)
    arithmetic_busy = min(1.0, resident_threads / ARITHMETIC_SATURATING_THREADS)
    return max(part.memory_s / max(memory_busy, 1e-3) / efficiency,
               part.arithmetic_s / max(arithmetic_busy, 1e-3))


def side_by_side_efficiency(parts: Sequence[PartShape]) -> float:
    """The share of the copy bandwidth the DRAM traffic of ``parts`` side by side reaches:
    where their grids are balanced (within :data:`BALANCED_GRIDS`), each part's blocks' DRAM
    phases (load a tile, compute, store) leave gaps that the others' fill, all through the
    kernel; where not, the larger part runs its extra blocks alone, as it runs alone."""
    blocks = [part.blocks for part in parts]
    if max(blocks) > BALANCED_GRIDS * min(blocks):
        return ALONE_STREAM_EFFICIENCY
    return 1.0 - (1.0 - ALONE_STREAM_EFFICIENCY) / len(parts)


def dram_held_s(part: PartShape) -> float:
    """How long a part keeps the DRAM to itself beside another: its DRAM time, or where its
    arithmetic is not at least :data:`SPARE_ARITHMETIC` times that, its arithmetic time too
    (its warps then wait on memory about as often as they compute, and leave the other
    part's memory traffic no gaps to overlap; HFuse's compute-bound kernels keep 90% of the
    issue slots busy)."""
    if part.arithmetic_s >= SPARE_ARITHMETIC * part.memory_s:
        return part.memory_s
    return max(part.memory_s, part.arithmetic_s)


def resident_threads(part: PartShape, blocks_per_sm: int, profile: DeviceProfile) -> float:
    """A part's threads resident per multiprocessor on average, at ``blocks_per_sm``."""
    return min(part.blocks / profile.sm_count, blocks_per_sm) * part.threads


def alone_s(part: PartShape, profile: DeviceProfile) -> float:
    """A part's time alone, at the occupancy its own launch has."""
    per_sm = resident_blocks(part.threads, part.registers, part.shared_bytes, profile)
    return part_time(part, resident_threads(part, per_sm, profile))


def capped_registers(threads: int, least_blocks: int, profile: DeviceProfile) -> int:
    """Registers per thread the compiler keeps to when asked for ``least_blocks`` blocks of
    ``threads`` per multiprocessor (``__launch_bounds__``; HFuse's r0)."""
    per_thread = profile.registers_per_sm // (least_blocks * threads)
    return max(REGISTER_GRANULE, per_thread // REGISTER_GRANULE * REGISTER_GRANULE)


def predict(parts: Sequence[PartShape], profile: DeviceProfile, least_blocks: int = 0,
            ideal: bool = False) -> SideBySidePrediction:
    """The three ways of running ``parts`` (no path between them), predicted. ``ideal``:
    side by side at the best any split could reach (the fused block keeps every part as
    busy as it is alone): a bound, for screening pairs before their candidates are written."""
    launch = profile.launch_overhead_s
    alone = [alone_s(part, profile) for part in parts]
    # a launch's overhead overlaps the kernel before it (back to back, or replayed in a CUDA
    # graph): one kernel fewer saves no device time, and side by side pays only by overlap
    sequential = max(sum(alone) + launch, CALL_FLOOR_S)
    shapes = [KernelShape(p.name, p.blocks, p.threads, p.registers, p.shared_bytes, t)
              for p, t in zip(parts, alone, strict=True)]
    streams = max(decide(shapes, profile).multi_s + launch, CALL_FLOOR_S)
    threads = sum(part.threads for part in parts)
    registers = max(part.registers for part in parts)
    if least_blocks:
        registers = min(registers, capped_registers(threads, least_blocks, profile))
    shared = sum(part.shared_bytes for part in parts)
    per_sm = resident_blocks(threads, registers, shared, profile)
    resident = [resident_threads(part, per_sm, profile) for part in parts]
    if ideal:  # as many of each part's threads resident as it has alone
        resident = [resident_threads(part, resident_blocks(
            part.threads, part.registers, part.shared_bytes, profile), profile)
            for part in parts]
    efficiency = side_by_side_efficiency(parts)
    own = [part_time(part, threads_of, efficiency)
           for part, threads_of in zip(parts, resident, strict=True)]
    in_flight = sum(r * p.bytes_in_flight for r, p in zip(resident, parts, strict=True))
    shared_memory = sum(dram_held_s(p) for p in parts) / max(
        1e-3, min(1.0, in_flight / BYTES_IN_FLIGHT_PER_SM)) / efficiency
    shared_arithmetic = sum(p.arithmetic_s for p in parts) / max(
        1e-3, min(1.0, sum(resident) / ARITHMETIC_SATURATING_THREADS))
    fused = max(max(shared_memory, shared_arithmetic, *own) + launch, CALL_FLOOR_S)
    bounds = " and ".join(f"'{p.name}' {p.bound}-bound ({t * 1e6:.1f} us alone)"
                          for p, t in zip(parts, alone, strict=True))
    split = "/".join(str(part.threads) for part in parts)
    cap = f" {registers} registers," if least_blocks else ""
    reason = (f"{bounds}: predicted {fused * 1e6:.1f} us side by side ({split} threads,"
              f"{cap} {per_sm} blocks per SM) against {sequential * 1e6:.1f} us one after "
              f"another and {streams * 1e6:.1f} us on two streams")
    return SideBySidePrediction(sequential, streams, fused,
                                tuple(part.threads for part in parts), least_blocks, reason)


__all__ = ["PartShape", "SideBySidePrediction", "alone_s", "capped_registers", "dram_held_s",
           "part_time", "side_by_side_efficiency",
           "predict", "resident_blocks", "resident_threads"]
