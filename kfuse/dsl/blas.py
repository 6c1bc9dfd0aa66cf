"""BLAS-1/2 operators on vectors and row-major matrices, as map / reduce / nested map-reduce.

Every operator records ordinary IR kernels, so the planner treats them like any other:

- a vector map (``scal``, ``axpy``, ``axpby``) is a ``point`` kernel over the vector;
- ``dot`` / ``nrm2`` / ``asum`` are a sum reduction over the vector (``nrm2`` adds a 0-d
  ``sqrt`` kernel, since a reduction's result is never consumed in its own kernel);
- ``A @ x`` is a nested map-reduce over the matrix (Filipovič et al. 2015 §2.1): the domain is
  ``(rows, cols)``, ``x`` is read along the column axis (``Load.dims == (1,)``) and the
  products are summed over axis 1;
- ``A.T @ y`` is the same domain with ``y`` read along the row axis, summed over axis 0,
  so ``A`` is read row-major, with the same thread-to-data mapping, in both (BiCGK);
- ``outer(u, v)`` is the broadcast product ``u[i] * v[j]`` (an expression: ``A + outer(u, v)``
  inside :func:`kfuse.point` or :func:`ger` is a rank-1 update), matrix add is a 2-D point.

Scalars are runtime parameters (``pipeline.param``), constants or 0-d results (a ``dot``).
Sizes of any value (no padding) are fine; the generated code handles the edges.
"""

from __future__ import annotations

from dataclasses import replace

from kfuse.dsl.pipeline import Array, Pipeline, forward_arithmetic
from kfuse.errors import DslError, ShapeError
from kfuse.ir.expr import Expr, Load, as_expr, loads, transform, unary
from kfuse.user_line import UserLine, user_line, where_of


def _pipeline(values: tuple[object, ...], operator: str, line: UserLine | None) -> Pipeline:
    """The one pipeline every array of the operands belongs to."""
    found: dict[int, Pipeline] = {}
    for value in values:
        if isinstance(value, Array):
            found[id(value.pipeline)] = value.pipeline
        elif isinstance(value, Transposed):
            found[id(value.array.pipeline)] = value.array.pipeline
        elif isinstance(value, Expr):
            for load in loads(value):
                if load.origin is not None:
                    found[id(load.origin)] = load.origin  # type: ignore[assignment]
    if len(found) > 1:
        raise DslError("combines arrays of different pipelines", operator=operator,
                       where=where_of(line))
    if not found:
        raise DslError("reads no array; give at least one vector or matrix",
                       operator=operator, where=where_of(line))
    return next(iter(found.values()))


def _ndim(pipeline: Pipeline, load: Load) -> int:
    return pipeline._arrays[load.buffer].ndim


def _operand_ndim(value: object, pipeline: Pipeline) -> int:
    """The number of axes of an operand: an array's, or the widest array it reads."""
    if isinstance(value, Array):
        return value.ndim
    if isinstance(value, Transposed):
        return 2
    expr = as_expr(value)
    widest = 0
    for load in loads(expr):
        if load.dims is None:
            widest = max(widest, _ndim(pipeline, load))
        elif load.dims:
            widest = max(widest, max(load.dims) + 1)
    return widest


def _check_centered(expr: Expr, operator: str, line: UserLine | None) -> None:
    for load in loads(expr):
        if not load.is_centered:
            raise DslError(f"reads '{load.buffer}' at an offset; BLAS operators read every "
                           "element at its own index (use kfuse.local for stencils)",
                           operator=operator, where=where_of(line))


def _operand(value: object, ndim: int, pipeline: Pipeline, what: str, operator: str,
             line: UserLine | None) -> Expr:
    """An ``ndim``-D operand (array or expression of such arrays and scalars) read at the
    current point; a transposed matrix is a matrix operand."""
    if ndim == 2 and isinstance(value, Transposed):
        return value.expr()
    found = _operand_ndim(value, pipeline)
    if found != ndim:
        name = value.name if isinstance(value, Array) else "the expression"
        kind = "a vector" if ndim == 1 else "a matrix"
        raise ShapeError(f"{what} must be {kind}; {name} is {found}-D", operator=operator,
                         where=where_of(line))
    expr = as_expr(value)
    _check_centered(expr, operator, line)
    return expr


