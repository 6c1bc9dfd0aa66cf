"""Register tiles' halo columns from the neighbouring lanes (GPU experiment, timing only).

In the vector path of a register-tiled kernel each row of a thread's tile is one aligned
vector load, and the halo columns left and right of it are separate loads: in 3-D (and
in 2-D at the edges) one scalar load per halo column and row, each of which makes the L1
fetch the same four cache lines per warp as the vector load of the row does. The
neighbouring lane already holds those columns in its own vector of the row. Here the
planned program's vector path is patched so that a halo column comes from that lane
(``__shfl_up_sync`` / ``__shfl_down_sync``), and only the warp's first or last lane loads
it (through the boundary mode, as before). Timed against the planned program, each also
with its grid-stride loops run once, in alternating rounds beside torch.compile, after
checking that the outputs agree. Needs rows of whole warps (the apps' benchmark sizes).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/shuffle_halo_probe.py [app ...] [--rounds 5] [--runs 30]
"""

from __future__ import annotations

import re
from dataclasses import replace

from scripts.grid_loop_experiment import once

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.cli.arguments import alternating_main

VECTOR = re.compile(r"const float4 (\w+) = \*reinterpret_cast<const float4\*>"
                    r"\(&(\w+)\[(.+) \* (n_\w+) \+ ix\]\);")
HALO = re.compile(r"const float (\w+) = (\w+)\[(.+) \* (n_\w+) \+ (ix(?:_[mp]\d+_\w+?)+)\];")
STEP = re.compile(r"_([mp])(\d+)_(?:clamp|mirror|repeat|constant)")


def column_steps(index: str) -> list[int]:
    """The running column offsets of a nested boundary index (``ix_m1_clamp_p1_clamp``:
    -1 then 0)."""
    total, steps = 0, []
    for sign, amount in STEP.findall(index):
        total += int(amount) if sign == "p" else -int(amount)
        steps.append(total)
    return steps


def shuffled(source: str, columns: int = 4) -> tuple[str, int]:
    """``source`` with the vector paths' scalar halo loads taken from the neighbouring
    lanes, and how many were."""
    lines = source.split("\n")
    out, vectors, count, region = [], {}, 0, None
    for line in lines:
        indent = line[:len(line) - len(line.lstrip())]
        if "one aligned vector load or store each" in line:
            region = len(indent) - 2  # the if's indentation
            vectors = {}
        elif region is not None and line.startswith(" " * region + "} else"):
            region = None
        if line.lstrip().startswith("const int ix = ") and "kf_lane" not in source:
            out += [line, indent + "const int kf_lane = threadIdx.x & 31;"]
            continue
        vector, halo = VECTOR.search(line), HALO.search(line)
        if region is not None and vector:
            vectors[(vector.group(2), vector.group(3))] = vector.group(1)
        if region is None or not halo:
            out.append(line)
            continue
        name, buffer, row, width, index = halo.groups()
        steps = column_steps(index)
        if not steps:
            out.append(line)
            continue
        key = (buffer, row)
        if key not in vectors:
            vectors[key] = f"vec_shfl_{len(vectors)}_{name}"
            out.append(f"{indent}const float4 {vectors[key]} = *reinterpret_cast<const "
                       f"float4*>(&{buffer}[{row} * {width} + ix]);")
        vec, column = vectors[key], steps[-1]
        load = f"{buffer}[{row} * {width} + {index}]"
        edge = "kf_lane == 0" if min(steps) < 0 else "kf_lane == 31"
        if 0 <= column < columns:
            value = f"{vec}.{'xyzw'[column]}"
        elif column < 0:
            value = f"__shfl_up_sync(0xffffffffu, {vec}.{'xyzw'[column + columns]}, 1)"
        else:
            value = f"__shfl_down_sync(0xffffffffu, {vec}.{'xyzw'[column - columns]}, 1)"
        out += [f"{indent}const float {name}_lane = {value};",
                f"{indent}const float {name} = {edge} ? {load} : {name}_lane;"]
        count += 1
    return "\n".join(out), count


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    program = planned_program(case)
    patched, count = shuffled(program.source)
    print(f"{name}: {count} halo loads from the neighbouring lanes", flush=True)
    sources = {"planned": program.source, "lanes": patched}
    sources |= {f"{label}, loops once": once(text)[0] for label, text in sources.items()}
    time_sources(case, {label: replace(program, source=text) for label, text in sources.items()},
                 rounds, runs)


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, ["diffusion3d"], rounds=5)


if __name__ == "__main__":
    main()
