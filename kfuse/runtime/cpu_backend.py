"""The ``cpu`` backend: the generated CUDA C, compiled by the host C++ compiler.

The source is exactly what the GPU gets; the CPU shim runs each block's threads as real
threads. A small ``extern "C"`` launcher per kernel, appended here, lets ctypes call it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kfuse.codegen.program import LaunchSpec, Program
from kfuse.errors import BackendUnavailable, LaunchError
from kfuse.runtime.backend import CompiledBackend, Executable, LoadedProgram
from kfuse.runtime.host_compiler import compile_and_load, find_compiler
from kfuse.runtime.launch import BoundLaunch

_NUMPY_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
                 "bool": np.bool_}


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

    def launch(self, launch: BoundLaunch, stream: Any) -> None:
        spec = launch.spec
        status = launch.function((ctypes.c_uint * 3)(*launch.grid),
                                 (ctypes.c_uint * 3)(*spec.block),
                                 spec.dynamic_shared_bytes, launch.arguments.address)
        if status != 0:
            describe = self.library.kf_last_error
            describe.restype = ctypes.c_char_p
            raise LaunchError(f"launch of {spec.symbol} failed (status {status}): "
                              f"{describe().decode(errors='replace')}",
                              operator=",".join(spec.operators))

    def fill(self, buffer: np.ndarray, value: float, stream: Any) -> None:
        buffer.fill(value)


class CpuExecutable(Executable):
    loaded_class = CpuLoadedProgram

    def address(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    def upload(self, array: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(array)).copy()

    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> np.ndarray:
        return np.full(shape, value, dtype=_NUMPY_DTYPES[dtype])

    def download(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()


class CpuBackend(CompiledBackend):
    """Runs generated CUDA C on the host through the CPU shim (how CI executes kernels)."""

    name = "cpu"
    executable_class = CpuExecutable

    @classmethod
    def available(cls) -> bool:
        try:
            find_compiler()
        except BackendUnavailable:
            return False
        return True
