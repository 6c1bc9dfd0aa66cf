"""Measure the GPU: properties, device-to-device copy bandwidth, kernel launch overhead, the
block with which kfuse's elementwise kernels stream fastest, and the block-row form with
which its GEMV kernels do."""

from __future__ import annotations

import datetime
from contextlib import nullcontext
from typing import Any

import numpy as np

from kfuse.model.device import DeviceProfile
from kfuse.tune.timing import Timing, time_gpu, time_in_turn

COPY_SOURCE = r"""
extern "C" __global__ void kf_copy4(const float4* __restrict__ src, float4* __restrict__ dst,
                                    long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long stride = (long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) dst[i] = src[i];
}
extern "C" __global__ void kf_empty() {}
"""

COPY_BLOCK = 256


def _decode(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def device_properties(device_id: int | None = None) -> dict[str, Any]:
    """``cudaGetDeviceProperties`` as a dict, gaps filled from device attributes."""
    import cupy

    device = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    props = dict(cupy.cuda.runtime.getDeviceProperties(device.id))
    try:
        attributes = device.attributes
    except Exception:  # pragma: no cover - depends on the CuPy version
        attributes = {}
    fallbacks = {
        "multiProcessorCount": "MultiProcessorCount",
        "sharedMemPerBlock": "MaxSharedMemoryPerBlock",
        "sharedMemPerMultiprocessor": "MaxSharedMemoryPerMultiprocessor",
        "sharedMemPerBlockOptin": "MaxSharedMemoryPerBlockOptin",
        "regsPerMultiprocessor": "MaxRegistersPerMultiprocessor",
        "maxThreadsPerMultiProcessor": "MaxThreadsPerMultiProcessor",
        "l2CacheSize": "L2CacheSize",
        "memoryClockRate": "MemoryClockRate",
        "memoryBusWidth": "GlobalMemoryBusWidth",
        "major": "ComputeCapabilityMajor",
        "minor": "ComputeCapabilityMinor",
    }
    for key, attribute in fallbacks.items():
        if not props.get(key) and attributes.get(attribute):
            props[key] = attributes[attribute]
    props["name"] = _decode(props.get("name", "unknown GPU"))
    props["id"] = device.id
    return props


def _peak_bandwidth(props: dict[str, Any]) -> float | None:
    """Theoretical DRAM bandwidth from memory clock (kHz) and bus width (bits), if known."""
    clock_khz, bus_bits = props.get("memoryClockRate"), props.get("memoryBusWidth")
    if not clock_khz or not bus_bits:
        return None
    return 2.0 * float(clock_khz) * 1e3 * float(bus_bits) / 8.0


def measure_copy(nbytes: int = 1 << 30, *, warmup: int = 5, repeat: int = 30
                 ) -> dict[str, Timing]:
    """Time a ``nbytes`` device-to-device copy with a float4 kernel and with cudaMemcpy."""
    import cupy

    n4 = max(nbytes // 16, 1)
    src = cupy.ones(n4 * 4, dtype=cupy.float32)
    dst = cupy.zeros_like(src)
    module = cupy.RawModule(code=COPY_SOURCE)
    copy = module.get_function("kf_copy4")
    blocks = min(-(-n4 // COPY_BLOCK), 2**31 - 1)
    count = np.int64(n4)
    size = n4 * 16
    stream = cupy.cuda.get_current_stream()

    def kernel_copy() -> None:
        copy((blocks,), (COPY_BLOCK,), (src, dst, count))

    def memcpy() -> None:
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, size,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)

    results = {"kernel": time_gpu(kernel_copy, warmup=warmup, repeat=repeat, max_seconds=None)}
    if not bool((dst[:4] == 1).all()) or not bool((dst[-4:] == 1).all()):
        raise RuntimeError("the calibration copy kernel did not copy; the GPU run is broken")
    results["memcpy"] = time_gpu(memcpy, warmup=warmup, repeat=repeat, max_seconds=None)
    return results


def measure_launch(*, batch: int = 200, repeat: int = 30) -> dict[str, Timing]:
    """Time empty kernel launches: one alone, and per launch in back-to-back batches."""
    import cupy

    empty = cupy.RawModule(code=COPY_SOURCE).get_function("kf_empty")

    def one() -> None:
        empty((1,), (32,), ())

    def many() -> None:
        for _ in range(batch):
            empty((1,), (32,), ())

    single = time_gpu(one, warmup=20, repeat=max(repeat, 100), max_seconds=None)
    batched = time_gpu(many, warmup=2, repeat=repeat, max_seconds=None)
    per_launch = Timing(batched.median_s / batch, batched.min_s / batch, batched.p10 / batch,
                        batched.p90 / batch, batched.runs)
    return {"single": single, "per_launch": per_launch}


# Threads per block an elementwise kernel is timed with: kfuse's plain maps (MAP_VARIANTS) with
# 8-byte accesses, which the model predicts equal. Measured on the same buffers (session 17,
# docs/journal/benchmarks.md): an H100 ran MADD, WAXPBY, VADD and SSCAL 0.2-1.0% faster in blocks of
# 512 threads than of 128; an H200 ran MADD and WAXPBY 3.7% slower in them, 0.8% in 256.
MAP_BLOCKS = (128, 256, 512)


def measure_map_blocks(nbytes: int = 1 << 29, *, rounds: int = 3, warmup: int = 3,
                       repeat: int = 10) -> dict[int, float]:
    """Seconds of kfuse's elementwise kernel ``c = a + b`` over float32 arrays of ``nbytes``
    each, generated with each of :data:`MAP_BLOCKS` threads per block, timed in turn on the
    same buffers (where an output lies moves a streaming kernel's time)."""
    import cupy

    from kfuse.dsl.ops import point
    from kfuse.dsl.pipeline import Pipeline

    pipeline = Pipeline("calibrate_map")
    a, b = pipeline.input("a", ndim=1), pipeline.input("b", ndim=1)
    pipeline.output(point(a + b, name="c"))
    graph = pipeline.graph()
    count = max(nbytes // 4, 1024)
    given = {name: cupy.random.random(count, dtype=cupy.float32) + 0.5 for name in "ab"}

    def check(buffers: Any) -> None:
        if not bool(cupy.allclose(buffers["c"], given["a"] + given["b"])):
            raise RuntimeError("the calibration's elementwise kernel computed wrong sums; the "
                               "GPU run is broken")

    variants = [f"mapreduce:{threads}x1:r1:i1:w8:shuffle" for threads in MAP_BLOCKS]
    times = _time_variants(graph, given, variants, check, rounds=rounds, warmup=warmup,
                           repeat=repeat)
    return dict(zip(MAP_BLOCKS, times, strict=True))


def _time_variants(graph: Any, given: dict[str, Any], variants: list[str],
                   check: Any, **timing: int) -> list[float]:
    """Seconds of ``graph`` run as one kernel in each map-reduce variant, all on the same
    buffers (where an output lies moves a streaming kernel's time), each run's buffers
    given to ``check`` first, then timed in turn (:func:`time_in_turn`)."""
    from kfuse.fusion.plan import make_plan
    from kfuse.runtime import get_backend

    backend = get_backend("cuda")
    members = frozenset(kernel.name for kernel in graph.kernels)
    executables: list[Any] = []
    for variant in variants:
        plan = make_plan(graph, [sorted(members)], check_resources=False,
                         variants={members: variant})
        executable = backend.prepare(graph, given, plan=plan,
                                     buffers_of=executables[0] if executables else None)
        executable.launch_all()
        check(executable.buffers)
        executables.append(executable)
    return time_in_turn([e.launch_all for e in executables], **timing)


# Block-row GEMV forms (threads, access bytes, accesses per row, thread and step) timed for
# one and two matrices per row (SGEMV's z = alpha A x + beta y, GESUMMV's two), which the
# model predicts equal. Measured on the same buffers at 16384^2 (docs/journal/benchmarks.md): an H200
# ran SGEMV fastest in (512, 8, 16), 1024 threads 1.5-3% slower (sessions 17-18); an H100 in
# (1024, 16, 2) and (1024, 8, 2-4), (512, 8, 16) 1% slower, and GESUMMV in (1024, 16, 2), the
# others 0.5-2.8% slower (session 19).
ROW_BLOCK_FORMS = ((512, 8, 8), (512, 8, 16), (512, 16, 4), (1024, 8, 4), (1024, 8, 8),
                   (1024, 16, 2), (1024, 16, 4))
ROW_BLOCK_COLUMNS = 16384
MAX_ROW_LOADS = 16  # accesses per thread and step over the row's matrices (as the search)


def measure_row_blocks(nbytes: int = 1 << 29, *, rounds: int = 3, warmup: int = 3,
                       repeat: int = 10) -> dict[str, dict[tuple[int, int, int], float]]:
    """Seconds of kfuse's block-row GEMV in each of :data:`ROW_BLOCK_FORMS`, per number of
    matrices a row reads (``"1"``: the SGEMV app, ``"2"``: GESUMMV), on matrices of
    :data:`ROW_BLOCK_COLUMNS` columns and ``nbytes`` in all, each set timed in turn on the
    same buffers and checked against the float64 reference."""
    import cupy

    from kfuse.apps import get_app
    from kfuse.apps.check import relative_error

    result: dict[str, dict[tuple[int, int, int], float]] = {}
    for matrices, name in ((1, "sgemv"), (2, "gesummv")):
        app = get_app(name)
        graph = app.build().graph()
        rows = max(nbytes // (4 * ROW_BLOCK_COLUMNS * matrices), 64)
        arrays, params = app.make_inputs((rows, ROW_BLOCK_COLUMNS), np.random.default_rng(0),
                                         "float32")
        reference = app.reference(arrays, params, None)
        given = {key: cupy.asarray(value) for key, value in arrays.items()} | params

        def check(buffers: Any, name: str = name, reference: Any = reference) -> None:
            for output, expected in reference.items():
                if relative_error(buffers[output].get(), expected) > 1e-4:
                    raise RuntimeError(f"the calibration's GEMV ({name}) computed a wrong "
                                       f"'{output}'; the GPU run is broken")

        forms = [f for f in ROW_BLOCK_FORMS if f[2] * matrices <= MAX_ROW_LOADS]
        variants = [f"mapreduce:{threads}x1:r1:i1:{'w8' if access == 8 else 'w'}:stream:"
                    f"u{unroll}" for threads, access, unroll in forms]
        times = _time_variants(graph, given, variants, check, rounds=rounds, warmup=warmup,
                               repeat=repeat)
        result[str(matrices)] = dict(zip(forms, times, strict=True))
        cupy.get_default_memory_pool().free_all_blocks()
    return result


def calibrate(*, copy_bytes: int = 1 << 30, repeat: int = 30, warmup: int = 5,
              progress: bool = True, device_id: int | None = None) -> DeviceProfile:
    """Measure the current GPU with CuPy and return its :class:`DeviceProfile` (not saved).

    Copy bandwidth is (bytes read + bytes written) / median time of a ``copy_bytes``
    device-to-device copy, the better of a float4 copy kernel and ``cudaMemcpyAsync``;
    launch overhead the median per-launch time of back-to-back empty kernels; the block of
    kfuse's elementwise kernels the fastest of :data:`MAP_BLOCKS` (:func:`measure_map_blocks`).
    """
    from kfuse.runtime.cuda_backend import _cupy
    cupy = _cupy()  # BackendUnavailable, not ModuleNotFoundError, where there is no GPU

    device = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    with device, _progress(progress) as bar:
        task = bar.add_task("calibrating", total=5) if bar else None

        def step(text: str) -> None:
            if bar is not None:
                bar.update(task, description=text)

        step("device properties")
        props = device_properties(device.id)
        if bar is not None:
            bar.advance(task)
        step(f"copy bandwidth ({copy_bytes / 2**30:.2f} GiB, {repeat} runs)")
        copies = measure_copy(copy_bytes, warmup=warmup, repeat=repeat)
        cupy.get_default_memory_pool().free_all_blocks()
        if bar is not None:
            bar.advance(task)
        step("launch overhead")
        launches = measure_launch(repeat=repeat)
        if bar is not None:
            bar.advance(task)
        step(f"elementwise kernels in blocks of {', '.join(map(str, MAP_BLOCKS))} threads")
        blocks = measure_map_blocks(copy_bytes // 2)
        cupy.get_default_memory_pool().free_all_blocks()
        if bar is not None:
            bar.advance(task)
        step("block-row GEMV forms")
        row_blocks = measure_row_blocks(copy_bytes // 2)
        if bar is not None:
            bar.advance(task)
    moved = 2 * (max(copy_bytes // 16, 1) * 16)
    bandwidths = {method: moved / timing.median_s for method, timing in copies.items()}
    best = max(bandwidths, key=bandwidths.get)
    return _profile(
        props, float(bandwidths[best]), float(launches["per_launch"].median_s),
        measured_at=datetime.date.today().isoformat(),
        map_block_threads=min(blocks, key=blocks.get),
        row_block_forms=tuple((int(matrices), *min(forms, key=forms.get))
                              for matrices, forms in row_blocks.items()),
        notes={
            "map_block_seconds": {str(threads): s for threads, s in blocks.items()},
            "row_block_seconds": {matrices: {"x".join(map(str, form)): s
                                             for form, s in forms.items()}
                                  for matrices, forms in row_blocks.items()},
            "copy_method": best,
            "copy_bytes": copy_bytes,
            "copy_bandwidth_by_method": {k: float(v) for k, v in bandwidths.items()},
            "copy_timings": {k: str(v) for k, v in copies.items()},
            "single_launch_s": float(launches["single"].median_s),
            "launch_timings": {k: str(v) for k, v in launches.items()},
            "cupy": getattr(cupy, "__version__", "?"),
            "measured_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
        },
    )


# Where nothing was measured: the copy bandwidth as this fraction of the DRAM peak (measured
# here: H100 80GB HBM3 3016-3018 of 3352 GB/s, 0.90; H200 4248-4276 of 4814, 0.88-0.89), and
# the launch overhead of a CuPy launch from Python.
COPY_FRACTION_OF_PEAK = 0.89
ESTIMATED_LAUNCH_S = 6e-6


def estimated_profile(device_id: int | None = None) -> DeviceProfile:
    """The GPU's profile from its properties alone, without timing anything (what kfuse plans
    with on a GPU nobody calibrated): its multiprocessors, memory and L2, the copy bandwidth
    estimated from the DRAM peak. ``measured_at`` stays None: ``kfuse calibrate`` measures."""
    from kfuse.model.device import default_profile

    props = device_properties(device_id)
    peak = _peak_bandwidth(props)
    copy = peak * COPY_FRACTION_OF_PEAK if peak else default_profile().copy_bandwidth_bytes_per_s
    return _profile(props, copy, ESTIMATED_LAUNCH_S, measured_at=None, notes={
        "source": f"estimated from the device's properties (copy = {COPY_FRACTION_OF_PEAK} x "
                  "the DRAM peak); run 'kfuse calibrate' to measure"})


def _profile(props: dict[str, Any], copy_bandwidth: float, launch_overhead: float, *,
             measured_at: str | None, notes: dict[str, Any],
             map_block_threads: int | None = None,
             row_block_forms: tuple[tuple[int, int, int, int], ...] | None = None
             ) -> DeviceProfile:
    """A profile of the device described by ``props`` (:func:`device_properties`)."""
    major, minor = props.get("major", 0), props.get("minor", 0)
    return DeviceProfile(
        name=props["name"],
        compute_capability=f"{major}.{minor}",
        sm_count=int(props.get("multiProcessorCount", 0)),
        shared_memory_per_block=int(props.get("sharedMemPerBlock", 0)),
        shared_memory_per_sm=int(props.get("sharedMemPerMultiprocessor", 0)),
        registers_per_sm=int(props.get("regsPerMultiprocessor", 0)),
        max_threads_per_sm=int(props.get("maxThreadsPerMultiProcessor", 0)),
        l2_bytes=int(props.get("l2CacheSize", 0)),
        copy_bandwidth_bytes_per_s=copy_bandwidth,
        launch_overhead_s=launch_overhead,
        measured_at=measured_at,
        shared_memory_per_block_optin=int(props["sharedMemPerBlockOptin"])
        if props.get("sharedMemPerBlockOptin") else None,
        peak_bandwidth_bytes_per_s=_peak_bandwidth(props),
        global_memory_bytes=int(props["totalGlobalMem"]) if props.get("totalGlobalMem") else None,
        map_block_threads=map_block_threads,
        row_block_forms=row_block_forms,
        notes=notes,
    )


def _progress(enabled: bool):
    if not enabled:
        return nullcontext(None)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    transient=True)


_VISIBLE_GPU: list[DeviceProfile | None] = []  # asked once per process


def visible_gpu_profile() -> DeviceProfile | None:
    """The current GPU's estimated profile (:func:`estimated_profile`; None where CuPy sees
    no GPU), asked once per process."""
    if not _VISIBLE_GPU:
        from kfuse.runtime.cuda_backend import CudaBackend
        profile = None
        if CudaBackend.available():
            try:
                profile = estimated_profile()
            except Exception:  # pragma: no cover - a driver that will not say: plan nominally
                profile = None
        _VISIBLE_GPU.append(profile)
    return _VISIBLE_GPU[0]
