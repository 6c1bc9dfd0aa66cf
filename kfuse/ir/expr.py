"""Expression trees: the body of every kernel.

An expression is an immutable tree evaluated at one point of a kernel's iteration space.
Leaves read arrays (`Load`, with constant offsets and a boundary mode), runtime scalar
parameters (`Param`), constants and coordinates. Inner nodes are arithmetic, comparisons,
math functions, selects and casts. Operator overloading builds trees, ``==`` and ``!=``
included (elementwise, as :func:`kfuse.dsl.eq`); nodes hash by identity, so they still work
as dict keys and set members (a lookup compares them by identity first), but code of kfuse
must never compare two nodes with ``==`` or look one up in a list: use ``is``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kfuse.errors import BoundaryError, DslError, DtypeError

FLOAT_DTYPES = ("float32", "float64")
# Two-byte floats: stored as such, computed in float32 inside an operator, and rounded to
# their dtype where an operator's result is formed (NumPy rounds after each operation).
HALF_DTYPES = ("float16", "bfloat16")
REAL_DTYPES = (*FLOAT_DTYPES, *HALF_DTYPES)
# Integers, by signedness and size. Arithmetic wraps around as NumPy's does.
INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "int64")
SMALL_INT_DTYPES = ("int8", "uint8", "int16", "uint16")  # computed in int, wrapped per op
DTYPES = ("float32", "float64", *HALF_DTYPES, *INT_DTYPES, "bool")

# C type of each dtype's values in generated code (two-byte floats: float), and of its
# elements in memory (STORAGE_TYPES: the prelude's kf_half and kf_bfloat16 for those).
C_TYPES = {"float32": "float", "float64": "double", "float16": "float", "bfloat16": "float",
           "int8": "signed char",
           "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
           "int32": "int", "int64": "long long", "bool": "bool"}
STORAGE_TYPES = {**C_TYPES, "float16": "kf_half", "bfloat16": "kf_bfloat16"}
ITEM_SIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
             "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "bool": 1}
# Bytes of a value in registers or shared memory (two-byte floats are computed as float).
VALUE_SIZE = {**ITEM_SIZE, "float16": 4, "bfloat16": 4}
INT_RANGES = {"int8": (-2**7, 2**7 - 1), "uint8": (0, 2**8 - 1), "int16": (-2**15, 2**15 - 1),
              "uint16": (0, 2**16 - 1), "int32": (-2**31, 2**31 - 1),
              "int64": (-2**63, 2**63 - 1), "bool": (0, 1)}


def normalize_dtype(dtype: object) -> str:
    """Map anything dtype-like (``"float32"``, ``numpy.float32``, ``numpy.dtype``) to our name;
    Python's ``float`` and ``int`` are float64 and int64, as in NumPy."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    aliases = {"float": "float64", "f4": "float32", "f8": "float64", "double": "float64",
               "int": "int64", "i4": "int32", "bool_": "bool", "i1": "int8", "u1": "uint8",
               "i2": "int16", "u2": "uint16", "i8": "int64", "byte": "int8",
               "ubyte": "uint8", "short": "int16", "ushort": "uint16", "long": "int64",
               "longlong": "int64", "int_": "int64", "half": "float16", "f2": "float16",
               "float16": "float16", "bfloat16": "bfloat16"}
    name = aliases.get(name, name)
    if name not in DTYPES:
        raise DtypeError(f"unsupported dtype {dtype!r}; kfuse supports {', '.join(DTYPES)}")
    return name


FLOAT32_ROUNDS_TO_INFINITY = (2 - 2**-24) * 2.0**127  # and beyond: float32 rounds to inf


def representable(value: float | int | bool, dtype: str) -> bool:
    """Whether ``value`` is exactly a value of ``dtype``: an integral number in int32's range
    for int32, 0 or 1 for bool, a float that rounds to a finite float32 (or inf, nan) for
    float32 (so the printed float32 maximum, 3.4028235e+38, is one)."""
    value = float(value)
    if dtype in ("float64", *HALF_DTYPES):  # (beyond a half's range: inf, as NumPy casts)
        return True
    if dtype == "float32":  # below the midpoint between float32's largest and 2^128
        return not math.isfinite(value) or abs(value) < FLOAT32_ROUNDS_TO_INFINITY
    if not value.is_integer():
        return False
    low, high = INT_RANGES[dtype]
    return low <= value <= high


