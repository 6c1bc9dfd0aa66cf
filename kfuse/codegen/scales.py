"""Constant factors carried out of a fused group's intermediates, applied once at its outputs.

Image filters scale their sums: Harris's derivatives are divided by 6 and its Gaussians by
16, and a fused kernel evaluates those scales at every point of every intermediate (216 of
Harris's 1484 instructions per thread). The product of two scaled values is the product of
the unscaled ones times the product of the scales, a weighted sum of values with one scale
is the unscaled sum times that scale, and so on: this module rewrites the members' bodies to
compute the intermediates without their constant factors and gives the factor each
member's value carries, which the kernel multiplies in where it stores an output. Harris then
evaluates one multiplication per output where it evaluated 6.75 (docs/journal/benchmarks.md).

The rewrite changes rounding only, as any reassociation does: a fused result may differ from
the unfused one by a few ulp of the terms involved (more, relative to the result, where they
cancel). It keeps every intermediate within ``MAX_FACTOR`` of its true value (a larger
factor is multiplied in where it arises; a sum with an operand at its true value stays at
its true value), so an intermediate can overflow where the unfused program's would not
only within that factor of the overflow threshold. A constant-mode border of a scaled
intermediate answers the constant divided by the factor, and an intermediate whose border
constants cannot be so divided keeps its true value. Only float operators take part; anything else (exp, log, pow,
selects, comparisons of differently scaled values, casts) receives its operands with their
factors multiplied in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kfuse.ir.expr import (
    FLOAT_DTYPES,
    Binary,
    Boundary,
    Const,
    Expr,
    Load,
    Unary,
    loads,
    representable,
    with_children,
)
from kfuse.ir.graph import Graph, Kernel

MAX_FACTOR = 2.0**24  # an intermediate stays within this factor of its true value


@dataclass(frozen=True)
class Scaled:
    """A value equal to ``factor * expr``; ``expr`` None: the value is ``factor`` itself."""

    factor: float
    expr: Expr | None


def factor_out_constants(graph: Graph, members: Sequence[str]
                         ) -> tuple[Graph, dict[str, float]]:
    """``graph`` with the members' bodies computing their values without constant factors,
    and the factor of each member's output (1.0: none)."""
    chosen = set(members)
    ordered = [k for k in graph.topological_kernels() if k.name in chosen]  # producers first
    if any(k.body is None or k.reduction is not None for k in ordered):
        return graph, {k.output: 1.0 for k in ordered}  # reductions and opaque kernels: as is
    borders = _constant_borders(ordered)
    factors: dict[str, float] = {}
    kernels = dict(graph.kernel_by_name)
    for kernel in ordered:
        dtype = kernel.body.dtype  # type: ignore[union-attr]
        scaled = _Rewriter(factors).visit(kernel.body)  # type: ignore[arg-type]
        border = borders.get(kernel.output, 0.0)
        if dtype not in FLOAT_DTYPES or scaled.expr is None or \
                not _representable(border / abs(scaled.factor), dtype):
            scaled = Scaled(1.0, materialise(scaled, dtype))  # (a border constant / factor
        factors[kernel.output] = scaled.factor            # would overflow: no factor)
        kernels[kernel.name] = dataclasses.replace(kernel, body=scaled.expr)
    rewritten = dataclasses.replace(graph, kernels=tuple(kernels[k.name] for k in graph.kernels))
    return rewritten, factors


def _constant_borders(kernels: Sequence[Kernel]) -> dict[str, float]:
    """Buffer produced by one of ``kernels`` -> the largest magnitude of the constants that
    constant-mode reads of it among them answer outside the array."""
    produced = {kernel.output for kernel in kernels}
    largest: dict[str, float] = {}
    for kernel in kernels:
        for load in loads(kernel.body):  # type: ignore[arg-type]
            if load.buffer in produced and load.boundary is not None and \
                    load.boundary.mode == "constant":
                largest[load.buffer] = max(largest.get(load.buffer, 0.0),
                                           abs(load.boundary.value))
    return largest


def _representable(value: float, dtype: str) -> bool:
    """Whether a constant of magnitude ``value`` stays finite in ``dtype``."""
    return math.isfinite(value) and representable(value, dtype)


def materialise(value: Scaled, dtype: str) -> Expr:
    """The expression computing ``value`` with its factor multiplied in."""
    if value.expr is None:
        return Const(value.factor, dtype)
    if value.factor == 1.0:
        return value.expr
    return Binary("mul", Const(value.factor, dtype), value.expr, value.expr.dtype)


def _within_bounds(factor: float) -> bool:
    return factor != 0.0 and math.isfinite(factor) and \
        1.0 / MAX_FACTOR <= abs(factor) <= MAX_FACTOR