def _vector(value: object, pipeline: Pipeline, what: str, operator: str,
            line: UserLine | None) -> Expr:
    """A vector operand (1-D array or expression over 1-D arrays and scalars)."""
    return _operand(value, 1, pipeline, what, operator, line)


def _matrix(value: object, pipeline: Pipeline, what: str, operator: str,
            line: UserLine | None) -> Expr:
    """A matrix operand read at the current (row, column) point."""
    return _operand(value, 2, pipeline, what, operator, line)


def along(value: object, axis: int) -> Expr:
    """A vector expression read along ``axis`` of a 2-D iteration space (a broadcast read).

    Every 1-D read of ``value`` indexes iteration axis ``axis``; 0-d reads and parameters
    stay scalars.
    """
    expr = as_expr(value)

    def redim(node: Expr) -> Expr | None:
        if isinstance(node, Load) and node.offsets and len(node.offsets) == 1:
            return replace(node, dims=(axis,))
        return None

    return transform(expr, redim)


def _matrix_shape(pipeline: Pipeline, matrix: Expr, rows: Expr | None = None,
                  cols: Expr | None = None) -> tuple[str, str] | None:
    """Size symbols (rows, cols) of a 2-D iteration space, when no plain 2-D read gives them."""
    for load in loads(matrix):
        if load.dims is None and _ndim(pipeline, load) == 2:
            return None  # the domain follows the matrix read
    row_symbol = col_symbol = None
    for expr, axis in ((matrix, None), (rows, 0), (cols, 1)):
        if expr is None:
            continue
        for load in loads(expr):
            array = pipeline._arrays[load.buffer]
            dims = load.dims if load.dims is not None else ((axis,) if axis is not None
                                                            else tuple(range(array.ndim)))
            for array_axis, dim in enumerate(dims):
                if dim == 0 and row_symbol is None:
                    row_symbol = array._shape[array_axis]
                if dim == 1 and col_symbol is None:
                    col_symbol = array._shape[array_axis]
    if row_symbol is None or col_symbol is None:
        return None
    return (row_symbol, col_symbol)


class Transposed:
    """``A.T``: the transpose of a matrix, for ``A.T @ y`` and transposed elementwise reads."""

    def __init__(self, array: Array):
        self.array = array

    def expr(self) -> Load:
        """``A`` read transposed: element (i, j) of the iteration space reads ``A[j, i]``."""
        return self.array.at(0, 0, dims=(1, 0))

    def __matmul__(self, other: object) -> Array:
        line = user_line()
        return _gemv(self.array, other, None, None, None, trans=True, name=None, line=line)

    @property
    def T(self) -> Array:  # noqa: N802 - numpy's name
        return self.array

    def __repr__(self) -> str:
        return f"{self.array.name}.T"



forward_arithmetic(Transposed)  # arithmetic on A.T: on A read transposed at the point


# ---------------------------------------------------------------------------------------------
# Level 1: vectors
# ---------------------------------------------------------------------------------------------

def dot(x: object, y: object, *, name: str | None = None) -> Array:
    """``xᵀ y`` as a 0-d array: a sum reduction over the vector (map -> reduce)."""
    line = user_line()
    operator = name or "dot"
    pipeline = _pipeline((x, y), operator, line)
    body = _vector(x, pipeline, "x", operator, line) * _vector(y, pipeline, "y", operator, line)
    return pipeline.add_kernel("reduce", body, name=name, line=line, reduction_op="sum")


def asum(x: object, *, name: str | None = None) -> Array:
    """``sum |x_i|`` as a 0-d array."""
    line = user_line()
    operator = name or "asum"
    pipeline = _pipeline((x,), operator, line)
    body = unary("abs", _vector(x, pipeline, "x", operator, line))
    return pipeline.add_kernel("reduce", body, name=name, line=line, reduction_op="sum")


