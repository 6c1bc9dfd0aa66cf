"""The reference semantics: execute the IR with NumPy, one whole-array step per kernel.

This is the ground truth every generated kernel is checked against. With
``precision="float64"`` every floating-point value is computed in double precision,
which is how tests obtain a reference for float32 pipelines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kfuse.errors import BackendUnavailable, DtypeError, ShapeError
from kfuse.ir.expr import (
    HALF_DTYPES,
    Binary,
    Boundary,
    Cast,
    Const,
    Coord,
    Expr,
    Load,
    Param,
    Select,
    Unary,
)
from kfuse.ir.graph import Graph, Kernel
from kfuse.runtime.backend import Backend


def erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise (NumPy has none; the reference's, one value at a time
    through :func:`math.erf`, in the array's own float type)."""
    values = np.asarray(x)
    kind = values.dtype if values.dtype.kind == "f" else np.dtype(np.float64)
    return np.vectorize(math.erf, otypes=[kind])(values)


# NumPy's function for each of the IR's unary and binary operations (the reference's, and
# the torch baseline's for constants)
UNARY_FUNCTIONS = {
    "neg": np.negative, "not": np.logical_not, "sqrt": np.sqrt, "exp": np.exp, "log": np.log,
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "rsqrt": lambda x: 1.0 / np.sqrt(x), "round": np.rint, "trunc": np.trunc,
    "exp2": np.exp2, "log2": np.log2, "expm1": np.expm1, "log1p": np.log1p, "erf": erf,
    "tan": np.tan, "atan": np.arctan,
}
BINARY_FUNCTIONS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "min": np.minimum, "max": np.maximum, "pow": np.power, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
    "and": np.logical_and, "or": np.logical_or, "floordiv": np.floor_divide, "mod": np.mod,
}
_REDUCE = {"sum": np.sum, "min": np.min, "max": np.max}


def _gather_computed(array: np.ndarray, load: Load, domain: tuple[int, ...],
                     computed: list[np.ndarray]) -> np.ndarray:
    """A data-dependent read: every axis's index as an array broadcast over the domain (a
    gathered axis's from its computed values), read at once."""
    boundary = load.boundary or Boundary("clamp")
    values = iter(computed)
    indices, inside = [], np.ones((1,) * len(domain), dtype=bool)
    assert load.indices is not None and load.dims is not None
    for axis, (dim, offset, index) in enumerate(zip(load.dims, load.offsets, load.indices,
                                                    strict=True)):
        if index is not None:
            raw = np.asarray(next(values)).astype(np.int64) + offset
            raw = raw.reshape(raw.shape + (1,) * (len(domain) - raw.ndim)) if raw.ndim else \
                raw.reshape((1,) * len(domain))
        else:
            numerator, denominator = load.scale(axis)
            shape = [1] * len(domain)
            shape[dim] = domain[dim]
            raw = (np.arange(domain[dim]) * numerator // denominator + offset).reshape(shape)
        mapped, within = remap_index(raw, array.shape[axis], boundary)
        indices.append(mapped)
        inside = inside & within
    picked = array[tuple(indices)]
    if boundary.mode == "constant":
        picked = np.where(inside, picked, np.asarray(boundary.value, dtype=array.dtype))
    return picked


def remap_index(index: np.ndarray, size: int, boundary: Boundary) -> tuple[np.ndarray, np.ndarray]:
    """Map possibly out-of-range indices into ``[0, size)``; also return which were inside.

    Mirror repeats the edge element (-1 -> 0, size -> size-1) and is periodic with period
    2*size, so it is exact for any overhang; constant mode leaves the mask to the caller.
    """
    inside = (index >= 0) & (index < size)
    if boundary.mode == "clamp":
        mapped = np.clip(index, 0, size - 1)
    elif boundary.mode == "mirror":
        folded = np.mod(index, 2 * size)
        mapped = np.where(folded < size, folded, 2 * size - 1 - folded)
    elif boundary.mode == "repeat":
        mapped = np.mod(index, size)
    else:  # constant: any valid index; the mask selects the constant
        mapped = np.clip(index, 0, size - 1)
    return mapped, inside


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of kfuse's dtype ``name`` (bfloat16: ``ml_dtypes``')."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes is a dependency of kfuse
            raise DtypeError("bfloat16 NumPy arrays need ml_dtypes: pip install ml_dtypes") \
                from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name if name != "bool" else np.bool_)


