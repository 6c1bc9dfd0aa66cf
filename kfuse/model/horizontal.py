"""When kernels side by side in one block pay (horizontal fusion; Li et al. 2022, HFuse).

HFuse profiles every split; it explains its gains by the parts' bottlenecks and occupancy
(§IV of the paper, ``shared/notes/hfuse-horizontal-fusion.md``): a memory-bound kernel
beside an arithmetic-bound one overlaps its memory stalls with the other's arithmetic, and
two kernels that each leave the GPU partly idle fill it together. This model predicts the
three ways of running independent kernels from the same facts, with the device profile:

- each part alone: its DRAM time and its arithmetic time at the device's rates, the larger
  of the two, stretched where its grid holds fewer threads than keep the device busy
  (:func:`busy_fraction`);
- one after another: the sum; on two streams: the wave model (:mod:`kfuse.model.waves`);
- side by side: the parts share the DRAM and the arithmetic units, so the fused kernel takes
  at least the sum of their DRAM times and the sum of their arithmetic times, stretched by
  the fused grid's busy fraction; and each part takes at least its own time at the threads
  the fused kernel keeps resident for it (fewer where the fused block's registers or size
  allow fewer blocks than the part had alone: the occupancy HFuse's register cap restores).
  Where the grids differ, the part with the larger grid runs its extra blocks alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.model.device import DeviceProfile
from kfuse.model.occupancy import blocks_per_multiprocessor
from kfuse.model.waves import KernelShape, decide

# resident threads per multiprocessor that keep a kernel's memory traffic or arithmetic
# going at the device's rate (half of the 2048 an H100 / H200 holds; more hide no more)
SATURATING_THREADS_PER_SM = 1024
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


def busy_fraction(threads_per_sm: float) -> float:
    """The share of the device's rate a kernel reaches with this many threads resident per
    multiprocessor on average (1 from :data:`SATURATING_THREADS_PER_SM` on)."""
    return max(1e-3, min(1.0, threads_per_sm / SATURATING_THREADS_PER_SM))


def alone_s(part: PartShape, profile: DeviceProfile) -> float:
    """A part's time alone: its bottleneck at the share of the device its grid keeps busy."""
    per_sm = resident_blocks(part.threads, part.registers, part.shared_bytes, profile)
    resident = min(part.blocks / profile.sm_count, per_sm) * part.threads
    return max(part.memory_s, part.arithmetic_s) / busy_fraction(resident)


def capped_registers(threads: int, least_blocks: int, profile: DeviceProfile) -> int:
    """Registers per thread the compiler keeps to when asked for ``least_blocks`` blocks of
    ``threads`` per multiprocessor (``__launch_bounds__``; HFuse's r0)."""
    per_thread = profile.registers_per_sm // (least_blocks * threads)
    return max(REGISTER_GRANULE, per_thread // REGISTER_GRANULE * REGISTER_GRANULE)


def predict(parts: Sequence[PartShape], profile: DeviceProfile, least_blocks: int = 0,
            spilled: bool = False) -> SideBySidePrediction:
    """The three ways of running ``parts`` (no path between them), predicted. ``spilled``:
    the register cap makes a part spill (its time is then not trusted: predicted as apart)."""
    launch = profile.launch_overhead_s
    alone = [alone_s(part, profile) for part in parts]
    sequential = sum(alone) + launch * len(parts)
    shapes = [KernelShape(p.name, p.blocks, p.threads, p.registers, p.shared_bytes, t + launch)
              for p, t in zip(parts, alone, strict=True)]
    streams = decide(shapes, profile).multi_s
    threads = sum(part.threads for part in parts)
    registers = max(part.registers for part in parts)
    if least_blocks:
        registers = min(registers, capped_registers(threads, least_blocks, profile))
    shared = sum(part.shared_bytes for part in parts)
    per_sm = resident_blocks(threads, registers, shared, profile)
    blocks = max(part.blocks for part in parts)
    fused_busy = busy_fraction(min(blocks / profile.sm_count, per_sm) * threads)
    together = max(sum(p.memory_s for p in parts), sum(p.arithmetic_s for p in parts))
    own = []
    for part in parts:  # each at the threads the fused kernel keeps resident for it
        resident = min(part.blocks / profile.sm_count, per_sm) * part.threads
        own.append(max(part.memory_s, part.arithmetic_s) / busy_fraction(resident))
    fused = max(together / fused_busy, *own) + launch
    if spilled:
        fused = max(fused, sequential)
    bounds = " and ".join(f"'{p.name}' {p.bound}-bound ({t * 1e6:.1f} us alone)"
                          for p, t in zip(parts, alone, strict=True))
    split = "/".join(str(part.threads) for part in parts)
    cap = f" {registers} registers," if least_blocks else ""
    reason = (f"{bounds}: predicted {fused * 1e6:.1f} us side by side ({split} threads,"
              f"{cap} {per_sm} blocks per SM) against {sequential * 1e6:.1f} us one after "
              f"another and {streams * 1e6:.1f} us on two streams")
    return SideBySidePrediction(sequential, streams, fused,
                                tuple(part.threads for part in parts), least_blocks, reason)


__all__ = ["PartShape", "SideBySidePrediction", "alone_s", "busy_fraction",
           "capped_registers", "predict", "resident_blocks"]
