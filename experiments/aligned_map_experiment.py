"""Programs compiled for aligned arrays against programs that test their pointers (issue 5).

Session 15 found that the planned plain-map kernel tested every pointer's alignment on the
device before its straight pass, and that with the test replaced by ``true`` MADD and WAXPBY
ran 0.2-0.3% faster on an H200. Since session 16 the runtime compiles programs for aligned
arrays where every array is (``KF_ARRAYS_ALIGNED``; what CuPy allocates). Here the planned
program as the cuda backend builds it is timed beside the same plan generated with
``array_alignment=1`` (the pointer tests kept), both on the same buffers, and torch.compile, in
alternating rounds; the two programs' outputs must agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/aligned_map_experiment.py [madd waxpby vadd] [--rounds 7]
"""

from __future__ import annotations

import numpy as np

from kfuse.bench.experiment import device_case, planned_program
from kfuse.cli.arguments import alternating_main
from kfuse.codegen import generate
from kfuse.tune.timing import print_rounds, time_alternating


def compare(name: str, rounds: int, runs: int) -> None:
    """Both programs launched on the very same buffers (where the output lies in memory moves
    a streaming kernel's time by up to 0.6% on an H200), beside torch.compile."""
    from kfuse.bench.torch_baseline import compiled_on
    from kfuse.runtime import get_backend

    case = device_case(name)
    aligned = get_backend("cuda").prepare(case.graph, case.given,
                                          program=planned_program(case))
    tested = get_backend("cuda").prepare(  # the same buffers
        case.graph, case.given, buffers_of=aligned,
        program=generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes))
    outputs = {}
    for label, executable in (("aligned", aligned), ("tested", tested)):
        executable.launch_all()
        outputs[label] = {o: executable.buffers[o].get() for o in case.graph.outputs}
        registers = "/".join(str(f.num_regs) for f in executable.functions.values())
        print(f"{name} {label}: registers {registers}", flush=True)
    for output in case.graph.outputs:
        expected = outputs["tested"][output]  # (atomics add in any order: not bitwise)
        error = np.abs(outputs["aligned"][output] - expected).max() / np.abs(expected).max()
        assert error < 1e-5, f"{output}: {error:.1e}"
    times = time_alternating({"compile": compiled_on(case.graph, case.given),
                              "compiled for aligned arrays": aligned.launch_all,
                              "pointers tested (same buffers)": tested.launch_all},
                             rounds, repeat=runs)
    print_rounds(name, times, "compile")


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare, ("madd", "waxpby", "vadd"), rounds=7)
