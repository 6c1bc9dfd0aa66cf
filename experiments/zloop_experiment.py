"""3-D fused kernels whose blocks walk consecutive plane chunks (GPU experiment, issue 3).

Nsight Compute finds the fused diffusion3d kernel 81% L2-busy: each block loads its input
planes again for the halo that the next chunk along z shares. Here the generated kernel's
grid-stride loop over plane chunks is patched into a loop over *consecutive* chunks, and
the kernel is launched with fewer blocks along z, so a block's next chunk may find the
shared halo planes still in L1. Each patched result is checked against the unpatched one.

Usage on the device machine: PYTHONPATH=. python3 experiments/zloop_experiment.py [app ...]
(Z_BLOCKS=32,16,8,4 blocks along z)
"""

from __future__ import annotations

import os
import re
import sys

from patched_kernels import FusedApp, copy_bandwidth

LOOP = re.compile(r"for \(int iz = \(blockIdx\.z\) \* (\d+); iz < (\w+);\n\s*"
                  r"iz \+= gridDim\.z \* \d+\) \{\n")


def contiguous(source: str) -> str:
    """``source`` with each block walking consecutive chunks of planes."""
    match = LOOP.search(source)
    rows, depth = match.group(1), match.group(2)
    span = f"((({depth} + {rows} * gridDim.z - 1) / ({rows} * gridDim.z)) * {rows})"
    loop = (f"for (int iz = blockIdx.z * {span}; iz < {depth} && "
            f"iz < (blockIdx.z + 1) * {span}; iz += {rows}) {{\n")
    return source[:match.start()] + loop + source[match.end():]


def threads_along_z(source: str, block_y: int, block_z: int) -> str:
    """``source`` for blocks of several threads along z (each a register tile of planes) and
    ``block_y`` along y: a block covers more planes for the same halo."""
    match = LOOP.search(source)
    rows, depth = match.group(1), match.group(2)
    loop = (f"for (int iz = (blockIdx.z * {block_z} + threadIdx.z) * {rows}; iz < {depth};\n"
            f"         iz += gridDim.z * {block_z} * {rows}) {{\n")
    source = source[:match.start()] + loop + source[match.end():]
    return source.replace("__launch_bounds__(128)", f"__launch_bounds__({32 * block_y * block_z})")


def main(names: list[str]) -> None:
    bandwidth = copy_bandwidth()
    z_blocks = [int(v) for v in os.environ.get("Z_BLOCKS", "32,16,8,4").split(",")]
    for name in names or ["diffusion3d"]:
        app = FusedApp.prepare(name, bandwidth)
        (spec,) = app.program.launches
        grid = spec.grid_size(app.executable.bound.sizes)
        app.time_patched(f"generated          {grid[2]:3d} blocks along z", app.executable, grid)
        runner = app.with_source(contiguous(app.program.source))
        for blocks in [grid[2], *z_blocks]:
            app.time_patched(f"consecutive chunks {blocks:3d} blocks along z", runner,
                             (grid[0], grid[1], blocks))
        for block_y, block_z in ((2, 2), (4, 2), (1, 4), (2, 4), (1, 8)):
            runner = app.with_source(threads_along_z(app.program.source, block_y, block_z))
            y_blocks = -(-grid[1] * spec.block[1] // block_y)
            z_count = -(-grid[2] // block_z)
            app.time_patched(f"blocks of 32 x {block_y} x {block_z} threads    ", runner,
                             (grid[0], y_blocks, z_count), block=(32, block_y, block_z))


if __name__ == "__main__":
    main(sys.argv[1:])
