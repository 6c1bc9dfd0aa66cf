"""``@kfuse.jit``: a Python function of kfuse operators, traced into a pipeline on its first
call and compiled per call signature, in the manner of ``cupy.fuse``, ``numba.jit`` and
``torch.compile``.

The function takes arrays (NumPy, CuPy, PyTorch) and scalars; it is called once per kind of
arguments (each array's number of axes and dtype, each scalar's type) with symbolic arrays
and parameters, and what it returns names the outputs: one array, a tuple of arrays, or a
dict of arrays by name. Operators inside are named by their kind (``point``, ``local_2``),
never from the source text, so a function traced under ``python -c`` or ``exec`` makes the
same pipeline as one in a file.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kfuse.dsl.pipeline import Array, Pipeline
from kfuse.errors import BindError, DslError
from kfuse.runtime.binding import dtype_name
from kfuse.runtime.compiled import CacheStats, CompiledPipeline

_SCALAR_DTYPES = {bool: "bool", int: "int32", float: "float32"}


class JitFunction:
    """A function compiled by :func:`jit`: call it as the function itself."""

    def __init__(self, function: Callable[..., Any], backend: str, plan: Any,
                 max_signatures: int, graphs: bool):
        self.function = function
        self.backend = backend
        self.plan = plan
        self.max_signatures = max_signatures
        self.graphs = graphs
        parameters = inspect.signature(function).parameters.values()
        for parameter in parameters:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise DslError(f"@kfuse.jit: '{function.__name__}' takes *{parameter.name}: "
                               "name every argument")
        self.names = tuple(parameter.name for parameter in parameters)
        self.defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        self.traces: dict[tuple, tuple[CompiledPipeline, Any]] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, function)

    @property
    def stats(self) -> CacheStats:
        """The cache statistics of every traced pipeline, added up."""
        total = CacheStats()
        for compiled, _ in list(self.traces.values()):
            for name, value in compiled.stats.as_dict().items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self.names):
            raise BindError(f"{self.function.__name__}() takes {len(self.names)} arguments, "
                            f"got {len(args)}")
        given = dict(self.defaults)
        given.update(zip(self.names, args, strict=False))
        given.update(kwargs)
        if len(given) != len(self.names) or not given.keys() <= set(self.names):
            missing = [n for n in self.names if n not in given]
            unknown = [n for n in given if n not in self.names]
            raise BindError(f"{self.function.__name__}() "
                            + (f"needs {', '.join(map(repr, missing))}" if missing else
                               f"takes no argument {', '.join(map(repr, unknown))}"))
        kinds = tuple(_kind(name, given[name]) for name in self.names)
        traced = self.traces.get(kinds)
        if traced is None:
            with self._lock:
                traced = self.traces.get(kinds) or self._trace(kinds)
                self.traces[kinds] = traced
        compiled, shape_of_result = traced
        results = compiled(**given)
        return _restructure(shape_of_result, results)

    def _trace(self, kinds: tuple) -> tuple[CompiledPipeline, Any]:
        """The function traced for arguments of ``kinds`` into a compiled pipeline, and the
        structure of its result (output names in place of arrays)."""
        pipeline = Pipeline(self.function.__name__ if self.function.__name__.isidentifier()
                            else "jit", names_from_source=False)
        symbols = {}
        for name, (role, ndim_or_dtype, dtype) in zip(self.names, kinds, strict=True):
            symbols[name] = (pipeline.input(name, ndim=ndim_or_dtype, dtype=dtype)
                             if role == "array" else pipeline.param(name, dtype))
        result = self.function(**symbols)
        structure = _outputs(pipeline, result, self.function.__name__)
        compiled = CompiledPipeline(pipeline.graph, self.backend, self.plan,
                                    max_signatures=self.max_signatures, graphs=self.graphs)
        return compiled, structure


def _kind(name: str, value: Any) -> tuple:
    """How an argument is traced: ("array", ndim, dtype) or ("param", None, dtype)."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        return ("array", len(value.shape), dtype_name(value))
    if isinstance(value, np.generic):
        return ("param", None, dtype_name(value))
    if type(value) in _SCALAR_DTYPES:
        return ("param", None, _SCALAR_DTYPES[type(value)])
    raise BindError(f"argument '{name}' must be an array or a number, got "
                    f"{type(value).__name__}")


def _outputs(pipeline: Pipeline, result: Any, function: str) -> Any:
    """Mark what the traced function returned as outputs; the same structure of names."""
    from kfuse.dsl.ops import point

    def output(value: Any) -> str:
        if not isinstance(value, Array) or value.pipeline is not pipeline:
            raise DslError(f"@kfuse.jit: '{function}' must return arrays made by kfuse "
                           f"operators (one, a tuple or a dict of them), got "
                           f"{type(value).__name__}")
        if value.name in pipeline.inputs:
            value = point(value)  # an input returned as it is: a copy
        pipeline.output(value)
        return value.name

    if isinstance(result, Mapping):
        return {key: output(value) for key, value in result.items()}
    if isinstance(result, (tuple, list)):
        return tuple(output(value) for value in result)
    return output(result)


def _restructure(structure: Any, results: Mapping[str, Any]) -> Any:
    if isinstance(structure, str):
        return results[structure]
    if isinstance(structure, tuple):
        return tuple(results[name] for name in structure)
    return {key: results[name] for key, name in structure.items()}


def jit(function: Callable[..., Any] | None = None, *, backend: str = "auto",
        plan: Any = "auto", max_signatures: int = 64, graphs: bool = True) -> Any:
    """Compile a function of kfuse operators: ``@kfuse.jit`` or
    ``@kfuse.jit(backend="cpu", plan="unfused")``. Its arrays become the pipeline's inputs
    and its scalars runtime parameters (float: float32, int: int32, NumPy scalars their
    dtype); it returns what the function returns, computed."""
    def decorate(inner: Callable[..., Any]) -> JitFunction:
        return JitFunction(inner, backend, plan, max_signatures, graphs)
    return decorate if function is None else decorate(function)


__all__ = ["JitFunction", "jit"]
