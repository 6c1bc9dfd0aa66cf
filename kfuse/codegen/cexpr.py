"""Emit an expression tree as C statements, one named value per distinct subexpression.

Reads become loads with boundary-mapped indices (each index computed once per axis and
offset); identical subtrees are emitted once (common-subexpression elimination), and 3-tap
window sums are associated so that neighbouring points share a pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfuse import config
from kfuse.analysis.operations import LOG_IN_EXP, logs_in_exp
from kfuse.ir.cnames import c_name
from kfuse.ir.expr import (
    C_TYPES,
    FLOAT_DTYPES,
    HALF_DTYPES,
    INT_DTYPES,
    SMALL_INT_DTYPES,
    STORAGE_TYPES,
    Binary,
    Cast,
    Const,
    Coord,
    Expr,
    Load,
    Param,
    Select,
    Unary,
    format_value,
    shift_between,
)
from kfuse.ir.graph import Graph
from kfuse.ir.sizes import derived_size

_FLOAT_FUNCTIONS = {
    "sqrt": "sqrt", "rsqrt": "rsqrt", "exp": "exp", "log": "log", "sin": "sin", "cos": "cos",
    "tanh": "tanh", "abs": "fabs", "floor": "floor", "ceil": "ceil", "pow": "pow",
    "round": "rint",  # to nearest, ties to even: NumPy's round
    "trunc": "trunc", "exp2": "exp2", "log2": "log2", "expm1": "expm1", "log1p": "log1p",
    "erf": "erf", "tan": "tan", "atan": "atan",
}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}
# int32 and int64 operations that can overflow: the prelude's wrapping helpers (NumPy's
# wraparound); the smaller integers compute in int and are cast back (:func:`_wrapped`)
_INT_WRAPPING = {"add": "kf_iadd", "sub": "kf_isub", "mul": "kf_imul"}
_LONG_WRAPPING = {"add": "kf_ladd", "sub": "kf_lsub", "mul": "kf_lmul"}


FOLDED_DTYPES = frozenset({"bool", "int32", "float32"})
_INT32_RANGE = range(-2**31, 2**31)
_FOLDED_INT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
               "floordiv": lambda a, b: a // b if b > 0 else None,
               "mod": lambda a, b: a % b if b > 0 else None}
_FOLDED_FLOAT = {"add": np.add, "sub": np.subtract, "mul": np.multiply}
_FOLDED_COMPARISON = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
                      "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
                      "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def folded_value(node: Expr, values: list[Any]) -> int | float | bool | None:
    """The value of ``node`` on constant operands where C computes it exactly as Python
    does here (int32 arithmetic inside its range, float32 sums and products rounded to
    float32, comparisons, logic, exact casts, negation and absolute values); else None."""
    dtype = node.dtype
    if dtype not in FOLDED_DTYPES:
        return None
    if isinstance(node, Cast):
        value = values[0]
        if dtype == "float32" and isinstance(value, int) and abs(value) < 2**24:
            return float(value)
        return value if dtype == "int32" and type(value) is int else None
    if isinstance(node, Unary):
        value = values[0]
        if node.op == "not" and dtype == "bool":
            return not value
        if node.op in ("neg", "abs") and dtype != "bool":
            result = -value if node.op == "neg" else abs(value)
            return result if dtype == "float32" or result in _INT32_RANGE else None
        return None
    if not isinstance(node, Binary):
        return None
    a, b = values
    if node.op in _FOLDED_COMPARISON and dtype == "bool":
        return bool(_FOLDED_COMPARISON[node.op](a, b))
    if node.op in ("and", "or") and dtype == "bool":
        return bool(a and b) if node.op == "and" else bool(a or b)
    if dtype == "int32" and node.op in _FOLDED_INT and type(a) is int and type(b) is int:
        result = _FOLDED_INT[node.op](a, b)
        return result if result is not None and result in _INT32_RANGE else None
    if dtype == "float32" and node.op in _FOLDED_FLOAT:
        return float(_FOLDED_FLOAT[node.op](np.float32(a), np.float32(b)))
    return None


def plus_constant(text: str, constant: int) -> str:
    """C text of ``text + constant`` (``text`` itself for 0)."""
    return text if constant == 0 else \
        f"{text} {'+' if constant > 0 else '-'} {abs(constant)}"


def element_value(text: str, dtype: str) -> str:
    """The value of the element ``text`` reads from memory (a two-byte float's: as float)."""
    return f"kf_value({text})" if dtype in HALF_DTYPES else text


_PRELUDE_NAMES = {"float16": "half", "bfloat16": "bfloat16"}  # kf_to_half, kf_round_half


def element_store(value: str, dtype: str) -> str:
    """``value`` as an element of ``dtype`` is stored (a two-byte float's: rounded)."""
    if dtype in HALF_DTYPES:
        return f"kf_to_{_PRELUDE_NAMES[dtype]}({value})"
    return f"({C_TYPES[dtype]}){value}"


def rounded(value: str, dtype: str) -> str:
    """``value`` rounded to ``dtype`` where that is a two-byte float (an operator's result
    is formed as its unfused kernel stores it), else itself."""
    if dtype in HALF_DTYPES:
        return f"kf_round_{_PRELUDE_NAMES[dtype]}({value})"
    return value


def _wrapped(text: str, dtype: str) -> str:
    """``text`` cast back to ``dtype`` where that is an integer smaller than int (C computes
    it in int): the result wraps around as NumPy's int8, uint8, int16 and uint16 do."""
    return f"({C_TYPES[dtype]})({text})" if dtype in SMALL_INT_DTYPES else text


Coordinate = tuple[str, int]  # (C variable, constant shift)

# 3-tap windows are summed so that neighbouring points share a pair
# (ExprEmitter._emit_window_sum) and constant-mode reads that may fall outside load from
# their clamped index unconditionally (a load inside the conditional is a branch per tap,
# which keeps the compiler from issuing a tile's loads together) unless kfuse.config's
# ``window_sums`` and ``unconditional_border_loads`` say otherwise.

# 8- and 16-byte vector types by (element dtype, elements): one load for a thread's columns
# (dtype, columns) -> the CUDA vector type that loads or stores that many at once (the
# narrow integers too: an 8-bit image read a byte per thread reaches a third of the bandwidth)
VECTOR_TYPES = {("float32", 2): "float2", ("float32", 4): "float4", ("float64", 2): "double2",
                ("int32", 2): "int2", ("int32", 4): "int4", ("int64", 2): "longlong2",
                ("int8", 2): "char2", ("int8", 4): "char4",
                ("uint8", 2): "uchar2", ("uint8", 4): "uchar4",
                ("int16", 2): "short2", ("int16", 4): "short4",
                ("uint16", 2): "ushort2", ("uint16", 4): "ushort4"}


def coordinate_text(coord: Coordinate) -> str:
    base, shift = coord
    return base if shift == 0 else f"({base} {'+' if shift > 0 else '-'} {abs(shift)})"


_DEFAULT_SIZE = re.compile(r"[A-Za-z_]\w*\.\d+")  # an input's axis ``x.0`` (kfuse's own)
# what defaults and derived sizes become, and their suffixed form
_NUMBERED = re.compile(r".*_(over|times)?\d+(_s)*")


def size_var(symbol: str) -> str:
    """The C variable holding a size symbol's value, one-to-one: a fixed size ``23`` is
    ``n_23``, an input's default symbol ``x.0`` is ``n_x_0``, a pyramid level's ``x.0/2``
    ``n_x_0_over2`` (``n*2``: ``n_n_times2``), a symbol the user named is ``n_`` and the
    name (with the suffix ``_s`` where it ends like a default's or a level's, ``_0`` or
    ``_over2``), and any other symbol is spelled as :func:`c_name` spells it."""
    derived = derived_size(symbol)
    if derived is not None:
        base, operation, factor = derived
        return f"{size_var(base)}_{'over' if operation == '/' else 'times'}{factor}"
    if symbol.isascii() and (symbol.isdigit() or _DEFAULT_SIZE.fullmatch(symbol)):
        return "n_" + symbol.replace(".", "_")
    if symbol.isascii() and symbol.isidentifier():
        return "n_" + symbol + ("_s" if _NUMBERED.fullmatch(symbol) else "")
    return "n_" + c_name(symbol)


def comment_text(text: str) -> str:
    """``text`` (the user's file name and line) safe inside a ``//`` comment of generated C:
    characters that are not printable are written as escapes (a newline would end the
    comment and make the rest code), and it never ends with a backslash (which would join
    the next line of code to the comment)."""
    safe = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    return safe + "." if safe.rstrip().endswith("\\") else safe


def param_var(name: str) -> str:
    return "p_" + name




def function_name(op: str, dtype: str) -> str:
    """The C math function for ``op`` on ``dtype`` (float32 gets the ``f`` suffix)."""
    if dtype in INT_DTYPES:  # abs of the smallest value wraps around (to itself)
        return {"abs": "kf_labs" if dtype == "int64" else "kf_iabs", "min": "min",
                "max": "max"}[op]
    if op in ("min", "max"):
        return f"kf_{op}"  # see the prelude: NaN on either side is the result, as NumPy's
    if op in ("pow", "sqrt") and dtype == "float32":
        return f"kf_{op}f"  # see the prelude: branch-free forms, accuracy stated there
    if op == LOG_IN_EXP:
        return "kf_logf_in_exp"  # float32 only (see logs_in_exp)
    base = _FLOAT_FUNCTIONS[op]
    return base + "f" if dtype == "float32" else base


def _three_term_sum(node: Expr) -> bool:
    """``(x[i-s] + x[i]) + x[i+s]`` in floating point: a 3-tap window of one expression."""
    if not (config.current().window_sums and isinstance(node, Binary) and node.op == "add"
            and node.dtype in FLOAT_DTYPES):
        return False
    inner = node.a
    if not (isinstance(inner, Binary) and inner.op == "add" and inner.dtype == node.dtype):
        return False
    if any(_is_product(term) for term in (inner.a, inner.b, node.b)):
        return False
    step = shift_between(inner.a, inner.b)
    return step is not None and step == shift_between(inner.b, node.b)


def _is_product(term: Expr) -> bool:
    """A product, which the compiler folds into the addition that consumes it (FFMA): such
    sums are left as written (sharing their pairs measured 2% slower on Enhance, H200)."""
    return (isinstance(term, Binary) and term.op == "mul") or (
        isinstance(term, Unary) and term.op == LOG_IN_EXP)


def structural_key(node: Expr, child_keys: tuple) -> tuple:
    """A hashable key equal for structurally identical nodes whose children have the keys
    ``child_keys`` (numbers, :attr:`EmitState.structures`)."""
    if isinstance(node, Const):
        return ("const", node.value, node.dtype)
    if isinstance(node, Param):
        return ("param", node.name)
    if isinstance(node, Coord):
        return ("coord", node.axis)
    if isinstance(node, Load):
        return ("load", *node.read_key, child_keys)
    if isinstance(node, Unary):
        return ("unary", node.op, node.dtype, child_keys)
    if isinstance(node, Binary):
        return ("binary", node.op, node.dtype, child_keys)
    if isinstance(node, Select):
        return ("select", node.dtype, child_keys)
    if isinstance(node, Cast):
        return ("cast", node.dtype, child_keys)
    raise TypeError(f"unknown expression node {type(node).__name__}")


@dataclass(frozen=True)
class Statement:
    """One emitted definition ``const <ctype> <name> = <text>;`` and what it is: its
    ``key`` says how the value is made from its operands, each named by
    :meth:`EmitState.ref_of` (an index by its axis, its offset from the axis's base and its
    boundary mode; another statement by its name), so that two statements with equal keys
    compute the same value, and a statement's counterpart elsewhere (one plane up,
    :mod:`kfuse.codegen.marching`) is the one whose key is this key moved there. Keys stay
    flat (a statement is named, not spelled out), so hashing one costs its own operands
    only. ``refs`` names the statements its text reads."""

    ctype: str
    name: str
    text: str
    key: tuple
    refs: tuple[str, ...] = ()
    accesses: tuple[str, ...] = ()  # its reads of staged buffers (EmitState.accesses)

    @property
    def line(self) -> str:
        return f"const {self.ctype} {self.name} = {self.text};"


def index_key(base: str, offset: int, *mode: str) -> tuple:
    """The key of an index (or inside-flag) statement: ``base`` + ``offset`` through
    ``mode`` (none: known inside; (size, mode) or (size, "flag"))."""
    return ("index", base, offset, *mode)


def moved_key(key: tuple, base: str, by: int, moved: Callable[[str], str | None]
              ) -> tuple | None:
    """``key`` with every index of axis ``base`` (and coordinate along it) ``by`` further
    and every statement it names replaced by ``moved(name)``, the statement moved as far
    (None where one has no such counterpart)."""
    if key and key[0] in ("index", "coord") and key[1] == base:
        return (key[0], base, key[2] + by, *key[3:])
    if key and key[0] == "stmt":
        name = moved(key[1])
        return None if name is None else ("stmt", name)
    parts = []
    for part in key:
        if isinstance(part, tuple):
            part = moved_key(part, base, by, moved)
            if part is None:
                return None
        parts.append(part)
    return tuple(parts)


@dataclass
class EmitState:
    """What every evaluation context of one kernel shares: statements, names, memo tables."""

    statements: list[Statement] = field(default_factory=list)
    keys: dict[str, tuple] = field(default_factory=dict)  # C operand -> its key
    named: dict[tuple, str] = field(default_factory=dict)  # key -> the statement's name
    # operands that are expressions over statements (a two-byte float's rounding of one)
    # -> the statements they read
    wrapped: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # reads of staged buffers as written in statements (a marker for the address) -> the
    # buffer and the index of each axis, for the kernel to render (kfuse.codegen.marching)
    accesses: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    values: dict[tuple, dict[int, str]] = field(default_factory=dict)  # per coordinates
    # an expression's structural key -> a number: keys of nodes name their children by
    # number, so hashing one costs its own fields (a chain of n sums: n, not n squared)
    structures: dict[tuple, int] = field(default_factory=dict)
    indices: dict[tuple, str] = field(default_factory=dict)
    counter: int = 0
    in_range: dict[str, tuple[int, int]] = field(default_factory=dict)  # base -> safe shifts
    texts: dict[tuple[str, str], str] = field(default_factory=dict)  # C text -> variable
    evaluated: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)  # (kernel, point)
    vector_columns: int = 0  # >1: reads of columns ix .. ix+n-1 of one row are one vector load
    # base coordinate -> a number it is always a multiple of (a register tile's origin):
    # ``(base + k) % m`` and ``(base + k) / m`` for m dividing it fold to constants and
    # shifts of ``base / m``, so points of a tile share the coarse points they resample
    multiples: dict[str, int] = field(default_factory=dict)
    # C literals emitted for constants -> their values: operations on constants only
    # (a resampled read's phase in a tile) are folded to literals, selects on them resolved
    constants: dict[str, int | float | bool] = field(default_factory=dict)
    window_sums: dict[Expr, bool] = field(default_factory=dict)  # node -> _three_term_sum
    # buffers whose element reads are left as markers (``accesses``), for the kernel to
    # render as global or shared-memory addresses (kfuse.codegen.marching)
    staged: frozenset[str] = frozenset()

    def divides_base(self, base: str, divisor: int) -> bool:
        """Whether the base coordinate ``base`` is a known multiple of ``divisor``
        (:attr:`multiples`)."""
        multiple = self.multiples.get(base, 0)
        return divisor >= 1 and multiple >= 1 and multiple % divisor == 0

    @property
    def lines(self) -> list[str]:
        """The statements as C lines, in the order they were emitted."""
        return [statement.line for statement in self.statements]

    def declare(self, ctype: str, name: str, text: str, key: tuple,
                refs: tuple[str, ...] = (), accesses: tuple[str, ...] = ()) -> str:
        """Append the statement defining ``name``; return ``name``."""
        self.statements.append(Statement(ctype, name, text, key, refs, accesses))
        self.keys[name] = key
        self.named.setdefault(key, name)
        return name

    def ref_of(self, operand: str) -> tuple:
        """How a key names a C operand: an index or a coordinate (or an expression over a
        statement) by its own key, a statement by its name, anything else (a constant, a
        parameter) by its text."""
        key = self.keys.get(operand)
        if key is None:
            return ("text", operand)
        if key[0] in ("index", "coord") or operand in self.wrapped:
            return key
        return ("stmt", operand)

    def reads_of(self, *operands: str) -> tuple[str, ...]:
        """The statements that C operands read (themselves where they are one)."""
        reads: list[str] = []
        for operand in operands:
            if operand in self.wrapped:
                reads += self.wrapped[operand]
            elif operand in self.keys:
                reads.append(operand)
        return tuple(reads)

    def wrap(self, text: str, template: str, operand: str) -> str:
        """``text`` (``template`` filled with ``operand``) as an operand with a key."""
        if text != operand:
            self.keys.setdefault(text, (template, self.ref_of(operand)))
            self.wrapped.setdefault(text, self.reads_of(operand))
        return text

    def formed(self, value: str, dtype: str) -> str:
        """An operator's result ``value`` as its unfused kernel stores it (a two-byte float's
        rounded to it), as an operand with a key."""
        return self.wrap(rounded(value, dtype), rounded("{}", dtype), value)

    def evaluations(self) -> dict[str, int]:
        """How many distinct points each operator was evaluated at, per thread iteration."""
        counts: dict[str, int] = {}
        for name, _ in self.evaluated:
            counts[name] = counts.get(name, 0) + 1
        return counts


