"""Verify every image/stencil app on a backend at its benchmark size, fused and unfused.

The float64 NumPy reference (the slow part at 8192² and 512³) is computed once per app and
compared with both programs; one JSON line per (app, program). Exit status 1 if any result
is off by more than the tolerance (norm-wise relative error 1e-5, as the tests use).

Usage (GPU machine): PYTHONPATH=. python3 benchmarks/verify_apps.py [--backend cuda] [app ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from kfuse.apps import get_app, list_apps
from kfuse.apps.check import relative_error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--small", action="store_true", help="the apps' small test sizes")
    args = parser.parse_args()
    names = args.apps or [a.name for a in list_apps(family="image")]
    failed = False
    for name in names:
        app = get_app(name)
        pipeline = app.build()
        size = app.test_size if args.small else app.bench_size
        arrays, params = app.make_inputs(size, np.random.default_rng(5), "float32")
        started = time.perf_counter()
        reference = app.reference(arrays, params, "clamp")
        reference_s = time.perf_counter() - started
        tolerance = app.tolerance
        for plan in ("auto", "unfused"):
            outputs = pipeline.run(backend=args.backend, plan=plan, **arrays, **params)
            error = max(relative_error(outputs[k], reference[k]) for k in reference)
            failed |= not error <= tolerance
            print(json.dumps({"app": name, "size": list(size), "plan": plan,
                              "backend": args.backend, "max_rel_error": error,
                              "verified": error <= tolerance,
                              "reference_s": round(reference_s, 1)}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