def nrm2(x: object, *, name: str | None = None) -> Array:
    """``sqrt(xᵀ x)`` as a 0-d array: the reduction ``<name>_ss`` and a 0-d ``sqrt`` kernel.

    The square root is a separate kernel because a reduction's result is complete only
    after every block finished (Filipovič et al. 2015, fusion rule F2).
    """
    line = user_line()
    operator = name or "nrm2"
    pipeline = _pipeline((x,), operator, line)
    vector = _vector(x, pipeline, "x", operator, line)
    final = pipeline._operator_name(name, "nrm2", line)
    with pipeline.all_or_nothing():  # two kernels: both or none
        squares = pipeline.add_kernel("reduce", vector * vector, name=f"{final}_ss", line=line,
                                      reduction_op="sum")
        return pipeline.add_kernel("point", unary("sqrt", squares.expr()), name=final,
                                   line=line, shape=())


def scal(alpha: object, x: object, *, name: str | None = None) -> Array:
    """``alpha * x`` (out of place: a new vector)."""
    line = user_line()
    operator = name or "scal"
    pipeline = _pipeline((x,), operator, line)
    body = as_expr(alpha) * _vector(x, pipeline, "x", operator, line)
    return pipeline.add_kernel("point", body, name=name, line=line)


def axpy(alpha: object, x: object, y: object, *, name: str | None = None) -> Array:
    """``alpha * x + y`` (out of place)."""
    line = user_line()
    operator = name or "axpy"
    pipeline = _pipeline((x, y), operator, line)
    body = as_expr(alpha) * _vector(x, pipeline, "x", operator, line) + _vector(
        y, pipeline, "y", operator, line)
    return pipeline.add_kernel("point", body, name=name, line=line)


def axpby(alpha: object, x: object, beta: object, y: object, *,
          name: str | None = None) -> Array:
    """``alpha * x + beta * y`` (BLAS ``waxpby``)."""
    line = user_line()
    operator = name or "axpby"
    pipeline = _pipeline((x, y), operator, line)
    body = (as_expr(alpha) * _vector(x, pipeline, "x", operator, line)
            + as_expr(beta) * _vector(y, pipeline, "y", operator, line))
    return pipeline.add_kernel("point", body, name=name, line=line)


# ---------------------------------------------------------------------------------------------
# Level 2: matrices (row-major)
# ---------------------------------------------------------------------------------------------

def outer(u: object, v: object) -> Expr:
    """``u vᵀ`` as a 2-D expression (``u`` along rows, ``v`` along columns), not a kernel.

    Use it inside a matrix operator: ``kfuse.point(A + outer(u, v))`` or :func:`ger`.
    """
    line = user_line()
    pipeline = _pipeline((u, v), "outer", line)
    left = _vector(u, pipeline, "u", "outer", line)
    right = _vector(v, pipeline, "v", "outer", line)
    return along(left, 0) * along(right, 1)


def ger(a: object, u: object, v: object, alpha: object = 1.0, *,
        name: str | None = None) -> Array:
    """Rank-1 update ``A + alpha u vᵀ`` (out of place: a new matrix)."""
    line = user_line()
    operator = name or "ger"
    pipeline = _pipeline((a, u, v), operator, line)
    matrix = _matrix(a, pipeline, "A", operator, line)
    left = along(_vector(u, pipeline, "u", operator, line), 0)
    right = along(_vector(v, pipeline, "v", operator, line), 1)
    body = matrix + as_expr(alpha) * left * right
    shape = _matrix_shape(pipeline, matrix, left, right)
    return pipeline.add_kernel("point", body, name=name, line=line, shape=shape)


def geam(alpha: object, a: object, beta: object, b: object, *,
         name: str | None = None) -> Array:
    """Matrix add ``alpha A + beta B`` (``B`` may be ``C.T``)."""
    line = user_line()
    operator = name or "geam"
    pipeline = _pipeline((a, b), operator, line)
    body = (as_expr(alpha) * _matrix(a, pipeline, "A", operator, line)
            + as_expr(beta) * _matrix(b, pipeline, "B", operator, line))
    return pipeline.add_kernel("point", body, name=name, line=line,
                               shape=_matrix_shape(pipeline, body))


