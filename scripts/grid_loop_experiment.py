"""Grid-stride loops that run once: do they cost time? (GPU experiment, timing only).

kfuse's general kernel templates (and, before session 10, its map-reduce kernels) walk their
rows or chunks in grid-stride loops (``for (iy = first; iy < n; iy += gridDim.y * ...)``),
so that a grid capped by the hardware still covers every point. Where the grid covers every
point, each loop runs once. Here every such loop of an app's planned program is patched to
stop after its first pass (``iy += step`` becomes ``iy = n``) and the two programs are timed
in alternating rounds beside torch.compile; the outputs must agree.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/grid_loop_experiment.py [app ...] [--rounds 3] [--runs 30]
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from kfuse.apps import get_app
from kfuse.bench.harness import app_plan
from kfuse.bench.timing import alternating_main, print_rounds, time_alternating
from kfuse.codegen import generate
from kfuse.runtime import get_backend

LOOP = re.compile(r"(for \((?:int|kf_index_t) (\w+) = [^;]+;\s*\2 < (\w+);\s*)"
                  r"\2 \+= (?:[^)]*gridDim[^)]*|step)\)")


def once(source: str) -> tuple[str, int]:
    """``source`` with every grid-stride loop stopped after its first pass, and how many."""
    return LOOP.subn(r"\1\2 = \3)", source)


def compare(name: str, rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app(name)
    graph = app.build().graph()
    arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    sizes = graph.bind_shapes({name: array.shape for name, array in arrays.items()})
    plan = app_plan(app, graph, sizes)
    program = generate(graph, plan.kernel_groups, fixed_sizes=sizes)
    patched, count = once(program.source)
    backend = get_backend("cuda")
    planned = backend.prepare(graph, given, program=program)
    single = backend.prepare(graph, given, program=replace(program, source=patched))
    planned.launch_all()
    single.launch_all()
    error = max(float(cupy.abs(single.buffers[o] - planned.buffers[o]).max()
                      / cupy.abs(planned.buffers[o]).max()) for o in graph.outputs)
    print(f"{name}: {count} grid-stride loop(s) patched; error against the plan {error:.1e}",
          flush=True)
    labels = {"compile": compiled_on(graph, given), "plan": planned.launch_all}
    if count and error < 1e-6:
        labels["loops run once"] = single.launch_all
    print_rounds(name, time_alternating(labels, rounds, repeat=runs), "compile")


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare,
                     ["shi_tomasi", "harris", "sobel", "unsharp", "enhance", "diffusion3d",
                      "vadd", "madd"])


if __name__ == "__main__":
    main()
