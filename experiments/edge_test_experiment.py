"""Register tiles: the interior test per warp against per thread (GPU experiment, timing only).

The 2-D register-tile kernels take aligned vectors for a tile's rows where every column the
tile reads is inside the image, and the scalar path with boundary modes otherwise. With the
test made per thread, the warp holding a thread at the image's left or right edge ran both
paths one after the other; the generator now makes the test per warp (``warp_ix``). Here
the planned program is timed against the same program with the test per thread (and each
with its grid-stride loops run once) in alternating rounds beside torch.compile, after
checking that the outputs agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/edge_test_experiment.py [app ...] [--rounds 3] [--runs 30]
        [--size 16384]
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace

from scripts.grid_loop_experiment import once

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.cli.arguments import alternating_main

SIZE = None  # --size N: square images of N (else the benchmark size)


def per_thread(source: str) -> str:
    """``source`` with the register tiles' interior test made per thread again."""
    source = re.sub(r"warp_ix >= (\d+)", r"ix >= \1", source)
    return re.sub(r"warp_ix_last \+ (\d+) <=", r"ix + \1 <=", source)


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name, size=(SIZE, SIZE) if SIZE else None)
    program = planned_program(case)
    sources = {"warp test": program.source, "thread test": per_thread(program.source)}
    sources |= {f"{label}, loops once": once(text)[0] for label, text in sources.items()}
    time_sources(case, {label: replace(program, source=text) for label, text in sources.items()},
                 rounds, runs)


def main() -> None:
    global SIZE
    if "--size" in sys.argv:
        at = sys.argv.index("--size")
        SIZE = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    alternating_main(__doc__.splitlines()[0], compare,
                     ["shi_tomasi", "harris", "sobel", "unsharp", "enhance"])


if __name__ == "__main__":
    main()
