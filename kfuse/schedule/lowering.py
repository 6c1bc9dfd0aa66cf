"""What planning asks of code generation, without importing it.

Two decisions of planning need a group's kernel as it will be written: fusion legality
checks its registers and shared memory on the compiled kernel (Wahib & Maruyama 2014,
constraints 1.6 and 1.7: the register tile of a fused group is the largest that fits), and
a plan explains in which order its kernels visit their blocks. Code generation lives above
planning, so it installs a :class:`Lowering` here when it is imported (as
:mod:`kfuse.driver` installs itself into the DSL); ``import kfuse`` loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kfuse.errors import KfuseError
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import GroupSchedule


@dataclass(frozen=True)
class LoweredKernel:
    """One group's kernel as code generation writes it: the whole source (prelude
    included), the kernel's symbol and the dynamic shared memory its launch asks for."""

    source: str
    symbol: str
    dynamic_shared_bytes: int


@dataclass(frozen=True)
class LaunchShape:
    """One group's kernel launched at given sizes: threads per block, blocks, dynamic
    shared bytes per block, and the kernel itself (for the compiler's figures)."""

    threads: int
    blocks: int
    dynamic_shared_bytes: int
    kernel: LoweredKernel


@dataclass(frozen=True)
class KernelFigures:
    """What the compiler reports of a kernel (ptxas)."""

    registers: int
    shared_bytes: int
    spill_store_bytes: int


class Lowering(Protocol):
    """Code generation as planning sees it."""

    def lower(self, graph: Graph, group: GroupSchedule,
              fixed_sizes: Mapping[str, int] | None) -> LoweredKernel:
        """``group``'s kernel alone, compiled for ``fixed_sizes`` where given."""

    def measures(self) -> bool:
        """Whether :meth:`figures` can compile (a CUDA compiler is at hand)."""

    def measurer(self) -> str | None:
        """What gives :meth:`figures` (the compiler and its version): part of the key a fit
        is stored under, so that another compiler measures again; None where the figures
        come from elsewhere than the compiler (they are not stored)."""

    def figures(self, kernel: LoweredKernel) -> KernelFigures | None:
        """The compiler's figures of ``kernel`` (None: not reported); a
        :class:`~kfuse.errors.CompileError` where it does not compile."""

    def last_first(self, graph: Graph, groups: Sequence[GroupSchedule]) -> tuple[str, ...]:
        """Per kernel of the program ``groups``: why it visits its blocks last-first ("":
        first-to-last)."""

    def launch_shape(self, graph: Graph, group: GroupSchedule, sizes: Mapping[str, int],
                     threads: int | None = None) -> LaunchShape:
        """``group``'s kernel and its launch at ``sizes`` (in blocks of ``threads`` where
        given: a part of kernels side by side; a CompileError where it cannot take them)."""

    def resizes(self, graph: Graph, group: GroupSchedule) -> bool:
        """Whether ``group``'s kernel may take another number of threads per block."""


_installed: list[Lowering] = []


def install_lowering(lowering: Lowering) -> None:
    """Make ``lowering`` the one planning asks (code generation calls this on import)."""
    _installed[:] = [lowering]


def lowering() -> Lowering:
    """The installed :class:`Lowering`."""
    if not _installed:
        raise KfuseError("code generation is not loaded: import kfuse (kfuse.codegen "
                         "installs the lowering planning asks)")
    return _installed[0]