class ExprEmitter:
    """Turns bodies into C statements for one kernel.

    ``coords[d]`` is the coordinate along iteration axis ``d`` as (C variable, shift): the
    point ``(iy, 1)`` is the row below ``iy``. Shifts let a thread computing several points
    share loads and intermediate values between them. ``flat_index`` (optional) addresses
    identity reads of buffers shaped like the domain;
    ``load_hook`` may answer a read itself (fused kernels evaluate producers there).
    ``at(coords)`` gives an emitter for another point that shares statements and names.
    """

    def __init__(self, graph: Graph, coords: tuple[Coordinate, ...], domain: tuple[str, ...],
                 flat_index: str | None = None,
                 load_hook: Callable[[Load, ExprEmitter], str | None] | None = None,
                 state: EmitState | None = None):
        self.graph = graph
        self.coords = tuple(coords)
        self.domain = domain
        self.flat_index = flat_index
        self.load_hook = load_hook
        self.state = state or EmitState()

    @property
    def lines(self) -> list[str]:
        return self.state.lines

    def at(self, coords: tuple[Coordinate, ...], flat_index: str | None = None) -> ExprEmitter:
        """An emitter at another point, sharing statements and names with this one.

        The flat index carries over to the same point; another point may bring its own.
        """
        if flat_index is None and tuple(coords) == self.coords:
            flat_index = self.flat_index
        return ExprEmitter(self.graph, coords, self.domain, flat_index, self.load_hook,
                           self.state)

    def fresh(self, prefix: str) -> str:
        self.state.counter += 1
        return f"{prefix}{self.state.counter}"

    def emit(self, body: Expr) -> str:
        """Append the statements computing ``body``; return the C variable holding it."""
        values = self.state.values.setdefault(self.coords, {})
        body = logs_in_exp(body)
        keys: dict[int, int] = {}
        names: dict[int, str] = {}
        nodes = list(body.walk())
        windows = self.state.window_sums
        for node in nodes:
            if node not in windows:
                windows[node] = _three_term_sum(node)
        # the inner sums of three-term sums are emitted by their parent (or on demand)
        inner_sums = {id(node.a) for node in nodes if windows[node]}  # type: ignore[attr-defined]

        def name_of(node: Expr) -> str:
            if id(node) not in names:  # an inner sum its parent did not emit
                key = keys[id(node)]
                if key not in values:
                    values[key] = self._emit_node(
                        node, [name_of(child) for child in node.children()])
                names[id(node)] = values[key]
            return names[id(node)]

        structures = self.state.structures
        for node in nodes:
            key = structures.setdefault(
                structural_key(node, tuple(keys[id(c)] for c in node.children())),
                len(structures))
            keys[id(node)] = key
            if key in values:
                names[id(node)] = values[key]
            elif id(node) in inner_sums:
                continue
            elif windows[node] and keys[id(node.a)] not in values:  # type: ignore[attr-defined]
                values[key] = self._emit_window_sum(node, name_of)
                names[id(node)] = values[key]
            else:
                values[key] = self._emit_node(node, [name_of(c) for c in node.children()])
                names[id(node)] = values[key]
        return name_of(body)

    def _emit_window_sum(self, node: Binary, name_of: Callable[[Expr], str]) -> str:
        """``(a + b) + c`` summed so that neighbouring points share a pair.

        A point of a 3-tap window sum ``x[i-1] + x[i] + x[i+1]`` and the point after it
        share ``x[i] + x[i+1]``: the first adds the pair on the right, the next (finding
        the pair defined) on the left, which saves a quarter of the additions of a thread's
        window sums. Floating-point sums are reassociated only here (one rounding moves).
        """
        assert isinstance(node.a, Binary)
        first, second, third = name_of(node.a.a), name_of(node.a.b), name_of(node.b)
        dtype = node.dtype
        left_pair = self.state.texts.get((dtype, f"{first} + {second}"))
        if left_pair is not None:
            return self.define_of(dtype, "{} + {}", left_pair, third)
        pair = self.define_of(dtype, "{} + {}", second, third)
        return self.define_of(dtype, "{} + {}", first, pair)

    def define(self, dtype: str, text: str, prefix: str = "v", key: tuple | None = None,
               refs: tuple[str, ...] = (), accesses: tuple[str, ...] = ()) -> str:
        """A named value for ``text`` (made as ``key`` says, from the statements ``refs``,
        reading ``accesses`` of staged buffers; no key: the text is its key); the same
        text at any point reuses the same name."""
        texts = (dtype, text)
        key = key or ("text", dtype, text)
        if texts not in self.state.texts:
            self.state.texts[texts] = self.state.declare(
                C_TYPES[dtype], self.fresh(prefix), text, key, refs, accesses)
        self.state.named.setdefault(key, self.state.texts[texts])
        return self.state.texts[texts]

    def define_of(self, dtype: str, template: str, *operands: str) -> str:
        """:meth:`define` of ``template`` filled with ``operands`` (C operands), keyed by
        the template and the operands' keys."""
        ref_of = self.state.ref_of
        return self.define(dtype, template.format(*operands),
                           key=(template, dtype, *(ref_of(o) for o in operands)),
                           refs=self.state.reads_of(*operands))

    def _emit_node(self, node: Expr, args: list[str]) -> str:
        if isinstance(node, Const):
            return self._literal(node.value, node.dtype)
        if isinstance(node, (Unary, Binary, Cast, Select)):
            folded = self._folded(node, args)
            if folded is not None:
                return folded
        if isinstance(node, Param):
            return param_var(node.name)
        if isinstance(node, Coord):
            base, shift = self.coords[node.axis]
            text = coordinate_text((base, shift))
            self.state.keys.setdefault(text, ("coord", base, shift))
            return text
        if isinstance(node, Load):
            if self.load_hook is not None:
                answered = self.load_hook(node, self)
                if answered is not None:
                    return answered
            text, key, refs, accesses = self.load_read(node, args)
            return self.define(node.dtype, text, prefix=f"ld_{node.buffer}_", key=key,
                               refs=refs, accesses=accesses)
        dtype = node.dtype
        if isinstance(node, Unary):
            if node.op == "neg":
                template = {"int32": "kf_ineg({})", "int64": "kf_lneg({})"}.get(dtype, "-{}")
                return self.define_of(dtype, _wrapped(template, dtype), *args)
            if node.op == "not":
                return self.define_of(dtype, "!{}", *args)
            return self.define_of(dtype, _wrapped(f"{function_name(node.op, dtype)}({{}})",
                                                  dtype), *args)
        if isinstance(node, Binary):
            if node.op == "div" and dtype == "float32":
                return self.define_of(dtype, "kf_divf({}, {})", *args)
            wrapping = _INT_WRAPPING.get(node.op) if dtype == "int32" else \
                _LONG_WRAPPING.get(node.op) if dtype == "int64" else None
            if wrapping:
                return self.define_of(dtype, f"{wrapping}({{}}, {{}})", *args)
            aligned = self._aligned_coordinate(node)
            if aligned is not None:
                return aligned
            if node.op == "floordiv":  # by a positive constant: one less where C's
                return self.define_of(dtype, _wrapped("{0} / {1} - ({0} % {1} < 0)", dtype),
                                      *args)  # remainder is negative
            if node.op == "mod":
                return self.define_of(dtype, _wrapped("({0} % {1} + {1}) % {1}", dtype), *args)
            if node.op in _INFIX:
                return self.define_of(dtype, _wrapped(f"{{}} {_INFIX[node.op]} {{}}", dtype),
                                      *args)
            operand = node.a.dtype
            return self.define_of(dtype, f"{function_name(node.op, operand)}({{}}, {{}})",
                                  *args)
        if isinstance(node, Select):
            return self.define_of(dtype, "{} ? {} : {}", *args)
        if isinstance(node, Cast):
            if dtype in HALF_DTYPES:  # a value of a two-byte float: rounded to it
                return self.define_of(dtype, rounded("{}", dtype), *args)
            return self.define_of(dtype, f"({C_TYPES[dtype]})({{}})", *args)
        raise TypeError(f"unknown expression node {type(node).__name__}")

    def _literal(self, value: int | float | bool, dtype: str) -> str:
        """The C literal of a constant, remembered as one (:attr:`EmitState.constants`)."""
        text = format_value(value, dtype)
        if dtype in FOLDED_DTYPES:
            self.state.constants.setdefault(text, value)
        return text

    def _folded(self, node: Unary | Binary | Cast | Select, args: list[str]) -> str | None:
        """A literal for an operation whose operands are all constants (a select on a
        constant condition: the chosen operand), else None."""
        known = self.state.constants
        if isinstance(node, Select):
            return (args[1] if known[args[0]] else args[2]) if args[0] in known else None
        if not all(arg in known for arg in args):
            return None
        value = folded_value(node, [known[arg] for arg in args])
        return None if value is None else self._literal(value, node.dtype)

    def _aligned_coordinate(self, node: Binary) -> str | None:
        """``coord % m`` or ``coord // m`` where the coordinate is ``base + shift`` and
        ``base`` a known multiple of ``m`` (:attr:`EmitState.multiples`): the constant
        ``shift % m``, or ``base / m`` shifted by ``shift // m``; else None."""
        if node.op not in ("mod", "floordiv") or not isinstance(node.a, Coord) or \
                not isinstance(node.b, Const) or node.dtype not in ("int32", "int64"):
            return None
        divisor = node.b.value
        base, shift = self.coords[node.a.axis]
        if not isinstance(divisor, int) or not self.state.divides_base(base, divisor):
            return None
        if node.op == "mod":
            return self._literal(shift % divisor, node.dtype)
        steps = shift // divisor
        return self.define(node.dtype, plus_constant(f"{base} / {divisor}", steps),
                           key=("aligned", base, divisor, steps))

    # -- reads -------------------------------------------------------------------------------
    def load_read(self, load: Load, index_values: list[str] | None = None
                  ) -> tuple[str, tuple, tuple[str, ...], tuple[str, ...]]:
        """(C expression reading ``load`` with the boundary mode applied, its key, the
        statements it reads, its reads of staged buffers); ``index_values``: the C values of
        a data-dependent read's index expressions (its children), in order."""
        buffer = self.graph.buffers[load.buffer]
        pointer = c_name(load.buffer)
        ref_of = self.state.ref_of
        if buffer.ndim == 0:
            return (element_value(f"{pointer}[0]", buffer.dtype), ("scalar", load.buffer),
                    (), ())
        identity = load.dims == tuple(range(len(self.domain))) and load.is_centered
        if identity and self.flat_index is not None:
            return (element_value(f"{pointer}[{self.flat_index}]", buffer.dtype),
                    ("flat", load.buffer, ref_of(self.flat_index)), (), ())
        vector = load.dims == tuple(range(len(self.domain))) and not load.is_remapped \
            and self.vector_column(load)
        indices, inside = [], []
        for axis, (dim, offset) in enumerate(zip(load.dims, load.offsets, strict=True)):
            if vector and axis == buffer.ndim - 1:
                break  # the column is the vector's component
            size = size_var(buffer.shape[axis])
            if load.indices is not None and load.indices[axis] is not None:
                value = (index_values or [])[sum(i is not None for i in load.indices[:axis])]
                index, flag = self.computed_index(value, offset, size, load)
            elif load.scale(axis) != (1, 1):
                index, flag = self.scaled_index(self.coords[dim], load.scale(axis), offset,
                                                size, load)
            else:
                index, flag = self.index(self.coords[dim], offset, size, load)
            indices.append(index)
            if flag:
                inside.append(flag)
        refs = self.state.reads_of(*indices)
        accesses: tuple[str, ...] = ()
        if vector:
            vector_name, component = self.vector_component(load, indices, vector[0], vector[1])
            read = f"{vector_name}.{component}"
            key: tuple = ("component", ref_of(vector_name), component)
            refs = (vector_name,)
        else:
            access = self.access(load.buffer, indices)
            read = element_value(access, buffer.dtype)
            key = ("load", load.buffer, buffer.dtype, *(ref_of(i) for i in indices))
            accesses = (access,) if access in self.state.accesses else ()
        if inside:
            if not vector and config.current().unconditional_border_loads:  # the index is clamped inside
                read = self.define(load.dtype, read, prefix=f"ld_{load.buffer}_", key=key,
                                   refs=refs, accesses=accesses)
                key, refs, accesses = ref_of(read), (read,), ()
            value = format_value(load.boundary.value, load.dtype)  # type: ignore[union-attr]
            return (f"({' && '.join(inside)}) ? {read} : {value}",
                    ("inside", key, value, *(ref_of(f) for f in inside)),
                    (*refs, *self.state.reads_of(*inside)), accesses)
        return read, key, refs, accesses

    def shifted(self, coord: Coordinate, offset: int, size: str, load: Load
                ) -> tuple[Coordinate, str | None]:
        """The coordinate ``offset`` away from ``coord`` after the read's boundary mode.

        A point the kernel knows to be inside stays a shift of the same base, so the same
        point reached along different paths is one point (evaluated once).
        """
        base, shift = coord
        low, high = self.state.in_range.get(base, (0, 0))
        if low <= shift + offset <= high:
            return (base, shift + offset), None
        index, flag = self.index(coord, offset, size, load)
        return (index, 0), flag

    def access(self, name: str, indices: list[str]) -> str:
        """The element ``indices`` of buffer ``name``, row-major (of a staged buffer: a
        marker, recorded in ``state.accesses`` for the kernel to render)."""
        if name in self.state.staged:
            access = f"{c_name(name)}[KF_AT({'|'.join([name, *indices])})]"
            self.state.accesses[access] = (name, tuple(indices))
            return access
        return f"{c_name(name)}[{row_major_address(self.graph, name, indices)}]"

    def vector_column(self, load: Load) -> tuple[str, int] | None:
        """(vector type, column) when the read is a component of an aligned vector load.

        Vector mode only (the kernel checked alignment, and that every column it reads
        within ``in_range['ix']`` is inside the array): the thread's columns
        ``ix .. ix+n-1`` are one vector, and halo columns come from the aligned vectors
        beside it.
        """
        width = self.state.vector_columns
        base, shift = self.coords[-1]
        column = shift + load.offsets[-1]
        low, high = self.state.in_range.get("ix", (0, 0))
        vector_type = VECTOR_TYPES.get((load.dtype, width))
        if width < 2 or base != "ix" or not low <= column <= high or vector_type is None:
            return None
        return vector_type, column

    def vector_component(self, load: Load, row_indices: list[str], vector_type: str,
                         column: int) -> tuple[str, str]:
        """(the aligned vector load holding column ``column`` (from ``ix``) of the read's
        row, emitted once; the component that is the column)."""
        width = self.state.vector_columns
        start = column // width * width
        access = self.access(load.buffer, [*row_indices, coordinate_text(("ix", start))])
        texts = (vector_type, access)
        if texts not in self.state.texts:
            ref_of = self.state.ref_of
            self.state.texts[texts] = self.state.declare(
                vector_type, self.fresh(f"vec_{load.buffer}_"),
                f"*reinterpret_cast<const {vector_type}*>(&{access})",
                ("vector", load.buffer, vector_type, start, *(ref_of(i) for i in row_indices)),
                self.state.reads_of(*row_indices),
                (access,) if access in self.state.accesses else ())
        return self.state.texts[texts], "xyzw"[column - start]

    def computed_index(self, value: str, offset: int, size: str, load: Load
                       ) -> tuple[str, str | None]:
        """(index variable, inside-flag variable or None) for an axis a data-dependent read
        indexes by ``value`` (an integer C value) plus ``offset``, through its mode."""
        text = plus_constant(f"(int){value}", offset)
        key = ("computed", self.state.ref_of(value), offset, size)
        return self._mapped_anywhere(text, key, "at", size, load, self.state.reads_of(value))

    def scaled_index(self, coord: Coordinate, scale: tuple[int, int], offset: int, size: str,
                     load: Load) -> tuple[str, str | None]:
        """(index variable, inside-flag variable or None) for an axis read at another
        resolution: ``floor(p * numerator / denominator) + offset`` through the read's
        boundary mode. The same coarse or fine point read from different points of a
        register tile is one index (and one load): ``(base + k) * n + offset`` is ``base * n``
        shifted, and so is ``(base + k) / d`` where ``base`` is a known multiple of ``d``."""
        numerator, denominator = scale
        base, shift = coord
        exact = numerator == 1 and self.state.divides_base(base, denominator)
        if denominator == 1:
            shift, offset = 0, shift * numerator + offset
        elif exact:
            shift, offset = 0, shift // denominator + offset
        position = coordinate_text((base, shift))
        scaled = f"{position} * {numerator}" if denominator == 1 else \
            f"{base} / {denominator}" if exact else \
            f"kf_floor_div({position}, {denominator})" if numerator == 1 else \
            f"kf_floor_div({position} * {numerator}, {denominator})"
        text = plus_constant(scaled, offset)
        step = f"x{numerator}" if denominator == 1 else f"d{denominator}" if numerator == 1 \
            else f"x{numerator}d{denominator}"
        tag = "".join([step, f"s{shift}" if shift > 0 else f"sm{-shift}" if shift else "",
                       f"p{offset}" if offset > 0 else f"m{-offset}" if offset else ""])
        key = ("scaled", base, shift, numerator, denominator, offset, size)
        return self._mapped_anywhere(text, key, f"{base}_{tag}", size, load)

    def _mapped_anywhere(self, text: str, key: tuple, name: str, size: str, load: Load,
                         refs: tuple[str, ...] = ()) -> tuple[str, str | None]:
        """(index variable, inside-flag variable or None) for the index ``text`` mapped by
        the read's mode however far outside ``[0, size)`` it lies (reads at another
        resolution or at computed indices), each declared once per ``key``."""
        mode = load.boundary.mode if load.boundary else "clamp"
        state = self.state
        key = (*key, mode)
        if key not in state.indices:
            if name == "at":  # (a computed value: a fresh name)
                name = self.fresh("at")
            function = {"clamp": "kf_clamp", "mirror": "kf_mirror_any",
                        "repeat": "kf_repeat_any", "constant": "kf_clamp"}[mode]
            state.indices[key] = state.declare("int", f"{name}_{mode}",
                                               f"{function}({text}, {size})", key, refs)
            if mode == "constant":
                state.indices[(*key, "flag")] = state.declare(
                    "bool", f"in_{name}", f"kf_inside({text}, {size})", (*key, "flag"), refs)
        return state.indices[key], state.indices.get((*key, "flag"))

    def index(self, coord: Coordinate, offset: int, size: str, load: Load
              ) -> tuple[str, str | None]:
        """(index variable, inside-flag variable or None) for one axis of a read.

        A shift the kernel knows to be inside the array needs no boundary mode; any other
        goes through the read's mode (constant mode also gets an inside flag).
        """
        base, shift = coord
        total = shift + offset
        low, high = self.state.in_range.get(base, (0, 0))
        tag = f"{'p' if total > 0 else 'm'}{abs(total)}"
        shifted = f"{base} {'+' if total > 0 else '-'} {abs(total)}"
        state = self.state
        if low <= total <= high:
            if total == 0:
                state.keys.setdefault(base, index_key(base, 0))
                return base, None
            key = (base, total, "inside")
            if key not in state.indices:
                state.indices[key] = state.declare("int", f"{base}_{tag}", shifted,
                                                   index_key(base, total))
            return state.indices[key], None
        mode = load.boundary.mode if load.boundary else "clamp"
        key = (base, total, size, mode)
        if key not in state.indices:
            function = {"clamp": "kf_clamp", "mirror": "kf_mirror", "repeat": "kf_repeat",
                        "constant": "kf_clamp"}[mode]
            state.indices[key] = state.declare("int", f"{base}_{tag}_{mode}",
                                               f"{function}({shifted}, {size})",
                                               index_key(base, total, size, mode))
        flag = None
        if mode == "constant":
            flag_key = (base, total, size, "flag")
            if flag_key not in state.indices:
                state.indices[flag_key] = state.declare(
                    "bool", f"in_{base}_{tag}", f"kf_inside({shifted}, {size})",
                    index_key(base, total, size, "flag"))
            flag = state.indices[flag_key]
        return state.indices[key], flag


