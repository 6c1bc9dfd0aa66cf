"""A kfuse pipeline over Dask arrays of CuPy chunks on one and on two GPUs, in one run
(GPU benchmark for kfuse.scaleout; issue 32's "two GPUs: >= 1.8x one GPU").

One worker process per GPU (a ``distributed`` cluster whose workers each see one GPU
through ``CUDA_VISIBLE_DEVICES``; dask-cuda's ``LocalCUDACluster`` does the same). The input
is drawn on the workers (CuPy chunks, never on the host), persisted in bands
(``kfuse.scaleout.persist_in_bands``: each worker a run of consecutive chunks), then the pipeline's
outputs are persisted on the workers (nothing gathered to the client) and timed after a
warm-up call that compiles the pipeline once per worker. ``--calls N`` submits N calls
over the same inputs before waiting for them (a stream of frames: the throughput, with
Dask's per-task latency overlapped with the GPUs' work). Prints seconds per call and the
speed-up of each GPU count over one.

Usage on the device machine (repo root; Dask installed from carried wheels)::

    PYTHONPATH=. python3 benchmarks/dask_bench.py --gpus 1,2 [--apps harris,heat3d]
        [--size2d 32768] [--size3d 1024] [--chunks2d 8192] [--chunks3d 256] [--repeat 3]
        [--calls 1] [--steps 8 --per-exchange 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def cluster_of(gpus: int):
    """A local cluster of one single-threaded worker process per GPU, each seeing its own
    GPU first and the others after it (as dask-cuda's ``LocalCUDACluster`` sets
    ``CUDA_VISIBLE_DEVICES``: halos then go device to device). No host memory limit: the
    chunks live in GPU memory, and a limit would have Dask spill them to disk by the bytes
    it counts (dask-cuda's ``device_memory_limit`` is the GPU's own)."""
    from distributed import Nanny, Scheduler, SpecCluster

    def visible(own: int) -> str:
        return ",".join(str((own + step) % gpus) for step in range(gpus))

    workers = {f"gpu{i}": {"cls": Nanny, "options": {
        "nthreads": 1, "memory_limit": 0, "env": {"CUDA_VISIBLE_DEVICES": visible(i)}}}
        for i in range(gpus)}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {
        "dashboard_address": None}})


def time_app(client, name: str, size: tuple[int, ...], chunks: tuple[int, ...],
             repeat: int, backend: str = "cuda", calls: int = 1, tasks: bool = False,
             steps: int = 0, per_exchange: int = 1) -> float:
    """Median seconds of one call of app ``name`` over a Dask array of CuPy chunks (NumPy
    chunks on the cpu backend: a smoke test of this script without a GPU)."""
    import dask.array as da
    from distributed import get_task_stream, wait

    from kfuse.apps import get_app
    from kfuse.scaleout import iterate, persist_in_bands

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    _, params = app.make_inputs(tuple(9 for _ in size), np.random.default_rng(0), "float32")
    if backend == "cuda":
        import cupy
        state = da.random.RandomState(RandomState=cupy.random.RandomState)
    else:
        state = da.random.RandomState()
    arrays = {key: persist_in_bands(state.random_sample(size, chunks=chunks).astype("float32"),
                                    client) for key in graph.inputs}
    wait(list(arrays.values()))
    def one_call() -> dict:
        if not steps:
            return pipeline.run(backend=backend, **arrays, **params)
        # a time loop: steps calls, each output fed back, halos exchanged every per_exchange
        (only_input,), (only_output,) = graph.inputs, graph.outputs
        return iterate(pipeline, steps, {only_output: only_input}, backend=backend,
                       calls_per_exchange=per_exchange, **arrays, **params)

    times = []
    for index in range(repeat + 1):  # the first round compiles on every worker
        with get_task_stream(client) as stream:
            began = time.perf_counter()
            persisted = []
            for _ in range(calls if index else 1):
                outputs = one_call()
                persisted += [value.persist() for value in outputs.values()]
            submitted = time.perf_counter()
            wait(persisted)
            if backend == "cuda":  # the GPUs' work done, not only the tasks that queued it
                client.run(_synchronised)
            if index:
                times.append((time.perf_counter() - began) / calls)
        del persisted
    if tasks:
        print(f"    the client: {(submitted - began) / calls * 1e3:.2f} ms per call to submit")
        print_task_stream(stream.data, calls)
    times.sort()
    return times[len(times) // 2]


def time_direct(name: str, size: tuple[int, ...], chunks: tuple[int, ...], repeat: int) -> str:
    """The GPU work of one chunked call without Dask, in this process on one GPU: each chunk
    grown by its halo (joined with its neighbours' slices, as a chunk task does), then the
    pipeline's compiled call on it; and the whole array in one call. Median of ``repeat``."""
    import cupy

    from kfuse.apps import get_app
    from kfuse.scaleout.dask_arrays import chunk_graph, compiled_once, halo_depths
    from kfuse.tune.timing import time_gpu

    app = get_app(name)
    graph = app.build().graph()
    _, params = app.make_inputs(tuple(9 for _ in size), np.random.default_rng(0), "float32")
    depth = max(halo_depths(graph)[0])
    whole = {key: cupy.random.random_sample(size, dtype=cupy.float32) for key in graph.inputs}
    rows = list(range(0, size[0], chunks[0]))
    grown = [(max(start - depth, 0), min(start + chunks[0] + depth, size[0])) for start in rows]
    pieces = chunk_graph(graph)
    runs = {(low, high): compiled_once(pieces, "cuda", "auto", (high - low, *size[1:]))
            for low, high in grown}

    def chunked() -> None:
        for low, high in grown:
            joined = {key: cupy.concatenate([value[low:low + depth], value[low + depth:high]])
                      for key, value in whole.items()}
            runs[(low, high)](**joined, **params)

    chunked()
    joined_ms = time_gpu(chunked, repeat=repeat).median_ms
    one = compiled_once(pieces, "cuda", "auto", size)
    one(**whole, **params)
    whole_ms = time_gpu(lambda: one(**whole, **params), repeat=repeat).median_ms
    return (f"    without Dask on one GPU: chunks grown and computed {joined_ms:.2f} ms, the "
            f"whole array in one call {whole_ms:.2f} ms")


def _synchronised() -> None:
    import cupy
    cupy.cuda.runtime.deviceSynchronize()


def print_task_stream(records: list[dict], calls: int) -> None:
    """Per worker and kind of task (its key's prefix), the tasks' count and seconds per call,
    computing and receiving data, from Dask's task stream of the last round."""
    from dask.utils import key_split

    spent: dict[tuple[str, str, str], list[float]] = {}
    for record in records:
        for step in record.get("startstops", ()):
            entry = spent.setdefault((record["worker"], key_split(record["key"]),
                                      step["action"]), [0, 0.0])
            entry[0] += 1
            entry[1] += step["stop"] - step["start"]
    for (worker, prefix, action), (count, seconds) in sorted(spent.items()):
        print(f"    {worker[-6:]:>6} {prefix[:40]:40} {action:9} {count / calls:5.1f} per call "
              f"{seconds / calls * 1e3:8.2f} ms per call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--apps", default="harris,heat3d")
    parser.add_argument("--size2d", type=int, default=32768)
    parser.add_argument("--size3d", type=int, default=1024)
    parser.add_argument("--chunks2d", default="8192,32768",
                        help="a chunk's shape (comma-separated; one number: a cube)")
    parser.add_argument("--chunks3d", default="256,1024,1024")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1,
                        help="calls submitted before waiting (seconds are per call)")
    parser.add_argument("--backend", default="cuda", help="cpu: NumPy chunks (a smoke test)")
    parser.add_argument("--direct", action="store_true",
                        help="also time the chunks' GPU work without Dask (cuda)")
    parser.add_argument("--steps", type=int, default=0,
                        help="a call is a time loop of this many pipeline calls, each output "
                        "fed back (apps of one input and one output; kfuse.scaleout.iterate)")
    parser.add_argument("--per-exchange", type=int, default=1,
                        help="with --steps: calls per halo exchange (calls_per_exchange)")
    parser.add_argument("--tasks", action="store_true",
                        help="print where the last round's tasks spent their time")
    args = parser.parse_args()
    from distributed import Client

    from kfuse.apps import get_app

    results: dict[tuple[str, int], float] = {}
    for gpus in [int(g) for g in args.gpus.split(",")]:
        with cluster_of(gpus) as cluster, Client(cluster) as client:
            for name in args.apps.split(","):
                ndim = get_app(name).ndim
                size = (args.size2d,) * 2 if ndim == 2 else (args.size3d,) * 3
                given = [int(n) for n in (args.chunks2d if ndim == 2 else args.chunks3d)
                         .split(",")]
                chunks = tuple(given * ndim if len(given) == 1 else given)
                if args.direct and gpus == 1 and args.backend == "cuda":
                    print(time_direct(name, size, chunks, 20), flush=True)
                seconds = time_app(client, name, size, chunks, args.repeat, args.backend,
                                   args.calls, args.tasks, args.steps, args.per_exchange)
                results[(name, gpus)] = seconds
                one = results.get((name, 1))
                print(f"{name} {'x'.join(map(str, size))} on {gpus} GPU(s), {args.calls} "
                      f"call(s) in flight: {seconds:.4f} s "
                      f"per call" + (f", {one / seconds:.2f}x one GPU" if one else ""),
                      flush=True)


if __name__ == "__main__":
    main()
