"""Constant-mode borders: reads outside the array loaded unconditionally, then selected
(GPU experiment, alternating rounds beside torch.compile; every form checked against the
planned program).

A constant-mode read whose point may be outside the array was emitted as
``(inside) ? u0[clamped] : 0.5f``: the load inside the conditional is a branch per tap
(646 branches in diffusion3d's tiled kernel), which keeps the compiler from issuing a tile's
loads together. The index is clamped inside the array, so the load is safe whatever the flag:
the generator now loads unconditionally and selects. The old form is rebuilt here from the
new source (each selected load put back inside its conditional).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/constant_mode_experiment.py [app ...] [--rounds 5]
        [--runs 30]
"""

from __future__ import annotations

import re
from dataclasses import replace

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.bench.timing import alternating_main
from kfuse.codegen import generate

PLAIN_LOAD = re.compile(r"const \w+ (ld_\w+) = (\w+\[[^;]*\]);")
SELECTED = re.compile(r"\) \? (ld_\w+) : ")
BORDER = ("constant", 0.5)


def loads_in_conditionals(program):
    """``program`` with every selected plain load back inside its conditional (the old
    form; the unconditional load, now unused, is left for the compiler to drop)."""
    loads: dict[str, str] = {}  # name -> its latest definition above (names repeat per scope)
    lines, count = [], 0
    for line in program.source.splitlines():
        line, found = SELECTED.subn(
            lambda match: f") ? {loads.get(match.group(1), match.group(1))} : ", line)
        count += found
        for name, text in PLAIN_LOAD.findall(line):
            loads[name] = text
        lines.append(line)
    print(f"{program.name}: {count} selects", flush=True)
    return replace(program, source="\n".join(lines))


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name, boundary=BORDER)
    programs = {"planned (tiles)": planned_program(case)}
    if name == "diffusion3d":
        programs["marching"] = generate(case.graph, case.plan.kernel_groups,
                                        fixed_sizes=case.sizes, march=True)
    for label, program in list(programs.items()):
        programs[f"{label}, loads in conditionals"] = loads_in_conditionals(program)
    time_sources(case, programs, rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare,
                     ("diffusion3d", "harris", "sobel", "unsharp", "shi_tomasi", "enhance"))
