"""Host arrays streamed through one GPU in slabs (kfuse.scaleout.host_slabs), against the same
pipeline on data that fits (GPU benchmark; issue 32's "larger than a GPU").

For each app, one host volume (page-locked, random) and, side by side in one run:

- ``resident``: the pipeline on device arrays of one slab's size (the kernels alone; no copy);
- ``fits, host to host``: the whole volume copied in, computed in one call, copied out, one
  after another (what a user with data that fits in the GPU does from host memory);
- ``slabs``: :func:`kfuse.scaleout.run_in_slabs` over the same volume in slabs of
  ``--slab-rows`` (default: what the device's memory gives), copies overlapped with compute
  on three streams, outputs into page-locked arrays given once;
- ``slabs, pageable input``: the same from an ordinary NumPy array (page-locked in place for
  each call).

Throughput is input bytes per second; the slabbed result is checked against the one-shot run.

    PYTHONPATH=. python3 benchmarks/slab_bench.py [--apps heat3d,harris] [--planes 2048]
        [--slab-rows 128] [--repeat 3] [--larger-planes 34304]

``--larger-planes``: a volume whose inputs and outputs together exceed the GPU's memory,
streamed in slabs, against ``--planes`` that fit (copied in, one call, copied out).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def seconds(call, repeat: int) -> float:
    """Median wall seconds of ``call()`` (the device synchronised after each)."""
    import cupy

    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        cupy.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def bench(name: str, shape: tuple[int, ...], slab_rows: int | None, repeat: int) -> None:
    import cupy
    import cupyx

    from kfuse.apps import get_app
    from kfuse.scaleout import run_in_slabs

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    _, params = app.make_inputs(tuple(9 for _ in shape), np.random.default_rng(0), "float32")
    began = time.perf_counter()
    shapes = declared_shapes(graph, shape)
    inputs = {key: pinned_random(shapes[key]) for key in graph.inputs}
    outputs = {key: cupyx.empty_pinned(shapes[key], dtype=np.float32) for key in graph.outputs}
    gigabytes = sum(value.nbytes for value in inputs.values()) / 1e9
    print(f"== {name} {'x'.join(map(str, shape))}: {gigabytes:.1f} GB of inputs "
          f"(made in {time.perf_counter() - began:.0f} s)", flush=True)

    rows = {}
    # one slab's worth resident on the device: the kernels' own throughput
    slab = slab_rows or min(shape[0], 256)
    resident = {key: cupy.asarray(value[:slab] if value.shape == shape else value)
                for key, value in inputs.items()}
    compiled = pipeline.compile(backend="cuda")
    compiled(**resident, **params)
    rows["resident (kernels only)"] = seconds(lambda: compiled(**resident, **params),
                                              repeat) * shape[0] / slab

    def host_to_host() -> None:
        given = {key: cupy.asarray(value) for key, value in inputs.items()}
        results = compiled(**given, **params)
        for key, value in results.items():
            value.get(out=outputs[key])

    host_to_host()
    rows["fits, host to host"] = seconds(host_to_host, repeat)
    want = {key: value.copy() for key, value in outputs.items()}

    def slabs(given=inputs) -> dict:
        return run_in_slabs(pipeline, backend="cuda", slab_rows=slab_rows, out=outputs,
                            **given, **params)

    from kfuse.scaleout.host_slabs import default_slab_rows
    print(f"  slabs of {slab_rows or default_slab_rows(graph, shape, 'cuda', 3)} rows",
          flush=True)
    slabs()
    for key in want:
        error = float(np.max(np.abs(outputs[key] - want[key])))
        print(f"  slabs against one call: '{key}' differs by at most {error:.3g}", flush=True)
    rows["slabs (page-locked input)"] = seconds(slabs, repeat)
    pageable = {key: np.array(value) for key, value in inputs.items()}
    rows["slabs (pageable input)"] = seconds(lambda: slabs(pageable), repeat)
    from kfuse.scaleout.dask_arrays import compiled_pipelines
    for run in compiled_pipelines():  # (what the slabs' calls built and reused: a diagnosis)
        if run.graph is graph:
            print(f"  the slabs' compiled pipeline: {run.cache_info()}", flush=True)
    fits = rows["fits, host to host"]
    for label, value in rows.items():
        print(f"  {label:28s} {value * 1e3:10.1f} ms  {gigabytes / value:8.1f} GB/s  "
              f"{fits / value:6.2f}x of fits host-to-host", flush=True)


def declared_shapes(graph, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Every input's and output's shape as the pipeline declares it for a grid of ``shape``
    (a gain along the rows, a result per row), by name."""
    grid = next(graph.buffers[key].shape for key in graph.inputs
                if len(graph.buffers[key].shape) == len(shape))
    sizes = dict(zip(grid, shape, strict=True))
    sizes = graph.bind_shapes({key: tuple(sizes[symbol] for symbol in graph.buffers[key].shape)
                               for key in graph.inputs})
    return {key: tuple(sizes[symbol] for symbol in graph.buffers[key].shape)
            for key in (*graph.inputs, *graph.outputs)}