class NumpyEvaluator:
    """Evaluates kernels of one graph over NumPy arrays."""

    def __init__(self, graph: Graph, precision: str | None = None):
        self.graph = graph
        self.precision = precision

    def dtype(self, name: str) -> np.dtype:
        """The NumPy dtype of an array of dtype ``name``."""
        if self.precision == "float64" and name in ("float32", "float64"):
            return np.dtype(np.float64)
        return numpy_dtype(name)

    def compute(self, name: str) -> np.dtype:
        """The dtype values of ``name`` are computed in (two-byte floats: float32)."""
        if name in HALF_DTYPES:
            return np.dtype(np.float64 if self.precision == "float64" else np.float32)
        return self.dtype(name)

    def run(self, arrays: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Execute every kernel in order; return every buffer (inputs included)."""
        values: dict[str, np.ndarray] = {
            name: np.asarray(arrays[name]).astype(self.dtype(self.graph.buffers[name].dtype),
                                                   copy=False)
            for name in self.graph.inputs
        }
        scalars = {name: np.asarray(params[name], dtype=self.dtype(dtype))
                   for name, dtype in self.graph.params.items()}
        sizes = self.graph.bind_shapes({n: values[n].shape for n in self.graph.inputs})
        for kernel in self.graph.topological_kernels():
            if kernel.kind == "opaque":
                values.update(self.run_user_kernel(kernel, values, scalars, sizes))
            else:
                values[kernel.output] = self.run_kernel(kernel, values, scalars, sizes)
        return values

    def run_user_kernel(self, kernel: Kernel, values: Mapping[str, np.ndarray],
                        scalars: Mapping[str, np.ndarray], sizes: Mapping[str, int]
                        ) -> dict[str, np.ndarray]:
        """What a user kernel writes, by its NumPy reference (called with the arrays it
        reads and its parameters, in the order of its arguments)."""
        spec = kernel.opaque
        assert spec is not None
        if spec.reference is None:
            raise BackendUnavailable(
                f"operator '{kernel.name}' is a user CUDA kernel without a NumPy reference: "
                "give user_kernel(..., numpy=function) to run it on the numpy backend (or "
                "verify against a compiled backend)", operator=kernel.name, where=kernel.where)
        given = [values[a.ref] if a.role == "input" else scalars[a.ref][()]
                 for a in spec.arguments if a.role in ("input", "param")]
        result = spec.reference(*given)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(kernel.writes):
            raise ShapeError(f"its numpy= reference returned {len(results)} arrays for the "
                             f"{len(kernel.writes)} it writes ({', '.join(kernel.writes)})",
                             operator=kernel.name, where=kernel.where)
        written = {}
        for name, value in zip(kernel.writes, results, strict=True):
            buffer = self.graph.buffers[name]
            shape = tuple(sizes[s] for s in buffer.shape)
            value = np.asarray(value)
            if value.shape != shape:
                raise ShapeError(f"its numpy= reference returned shape {value.shape} for "
                                 f"'{name}', which has shape {shape}", operator=kernel.name,
                                 where=kernel.where)
            written[name] = np.array(value, dtype=self.dtype(buffer.dtype), order="C")
        return written

    def run_kernel(self, kernel: Kernel, values: Mapping[str, np.ndarray],
                   scalars: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> np.ndarray:
        domain = tuple(sizes[s] for s in kernel.domain)
        assert kernel.body is not None, "opaque kernels have no NumPy semantics"
        memo: dict[int, np.ndarray] = {}
        for node in kernel.body.walk():
            memo[id(node)] = self._node(node, memo, values, scalars, domain)
        result = np.broadcast_to(memo[id(kernel.body)], domain)
        dtype = self.dtype(kernel.body.dtype)
        if kernel.reduction is not None:
            fold = _REDUCE[kernel.reduction.op]
            return np.asarray(fold(result, axis=kernel.reduction.axes), dtype=dtype)
        return np.array(result, dtype=dtype, order="C")  # (ascontiguousarray makes 0-d 1-d)

    def _node(self, node: Expr, memo: Mapping[int, np.ndarray], values: Mapping[str, np.ndarray],
              scalars: Mapping[str, np.ndarray], domain: tuple[int, ...]) -> np.ndarray:
        dtype = self.compute(node.dtype)
        if isinstance(node, Const):
            return np.asarray(node.value, dtype=dtype)
        if isinstance(node, Param):
            return scalars[node.name].astype(dtype)
        if isinstance(node, Coord):
            shape = [1] * len(domain)
            shape[node.axis] = domain[node.axis]
            return np.arange(domain[node.axis], dtype=np.int32).reshape(shape)
        if isinstance(node, Load):
            computed = [memo[id(child)] for child in node.children()]
            return gather(values[node.buffer], node, domain, computed).astype(dtype,
                                                                              copy=False)
        args = [memo[id(child)] for child in node.children()]
        with np.errstate(all="ignore"):
            if isinstance(node, Unary):
                return UNARY_FUNCTIONS[node.op](args[0]).astype(dtype, copy=False)
            if isinstance(node, Binary):
                return BINARY_FUNCTIONS[node.op](args[0], args[1]).astype(dtype, copy=False)
            if isinstance(node, Select):
                return np.where(args[0], args[1], args[2]).astype(dtype, copy=False)
            if isinstance(node, Cast):  # (to a two-byte float: rounded to it)
                return args[0].astype(self.dtype(node.dtype)).astype(dtype)
        raise TypeError(f"unknown expression node {type(node).__name__}")


def gather(array: np.ndarray, load: Load, domain: tuple[int, ...],
           computed: list[np.ndarray] | None = None) -> np.ndarray:
    """Values of ``array`` read at every point of ``domain`` with the load's offsets and mode
    (``computed``: the values of a data-dependent read's index expressions, in order).

    The result broadcasts against the domain (axes the load does not index have size 1).
    """
    if array.ndim == 0:
        return array
    if load.indices is not None:
        return _gather_computed(array, load, domain, computed or [])
    boundary = load.boundary or Boundary("clamp")
    indices, masks = [], []
    for axis, (dim, offset) in enumerate(zip(load.dims, load.offsets, strict=True)):
        numerator, denominator = load.scale(axis)
        raw = np.arange(domain[dim]) * numerator // denominator + offset
        mapped, inside = remap_index(raw, array.shape[axis], boundary)
        indices.append(mapped)
        masks.append(inside)
    picked = array[np.ix_(*indices)]
    if boundary.mode == "constant" and not all(m.all() for m in masks):
        valid = np.ones(picked.shape, dtype=bool)
        for axis, mask in enumerate(masks):
            shape = [1] * picked.ndim
            shape[axis] = mask.size
            valid &= mask.reshape(shape)
        picked = np.where(valid, picked, np.asarray(boundary.value, dtype=array.dtype))
    # Order the picked axes by the iteration axes they follow, then insert missing axes.
    order = np.argsort(load.dims)
    picked = np.transpose(picked, order)
    shape = [1] * len(domain)
    for dim in load.dims:
        shape[dim] = domain[dim]
    return picked.reshape(shape)


class NumpyBackend(Backend):
    """Reference backend: interprets the IR with NumPy (``precision="float64"`` for truth)."""

    name = "numpy"

    def __init__(self, precision: str | None = None):
        self.precision = precision

    def run(self, graph: Graph, given: Mapping[str, Any], *, program: Any = None,
            plan: Any = None) -> dict[str, np.ndarray]:
        """The reference semantics; a plan changes nothing here (fusion preserves meaning)."""
        from kfuse.runtime.binding import bind, to_numpy
        bound = bind(graph, given)
        host = {name: to_numpy(array) for name, array in bound.arrays.items()}
        values = NumpyEvaluator(graph, self.precision).run(host, bound.params)
        return {name: values[name] for name in graph.outputs}
