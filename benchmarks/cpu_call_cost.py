"""The cpu backend's call cost: a repeated ``Pipeline.run`` of Harris 64x64 beside its
program's launches alone, and a fresh process's first result with a cold and a warm
cache folder.

    PYTHONPATH=. python3 benchmarks/cpu_call_cost.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

FRESH = r"""
import time
start = time.perf_counter()
import numpy as np
import kfuse as kf
from kfuse.apps import get_app
imported = time.perf_counter()
app = get_app("harris")
inputs, params = app.make_inputs((64, 64), np.random.default_rng(0), "float32")
pipeline = app.build()
ready = time.perf_counter()
pipeline.run(backend="cpu", **inputs, **params)
done = time.perf_counter()
print(f"{imported - start:.4f} {ready - imported:.4f} {done - ready:.4f} {done - start:.4f}")
"""


def median_ms(call, count: int = 60) -> float:
    call()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[count // 2] * 1e3


def main() -> None:
    from kfuse.apps import get_app
    from kfuse.runtime import auto_plan, get_backend

    app = get_app("harris")
    pipeline = app.build()
    inputs, params = app.make_inputs((64, 64), np.random.default_rng(1), "float32")
    given = {**inputs, **params}
    executable = get_backend("cpu").prepare(pipeline.graph(), given,
                                            plan=auto_plan(pipeline.graph(), given))
    compiled = pipeline.compile("cpu")
    result = {"launch_ms": median_ms(executable.launch_all),
              "run_ms": median_ms(lambda: pipeline.run(backend="cpu", **given)),
              "compiled_ms": median_ms(lambda: compiled(**given))}
    folder = tempfile.mkdtemp(prefix="kfuse-cache-")
    environment = {**os.environ, "KFUSE_CACHE_DIR": folder}
    result["fresh (import, inputs, first call, total s): cold, warm"] = [
        [float(v) for v in subprocess.run([sys.executable, "-c", FRESH], env=environment,
                                          text=True, capture_output=True,
                                          check=True).stdout.split()] for _ in range(2)]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
