"""User CUDA kernels as operators of a pipeline.

A user brings a ``__global__`` function of their own (its source text and its name) and
declares, argument by argument, what it reads and writes: kfuse then orders it among the
pipeline's operators, allocates what it writes, launches it on both compiled backends (the
``cpu`` backend compiles it like generated code) and may run it side by side with another
kernel in one launch (horizontal fusion, :mod:`kfuse.codegen.horizontal`). It never fuses it
vertically: what the kernel does between its reads and writes is not known to kfuse.

    saxpy = kf.user_kernel(SOURCE, "saxpy",
                           args=[kf.read(x, radius=0), kf.written("y", like=x),
                                 kf.size(x), alpha],
                           block=(256,), grid=[(kf.size(x), 256)],
                           numpy=lambda x, alpha: alpha * x)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kfuse.cuda_limits import MAX_BLOCK_THREADS, WARP
from kfuse.dsl.pipeline import Array, Pipeline
from kfuse.errors import DslError, ShapeError
from kfuse.ir.expr import Param, normalize_dtype
from kfuse.ir.graph import (
    Kernel,
    OpaqueSpec,
    UserAccess,
    UserArgument,
    UserGridAxis,
)
from kfuse.user_line import user_line, where_of


@dataclass(frozen=True)
class Read:
    """An array a user kernel reads and how (:func:`read`)."""

    array: Array
    pattern: str
    radius: tuple[int, ...] = ()


@dataclass(frozen=True)
class Written:
    """An array a user kernel writes (:func:`written`): its name, dtype, shape (size
    symbols or fixed sizes) and whether each thread writes only its own element."""

    name: str
    dtype: str | None
    shape: tuple[str | int, ...] | None
    like: Array | None
    elementwise: bool
    initial: float | None = None


@dataclass(frozen=True)
class Size:
    """A size passed to a user kernel as an int: one axis of an array, or (no axis) the
    number of its elements."""

    array: Array
    axis: int | None


def read(array: Array, *, radius: int | Sequence[int] | None = None) -> Read:
    """``array`` as a user kernel reads it: ``radius=0`` elementwise (thread i reads element
    i), ``radius=r`` (or one per axis) a stencil within r of it, None anywhere (whole)."""
    if not isinstance(array, Array):
        raise DslError(f"kf.read() takes an array of the pipeline, got {array!r}")
    if radius is None:
        return Read(array, "whole")
    radii = (radius,) * array.ndim if isinstance(radius, numbers.Integral) else tuple(radius)
    if len(radii) != array.ndim or not all(isinstance(r, numbers.Integral) and r >= 0
                                           for r in radii):
        raise DslError(f"kf.read('{array.name}'): radius must be a non-negative integer or one "
                       f"per axis ({array.ndim}), got {radius!r}")
    radii = tuple(int(r) for r in radii)
    return Read(array, "elementwise" if not any(radii) else "stencil", radii)


def written(name: str, *, like: Array | None = None, shape: Sequence[str | int] | None = None,
            dtype: object = None, elementwise: bool = True,
            initial: float | None = None) -> Written:
    """An array a user kernel writes, named ``name``: of ``like``'s shape and dtype (or
    ``shape``: size symbols of the pipeline's arrays or fixed sizes, and ``dtype``);
    ``elementwise=False``: a thread may write anywhere in it (a histogram); ``initial``:
    every element set to this value before the kernel runs (what its atomics add to)."""
    if initial is not None and (isinstance(initial, bool) or not isinstance(
            initial, numbers.Real) or not math.isfinite(float(initial))):
        raise DslError(f"kf.written('{name}'): initial= takes a finite number, got {initial!r}")
    if like is None and shape is None:
        raise DslError(f"kf.written('{name}'): give like= (an array of the same shape) or "
                       "shape=")
    if like is not None and not isinstance(like, Array):
        raise DslError(f"kf.written('{name}'): like= takes an array of the pipeline, "
                       f"got {like!r}")
    return Written(name, None if dtype is None else normalize_dtype(dtype),
                   None if shape is None else tuple(shape), like, bool(elementwise),
                   None if initial is None else float(initial))


def size(array: Array, axis: int | None = None) -> Size:
    """The size of ``array`` along ``axis`` (None: its number of elements), passed as int."""
    if not isinstance(array, Array):
        raise DslError(f"kf.size() takes an array of the pipeline, got {array!r}")
    if axis is not None and not (isinstance(axis, numbers.Integral)
                                 and -array.ndim <= axis < array.ndim):
        raise DslError(f"kf.size('{array.name}', {axis!r}): no such axis of a "
                       f"{array.ndim}-D array")
    return Size(array, None if axis is None else int(axis) % array.ndim)


def user_kernel(source: str, entry: str, args: Sequence[Any], *,
                block: Sequence[int] = (256,), grid: Sequence[Any] | None = None,
                shared_bytes: int = 0, any_block: bool = False, operations: float = 0.0,
                numpy: Callable[..., Any] | None = None,
                name: str | None = None) -> Array | tuple[Array, ...]:
    """A user's CUDA kernel ``entry`` (a ``__global__`` function of ``source``) as an
    operator; returns the arrays it writes (one, or a tuple in ``args`` order).

    ``args`` lists the function's parameters in order: an array it reads (a plain array:
    anywhere in it; :func:`read` says how), :func:`written` for an array it writes (kfuse
    allocates it), :func:`size` for an int size, a parameter of the pipeline
    (``pipeline.param``) or a Python number (a constant). ``block``: threads per block (x,
    y, z); ``grid``: blocks per axis (x, y, z), each an int or ``(size, per_block)``
    (ceil(size / per_block) blocks); None covers the first written array with one thread per
    element (x along its last axis). ``shared_bytes``: the dynamic shared memory it takes
    (declare it with ``KF_DYNAMIC_SHARED(type, name)``, which both backends provide, not
    ``extern __shared__``). ``any_block``: the kernel is correct at any 1-D block of whole
    warps (it reads ``blockDim``), so horizontal fusion may give it another block size.
    ``operations``: arithmetic per thread (the cost models' compute estimate; 0: memory
    bound). ``numpy``: computes its writes from the arrays it reads and its parameters (in
    ``args`` order), for the ``numpy`` backend and verification.
    """
    line = user_line()
    where = where_of(line)
    label = name or (entry if isinstance(entry, str) else "user_kernel")
    if not isinstance(source, str) or not source.strip():
        raise DslError("user_kernel() takes the kernel's CUDA C source as a string",
                       operator=label, where=where)
    if not isinstance(entry, str) or not entry.isidentifier():
        raise DslError(f"user_kernel(): the entry must be the kernel function's name, got "
                       f"{entry!r}", operator=label, where=where)
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise DslError("user_kernel(): args lists the kernel's parameters in order",
                       operator=label, where=where)
    pipeline = _pipeline_of(args, label, where)
    block3 = _block(block, label, where)
    with pipeline.all_or_nothing():
        arguments, reads, writes, new_arrays = _arguments(pipeline, args, label, where)
        if not writes:
            raise DslError("user_kernel(): declare what the kernel writes with kf.written()",
                           operator=label, where=where)
        first = new_arrays[0]
        grid3 = _grid(grid, block3, first, label, where)
        if not isinstance(shared_bytes, numbers.Integral) or shared_bytes < 0:
            raise DslError(f"shared_bytes must be a non-negative integer, got "
                           f"{shared_bytes!r}", operator=label, where=where)
        if any_block and (block3[1:] != (1, 1) or block3[0] % WARP):
            raise DslError(f"any_block=True needs a 1-D block of whole warps, got {block3}",
                           operator=label, where=where)
        if numpy is not None and not callable(numpy):
            raise DslError(f"numpy= takes a function, got {numpy!r}", operator=label,
                           where=where)
        spec = OpaqueSpec(source, entry, tuple(arguments), tuple(reads), tuple(writes), block3,
                          grid3, int(shared_bytes), bool(any_block), float(operations), numpy)
        operator = _operator_name(pipeline, name, entry, label, where)
        kernel = Kernel(operator, "opaque", first._shape, None,
                        tuple(access.buffer for access in writes), None, spec, where)
        pipeline._kernels.append(kernel)
    return new_arrays[0] if len(new_arrays) == 1 else tuple(new_arrays)


def _operator_name(pipeline: Pipeline, name: str | None, entry: str, label: str,
                   where: str | None) -> str:
    """``name``, or the entry's name made unique among the pipeline's operators and arrays
    (a second use of one kernel is ``entry_2``)."""
    taken = {k.name for k in pipeline._kernels} | set(pipeline._arrays) | set(pipeline._params)
    if name is not None:
        if not isinstance(name, str) or not name.isidentifier() or name in taken:
            raise DslError(f"name= must be a new identifier, got {name!r}", operator=label,
                           where=where)
        return name
    candidate, counter = entry, 2
    while candidate in taken:
        candidate, counter = f"{entry}_{counter}", counter + 1
    return candidate


def _pipeline_of(args: Sequence[Any], label: str, where: str | None) -> Pipeline:
    arrays = [a for arg in args for a in (
        [arg] if isinstance(arg, Array) else
        [arg.array] if isinstance(arg, (Read, Size)) else
        [arg.like] if isinstance(arg, Written) and arg.like is not None else [])]
    pipelines = {id(a.pipeline): a.pipeline for a in arrays}
    if not pipelines:
        raise DslError("user_kernel(): args name no array of a pipeline (read one, or give "
                       "kf.written(..., like=array))", operator=label, where=where)
    if len(pipelines) > 1:
        raise DslError("user_kernel(): args mix arrays of different pipelines",
                       operator=label, where=where)
    return next(iter(pipelines.values()))


def _block(block: Sequence[int], label: str, where: str | None) -> tuple[int, int, int]:
    values = (block,) if isinstance(block, numbers.Integral) else tuple(block)
    if not 1 <= len(values) <= 3 or not all(isinstance(v, numbers.Integral) and v > 0
                                            for v in values):
        raise DslError(f"block must be 1 to 3 positive integers (x, y, z), got {block!r}",
                       operator=label, where=where)
    block3 = tuple(int(v) for v in values) + (1,) * (3 - len(values))
    if math.prod(block3) > MAX_BLOCK_THREADS:
        raise DslError(f"block {block3} has {math.prod(block3)} threads; a block holds at most "
                       f"{MAX_BLOCK_THREADS}", operator=label, where=where)
    return block3  # type: ignore[return-value]


def _arguments(pipeline: Pipeline, args: Sequence[Any], label: str, where: str | None
               ) -> tuple[list[UserArgument], list[UserAccess], list[UserAccess], list[Array]]:
    arguments: list[UserArgument] = []
    reads: dict[str, UserAccess] = {}
    writes: list[UserAccess] = []
    new_arrays: list[Array] = []
    for index, arg in enumerate(args):
        what = f"argument {index}"
        if isinstance(arg, Array):
            arg = Read(arg, "whole")
        if isinstance(arg, Read):
            array = arg.array
            if array.name not in pipeline._arrays:
                raise DslError(f"{what}: array '{array.name}' does not belong to pipeline "
                               f"'{pipeline.name}'", operator=label, where=where)
            if array.name in [w.buffer for w in writes]:
                raise DslError(f"{what}: '{array.name}' is written by this kernel; a kernel "
                               "that reads what it writes is one argument (kf.written)",
                               operator=label, where=where)
            reads.setdefault(array.name, UserAccess(array.name, arg.pattern, arg.radius))
            arguments.append(UserArgument("input", array.name, array.dtype))
        elif isinstance(arg, Written):
            array = _new_array(pipeline, arg, label, where)
            writes.append(UserAccess(array.name, "elementwise" if arg.elementwise else "whole",
                                     initial=arg.initial))
            new_arrays.append(array)
            arguments.append(UserArgument("output", array.name, array.dtype))
        elif isinstance(arg, Size):
            symbols = arg.array._shape if arg.axis is None else (arg.array._shape[arg.axis],)
            arguments.append(UserArgument("size", "*".join(pipeline._find(s) for s in symbols)
                                          or "1", "int32"))
        elif isinstance(arg, Param):
            if arg.name not in pipeline._params:
                raise DslError(f"{what}: parameter '{arg.name}' belongs to another pipeline",
                               operator=label, where=where)
            arguments.append(UserArgument("param", arg.name, arg.dtype))
        elif isinstance(arg, (bool, numbers.Integral, numbers.Real)):
            dtype = ("bool" if isinstance(arg, bool) else
                     "int64" if isinstance(arg, numbers.Integral) else "float64")
            if not math.isfinite(float(arg)):
                raise DslError(f"{what}: a constant must be finite, got {arg!r}",
                               operator=label, where=where)
            arguments.append(UserArgument("constant", repr(arg if dtype != "float64"
                                                           else float(arg)), dtype))
        else:
            raise DslError(f"{what}: {arg!r} is not an array, kf.read(), kf.written(), "
                           "kf.size(), a parameter or a number", operator=label, where=where)
    return arguments, list(reads.values()), writes, new_arrays


def _new_array(pipeline: Pipeline, declared: Written, label: str, where: str | None) -> Array:
    from kfuse.dsl.pipeline import _size_symbol
    pipeline._check_new_name(declared.name)
    if declared.like is not None:
        shape = declared.like._shape
        dtype = declared.dtype or declared.like.dtype
    else:
        if isinstance(declared.shape, (str, bytes)) or not 1 <= len(declared.shape) <= 3:
            raise ShapeError(f"kf.written('{declared.name}'): shape must be 1 to 3 sizes, got "
                             f"{declared.shape!r}", operator=label, where=where)
        known = {pipeline._find(s) for a in pipeline._arrays.values() for s in a._shape}
        shape = []
        for axis, extent in enumerate(declared.shape):
            symbol = _size_symbol(declared.name, axis, extent)
            if not symbol.isdecimal() and pipeline._find(symbol) not in known:
                raise ShapeError(f"kf.written('{declared.name}'): size '{extent}' is no size of "
                                 "the pipeline's arrays (take them from an array's .shape)",
                                 operator=label, where=where)
            shape.append(pipeline._find(symbol) if not symbol.isdecimal() else symbol)
        shape = tuple(shape)
        dtype = declared.dtype or "float32"
    array = Array(pipeline, declared.name, dtype, tuple(shape))
    pipeline._arrays[declared.name] = array
    return array


def _grid(grid: Sequence[Any] | None, block: tuple[int, int, int], first: Array, label: str,
          where: str | None) -> tuple[UserGridAxis, UserGridAxis, UserGridAxis]:
    if grid is None:  # one thread per element of the first written array, x its last axis
        shape = tuple(reversed(first._shape))
        return tuple(UserGridAxis((shape[axis],), block[axis]) if axis < len(shape)
                     else UserGridAxis() for axis in range(3))  # type: ignore[return-value]
    entries = (grid,) if isinstance(grid, numbers.Integral) else tuple(grid)
    if not 1 <= len(entries) <= 3:
        raise DslError(f"grid gives 1 to 3 axes (x, y, z), got {grid!r}", operator=label,
                       where=where)
    axes = []
    for entry in entries:
        if isinstance(entry, numbers.Integral) and not isinstance(entry, bool) and entry > 0:
            axes.append(UserGridAxis(blocks=int(entry)))
        elif (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], Size)
              and isinstance(entry[1], numbers.Integral) and entry[1] > 0):
            extent, per_block = entry
            symbols = (extent.array._shape if extent.axis is None
                       else (extent.array._shape[extent.axis],))
            axes.append(UserGridAxis(tuple(extent.array.pipeline._find(s) for s in symbols),
                                     int(per_block)))
        else:
            raise DslError(f"a grid axis is a positive int or (kf.size(...), per_block), got "
                           f"{entry!r}", operator=label, where=where)
    axes += [UserGridAxis()] * (3 - len(axes))
    return tuple(axes)  # type: ignore[return-value]


__all__ = ["Read", "Size", "Written", "read", "size", "user_kernel", "written"]
