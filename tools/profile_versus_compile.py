"""Run an app's kfuse program and its torch.compile baseline twice each inside a profiler
range, for Nsight Compute (compilation and autotuning stay outside the range).

Usage on the device machine (repo root)::

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        PYTHONPATH=. python3 tools/profile_versus_compile.py sgemv [SOURCE_FILE] [--dtype float16]

(``SOURCE_FILE``: where to write the kfuse program's CUDA source, for nvcc and cuobjdump.)
"""

from __future__ import annotations

import sys

import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import auto_plan, get_backend


def main() -> None:
    import cupy
    import torch

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app(sys.argv[1])
    size = app.bench_size
    dtype = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "float32"
    graph = (app.build(dtype=dtype) if dtype != "float32" else app.build()).graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), dtype)
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    executable = get_backend("cuda").prepare(graph, given, plan=auto_plan(graph, given))
    if len(sys.argv) > 2 and not sys.argv[2].startswith("--"):
        with open(sys.argv[2], "w") as file:
            file.write(executable.program.source)
    compiled = compiled_on(graph, given)
    for _ in range(3):
        executable.launch_all()
        compiled()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(2):
        executable.launch_all()
        compiled()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
