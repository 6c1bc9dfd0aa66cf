"""Time-stepped stencils: every step in one kernel (temporal blocking) against the plan.

For each app of ``kfuse.apps.timesteps``: the planned program, and the whole chain as one
group under each kernel form that can compute it (``staged``: each step over the tile grown
by the halo the later steps need, in shared memory; ``recompute``: every step recomputed in
registers at each tap), each checked against the planned program, beside torch.compile, in
alternating rounds.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/timesteps_experiment.py [app ...] [--forms staged recompute]

``--check``: instead, each form's whole chain on the cuda backend at small odd sizes in every
boundary mode against the NumPy reference (the run compute-sanitizer checks).
"""

from __future__ import annotations

import argparse

from kfuse.bench.experiment import device_case, time_sources
from kfuse.codegen import generate
from kfuse.runtime.backend import VECTOR_ALIGNMENT
from kfuse.schedule.forms import as_form, group_outputs

APPS = ("smooth2d", "wave2d", "heat3d", "stencil27")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=APPS)
    parser.add_argument("--forms", nargs="*", default=["staged"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--steps", type=int, default=0,
                        help="steps per kernel (0: all in one)")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--flat", action="store_true",
                        help="also the planned program with separable stencils summed flat "
                             "(as before kfuse.ir.separable)")
    args = parser.parse_args()
    if args.check:
        check(args.apps, args.forms, args.backend)
        return
    for name in args.apps:
        case = device_case(name)
        members = tuple(k.name for k in case.graph.kernels)
        print(f"== {name} {'x'.join(map(str, case.app.bench_size))}: planned "
              f"{[g.members for g in case.plan.groups]}", flush=True)
        programs = {"planned": generate(case.graph, case.plan.kernel_groups,
                                        fixed_sizes=case.sizes,
                                        array_alignment=VECTOR_ALIGNMENT)}
        if args.flat:
            programs["planned, flat sums"] = flat_sums_program(case)
        for text in args.forms:
            form = as_form(text)
            steps = args.steps or len(members)
            groups = [members[k:k + steps] for k in range(0, len(members), steps)]
            reason = next((form.why_not(case.graph, g) for g in groups
                           if form.why_not(case.graph, g)), None)
            label = f"{'all' if steps == len(members) else steps} steps {text}"
            if reason:
                print(f"{name}: {label}: {reason}", flush=True)
                continue
            programs[label] = generate(
                case.graph, [(g, group_outputs(case.graph, g), form) for g in groups],
                fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)
        time_sources(case, programs, args.rounds, args.runs)


def flat_sums_program(case) -> object:
    """``case``'s planned program with separable stencils summed flat in streamed kernels
    (as before :mod:`kfuse.ir.separable`), for timing side by side."""
    from kfuse.config import configured

    with configured(separable_sums=False):
        return generate(case.graph, case.plan.kernel_groups, fixed_sizes=case.sizes,
                        array_alignment=VECTOR_ALIGNMENT)


def check(names, forms, backend: str) -> None:
    """Each form's whole chain on ``backend`` against the NumPy reference."""
    import numpy as np

    from kfuse.apps import get_app
    from kfuse.ir.expr import BOUNDARY_MODES
    for name in names:
        app = get_app(name)
        sizes = [(67, 301), (130, 41), (5, 9)] if app.ndim == 2 else [(13, 11, 9), (33, 20, 7)]
        for mode in BOUNDARY_MODES:
            pipeline = app.build(boundary=mode)
            members = [k.name for k in pipeline.graph().kernels]
            for text in forms:
                form = as_form(text)
                if form.why_not(pipeline.graph(), members):
                    continue
                plan = pipeline.fuse([members], [form])
                for size in sizes:
                    arrays, params = app.make_inputs(size, np.random.default_rng(sum(size)))
                    got = pipeline.run(backend=backend, plan=plan, **arrays, **params)
                    want = app.reference(arrays, params, boundary=mode)
                    error = max(float(np.max(np.abs(np.asarray(got[k].get() if hasattr(
                        got[k], "get") else got[k]) - v)) / np.max(np.abs(v)))
                        for k, v in want.items())
                    verdict = "ok" if error < 1e-5 else "WRONG"
                    print(f"{name} {mode} {text} {size}: error {error:.1e} {verdict}",
                          flush=True)


if __name__ == "__main__":
    main()
