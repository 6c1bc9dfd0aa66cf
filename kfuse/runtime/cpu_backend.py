"""The ``cpu`` backend: the generated CUDA C, compiled by the host C++ compiler.

The source is exactly what the GPU gets; the CPU shim runs each block's threads as real
threads. A small ``extern "C"`` launcher per kernel, appended here, lets ctypes call it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kfuse import config
from kfuse.codegen.program import LaunchSpec, Program
from kfuse.errors import BackendUnavailable, BindError, LaunchError
from kfuse.runtime.backend import POISON, CompiledBackend, Executable, LoadedProgram
from kfuse.runtime.host_compiler import compile_and_load, find_compiler
from kfuse.runtime.launch import BoundLaunch
from kfuse.runtime.numpy_backend import numpy_dtype

if TYPE_CHECKING:
    from kfuse.runtime.compiled import ArrayFacts



def launcher_source(spec: LaunchSpec) -> str:
    """An ``extern "C"`` host function that runs one kernel through the shim."""
    arguments = []  # CUDA's kernelParams convention: args[i] points to argument i's value
    for index, param in enumerate(spec.params):
        ctype = param.ctype.replace("__restrict__", "").strip()
        arguments.append(f"*({ctype.replace('const ', '')} const*)args[{index}]"
                         if param.role not in ("input", "output") else
                         f"*({ctype}*)args[{index}]")
    call = f"{spec.symbol}({', '.join(arguments)})"
    return (
        f'extern "C" int kf_launch_{spec.symbol}(const unsigned* grid, const unsigned* block,\n'
        f"    unsigned long long shared_bytes, void** args) {{\n"
        f"  return kf_cpu::launch(dim3(grid[0], grid[1], grid[2]),\n"
        f"                        dim3(block[0], block[1], block[2]), shared_bytes,\n"
        f"                        [&]() {{ {call}; }});\n"
        f"}}\n"
    )


def host_source(program: Program) -> str:
    """The program's CUDA C followed by its host launchers."""
    launchers = "\n".join(launcher_source(spec) for spec in program.launches)
    error = 'extern "C" const char* kf_last_error() { return kf_cpu::last_error(); }\n'
    return f"{program.source}\n#if !defined(__CUDACC__)\n{launchers}{error}#endif\n"


class CpuLoadedProgram(LoadedProgram):
    """A program compiled by the host compiler into a library whose launchers run each
    kernel through the shim (synchronously: the host has no streams)."""

    _loaded = {}

    def __init__(self, program: Program):
        super().__init__(program)
        library = compile_and_load(host_source(program), name_hint=program.name)
        self.library = library
        for spec in program.launches:
            function = getattr(library, f"kf_launch_{spec.symbol}")
            function.restype = ctypes.c_int
            function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong,
                                 ctypes.c_void_p)
            self.functions[spec.symbol] = function

    def current_stream(self) -> None:
        return None

    def enqueue(self, launches, buffers, stream, schedule=None, side=None) -> None:
        """Launch in order (the host has no streams); under the ``check_writes`` switch of
        :mod:`kfuse.config`, every kernel on guarded copies of its arrays
        (:func:`checked_launch`)."""
        if not config.current().check_writes:
            super().enqueue(launches, buffers, stream, schedule, side)
            return
        for launch in launches:
            for name, value in launch.fills:
                self.fill(buffers[name], value, stream)
            checked_launch(launch, buffers, lambda bound=launch: self.launch(bound, stream))

    def launch(self, launch: BoundLaunch, stream: Any) -> None:
        spec = launch.spec
        status = launch.function((ctypes.c_uint * 3)(*launch.grid),
                                 (ctypes.c_uint * 3)(*spec.block),
                                 spec.dynamic_shared_bytes, launch.arguments.address)
        if status != 0:
            raise self.launch_error(launch, status)

    def launch_error(self, launch: BoundLaunch | None, status: int) -> LaunchError:
        describe = self.library.kf_last_error
        describe.restype = ctypes.c_char_p
        spec = launch.spec if launch is not None else None
        return LaunchError(f"launch of {spec.symbol if spec else self.program.name} failed "
                           f"(status {status}): {describe().decode(errors='replace')}",
                           operator=",".join(spec.operators) if spec else None)

    def native_launch(self) -> tuple[int, int | None]:
        from kfuse.runtime import native

        built = native.module()
        if built is None:
            raise BackendUnavailable("the C call path is not built")
        return built.host_launch_address(), None

    def native_function(self, launch: BoundLaunch) -> int:
        return ctypes.cast(launch.function, ctypes.c_void_p).value  # kf_launch_<kernel>

    def fill(self, buffer: np.ndarray, value: float, stream: Any) -> None:
        buffer.fill(value)


