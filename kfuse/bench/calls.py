"""What a call from Python costs: microseconds per call of ``Pipeline.run``, of the compiled
callable (with and without CUDA graphs) and of torch.compile's call of the same pipeline,
beside the time of the program's kernels alone.

Calls are enqueued back to back and the device is waited on once at the end, so a call
whose host work takes longer than its kernels shows its host time, and one whose kernels
take longer shows theirs: the difference to the kernels' own time is what the call adds.
The kernels' own time is measured without Python in the way: CUDA events around replays
of a CUDA graph holding many launches of the prepared program.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

SMALL_SIZES = {1: (65536,), 2: (256, 256), 3: (64, 64, 64)}  # "small": 2^16 elements


def small_size(app: Any) -> tuple[int, ...]:
    """The small size calls are measured at: 256² images, 2^16-element vectors, matrices of
    256² (2^16 elements), volumes of 64³."""
    if getattr(app, "ndim", None) == 1 or len(app.bench_size) == 1:
        return SMALL_SIZES[1]
    return SMALL_SIZES[len(app.bench_size)]


def synchronize() -> None:
    """Wait for the GPU (CuPy's and PyTorch's work)."""
    import cupy
    cupy.cuda.Device().synchronize()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:  # pragma: no cover - without PyTorch there is only CuPy's work
        pass


def per_call_us(call: Callable[[], object], seconds: float = 0.1, least: int = 20,
                wait: Callable[[], None] = synchronize, runs: int = 7) -> float:
    """Microseconds per call, calls enqueued back to back and waited on at the end (the
    median of ``runs`` runs of as many calls as take about ``seconds``)."""
    return interleaved_us({"call": call}, seconds, least, wait, runs)["call"]


def interleaved_us(calls: Mapping[str, Callable[[], object]], seconds: float = 0.1,
                   least: int = 20, wait: Callable[[], None] = synchronize, runs: int = 7
                   ) -> dict[str, float]:
    """:func:`per_call_us` of each of ``calls`` (by name), their runs taken in turn, round
    after round: the host's speed drifts by tens of percent over seconds on a shared
    machine, and rounds expose every call to the same drift."""
    counts = {}
    for name, call in calls.items():
        call()
        wait()
        start = time.perf_counter()
        call()
        wait()
        once = time.perf_counter() - start
        counts[name] = max(least, min(5000, int(seconds / max(once, 1e-6))))
    measured: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            count = counts[name]
            wait()
            start = time.perf_counter()
            for _ in range(count):
                call()
            wait()
            measured[name].append((time.perf_counter() - start) / count * 1e6)
    return {name: sorted(times)[len(times) // 2] for name, times in measured.items()}


def graph_time_us(call: Callable[[], object], calls: int = 50) -> float:
    """The device's time per ``call()`` alone, in microseconds: ``calls`` of them captured
    into one CUDA graph (what they enqueue on the current stream), its replays timed with
    CUDA events (median of five)."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for _ in range(calls):
                call()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        runs = []
        for _ in range(5):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return sorted(runs)[2]


def kernels_us(executable: Any, launches: int = 50) -> float:
    """The prepared program's kernels alone, in microseconds (:func:`graph_time_us`)."""
    executable.launch_all()
    return graph_time_us(executable.launch_all, launches)


def measure_calls(graph: Any, pipeline_run: Callable[..., Any], compile_pipeline: Callable,
                  given: Mapping[str, Any], executable: Any, plan: Any,
                  torch_compile: bool = True) -> dict[str, Any]:
    """Per-call microseconds of one pipeline on ``given`` (CuPy arrays and parameters):
    ``kernels_us`` (the program alone), ``run_us`` (``pipeline_run(**given)``),
    ``compiled_us`` and ``direct_us`` (the compiled callable with and without CUDA graphs),
    ``python_us`` (the compiled callable with the C call path off) and
    ``torch_compile_us`` (None with a note where it failed)."""
    compiled = compile_pipeline(plan=plan)
    direct = compile_pipeline(plan=plan, graphs=False)
    in_python = compile_pipeline(plan=plan, native=False)
    calls: dict[str, Callable[[], object]] = {
        "run_us": lambda: pipeline_run(plan=plan, **given),
        "compiled_us": lambda: compiled(**given),
        "direct_us": lambda: direct(**given),
        "python_us": lambda: in_python(**given)}
    row: dict[str, Any] = {"launches": len(executable.program.launches),
                           "kernels_us": kernels_us(executable), "torch_compile_us": None}
    if torch_compile:
        try:
            from kfuse.bench.torch_baseline import compiled_on
            baseline = compiled_on(graph, dict(given))
            baseline()  # compiles now: a failure here loses the column, not the row
            calls["torch_compile_us"] = baseline
        except Exception as error:  # a failing baseline must not lose the row
            row["note"] = f"torch.compile failed: {type(error).__name__}: {str(error)[:160]}"
    row.update(interleaved_us(calls))
    row["graph_replays"] = compiled.stats.graph_replays
    row["native_calls"] = compiled.stats.native
    return row
