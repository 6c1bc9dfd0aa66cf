"""Kernels that follow each other over the same large array visit their blocks in opposite
orders (a serpentine order across the program's kernels).

A kernel that streams an array larger than L2 ends with the lines it touched last still in
L2 (up to 50 MB on an H100 or H200). The GPU starts a kernel's blocks in increasing linear
index, so a next kernel that reads the same array in the same order starts where nothing is
cached. One that visits its blocks last-first starts on what the kernel before it read or
wrote last, and its first blocks read that much from L2 instead of DRAM: SGEMVT's
``w = alpha A x`` after the column sums ``x = beta Aᵀ y + z``, GEMVER's ``w = alpha B x``
after the kernel that wrote ``B`` (docs/journal/benchmarks.md, session 19).

Reversing is renumbering: block ``b`` takes the work of block ``gridDim - 1 - b`` along every
axis, a permutation of the blocks. A reversed kernel's body declares its own ``blockIdx``
(the renumbered index, from ``kf_reversed_block()`` of the prelude) as its first statement,
which every later read of ``blockIdx`` in the body sees instead of CUDA's; the rest of the
body is untouched. A kernel computes the same result in either order (no
kernel kfuse generates depends on which block runs first; blocks of a grid-stride loop keep
their loops and only change partners). Kernels whose blocks walk their data in loops of
their own (whole columns, persistent grids, marching planes: ``LaunchSpec.blocks_walk``)
stay first-to-last, since renumbering their blocks would not change the order of their
accesses in time; the kernel after one of them turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kfuse import config
from kfuse.codegen.kernels import KernelGroup
from kfuse.codegen.program import KernelSource
from kfuse.ir.graph import Graph


@dataclass
class Serpentine:
    """Which kernels of a program visit their blocks last-first, decided kernel by kernel
    in program order (:meth:`place`)."""

    graph: Graph
    # per kernel placed so far: (its symbol, the arrays it touched, whether it ran last-first)
    placed: list[tuple[str, set[str], bool]] = field(default_factory=list)

    def place(self, symbol: str, members: Sequence[str], outputs: Sequence[str],
              blocks_walk: bool) -> str | None:
        """Why the next kernel visits its blocks last-first (None: first-to-last).

        A kernel's main arrays are those of the most axes that it reads. It runs opposite
        to the latest earlier kernel that touched one of them, unless a kernel in between
        touched another array of as many axes (which then fills L2); with no such kernel it
        runs first-to-last, as does a kernel whose blocks walk their data in loops of their
        own (``blocks_walk``: renumbering them would not change the order in time). Sizes are
        not consulted, so the generated source is the same at any size.
        """
        buffers = self.graph.buffers
        reads = set(KernelGroup(self.graph, members, outputs).reads)
        touched = reads | set(outputs)
        rank = max((buffers[b].ndim for b in reads), default=0)
        main = {b for b in reads if buffers[b].ndim == rank}
        reason = None
        for earlier, arrays, last_first in reversed(self.placed):
            if arrays & main:
                if config.current().serpentine_blocks and rank and not blocks_walk and not last_first:
                    shared = "', '".join(sorted(arrays & main))
                    reason = (f"'{earlier}' before it streamed '{shared}' first-to-last, so "
                              "the end of it is in L2")
                break
            if any(buffers[b].ndim >= rank for b in arrays):
                break
        self.placed.append((symbol, touched, reason is not None))
        return reason


def reverse_blocks(kernel: KernelSource, reason: str) -> KernelSource:
    """``kernel`` with its blocks renumbered last-first (``reason``: why, for the comment):
    its body's first statement declares the renumbered ``blockIdx`` that the rest reads."""
    note = f"  // blocks last-first (kfuse.codegen.block_order): {reason}"
    return replace(kernel, body=(note, "  const uint3 blockIdx = kf_reversed_block();",
                                 *kernel.body))
