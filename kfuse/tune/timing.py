"""Timing with CUDA events: warm-up, many runs, robust statistics, input-set rotation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Statistics of repeated runs, in seconds (``p10``/``p90``: 10th/90th percentiles)."""

    median_s: float
    min_s: float
    p10: float
    p90: float
    runs: int

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> Timing:
        values = np.asarray(samples, dtype=np.float64)
        if values.size == 0:
            raise ValueError("no timing samples")
        return cls(float(np.median(values)), float(values.min()),
                   float(np.percentile(values, 10)), float(np.percentile(values, 90)),
                   int(values.size))

    def __str__(self) -> str:
        return (f"{format_seconds(self.median_s)} median (min {format_seconds(self.min_s)}, "
                f"p10 {format_seconds(self.p10)}, p90 {format_seconds(self.p90)}, "
                f"{self.runs} runs)")


def format_seconds(seconds: float) -> str:
    """``1.234 ms``, ``56.7 us``, ``2.50 s``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def input_sets_needed(bytes_per_set: int, l2_bytes: int, *, limit: int = 8) -> int:
    """How many input sets to rotate so that repeated runs do not find their inputs in L2."""
    if bytes_per_set <= 0:
        return 1
    if bytes_per_set >= 2 * l2_bytes:
        return 1
    return max(1, min(limit, math.ceil(2 * l2_bytes / bytes_per_set) + 1))


def _cycle(rotate: Sequence[Callable[[], object]] | None, index: int) -> None:
    if rotate:
        rotate[index % len(rotate)]()


def time_gpu(fn: Callable[[], object], *, warmup: int = 5, repeat: int = 50,
             rotate: Sequence[Callable[[], object]] | None = None,
             max_seconds: float | None = 30.0) -> Timing:
    """Time ``fn`` on the GPU with CUDA events around each call; median of ``repeat`` runs.

    ``rotate``: one setup callable per input set (e.g. pointing the executable at another
    set); run ``i`` calls ``rotate[i % len(rotate)]()`` before ``fn``, outside the timed
    region, so repeated runs do not just measure L2. ``max_seconds`` caps slow cases:
    fewer runs (at least 3) are taken when one run is long.
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    for index in range(max(warmup, 0)):
        _cycle(rotate, index)
        fn()
    stream.synchronize()
    runs = max(int(repeat), 1)
    if max_seconds is not None:
        probe_start, probe_end = cupy.cuda.Event(), cupy.cuda.Event()
        _cycle(rotate, 0)
        probe_start.record(stream)
        fn()
        probe_end.record(stream)
        probe_end.synchronize()
        once = cupy.cuda.get_elapsed_time(probe_start, probe_end) * 1e-3
        if once > 0:
            runs = max(3, min(runs, int(max_seconds / once)))
    starts = [cupy.cuda.Event() for _ in range(runs)]
    ends = [cupy.cuda.Event() for _ in range(runs)]
    for index in range(runs):
        _cycle(rotate, index)
        starts[index].record(stream)
        fn()
        ends[index].record(stream)
    ends[-1].synchronize()
    samples = [cupy.cuda.get_elapsed_time(s, e) * 1e-3 for s, e in zip(starts, ends, strict=True)]
    return Timing.from_samples(samples)


def time_host(fn: Callable[[], object], *, warmup: int = 2, repeat: int = 10,
              rotate: Sequence[Callable[[], object]] | None = None,
              max_seconds: float | None = 30.0) -> Timing:
    """Wall-clock version of :func:`time_gpu` for host backends (``cpu``, ``numpy``)."""
    for index in range(max(warmup, 0)):
        _cycle(rotate, index)
        fn()
    samples: list[float] = []
    budget_start = time.perf_counter()
    for index in range(max(int(repeat), 1)):
        _cycle(rotate, index)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        if (max_seconds is not None and len(samples) >= 3
                and time.perf_counter() - budget_start > max_seconds):
            break
    return Timing.from_samples(samples)


def time_alternating(runs: Mapping[str, Callable[[], object]], rounds: int, *,
                     repeat: int = 30, warmup: int = 3,
                     timer: Callable[..., Timing] | None = None) -> dict[str, list[float]]:
    """Median ms of each labelled callable per round, the callables timed in turn each round.

    A difference of 1% between blocks of runs timed seconds apart can come from the order
    (clocks and temperature drift while the GPU works); alternating rounds tell a real
    difference from drift. ``timer``: :func:`time_gpu` (the default) or :func:`time_host`.
    """
    timer = timer or time_gpu
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, fn in runs.items():
            times[label].append(timer(fn, warmup=warmup, repeat=repeat).median_s * 1e3)
    return times


def time_in_turn(launches: Sequence[Callable[[], object]], *, rounds: int = 3,
                 warmup: int = 3, repeat: int = 10,
                 timer: Callable[..., Timing] | None = None) -> list[float]:
    """Seconds per call of each of ``launches``: the median over ``rounds`` rounds of each
    one's median, every round timing them all in turn (:func:`time_alternating`)."""
    times = time_alternating({str(i): launch for i, launch in enumerate(launches)},
                             max(rounds, 1), repeat=repeat, warmup=warmup, timer=timer)
    return [float(np.median(times[str(i)])) * 1e-3 for i in range(len(launches))]


def print_rounds(name: str, times: Mapping[str, list[float]], base: str) -> None:
    """One line per label: median of its rounds, its speed-up over ``base``, every round."""
    reference = float(np.median(times[base]))
    width = max(len(label) for label in times)
    for label, values in times.items():
        median = float(np.median(values))
        print(f"{name:11s} {label:{width}s} {median:.4f} ms  {reference / median:.4f}x {base}  "
              f"rounds {' '.join(f'{v:.4f}' for v in values)}", flush=True)
