"""Separable stencils: a weighted sum of taps whose weights are an outer product, rewritten
as sums along one axis (the *inner* sums) weighted along the other.

A 3x3 binomial smoother ``Σ w[dy][dx] u(dy, dx)`` with ``w = a bᵀ`` is ``Σ_dx b[dx] Σ_dy a[dy]
u(dy, dx)``: the inner sum at column ``x + dx`` is the same value for every output point
whose taps reach that column, so a thread computing several adjacent columns of a row
evaluates each column's inner sum once (the emitter's common subexpressions) and spends about
six operations a point where the flat sum spends nine. The rewrite changes only how the sum
is associated (rounding, never the value of the stencil), and applies to the taps of one
array read under one boundary mode, leaving every other term of the body as it is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from kfuse.ir.expr import FLOAT_DTYPES, Binary, Const, Expr, Load, Unary, weighted_sum


@dataclass
class LinearForm:
    """A body as ``Σ weight * tap + constant + Σ weight * other``: ``taps`` keyed by the read
    (one representative :class:`Load` each), ``others`` the terms that are not plain reads."""

    taps: dict[tuple, float] = field(default_factory=lambda: defaultdict(float))
    loads: dict[tuple, Load] = field(default_factory=dict)
    constant: float = 0.0
    others: list[tuple[float, Expr]] = field(default_factory=list)


def _tap_key(load: Load) -> tuple:
    return (load.buffer, load.dtype, load.dims, load.boundary, load.offsets)


def linear_form(body: Expr) -> LinearForm:
    """``body`` split into weighted plain reads (at the point plus offsets), a constant and
    the other terms, through sums, differences, negations and products by constants."""
    form = LinearForm()
    stack: list[tuple[Expr, float]] = [(body, 1.0)]
    while stack:
        node, weight = stack.pop()
        if isinstance(node, Binary) and node.op in ("add", "sub"):
            stack += [(node.a, weight), (node.b, -weight if node.op == "sub" else weight)]
        elif isinstance(node, Binary) and node.op == "mul" and isinstance(node.b, Const):
            stack.append((node.a, weight * float(node.b.value)))
        elif isinstance(node, Binary) and node.op == "mul" and isinstance(node.a, Const):
            stack.append((node.b, weight * float(node.a.value)))
        elif isinstance(node, Unary) and node.op == "neg":
            stack.append((node.x, -weight))
        elif isinstance(node, Const):
            form.constant += weight * float(node.value)
        elif isinstance(node, Load) and not node.is_remapped and node.dims is not None:
            key = _tap_key(node)
            form.taps[key] += weight
            form.loads.setdefault(key, node)
        else:
            form.others.append((weight, node))
    return form


def outer_factors(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, float] | None:
    """``(a, b, scale)`` with ``weights == scale * outer(a, b)`` (to 1e-12 relative), the
    first non-zero entries of ``a`` and ``b`` 1 (the sums multiply only where the weights
    differ, and by the common scale once); None unless the matrix is of rank one with two
    or more non-zero rows and columns."""
    rows = np.flatnonzero(np.any(weights != 0.0, axis=1))
    cols = np.flatnonzero(np.any(weights != 0.0, axis=0))
    if len(rows) < 2 or len(cols) < 2:
        return None
    pivot_col = cols[int(np.argmax(np.abs(weights[:, cols]).max(axis=0)))]
    column = weights[:, pivot_col]
    first = int(np.flatnonzero(column)[0])
    a = column / column[first]
    b = weights[first, :]
    if not np.allclose(np.outer(a, b), weights, rtol=1e-12, atol=0.0):
        return None
    scale = float(b[cols[0]])
    return a, b / scale, scale


def separated(body: Expr, inner_axis: int = 0) -> Expr:
    """``body`` with each rank-one set of 2-D taps (one array, one boundary mode) summed along
    ``inner_axis`` first, then weighted along the other axis; ``body`` itself where no set
    of taps is separable (or the body is not a weighted sum)."""
    dtype = body.dtype  # type: ignore[attr-defined]
    if dtype not in FLOAT_DTYPES:
        return body  # (integer weights would divide)
    form = linear_form(body)
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    modes: dict[tuple, set] = defaultdict(set)  # the boundary modes of each array's taps
    for key in form.taps:
        modes[key[:3]].add(key[3])
    for key in form.taps:
        load = form.loads[key]
        if len(load.offsets) == 2 and form.taps[key] != 0.0:
            mode = key[3]
            if mode is None and len(modes[key[:3]] - {None}) == 1:
                mode = next(iter(modes[key[:3]] - {None}))  # (a tap always inside: any mode)
            groups[(*key[:3], mode)].append(key)
    rebuilt: list[tuple[float, Expr]] = []
    separable_found = False
    for keys in groups.values():
        inner_offsets = sorted({form.loads[k].offsets[inner_axis] for k in keys})
        outer_offsets = sorted({form.loads[k].offsets[1 - inner_axis] for k in keys})
        weights = np.zeros((len(inner_offsets), len(outer_offsets)))
        for key in keys:
            offsets = form.loads[key].offsets
            weights[inner_offsets.index(offsets[inner_axis]),
                    outer_offsets.index(offsets[1 - inner_axis])] = form.taps[key]
        factors = outer_factors(weights)
        if factors is None:
            rebuilt += [(form.taps[k], form.loads[k]) for k in keys]
            continue
        separable_found = True
        a, b, scale = factors
        by_offsets = {form.loads[k].offsets: form.loads[k] for k in keys}
        outer_terms = []
        for j, outer in enumerate(outer_offsets):
            if b[j] == 0.0:
                continue
            inner_terms = []
            for i, inner in enumerate(inner_offsets):
                offsets = (inner, outer) if inner_axis == 0 else (outer, inner)
                if a[i] != 0.0:
                    inner_terms.append((float(a[i]), by_offsets[offsets]))
            inner_sum = weighted_sum(inner_terms, dtype)
            if inner_sum is not None:
                outer_terms.append((float(b[j]), inner_sum))
        outer_sum = weighted_sum(outer_terms, dtype)
        if outer_sum is not None:
            rebuilt.append((scale, outer_sum))
    if not separable_found:
        return body
    rebuilt += [(form.taps[k], form.loads[k]) for k in form.taps
                if not any(k in keys for keys in groups.values()) and form.taps[k] != 0.0]
    rebuilt += form.others
    if form.constant != 0.0:
        rebuilt.append((1.0, Const(form.constant, dtype)))
    total = weighted_sum(rebuilt, dtype)
    return body if total is None else total


__all__ = ["LinearForm", "linear_form", "outer_factors", "separated"]
