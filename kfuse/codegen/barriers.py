"""Barrier placement in map-reduce kernels: the two rules of Filipovič et al. 2015 (§3.3).

A kernel is a sequence of routines (load, compute, stage, sum, store), each with the shared
elements it reads and writes under a thread-to-data mapping. A ``__syncthreads()`` goes
before a routine that reads what another mapping wrote (B1) or that overwrites storage
accessed since the last barrier (B2); nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.schedule.shared_memory import SharedElement


@dataclass(frozen=True)
class SharedAccess:
    """A routine's read or write of a shared element under one thread-to-data mapping."""

    element: SharedElement
    write: bool
    mapping: str


@dataclass
class Routine:
    """A piece of the kernel (load, compute, stage, sum, store) and its shared accesses."""

    name: str
    lines: list[str]
    accesses: tuple[SharedAccess, ...] = ()
    barrier_inside: bool = False  # ends with its own __syncthreads (block reductions)


def barrier_reason(routine: Routine, since: Sequence[tuple[str, SharedAccess]]) -> str | None:
    """Why ``routine`` needs a ``__syncthreads()`` first, or ``None`` (rules B1 and B2).

    ``since`` holds (routine name, access) of everything since the last barrier.
    B1: the routine reads an element an earlier routine wrote with another mapping.
    B2: the routine writes shared storage overlapping an element accessed since the last
    barrier (another element, or the same one under another mapping).
    """
    for access in routine.accesses:
        for name, earlier in since:
            if (not access.write and earlier.write and earlier.element == access.element
                    and earlier.mapping != access.mapping):
                return (f"B1: reads '{access.element.name}' written by '{name}' with "
                        "another thread-to-data mapping")
            if access.write and earlier.element.overlaps(access.element) and (
                    earlier.element != access.element or earlier.mapping != access.mapping):
                return (f"B2: writes '{access.element.name}' over '{earlier.element.name}', "
                        f"accessed by '{name}' since the last barrier")
    return None


def place_barriers(routines: Sequence[Routine], *, loop: bool = False,
                   entry: Sequence[tuple[str, SharedAccess]] = ()
                   ) -> tuple[list[str], list[tuple[str, SharedAccess]]]:
    """The routines' lines with barriers where B1/B2 ask; and the accesses since the last one.

    ``loop``: the routines are a loop body, so the accesses of one iteration also precede
    the next (the body is checked twice).
    """
    needed: dict[int, str] = {}
    state = list(entry)
    for _ in range(2 if loop else 1):
        for index, routine in enumerate(routines):
            reason = needed.get(index) or barrier_reason(routine, state)
            if reason:
                needed[index] = reason
                state = []
            state += [(routine.name, access) for access in routine.accesses]
            if routine.barrier_inside:
                state = []
    lines: list[str] = []
    for index, routine in enumerate(routines):
        if index in needed:
            lines.append(f"__syncthreads();  // {needed[index]}")
        lines += routine.lines
    return lines, state


__all__ = ["Routine", "SharedAccess", "SharedElement", "barrier_reason", "place_barriers"]
