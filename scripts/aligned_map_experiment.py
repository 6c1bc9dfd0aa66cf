"""Plain maps with the pointers' alignment taken as known (GPU experiment, issue 5).

On an H200 a hand-written one-vector-per-thread kernel (``scripts/elementwise_hints_probe.py``,
128 threads x float2) ran MADD 0.15% and WAXPBY 0.4% faster than the planned map-reduce kernel
of the same shape, and ahead of torch.compile. The planned kernel tests the pointers'
alignment on the device (``kf_mr_aligned`` of every array) before its straight pass; here
that test is replaced by ``true`` (the arrays CuPy allocates are 256-byte aligned), alone and
with 64-bit element indices, and timed beside the planned program, the hand-written kernel's
shape and torch.compile in alternating rounds (every form checked against the planned one).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/aligned_map_experiment.py [madd waxpby vadd] [--rounds 7]
"""

from __future__ import annotations

import re
from dataclasses import replace

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.bench.timing import alternating_main

ALIGNMENT_TEST = re.compile(r"const bool kf_vec = [^;]*;")


def aligned(program, wide: bool = False):
    """``program`` with its alignment test replaced by ``true`` (and ``long long`` indices)."""
    source, count = ALIGNMENT_TEST.subn("const bool kf_vec = true;", program.source)
    assert count, "no alignment test found"
    if wide:
        source = source.replace("typedef int kf_index_t;", "typedef long long kf_index_t;")
    return replace(program, source=source)


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    planned = planned_program(case)
    time_sources(case, {"planned": planned, "alignment known": aligned(planned),
                        "alignment known, 64-bit indices": aligned(planned, wide=True)},
                 rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare, ("madd", "waxpby", "vadd"), rounds=7)
