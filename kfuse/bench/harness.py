"""Benchmark apps: kfuse against the DRAM floor and PyTorch baselines, on one GPU, in one run.

For each app: build the float32 pipeline, make random inputs on the device (several sets
when one set fits in L2), prepare the kfuse executable and time ``launch_all``; run PyTorch
eager and ``torch.compile`` on the very same arrays (zero-copy), check kfuse's result
against eager, time each generated kernel alone with its own DRAM traffic, and compare
everything with the floor at the measured copy bandwidth. BLAS sequences (Filipovič et al. 2015) are
also timed as their cuBLAS call sequence (``kfuse.bench.cublas_baseline``), and apps with
a ``planner`` (the BLAS apps: the implementation space of ``kfuse.search.variants``) get
their plan from it; ``autotune=k`` times the k best-predicted implementations and keeps
the fastest.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import Any

import numpy as np

from kfuse.bench.floor import dram_floor_bytes, floor_seconds, launch_bytes
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile, current_profile
from kfuse.runtime.binding import to_numpy
from kfuse.tune.timing import Timing, input_sets_needed, time_gpu, time_host

ERROR_TOLERANCE = 1e-4
# Halide computes the integer outputs of its apps in float32 too: one step of 16 bits apart
HALIDE_TOLERANCE = 2e-4
BASELINES = ("torch eager", "torch.compile", "cublas", "halide")


@dataclass
class KernelRow:
    """One generated kernel of the unfused program, timed alone."""

    name: str
    operators: tuple[str, ...]
    ms: float
    bytes: int
    gbps: float
    fraction_of_copy: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelRow:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["operators"] = tuple(values.get("operators", ()))
        return cls(**values)


@dataclass
class BenchRow:
    """Results of one app at one size on one device (times in milliseconds)."""

    app: str
    size: tuple[int, ...]
    device: str
    backend: str = "cuda"
    kfuse_ms: float | None = None        # the fused plan
    unfused_ms: float | None = None      # one kernel per operator
    plan_groups: list[list[str]] = field(default_factory=list)
    floor_ms: float | None = None
    floor_bytes: int = 0
    eager_ms: float | None = None
    compile_ms: float | None = None
    max_error: float | None = None  # kfuse vs torch eager: max|a - b| / max|b|
    compile_error: float | None = None  # torch.compile vs torch eager
    kernels: list[KernelRow] = field(default_factory=list)
    launches: int = 0
    input_sets: int = 1
    compile_mode: str | None = None
    copy_gbps: float | None = None
    bandwidth_measured: bool = True
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cublas_ms: float | None = None       # the app's cuBLAS call sequence (BLAS apps)
    cublas_error: float | None = None    # cuBLAS vs kfuse: max|a - b| / max|b|
    cublas_calls: str | None = None
    autotune: list[dict[str, Any]] = field(default_factory=list)  # implementations timed
    halide_ms: float | None = None       # Halide's own manual GPU schedule (pyramid apps)
    halide_auto_ms: float | None = None  # the fastest of Halide's GPU autoschedulers
    halide_auto: str | None = None       # which autoscheduler that was
    halide_error: float | None = None    # Halide vs kfuse (max over schedules), away from
    # the borders where Halide's boundary handling differs (kfuse.bench.halide_baseline)
    # a call from Python, in microseconds per call (kfuse.bench.calls), at the benchmark
    # size and at a small one: one dict per size
    calls: list[dict[str, Any]] = field(default_factory=list)

    # -- derived figures ---------------------------------------------------------------------
    @property
    def kfuse_gbps(self) -> float | None:
        """Effective bandwidth: floor bytes / kfuse time."""
        return _ratio(self.floor_bytes / 1e9, self.kfuse_ms and self.kfuse_ms / 1e3)

    @property
    def kfuse_over_floor(self) -> float | None:
        return _ratio(self.kfuse_ms, self.floor_ms)

    @property
    def eager_over_kfuse(self) -> float | None:
        return _ratio(self.eager_ms, self.kfuse_ms)

    @property
    def compile_over_kfuse(self) -> float | None:
        return _ratio(self.compile_ms, self.kfuse_ms)

    @property
    def cublas_over_kfuse(self) -> float | None:
        return _ratio(self.cublas_ms, self.kfuse_ms)

    @property
    def halide_over_kfuse(self) -> float | None:
        return _ratio(self.halide_ms, self.kfuse_ms)

    @property
    def halide_auto_over_kfuse(self) -> float | None:
        return _ratio(self.halide_auto_ms, self.kfuse_ms)

    @property
    def fusion_speedup(self) -> float | None:
        """Unfused time over fused time."""
        return _ratio(self.unfused_ms, self.kfuse_ms)

    @property
    def unfused_over_floor(self) -> float | None:
        return _ratio(self.unfused_ms, self.floor_ms)

    @property
    def error_ok(self) -> bool | None:
        if self.max_error is None:
            return None
        return bool(self.max_error <= ERROR_TOLERANCE)

    @property
    def kernels_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["size"] = list(self.size)
        for name in ("kfuse_gbps", "kfuse_over_floor", "eager_over_kfuse",
                     "compile_over_kfuse", "error_ok", "fusion_speedup", "unfused_over_floor",
                     "cublas_over_kfuse", "halide_over_kfuse", "halide_auto_over_kfuse"):
            data[name] = getattr(self, name)
        return _finite(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRow:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["size"] = tuple(values.get("size", ()))
        values["kernels"] = [KernelRow.from_dict(k) for k in values.get("kernels", [])]
        return cls(**values)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as None (and strings for +-inf errors)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Where things run: cuda (CuPy arrays, CUDA events) or cpu (NumPy arrays, wall clock)
# ---------------------------------------------------------------------------------------------

@dataclass
class _Env:
    backend: str
    xp: Any
    timer: Callable[..., Timing]
    torch_device: str

    def free(self) -> None:
        if self.backend == "cuda":
            try:
                self.xp.get_default_memory_pool().free_all_blocks()
            except Exception:  # pragma: no cover - best effort
                pass
            try:
                import torch
                torch.cuda.empty_cache()
            except Exception:  # pragma: no cover - best effort
                pass


def _env(backend: str) -> _Env:
    if backend == "cuda":
        from kfuse.runtime.cuda_backend import _cupy
        return _Env("cuda", _cupy(), time_gpu, "cuda")
    return _Env(backend, np, time_host, "cpu")


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def _as_size(size: int | Sequence[int] | None, app: Any) -> tuple[int, ...]:
    if size is None:
        return tuple(int(s) for s in app.bench_size)
    if isinstance(size, int):
        return (int(size),) * int(getattr(app, "ndim", len(app.bench_size)))
    return tuple(int(s) for s in size)


def device_inputs(app: Any, graph, size: tuple[int, ...], sets: int | None, xp: Any,
                  l2_bytes: int, *, seed: int = 0
                  ) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """Random input sets made on the device, with the value ranges of ``app.make_inputs``.

    A small probe from ``app.make_inputs`` gives names, dtypes, value ranges and parameters;
    the arrays themselves are drawn with ``xp.random`` at the full size. When an input's
    shape cannot be derived from ``size``, the app's own generator runs on the host.
    Returns (sets, params, how).
    """
    probe_size = tuple(getattr(app, "test_size", None) or size)
    probe, params = app.make_inputs(probe_size, np.random.default_rng(seed), "float32")
    sized = getattr(app, "parameters", None)
    params = (sized(size) if sized is not None else None) or params  # (1 / n at this size)
    symbols: dict[str, int] = {}
    for name in graph.inputs:
        if len(graph.buffers[name].shape) == len(size):
            symbols = dict(zip(graph.buffers[name].shape, size, strict=True))
            break
    shapes = {}
    for name in graph.inputs:
        shape = graph.buffers[name].shape
        if not all(symbol in symbols for symbol in shape):
            shapes = None
            break
        shapes[name] = tuple(symbols[symbol] for symbol in shape)
    if shapes is None:
        host, params = app.make_inputs(size, np.random.default_rng(seed), "float32")
        first = {name: xp.asarray(host[name]) for name in graph.inputs}
        set_bytes = sum(int(a.nbytes) for a in first.values())
        count = sets or input_sets_needed(set_bytes, l2_bytes)
        result = [first] + [{name: xp.asarray(host[name]).copy() for name in graph.inputs}
                            for _ in range(count - 1)]
        return result, params, "host (app.make_inputs)"
    set_bytes = sum(math.prod(shapes[n]) * np.dtype(probe[n].dtype).itemsize
                    for n in graph.inputs)
    count = sets or input_sets_needed(set_bytes, l2_bytes)
    state = _random_state(xp, seed)
    result = []
    for _ in range(count):
        result.append({name: _draw(xp, state, np.asarray(probe[name]), shapes[name])
                       for name in graph.inputs})
    return result, params, f"device ({xp.__name__}.random)"


def _random_state(xp: Any, seed: int) -> Any:
    if xp is np:
        return np.random.default_rng(seed)
    return xp.random.RandomState(seed)


def _draw(xp: Any, state: Any, probe: np.ndarray, shape: tuple[int, ...]) -> Any:
    """Uniform random values in the probe's range, with its dtype."""
    dtype = probe.dtype
    if dtype == np.bool_:
        return _uniform(xp, state, 0.0, 1.0, shape) < 0.5
    low = float(probe.min()) if probe.size else 0.0
    high = float(probe.max()) if probe.size else 1.0
    if np.issubdtype(dtype, np.integer):
        values = xp.floor(_uniform(xp, state, low, high + 1.0, shape))
        return xp.clip(values, low, high).astype(dtype)
    if high <= low:
        return xp.full(shape, low, dtype=dtype)
    return _uniform(xp, state, low, high, shape).astype(dtype, copy=False)


