"""A pyramid app's default plan on the GPU, step by step with times (what a benchmark's
progress bar hides): planning, the first compiled call, the result against the numpy
backend at a small size under the same groups, and per-call times of the compiled call with
and without CUDA graphs beside the unfused program and torch.compile.

    PYTHONPATH=. python3 experiments/pyramid_probe.py local_laplacian
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("app", choices=("local_laplacian", "blend", "exposure_fusion"))
    parser.add_argument("--size", default=None, help="h,w (the app's benchmark size)")
    args = parser.parse_args()
    import cupy

    from kfuse.apps import pyramids
    from kfuse.bench.calls import interleaved_us
    from kfuse.search import default_plan

    app = {"local_laplacian": pyramids.LOCAL_LAPLACIAN, "blend": pyramids.BLEND,
           "exposure_fusion": pyramids.EXPOSURE_FUSION}[args.app]
    size = tuple(int(n) for n in args.size.split(",")) if args.size else app.bench_size
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {text}", flush=True)

    pipeline = app.build()
    graph = pipeline.graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0))
    sizes = app.sizes(graph, size)
    plan = default_plan(graph, sizes)
    say(f"planned: {len(plan.kernel_groups)} launches")
    print(plan.explain(), flush=True)
    groups = [list(group.members) for group in plan.groups]
    small_arrays, small_params = app.make_inputs((45, 67), np.random.default_rng(1))
    small_plan = pipeline.fuse(groups)
    got = pipeline.run(backend="cuda", plan=small_plan, **small_arrays, **small_params)
    want = pipeline.run(backend="numpy", **small_arrays, **small_params)
    for name, values in want.items():
        difference = np.abs(cupy.asnumpy(got[name]).astype(np.float64) - values).max()
        say(f"45 x 67 under the same groups: '{name}' differs from numpy by at most "
            f"{difference:.3g}")
    given = {name: cupy.asarray(value) for name, value in arrays.items()} | params
    compiled = pipeline.compile(backend="cuda", plan=plan)
    direct = pipeline.compile(backend="cuda", plan=plan, graphs=False)
    unfused = pipeline.compile(backend="cuda", plan="unfused")
    for name, call in (("compiled", compiled), ("direct", direct), ("unfused", unfused)):
        call(**given)
        cupy.cuda.get_current_stream().synchronize()
        say(f"first {name} call done")
    calls = {"kfuse compiled (CUDA graph)": lambda: compiled(**given),
             "kfuse compiled, no graph": lambda: direct(**given),
             "kfuse unfused (CUDA graph)": lambda: unfused(**given)}
    try:
        from kfuse.bench.torch_baseline import compiled_on
        baseline = compiled_on(graph, dict(given))
        baseline()
        calls["torch.compile"] = baseline
        say("torch.compile ready")
    except Exception as error:  # noqa: BLE001 - a failing baseline loses its column only
        say(f"torch.compile failed: {type(error).__name__}: {str(error)[:200]}")
    for name, us in interleaved_us(calls, seconds=0.5).items():
        say(f"{name}: {us / 1e3:.4f} ms per call")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
