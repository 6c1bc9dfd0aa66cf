"""Register tiles: the interior test per warp against per thread (GPU experiment, timing only).

The 2-D register-tile kernels take aligned vectors for a tile's rows where every column the
tile reads is inside the image, and the scalar path with boundary modes otherwise. With the
test made per thread, the warp holding a thread at the image's left or right edge ran both
paths one after the other; the generator now makes the test per warp (``warp_ix``). Here
the planned program is timed against the same program with the test per thread (and each
with its grid-stride loops run once) in alternating rounds beside torch.compile, after
checking that the outputs agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/edge_test_experiment.py [app ...] [--rounds 3] [--runs 30]
        [--size 16384]
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace

from kfuse.bench.experiment import device_case, planned_run, run_checked
from kfuse.bench.timing import alternating_main, print_rounds, time_alternating
from kfuse.codegen import generate
from kfuse.runtime import get_backend
from scripts.grid_loop_experiment import once

SIZE = None  # --size N: square images of N (else the benchmark size)


def per_thread(source: str) -> str:
    """``source`` with the register tiles' interior test made per thread again."""
    source = re.sub(r"warp_ix >= (\d+)", r"ix >= \1", source)
    return re.sub(r"warp_ix_last \+ (\d+) <=", r"ix + \1 <=", source)


def compare(name: str, rounds: int, runs: int) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name, size=(SIZE, SIZE) if SIZE else None)
    backend = get_backend("cuda")
    program = generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes)
    _, expected = planned_run(case, backend)
    sources = {"warp test": program.source, "thread test": per_thread(program.source)}
    sources |= {f"{label}, loops once": once(text)[0] for label, text in sources.items()}
    labels = {"compile": compiled_on(case.graph, case.given)}
    for label, text in sources.items():
        executable, error, registers = run_checked(
            backend, case, replace(program, source=text), expected)
        print(f"{name} {label}: error {error:.1e}, registers {registers}", flush=True)
        if error < 1e-6:
            labels[label] = executable.launch_all
    print_rounds(name, time_alternating(labels, rounds, repeat=runs), "compile")


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
