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
from kfuse.runtime.backend import CompiledBackend, Executable
from kfuse.runtime.host_compiler import compile_host_library, find_compiler, load_host_library

_NUMPY_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
                 "bool": np.bool_}


def launcher_source(spec: LaunchSpec) -> str:
    """An ``extern "C"`` host function that runs one kernel through the shim."""
    arguments = []
    for index, param in enumerate(spec.params):
        ctype = param.ctype.replace("__restrict__", "").strip()
        if param.role in ("input", "output"):
            arguments.append(f"({ctype})args[{index}]")
        else:
            arguments.append(f"*({ctype.replace('const ', '')} const*)args[{index}]")
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


class CpuExecutable(Executable):
    def compile(self, program: Program) -> None:
        path = compile_host_library(host_source(program), name_hint=program.name)
        self.library = load_host_library(path)

    def address(self, buffer: np.ndarray) -> int:
        return buffer.ctypes.data

    def upload(self, array: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(array)).copy()

    def full(self, shape: tuple[int, ...], dtype: str, value: float) -> np.ndarray:
        return np.full(shape, value, dtype=_NUMPY_DTYPES[dtype])

    def fill(self, buffer: np.ndarray, value: float) -> None:
        buffer.fill(value)

    def launch(self, spec: LaunchSpec, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: list[Any]) -> None:
        keep = []
        pointers = (ctypes.c_void_p * len(args))()
        for index, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                pointers[index] = arg.ctypes.data
            else:
                scalar = np.array(arg)
                keep.append(scalar)
                pointers[index] = scalar.ctypes.data
        function = getattr(self.library, f"kf_launch_{spec.symbol}")
        function.restype = ctypes.c_int
        status = function((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                          ctypes.c_ulonglong(spec.dynamic_shared_bytes), pointers)
        if status != 0:
            describe = self.library.kf_last_error
            describe.restype = ctypes.c_char_p
            raise LaunchError(f"launch of {spec.symbol} failed (status {status}): "
                              f"{describe().decode(errors='replace')}",
                              operator=",".join(spec.operators))

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
