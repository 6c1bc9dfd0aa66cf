"""What one small pyramid level costs on the GPU: a downsample of n x n alone, for n from the
finest to the coarsest level of a 4096^2 pyramid (a call from Python, CUDA events around
it), and the blend app's call with CUDA graphs on and off.

    PYTHONPATH=. python3 experiments/pyramid_level_cost.py
"""

from __future__ import annotations

import cupy
import numpy as np

import kfuse as kf
from kfuse.apps import get_app
from kfuse.tune.timing import time_gpu


def main() -> None:
    p = kf.Pipeline("one_level")
    x = p.input("x", 2)
    p.output(kf.downsample(x, name="coarse"))
    for n in (4096, 1024, 256, 64, 16):
        given = cupy.random.random((n, n), dtype=cupy.float32)
        compiled = p.compile("cuda")
        compiled(x=given)
        timing = time_gpu(lambda compiled=compiled, given=given: compiled(x=given))
        print(f"downsample {n}x{n}: {timing.median_ms:.4f} ms")
    app = get_app("blend")
    arrays, _ = app.make_inputs((4096, 4096), np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()}
    pipeline = app.build()
    for graphs in (True, False):
        compiled = pipeline.compile("cuda", graphs=graphs)
        compiled(**given)
        ms = time_gpu(lambda compiled=compiled: compiled(**given)).median_ms
        print(f"blend 4096^2 graphs={graphs}: {ms:.4f} ms")
    print(compiled.explain() if hasattr(compiled, "explain") else "")


if __name__ == "__main__":
    main()
