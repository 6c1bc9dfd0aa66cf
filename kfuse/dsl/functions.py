"""Math functions usable in operator bodies (elementwise, on arrays or expressions)."""

from __future__ import annotations

from kfuse.errors import BoundaryError, DslError
from kfuse.ir.expr import (
    REAL_DTYPES,
    Boundary,
    Coord,
    Expr,
    as_boundary,
    as_expr,
    binary,
    cast,
    is_integer_scalar,
    select,
    unary,
)


def sqrt(x: object) -> Expr:
    return unary("sqrt", x)


def rsqrt(x: object) -> Expr:
    """1 / sqrt(x)."""
    return unary("rsqrt", x)


def exp(x: object) -> Expr:
    return unary("exp", x)


def log(x: object) -> Expr:
    return unary("log", x)


def sin(x: object) -> Expr:
    return unary("sin", x)


def cos(x: object) -> Expr:
    return unary("cos", x)


def tanh(x: object) -> Expr:
    return unary("tanh", x)


def abs(x: object) -> Expr:  # noqa: A001 - mirrors numpy's name
    return unary("abs", x)


def floor(x: object) -> Expr:
    return unary("floor", x)


def ceil(x: object) -> Expr:
    return unary("ceil", x)


def round(x: object) -> Expr:  # noqa: A001 - mirrors numpy's name
    """To the nearest integer value, ties to even (NumPy's ``round``/``rint``)."""
    return unary("round", x)


def trunc(x: object) -> Expr:
    """Towards zero."""
    return unary("trunc", x)


def exp2(x: object) -> Expr:
    return unary("exp2", x)


def log2(x: object) -> Expr:
    return unary("log2", x)


def expm1(x: object) -> Expr:
    """``exp(x) - 1``, exact near 0."""
    return unary("expm1", x)


def log1p(x: object) -> Expr:
    """``log(1 + x)``, exact near 0."""
    return unary("log1p", x)


def erf(x: object) -> Expr:
    """The error function (an exact GELU is ``0.5 x (1 + erf(x / sqrt 2))``)."""
    return unary("erf", x)


def tan(x: object) -> Expr:
    return unary("tan", x)


def atan(x: object) -> Expr:
    return unary("atan", x)


def sigmoid(x: object) -> Expr:
    """The logistic function ``1 / (1 + exp(-x))`` (0 and 1 at the far ends, no overflow
    to NaN)."""
    return 1.0 / (1.0 + exp(-as_expr(x)))


def sign(x: object) -> Expr:
    """-1, 0 or 1 by the sign of ``x`` (NaN stays NaN, as NumPy's)."""
    value = as_expr(x)
    return select(value > 0, 1.0, select(value < 0, -1.0, value * 0.0)) \
        if value.dtype in REAL_DTYPES else \
        select(value > 0, 1, select(value < 0, -1, 0))


def minimum(a: object, b: object) -> Expr:
    """Elementwise minimum of two operands."""
    return binary("min", a, b)


def maximum(a: object, b: object) -> Expr:
    """Elementwise maximum of two operands."""
    return binary("max", a, b)


min = minimum  # noqa: A001 - elementwise, as the issue names them
max = maximum  # noqa: A001


def pow(base: object, exponent: object) -> Expr:  # noqa: A001
    return binary("pow", base, exponent)


def where(condition: object, if_true: object, if_false: object) -> Expr:
    """Select ``if_true`` where ``condition`` holds, else ``if_false``."""
    return select(condition, if_true, if_false)



def eq(a: object, b: object) -> Expr:
    """Elementwise ``a == b`` (as ``a == b`` on kfuse arrays and expressions)."""
    return binary("eq", a, b)


def ne(a: object, b: object) -> Expr:
    """Elementwise ``a != b``."""
    return binary("ne", a, b)


def astype(x: object, dtype: object) -> Expr:
    """Cast to float32, float64, int32 or bool."""
    return cast(x, dtype)


def coord(axis: int) -> Expr:
    """The integer coordinate of the current point along ``axis`` (0 is the outermost) of
    the operator's iteration space; the operator checks that it has that axis."""
    if not is_integer_scalar(axis) or axis < 0:
        raise DslError(f"coord() takes an axis number (0, 1 or 2), got {axis!r}")
    return Coord(int(axis))


def constant(value: float) -> Boundary:
    """Boundary mode: reads outside the array give ``value`` (a number the array's dtype
    holds: inf and nan for float arrays, integers for int32 ones)."""
    return boundary_of(("constant", value))


def boundary_of(spec: object, operator: str | None = None) -> Boundary:
    """``spec`` (a :class:`Boundary`, a mode name or ``("constant", value)``) as a boundary
    mode; a bad one is a :class:`BoundaryError` at the user's line."""
    try:
        return as_boundary(spec)
    except BoundaryError as error:
        raise BoundaryError(error.detail, operator=operator) from None


clamp = Boundary("clamp")
mirror = Boundary("mirror")
repeat = Boundary("repeat")
