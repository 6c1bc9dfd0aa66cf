"""Multiresolution operators: downsampling, upsampling and image pyramids.

A pyramid level is an array ``factor`` times coarser along some axes (``ceil(n / factor)``
points: its size symbol ``n/2`` is derived from its base's and bound with it). Reads at
another resolution are ``x.at(..., down=f)`` (at ``f * p + offset``) and ``x.at(..., up=f)``
(at ``p // f + offset``); this module builds the filters users expect from them:

- :func:`downsampled` — a separable low-pass filter read at every ``factor``-th point (by
  default Burt and Adelson's 4-tap ``[1, 3, 3, 1] / 8`` for a factor of 2, as Halide's
  ``local_laplacian`` app downsamples; a box of ``factor`` taps otherwise);
- :func:`upsampled` — nearest or linear interpolation (half-pixel centres: for a factor of
  2, ``0.75`` of the nearest coarse point and ``0.25`` of the next, as Halide's app);
- :func:`gaussian_pyramid`, :func:`laplacian_pyramid` and :func:`collapse` (Burt and
  Adelson 1983) from them, one operator per level.

Expressions (``downsampled``, ``upsampled``) can be combined with others in one operator
(a Laplacian level is ``fine - upsampled(coarse)`` in one kernel); the operators
(``downsample``, ``upsample``) make one array of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfuse.dsl.functions import boundary_of
from kfuse.dsl.pipeline import Array
from kfuse.errors import DslError, ShapeError
from kfuse.ir.expr import Expr, as_expr, cast, is_integer_scalar, select
from kfuse.user_line import user_line

INTERPOLATIONS = ("nearest", "linear")
# Burt and Adelson's binomial filter for a factor of 2 (taps at 2p-1 .. 2p+2)
BINOMIAL_WEIGHTS = (1 / 8, 3 / 8, 3 / 8, 1 / 8)
BINOMIAL_FIRST = -1


def _check_array(x: object, operator: str) -> Array:
    if not isinstance(x, Array):
        raise DslError(f"{operator}() takes an array of a pipeline, got {type(x).__name__}",
                       operator=operator)
    return x


def _axes(x: Array, axes: Sequence[int] | None, operator: str) -> tuple[int, ...]:
    """The array axes to rescale (default: all), each once, checked."""
    if axes is None:
        return tuple(range(x.ndim))
    listed = tuple(axes)
    if not listed or not all(is_integer_scalar(a) and -x.ndim <= a < x.ndim for a in listed):
        raise DslError(f"'{x.name}' is {x.ndim}-D: axes must name some of its axes, got "
                       f"{axes!r}", operator=operator)
    normalised = tuple(sorted({int(a) % x.ndim for a in listed}))
    if len(normalised) != len(listed):
        raise DslError(f"axes {axes!r} names an axis twice", operator=operator)
    return normalised


def _factor(factor: object, operator: str) -> int:
    if not is_integer_scalar(factor) or factor < 2:
        raise DslError(f"factor must be a whole number >= 2, got {factor!r}", operator=operator)
    return int(factor)


def downsampled(x: Array, factor: int = 2, *, weights: Sequence[float] | None = None,
                first: int | None = None, axes: Sequence[int] | None = None,
                boundary: object = "clamp") -> Expr:
    """``x`` filtered and read at every ``factor``-th point of ``axes`` (an expression on
    the coarse grid): per axis the taps ``weights`` at ``factor * p + first + t``, their
    product over the axes. Default: ``[1, 3, 3, 1] / 8`` from ``-1`` for a factor of 2,
    a box of ``factor`` taps from 0 otherwise."""
    operator = "downsampled"
    x = _check_array(x, operator)
    factor = _factor(factor, operator)
    scaled_axes = _axes(x, axes, operator)
    if weights is None:
        weights = BINOMIAL_WEIGHTS if factor == 2 else (1 / factor,) * factor
        first = (BINOMIAL_FIRST if factor == 2 else 0) if first is None else first
    weights = tuple(float(w) for w in weights)
    if not weights:
        raise DslError("weights must hold at least one tap", operator=operator)
    if first is None:
        first = -((len(weights) - factor) // 2)  # centred on the factor's points
    if not is_integer_scalar(first):
        raise DslError(f"first must be a whole offset, got {first!r}", operator=operator)
    mode = boundary_of(boundary, operator)
    down = tuple(factor if axis in scaled_axes else 1 for axis in range(x.ndim))

    def taps(axis_index: int, offsets: tuple[int, ...]) -> Expr:
        if axis_index == len(scaled_axes):
            return x.at(*offsets, boundary=mode, down=down)
        axis = scaled_axes[axis_index]
        total = None
        for tap, weight in enumerate(weights):
            moved = list(offsets)
            moved[axis] = int(first) + tap
            term = weight * taps(axis_index + 1, tuple(moved))
            total = term if total is None else total + term
        return total  # type: ignore[return-value]

    return taps(0, (0,) * x.ndim)


def upsampled(x: Array, factor: int = 2, *, interpolation: str = "linear",
              axes: Sequence[int] | None = None, boundary: object = "clamp") -> Expr:
    """``x`` read on a grid ``factor`` times finer along ``axes`` (an expression on the fine
    grid, whose axes are ``x``'s): ``nearest`` takes the coarse point ``p // factor``;
    ``linear`` interpolates between coarse points with half-pixel centres (the fine point
    ``p`` lies at ``(p + 0.5) / factor - 0.5`` on the coarse grid)."""
    operator = "upsampled"
    x = _check_array(x, operator)
    factor = _factor(factor, operator)
    if interpolation not in INTERPOLATIONS:
        raise DslError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got "
                       f"{interpolation!r}", operator=operator)
    scaled_axes = _axes(x, axes, operator)
    mode = boundary_of(boundary, operator)
    up = tuple(factor if axis in scaled_axes else 1 for axis in range(x.ndim))
    if interpolation == "nearest":
        return x.at(*(0,) * x.ndim, boundary=mode, up=up)
    from kfuse.dsl.functions import abs as absolute
    from kfuse.dsl.functions import coord

    # per axis: the nearest coarse point and the next one towards the fine point, with
    # weights 1 - w and w, w = |(phase + 0.5) / factor - 0.5|
    phases = {axis: coord(axis) % factor for axis in scaled_axes}
    towards_low = {axis: 2 * phases[axis] + 1 < factor for axis in scaled_axes}
    far_weight = {axis: absolute(cast(phases[axis], "float32") * (1 / factor)
                                 + (0.5 / factor - 0.5)) for axis in scaled_axes}

    def value(axis_index: int, offsets: tuple[int, ...]) -> Expr:
        if axis_index == len(scaled_axes):
            return as_expr(x.at(*offsets, boundary=mode, up=up))
        axis = scaled_axes[axis_index]
        near = value(axis_index + 1, offsets)
        moved = [list(offsets), list(offsets)]
        moved[0][axis], moved[1][axis] = -1, 1
        far = select(towards_low[axis], value(axis_index + 1, tuple(moved[0])),
                     value(axis_index + 1, tuple(moved[1])))
        return near + far_weight[axis] * (far - near)

    return value(0, (0,) * x.ndim)


def downsample(x: Array, factor: int = 2, *, weights: Sequence[float] | None = None,
               first: int | None = None, axes: Sequence[int] | None = None,
               boundary: object = "clamp", name: str | None = None) -> Array:
    """The next level of ``x``'s Gaussian pyramid: :func:`downsampled` as an operator, an
    array of ``ceil(n / factor)`` points along ``axes``."""
    line = user_line()
    expr = downsampled(x, factor, weights=weights, first=first, axes=axes, boundary=boundary)
    return x.pipeline.add_kernel("local", expr, name=name, line=line,
                                 default_boundary=boundary_of(boundary, name))


def upsample(x: Array, factor: int = 2, *, interpolation: str = "linear",
             axes: Sequence[int] | None = None, like: Array | None = None,
             boundary: object = "clamp", name: str | None = None) -> Array:
    """:func:`upsampled` as an operator: an array of ``n * factor`` points along ``axes``,
    or of the shape of ``like`` (the finer level this one came from: ``ceil(n/2)`` points
    upsample to ``n``, odd ``n`` included)."""
    line = user_line()
    expr = upsampled(x, factor, interpolation=interpolation, axes=axes, boundary=boundary)
    shape = None
    if like is not None:
        like = _check_array(like, "upsample")
        if like.pipeline is not x.pipeline or like.ndim != x.ndim:
            raise ShapeError(f"like= takes a {x.ndim}-D array of the same pipeline",
                             operator=name or "upsample")
        shape = like.shape
    return x.pipeline.add_kernel("local", expr, name=name, line=line, shape=shape,
                                 default_boundary=boundary_of(boundary, name))


def gaussian_pyramid(x: Array, levels: int, *, factor: int = 2,
                     axes: Sequence[int] | None = None, boundary: object = "clamp",
                     name: str | None = None) -> list[Array]:
    """``levels`` arrays: ``x``, then each level :func:`downsample` of the one before."""
    if not is_integer_scalar(levels) or levels < 1:
        raise DslError(f"levels must be a whole number >= 1, got {levels!r}",
                       operator=name or "gaussian_pyramid")
    base = name or x.name
    pyramid = [x]
    for level in range(1, int(levels)):
        pyramid.append(downsample(pyramid[-1], factor, axes=axes, boundary=boundary,
                                  name=_level_name(x, f"{base}_g{level}")))
    return pyramid


def laplacian_pyramid(x: Array, levels: int, *, factor: int = 2,
                      axes: Sequence[int] | None = None, boundary: object = "clamp",
                      name: str | None = None) -> list[Array]:
    """``levels`` arrays: each level of ``x``'s Gaussian pyramid less the next one
    upsampled (one operator per level), and the coarsest Gaussian level last."""
    from kfuse.dsl.ops import point

    gaussian = gaussian_pyramid(x, levels, factor=factor, axes=axes, boundary=boundary,
                                name=name)
    base = name or x.name
    pyramid = []
    for level in range(len(gaussian) - 1):
        fine, coarse = gaussian[level], gaussian[level + 1]
        pyramid.append(point(fine - upsampled(coarse, factor, axes=axes, boundary=boundary),
                             name=_level_name(x, f"{base}_l{level}")))
    pyramid.append(gaussian[-1])
    return pyramid


def collapse(pyramid: Sequence[Array], *, factor: int = 2, axes: Sequence[int] | None = None,
             boundary: object = "clamp", name: str | None = None) -> Array:
    """The image a Laplacian pyramid holds: from the coarsest level up, each level plus the
    one below upsampled (one operator per level)."""
    from kfuse.dsl.ops import point

    levels = list(pyramid)
    if not levels or not all(isinstance(level, Array) for level in levels):
        raise DslError("collapse() takes a list of arrays (a Laplacian pyramid)",
                       operator=name or "collapse")
    image = levels[-1]
    base = name or "collapsed"
    for level in range(len(levels) - 2, -1, -1):
        final = level == 0 and name is not None
        image = point(levels[level] + upsampled(image, factor, axes=axes, boundary=boundary),
                      name=name if final else _level_name(levels[0], f"{base}_{level}"))
    return image


def _level_name(x: Array, wanted: str) -> str:
    """``wanted``, or with a number after it where the pipeline has that name already."""
    taken = x.pipeline._arrays
    candidate, counter = wanted, 2
    while candidate in taken:
        candidate, counter = f"{wanted}_{counter}", counter + 1
    return candidate
