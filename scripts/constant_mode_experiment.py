"""Constant-mode borders: reads outside the array loaded unconditionally, then selected
(GPU experiment, alternating rounds beside torch.compile; every form checked against the
planned program).

A constant-mode read whose point may be outside the array was emitted as
``(inside) ? u0[clamped] : 0.5f``: the load inside the conditional is a branch per tap
(646 branches in diffusion3d's tiled kernel), which keeps the compiler from issuing a tile's
loads together. The index is clamped inside the array, so the load is safe whatever the flag:
the generator now loads unconditionally and selects. The old form is generated with
``cexpr.UNCONDITIONAL_BORDER_LOADS = False``.

Usage on the device machine (repo root)::

    [TILES=8x2x4,4x2x4] PYTHONPATH=. python3 scripts/constant_mode_experiment.py [app ...]
        [--rounds 5] [--runs 30]

``TILES``: also each group with these register tiles (both forms).
"""

from __future__ import annotations

import os

from kfuse.bench.experiment import device_case, time_sources
from kfuse.bench.timing import alternating_main
from kfuse.codegen import cexpr, generate

BORDER = ("constant", 0.5)


def forms(case, march: bool = False, tile: tuple[int, ...] | None = None) -> tuple:
    """(new, old) programs of ``case``'s plan (its groups with register tile ``tile`` where
    given): constant-mode loads unconditional, and inside their conditionals
    (``cexpr.UNCONDITIONAL_BORDER_LOADS``)."""
    groups = [(*group[:3], tile or group[3]) for group in case.plan.kernel_groups]
    made = []
    for unconditional in (True, False):
        cexpr.UNCONDITIONAL_BORDER_LOADS = unconditional
        made.append(generate(case.graph, groups, fixed_sizes=case.sizes, march=march))
    cexpr.UNCONDITIONAL_BORDER_LOADS = True
    return tuple(made)


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name, boundary=BORDER)
    programs = dict(zip(("planned (tiles)", "planned, loads in conditionals"), forms(case),
                        strict=True))
    if name == "diffusion3d":
        programs |= dict(zip(("marching", "marching, loads in conditionals"),
                             forms(case, march=True), strict=True))
    for text in filter(None, os.environ.get("TILES", "").split(",")):
        tile = tuple(int(v) for v in text.split("x"))
        programs |= dict(zip((f"tile {text}", f"tile {text}, loads in conditionals"),
                             forms(case, tile=tile), strict=True))
    time_sources(case, programs, rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare,
                     ("diffusion3d", "harris", "sobel", "unsharp", "shi_tomasi", "enhance"))