# ---------------------------------------------------------------------------------------------
# Boundary modes
# ---------------------------------------------------------------------------------------------

BOUNDARY_MODES = ("clamp", "mirror", "repeat", "constant")


@dataclass(frozen=True)
class Boundary:
    """How a read outside the array is answered.

    clamp: nearest valid element; mirror: reflection that repeats the edge element
    (-1 -> 0, n -> n-1); repeat: periodic; constant: the given value, no load.
    """

    mode: str
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in BOUNDARY_MODES:
            raise BoundaryError(
                f"unknown boundary mode {self.mode!r}; use one of {', '.join(BOUNDARY_MODES)}"
            )
        if not (is_real_scalar(self.value) or is_integer_scalar(self.value)
                or is_bool_scalar(self.value)):
            raise BoundaryError(f"a constant border takes a number, got {self.value!r}"
                                + (" (a parameter's value is not known when the code is made)"
                                   if isinstance(self.value, Param) else ""))
        try:
            object.__setattr__(self, "value", float(self.value))
        except OverflowError:
            raise BoundaryError(f"a constant border of {self.value!r} is past any float's "
                                "range") from None
        if self.mode != "constant" and self.value != 0.0:
            raise BoundaryError(f"boundary mode {self.mode!r} takes no value")

    def __str__(self) -> str:
        return f"constant({self.value:g})" if self.mode == "constant" else self.mode


def as_boundary(spec: object) -> Boundary:
    """Accept a :class:`Boundary`, a mode name, or ``("constant", value)``."""
    if isinstance(spec, Boundary):
        return spec
    if isinstance(spec, str):
        if spec == "constant":
            return Boundary("constant", 0.0)
        return Boundary(spec)
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "constant":
        return Boundary("constant", spec[1])
    raise BoundaryError(f"cannot read {spec!r} as a boundary mode; use one of {BOUNDARY_MODES}")


# ---------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------

UNARY_FUNCTIONS = ("neg", "not", "sqrt", "rsqrt", "exp", "log", "sin", "cos", "tanh", "abs",
                   "floor", "ceil", "round", "trunc", "exp2", "log2", "expm1", "log1p", "erf",
                   "tan", "atan")
BINARY_OPERATORS = ("add", "sub", "mul", "div", "min", "max", "pow",
                    "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "floordiv", "mod")
# Integer floor division and remainder (Python's and NumPy's: the remainder takes the
# divisor's sign), by a positive constant: a coordinate's phase on a coarser grid.
INTEGER_DIVISIONS = ("floordiv", "mod")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("and", "or")
# the special-function unit's (or a library call's) work, not one arithmetic instruction
SPECIAL_FUNCTIONS = ("sqrt", "rsqrt", "exp", "log", "sin", "cos", "tanh", "exp2", "log2",
                     "expm1", "log1p", "erf", "tan", "atan")
FLOAT_ONLY = (*SPECIAL_FUNCTIONS, "floor", "ceil", "round", "trunc", "pow", "div")


class Expr:
    """Base of all expression nodes. Subclasses are frozen dataclasses with a ``dtype``."""

    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return ()

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        return self

    def walk(self) -> Iterator[Expr]:
        """Every node of the tree, each distinct node once, children before parents."""
        seen: set[int] = set()
        stack: list[tuple[Expr, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                yield node
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children()))

    # -- operator overloading --------------------------------------------------------------
    def __add__(self, other): return binary("add", self, other)
    def __radd__(self, other): return binary("add", other, self)
    def __sub__(self, other): return binary("sub", self, other)
    def __rsub__(self, other): return binary("sub", other, self)
    def __mul__(self, other): return binary("mul", self, other)
    def __rmul__(self, other): return binary("mul", other, self)
    def __truediv__(self, other): return binary("div", self, other)
    def __rtruediv__(self, other): return binary("div", other, self)
    def __pow__(self, other): return binary("pow", self, other)
    def __rpow__(self, other): return binary("pow", other, self)
    def __lt__(self, other): return binary("lt", self, other)
    def __le__(self, other): return binary("le", self, other)
    def __gt__(self, other): return binary("gt", self, other)
    def __ge__(self, other): return binary("ge", self, other)
    def __eq__(self, other): return _comparison("eq", self, other)  # type: ignore[override]
    def __ne__(self, other): return _comparison("ne", self, other)  # type: ignore[override]
    __hash__ = object.__hash__  # by identity: nodes stay dict keys though == is elementwise
    __array_ufunc__ = None  # NumPy scalars on the left (np.int64(2) * x) defer to these methods
    def __and__(self, other): return binary("and", self, other)
    def __rand__(self, other): return binary("and", other, self)
    def __or__(self, other): return binary("or", self, other)
    def __ror__(self, other): return binary("or", other, self)
    def __neg__(self): return unary("neg", self)
    def __pos__(self): return self
    def __invert__(self): return unary("not", self)
    def __abs__(self): return unary("abs", self)

    def __bool__(self) -> bool:
        raise DslError("a kfuse expression has no truth value at trace time; "
                       "use kfuse.where(cond, a, b) instead of if/else, and & | instead of and/or")

    def __floordiv__(self, other): return integer_division("floordiv", self, other)
    def __mod__(self, other): return integer_division("mod", self, other)

    def __rfloordiv__(self, other):
        raise DslError("'//' takes an integer expression on the left and a positive integer "
                       "constant on the right; for floats use kfuse.floor(a / b)")

    def __rmod__(self, other):
        raise DslError("'%' takes an integer expression on the left and a positive integer "
                       "constant on the right")


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float | int | bool
    dtype: str
    weak: bool = False  # a Python literal: adopts the dtype of the other operand

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True, eq=False)
class Param(Expr):
    """A runtime scalar parameter of the pipeline."""

    name: str
    dtype: str

    def __repr__(self) -> str:
        return f"${self.name}"


