"""The ``cuda`` backend: NVRTC through CuPy, compiled modules cached on disk by source hash.

Accepts CuPy arrays and PyTorch CUDA tensors without copying, and NumPy arrays (copied in
and out); outputs come back in the kind of array the inputs were.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from kfuse.cache import writable_cache_dir, write_atomically
from kfuse.codegen.program import LaunchSpec, Program
from kfuse.errors import BackendUnavailable, CompileError, LaunchError
from kfuse.ir.graph import Graph
from kfuse.runtime.backend import CompiledBackend, Executable
from kfuse.runtime.binding import Bound
from kfuse.runtime.occupancy import blocks_per_multiprocessor

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


def compile_cubin(source: str, arch: str) -> Path:
    """Compile with NVRTC into a cubin under the cache directory (reused by source hash)."""
    options = (*NVRTC_OPTIONS, f"--gpu-architecture={arch}")
    digest = hashlib.sha256((source + "\0" + " ".join(options)).encode()).hexdigest()[:24]
    path = cache_dir() / f"{digest}.cubin"
    if path.exists():
        return path
    from cupy_backends.cuda.libs import nvrtc
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
    return path


@functools.lru_cache(maxsize=256)
def load_module(source: str):
    """The CuPy module of a program's source (compiled once per process and source)."""
    cupy = _cupy()
    return cupy.RawModule(path=str(compile_cubin(source, device_arch())))


DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a launch may use without opting in


def _kind(array: Any) -> str:
    module = type(array).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    return "numpy"


class CudaExecutable(Executable):
    def __init__(self, graph: Graph, bound: Bound):
        super().__init__(graph, bound)
        self.cupy = _cupy()
        self.resident: dict[str, int] = {}
        kinds = {_kind(a) for a in bound.arrays.values()}
        self.output_kind = "numpy" if "numpy" in kinds or not kinds else (
            "torch" if "torch" in kinds else "cupy")

    def compile(self, program: Program) -> None:
        self.module = load_module(program.source)
        self.functions = {spec.symbol: self.module.get_function(spec.symbol)
                          for spec in program.launches}
        for spec in program.launches:  # beyond 48 KiB of dynamic shared memory: opt in
            if spec.dynamic_shared_bytes > DEFAULT_SHARED_LIMIT:
                self.functions[spec.symbol].max_dynamic_shared_size_bytes = \
                    spec.dynamic_shared_bytes
        self.resident = {}

    def address(self, buffer: Any) -> int:
        return buffer.data.ptr

    def upload(self, array: Any) -> Any:
        kind = _kind(array)
        if kind == "torch":
            if not array.is_cuda:
                array = array.cuda()
            return self.cupy.asarray(array.contiguous())
        return self.cupy.ascontiguousarray(self.cupy.asarray(array))

    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> Any:
        return self.cupy.full(shape, value, dtype=np.dtype(dtype if dtype != "bool" else "bool"))

    def fill(self, buffer: Any, value: float) -> None:
        buffer.fill(value)

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

    def launch(self, spec: LaunchSpec, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: list[Any]) -> None:
        try:
            self.functions[spec.symbol](grid, block, tuple(args),
                                        shared_mem=spec.dynamic_shared_bytes)
        except self.cupy.cuda.driver.CUDADriverError as error:
            raise LaunchError(f"launch of {spec.symbol} failed: {error}",
                              operator=",".join(spec.operators)) from error

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
    specialises_sizes = True

    @classmethod
    def available(cls) -> bool:
        try:
            _cupy()
        except BackendUnavailable:
            return False
        return True

    def marches_along_z(self, graph: Graph, sizes: Mapping[str, int]) -> bool:
        """Whether marching kernels pay on the current device (its peak DRAM bandwidth per
        multiprocessor cycle, from the device's attributes) for the 3-D volumes of ``graph``
        at ``sizes`` (each must fill the device in long chunks)."""
        from kfuse.codegen.marching import fills_device, pays_on

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