def pinned_random(shape: tuple[int, ...], pageable: bool = False) -> np.ndarray:
    """A page-locked (or ``pageable``) host array of random float32 values drawn on the
    device, 256 rows at a time."""
    import cupy
    import cupyx

    values = np.empty(shape, np.float32) if pageable else \
        cupyx.empty_pinned(shape, dtype=np.float32)
    for start in range(0, shape[0], 256):
        block = cupy.random.random((min(256, shape[0] - start), *shape[1:]), dtype=cupy.float32)
        block.get(out=values[start:start + len(block)])
    return values


def bench_larger(name: str, fits: tuple[int, ...], larger: tuple[int, ...], repeat: int) -> None:
    """Slabs through the GPU of a volume whose arrays exceed the GPU's memory, against the
    same pipeline on a volume that fits, copied in, computed in one call and copied out
    (throughput in input bytes per second; the larger run once warm, then timed)."""
    import cupy

    from kfuse.apps import get_app
    from kfuse.scaleout import run_in_slabs

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    _, params = app.make_inputs(tuple(9 for _ in fits), np.random.default_rng(0), "float32")
    compiled = pipeline.compile(backend="cuda")
    small = {key: pinned_random(fits) for key in graph.inputs}
    small_out = {key: np.empty(fits, np.float32) for key in graph.outputs}

    def host_to_host() -> None:
        results = compiled(**{key: cupy.asarray(value) for key, value in small.items()},
                          **params)
        for key, value in results.items():
            value.get(out=small_out[key])

    host_to_host()
    fits_rate = sum(value.nbytes for value in small.values()) / seconds(host_to_host, repeat)
    small.clear()
    small_out.clear()
    cupy.get_default_memory_pool().free_all_blocks()
    began = time.perf_counter()
    # (pageable: the driver would not page-lock 151 GB in one allocation on an H200 host
    # of 512 GiB; run_in_slabs locks them in place where it may, else stages their slabs)
    large = {key: pinned_random(larger, pageable=True) for key in graph.inputs}
    large_out = {key: np.empty(larger, dtype=np.float32) for key in graph.outputs}
    total = sum(value.nbytes for value in (*large.values(), *large_out.values()))
    free, device = cupy.cuda.runtime.memGetInfo()
    print(f"== {name}: {'x'.join(map(str, larger))}, inputs and outputs {total / 1e9:.1f} GB "
          f"against the GPU's {device / 1e9:.1f} GB ({total / device:.2f}x; made in "
          f"{time.perf_counter() - began:.0f} s)", flush=True)
    gigabytes = sum(value.nbytes for value in large.values()) / 1e9

    print(f"  fits ({'x'.join(map(str, fits))}), host to host: {fits_rate / 1e9:8.1f} GB/s",
          flush=True)
    for staged in (True, None):
        def slabs(staged=staged) -> None:
            run_in_slabs(pipeline, backend="cuda", out=large_out, staged=staged, **large,
                         **params)

        slabs()
        took = seconds(slabs, repeat)
        how = "staged" if staged else "locked in place where the driver lets it"
        print(f"  larger than the GPU, slabs ({how}): {took * 1e3:10.1f} ms  "
              f"{gigabytes / took:8.1f} GB/s  {gigabytes * 1e9 / took / fits_rate:6.2f}x of "
              "fits host-to-host", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--apps", default="heat3d,harris")
    parser.add_argument("--planes", type=int, default=2048, help="3-D: planes of 1024 x 1024")
    parser.add_argument("--rows", type=int, default=65536, help="2-D: rows of 32768")
    parser.add_argument("--slab-rows", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--larger-planes", type=int, default=None,
                        help="3-D apps: also stream planes of 1024 x 1024 whose inputs and "
                        "outputs exceed the GPU's memory, against --planes that fit")
    args = parser.parse_args()
    if args.larger_planes:
        for name in args.apps.split(","):
            bench_larger(name, (args.planes, 1024, 1024), (args.larger_planes, 1024, 1024),
                         args.repeat)
        return
    for name in args.apps.split(","):
        shape = (args.planes, 1024, 1024) if name in ("heat3d", "diffusion3d", "stencil27") \
            else (args.rows, 32768)
        bench(name, shape, args.slab_rows, args.repeat)


if __name__ == "__main__":
    main()
