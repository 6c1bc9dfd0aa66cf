"""kfuse against torch.compile in alternating rounds, to tell a real gap from drift.

``kfuse bench`` times kfuse, then its unfused program, then PyTorch eager, then
torch.compile, each in one block of runs. A gap of 1% between two blocks timed a few seconds
apart can come from the order (clocks and temperature drift while the GPU works). Here the
two are timed in alternating rounds (kfuse, compile, kfuse, compile, ...) on the very same
input arrays; each round's median is printed, then the median of the rounds and how many
rounds kfuse won.

``KFUSE_AUTOTUNE=K`` runs the fastest of the K best-predicted implementations (``kfuse run
--autotune K``; torch.compile autotunes its own kernels too) instead of the predicted plan;
``SIZE=67108864`` (or ``8192x8192``) runs every app at that size instead of its benchmark
size. ``CONTROL=1`` also times a second executable of kfuse's program on outputs of its
own ("kfuse again"): the spread of one program against itself, which a gap between kfuse
and torch.compile must exceed to be more than where the outputs lie (METHOD.md: a
difference smaller than the spread of the same version timed twice is noise).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 benchmarks/interleaved_bench.py [app ...] [--rounds 8] [--runs 30]
"""

from __future__ import annotations

import os

import numpy as np

from kfuse.bench.experiment import device_case
from kfuse.cli.arguments import alternating_main
from kfuse.runtime import get_backend
from kfuse.tune.timing import time_alternating

DEFAULT_APPS = ("sgemv", "sgemvt", "gesummv", "madd", "vadd", "waxpby", "sscal", "atax")


def compare(name: str, rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    size = tuple(int(n) for n in os.environ["SIZE"].split("x")) if os.environ.get("SIZE") \
        else None
    case = device_case(name, size=size)  # planned as kfuse bench plans it
    graph, given, sizes, plan = case.graph, case.given, case.sizes, case.plan
    tune = int(os.environ.get("KFUSE_AUTOTUNE", "0"))
    if tune:
        from kfuse.tune.autotune import autotune
        plan = autotune(graph, given, tune, sizes=sizes).plan
    executable = get_backend("cuda").prepare(graph, given, plan=plan)
    compiled = compiled_on(graph, given)
    executable.launch_all()
    result = compiled()
    for output in graph.outputs:
        ours = executable.buffers[output]
        theirs = cupy.asarray(result[output])
        error = float(cupy.abs(ours - theirs).max() / cupy.abs(theirs).max())
        assert error < 1e-4, f"{name}: '{output}' differs from torch.compile by {error:.1e}"
    launches = {"kfuse": executable.launch_all, "compile": compiled}
    if os.environ.get("CONTROL") == "1":
        launches["kfuse again"] = get_backend("cuda").prepare(graph, given, plan=plan).launch_all
    times = time_alternating(launches, rounds, repeat=runs)
    ours_ms, theirs_ms = times["kfuse"], times["compile"]
    won = sum(a <= b for a, b in zip(ours_ms, theirs_ms, strict=True))
    ours, theirs = float(np.median(ours_ms)), float(np.median(theirs_ms))
    print(f"{name:8s} size {tuple(sizes.values())} plan {[g.variant for g in plan.groups]}")
    print(f"{name:8s} kfuse {ours:.4f} ms  torch.compile {theirs:.4f} ms  "
          f"x compile {theirs / ours:.4f}  kfuse faster in {won}/{rounds} rounds", flush=True)
    print("         kfuse rounds   " + " ".join(f"{t:.4f}" for t in ours_ms))
    print("         compile rounds " + " ".join(f"{t:.4f}" for t in theirs_ms), flush=True)
    if "kfuse again" in times:
        again_ms = times["kfuse again"]
        again = float(np.median(again_ms))
        print(f"{name:8s} control: kfuse again {again:.4f} ms, {again / ours:.4f}x kfuse "
              f"(spread of one program on other outputs)")
        print("         again rounds   " + " ".join(f"{t:.4f}" for t in again_ms), flush=True)


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, DEFAULT_APPS, rounds=8)


if __name__ == "__main__":
    main()