def _uniform(xp: Any, state: Any, low: float, high: float, shape: tuple[int, ...]) -> Any:
    if xp is np:
        return state.uniform(low, high, size=shape).astype(np.float32)
    return state.uniform(low, high, size=shape, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def max_relative_error(result: Any, reference: Any) -> float:
    """``max|result - reference| / max|reference|`` in float64 (fraction differing for bool).

    Either argument may be a NumPy or CuPy array or a torch tensor; with torch the
    computation stays on the tensor's device. NaN or infinity anywhere gives ``inf``.
    """
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and (isinstance(result, torch.Tensor) or isinstance(reference,
                                                                             torch.Tensor)):
        device = reference.device if isinstance(reference, torch.Tensor) else result.device
        a = torch.as_tensor(result, device=device)
        b = torch.as_tensor(reference, device=device)
        if a.shape != b.shape:
            raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        if a.dtype == torch.bool or b.dtype == torch.bool:
            return float((a != b).double().mean().item()) if a.numel() else 0.0
        a, b = a.double(), b.double()
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            return math.inf
        scale = float(b.abs().max().item()) if b.numel() else 0.0
        error = float((a - b).abs().max().item()) if b.numel() else 0.0
    else:
        a, b = to_numpy(result), to_numpy(reference)
        if a.shape != b.shape:
            raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
        if a.dtype == np.bool_ or b.dtype == np.bool_:
            return float(np.mean(a != b)) if a.size else 0.0
        a, b = a.astype(np.float64), b.astype(np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return math.inf
        scale = float(np.abs(b).max()) if b.size else 0.0
        error = float(np.abs(a - b).max()) if b.size else 0.0
    return error / scale if scale > 0 else error


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------

def bench_apps(names: Sequence[Any], *, backend: str = "cuda",
               size: int | Sequence[int] | None = None, profile: DeviceProfile | None = None,
               baselines: bool | Sequence[str] = True, progress: bool = True, warmup: int = 5,
               repeat: int = 50, sets: int | None = None, seed: int = 0,
               compile_mode: str | None = None,
               program: Callable[[Any], Any] | None = None,
               autotune: int = 0, calls: bool = True) -> list[BenchRow]:
    """Benchmark apps (names from :mod:`kfuse.apps`, or ``App`` objects); one row each.

    ``size`` defaults to each app's ``bench_size``; ``profile`` to a fresh calibration on
    the cuda backend (the floor is measured in the same run), else the stored/default one.
    ``baselines``: True for both, False for none, or a subset of :data:`BASELINES`.
    ``compile_mode`` overrides :data:`~kfuse.bench.torch_baseline.COMPILE_MODE`.
    ``program(graph) -> Program`` picks what kfuse runs (e.g. a fused plan's code); left
    out, the unfused program. Kernel rows always time the unfused program's kernels.
    ``sets`` overrides how many input sets are rotated. ``autotune=k`` (k > 0) times the
    k best-predicted implementations of :mod:`kfuse.search.variants` and runs the fastest.
    ``calls``: on the GPU, also time a call from Python at the benchmark size and a small
    one (:mod:`kfuse.bench.calls`). An app that fails gets a row whose notes say why; the others still run.
    """
    if baselines is True:
        chosen = BASELINES
    elif not baselines:
        chosen = ()
    else:
        chosen = tuple(baselines)
        unknown = sorted(set(chosen) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; choose from {BASELINES}")
    env = _env(backend)
    if profile is None:
        profile = _profile_now(env, progress)
    rows = []
    with _progress(progress) as bar:
        for entry in names:
            app = _resolve(entry)
            task = bar.add_task(f"{app.name}", total=None) if bar is not None else None

            def status(text: str, name: str = app.name, task: Any = task) -> None:
                if bar is not None:
                    bar.update(task, description=f"{name}: {text}")
                    if not sys.stdout.isatty():  # (a log: rich draws no bar into it)
                        print(f"[{time.strftime('%H:%M:%S')}] {name}: {text}", flush=True)

            row = BenchRow(app.name, _as_size(size, app), profile.name, backend,
                           copy_gbps=profile.copy_bandwidth_bytes_per_s / 1e9,
                           bandwidth_measured=profile.measured)
            try:
                _bench_one(app, row, env, profile, baselines=chosen, status=status,
                           warmup=warmup, repeat=repeat, sets=sets, seed=seed,
                           compile_mode=compile_mode, program=program, autotune=autotune,
                           calls=calls)
            except Exception as error:  # one failing app must not lose the others
                row.notes.append(f"failed: {type(error).__name__}: {error}")
                frames = traceback.extract_tb(error.__traceback__)
                if frames:
                    row.notes.append(f"raised at {frames[-1].filename}:{frames[-1].lineno} "
                                     f"in {frames[-1].name}")
            finally:
                env.free()
            if bar is not None:
                bar.update(task, description=f"{app.name}: done", total=1, completed=1)
            rows.append(row)
    return rows


def _resolve(entry: Any) -> Any:
    if isinstance(entry, str):
        from kfuse.apps import get_app
        return get_app(entry)
    return entry


def _profile_now(env: _Env, progress: bool) -> DeviceProfile:
    if env.backend != "cuda":
        return current_profile()
    from kfuse.tune.calibrate import calibrate
    profile = calibrate(progress=progress)
    try:
        profile.save()
    except OSError:  # pragma: no cover - read-only cache: keep going
        pass
    return profile


def _progress(enabled: bool):
    if not enabled:
        return nullcontext(None)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())


def _timing_dict(timing: Timing) -> dict[str, float]:
    return {"median_s": timing.median_s, "min_s": timing.min_s, "p10": timing.p10,
            "p90": timing.p90, "runs": timing.runs}


# kfuse, its unfused program and the baselines are timed in turn, in this many rounds of
# repeat / BENCH_ROUNDS runs each: one block of runs per program seconds apart let drift
# (clocks, temperature) and a passing disturbance decide between programs within 0.5% of
# each other (docs/journal/benchmarks.md, sessions 7 and 17).
BENCH_ROUNDS = 5
# the row's field of each timed program's median, in ms
_TIMED_FIELDS = {"kfuse": "kfuse_ms", "kfuse unfused": "unfused_ms", "torch eager": "eager_ms",
                 "torch.compile": "compile_ms", "cublas": "cublas_ms",
                 "halide manual": "halide_ms"}
# label -> (run, input-set setters, timer or None for the environment's): a program that
# runs outside the environment's stream (Halide's own CUDA context) brings its own timer
Timed = dict[str, tuple[Callable[[], object], list[Callable[[], None]],
                        Callable[..., Timing] | None]]


def _time_side_by_side(row: BenchRow, env: _Env, timed: Timed, *, warmup: int,
                       repeat: int) -> None:
    """Each program of ``timed`` (label -> (run, input-set setters)) in BENCH_ROUNDS rounds,
    all of them in turn each round; the row gets the median of each one's round medians
    (and the smallest, the median 10th and 90th percentiles, the runs). A baseline that
    fails while timed is dropped with a note; kfuse's own failures propagate."""
    rounds = max(1, min(BENCH_ROUNDS, repeat))
    per_round = max(1, repeat // rounds)
    results: dict[str, list[Timing]] = {label: [] for label in timed}
    for _ in range(rounds):
        for label, (run, rotate, timer) in list(timed.items()):
            try:
                results[label].append((timer or env.timer)(run, warmup=warmup,
                                                           repeat=per_round, rotate=rotate))
            except Exception as error:  # a broken baseline must not lose the row
                if label.startswith("kfuse"):
                    raise
                row.notes.append(_failure(f"{label} failed while timed", error))
                del timed[label], results[label]
    for label, timings in results.items():
        timing = Timing(float(np.median([t.median_s for t in timings])),
                        min(t.min_s for t in timings),
                        float(np.median([t.p10 for t in timings])),
                        float(np.median([t.p90 for t in timings])),
                        sum(t.runs for t in timings))
        row.timings[label] = _timing_dict(timing)
        if label in _TIMED_FIELDS:
            setattr(row, _TIMED_FIELDS[label], timing.median_s * 1e3)


def _failure(what: str, error: Exception) -> str:
    """A row's note: ``what``, the error's type and the first line of its message."""
    text = str(error).strip()
    return f"{what}: {type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _bench_one(app: Any, row: BenchRow, env: _Env, profile: DeviceProfile, *,
               baselines: tuple[str, ...],
               status: Callable[[str], None], warmup: int, repeat: int, sets: int | None,
               seed: int, compile_mode: str | None = None,
               program: Callable[[Any], Any] | None = None, autotune: int = 0,
               calls: bool = True) -> None:
    from kfuse.runtime import get_backend

    status("building")
    graph = app.build(dtype="float32").graph()
    status("making inputs")
    input_sets, params, how = device_inputs(app, graph, row.size, sets, env.xp,
                                            profile.l2_bytes, seed=seed)
    row.input_sets = len(input_sets)
    row.notes.append(f"inputs made on the {how}; {len(input_sets)} set(s) rotated")
    if not profile.measured:
        row.notes.append("floor uses nominal (not measured) copy bandwidth")

    status("compiling kfuse")
    backend = get_backend(env.backend)
    plan_of_row: Any = None  # a program given by hand is not called through a pipeline
    given = {**input_sets[0], **params}
    unfused = backend.prepare(graph, given)
    sizes = unfused.bound.sizes
    if program is not None:
        chosen = program(graph)
        executable = backend.prepare(graph, given, program=chosen)
        row.notes.append(f"kfuse runs program '{chosen.name}' ({len(chosen.launches)} "
                         "launches)")
    else:
        began = time.perf_counter()
        status("planning")
        plan = _choose_plan(app, graph, given, sizes, profile, env, row, autotune)
        row.notes.append(f"planned in {time.perf_counter() - began:.1f} s")
        row.plan_groups = [list(group.members) for group in plan.groups]
        status(f"compiling the plan's program ({len(plan.kernel_groups)} kernels)")
        executable = backend.prepare(graph, given, plan=plan)
        plan_of_row = plan
    row.floor_bytes = dram_floor_bytes(graph, sizes)
    row.floor_ms = floor_seconds(row.floor_bytes, profile) * 1e3
    row.launches = len(executable.program.launches)
    rotate = [_setter(executable, one) for one in input_sets]
    executable.launch_all()
    outputs = {name: executable.buffers[name].copy() for name in graph.outputs}

    unfused_rotate = [_setter(unfused, one) for one in input_sets]
    unfused_rotate[0]()  # the input set the fused outputs were computed from
    unfused.launch_all()
    for name in graph.outputs:
        error = max_relative_error(unfused.buffers[name], outputs[name])
        if error > ERROR_TOLERANCE:
            row.notes.append(f"unfused and fused '{name}' differ: {error:.1e}")
    timed: Timed = {"kfuse": (executable.launch_all, rotate, None),
                    "kfuse unfused": (unfused.launch_all, unfused_rotate, None)}
    if set(baselines) & {"torch eager", "torch.compile"}:
        _bench_torch(graph, row, env, input_sets, params, outputs, timed, status=status,
                     with_compile="torch.compile" in baselines, compile_mode=compile_mode)
    if "cublas" in baselines:
        _bench_cublas(app, graph, row, env, input_sets, params, outputs, timed, status=status)
    if "halide" in baselines:
        _bench_halide(app, graph, row, env, input_sets, params, outputs, timed, status=status)
    del outputs
    status(f"timing {', '.join(timed)} in turn")
    _time_side_by_side(row, env, timed, warmup=warmup, repeat=repeat)
    _fastest_autoscheduler(row)
    status("measured " + ", ".join(f"{label} {timing['median_s'] * 1e3:.3f} ms"
                                   for label, timing in row.timings.items())
           + f" (floor {row.floor_ms:.3f} ms)")

    if env.backend == "cuda" and calls:
        status("timing calls from Python")
        _bench_calls(app, graph, row, env, given, executable, plan_of_row, seed,
                     "torch.compile" in baselines)

    status("timing each kernel")
    rotate = unfused_rotate
    unfused.launch_all()  # every intermediate holds real values before kernels run alone
    for spec in unfused.program.launches:
        kernel_timing = env.timer(lambda spec=spec: unfused.launch_one(spec),
                                  warmup=max(1, warmup // 2), repeat=repeat, rotate=rotate)
        nbytes = launch_bytes(graph, spec, sizes)
        seconds = kernel_timing.median_s
        gbps = nbytes / seconds / 1e9 if seconds > 0 else math.nan
        row.kernels.append(KernelRow(spec.symbol, tuple(spec.operators), seconds * 1e3, nbytes,
                                     gbps, gbps * 1e9 / profile.copy_bandwidth_bytes_per_s))
    status("done")


def _bench_calls(app: Any, graph: Graph, row: BenchRow, env: _Env, given: dict[str, Any],
                 executable: Any, plan: Any, seed: int, with_torch: bool) -> None:
    """Microseconds per call from Python (:mod:`kfuse.bench.calls`) at the benchmark size
    and at a small size: ``Pipeline.run``, the compiled callable with and without CUDA
    graphs, torch.compile's call, beside the program's kernels alone."""
    from kfuse.bench.calls import measure_calls, small_size
    from kfuse.runtime import get_backend

    if plan is None:
        return
    pipeline = app.build(dtype="float32")
    small = small_size(app)
    cases = [(row.size, given, executable, plan)]
    if tuple(small) != tuple(row.size):
        input_sets, params, _ = device_inputs(app, pipeline.graph(), small, 1, env.xp,
                                              0, seed=seed)
        small_given = {**input_sets[0], **params}
        sizes = pipeline.graph().bind_shapes({name: tuple(input_sets[0][name].shape)
                                              for name in pipeline.graph().inputs})
        small_plan = app_plan(app, pipeline.graph(), sizes)
        cases.append((small, small_given, get_backend("cuda").prepare(
            pipeline.graph(), small_given, plan=small_plan), "auto"))
    for size, arguments, prepared, chosen in cases:
        try:
            measured = measure_calls(
                pipeline.graph(), lambda plan, **a: pipeline.run(backend="cuda", plan=plan, **a),
                lambda plan, graphs=True, native=True: pipeline.compile(
                    "cuda", plan, graphs=graphs, native=native),
                arguments, prepared, "auto" if chosen is not plan else plan, with_torch)
        except Exception as error:  # the call timings must not lose the row
            row.notes.append(_failure(f"call timing at {'x'.join(map(str, size))} failed",
                                      error))
            continue
        row.calls.append({"size": list(size), **measured})


def _choose_plan(app: Any, graph, given: dict[str, Any], sizes: dict[str, int],
                 profile: DeviceProfile, env: _Env, row: BenchRow, autotune: int) -> Any:
    """The plan kfuse runs: autotuned, the app's own planner, or the default search."""
    if autotune:
        from kfuse.tune.autotune import autotune as tune
        result = tune(graph, given, autotune, backend=env.backend, sizes=sizes,
                      profile=profile)
        row.autotune = result.table()
        best = result.best
        origin = (f"predicted #{best.rank}" if best.rank else
                  "assembled from the fastest variant of each group")
        row.notes.append(f"autotuned: {len(result.measured)} of {result.count} "
                         f"implementations timed; the fastest was {origin}")
        return result.plan
    return app_plan(app, graph, sizes, profile)


def app_plan(app: Any, graph: Graph, sizes: Mapping[str, int],
             profile: DeviceProfile | None = None) -> Any:
    """The plan an app runs in benchmarks: its own planner (the BLAS apps: the
    implementation space of Filipovič et al. 2015), else the default search."""
    planner = getattr(app, "planner", None)
    if planner is not None:
        return planner(graph, sizes, profile)
    from kfuse.search import default_plan
    return default_plan(graph, sizes=sizes, profile=profile, fill_device=True)


def _bench_cublas(app: Any, graph, row: BenchRow, env: _Env, input_sets: list[dict[str, Any]],
                  params: dict[str, Any], outputs: dict[str, Any], timed: Timed, *,
                  status: Callable[[str], None]) -> None:
    """The app's cuBLAS call sequence (BLAS apps on the cuda backend only), checked and
    added to ``timed``."""
    from kfuse.bench.cublas_baseline import has_sequence, prepare
    if not has_sequence(app.name):
        return
    if env.backend != "cuda":
        row.notes.append("cuBLAS baseline skipped: it needs the cuda backend")
        return
    status("cuBLAS sequence")
    try:
        sequences = [prepare(app.name, one, params) for one in input_sets]
    except Exception as error:  # no CuPy cuBLAS bindings: keep the row
        row.notes.append(f"cuBLAS baseline unavailable: {type(error).__name__}: {error}")
        return
    sequences[0].run()
    row.cublas_calls = sequences[0].describe()
    row.cublas_error = max((max_relative_error(sequences[0].outputs[name], outputs[name])
                            for name in graph.outputs), default=0.0)
    if row.cublas_error > ERROR_TOLERANCE:
        row.notes.append(f"cuBLAS and kfuse differ: max relative error {row.cublas_error:.3g}")
    current = [sequences[0]]
    rotate = [_chooser(current, one) for one in sequences]  # type: ignore[arg-type]
    timed["cublas"] = (lambda: current[0].run(), rotate, None)


def _bench_halide(app: Any, graph, row: BenchRow, env: _Env, input_sets: list[dict[str, Any]],
                  params: dict[str, Any], outputs: dict[str, Any], timed: Timed, *,
                  status: Callable[[str], None]) -> None:
    """Halide's program of the app (the pyramid apps), under its manual GPU schedule and
    each GPU autoscheduler, checked against kfuse away from the borders and added to
    ``timed`` with Halide's own timer (:mod:`kfuse.bench.halide_baseline`)."""
    from kfuse.bench import halide_baseline as halide
    if not halide.has_program(app.name):
        return
    why_not = halide.available() or (
        None if env.backend == "cuda" else "it needs the cuda backend")
    if why_not:
        row.notes.append(f"Halide baseline skipped: {why_not}")
        return
    host_sets = [{name: to_numpy(array) for name, array in one.items()} for one in input_sets]
    margin = halide.border_margin(app.name)
    (output_name,) = graph.outputs
    expected = to_numpy(outputs[output_name])
    inner = (Ellipsis, *(slice(margin, size - margin) for size in expected.shape[-2:]))
    errors = []
    for schedule in halide.schedules():
        status(f"Halide ({schedule}: compiling)")
        try:
            run = halide.prepare(app.name, host_sets, params, schedule)
        except Exception as error:  # an autoscheduler that fails must not lose the row
            row.notes.append(_failure(f"Halide {schedule} failed", error))
            continue
        errors.append(max_relative_error(run.result()[inner], expected[inner]))
        row.notes.append(f"Halide {schedule}: compiled in {run.compile_seconds:.1f} s")

        timed[f"halide {schedule}"] = (
            run.run, [partial(run.use, index) for index in range(len(host_sets))],
            partial(halide.time_halide, sync=run.sync))
    if errors:
        row.halide_error = max(errors)
        if row.halide_error > HALIDE_TOLERANCE:
            row.notes.append(f"Halide and kfuse differ away from the borders: max relative "
                             f"error {row.halide_error:.3g}")


def _fastest_autoscheduler(row: BenchRow) -> None:
    """The row's fastest Halide autoscheduler (timed as ``halide <name>``) and its time."""
    autoscheduled = {label.removeprefix("halide "): timing["median_s"] * 1e3
                     for label, timing in row.timings.items()
                     if label.startswith("halide ") and label != "halide manual"}
    if autoscheduled:
        row.halide_auto = min(autoscheduled, key=autoscheduled.__getitem__)
        row.halide_auto_ms = autoscheduled[row.halide_auto]


def _setter(executable: Any, arrays: dict[str, Any]) -> Callable[[], None]:
    """A function that points ``executable``'s inputs at ``arrays`` (another input set: the
    program must be able to run on them, which is checked here once)."""
    executable.check_alignment(arrays)

    def point_at() -> None:
        executable.buffers.update(arrays)
    return point_at


def _bench_torch(graph, row: BenchRow, env: _Env, input_sets: list[dict[str, Any]],
                 params: dict[str, Any], outputs: dict[str, Any], timed: Timed, *,
                 status: Callable[[str], None], with_compile: bool = True,
                 compile_mode: str | None = None) -> None:
    """PyTorch eager and torch.compile of the graph, checked and added to ``timed``."""
    try:
        import torch
    except ImportError:
        row.notes.append("PyTorch is not installed: baselines skipped")
        return
    if env.torch_device == "cuda" and not torch.cuda.is_available():
        row.notes.append("PyTorch has no CUDA here: baselines skipped")
        return
    from kfuse.bench.torch_baseline import compile_core, compile_description, translate

    status("translating to PyTorch")
    try:
        program = translate(graph)
        tensor_sets = [{name: _to_torch(array, env.torch_device) for name, array in one.items()}
                       for one in input_sets]
        eager = program.function()
        status("torch eager")
        reference = eager(**tensor_sets[0], **params)
    except Exception as error:  # a baseline that cannot run must not lose the row
        row.notes.append(_failure("PyTorch baselines failed", error))
        return
    current: list[dict[str, Any]] = [tensor_sets[0]]
    rotate = [_chooser(current, one) for one in tensor_sets]
    errors = [max_relative_error(_to_torch(outputs[name], env.torch_device), reference[name])
              for name in graph.outputs]
    row.max_error = max(errors) if errors else 0.0
    if row.error_ok is False:
        row.notes.append(f"kfuse differs from torch eager: max relative error "
                         f"{row.max_error:.3g} > {ERROR_TOLERANCE:g}")
    timed["torch eager"] = (lambda: eager(**current[0], **params), rotate, None)

    if not with_compile:
        return
    status("torch.compile (compiling)")
    row.compile_mode = compile_description(compile_mode)
    try:
        compiled = program.function(compile_core(program, compile_mode))
        result = compiled(**tensor_sets[0], **params)
        row.compile_error = max((max_relative_error(result[n], reference[n])
                                 for n in graph.outputs), default=0.0)
        timed["torch.compile"] = (lambda: compiled(**current[0], **params), rotate, None)
    except Exception as error:  # a broken Triton/inductor must not lose the row
        row.notes.append(_failure("torch.compile failed", error))
    del reference


def _chooser(current: list[dict[str, Any]], tensors: dict[str, Any]) -> Callable[[], None]:
    def choose() -> None:
        current[0] = tensors
    return choose


def _to_torch(array: Any, device: str) -> Any:
    import torch
    if isinstance(array, torch.Tensor):
        return array
    if device == "cuda":
        return torch.as_tensor(array, device="cuda")
    host = np.asarray(array)
    return torch.from_numpy(np.ascontiguousarray(host).reshape(host.shape))  # keeps 0-d
