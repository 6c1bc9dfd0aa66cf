"""Where an app's call spends its time on the GPU: the default plan's compiled call timed end
to end (CUDA events), then the same call under PyTorch's profiler (CUPTI), which lists every
kernel's device time; the sum of the kernels against the call says what is gaps and launches.

    PYTHONPATH=. python3 experiments/kernel_profile.py APP [APP ...] [--size 4096,4096]
        [--compare-fill]

``--compare-fill`` also times the call under the plan without the tiles that fill the device
(``default_plan(..., fill_device=False)``), side by side in the same process.
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np


def profile(name: str, size: tuple[int, ...] | None, calls: int, compare_fill: bool) -> None:
    import cupy
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from kfuse.apps import get_app
    from kfuse.apps.pyramids import EXPOSURE_FUSION, LOCAL_LAPLACIAN
    from kfuse.search import default_plan
    from kfuse.tune.timing import time_gpu
    unregistered = {app.name: app for app in (LOCAL_LAPLACIAN, EXPOSURE_FUSION)}
    app = unregistered[name] if name in unregistered else get_app(name)
    size = size or app.bench_size
    pipeline = app.build()
    graph = pipeline.graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    plan = default_plan(graph, app.sizes(graph, size), fill_device=True)
    given = {key: cupy.asarray(value) for key, value in arrays.items()} | params
    compiled = pipeline.compile(backend="cuda", plan=plan)
    compiled(**given)
    call_ms = time_gpu(lambda: compiled(**given)).median_ms
    print(f"== {name} {'x'.join(map(str, size))}: {len(plan.kernel_groups)} launches, "
          f"call {call_ms:.4f} ms (CUDA events, median)")
    if compare_fill:
        unfilled = pipeline.compile(backend="cuda", plan=default_plan(
            graph, app.sizes(graph, size), fill_device=False))
        unfilled(**given)
        filled_ms, unfilled_ms = (time_gpu(partial(run, **given)).median_ms
                                  for run in (compiled, unfilled))
        print(f"  filling tiles {filled_ms:.4f} ms, default tiles {unfilled_ms:.4f} ms: "
              f"{unfilled_ms / filled_ms:.3f}x")
    cupy.cuda.get_current_stream().synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as run:
        for _ in range(calls):
            compiled(**given)
        cupy.cuda.get_current_stream().synchronize()
        torch.cuda.synchronize()
    total = 0.0
    rows = []
    for event in run.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = event.cuda_time_total
        if device_us <= 0:
            continue
        total += device_us
        rows.append((device_us / calls, event.count // calls, event.key))
    for per_call, count, key in sorted(rows, reverse=True):
        print(f"  {per_call:9.1f} us  x{count:<3d} {key[:110]}")
    print(f"  sum of kernels {total / calls / 1e3:.4f} ms per call against the call's "
          f"{call_ms:.4f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("apps", nargs="+")
    parser.add_argument("--size", default=None, help="comma-separated (the app's benchmark size)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--compare-fill", action="store_true")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split(",")) if args.size else None
    for name in args.apps:
        profile(name, size, args.calls, args.compare_fill)


if __name__ == "__main__":
    main()
