"""What code generation produces: CUDA C source plus how to launch each kernel in it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

from kfuse.errors import LaunchError

GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class KernelParam:
    """One argument of a generated kernel.

    ``role`` is ``input`` or ``output`` (a buffer pointer), ``size`` (an int size symbol)
    or ``param`` (a runtime scalar); ``ref`` names the buffer, symbol or parameter.
    """

    name: str
    ctype: str
    role: str
    ref: str
    dtype: str = "int32"


@dataclass(frozen=True)
class KernelSource:
    """One generated kernel in parts: the lines written before it (helpers, the comment
    that describes it), its launch bounds, symbol and parameters, and its body's lines
    (indented one level). Compiling sizes in and reversing the block order change these
    parts (:mod:`kfuse.codegen.specialise`, :mod:`kfuse.codegen.block_order`);
    :meth:`lines` writes the kernel."""

    preamble: tuple[str, ...]
    symbol: str
    bounds: str  # __launch_bounds__: threads per block[, least resident blocks]
    params: tuple[KernelParam, ...]
    body: tuple[str, ...]

    def header(self) -> str:
        parameters = ", ".join(f"{param.ctype} {param.name}" for param in self.params)
        return f"KF_KERNEL void __launch_bounds__({self.bounds}) {self.symbol}({parameters})"

    def lines(self) -> list[str]:
        return [*self.preamble, self.header(), "{", *self.body, "}"]


def launch_bounds(threads: int, least_blocks: int = 0) -> str:
    """The ``__launch_bounds__`` arguments: threads per block, and the fewest blocks each
    multiprocessor must hold (0: none asked)."""
    return f"{threads}, {least_blocks}" if least_blocks else str(threads)


@dataclass(frozen=True)
class GridAxis:
    """Blocks along one grid axis: ceil(product of ``symbols`` / ``per_block``), at most ``cap``.

    ``covering``: the kernel takes the unit of its block index without a grid-stride loop
    (measured faster: docs/journal/benchmarks.md, session 10), so every block must be launched; a
    size that would need more than ``cap`` blocks is refused rather than computed in part.
    """

    symbols: tuple[str, ...] = ()
    per_block: int = 1
    cap: int = GRID_LIMITS[0]
    covering: bool = False
    # > 0: the kernel divides the extent among the axis's blocks itself (chunks of
    # ceil(extent / blocks)); where the launcher knows how many blocks the device holds at
    # once, the axis takes as many as fill that one wave beside the other axes' blocks, with
    # chunks of at least this many items (fewer, longer chunks: kfuse.codegen.marching)
    least_per_block: int = 0
    # > 0: exactly this many blocks, whatever the sizes (a user kernel's grid-stride loop)
    fixed_blocks: int = 0

    def extent(self, sizes: Mapping[str, int]) -> int:
        """Items along the axis (the product of its symbols' sizes)."""
        return prod(sizes[s] for s in self.symbols) if self.symbols else 1

    def blocks(self, sizes: Mapping[str, int]) -> int:
        if self.fixed_blocks:
            return self.fixed_blocks
        extent = self.extent(sizes)
        needed = -(-extent // self.per_block)
        if self.covering and needed > self.cap:
            raise LaunchError(f"{extent} points along {'*'.join(self.symbols)} need {needed} "
                              f"blocks of {self.per_block}; a grid axis holds at most "
                              f"{self.cap}")
        return max(1, min(self.cap, needed))

    def wave_blocks(self, sizes: Mapping[str, int], others: int, resident: int) -> int:
        """Blocks along a chunked axis (``least_per_block``) when ``resident`` blocks fit the
        device at once and the other axes launch ``others``."""
        most = -(-self.extent(sizes) // self.least_per_block)
        return max(1, min(self.cap, most, resident // others))


@dataclass(frozen=True)
class LaunchSpec:
    """One generated kernel: its C name, the IR operators it computes and its launch shape.

    ``initial_values`` lists outputs that must hold a value before the launch (reductions
    combine into them with atomics). ``size_limits``: (size symbol, largest value) pairs the
    kernel can run at (a block holding whole rows in registers holds so many columns); a
    launch at a larger size is refused. ``blocks_walk``: each block walks its share of the
    data in a loop of its own (whole columns, persistent grids, marching planes), so the
    order of the block numbers is not the order in time (:mod:`kfuse.codegen.block_order`).
    """

    symbol: str
    operators: tuple[str, ...]
    params: tuple[KernelParam, ...]
    block: tuple[int, int, int]
    grid: tuple[GridAxis, GridAxis, GridAxis]
    initial_values: tuple[tuple[str, float | int], ...] = ()
    dynamic_shared_bytes: int = 0
    size_limits: tuple[tuple[str, int], ...] = ()
    blocks_walk: bool = False
    # kernels side by side in one block (kfuse.codegen.horizontal): each part's grid; the
    # launch is 1-D, as many blocks as the largest part has, and each part's block counts
    # per axis are passed as parameters of role "blocks" (ref "part.axis")
    part_grids: tuple[tuple[GridAxis, GridAxis, GridAxis], ...] = ()

    def part_blocks(self, sizes: Mapping[str, int]) -> tuple[tuple[int, int, int], ...]:
        """Blocks per axis of each part's grid (side-by-side kernels)."""
        return tuple(tuple(axis.blocks(sizes) for axis in grid)  # type: ignore[misc]
                     for grid in self.part_grids)

    @property
    def fills_wave(self) -> bool:
        """Whether an axis takes its block count from the device's resident blocks."""
        return any(axis.least_per_block for axis in self.grid)

    def grid_size(self, sizes: Mapping[str, int], resident: int | None = None
                  ) -> tuple[int, int, int]:
        """Blocks per grid axis; ``resident``: how many blocks of this kernel the device
        holds at once (chunked axes fill one wave), None where not known."""
        for symbol, largest in self.size_limits:
            if sizes[symbol] > largest:
                raise LaunchError(f"kernel '{self.symbol}' ({', '.join(self.operators)}) runs "
                                  f"at {symbol} <= {largest}, not {sizes[symbol]}: its variant "
                                  "holds that many columns per row (plan it for these sizes, "
                                  "or name a variant with more threads or accesses per row)")
        if self.part_grids:
            largest = max(prod(blocks) for blocks in self.part_blocks(sizes))
            if largest > GRID_LIMITS[0]:
                raise LaunchError(f"kernel '{self.symbol}' needs {largest} blocks; a grid "
                                  f"axis holds at most {GRID_LIMITS[0]}")
            return (largest, 1, 1)
        blocks = [axis.blocks(sizes) for axis in self.grid]
        for index, axis in enumerate(self.grid):
            if axis.least_per_block and resident:
                others = prod(blocks) // blocks[index]
                blocks[index] = axis.wave_blocks(sizes, others, resident)
        return tuple(blocks)  # type: ignore[return-value]


@dataclass(frozen=True)
class Program:
    """Generated source of a whole pipeline and its launches, in execution order."""

    name: str
    source: str
    launches: tuple[LaunchSpec, ...]
    wide_index: bool = False
    # (size symbol, size) pairs the kernels were compiled for; None: any sizes
    fixed_sizes: tuple[tuple[str, int], ...] | None = None
    # bytes every array's address is compiled in as a multiple of (1: any address; the
    # runtime refuses to launch the program on arrays that are not)
    array_alignment: int = 1
    # per launch: why its kernel visits its blocks last-first ("": first-to-last;
    # kfuse.codegen.block_order)
    last_first: tuple[str, ...] = ()
