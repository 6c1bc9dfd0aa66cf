"""Is the output placement that streams fastest a stable property? (GPU experiment, issue 5)

Session 16 found that where a streaming kernel's output lies moves its time by up to 0.6%,
as much as kfuse's whole gap to torch.compile on the elementwise sequences and the GEMV-like
ones. If one placement stays fastest over time, kfuse could time a few output allocations
and keep the fastest, as it keeps the fastest implementation. Here the planned program is
prepared ``--allocations`` times, each on its own freshly allocated outputs (all kept alive,
so each lies elsewhere), and timed beside torch.compile in alternating rounds, twice: the
second pass tells whether the first pass's fastest placement stays fastest.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/fresh_outputs_experiment.py [app ...] [--rounds 5]
        [--allocations 6]
"""

from __future__ import annotations

import argparse

import numpy as np

from kfuse.bench.experiment import device_case
from kfuse.runtime import get_backend
from kfuse.tune.timing import print_rounds, time_alternating


def compare(name: str, rounds: int, runs: int, allocations: int) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    labels = {"compile": compiled_on(case.graph, case.given)}
    for index in range(allocations):
        executable = get_backend("cuda").prepare(case.graph, case.given, plan=case.plan)
        executable.launch_all()
        labels[f"kfuse outputs #{index}"] = executable.launch_all
    passes = []
    for number in (1, 2):
        times = time_alternating(labels, rounds, repeat=runs)
        print(f"{name}: pass {number}", flush=True)
        print_rounds(name, times, "compile")
        passes.append([float(np.median(times[f"kfuse outputs #{i}"]))
                       for i in range(allocations)])
    first, second = (np.array(p) for p in passes)
    best = int(np.argmin(first))
    print(f"{name}: fastest in pass 1 #{best}; in pass 2 it ranks "
          f"{int(np.argsort(np.argsort(second))[best]) + 1} of {allocations}; spread pass 1 "
          f"{(first.max() / first.min() - 1) * 100:.2f}%, pass 2 "
          f"{(second.max() / second.min() - 1) * 100:.2f}%; rank correlation "
          f"{np.corrcoef(np.argsort(np.argsort(first)), np.argsort(np.argsort(second)))[0, 1]:.2f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=["sscal", "waxpby", "vadd", "gesummv"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--allocations", type=int, default=6)
    args = parser.parse_args()
    for name in args.apps:
        compare(name, args.rounds, args.runs, args.allocations)


if __name__ == "__main__":
    main()