GUARD_BYTES = 4096  # bytes before and after each array a checked launch watches
GUARD_BYTE = 0xA5


def checked_launch(launch: BoundLaunch, buffers: Mapping[str, np.ndarray],
                   run: Callable[[], None]) -> None:
    """``run()`` the launch on copies of its arrays, each between two guard zones, and
    refuse, naming the kernel's operators, a write into a guard zone (outside the array) or
    into an array the kernel does not write (a user kernel's declarations: kf.written);
    what it writes is copied back."""
    operators = ", ".join(launch.spec.operators)
    outputs = {p.ref for p in launch.spec.params if p.role == "output"}
    copies: list[tuple[object, str, int, np.ndarray]] = []
    for slot, name in launch.arguments.buffer_slots:
        data = buffers[name].reshape(-1).view(np.uint8)
        guarded = np.full(data.size + 2 * GUARD_BYTES, GUARD_BYTE, dtype=np.uint8)
        guarded[GUARD_BYTES:GUARD_BYTES + data.size] = data
        copies.append((slot, name, slot.value, guarded))
        slot.value = guarded.ctypes.data + GUARD_BYTES
    try:
        run()
    finally:
        for slot, _, address, _ in copies:
            slot.value = address
    for _, name, _, guarded in copies:
        size = guarded.size - 2 * GUARD_BYTES
        for zone, place in ((guarded[:GUARD_BYTES], "before"),
                            (guarded[GUARD_BYTES + size:], "after")):
            if np.any(zone != GUARD_BYTE):
                raise LaunchError(f"kernel '{launch.spec.symbol}' wrote outside array "
                                  f"'{name}' (in the {GUARD_BYTES} bytes {place} it)",
                                  operator=operators)
        inside = guarded[GUARD_BYTES:GUARD_BYTES + size]
        data = buffers[name].reshape(-1).view(np.uint8)
        if name in outputs:
            data[:] = inside
        elif not np.array_equal(inside, data):
            raise LaunchError(f"kernel '{launch.spec.symbol}' wrote into '{name}', which it "
                              "does not declare as written (declare it with kf.written)",
                              operator=operators)


class HostArrays:
    """The cpu backend's arrays: NumPy, in host memory; work runs as it is called. Fresh
    buffers are filled with a poison value (NaN, a sentinel integer), so that an element no
    kernel writes shows in the tests rather than passing with stale memory."""

    captures = False  # no streams, no CUDA graphs: work runs as it is launched

    def copies_in(self, facts: ArrayFacts) -> bool:
        """Whether a call copies this input in (besides a non-contiguous one): never."""
        return False

    def placement(self, facts: Mapping[str, ArrayFacts]) -> tuple[str, None]:
        for name, fact in facts.items():
            if fact.family == "cupy" or fact.family == "torch" and fact.device is not None:
                raise BindError(f"input '{name}' is in GPU memory; the cpu backend takes "
                                "arrays in host memory (NumPy)")
        return "numpy", None

    def on_device(self, device: None) -> Any:
        from contextlib import nullcontext
        return nullcontext()

    def allocator(self, family: str, device: None
                  ) -> Callable[[tuple, str], tuple[np.ndarray, int]]:
        def allocate(shape: tuple, dtype: str) -> tuple[np.ndarray, int]:
            array = np.full(shape, POISON[dtype], dtype=numpy_dtype(dtype))
            return array, array.ctypes.data
        return allocate

    def current_device(self) -> None:
        return None

    def contiguous(self, array: Any, device: None) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(array))

    def address(self, array: np.ndarray) -> int:
        return array.ctypes.data

    def stream_function(self, family: str, device: None) -> None:
        return None  # the host has no streams

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return array  # already there

    def check_out(self, name: str, facts: ArrayFacts, device: None) -> None:
        if facts.family != "numpy":
            raise BindError(f"out= array for '{name}' must be a NumPy array on the cpu backend")
        if not facts.contiguous:
            raise BindError(f"out= array for '{name}' must be C-contiguous")


class CpuExecutable(Executable):
    loaded_class = CpuLoadedProgram

    def address(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    def upload(self, array: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(array)).copy()

    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> np.ndarray:
        return np.full(shape, value, dtype=numpy_dtype(dtype))

    def download(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()


class CpuBackend(CompiledBackend):
    """Runs generated CUDA C on the host through the CPU shim (how CI executes kernels)."""

    name = "cpu"
    executable_class = CpuExecutable
    arrays_class = HostArrays

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            find_compiler()
        except BackendUnavailable as error:
            return error.detail
        return None
