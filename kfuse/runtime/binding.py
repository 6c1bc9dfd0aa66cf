"""Match call-time arguments to a pipeline's declared inputs and parameters."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kfuse.errors import BindError, DtypeError
from kfuse.ir.expr import (
    FLOAT32_ROUNDS_TO_INFINITY,
    INT_DTYPES,
    normalize_dtype,
    representable,
    round_to,
)
from kfuse.ir.graph import Graph

INT32_LIMIT = 2**31 - 1


def dtype_name(array: Any) -> str:
    """Our dtype name for a NumPy/CuPy array or a PyTorch tensor."""
    dtype = getattr(array, "dtype", None)
    if dtype is None:
        raise BindError(f"expected an array, got {type(array).__name__}")
    text = str(dtype).replace("torch.", "")
    try:
        return normalize_dtype(text)
    except DtypeError as error:
        raise BindError(error.detail) from None


def to_numpy(array: Any) -> np.ndarray:
    """A NumPy copy of a CuPy array or PyTorch tensor; NumPy arrays as they are."""
    if hasattr(array, "get"):  # CuPy
        return array.get()
    if hasattr(array, "detach"):  # PyTorch
        return array.detach().cpu().numpy()
    return np.asarray(array)


@dataclass(frozen=True)
class Bound:
    """Arguments checked against the graph, with every size symbol bound."""

    arrays: dict[str, Any]
    params: dict[str, Any]
    sizes: dict[str, int]

    def numel(self, graph: Graph, buffer: str) -> int:
        count = 1
        for size in graph.shape_of(buffer, self.sizes):
            count *= size
        return count

    def wide_index(self, graph: Graph) -> bool:
        """True if some buffer has more elements than a 32-bit index can address."""
        return any(self.numel(graph, name) > INT32_LIMIT for name in graph.buffers)


def param_value(name: str, dtype: str, value: Any) -> Any:
    """A runtime parameter's value as the Python number its kernels take (float, int or
    bool), or a :class:`~kfuse.errors.BindError` saying why ``value`` cannot be one."""
    if type(value) is float and (dtype == "float64" or dtype == "float32"
                                 and -FLOAT32_ROUNDS_TO_INFINITY < value
                                 < FLOAT32_ROUNDS_TO_INFINITY):
        return value  # the common case, checked first (a call takes it every time)
    if getattr(value, "ndim", 0) != 0 or isinstance(value, (str, bytes)):
        raise BindError(f"parameter '{name}' must be a scalar, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BindError(f"parameter '{name}' must be a number, got {value!r}") from None
    except OverflowError:
        raise BindError(f"parameter '{name}' is {dtype}, which cannot hold {value!r}") from None
    if not representable(number, dtype):  # (a bool parameter takes 0, 1, False, True)
        raise BindError(f"parameter '{name}' is {dtype}, which cannot hold {value!r}")
    if dtype in INT_DTYPES:  # (an integer as it is: beyond 2^53 a float would round it)
        return int(value) if isinstance(value, numbers.Integral) else int(number)
    return bool(number) if dtype == "bool" else round_to(float(number), dtype)


def bind(graph: Graph, given: Mapping[str, Any]) -> Bound:
    """Split keyword arguments into arrays and parameters; check names, dtypes and shapes."""
    expected = set(graph.inputs) | set(graph.params)
    unknown = sorted(set(given) - expected)
    if unknown:
        raise BindError(f"pipeline '{graph.name}' has no input or parameter named "
                        f"{', '.join(repr(u) for u in unknown)}; it takes "
                        f"{', '.join(sorted(expected))}")
    missing = sorted(expected - set(given))
    if missing:
        raise BindError(f"pipeline '{graph.name}' needs {', '.join(repr(m) for m in missing)}")
    arrays = {}
    for name in graph.inputs:
        array = given[name]
        declared = graph.buffers[name].dtype
        actual = dtype_name(array)
        if actual != declared:
            raise BindError(f"input '{name}' is declared {declared} but the array is {actual}; "
                            f"convert it first (e.g. x.astype('{declared}'))")
        arrays[name] = array
    params = {name: param_value(name, dtype, given[name]) for name, dtype in graph.params.items()}
    sizes = graph.bind_shapes({name: tuple(arrays[name].shape) for name in graph.inputs})
    return Bound(arrays, params, sizes)
