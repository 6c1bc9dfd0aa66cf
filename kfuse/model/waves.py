"""The wave model of concurrent kernels (Qiao's Hipacc thesis, Qiao 2021, §4.3: Eqs. 4.1-4.11).

A kernel whose blocks do not fill the device leaves multiprocessors idle; kernels with no
path between them can then run at once, on separate streams joined by events. Whether that
pays is predicted from occupancy and waves:

- ``N_blk`` blocks of a kernel fit one multiprocessor (Eq. 4.1, the occupancy calculation);
  ``waves = ceil(k_blk / (N_blk C_SM))`` (Eq. 4.4);
- a kernel of a full wave or more runs alone; the others are packed, in order, into sets
  that fit the multiprocessors together, each kernel placing ``ceil(k_blk / C_SM)`` blocks
  on each multiprocessor (Eq. 4.2 chained; blocks are dispatched breadth-first);
- one stream: the sum of the kernels' own times (Eq. 4.7); several: per set, the longest
  kernel times ``O_par`` plus one event ``O_event`` per extra stream (Eqs. 4.9-4.11);
- concurrency is chosen where it is predicted faster.

``O_event`` and ``O_par`` are not given numbers in the thesis (ambiguity B1 of
``shared/notes/hipacc-concurrency-borders-reductions.md``); kfuse takes them from the device
profile (:data:`EVENT_OVERHEAD_S` and :data:`CONCURRENCY_SLOWDOWN` where it has none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.cuda_limits import WARP
from kfuse.model.device import DeviceProfile

# O_event: what joining one more stream by events costs the device (nominal; a profile may
# set its own, notes["event_overhead_s"]). The model is the thesis's, of device time: the
# host's own cost of a side stream (about 1.6 us a call with CUDA graphs, 5 us without, on
# an H100's host: docs/journal/benchmarks.md) shows only where calls wait on the host.
EVENT_OVERHEAD_S = 1.0e-6
CONCURRENCY_SLOWDOWN = 1.1  # O_par: kernels sharing the device run this much slower (nominal)
REGISTER_UNIT = 256
MAX_BLOCKS_PER_SM = 32
RESERVED_SHARED_PER_BLOCK = 1024


@dataclass(frozen=True)
class KernelShape:
    """What the wave model needs of one kernel: its blocks, their resources, its time alone."""

    name: str
    blocks: int
    threads: int
    registers: int  # per thread
    shared_bytes: int  # per block, static and dynamic
    solo_s: float

    def block(self) -> tuple[int, int, int, int]:
        """(1, registers, threads, shared bytes) of one block, as the device allocates them
        (registers per warp in units of 256, shared memory with the system's reserve)."""
        warps = -(-self.threads // WARP)
        per_warp = math.ceil(max(self.registers, 1) * WARP / REGISTER_UNIT) * REGISTER_UNIT
        return (1, per_warp * warps, warps * WARP,
                self.shared_bytes + RESERVED_SHARED_PER_BLOCK)

    def demand(self, sm_count: int) -> tuple[int, ...]:
        """(blocks, registers, threads, shared bytes) it places on each multiprocessor
        (Eq. 4.3's blocks dealt breadth-first)."""
        per_sm = -(-self.blocks // sm_count)
        return tuple(per_sm * amount for amount in self.block())


@dataclass(frozen=True)
class Concurrency:
    """The model's answer for a set of kernels with no path between them."""

    kernels: tuple[str, ...]
    concurrent: bool
    single_s: float
    multi_s: float
    reason: str


def _capacity(profile: DeviceProfile) -> tuple[int, int, int, int]:
    return (MAX_BLOCKS_PER_SM, profile.registers_per_sm, profile.max_threads_per_sm,
            profile.shared_memory_per_sm)


def waves(kernel: KernelShape, profile: DeviceProfile) -> float:
    """Eq. 4.4 as a fraction: the kernel's blocks over what the device holds at once."""
    resident = min(available // max(amount, 1)  # Eq. 4.1
                   for available, amount in zip(_capacity(profile), kernel.block(), strict=True))
    return kernel.blocks / max(1, resident * profile.sm_count)


def decide(kernels: Sequence[KernelShape], profile: DeviceProfile,
           event_overhead_s: float | None = None, slowdown: float | None = None
           ) -> Concurrency:
    """Whether ``kernels`` (no path between any two) should run on separate streams."""
    names = tuple(k.name for k in kernels)
    event = EVENT_OVERHEAD_S if event_overhead_s is None else event_overhead_s
    factor = CONCURRENCY_SLOWDOWN if slowdown is None else slowdown
    single = sum(k.solo_s for k in kernels)
    if len(kernels) < 2:
        return Concurrency(names, False, single, single, "one kernel: nothing to overlap")
    capacity = _capacity(profile)
    alone = [k for k in kernels if waves(k, profile) >= 1.0]
    sets: list[list[KernelShape]] = []
    used = [0, 0, 0, 0]
    for kernel in (k for k in kernels if k not in alone):
        need = kernel.demand(profile.sm_count)
        if sets and all(u + n <= c for u, n, c in zip(used, need, capacity, strict=True)):
            sets[-1].append(kernel)
            used = [u + n for u, n in zip(used, need, strict=True)]
        else:
            sets.append([kernel])
            used = list(need)
    multi = sum(k.solo_s for k in alone) + sum(
        max(k.solo_s for k in group) * (factor if len(group) > 1 else 1.0)
        + (len(group) - 1) * event for group in sets)
    together = max((len(group) for group in sets), default=0)
    shape = (f"{len(alone)} fill{'s' if len(alone) == 1 else ''} the device alone; "
             if alone else "") + (
        f"the {len(kernels) - len(alone)} {'others' if alone else 'kernels'} fit "
        f"{len(sets)} wave(s) together "
        f"(up to {together} at once)" if sets else "none fits beside another")
    if multi < single:
        return Concurrency(names, True, single, multi,
                           f"{shape}: predicted {multi * 1e6:.1f} us on separate streams "
                           f"against {single * 1e6:.1f} us on one")
    return Concurrency(names, False, single, multi,
                       f"{shape}: predicted {multi * 1e6:.1f} us on separate streams, not "
                       f"less than {single * 1e6:.1f} us on one")
