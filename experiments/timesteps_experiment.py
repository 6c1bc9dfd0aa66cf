"""Time-stepped stencils: every step in one kernel (temporal blocking) against the plan.

For each app of ``kfuse.apps.timesteps``: the planned program, and the whole chain as one
group under each kernel form that can compute it (``staged``: each step over the tile grown
by the halo the later steps need, in shared memory; ``recompute``: every step recomputed in
registers at each tap), each checked against the planned program, beside torch.compile, in
alternating rounds.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/timesteps_experiment.py [app ...] [--forms staged recompute]
"""

from __future__ import annotations

import argparse

from kfuse.bench.experiment import device_case, time_sources
from kfuse.codegen import generate
from kfuse.runtime.backend import VECTOR_ALIGNMENT
from kfuse.schedule.forms import as_form

APPS = ("smooth2d", "wave2d", "heat3d", "stencil27")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=APPS)
    parser.add_argument("--forms", nargs="*", default=["staged"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for name in args.apps:
        case = device_case(name)
        members = tuple(k.name for k in case.graph.kernels)
        outputs = tuple(case.graph.outputs)
        print(f"== {name} {'x'.join(map(str, case.app.bench_size))}: planned "
              f"{[g.members for g in case.plan.groups]}", flush=True)
        programs = {"planned": generate(case.graph, case.plan.kernel_groups,
                                        fixed_sizes=case.sizes,
                                        array_alignment=VECTOR_ALIGNMENT)}
        for text in args.forms:
            form = as_form(text)
            reason = form.why_not(case.graph, members)
            if reason:
                print(f"{name}: all steps {text}: {reason}", flush=True)
                continue
            programs[f"all steps {text}"] = generate(
                case.graph, [(members, outputs, form)], fixed_sizes=case.sizes,
                array_alignment=VECTOR_ALIGNMENT)
        time_sources(case, programs, args.rounds, args.runs)


if __name__ == "__main__":
    main()