class _Rewriter:
    """Bottom-up rewrite of one body into a :class:`Scaled` (shared nodes visited once)."""

    def __init__(self, factors: dict[str, float]):
        self.factors = factors  # buffers produced earlier in the group -> their factor
        self.memo: dict[int, Scaled] = {}

    def visit(self, node: Expr) -> Scaled:
        key = id(node)
        if key not in self.memo:
            self.memo[key] = self._checked(self._rewrite(node), node.dtype)
        return self.memo[key]

    def _checked(self, value: Scaled, dtype: str) -> Scaled:
        """``value``, its factor multiplied in when out of bounds or the node is not float."""
        if value.expr is None or value.factor == 1.0:
            return value
        if dtype not in FLOAT_DTYPES or not _within_bounds(value.factor):
            return Scaled(1.0, materialise(value, dtype))
        return value

    def plain(self, node: Expr) -> Expr:
        """A child as an expression of its true value."""
        return materialise(self.visit(node), node.dtype)

    def _rewrite(self, node: Expr) -> Scaled:
        if isinstance(node, Const) and node.dtype in FLOAT_DTYPES:
            return Scaled(float(node.value), None)
        if isinstance(node, Load):  # (a data-dependent read's index at its true value)
            node = with_children(node, tuple(self.plain(child) for child in node.children()))
            factor = self.factors.get(node.buffer, 1.0)
            if factor == 1.0:
                return Scaled(1.0, node)
            boundary = node.boundary
            if boundary is not None and boundary.mode == "constant":
                boundary = Boundary("constant", boundary.value / factor)
            return Scaled(factor, dataclasses.replace(node, boundary=boundary))
        if node.dtype in FLOAT_DTYPES and isinstance(node, Binary) and \
                node.a.dtype == node.dtype and node.b.dtype == node.dtype:
            handled = self._binary(node)
            if handled is not None:
                return handled
        if node.dtype in FLOAT_DTYPES and isinstance(node, Unary) and node.x.dtype == node.dtype:
            handled = self._unary(node)
            if handled is not None:
                return handled
        children = tuple(self.plain(child) for child in node.children())
        return Scaled(1.0, with_children(node, children))

    def _unary(self, node: Unary) -> Scaled | None:
        x = self.visit(node.x)
        if node.op == "neg":
            return Scaled(-x.factor, x.expr)
        if x.expr is None:
            return None
        if node.op == "abs":
            return Scaled(abs(x.factor), Unary("abs", x.expr, node.dtype))
        if node.op == "sqrt" and x.factor > 0.0:
            return Scaled(math.sqrt(x.factor), Unary("sqrt", x.expr, node.dtype))
        return None

    def _binary(self, node: Binary) -> Scaled | None:
        a, b = self.visit(node.a), self.visit(node.b)
        dtype = node.dtype
        if node.op in ("mul", "div") and a.expr is not None and b.expr is not None:
            # the unscaled product must itself stay within bounds: past them, b's factor is
            # multiplied in first (a's factor is within them)
            factor = a.factor * b.factor if node.op == "mul" else a.factor / b.factor
            if not _within_bounds(factor):
                b, factor = Scaled(1.0, materialise(b, dtype)), a.factor
            return Scaled(factor, Binary(node.op, a.expr, b.expr, dtype))
        if node.op == "mul":
            return Scaled(a.factor * b.factor, a.expr if b.expr is None else b.expr)
        if node.op == "div":
            if b.expr is None and b.factor != 0.0:
                return Scaled(a.factor / b.factor, a.expr)
            return None
        if node.op in ("add", "sub"):
            if a.expr is None and b.expr is None:
                return None  # two constants: kept as written
            if a.expr is None or b.expr is None:
                scaled, constant = (b, a.factor) if a.expr is None else (a, b.factor)
                if not _representable(constant / scaled.factor, dtype):
                    return None
                shifted = Const(constant / scaled.factor, dtype)
                operands = (shifted, scaled.expr) if a.expr is None else (scaled.expr, shifted)
                return Scaled(scaled.factor, Binary(node.op, *operands, dtype))
            if a.factor == b.factor:
                return Scaled(a.factor, Binary(node.op, a.expr, b.expr, dtype))
            if a.factor == -b.factor:  # a A + (-a) B = a (A - B)
                flipped = "sub" if node.op == "add" else "add"
                return Scaled(a.factor, Binary(flipped, a.expr, b.expr, dtype))
            # one fused multiply-add; an operand holding its true value (factor 1) keeps the
            # sum at its true value too
            if b.factor != 1.0:
                ratio = Const(b.factor / a.factor, dtype)
                return Scaled(a.factor, Binary(node.op, a.expr,
                                               Binary("mul", ratio, b.expr, dtype), dtype))
            ratio = Const(a.factor / b.factor, dtype)
            return Scaled(b.factor, Binary(node.op, Binary("mul", ratio, a.expr, dtype),
                                           b.expr, dtype))
        if node.op in ("min", "max") and a.expr is not None and b.expr is not None and \
                a.factor == b.factor and a.factor > 0.0:
            return Scaled(a.factor, Binary(node.op, a.expr, b.expr, dtype))
        return None