@dataclass(frozen=True, eq=False)
class Coord(Expr):
    """The integer coordinate of the current point along one axis of the iteration space."""

    axis: int
    dtype: str = "int32"


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Read ``buffer`` at (current point + offsets).

    ``dims[k]`` is the iteration axis that indexes array axis ``k`` (identity for a plain
    read; fewer entries for a broadcast read, e.g. a vector read along one matrix axis).
    The DSL leaves ``dims`` unset for plain reads until the operator's domain is known.
    ``boundary`` answers reads outside the array; ``None`` until the operator fills its default.
    ``scales[k]`` (``(numerator, denominator)``) reads array axis ``k`` at
    ``floor(p * numerator / denominator) + offsets[k]`` for the point's coordinate ``p``
    along ``dims[k]``: ``(2, 1)`` a downsampling read, ``(1, 2)`` an upsampling one; None
    (and ``(1, 1)``) reads at ``p + offsets[k]``. ``indices[k]`` (an integer expression)
    reads axis ``k`` at its value plus ``offsets[k]`` (a data-dependent read: a lookup
    table, a level chosen by a value); that axis follows no iteration axis (``dims[k]`` is
    -1) and the expression is a child of the read.
    """

    buffer: str
    dtype: str
    offsets: tuple[int, ...]
    dims: tuple[int, ...] | None  # None only while the DSL builds an operator
    boundary: Boundary | None = None
    origin: object = field(default=None, compare=False, repr=False)  # the DSL pipeline
    scales: tuple[tuple[int, int], ...] | None = None
    indices: tuple[Expr | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.scales is not None and all(scale == (1, 1) for scale in self.scales):
            object.__setattr__(self, "scales", None)  # one spelling of "not scaled"
        if self.indices is not None and all(index is None for index in self.indices):
            object.__setattr__(self, "indices", None)

    def children(self) -> tuple[Expr, ...]:
        return () if self.indices is None else tuple(i for i in self.indices if i is not None)

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        if self.indices is None:
            return self
        given = iter(children)
        indices = tuple(None if index is None else next(given) for index in self.indices)
        return Load(self.buffer, self.dtype, self.offsets, self.dims, self.boundary,
                    self.origin, self.scales, indices)

    @property
    def is_gathered(self) -> bool:
        """True for a data-dependent read (some axis indexed by a computed value)."""
        return self.indices is not None

    @property
    def is_remapped(self) -> bool:
        """True for a read not at the point plus an offset on some axis (scaled or
        data-dependent): forms that stage or stream what a point reads read it where it is."""
        return self.scales is not None or self.indices is not None

    @property
    def is_scaled(self) -> bool:
        """True for a read at another resolution (some axis read at a multiple or a
        fraction of the point's coordinate)."""
        return self.scales is not None

    def scale(self, axis: int) -> tuple[int, int]:
        """(numerator, denominator) of array axis ``axis``'s index (``(1, 1)``: unscaled)."""
        return (1, 1) if self.scales is None else self.scales[axis]

    @property
    def read_key(self) -> tuple:
        """What makes two reads the same read (code generation may rebuild a body's
        nodes): the array, where and how it is read."""
        indices = None if self.indices is None else tuple(  # (their values: the children)
            index is not None for index in self.indices)
        return (self.buffer, self.offsets, self.dims, self.boundary, self.scales, indices)

    @property
    def is_centered(self) -> bool:
        """True for a read at the current point itself (no offset, not remapped)."""
        return not self.is_remapped and all(offset == 0 for offset in self.offsets)

    def __repr__(self) -> str:
        if self.is_centered:
            return self.buffer
        terms = []
        for axis, offset in enumerate(self.offsets):
            numerator, denominator = self.scale(axis)
            point = "p" if (numerator, denominator) == (1, 1) else \
                f"{numerator}p" if denominator == 1 else f"p/{denominator}" \
                if numerator == 1 else f"{numerator}p/{denominator}"
            terms.append(f"{point}{offset:+d}")
        if self.indices is not None:
            terms = [term if index is None else f"({index!r}){offset:+d}"
                     for term, index, offset in zip(terms, self.indices, self.offsets,
                                                    strict=True)]
        elif self.scales is None:
            return f"{self.buffer}[{', '.join(f'{o:+d}' for o in self.offsets)}]"
        return f"{self.buffer}[{', '.join(terms)}]"


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    op: str
    x: Expr
    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        return Unary(self.op, children[0], self.dtype)


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        return Binary(self.op, children[0], children[1], self.dtype)


@dataclass(frozen=True, eq=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        return Select(children[0], children[1], children[2], self.dtype)


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    x: Expr
    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def replace_children(self, children: tuple[Expr, ...]) -> Expr:
        return Cast(children[0], self.dtype)


# ---------------------------------------------------------------------------------------------
# Construction with type promotion
# ---------------------------------------------------------------------------------------------

# Objects that can stand for an expression (the DSL's symbolic arrays) register a converter.
_converters: list[Callable[[object], Expr | None]] = []


def register_converter(convert: Callable[[object], Expr | None]) -> None:
    _converters.append(convert)


def is_integer_scalar(value: object) -> bool:
    """True for a Python or NumPy integer (``np.int64(2)``), False for bools."""
    return isinstance(value, numbers.Integral) and not is_bool_scalar(value)


def is_bool_scalar(value: object) -> bool:
    """True for ``True``/``False`` and NumPy's ``np.bool_``."""
    return isinstance(value, (bool, np.bool_))


def is_real_scalar(value: object) -> bool:
    """True for a Python or NumPy number that is not an integer or a bool (``np.float32``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) \
        and not is_bool_scalar(value)


def as_expr(value: object) -> Expr:
    """Turn a Python or NumPy number, an expression or a DSL array into an expression."""
    if isinstance(value, Expr):
        return value
    if is_bool_scalar(value):
        return Const(bool(value), "bool", weak=True)
    if is_integer_scalar(value):
        if not -2**63 <= int(value) < 2**63:  # no dtype of kfuse holds it, nor float64 exactly
            raise DslError(f"the integer constant {value} is out of range")
        return Const(int(value), "int32", weak=True)
    if is_real_scalar(value):
        return Const(float(value), "float32", weak=True)
    for convert in _converters:
        converted = convert(value)
        if converted is not None:
            return converted
    type_name = type(value).__name__
    raise DslError(f"cannot use a value of type {type_name} in a kfuse expression")


def _rank(dtype: str) -> int:
    return {"bool": 0, "float16": 2, "bfloat16": 2, "float32": 3, "float64": 4}.get(dtype, 1)


def _promote_floats(a: str, b: str) -> str:
    """Two dtypes of which one at least is a float: NumPy's float of both (float16 with
    bfloat16, or a half with an integer wider than a byte: float32; an integer with float32:
    float32, where NumPy gives float64 for int32 and int64)."""
    if a == b:
        return a
    if _rank(a) < _rank(b):
        a, b = b, a
    if a in HALF_DTYPES:  # the other is a half of the other kind, an integer or a bool
        return a if b == "bool" or b in ("int8", "uint8") else "float32"
    return a


def promote_integers(a: str, b: str) -> str:
    """NumPy's result of two integer dtypes: the smaller that holds both (int64 at most)."""
    if a == b:
        return a
    low = min(INT_RANGES[a][0], INT_RANGES[b][0])
    high = max(INT_RANGES[a][1], INT_RANGES[b][1])
    for dtype in ("int8", "uint8", "int16", "uint16", "int32", "int64"):
        if INT_RANGES[dtype][0] <= low and high <= INT_RANGES[dtype][1]:
            return dtype
    return "int64"


def promote(a: Expr, b: Expr) -> str:
    """Result dtype of combining two operands (Python literals are weak).

    NumPy's rules, but for one: an integer array with a float32 one (or a Python float)
    gives float32, where NumPy gives float64 for int32 and int64.
    """
    a_weak = isinstance(a, Const) and a.weak
    b_weak = isinstance(b, Const) and b.weak
    if a_weak and not b_weak:
        a, b = b, a
        a_weak, b_weak = b_weak, a_weak
    if b_weak and not a_weak:
        if b.dtype == "float32" and (a.dtype in INT_DTYPES or a.dtype == "bool"):
            return "float32"
        if b.dtype == "int32" and a.dtype == "bool":
            return "int32"
        return a.dtype
    if a.dtype in INT_DTYPES and b.dtype in INT_DTYPES:
        return promote_integers(a.dtype, b.dtype)
    if a.dtype in REAL_DTYPES or b.dtype in REAL_DTYPES:
        return _promote_floats(a.dtype, b.dtype)
    result = a.dtype if _rank(a.dtype) >= _rank(b.dtype) else b.dtype
    if result == "bool":
        return "int32"
    return result


def _coerce(node: Expr, dtype: str) -> Expr:
    if dtype in INT_DTYPES and isinstance(node, Const) and not isinstance(node.value, bool) \
            and isinstance(node.value, int) and not \
            INT_RANGES[dtype][0] <= node.value <= INT_RANGES[dtype][1]:
        raise DtypeError(f"the integer constant {node.value} does not fit {dtype}, the dtype "
                         "it meets (NumPy raises OverflowError here too): write it as a float, "
                         "or cast the array to a wider dtype first")
    if node.dtype == dtype:
        return node
    if isinstance(node, Const):
        value = bool(node.value) if dtype == "bool" else int(node.value) \
            if dtype in INT_DTYPES else round_to(float(node.value), dtype)
        if dtype in INT_DTYPES:  # a constant cast wraps around as NumPy's astype does
            low, high = INT_RANGES[dtype]
            value = (value - low) % (high - low + 1) + low
        return Const(value, dtype)
    return Cast(node, dtype)


# x ** n for a constant whole n with 1 <= |n| <= this: products (and a reciprocal), exact for
# n = 2 as NumPy's square; integer powers of integers (0 <= n <= INTEGER_POWERS) stay
# integers as in NumPy (wrapping around as NumPy's do).
PRODUCT_POWERS = 8
INTEGER_POWERS = 64


def _power_as_products(base: Expr, exponent: Expr) -> Expr | None:
    """``base ** exponent`` as multiplications where the exponent is a small whole constant,
    as a square root where it is 0.5 (as NumPy computes both), None otherwise (the general
    pow)."""
    if not isinstance(exponent, Const) or exponent.dtype == "bool" or base.dtype == "bool":
        return None
    try:
        value = float(exponent.value)
    except OverflowError:  # an exponent past float64's range: the general pow
        return None
    dtype = promote(base, exponent)
    if value == 0.5 and dtype in REAL_DTYPES:  # NumPy's square root (-0 and -inf as sqrt's)
        return Unary("sqrt", _coerce(base, dtype), dtype)
    if not value.is_integer():
        return None
    if dtype not in REAL_DTYPES:  # integers: any whole n >= 0 (NumPy refuses n < 0)
        if not 0 <= value <= INTEGER_POWERS:
            return None
        if value == 0:  # reads the base still (an operator needs an array)
            zero = Binary("mul", _coerce(base, dtype), Const(0, dtype), dtype)
            return Binary("add", zero, Const(1, dtype), dtype)
    elif not 1 <= abs(value) <= PRODUCT_POWERS:
        return None
    factor, product, remaining = _coerce(base, dtype), None, int(abs(value))
    while remaining:  # square and multiply
        if remaining & 1:
            product = factor if product is None else Binary("mul", product, factor, dtype)
        remaining >>= 1
        if remaining:
            factor = Binary("mul", factor, factor, dtype)
    assert product is not None
    return product if value > 0 else Binary("div", Const(1.0, dtype), product, dtype)


def binary(op: str, a: object, b: object) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if op == "pow":
        products = _power_as_products(a, b)
        if products is not None:
            return products
    if op in LOGICAL:
        if a.dtype != "bool" or b.dtype != "bool":
            raise DtypeError(f"'{op}' needs two conditions (bool), got {a.dtype} and {b.dtype}")
        return Binary(op, a, b, "bool")
    operand = promote(a, b)
    if op in FLOAT_ONLY and operand not in REAL_DTYPES:
        operand = "float32"
    a, b = _coerce(a, operand), _coerce(b, operand)
    result = "bool" if op in COMPARISONS else operand
    return Binary(op, a, b, result)


def weighted_sum(terms: Sequence[tuple[float, Expr | None]], dtype: str) -> Expr | None:
    """``Σ weight * term`` (a weighted sum of taps: a convolution's, a separable stencil's),
    skipping zero weights and missing terms, multiplying only by weights other than ±1, and
    starting from a positive term where there is one; None where nothing is left."""
    kept = sorted(((w, t) for w, t in terms if w != 0.0 and t is not None),
                  key=lambda term: term[0] < 0)
    total: Expr | None = None
    for weight, term in kept:
        if total is not None and weight == -1.0:
            total = binary("sub", total, term)
            continue
        scaled = term if weight == 1.0 else binary("mul", Const(weight, dtype), term)
        total = scaled if total is None else binary("add", total, scaled)
    return total


def integer_division(op: str, a: object, b: object) -> Expr:
    """``a // b`` or ``a % b`` of an integer expression by a positive integer constant
    (floor division and a remainder of the divisor's sign, as Python's and NumPy's)."""
    symbol = "//" if op == "floordiv" else "%"
    a, b = as_expr(a), as_expr(b)
    if a.dtype not in INT_DTYPES or not (isinstance(b, Const) and is_integer_scalar(b.value)
                                         and b.value > 0):
        hint = "; for floats use kfuse.floor(a / b)" if op == "floordiv" else ""
        raise DslError(f"'{symbol}' takes an integer expression on the left and a positive "
                       f"integer constant on the right (got {a.dtype} {symbol} {b!r}){hint}")
    return Binary(op, a, _coerce(b, a.dtype), a.dtype)


def _comparison(op: str, a: Expr, b: object) -> Expr:
    """``a == b`` / ``a != b`` elementwise; NotImplemented where ``b`` is no operand (None,
    a string), so Python answers by identity there as for any object."""
    try:
        other = as_expr(b)
    except DslError:
        return NotImplemented
    return binary(op, a, other)


def unary(op: str, x: object) -> Expr:
    x = as_expr(x)
    if op == "not":
        if x.dtype != "bool":
            raise DtypeError(f"'~' needs a condition (bool), got {x.dtype}")
        return Unary(op, x, "bool")
    dtype = x.dtype
    if dtype == "bool":
        dtype = "int32"
    if op in FLOAT_ONLY and dtype not in REAL_DTYPES:
        dtype = "float32"
    return Unary(op, _coerce(x, dtype), dtype)


def select(cond: object, a: object, b: object) -> Expr:
    cond, a, b = as_expr(cond), as_expr(a), as_expr(b)
    if cond.dtype != "bool":
        raise DtypeError(f"where() needs a condition (bool) as first argument, got {cond.dtype}")
    dtype = promote(a, b)
    return Select(cond, _coerce(a, dtype), _coerce(b, dtype), dtype)


def cast(x: object, dtype: object) -> Expr:
    return _coerce(as_expr(x), normalize_dtype(dtype))


def resolve_weak_constants(node: Expr, dtype: str) -> Expr:
    """Give a bare literal a concrete dtype (a kernel whose whole body is a constant)."""
    if isinstance(node, Const) and node.weak:
        return _coerce(Const(node.value, node.dtype), dtype)
    return node


def with_children(node: Expr, children: tuple[Expr, ...]) -> Expr:
    """``node`` itself when ``children`` are its own, else a copy of it over ``children``."""
    if all(new is old for new, old in zip(children, node.children(), strict=True)):
        return node
    return node.replace_children(children)


def transform(node: Expr, rewrite: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild a tree bottom-up; ``rewrite`` returns a replacement node or ``None`` to keep.

    Iterative (children before parents, each distinct node once), so expressions thousands
    of nodes deep (a large convolution's sum of taps) do not reach Python's recursion limit.
    """
    memo: dict[int, Expr] = {}
    stack: list[tuple[Expr, bool]] = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        key = id(current)
        if key in memo:
            continue
        children = current.children()
        if not expanded:
            stack.append((current, True))
            stack.extend((child, False) for child in reversed(children) if id(child) not in memo)
            continue
        rebuilt = with_children(current, tuple(memo[id(child)] for child in children))
        replaced = rewrite(rebuilt)
        memo[key] = rebuilt if replaced is None else replaced
    return memo[id(node)]


def loads(node: Expr) -> list[Load]:
    """Every distinct read of the tree, in first-visit order."""
    return [n for n in node.walk() if isinstance(n, Load)]


def params(node: Expr) -> list[Param]:
    return [n for n in node.walk() if isinstance(n, Param)]


def shift_between(a: Expr, b: Expr) -> dict[int, int] | None:
    """The shift (iteration axis -> points) that turns ``a`` into ``b``, or None.

    ``b`` must be ``a`` with every read moved by the same non-zero shift (a window's next
    tap); expressions that read coordinates are never shifted copies.
    """
    shift: dict[int, int] = {}
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y) or x.dtype != y.dtype or isinstance(x, Coord):
            return None
        if isinstance(x, Load):
            assert isinstance(y, Load)
            if (x.buffer, x.dims) != (y.buffer, y.dims) or x.is_remapped or y.is_remapped \
                    or None not in (
                    x.boundary, y.boundary) and x.boundary != y.boundary:
                return None  # a read at the point itself has no boundary mode
            for axis, offset_x, offset_y in zip(x.dims or (), x.offsets, y.offsets, strict=True):
                if shift.setdefault(axis, offset_y - offset_x) != offset_y - offset_x:
                    return None
            continue
        if isinstance(x, Const):
            if x.value != y.value:  # type: ignore[attr-defined]
                return None
            continue
        if isinstance(x, Param):
            if x.name != y.name:  # type: ignore[attr-defined]
                return None
            continue
        if getattr(x, "op", None) != getattr(y, "op", None):
            return None
        pending.extend(zip(x.children(), y.children(), strict=True))
    return shift if any(shift.values()) else None


def count_operations(node: Expr) -> dict[str, int]:
    """Arithmetic (ALU) and special-function (SFU) operations of one evaluation."""
    counts = {"alu": 0, "sfu": 0}
    for n in node.walk():
        if isinstance(n, Binary):
            counts["sfu" if n.op in ("div", "pow") and n.dtype in REAL_DTYPES else "alu"] += 1
        elif isinstance(n, Unary):
            special = n.op in SPECIAL_FUNCTIONS
            counts["sfu" if special else "alu"] += 1
        elif isinstance(n, Select):
            counts["alu"] += 1
    return counts


def round_to(value: float, dtype: str) -> float:
    """``value`` rounded to ``dtype`` (to nearest, ties to even) where that is a two-byte
    float, else itself."""
    if dtype == "float16":
        return float(np.float16(value))
    if dtype == "bfloat16":  # the upper half of the float32 bits, rounded
        if math.isnan(value):
            return value
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.array(bits, dtype=np.uint32).view(np.float32))
    return value


def format_value(value: float | int | bool, dtype: str) -> str:
    """A C literal for a constant of the given dtype (a two-byte float's: its value, as a
    float)."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in INT_DTYPES:
        number = int(value)
        if dtype == "int64":  # (the smallest has no literal: its negation overflows)
            return "(-9223372036854775807LL - 1)" if number == -2**63 else f"{number}LL"
        return str(number)
    value = float(value)
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "-INFINITY"
    else:
        text = repr(value)
        if "e" not in text and "." not in text:
            text += ".0"
    if dtype in HALF_DTYPES:
        return format_value(round_to(value, dtype), "float32")
    if dtype == "float32" and text[-1].isdigit():
        return text + "f"
    return text if dtype == "float64" else f"((float){text})"
