"""Minimum and maximum that keep NaN (``kf_min``/``kf_max``, as NumPy's) against CUDA's
``fminf``/``fmaxf`` (which drop it) in the Night filter's clamps to [0, 1] (GPU experiment,
alternating rounds beside torch.compile; both forms checked against the planned program).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/minmax_experiment.py [app ...] [--rounds 5] [--runs 30]
"""

from __future__ import annotations

from dataclasses import replace

from kfuse.bench.experiment import device_case, planned_program, time_sources
from kfuse.cli.arguments import alternating_main
from kfuse.codegen.prelude import PRELUDE


def dropping_nan(program):
    """``program`` with ``fminf``/``fmaxf`` for the generated ``kf_min``/``kf_max`` calls."""
    head, body = program.source.split(PRELUDE, 1)  # (head: the alignment compiled in)
    body = body.replace("kf_min(", "fminf(").replace("kf_max(", "fmaxf(")
    return replace(program, source=head + PRELUDE + body)


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    planned = planned_program(case)
    time_sources(case, {"kf_min/kf_max (planned)": planned, "fminf/fmaxf": dropping_nan(planned)},
                 rounds, runs)


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare, ("night",))