def row_major_address(graph: Graph, name: str, indices: list[str]) -> str:
    """Row-major element address of ``indices`` in buffer ``name``."""
    buffer = graph.buffers[name]
    address = indices[0] if buffer.ndim == 1 else f"(kf_index_t){indices[0]}"
    for axis in range(1, buffer.ndim):
        address = f"({address}) * {size_var(buffer.shape[axis])} + {indices[axis]}"
    return address


def param_list(graph: Graph, reads: list[str], writes: list[str], symbols: list[str],
               scalars: list[str]) -> list[tuple[str, str, str, str, str]]:
    """(C name, C type, role, ref, dtype) of a kernel's arguments, in a fixed order."""
    result = []
    for name in reads:
        dtype = graph.buffers[name].dtype
        result.append((c_name(name), f"const {STORAGE_TYPES[dtype]}* __restrict__", "input", name,
                       dtype))
    for name in writes:
        dtype = graph.buffers[name].dtype
        result.append((c_name(name), f"{STORAGE_TYPES[dtype]}* __restrict__", "output", name,
                       dtype))
    for symbol in symbols:
        result.append((size_var(symbol), "const int", "size", symbol, "int32"))
    for name in scalars:
        dtype = graph.params[name]
        result.append((param_var(name), f"const {C_TYPES[dtype]}", "param", name, dtype))
    return result


def indent(lines: list[str], depth: int) -> list[str]:
    return [("  " * depth + line) if line else "" for line in lines]


def sizes_of(graph: Graph, buffers: list[str], domain: tuple[str, ...]) -> list[str]:
    """Size symbols a kernel needs: its domain's and those of the buffers it touches, each
    once (a square domain, ``("n", "n")`` or ``("7", "7")``, passes its size once)."""
    symbols = list(dict.fromkeys(domain))
    for name in buffers:
        for symbol in graph.buffers[name].shape:
            if symbol not in symbols:
                symbols.append(symbol)
    return symbols
