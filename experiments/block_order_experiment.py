"""Serpentine block order against first-to-last, on the same buffers (GPU experiment).

For each app, its planned program generated twice, with every kernel visiting its blocks
first-to-last (``serpentine_blocks=False`` of ``kfuse.config``) and with the serpentine order of
:mod:`kfuse.codegen.block_order`; both checked against the planned run and timed on the very
same buffers in alternating rounds beside torch.compile. Then the two again with L2 flushed
before every run (a 256 MiB fill outside the timed region): what is left is the gain inside
one call, without what a call finds in L2 from the call before. ``--unfused`` times the
unfused programs instead (one kernel per operator: more boundaries between kernels).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/block_order_experiment.py [app ...] [--rounds 7] [--runs 30]
"""

from __future__ import annotations

import argparse

import numpy as np

from kfuse.bench.experiment import device_case, planned_run, run_checked
from kfuse.codegen import generate
from kfuse.config import configured
from kfuse.runtime import get_backend
from kfuse.runtime.backend import VECTOR_ALIGNMENT
from kfuse.tune.timing import time_gpu

FLUSH_BYTES = 256 << 20


def program(case, unfused: bool, serpentine: bool):
    """``case``'s planned (or unfused) program for its sizes, in one block order."""
    with configured(serpentine_blocks=serpentine):
        return generate(case.graph, None if unfused else case.plan.kernel_groups,
                        fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)


def compare(name: str, rounds: int, runs: int, unfused: bool) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    backend = get_backend("cuda")
    planned, expected = planned_run(case, backend)
    launches = {"compile": compiled_on(case.graph, case.given)}
    for label, serpentine in (("first-to-last", False), ("serpentine", True)):
        prog = program(case, unfused, serpentine)
        reversed_count = prog.source.count("kf_reversed_block();")
        executable, error, registers = run_checked(backend, case, prog, expected,
                                                   buffers_of=planned)
        print(f"{name} {label}: {reversed_count} of {len(prog.launches)} kernels last-first, "
              f"error {error:.1e}, registers {registers}", flush=True)
        if error < 1e-5:
            launches[label] = executable.launch_all
    scratch = cupy.empty(FLUSH_BYTES // 4, dtype=cupy.float32)
    flush = [lambda: scratch.fill(1.0)]
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, launch in launches.items():
            for flushed in (False, True):
                key = label + (" (L2 flushed)" if flushed else "")
                timing = time_gpu(launch, warmup=3, repeat=runs,
                                  rotate=flush if flushed else None)
                times.setdefault(key, []).append(timing.median_s * 1e3)
    base = float(np.median(times["first-to-last"]))
    base_flushed = float(np.median(times["first-to-last (L2 flushed)"]))
    what = "unfused" if unfused else "planned"
    for key, values in times.items():
        median = float(np.median(values))
        reference = base_flushed if "flushed" in key else base
        print(f"{name:8s} {what} {key:28s} {median:.4f} ms  "
              f"{reference / median:.4f}x first-to-last  "
              f"rounds {' '.join(f'{v:.4f}' for v in values)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=["sgemvt", "gemver", "night"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--unfused", action="store_true")
    args = parser.parse_args()
    for name in args.apps:
        compare(name, args.rounds, args.runs, args.unfused)


if __name__ == "__main__":
    main()
