"""Operators: each records one kernel in the pipeline and returns the array it produces."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kfuse.dsl.functions import boundary_of
from kfuse.dsl.pipeline import Array, Pipeline
from kfuse.errors import DslError
from kfuse.ir.expr import (
    FLOAT_DTYPES,
    Boundary,
    Const,
    Expr,
    Load,
    as_expr,
    cast,
    is_integer_scalar,
    loads,
    weighted_sum,
)
from kfuse.ir.graph import REDUCE_OPS
from kfuse.user_line import UserLine, user_line, where_of


def _pipeline_of(value: object, operator: str) -> Pipeline:
    expr = as_expr(value)
    pipelines = {id(ld.origin): ld.origin for ld in loads(expr) if ld.origin is not None}
    if len(pipelines) > 1:
        raise DslError("combines arrays of different pipelines", operator=operator)
    if not pipelines:
        raise DslError("reads no array; an operator needs at least one input array",
                       operator=operator)
    return next(iter(pipelines.values()))


def point(expr: object, *, name: str | None = None, dtype: object = None,
          shape: Sequence[str | int] | None = None) -> Array:
    """Elementwise operator: every output element depends on inputs at the same point.

    ``shape``: the iteration space's sizes (symbols of the pipeline's arrays, ``x.shape[1]``,
    or fixed numbers) where no read gives it: every read broadcast (``dims=``) or at
    computed indices, as a stack of levels built from a 2-D image."""
    line = user_line()
    pipeline = _pipeline_of(expr, name or "point")
    if shape is not None:
        if any(is_integer_scalar(size) and size < 1 or not (is_integer_scalar(size) or
                                                            isinstance(size, str))
               for size in shape):
            raise DslError(f"shape takes size symbols or positive sizes, got {shape!r}",
                           operator=name or "point", where=where_of(line))
        shape = [str(int(size)) if is_integer_scalar(size) else size for size in shape]
    return pipeline.add_kernel("point", expr, name=name, line=line, dtype=dtype, shape=shape)


def local(expr: object, *, boundary: object = "clamp", name: str | None = None,
          dtype: object = None) -> Array:
    """Stencil operator: reads inputs at constant offsets (``x.at(dy, dx)``).

    ``boundary`` is the default mode for reads that do not name one.
    """
    line = user_line()
    pipeline = _pipeline_of(expr, name or "local")
    return pipeline.add_kernel("local", expr, name=name, line=line,
                               default_boundary=boundary_of(boundary, name), dtype=dtype)


def convolve(x: Array, mask: Sequence | np.ndarray, *, boundary: object = "clamp",
             name: str | None = None, scale: float = 1.0) -> Array:
    """Convolution-style stencil with a constant coefficient mask centred on each point.

    Computes ``scale * sum(mask[k] * x[p + k - centre])`` (correlation order, as image
    filters are written); zero coefficients are skipped.
    """
    line = user_line()
    if not isinstance(x, Array):
        raise DslError("convolve() takes an array as first argument", operator=name,
                       where=where_of(line))
    coefficients = _mask_coefficients(mask, name, line)
    if coefficients.ndim != x.ndim or any(n % 2 == 0 for n in coefficients.shape):
        raise DslError(f"the mask must be {x.ndim}-D with odd sizes, got shape "
                       f"{coefficients.shape}", operator=name, where=where_of(line))
    centre = tuple(n // 2 for n in coefficients.shape)
    bound = boundary_of(boundary, name)
    # a convolution of an integer (or bool) array is computed in float32, whatever its
    # mask: a sum of taps in a small integer type would wrap around
    dtype = x.dtype if x.dtype in FLOAT_DTYPES else "float32"

    def taps(weights: np.ndarray, leading: tuple[int, ...]) -> Expr | None:
        terms = []
        for index in np.ndindex(*weights.shape):
            offsets = tuple(i - c for i, c in zip(leading + index, centre, strict=True))
            tap = x.at(*offsets, boundary=bound)
            terms.append((float(weights[index]), tap if dtype == x.dtype else cast(tap, dtype)))
        return weighted_sum(terms, dtype)

    factors = _outermost_factors(coefficients)
    if factors is None:
        body = taps(coefficients, ())
    else:
        # separable along the outermost axis: sum_i v_i * (sum_j h_j x[i, j]); the inner
        # sums of one row are shared by the points above and below that read it
        outer_weights, inner = factors
        body = weighted_sum([(weight, taps(inner, (i,)))
                                    for i, weight in enumerate(outer_weights)], dtype)
    if body is not None and scale != 1.0:
        body = Const(scale, dtype) * body
    if body is None:
        raise DslError("the mask has no non-zero coefficient", operator=name,
                       where=where_of(line))
    return x.pipeline.add_kernel("local", body, name=name, line=line, default_boundary=bound)


def _mask_coefficients(mask: object, name: str | None, line: UserLine | None) -> np.ndarray:
    """The mask as a float64 array; a ragged mask, or one that holds anything but finite
    numbers, is refused."""
    where = where_of(line)
    if isinstance(mask, (str, bytes)):
        raise DslError(f"the mask must be nested lists (or an array) of numbers, got {mask!r}",
                       operator=name, where=where)
    try:
        coefficients = np.asarray(mask, dtype=np.float64)
    except (TypeError, ValueError):
        raise DslError("the mask must be nested lists (or an array) of numbers with the same "
                       f"length in every row, got {mask!r}", operator=name, where=where) from None
    if not np.all(np.isfinite(coefficients)):
        raise DslError("the mask's coefficients must be finite numbers", operator=name,
                       where=where)
    return coefficients


def _outermost_factors(mask: np.ndarray) -> tuple[list[float], np.ndarray] | None:
    """(v, H) with ``mask[i] == v[i] * H`` for every slice i along axis 0, if it is so.

    Only for masks of two or more axes with at least two non-zero slices; None otherwise.
    """
    if mask.ndim < 2:
        return None
    slices = [i for i in range(mask.shape[0]) if np.any(mask[i] != 0.0)]
    if len(slices) < 2:
        return None
    pivot = max(slices, key=lambda i: float(np.abs(mask[i]).max()))
    position = next(p for p in np.ndindex(*mask[pivot].shape) if mask[pivot][p] != 0.0)
    inner = mask[pivot] / mask[pivot][position]  # first non-zero weight 1: one multiply less
    weights = [float(mask[i][position]) for i in range(mask.shape[0])]
    if next(w for w in weights if w != 0.0) < 0:  # keep the outer sum free of negations
        weights, inner = [-w for w in weights], -inner
    rebuilt = np.stack([w * inner for w in weights])
    if not np.allclose(rebuilt, mask, rtol=1e-12, atol=0.0):
        return None
    return weights, inner


def reduce(expr: object, op: str = "sum", axis: int | tuple[int, ...] | None = None, *,
           name: str | None = None) -> Array:
    """Fold ``expr`` with ``op`` (sum, min, max) over all elements, along one axis, or along
    several (a tuple: compiled where they merge into one, :mod:`kfuse.ir.collapse`; the
    statistics of a layer norm over (channels, pixels)).

    A condition (bool) is folded as int32 0/1: its sum counts where it holds, as NumPy's.
    """
    line = user_line()
    where = where_of(line)
    if op not in REDUCE_OPS:
        raise DslError(f"unknown reduction {op!r}; use one of {', '.join(REDUCE_OPS)}",
                       operator=name, where=where)
    pipeline = _pipeline_of(expr, name or "reduce")
    if isinstance(axis, (tuple, list)) and axis and all(is_integer_scalar(a) for a in axis):
        axes: tuple[int, ...] | None = tuple(sorted({int(a) for a in axis}))
        if len(axes) != len(axis):
            raise DslError(f"axis names an axis twice: {tuple(axis)}", operator=name,
                           where=where)
    elif axis is not None and not is_integer_scalar(axis):
        raise DslError(f"axis must be an integer, a tuple of integers or None, got {axis!r}",
                       operator=name, where=where)
    else:
        axes = None if axis is None else (int(axis),)
    return pipeline.add_kernel("reduce", expr, name=name, line=line, reduction_op=op,
                               reduce_axes=axes, default_boundary=Boundary("clamp"))


def reduce_sum(expr: object, axis: int | tuple[int, ...] | None = None, *,
               name: str | None = None) -> Array:
    """Sum over all elements, along one axis or along several (see :func:`reduce`)."""
    return reduce(expr, "sum", axis, name=name)


def reduce_min(expr: object, axis: int | tuple[int, ...] | None = None, *,
               name: str | None = None) -> Array:
    """Minimum over all elements, along one axis or along several (see :func:`reduce`)."""
    return reduce(expr, "min", axis, name=name)


def reduce_max(expr: object, axis: int | tuple[int, ...] | None = None, *,
               name: str | None = None) -> Array:
    """Maximum over all elements, along one axis or along several (see :func:`reduce`)."""
    return reduce(expr, "max", axis, name=name)


__all__ = ["Load", "convolve", "local", "point", "reduce", "reduce_max", "reduce_min",
           "reduce_sum"]


def lookup(table: Array, index: object, *, boundary: object = "clamp") -> Load:
    """``table[index]``: a 1-D array read at a computed integer ``index`` (a lookup table,
    a histogram-equalisation remap), through ``boundary`` where the index falls outside.
    An expression, to use in an operator; the planner takes its footprint to be the whole
    table (fused with the operator that computes it, that operator is evaluated where
    read)."""
    if not isinstance(table, Array) or table.ndim != 1:
        raise DslError("lookup() takes a 1-D array of a pipeline as its table",
                       operator="lookup")
    return table.at(0, index={0: index}, boundary=boundary_of(boundary, "lookup"))

