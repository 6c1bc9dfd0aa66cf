"""Every generated kernel of the apps, run once on the GPU and checked, for compute-sanitizer.

Each app at its test size (odd sizes) under its ``auto`` plan and unfused; Harris in one
staged kernel and in one recompute kernel; diffusion3d with its threads marching along z
(marching forced on, chunks of 8 planes). Meant to run under each of compute-sanitizer's
tools, which then report any out-of-bounds access, race or barrier fault of those kernels:

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_apps.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_apps.py
    compute-sanitizer --tool synccheck --error-exitcode 9 python3 tools/sanitize_apps.py

Prints one line per program run with its largest relative error against the app's NumPy
reference; exits 1 if any result is wrong.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import cupy

    from kfuse.apps import list_apps
    from kfuse.bench.harness import max_relative_error
    from kfuse.config import configured
    from kfuse.fusion.plan import make_plan
    from kfuse.schedule import Recompute, Staged

    wrong = 0
    for app in list_apps("all"):
        graph = app.build().graph()
        sizes = [app.test_size] + ([(40, 36, 68)] if app.name == "diffusion3d" else [])
        for size in sizes:
            arrays, params = app.make_inputs(size, np.random.default_rng(5), "float32")
            reference = app.reference({k: v.astype(np.float64) for k, v in arrays.items()},
                                      params, "clamp")
            given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
            every = [k.name for k in graph.kernels]
            plans: dict[str, object] = {"auto": "auto", "unfused": "unfused"}
            if app.name == "harris":
                for form in (Staged(), Recompute()):
                    plans[f"all {form.text()}"] = make_plan(
                        graph, [every], variants={frozenset(every): form},
                        check_resources=False)
            for label, plan in plans.items():
                switches = {"march": True, "march_planes": 8, "march_least_planes": 1} \
                    if len(size) == 3 and size[0] >= 40 else {}
                with configured(**switches):
                    result = app.build().run(backend="cuda", plan=plan, **given)
                cupy.cuda.Device().synchronize()
                error = max(max_relative_error(result[name], reference[name])
                            for name in graph.outputs)
                ok = error <= app.tolerance
                wrong += not ok
                print(f"{app.name:12s} {'x'.join(map(str, size)):>10s} {label:14s} "
                      f"error {error:.1e} {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
