"""What a call from Python costs, end to end, beside the kernels' own time and torch.compile.

For each app and size: the kernels' time (CUDA events around back-to-back launches of the
prepared program), then microseconds per call from Python, calls enqueued back to back and
the device waited on once at the end, of ``Pipeline.run``, of the compiled callable with
and without CUDA graphs, and of ``torch.compile``'s call of the same pipeline. Then checks:
torch tensors in give torch tensors out without copies, ordering on a non-default torch
stream, graph replay equal to direct launches; and a fresh process's first result with a
cold and with a warm disk cache.

    PYTHONPATH=. python3 benchmarks/call_cost.py [--json FILE] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SMALL = {2: (256, 256), 1: (65536,)}
FRESH_PROCESS = r"""
import time
start = time.perf_counter()
import cupy, numpy as np
import kfuse as kf
from kfuse.apps import get_app
imported = time.perf_counter()
app = get_app("harris")
inputs, params = app.make_inputs(SIZE, np.random.default_rng(0), "float32")
given = {name: cupy.asarray(value) for name, value in inputs.items()}
ready = time.perf_counter()
out = app.build().run(backend="cuda", **given, **params)["hc"]
cupy.cuda.Device().synchronize()
done = time.perf_counter()
print(f"{imported - start:.4f} {ready - imported:.4f} {done - ready:.4f} {done - start:.4f}")
"""


def synchronize() -> None:
    import cupy
    import torch
    cupy.cuda.Device().synchronize()
    torch.cuda.synchronize()


def per_call_us(call, seconds: float = 0.4, least: int = 20) -> float:
    """Microseconds per call, calls enqueued back to back, the device waited on at the end
    (median of three runs)."""
    call()
    synchronize()
    start = time.perf_counter()
    call()
    synchronize()
    once = time.perf_counter() - start
    count = max(least, min(5000, int(seconds / max(once, 1e-6))))
    runs = []
    for _ in range(3):
        synchronize()
        start = time.perf_counter()
        for _ in range(count):
            call()
        synchronize()
        runs.append((time.perf_counter() - start) / count * 1e6)
    return sorted(runs)[1]


def kernel_us(executable, count: int = 200) -> float:
    """The program's kernels alone: CUDA events around ``count`` back-to-back launches."""
    import cupy
    executable.launch_all()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    runs = []
    for _ in range(3):
        start.record()
        for _ in range(count):
            executable.launch_all()
        end.record()
        end.synchronize()
        runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / count)
    return sorted(runs)[1]


def measure(name: str, size: tuple[int, ...], plan: str, rows: list[dict]) -> None:
    import cupy

    from kfuse.apps import get_app
    from kfuse.bench.torch_baseline import compiled_on
    from kfuse.runtime import auto_plan, get_backend

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    inputs, params = app.make_inputs(size, np.random.default_rng(1), "float32")
    given = {key: cupy.asarray(value) for key, value in inputs.items()}
    fused = auto_plan(graph, {**given, **params}) if plan == "auto" else None
    executable = get_backend("cuda").prepare(graph, {**given, **params}, plan=fused)
    kernels = kernel_us(executable, 50 if np.prod(size) > 2**22 else 500)
    direct = pipeline.compile(backend="cuda", plan=plan, graphs=False)
    graphs = pipeline.compile(backend="cuda", plan=plan)
    expected = {key: value.copy() for key, value in direct(**given, **params).items()}
    row = {"app": name, "size": "x".join(map(str, size)), "plan": plan,
           "launches": len(executable.program.launches), "kernel_us": kernels,
           "run_us": per_call_us(lambda: pipeline.run(backend="cuda", plan=plan, **given,
                                                      **params)),
           "compiled_us": per_call_us(lambda: direct(**given, **params)),
           "graphs_us": per_call_us(lambda: graphs(**given, **params))}
    replayed = graphs(**given, **params)
    row["graph_replays"] = graphs.stats.graph_replays
    row["graph_equal"] = all(bool(cupy.array_equal(replayed[k], expected[k])) for k in expected)
    try:
        torch_call = compiled_on(graph, {**given, **params})
        row["torch_compile_us"] = per_call_us(torch_call)
    except Exception as error:  # a baseline that fails must not lose the row
        row["torch_compile_us"] = None
        row["torch_error"] = f"{type(error).__name__}: {str(error)[:120]}"
    rows.append(row)
    print(json.dumps(row), flush=True)


def torch_manners() -> dict:
    """Torch in, torch out, no copies; a non-default stream orders the work."""
    import torch

    from kfuse.apps import get_app

    app = get_app("harris")
    compiled = app.build().compile(backend="cuda")
    inputs, params = app.make_inputs((1024, 1024), np.random.default_rng(2), "float32")
    image = torch.as_tensor(inputs["img"], device="cuda")
    out = compiled(img=image, **params)["hc"]
    facts = {"torch_out": isinstance(out, torch.Tensor), "device": str(out.device)}
    side = torch.cuda.Stream()
    wanted = compiled(img=image * 2.0, **params)["hc"].clone()
    with torch.cuda.stream(side):  # the input is made on the side stream, used at once
        for _ in range(20):
            doubled = image * 2.0
            got = compiled(img=doubled, **params)["hc"]
    side.synchronize()
    facts["side_stream_equal"] = bool(torch.equal(got, wanted))
    facts["signatures"] = compiled.cache_info()["signatures"]
    return facts


def fresh_process(size: tuple[int, int]) -> list[list[float]]:
    """(import, inputs, first call, total) seconds of two fresh processes on one new cache
    folder: the first with it empty, the second warm."""
    folder = tempfile.mkdtemp(prefix="kfuse-cache-")
    environment = {**os.environ, "KFUSE_CACHE_DIR": folder}
    code = FRESH_PROCESS.replace("SIZE", repr(size))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=environment, text=True,
                              capture_output=True, check=True)
        runs.append([float(v) for v in done.stdout.split()])
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    options = parser.parse_args()
    from kfuse.apps import get_app

    rows: list[dict] = []
    cases = [("harris", "auto"), ("harris", "unfused"), ("night", "auto"),
             ("gemver", "auto"), ("sgemv", "auto"), ("waxpby", "auto"), ("sobel", "auto")]
    for name, plan in cases:
        app = get_app(name)
        sizes = [SMALL.get(app.ndim, app.test_size)]
        if not options.quick:
            sizes.append(tuple(app.bench_size))
        if name == "harris" and plan == "auto" and not options.quick:
            sizes.insert(1, (1024, 1024))
        for size in sizes:
            measure(name, size, plan, rows)
    manners = torch_manners()
    print("torch manners:", manners, flush=True)
    fresh = {f"{n}x{n}": fresh_process((n, n)) for n in (8192,)}
    print("fresh process (import, inputs, first call, total s), cold then warm:", fresh)
    print()
    print(f"{'app':8} {'size':>11} {'plan':8} {'n':>2} {'kernel':>9} {'run':>9} {'compiled':>9} "
          f"{'graphs':>9} {'torch.c':>9}   (us per call)")
    for row in rows:
        torch_us = row["torch_compile_us"]
        print(f"{row['app']:8} {row['size']:>11} {row['plan']:8} {row['launches']:>2} "
              f"{row['kernel_us']:9.1f} {row['run_us']:9.1f} {row['compiled_us']:9.1f} "
              f"{row['graphs_us']:9.1f} {torch_us if torch_us is None else f'{torch_us:9.1f}'}"
              f"  replays={row['graph_replays']} equal={row['graph_equal']}")
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"rows": rows, "torch": manners, "fresh": fresh}, file, indent=1)


if __name__ == "__main__":
    main()
