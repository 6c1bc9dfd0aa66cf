"""Fused 2-D register-tile kernels with their next tiles' inputs bulk-prefetched into L2 (GPU).

An experiment for issue 3, not part of kfuse: the generated fused kernel of each app is
patched so that, at the start of each of its tiles, a block asks the copy engine
(``cp.async.bulk.prefetch.L2``, sm_90) for the input rows of the tile it will compute
``DISTANCE`` tiles later (halo included), and launched with fewer blocks along the rows so
that each block walks several tiles. The question: does DRAM stay busier while the warps
compute (Harris and Shi-Tomasi stop at 1.46-1.53x the floor while their loads are idle
during the arithmetic)? Each patched result is checked against the unpatched one.

Usage on the device machine: PYTHONPATH=. python3 experiments/prefetch_experiment.py [app ...]
(ROWS_OF_BLOCKS=8,16,32,64 blocks along the rows; DISTANCES=0,1,2 tiles ahead, 0: none)
"""

from __future__ import annotations

import os
import re
import sys

from patched_kernels import FusedApp, copy_bandwidth

LOOP = re.compile(r"for \(int iy = \(blockIdx\.y \* blockDim\.y \+ threadIdx\.y\) \* (\d+); "
                  r"iy < (\w+);\n\s*iy \+= gridDim\.y \* blockDim\.y \* \d+\) \{\n")
HALO_ROWS, HALO_COLUMNS = 4, 8  # at least every app's reach; multiples of 4 columns


def patched(source: str, symbol: str, distance: int) -> str:
    """``source`` with the prefetch of the block's tile ``distance`` steps ahead."""
    start = source.index(f" {symbol}(")
    signature = source[start:source.index(")", start)]
    inputs = re.findall(r"const float\* __restrict__ (\w+)", signature)
    width = re.findall(r"const int (n_\w+_1)", signature)[0]
    match = LOOP.search(source, start)
    rows, height = int(match.group(1)), match.group(2)
    columns = re.search(r"const int ix = \(blockIdx\.x \* blockDim\.x \+ threadIdx\.x\) "
                        r"\* (\d+);", source[start:])
    columns = int(columns.group(1)) if columns else 1
    lines = [
        "{  // experiment: bulk-prefetch the input rows of a later tile into L2",
        f"  const int kf_next = iy - threadIdx.y * {rows} + "
        f"{distance} * gridDim.y * blockDim.y * {rows};",
        f"  const int kf_rows = blockDim.y * {rows} + {2 * HALO_ROWS};",
        "  const int kf_tid = threadIdx.y * blockDim.x + threadIdx.x;",
        f"  const int kf_c0 = max((int)(blockIdx.x * blockDim.x * {columns}) - {HALO_COLUMNS}, 0);",
        f"  const int kf_c1 = min((int)((blockIdx.x + 1) * blockDim.x * {columns}) + "
        f"{HALO_COLUMNS}, {width});",
        f"  const int kf_row = kf_next - {HALO_ROWS} + kf_tid;",
        f"  if (kf_tid < kf_rows && kf_row >= 0 && kf_row < {height} && kf_c1 > kf_c0 && "
        f"{width} % 4 == 0) {{",
    ]
    for name in inputs:
        lines.append(f"    asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: "
                     f"\"l\"({name} + (long long)kf_row * {width} + kf_c0), "
                     f"\"r\"((kf_c1 - kf_c0) * 4) : \"memory\");")
    lines += ["  }", "}"]
    at = match.end()
    return source[:at] + "\n".join(lines) + "\n" + source[at:]


def main(names: list[str]) -> None:
    bandwidth = copy_bandwidth()
    block_rows = [int(v) for v in os.environ.get("ROWS_OF_BLOCKS", "8,16,32,64").split(",")]
    distances = [int(v) for v in os.environ.get("DISTANCES", "0,1,2").split(",")]
    for name in names or ["harris", "shi_tomasi", "sobel", "unsharp"]:
        app = FusedApp.prepare(name, bandwidth)
        app.time_generated()
        if len(app.program.launches) != 1:
            print("  (not one kernel: skipped)")
            continue
        (spec,) = app.program.launches
        grid = spec.grid_size(app.executable.bound.sizes)
        for distance in distances:
            try:
                source = patched(app.program.source, spec.symbol, distance) if distance \
                    else app.program.source
            except (AttributeError, IndexError, ValueError) as error:
                print(f"  cannot patch: {error}")
                break
            runner = app.with_source(source)
            for rows_of_blocks in [grid[1], *block_rows]:
                app.time_patched(f"prefetch {distance} ahead, {rows_of_blocks:4d} block rows",
                                 runner, (grid[0], rows_of_blocks, grid[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
