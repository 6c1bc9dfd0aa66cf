"""3-D fused kernels whose blocks walk consecutive plane chunks (GPU experiment, issue 3).

Nsight Compute finds the fused diffusion3d kernel 81% L2-busy: each block loads its input
planes again for the halo that the next chunk along z shares. Here the generated kernel's
grid-stride loop over plane chunks is patched into a loop over *consecutive* chunks, and
the kernel is launched with fewer blocks along z, so a block's next chunk may find the
shared halo planes still in L1. Each patched result is checked against the unpatched one.

Usage on the device machine: PYTHONPATH=. python3 scripts/zloop_experiment.py [app ...]
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


if __name__ == "__main__":
    main(sys.argv[1:])
