"""What a call from Python costs, end to end, beside the kernels' own time and torch.compile.

For each app and size, :func:`kfuse.bench.calls.measure_calls`: the kernels' own time, and
microseconds per call from Python of ``Pipeline.run``, of the compiled callable with and
without CUDA graphs, and of ``torch.compile``'s call of the same pipeline. Then checks:
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


def measure(name: str, size: tuple[int, ...], plan: str, rows: list[dict]) -> None:
    import cupy

    from kfuse.apps import get_app
    from kfuse.bench.calls import measure_calls
    from kfuse.runtime import auto_plan, get_backend

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    inputs, params = app.make_inputs(size, np.random.default_rng(1), "float32")
    given = {key: cupy.asarray(value) for key, value in inputs.items()} | params
    fused = auto_plan(graph, given) if plan == "auto" else None
    executable = get_backend("cuda").prepare(graph, given, plan=fused)
    row = {"app": name, "size": "x".join(map(str, size)), "plan": plan, **measure_calls(
        graph, lambda plan, **a: pipeline.run(backend="cuda", plan=plan, **a),
        lambda plan, graphs=True, native=True: pipeline.compile("cuda", plan, graphs=graphs,
                                                                native=native),
        given, executable, plan)}
    direct = pipeline.compile("cuda", plan, graphs=False)(**given)
    graphs = pipeline.compile("cuda", plan)
    for _ in range(3):  # the third call replays the graph where there is one
        replayed = graphs(**given)
    row["graph_error"] = max(float(cupy.abs(replayed[k] - direct[k]).max()
                                   / cupy.abs(direct[k]).max()) for k in direct)
    rows.append(row)
    print(json.dumps(row), flush=True)


def profile_calls(name: str, size: tuple[int, ...]) -> str:
    """Where the host time of a compiled call goes (cProfile, 2000 calls)."""
    import cProfile
    import io
    import pstats

    import cupy

    from kfuse.apps import get_app
    app = get_app(name)
    inputs, params = app.make_inputs(size, np.random.default_rng(5), "float32")
    given = {key: cupy.asarray(value) for key, value in inputs.items()} | params
    compiled = app.build().compile("cuda")
    for _ in range(10):
        compiled(**given)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(2000):
        compiled(**given)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    return text.getvalue()


def streams_experiment(size: tuple[int, int]) -> dict:
    """The levels app (independent branches of small kernels) with and without side
    streams: what the wave model predicts, and microseconds per call measured, with CUDA
    graphs (the launches cost one call) and without."""
    import cupy

    from kfuse.apps import get_app
    from kfuse.bench.calls import graph_time_us, per_call_us

    app = get_app("levels")
    pipeline = app.build()
    inputs, params = app.make_inputs(size, np.random.default_rng(3), "float32")
    given = {key: cupy.asarray(value) for key, value in inputs.items()} | params
    result: dict = {"size": "x".join(map(str, size))}
    outputs = {}
    for streams in (False, True):  # True: separate streams, whatever the model predicts
        for graphs in (False, True):
            compiled = pipeline.compile("cuda", graphs=graphs, streams=streams)
            outputs[(streams, graphs)] = compiled(**given)
            result[f"streams={streams} graphs={graphs} us"] = per_call_us(
                lambda compiled=compiled: compiled(**given))
            if streams and not graphs:
                (signature,) = compiled._signatures.values()
                result["schedule"] = signature.schedule.explain()
                result["predicted_single_us"] = sum(
                    d.single_s for d in signature.schedule.decisions) * 1e6
                result["predicted_multi_us"] = sum(
                    d.multi_s for d in signature.schedule.decisions) * 1e6
    result["auto"] = pipeline.compile("cuda")  # what the model chooses
    result["auto"](**given)
    result["auto"] = result["auto"].explain()
    for streams in (False, True):  # the device's time alone: 50 calls captured in a graph
        compiled = pipeline.compile("cuda", graphs=False, streams=streams)
        out = {key: cupy.empty_like(value) for key, value in outputs[(False, False)].items()}
        compiled(out=out, **given)
        result[f"streams={streams} device us"] = graph_time_us(
            lambda compiled=compiled, out=out: compiled(out=out, **given))
    base = outputs[(False, False)]
    result["max_difference"] = max(float(cupy.abs(out[k] - base[k]).max())
                                   for out in outputs.values() for k in base)
    print(json.dumps(result), flush=True)
    return result


def readme_example() -> dict:
    """The README's first example as a new user runs it, in a loop: per call on the GPU
    with the NumPy image it makes (copied in and out every call) and with the image on the
    GPU, beside the program's kernels alone."""
    import cupy

    import kfuse as kf
    from kfuse.bench.calls import kernels_us, per_call_us
    from kfuse.runtime import auto_plan, get_backend

    p = kf.Pipeline("sobel")
    img = p.input("img", ndim=2)
    dx = kf.convolve(img, [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], boundary="mirror")
    dy = kf.local(img.at(1, 0) - img.at(-1, 0), boundary=kf.constant(0.0))
    mag = kf.point(kf.sqrt(dx * dx + dy * dy))
    p.output(mag)
    image = np.random.rand(480, 640).astype(np.float32)
    on_gpu = cupy.asarray(image)
    executable = get_backend("cuda").prepare(p.graph(), {"img": on_gpu},
                                             plan=auto_plan(p.graph(), {"img": on_gpu}))
    result = {"kernels_us": kernels_us(executable),
              "numpy_image_us": per_call_us(lambda: p.run(backend="cuda", img=image)),
              "gpu_image_us": per_call_us(lambda: p.run(backend="cuda", img=on_gpu))}
    print("README example:", json.dumps(result), flush=True)
    return result


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
    parser.add_argument("--only", help="apps to time, by name, comma-separated")
    options = parser.parse_args()
    from kfuse.apps import get_app

    rows: list[dict] = []
    cases = [("harris", "auto"), ("harris", "unfused"), ("night", "auto"),
             ("gemver", "auto"), ("sgemv", "auto"), ("waxpby", "auto"), ("sobel", "auto"),
             ("levels", "auto")]
    if options.only:
        cases = [case for case in cases if case[0] in options.only.split(",")]
    for name, plan in cases:
        app = get_app(name)
        sizes = [SMALL.get(app.ndim, app.test_size)]
        if not options.quick:
            sizes.append(tuple(app.bench_size))
        if name == "harris" and plan == "auto" and not options.quick:
            sizes.insert(1, (1024, 1024))
        for size in sizes:
            measure(name, size, plan, rows)
    for name in ("gemver", "sgemv"):
        print(profile_calls(name, (256, 256)), flush=True)
    streams = [streams_experiment(size) for size in ((256, 256), (1024, 1024), (8192, 8192))]
    readme = readme_example()
    manners = torch_manners()
    print("torch manners:", manners, flush=True)
    fresh = {f"{n}x{n}": fresh_process((n, n)) for n in (8192,)}
    print("fresh process (import, inputs, first call, total s), cold then warm:", fresh)
    print()
    print(f"{'app':8} {'size':>11} {'plan':8} {'n':>2} {'kernels':>9} {'run':>9} "
          f"{'compiled':>9} {'no graph':>9} {'python':>9} {'torch.c':>9}   (us per call)")
    for row in rows:
        torch_us = row["torch_compile_us"]
        print(f"{row['app']:8} {row['size']:>11} {row['plan']:8} {row['launches']:>2} "
              f"{row['kernels_us']:9.1f} {row['run_us']:9.1f} {row['compiled_us']:9.1f} "
              f"{row['direct_us']:9.1f} {row['python_us']:9.1f} "
              f"{'-' if torch_us is None else f'{torch_us:9.1f}'}"
              f"  replays={row['graph_replays']} native={row['native_calls']} "
              f"graph error={row['graph_error']:.1e}")
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"rows": rows, "torch": manners, "fresh": fresh, "streams": streams,
                       "readme": readme},
                      file, indent=1)


if __name__ == "__main__":
    main()
