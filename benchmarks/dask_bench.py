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
             steps: int = 0, per_exchange: int = 1, host: bool = False) -> float:
    """Median seconds of one call of app ``name`` over a Dask array of CuPy chunks (NumPy
    chunks on the cpu backend: a smoke test of this script without a GPU; ``host``: NumPy
    chunks on the cuda backend, each copied to its worker's GPU and its outputs back: a
    scene held in host memory)."""
    import dask.array as da
    from distributed import get_task_stream, wait

    from kfuse.apps import get_app
    from kfuse.scaleout import iterate, persist_in_bands

    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    _, params = app.make_inputs(tuple(9 for _ in size), np.random.default_rng(0), "float32")
    if backend == "cuda" and not host:
        import cupy
        state = da.random.RandomState(RandomState=cupy.random.RandomState)
    else:
        state = da.random.RandomState()
    # every input by its declared shape (a gain along the columns, a value per row): the
    # grid's axes named by the first input of the grid's rank
    grid = next(graph.buffers[key].shape for key in graph.inputs
                if len(graph.buffers[key].shape) == len(size))
    axes = {symbol: axis for axis, symbol in enumerate(grid)}
    arrays = {}
    for key in graph.inputs:
        along = [axes[symbol] for symbol in graph.buffers[key].shape]
        array = state.random_sample(tuple(size[a] for a in along),
                                    chunks=tuple(chunks[a] for a in along))
        arrays[key] = persist_in_bands(array.astype("float32"), client)
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


def time_direct(name: str, size: tuple[int, ...], chunks: tuple[int, ...], repeat: int,
                backend: str = "cuda") -> str:
    """The GPU work of one chunked call without Dask, in this process on one GPU, by the
    chunk task's own code (``kfuse.scaleout.dask_arrays.ChunkTask``) over chunks of
    ``chunks[0]`` rows: each chunk joined with its neighbours' halos and computed, and each
    computed as it lies with its edge rows patched from strips; and the whole array in one
    call. Medians of ``repeat`` (on the cpu backend: NumPy arrays, wall time; a smoke
    test)."""
    from kfuse.apps import get_app
    from kfuse.scaleout.dask_arrays import (
        PERIODIC_MODES,
        ChunkTask,
        axis_modes,
        chunk_graph,
        compiled_once,
        grown_pieces,
        halo_depths,
        joined_pieces,
        planned_once,
        terminal_reductions,
    )
    if backend == "cuda":
        import cupy as xp

        from kfuse.tune.timing import time_gpu

        def median_ms(run) -> float:
            return time_gpu(run, repeat=repeat).median_ms
    else:
        xp = np

        def median_ms(run) -> float:
            times = []
            for _ in range(repeat):
                began = time.perf_counter()
                run()
                times.append((time.perf_counter() - began) * 1e3)
            return float(np.median(times))

    app = get_app(name)
    graph = app.build().graph()
    _, params = app.make_inputs(tuple(9 for _ in size), np.random.default_rng(0), "float32")
    pieces_graph = chunk_graph(graph)
    depth = {axis: max(reach) if axis == 0 else 0
             for axis, reach in enumerate(halo_depths(graph))}
    periodic = {axis: bool(modes & PERIODIC_MODES)
                for axis, modes in enumerate(axis_modes(graph, len(size)))}
    count = -(-size[0] // chunks[0])
    grid = (count,) + (1,) * (len(size) - 1)
    plan = planned_once(pieces_graph, (chunks[0] + 2 * depth[0], *size[1:]))
    task = ChunkTask(pieces_graph, backend, plan, params, depth, periodic, list(grid),
                      terminal_reductions(graph), patch_edges=True)
    whole = {key: xp.random.random_sample(size).astype(xp.float32)
             for key in pieces_graph.inputs}
    blocks = {key: [value[at * chunks[0]:(at + 1) * chunks[0]] for at in range(count)]
              for key, value in whole.items()}
    grown = {location: [grown_pieces(lambda at, cut, key=key: (blocks[key][at[0]], cut),
                                      grid, location, task.depth, task.periodic)
                        for key in pieces_graph.inputs] for location in np.ndindex(grid)}

    def joined() -> None:
        for location, pieces in grown.items():
            task.outputs(location, [joined_pieces(part, 0) for part in pieces])

    def patched() -> None:
        for location, pieces in grown.items():
            task.from_pieces(location, False, *pieces)

    timings = {}
    for label, run in (("joined", joined), ("patched", patched)):
        run()
        timings[label] = median_ms(run)
    one = compiled_once(pieces_graph, backend, "auto", size)
    one(**whole, **params)
    whole_ms = median_ms(lambda: one(**whole, **params))
    return (f"    without Dask on one {'GPU' if backend == 'cuda' else 'host'}, {count} chunks: joined with their halos "
            f"{timings['joined']:.2f} ms, patched from strips {timings['patched']:.2f} ms; "
            f"the whole array in one call {whole_ms:.2f} ms")


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
    parser.add_argument("--host", action="store_true",
                        help="NumPy chunks in host memory on the cuda backend (each chunk "
                        "copied to its worker's GPU, its outputs copied back)")
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
                if args.direct and gpus == 1:
                    print(time_direct(name, size, chunks, 20, args.backend), flush=True)
                seconds = time_app(client, name, size, chunks, args.repeat, args.backend,
                                   args.calls, args.tasks, args.steps, args.per_exchange,
                                   args.host)
                results[(name, gpus)] = seconds
                one = results.get((name, 1))
                print(f"{name} {'x'.join(map(str, size))} in chunks {'x'.join(map(str, chunks))}"
                      f"{' (host memory)' if args.host else ''} on {gpus} GPU(s), {args.calls} "
                      f"call(s) in flight: {seconds:.4f} s "
                      f"per call" + (f", {one / seconds:.2f}x one GPU" if one else ""),
                      flush=True)


if __name__ == "__main__":
    main()
