"""The ``cuda`` backend: NVRTC through CuPy, compiled modules cached on disk by source hash.

Accepts CuPy arrays and PyTorch CUDA tensors without copying, and NumPy arrays (copied in
and out); outputs come back in the kind of array the inputs were.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable, Mapping
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kfuse.cache import cache_dir as kfuse_cache_dir
from kfuse.cache import (
    compile_key,
    count_compiler_run,
    mark_used,
    writable_cache_dir,
    write_atomically,
)
from kfuse.codegen.program import LaunchSpec, Program
from kfuse.cuda_limits import STATIC_SHARED_LIMIT
from kfuse.errors import BackendUnavailable, BindError, CompileError, LaunchError
from kfuse.ir.expr import DTYPES
from kfuse.ir.graph import Graph
from kfuse.log import LOG
from kfuse.model.occupancy import blocks_per_multiprocessor
from kfuse.runtime.backend import CompiledBackend, Executable, LoadedProgram
from kfuse.runtime.binding import Bound
from kfuse.runtime.launch import BoundLaunch

if TYPE_CHECKING:
    from kfuse.runtime.compiled import ArrayFacts

NVRTC_OPTIONS = ("--std=c++17", "-default-device")


def _cupy():
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise BackendUnavailable("the cuda backend needs CuPy: pip install 'kfuse[cuda]'") from error
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise BackendUnavailable("no CUDA device is visible")
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise BackendUnavailable(f"no usable CUDA device: {error}") from error
    return cupy


@functools.lru_cache(maxsize=16)
def _device_attributes(device: int) -> dict[str, int]:
    """The CUDA device attributes of ``device`` (read once: CuPy asks the driver for each)."""
    return dict(_cupy().cuda.Device(device).attributes)


def device_attributes() -> dict[str, int]:
    """The current device's CUDA attributes, by CUDA's names without ``cudaDevAttr``."""
    return _device_attributes(_cupy().cuda.Device().id)


def cache_dir() -> Path:
    """Compiled cubins: ``$KFUSE_CACHE_DIR/cuda`` (created on first use)."""
    return writable_cache_dir("cuda")


def device_arch() -> str:
    cupy = _cupy()
    return f"sm_{cupy.cuda.Device().compute_capability}"


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """NVRTC's version (part of every compiled kernel's cache key)."""
    from cupy_backends.cuda.libs import nvrtc
    return ".".join(map(str, nvrtc.getVersion()))


def compile_cubin(source: str, arch: str) -> Path:
    """Compile with NVRTC into a cubin under the cache directory (reused by a key of the
    source, the options, the architecture and NVRTC's version)."""
    options = (*NVRTC_OPTIONS, f"--gpu-architecture={arch}")
    digest = compile_key(source, ("nvrtc",), nvrtc_version(), options)
    path = kfuse_cache_dir("cuda") / f"{digest}.cubin"
    if path.exists():  # (a read-only cache still serves what it holds)
        mark_used(path)
        return path
    path = cache_dir() / f"{digest}.cubin"
    from cupy_backends.cuda.libs import nvrtc
    count_compiler_run()
    started = time.perf_counter()
    program = nvrtc.createProgram(source, "kfuse.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as error:
            log = nvrtc.getProgramLog(program)
            saved = cache_dir() / f"{digest}.failed.cu"
            saved.write_text(source)
            raise CompileError(f"NVRTC failed ({error}); source saved at {saved}\n{log}") from None
        cubin = nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
    write_atomically(path, cubin)
    LOG.info("compiled %s with NVRTC %s in %.2f s", path.name, nvrtc_version(),
             time.perf_counter() - started)
    return path


@functools.lru_cache(maxsize=256)
def load_module(source: str, kernel: str | None = None):
    """The CuPy module of a program's source (compiled once per process and source). A
    cached cubin the driver cannot load (truncated, corrupt) is deleted and compiled again:
    loading ``kernel``, one of the source's kernels, shows whether it loads."""
    cupy = _cupy()
    path = compile_cubin(source, device_arch())
    module = cupy.RawModule(path=str(path))
    if kernel is not None:
        try:
            module.get_function(kernel)
        except cupy.cuda.driver.CUDADriverError:
            path.unlink(missing_ok=True)
            module = cupy.RawModule(path=str(compile_cubin(source, device_arch())))
    return module




def _kind(array: Any) -> str:
    module = type(array).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    return "numpy"


def output_family(families: set[str]) -> str:
    """The kind of array a call returns, given its inputs' kinds: NumPy if any input is
    NumPy (or none is an array), else PyTorch if any is a tensor, else CuPy."""
    if "numpy" in families or not families:
        return "numpy"
    return "torch" if "torch" in families else "cupy"


FILL_SOURCE = r"""
// Set n elements of 1, 2, 4 or 8 bytes to one bit pattern (reductions' identities).
#define KF_FILL(bits, type) \
extern "C" __global__ void kf_fill_##bits(type* p, unsigned long long n, \
                                          unsigned long long pattern) { \
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; \
       i < n; i += (unsigned long long)gridDim.x * blockDim.x) p[i] = (type)pattern; }
KF_FILL(8, unsigned char)
KF_FILL(16, unsigned short)
KF_FILL(32, unsigned int)
KF_FILL(64, unsigned long long)
"""
FILL_THREADS = 256


@functools.lru_cache(maxsize=16)
def _fill_functions(device: int) -> dict[int, int]:
    """Handles of the fill kernels on ``device``, by element size in bytes."""
    module = load_module(FILL_SOURCE, "kf_fill_8")
    return {size: module.get_function(f"kf_fill_{size * 8}").kernel.ptr
            for size in (1, 2, 4, 8)}


def address_of(buffer: Any) -> int:
    """Where a CuPy array's or a PyTorch tensor's first element lies in device memory."""
    data = getattr(buffer, "data", None)
    return data.ptr if hasattr(data, "ptr") else buffer.data_ptr()


class SideStreams:
    """The streams besides the caller's that one workspace launches on, and its events
    (made once, used by every call: :mod:`kfuse.runtime.streams`)."""

    def __init__(self, count: int, launches: int):
        cupy = _cupy()
        self.runtime = cupy.cuda.runtime
        self._streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(count)]
        self.streams = [stream.ptr for stream in self._streams]
        self._events = [cupy.cuda.Event(block=False, disable_timing=True)
                        for _ in range(launches + 1 + count)]
        pointers = [event.ptr for event in self._events]
        self.after = pointers[:launches]  # recorded after launch i, where another waits
        self.forked = pointers[launches]
        self.joined = pointers[launches + 1:]

    def fork(self, stream: int) -> None:
        """Side streams wait for what the caller's stream holds so far."""
        self.runtime.eventRecord(self.forked, stream)
        for side in self.streams:
            self.runtime.streamWaitEvent(side, self.forked, 0)

    def record(self, launch: int, stream: int) -> None:
        self.runtime.eventRecord(self.after[launch], stream)

    def wait(self, stream: int, launch: int) -> None:
        self.runtime.streamWaitEvent(stream, self.after[launch], 0)

    def join(self, stream: int) -> None:
        """The caller's stream waits for everything the side streams hold."""
        for side, event in zip(self.streams, self.joined, strict=True):
            self.runtime.eventRecord(event, side)
            self.runtime.streamWaitEvent(stream, event, 0)


class CudaLoadedProgram(LoadedProgram):
    """A program's module on the current device; kernels launched through the driver
    (``cuLaunchKernel``) with their packed arguments, on the caller's stream."""

    _loaded = {}

    def __init__(self, program: Program):
        super().__init__(program)
        cupy = _cupy()
        self.driver = cupy.cuda.driver
        self.device = cupy.cuda.runtime.getDevice()
        module = load_module(program.source, next(
            (spec.symbol for spec in program.launches), None))
        for spec in program.launches:
            function = module.get_function(spec.symbol)
            if spec.dynamic_shared_bytes > STATIC_SHARED_LIMIT:  # beyond 48 KiB: opt in
                function.max_dynamic_shared_size_bytes = spec.dynamic_shared_bytes
            self.functions[spec.symbol] = function
        self.handles = {symbol: function.kernel.ptr for symbol, function in
                        self.functions.items()}
        self.resident: dict[str, int] = {}

    @classmethod
    def device_key(cls) -> int:
        return _cupy().cuda.runtime.getDevice()

    def handle(self, spec: LaunchSpec) -> int:
        return self.handles[spec.symbol]  # the CUfunction cuLaunchKernel takes

    def current_stream(self) -> int:
        return _cupy().cuda.get_current_stream().ptr

    def resident_blocks(self, spec: LaunchSpec) -> int:
        """Blocks of the kernel that fit the device at once (the occupancy calculation from
        its registers and shared memory, times the multiprocessors)."""
        if spec.symbol not in self.resident:
            function = self.functions[spec.symbol]
            attributes = device_attributes()
            per_multiprocessor = blocks_per_multiprocessor(
                function.num_regs, prod(spec.block),
                function.shared_size_bytes + spec.dynamic_shared_bytes, attributes)
            self.resident[spec.symbol] = max(1, per_multiprocessor) * \
                attributes["MultiProcessorCount"]
        return self.resident[spec.symbol]

    def launch(self, launch: BoundLaunch, stream: int) -> None:
        try:
            self.driver.launchKernel(launch.function, *launch.shape, stream,
                                     launch.arguments.address, 0)
        except self.driver.CUDADriverError as error:
            raise self.launch_error(launch, error.status) from error

    def launch_error(self, launch: BoundLaunch | None, status: int) -> LaunchError:
        reason = self.driver.CUDADriverError(status)
        if launch is None:
            return LaunchError(f"replay of a CUDA graph of program {self.program.name} "
                               f"failed: {reason}")
        return LaunchError(f"launch of {launch.spec.symbol} failed: {reason}",
                           operator=",".join(launch.spec.operators))

    def native_launch(self) -> tuple[int, int | None]:
        return _driver_entry("cuLaunchKernel"), _driver_entry("cuGraphLaunch")

    def native_function(self, launch: BoundLaunch) -> int:
        return launch.function  # the CUfunction

    def fill(self, buffer: Any, value: float, stream: int) -> None:
        count = buffer.numel() if callable(getattr(buffer, "numel", None)) else buffer.size
        itemsize, pattern = _fill_pattern(buffer.dtype, value)
        arguments = (ctypes.c_void_p(address_of(buffer)), ctypes.c_ulonglong(count),
                     ctypes.c_ulonglong(pattern))
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(a) for a in arguments])
        blocks = max(1, min(1024, -(-count // FILL_THREADS)))
        self.driver.launchKernel(_fill_functions(self.device)[itemsize], blocks, 1, 1,
                                 FILL_THREADS, 1, 1, 0, stream, ctypes.addressof(pointers), 0)


@functools.cache
def _driver_entry(name: str) -> int:
    """The address of the CUDA driver's function ``name`` (the libcuda CuPy runs on)."""
    return ctypes.cast(getattr(ctypes.CDLL("libcuda.so.1"), name), ctypes.c_void_p).value


@functools.lru_cache(maxsize=64)
def _fill_pattern(dtype: Any, value: float) -> tuple[int, int]:
    """The element size of ``dtype`` (NumPy's or PyTorch's) and ``value``'s bits in it."""
    numpy_dtype = np.dtype(str(dtype).replace("torch.", ""))
    pattern = int(np.array(value, dtype=numpy_dtype).view(f"u{numpy_dtype.itemsize}"))
    return numpy_dtype.itemsize, pattern


class CudaArrays:
    """The cuda backend's arrays: CuPy arrays and PyTorch tensors stay where they are
    (outputs come from the same library's allocator, on the same device); NumPy arrays
    are copied in and their outputs copied back. Work goes on the caller's current stream
    (PyTorch's for tensors, CuPy's otherwise)."""

    captures = True  # streams and CUDA graphs

    def __init__(self) -> None:
        self.cupy = _cupy()
        self.torch: Any = None

    def copies_in(self, facts: ArrayFacts) -> bool:
        """Whether a call copies this input in (besides a non-contiguous one): host memory."""
        return facts.family == "numpy"

    def _torch(self) -> Any:
        if self.torch is None:
            import torch
            self.torch = torch
        return self.torch

    def placement(self, facts: Mapping[str, ArrayFacts]) -> tuple[str, int]:
        families = {fact.family for fact in facts.values()}
        devices = {fact.device for fact in facts.values() if fact.device is not None}
        if len(devices) > 1:
            raise BindError(f"the inputs lie on several GPUs ({sorted(devices)}); give arrays "
                            "on one device")
        for name, fact in facts.items():
            if fact.family == "torch" and fact.device is None:
                raise BindError(f"input '{name}' is a PyTorch tensor in host memory; the cuda "
                                "backend takes tensors on the GPU (tensor.cuda())")
        device = devices.pop() if devices else self.cupy.cuda.runtime.getDevice()
        return output_family(families), device

    def on_device(self, device: int) -> Any:
        return self.cupy.cuda.Device(device)

    def allocator(self, family: str, device: int) -> Callable[[tuple, str], tuple[Any, int]]:
        """How a call's outputs are made: the caller's library's ``empty`` (on the device
        current when the call runs, which is the signature's); it returns the array and its
        address."""
        if family == "torch":
            torch = self._torch()
            where = torch.device("cuda", device)
            types = {name: getattr(torch, name) for name in DTYPES if hasattr(torch, name)}

            def allocate_tensor(shape: tuple, dtype: str) -> tuple[Any, int]:
                tensor = torch.empty(shape, dtype=types[dtype], device=where)
                return tensor, tensor.data_ptr()
            return allocate_tensor
        empty = self.cupy.empty

        def allocate_array(shape: tuple, dtype: str) -> tuple[Any, int]:
            array = empty(shape, dtype)
            return array, array.data.ptr
        return allocate_array

    def current_device(self) -> int:
        return self.cupy.cuda.runtime.getDevice()

    def contiguous(self, array: Any, device: int) -> Any:
        with self.cupy.cuda.Device(device):
            if type(array).__module__.startswith("torch"):
                return array.contiguous()
            return self.cupy.ascontiguousarray(self.cupy.asarray(array))

    def address(self, array: Any) -> int:
        return address_of(array)

    def stream_function(self, family: str, device: int) -> Callable[[], int]:
        """The function giving the caller's current stream (a raw pointer) for outputs of
        ``family`` on ``device``: PyTorch's for tensors, CuPy's otherwise."""
        if family == "torch":
            torch = self._torch()
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            current = functools.partial(raw, device) if raw is not None else \
                (lambda: torch.cuda.current_stream(device).cuda_stream)
        else:
            current = functools.partial(_stream_pointer, self.cupy.cuda.get_current_stream)
        return functools.partial(_in_context, self.cupy.cuda, device, current)

    def to_host(self, array: Any) -> np.ndarray:
        return self.cupy.asnumpy(array)

    def check_out(self, name: str, facts: ArrayFacts, device: int) -> None:
        if facts.device != device:
            where = "host memory" if facts.device is None else f"GPU {facts.device}"
            raise BindError(f"out= array for '{name}' lies in {where}; the call runs on GPU "
                            f"{device}")
        if not facts.contiguous:
            raise BindError(f"out= array for '{name}' must be C-contiguous")

    def capture(self, workspace: Any, enqueue: Callable[[int], None]) -> Any:
        """A CUDA graph of what ``enqueue(stream)`` launches (captured on a stream of the
        workspace's own)."""
        cupy = self.cupy
        if workspace.capture_stream is None:
            workspace.capture_stream = cupy.cuda.Stream(non_blocking=True)
        capture = workspace.capture_stream
        mode = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
        with capture:
            capture.begin_capture(mode) if mode is not None else capture.begin_capture()
            try:
                enqueue(capture.ptr)
            finally:
                graph = capture.end_capture()
        return graph

    def side_streams(self, count: int, launches: int) -> SideStreams:
        return SideStreams(count, launches)

    def replay(self, graph: Any, stream: int) -> None:
        """Launch a captured CUDA graph on ``stream`` (a raw stream pointer)."""
        self.cupy.cuda.runtime.graphLaunch(graph.graphExec, stream)


class CudaExecutable(Executable):
    loaded_class = CudaLoadedProgram

    def __init__(self, graph: Graph, bound: Bound):
        super().__init__(graph, bound)
        self.cupy = _cupy()
        self.output_kind = output_family({_kind(a) for a in bound.arrays.values()})

    def address(self, buffer: Any) -> int:
        return address_of(buffer)

    def upload(self, array: Any) -> Any:
        kind = _kind(array)
        if kind == "torch":
            if not array.is_cuda:
                array = array.cuda()
            return self.cupy.asarray(array.contiguous())
        return self.cupy.ascontiguousarray(self.cupy.asarray(array))

    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> Any:
        return self.cupy.full(shape, value, dtype=np.dtype(dtype if dtype != "bool" else "bool"))

    def download(self, buffer: Any) -> Any:
        if self.output_kind == "numpy":
            return self.cupy.asnumpy(buffer)
        if self.output_kind == "torch":
            import torch
            return torch.as_tensor(buffer, device="cuda")
        return buffer


class CudaBackend(CompiledBackend):
    """Runs generated kernels on the GPU."""

    name = "cuda"
    executable_class = CudaExecutable
    arrays_class = CudaArrays
    specialises_sizes = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            _cupy()
        except BackendUnavailable as error:
            return error.detail
        return None

    def marches_along_z(self, graph: Graph, sizes: Mapping[str, int]) -> bool:
        """Whether marching kernels pay on the current device (its peak DRAM bandwidth per
        multiprocessor cycle, from the device's attributes) for the 3-D volumes of ``graph``
        at ``sizes`` (each must fill the device in long chunks)."""
        from kfuse.schedule.marching import fills_device, pays_on

        attributes = device_attributes()
        try:
            peak = 2 * attributes["MemoryClockRate"] * 1e3 * attributes["GlobalMemoryBusWidth"] / 8
            multiprocessors = attributes["MultiProcessorCount"]
            clock = attributes["ClockRate"] * 1e3
        except KeyError:  # the attributes are not reported: keep the register tiles
            return False
        if not pays_on(peak, multiprocessors, clock):
            return False
        volumes = {tuple(sizes[symbol] for symbol in kernel.domain) for kernel in graph.kernels
                   if len(kernel.domain) == 3}
        return all(fills_device(*volume, multiprocessors) for volume in volumes)


_THREAD = threading.local()  # whether this host thread was checked for a current context


def _stream_pointer(get_current_stream: Callable[[], Any]) -> int:
    return get_current_stream().ptr


def _in_context(cuda: Any, device: int, current: Callable[[], int]) -> int:
    """``current()`` (the caller's stream), the first call of each host thread making sure
    it has a current context: kernels are launched through the driver, which needs one,
    and a thread that never called the runtime (a Dask worker's, say) has none (then
    ``device``'s primary context is made current; a thread's own context is left alone)."""
    if not getattr(_THREAD, "checked", False):
        if not cuda.driver.ctxGetCurrent():
            cuda.runtime.setDevice(device)
        _THREAD.checked = True
    return current()
