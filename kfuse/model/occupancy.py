"""How many blocks of a kernel a multiprocessor holds at once (the occupancy calculation).

Computed from the compiled kernel's registers and shared memory and the device's limits,
as NVIDIA's occupancy calculator does: registers are allocated per warp in units of 256,
each block also reserves some shared memory for the system.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kfuse.cuda_limits import WARP

REGISTER_UNIT = 256  # registers are allocated to a warp in units of this many
# limits of an H100/H200 multiprocessor, where the device does not report one
DEFAULT_LIMITS = {
    "MaxRegistersPerMultiprocessor": 65536,
    "MaxSharedMemoryPerMultiprocessor": 228 * 1024,
    "MaxThreadsPerMultiProcessor": 2048,
    "MaxBlocksPerMultiprocessor": 32,
    "ReservedSharedMemoryPerBlock": 1024,
}


def blocks_per_multiprocessor(registers: float, threads: int, shared_bytes: int = 0,
                              limits: Mapping[str, int] = DEFAULT_LIMITS) -> int:
    """Blocks of ``threads`` threads using ``registers`` registers per thread (a model's
    estimate may be fractional) and ``shared_bytes`` of shared memory (static and dynamic)
    that one multiprocessor holds; ``limits`` by CUDA's device attribute names, the
    H100/H200's where one is missing."""
    def limit(name: str) -> int:
        return int(limits.get(name, DEFAULT_LIMITS[name]))

    warps = -(-threads // WARP)
    per_warp = math.ceil(max(registers, 1) * WARP / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = limit("MaxRegistersPerMultiprocessor") // (per_warp * warps)
    by_threads = limit("MaxThreadsPerMultiProcessor") // (warps * WARP)
    by_shared = limit("MaxSharedMemoryPerMultiprocessor") // (
        shared_bytes + limit("ReservedSharedMemoryPerBlock"))
    return max(0, min(by_registers, by_threads, by_shared, limit("MaxBlocksPerMultiprocessor")))
