"""Window sums that share pairs between neighbouring points, on and off (GPU experiment).

kfuse.codegen.cexpr sums a 3-tap window ``x[i-1] + x[i] + x[i+1]`` of one expression so
that a thread's neighbouring points share ``x[i] + x[i+1]`` (``WINDOW_SUMS``). Here each
app's default program is generated with it on and off, compiled for the benchmark size,
checked (both against the float64 reference), timed in alternating rounds, and the SASS
of each fused kernel counted by instruction class (nvcc + cuobjdump, when present).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/window_sum_experiment.py [app ...] [--rounds 7]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

import kfuse.codegen.cexpr as cexpr
from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.bench.timing import time_gpu
from kfuse.codegen import generate
from kfuse.search import search

DEFAULT_APPS = ("harris", "shi_tomasi", "enhance")


def sass_classes(source: str) -> dict[str, int]:
    """SASS instructions of the program's kernels by opcode (empty without the tools)."""
    if not (shutil.which("nvcc") and shutil.which("cuobjdump")):
        return {}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cu")
        with open(path, "w") as file:
            file.write(source)
        subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-o", path + ".cubin", path],
                       check=True, capture_output=True)
        sass = subprocess.run(["cuobjdump", "-sass", path + ".cubin"], check=True,
                              capture_output=True, text=True).stdout
    counts: collections.Counter[str] = collections.Counter()
    for match in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass):
        counts[match.group(1)] += 1
    return dict(counts)


def compare(name: str, rounds: int) -> None:
    import cupy

    from kfuse.runtime import get_backend

    app = get_app(name)
    graph = app.build().graph()
    arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    sizes = graph.bind_shapes({n: app.bench_size for n in graph.inputs})
    plan = search(graph, sizes=sizes)
    reference = app.reference(arrays, params, "clamp")
    backend = get_backend("cuda")
    executables = {}
    for label, window_sums in (("pairs shared", True), ("as written", False)):
        cexpr.WINDOW_SUMS = window_sums
        program = generate(graph, plan.kernel_groups, fixed_sizes=sizes)
        cexpr.WINDOW_SUMS = True
        executable = backend.prepare(graph, given, program=program)
        executable.launch_all()
        error = max(relative_error(executable.buffers[k].get(), reference[k])
                    for k in graph.outputs)
        counts = sass_classes(program.source)
        floating = sum(v for k, v in counts.items() if k in ("FADD", "FMUL", "FFMA", "MUFU"))
        print(f"{name:11s} {label:13s} error {error:.1e}  SASS {sum(counts.values())} "
              f"(FADD {counts.get('FADD', 0)}, FMUL {counts.get('FMUL', 0)}, "
              f"FFMA {counts.get('FFMA', 0)}, float {floating})", flush=True)
        executables[label] = executable
    times: dict[str, list[float]] = {label: [] for label in executables}
    for _ in range(rounds):
        for label, executable in executables.items():
            times[label].append(time_gpu(executable.launch_all, warmup=3,
                                         repeat=30).median_s * 1e3)
    base = float(np.median(times["as written"]))
    for label, values in times.items():
        median = float(np.median(values))
        print(f"{name:11s} {label:13s} {median:.4f} ms  {base / median:.4f}x as written  "
              f"rounds {' '.join(f'{v:.4f}' for v in values)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=list(DEFAULT_APPS))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for name in args.apps:
        compare(name, args.rounds)


if __name__ == "__main__":
    main()
