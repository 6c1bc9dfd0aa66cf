"""Constant-mode borders: reads outside the array loaded unconditionally, then selected
(GPU experiment, alternating rounds beside torch.compile; every form checked against the
planned program).

A constant-mode read whose point may be outside the array was emitted as
``(inside) ? u0[clamped] : 0.5f``: the load inside the conditional is a branch per tap
(646 branches in diffusion3d's tiled kernel), which keeps the compiler from issuing a tile's
loads together. The index is clamped inside the array, so the load is safe whatever the flag:
the generator now loads unconditionally and selects. The old form is generated with
the switch ``unconditional_border_loads=False`` of ``kfuse.config``.

Usage on the device machine (repo root)::

    [TILES=8x2x4,4x2x4] [BOUNDARY=mirror] PYTHONPATH=. python3
        experiments/constant_mode_experiment.py [app ...] [--rounds 5] [--runs 30]

``TILES``: also each group with these register tiles (both forms); ``BOUNDARY``: the mode of
every read (default ``constant:0.5``; other modes have one form).
"""

from __future__ import annotations

import os

from kfuse.bench.experiment import device_case, time_sources
from kfuse.cli.arguments import alternating_main
from kfuse.codegen import generate
from kfuse.config import configured


def border() -> object:
    """The boundary mode of every read: ``BOUNDARY=constant:V`` (default 0.5) or a mode."""
    text = os.environ.get("BOUNDARY", "constant:0.5")
    mode, _, value = text.partition(":")
    return (mode, float(value)) if mode == "constant" else mode


def forms(case, march: bool = False, tile: tuple[int, ...] | None = None) -> tuple:
    """(new, old) programs of ``case``'s plan (its groups with register tile ``tile`` where
    given): constant-mode loads unconditional, and inside their conditionals
    (``unconditional_border_loads`` of ``kfuse.config``)."""
    groups = [group.with_tile(tile) if tile else group for group in case.plan.kernel_groups]
    made = []
    for unconditional in (True, False):
        with configured(unconditional_border_loads=unconditional):
            made.append(generate(case.graph, groups, fixed_sizes=case.sizes, march=march))
    return tuple(made)


def labelled(label: str, made: tuple) -> dict:
    """Both forms by label (one where they are the same source: no constant-mode reads)."""
    new, old = made
    return {label: new} if new.source == old.source else {
        label: new, f"{label}, loads in conditionals": old}


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name, boundary=border())
    print(f"{name} {border()}: planned tiles {[g.tile for g in case.plan.groups]}", flush=True)
    programs = labelled("planned (tiles)", forms(case))
    if name == "diffusion3d":
        programs |= labelled("marching", forms(case, march=True))
    for text in filter(None, os.environ.get("TILES", "").split(",")):
        programs |= labelled(f"tile {text}", forms(case, tile=tuple(int(v) for v in
                                                                   text.split("x"))))
    time_sources(case, programs, rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare,
                     ("diffusion3d", "harris", "sobel", "unsharp", "shi_tomasi", "enhance"))