def gemv(a: object, x: object, alpha: object = None, beta: object = None, y: object = None,
         *, trans: bool = False, name: str | None = None) -> Array:
    """``alpha A x + beta y`` (``trans``: ``alpha Aᵀ x + beta y``), ``A`` row-major.

    ``alpha A x`` is one nested map-reduce kernel (``alpha`` folded into the map); with
    ``y`` the sum ``... + beta y`` is a second, vector kernel (the reduction's result is
    never consumed in its own kernel). The product kernel is called ``<name>_prod`` then.
    """
    line = user_line()
    return _gemv(a, x, alpha, beta, y, trans=trans, name=name, line=line)


def matvec(a: object, x: object, *, name: str | None = None) -> Array:
    """``A x`` (also written ``A @ x``)."""
    line = user_line()
    return _gemv(a, x, None, None, None, trans=False, name=name, line=line)


def matvec_t(a: object, y: object, *, name: str | None = None) -> Array:
    """``Aᵀ y`` (also written ``A.T @ y``): ``A`` is still read row-major."""
    line = user_line()
    return _gemv(a, y, None, None, None, trans=True, name=name, line=line)


def _gemv(a: object, x: object, alpha: object, beta: object, y: object, *, trans: bool,
          name: str | None, line: UserLine | None) -> Array:
    operator = name or ("gemv_t" if trans else "gemv")
    pipeline = _pipeline((a, x, y) if y is not None else (a, x), operator, line)
    if isinstance(a, Transposed):  # (A.T) @ x through gemv(): flip
        a, trans = a.array, not trans
    matrix = _matrix(a, pipeline, "A", operator, line)
    vector = along(_vector(x, pipeline, "x", operator, line), 0 if trans else 1)
    body = matrix * vector
    if alpha is not None:
        body = as_expr(alpha) * body
    shape = _matrix_shape(pipeline, matrix, vector if trans else None,
                          None if trans else vector)
    axis = 0 if trans else 1
    if y is None:
        if beta is not None:
            raise DslError("beta needs y", operator=operator, where=where_of(line))
        return pipeline.add_kernel("reduce", body, name=name, line=line, reduction_op="sum",
                                   reduce_axes=(axis,), shape=shape)
    final = pipeline._operator_name(name, "gemv", line)
    with pipeline.all_or_nothing():  # two kernels: both or none
        product = pipeline.add_kernel("reduce", body, name=f"{final}_prod", line=line,
                                      reduction_op="sum", reduce_axes=(axis,), shape=shape)
        addend = _vector(y, pipeline, "y", operator, line)
        if beta is not None:
            addend = as_expr(beta) * addend
        return pipeline.add_kernel("point", product.expr() + addend, name=final, line=line)


def _array_matmul(self: Array, other: object) -> Array:
    """``A @ x`` on a symbolic 2-D array."""
    line = user_line()
    if self.ndim != 2:
        raise ShapeError(f"'{self.name}' is {self.ndim}-D; '@' needs a matrix on the left",
                         operator="matvec", where=where_of(line))
    return _gemv(self, other, None, None, None, trans=False, name=None, line=line)


def _array_transpose(self: Array) -> Transposed:
    """``A.T`` of a symbolic 2-D array."""
    if self.ndim != 2:
        raise ShapeError(f"'{self.name}' is {self.ndim}-D; .T needs a matrix",
                         where=where_of(user_line()))
    return Transposed(self)


# Arrays gain '@' and '.T' here (kept with the operators they build).
Array.__matmul__ = _array_matmul  # type: ignore[attr-defined]
Array.T = property(_array_transpose)  # type: ignore[attr-defined]


def _convert(value: object) -> Expr | None:
    return value.expr() if isinstance(value, Transposed) else None


from kfuse.ir.expr import register_converter  # noqa: E402 - after the class it converts

register_converter(_convert)

__all__ = ["Transposed", "along", "asum", "axpby", "axpy", "dot", "geam", "gemv", "ger",
           "matvec", "matvec_t", "nrm2", "outer", "scal"]
