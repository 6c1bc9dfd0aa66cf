"""Programs compiled for aligned arrays against programs that test their pointers (issue 5).

Session 15 found that the planned plain-map kernel tested every pointer's alignment on the
device before its straight pass, and that with the test replaced by ``true`` MADD and WAXPBY
ran 0.2-0.3% faster on an H200. Since session 16 the runtime compiles programs for aligned
arrays where every array is (``KF_ARRAYS_ALIGNED``; what CuPy allocates). Here the planned
program as the cuda backend builds it is timed beside the same plan generated with
``array_alignment=1`` (the pointer tests kept) and torch.compile, in alternating rounds, each
checked against the planned program.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/aligned_map_experiment.py [madd waxpby vadd] [--rounds 7]
"""

from __future__ import annotations

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.bench.timing import alternating_main
from kfuse.codegen import generate


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    tested = generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes)
    time_sources(case, {"compiled for aligned arrays": planned_program(case),
                        "pointers tested": tested}, rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare, ("madd", "waxpby", "vadd"), rounds=7)
