"""Exhaustive search: every legal partition, the cheapest one wins (small graphs only).

Legal groups are enumerated once (:func:`~kfuse.search.problem.enumerate_groups`); a
partition is then built by giving the lowest unplaced kernel each legal group it can head,
so every partition is produced exactly once. A branch stops as soon as the groups chosen so
far make the quotient graph cyclic (unplaced kernels count as singletons, and coarsening
the rest later cannot break such a cycle). Refuses problems above ``max_kernels``.
"""

from __future__ import annotations

from kfuse.errors import KfuseError
from kfuse.search.problem import FusionProblem, enumerate_groups

MAX_KERNELS = 12


def exhaustive_search(problem: FusionProblem, seed: int = 0, progress: bool = False,
                      max_kernels: int = MAX_KERNELS, max_partitions: int = 20_000_000
                      ) -> tuple[list[tuple[str, ...]], dict, dict]:
    """The optimal plan by enumerating all legal partitions (``seed`` is unused)."""
    del seed, progress
    bits = problem.bits
    n = bits.n
    if n > max_kernels:
        raise KfuseError(f"exhaustive search enumerates every partition and is limited to "
                         f"{max_kernels} kernels; '{problem.name}' has {n}: use the exact "
                         "or gga strategy")
    candidates, enum_stats = enumerate_groups(problem)
    heads: list[list[int]] = [[] for _ in range(n)]
    for mask in candidates:
        heads[(mask & -mask).bit_length() - 1].append(mask)
    times = {mask: bits.time(mask) for mask in candidates}
    gid = [-1] * n
    groups: list[int] = []
    best: list = [float("inf"), None]
    count = [0]

    def place(unplaced: int, total: float) -> None:
        if not unplaced:
            count[0] += 1
            if count[0] > max_partitions:
                raise KfuseError(f"more than {max_partitions} legal partitions; use the "
                                 "exact strategy")
            if total < best[0]:
                best[0], best[1] = total, list(groups)
            return
        head = (unplaced & -unplaced).bit_length() - 1
        for mask in heads[head]:
            if mask & ~unplaced:
                continue
            if mask & (mask - 1) and not bits.merge_ok(gid, groups, mask):
                continue
            g = len(groups)
            groups.append(mask)
            members = [i for i in range(n) if mask >> i & 1]
            for i in members:
                gid[i] = g
            place(unplaced & ~mask, total + times[mask])
            for i in members:
                gid[i] = -1
            groups.pop()

    place(bits.full, 0.0)
    chosen = best[1]
    stats = dict(enum_stats, partitions=count[0], optimal=True)
    return [bits.members(m) for m in chosen], {}, stats
