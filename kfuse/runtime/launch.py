"""Kernel launches bound to one call signature: arguments packed once, buffers per call.

A program's kernels take buffers, sizes and runtime parameters. For one signature (the
sizes of the arrays a pipeline is called with) the sizes and the grid never change, so
they are packed once into an :class:`ArgumentBlock` (CUDA's ``kernelParams`` convention:
an array of pointers, each to where one argument's value lies); a call writes only the
buffer addresses and parameter values into it and launches. Both compiled backends take
this block: the GPU through ``cuLaunchKernel``, the cpu backend through the launcher the
generated source exports (:mod:`kfuse.runtime.cpu_backend`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kfuse.codegen.program import LaunchSpec, Program

_C_VALUES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "float16": ctypes.c_float,
             "bfloat16": ctypes.c_float, "int8": ctypes.c_int8,
             "uint8": ctypes.c_uint8, "int16": ctypes.c_int16, "uint16": ctypes.c_uint16,
             "int64": ctypes.c_int64, "int32": ctypes.c_int32,
             "bool": ctypes.c_bool}


class ArgumentBlock:
    """The argument array of one kernel launch: sizes packed once, buffer addresses and
    runtime parameters written in by :meth:`write` before each launch."""

    def __init__(self, spec: LaunchSpec, sizes: Mapping[str, int]):
        values: list[Any] = []
        self.buffer_slots: list[tuple[Any, str]] = []
        self.param_slots: list[tuple[Any, str]] = []
        for param in spec.params:
            if param.role in ("input", "output"):
                value = ctypes.c_void_p(0)
                self.buffer_slots.append((value, param.ref))
            elif param.role == "size":
                value = ctypes.c_int32(sizes[param.ref])
            elif param.role == "blocks":  # a part's blocks along an axis (side by side)
                part, axis = map(int, param.ref.split("."))
                value = ctypes.c_uint32(spec.part_blocks(sizes)[part][axis])
            else:
                value = _C_VALUES[param.dtype]()
                self.param_slots.append((value, param.ref))
            values.append(value)
        self.values = values  # kept alive: the array points into them
        self.array = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.addressof(value) for value in values])
        self.address = ctypes.addressof(self.array)

    def write(self, addresses: Mapping[str, int], params: Mapping[str, Any]) -> None:
        """Point the buffer arguments at ``addresses`` (by buffer name) and set the runtime
        parameters to ``params`` (by name)."""
        for value, name in self.buffer_slots:
            value.value = addresses[name]
        for value, name in self.param_slots:
            value.value = params[name]


@dataclass
class BoundLaunch:
    """One kernel of a program at one signature: its compiled function, grid, packed
    arguments, and the outputs set to a value before it runs (reductions' identities)."""

    spec: LaunchSpec
    function: Any
    grid: tuple[int, int, int]
    arguments: ArgumentBlock
    fills: tuple[tuple[str, float], ...]
    # grid, block and dynamic shared bytes in cuLaunchKernel's order (made once)
    shape: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.shape = (*self.grid, *self.spec.block, self.spec.dynamic_shared_bytes)


def bind_launches(program: Program, sizes: Mapping[str, int],
                  function_of: Callable[[LaunchSpec], Any],
                  resident_blocks: Callable[[LaunchSpec], int | None]) -> tuple[BoundLaunch, ...]:
    """Every launch of ``program`` bound at ``sizes``: ``function_of(spec)`` is the
    backend's compiled function, ``resident_blocks(spec)`` how many of its blocks the
    device holds at once (for grids that fill one wave; None where not known)."""
    bound = []
    for spec in program.launches:
        resident = resident_blocks(spec) if spec.fills_wave else None
        bound.append(BoundLaunch(spec, function_of(spec), spec.grid_size(sizes, resident),
                                 ArgumentBlock(spec, sizes), spec.initial_values))
    return tuple(bound)


def bound_launches_copy(launches: tuple[BoundLaunch, ...], sizes: Mapping[str, int]
                        ) -> tuple[BoundLaunch, ...]:
    """The same launches with argument blocks of their own (one set per workspace, so that
    two calls writing addresses at once do not share one block)."""
    return tuple(BoundLaunch(launch.spec, launch.function, launch.grid,
                             ArgumentBlock(launch.spec, sizes), launch.fills)
                 for launch in launches)


def call_slots(launches: Sequence[BoundLaunch], fixed: Mapping[str, int],
               arrays: Sequence[str], params: Sequence[str]
               ) -> tuple[tuple[tuple[Any, int], ...], tuple[tuple[Any, int], ...]]:
    """Point the buffer arguments of ``launches`` named in ``fixed`` at their addresses
    once (a workspace's own buffers), and return what each call writes: for every argument
    that is one of ``arrays`` (a call's inputs and outputs, in order) the slot and that
    array's index, and for every runtime parameter the slot and the index in ``params``."""
    array_index = {name: index for index, name in enumerate(arrays)}
    param_index = {name: index for index, name in enumerate(params)}
    array_slots: list[tuple[Any, int]] = []
    param_slots: list[tuple[Any, int]] = []
    for launch in launches:
        for value, name in launch.arguments.buffer_slots:
            if name in array_index:
                array_slots.append((value, array_index[name]))
            else:
                value.value = fixed[name]
        param_slots.extend((value, param_index[name])
                           for value, name in launch.arguments.param_slots)
    return tuple(array_slots), tuple(param_slots)
