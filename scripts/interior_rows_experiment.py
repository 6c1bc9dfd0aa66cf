"""Register tiles: a path for tiles whose rows (and planes) are all inside (GPU experiment,
timing only).

In the vector path of a register-tiled kernel every row (and plane) index outside the tile
goes through the boundary mode, so each such row's address is computed at run time, even
where the mapping is the identity. ``kfuse.codegen.kernels.INTERIOR_ROWS`` adds, per
dimensionality, a path for tiles whose rows and planes are all inside: no mapping along
them, every row a constant offset from the tile's first. Here the planned program is timed
against the same program generated with that path on or off (the other setting), in
alternating rounds beside torch.compile, after checking that the outputs agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/interior_rows_experiment.py [app ...] [--rounds 5]
"""

from __future__ import annotations

import kfuse.codegen.kernels as kernels
from kfuse.bench.experiment import device_case, time_sources
from kfuse.bench.timing import alternating_main
from kfuse.codegen import generate


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    ndim = len(case.graph.buffers[case.graph.outputs[0]].shape)
    program = generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes)
    planned = "rows inside path" if kernels.INTERIOR_ROWS[ndim] else "no rows inside path"
    other = "no rows inside path" if kernels.INTERIOR_ROWS[ndim] else "rows inside path"
    kernels.INTERIOR_ROWS[ndim] = not kernels.INTERIOR_ROWS[ndim]
    try:
        toggled = generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes)
    finally:
        kernels.INTERIOR_ROWS[ndim] = not kernels.INTERIOR_ROWS[ndim]
    time_sources(case, program, {f"{planned} (planned)": program.source,
                                 other: toggled.source}, rounds, runs)


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, ["diffusion3d", "shi_tomasi", "harris"],
                     rounds=5)


if __name__ == "__main__":
    main()
