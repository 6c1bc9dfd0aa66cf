"""The L1 / shared-memory split of the planned kernels (GPU experiment, timing only).

A kernel that uses no shared memory leaves the split of each SM's unified L1 / shared
memory to the driver (``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`` -1, no
preference). The register-tiled stencil kernels live on L1 hits (halo rows and planes read
again by neighbouring threads). Here the planned program's kernels are timed with no
preference, with the largest L1 (carveout 0) and with the largest shared memory (100), in
alternating rounds beside torch.compile.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/carveout_experiment.py [app ...] [--rounds 5] [--runs 30]
"""

from __future__ import annotations

from collections.abc import Callable

from kfuse.bench.experiment import device_case, planned_run
from kfuse.cli.arguments import alternating_main
from kfuse.runtime import get_backend
from kfuse.tune.timing import print_rounds, time_alternating

CARVEOUTS = {"no preference": -1, "largest L1 (0)": 0, "largest shared (100)": 100}


def with_carveout(executable, carveout: int) -> Callable[[], None]:
    """The executable's launch with its kernels' carveout preference set first."""
    def run() -> None:
        for function in executable.functions.values():
            function.preferred_shared_memory_carveout = carveout
        executable.launch_all()
    return run


def compare(name: str, rounds: int, runs: int) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    executable, _ = planned_run(case, get_backend("cuda"))
    labels = {"compile": compiled_on(case.graph, case.given)}
    labels |= {label: with_carveout(executable, value) for label, value in CARVEOUTS.items()}
    print_rounds(name, time_alternating(labels, rounds, repeat=runs), "compile")


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare,
                     ["diffusion3d", "shi_tomasi", "harris", "sobel"], rounds=5)


if __name__ == "__main__":
    main()
