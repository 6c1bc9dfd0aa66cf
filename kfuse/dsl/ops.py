"""Operators: each records one kernel in the pipeline and returns the array it produces."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kfuse.dsl.pipeline import Array, Pipeline
from kfuse.dsl.source import user_line
from kfuse.errors import DslError
from kfuse.ir.expr import Boundary, Const, Expr, Load, as_boundary, as_expr, loads
from kfuse.ir.graph import REDUCE_OPS


def _pipeline_of(value: object, operator: str) -> Pipeline:
    expr = as_expr(value)
    pipelines = {id(ld.origin): ld.origin for ld in loads(expr) if ld.origin is not None}
    if len(pipelines) > 1:
        raise DslError("combines arrays of different pipelines", operator=operator,
                       where=_where_text())
    if not pipelines:
        raise DslError("reads no array; an operator needs at least one input array",
                       operator=operator, where=_where_text())
    return next(iter(pipelines.values()))


def _where_text() -> str | None:
    line = user_line()
    return str(line) if line else None


def point(expr: object, *, name: str | None = None, dtype: object = None) -> Array:
    """Elementwise operator: every output element depends on inputs at the same point."""
    line = user_line()
    pipeline = _pipeline_of(expr, name or "point")
    return pipeline.add_kernel("point", expr, name=name, line=line, dtype=dtype)


def local(expr: object, *, boundary: object = "clamp", name: str | None = None,
          dtype: object = None) -> Array:
    """Stencil operator: reads inputs at constant offsets (``x.at(dy, dx)``).

    ``boundary`` is the default mode for reads that do not name one.
    """
    line = user_line()
    pipeline = _pipeline_of(expr, name or "local")
    return pipeline.add_kernel("local", expr, name=name, line=line,
                               default_boundary=as_boundary(boundary), dtype=dtype)


def convolve(x: Array, mask: Sequence | np.ndarray, *, boundary: object = "clamp",
             name: str | None = None, scale: float = 1.0) -> Array:
    """Convolution-style stencil with a constant coefficient mask centred on each point.

    Computes ``scale * sum(mask[k] * x[p + k - centre])`` (correlation order, as image
    filters are written); zero coefficients are skipped.
    """
    line = user_line()
    if not isinstance(x, Array):
        raise DslError("convolve() takes an array as first argument", operator=name,
                       where=str(line) if line else None)
    coefficients = np.asarray(mask, dtype=np.float64)
    if coefficients.ndim != x.ndim or any(n % 2 == 0 for n in coefficients.shape):
        raise DslError(f"the mask must be {x.ndim}-D with odd sizes, got shape "
                       f"{coefficients.shape}", operator=name, where=str(line) if line else None)
    centre = tuple(n // 2 for n in coefficients.shape)
    bound = as_boundary(boundary)
    body: Expr | None = None
    for index in np.ndindex(*coefficients.shape):
        weight = float(coefficients[index]) * scale
        if weight == 0.0:
            continue
        offsets = tuple(i - c for i, c in zip(index, centre, strict=True))
        term = Const(weight, x.dtype) * x.at(*offsets, boundary=bound)
        body = term if body is None else body + term
    if body is None:
        raise DslError("the mask has no non-zero coefficient", operator=name,
                       where=str(line) if line else None)
    return x.pipeline.add_kernel("local", body, name=name, line=line, default_boundary=bound)


def reduce(expr: object, op: str = "sum", axis: int | None = None, *,
           name: str | None = None) -> Array:
    """Fold ``expr`` with ``op`` (sum, min, max) over all elements or along one axis."""
    line = user_line()
    where = str(line) if line else None
    if op not in REDUCE_OPS:
        raise DslError(f"unknown reduction {op!r}; use one of {', '.join(REDUCE_OPS)}",
                       operator=name, where=where)
    pipeline = _pipeline_of(expr, name or "reduce")
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
        raise DslError(f"axis must be an integer or None, got {axis!r}", operator=name,
                       where=where)
    axes = None if axis is None else (axis,)
    return pipeline.add_kernel("reduce", expr, name=name, line=line, reduction_op=op,
                               reduce_axes=axes, default_boundary=Boundary("clamp"))


def reduce_sum(expr: object, axis: int | None = None, *, name: str | None = None) -> Array:
    """Sum over all elements or along one axis."""
    return reduce(expr, "sum", axis, name=name)


def reduce_min(expr: object, axis: int | None = None, *, name: str | None = None) -> Array:
    """Minimum over all elements or along one axis."""
    return reduce(expr, "min", axis, name=name)


def reduce_max(expr: object, axis: int | None = None, *, name: str | None = None) -> Array:
    """Maximum over all elements or along one axis."""
    return reduce(expr, "max", axis, name=name)


__all__ = ["Load", "convolve", "local", "point", "reduce", "reduce_max", "reduce_min",
           "reduce_sum"]
