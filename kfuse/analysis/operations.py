"""How much arithmetic an operator does, and where a fused group evaluates its members.

Facts of the IR that the cost models, the choice of a group's form and code generation all
read: operations per point with special functions weighted (:data:`SFU_WEIGHT`), the
logarithms that may be the hardware's (:func:`logs_in_exp`), and the points at which a
register tile evaluates each member of a group (:func:`evaluation_points`,
:func:`remote_evaluations`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import product

from kfuse.ir.expr import Binary, Const, Expr, Unary, count_operations, transform, with_children
from kfuse.ir.graph import Access, Graph, Kernel

SFU_WEIGHT = 8  # an accurate special function costs about 8 simple operations
LOG_IN_EXP = "log_in_exp"  # codegen's own unary op: a log emitted as kf_logf_in_exp


@functools.lru_cache(maxsize=4096)  # bodies hash by identity: one rewrite per body
def logs_in_exp(body: Expr) -> Expr:
    """``body`` with every float32 ``log`` whose value only feeds an ``exp`` through sums,
    differences, negations and constant factors turned into :data:`LOG_IN_EXP`.

    exp(sum c_i log x_i) turns an absolute error e_i of each log into a relative error of
    at most sum |c_i| e_i of the result, so the hardware logarithm serves there (prelude:
    kf_logf_in_exp). A log also used elsewhere stays a plain log at that other use (the op
    differs, so the two are not merged as common subexpressions).
    """
    memo: dict[int, Expr] = {}

    def linear(node: Expr) -> Expr:
        if id(node) in memo:
            return memo[id(node)]
        result = node
        if isinstance(node, Unary) and node.dtype == "float32":
            if node.op == "log":
                result = Unary(LOG_IN_EXP, node.x, node.dtype)
            elif node.op == "neg":
                result = with_children(node, (linear(node.x),))
        elif isinstance(node, Binary) and node.dtype == "float32":
            if node.op in ("add", "sub"):
                result = with_children(node, (linear(node.a), linear(node.b)))
            elif node.op == "mul" and isinstance(node.a, Const):
                result = with_children(node, (node.a, linear(node.b)))
            elif node.op in ("mul", "div") and isinstance(node.b, Const):
                result = with_children(node, (linear(node.a), node.b))
        memo[id(node)] = result
        return result

    def rewrite(node: Expr) -> Expr | None:
        if isinstance(node, Unary) and node.op == "exp" and node.dtype == "float32":
            return with_children(node, (linear(node.x),))
        return None

    return transform(body, rewrite)


def operations_per_point(kernel: Kernel) -> float:
    """Arithmetic of one evaluation of ``kernel`` as generated, special functions weighted
    (a log that only feeds an exp is the hardware logarithm: one simple operation)."""
    return 0.0 if kernel.body is None else _body_operations(kernel.body)


@functools.lru_cache(maxsize=4096)  # bodies hash by identity: counted once per body
def _body_operations(body: Expr) -> float:
    counts = count_operations(logs_in_exp(body))
    return counts["alu"] + SFU_WEIGHT * counts["sfu"]


def aligned_read(kernel: Kernel, access: Access) -> bool:
    """True for a read at the reader's own point plus constant offsets along its own axes
    (what register tiles share between points); reads at another resolution, at computed
    indices or through a broadcast index are evaluated where they land instead."""
    return not access.remapped and access.dims == tuple(range(kernel.ndim))


def evaluation_points(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                      tile: tuple[int, ...] | None = None) -> dict[str, set[tuple[int, ...]]]:
    """The points (offsets from a thread's first point) at which each member is evaluated.

    A thread computes a register tile of ``tile[d]`` consecutive points along each axis d
    (one point when left out); a member written to memory is evaluated at each of them,
    and a producer read by a consumer in the group at offsets is evaluated at every
    composed offset (each distinct point once). Members read at other points (another
    resolution, computed indices, a broadcast) are counted by :func:`remote_evaluations`.
    ``members`` are in program order (the last one is evaluated at the group's points).
    """
    group = set(members)
    ndim = graph.kernel_by_name[members[-1]].ndim
    rows = list(product(*(range(n) for n in (tile or (1,) * ndim))))
    offsets: dict[str, set[tuple[int, ...]]] = {name: set() for name in members}
    for name in members:
        if graph.kernel_by_name[name].output in outputs:
            offsets[name].update(rows)
    for name in reversed(list(members)):
        kernel = graph.kernel_by_name[name]
        for access in kernel.accesses:
            producer = graph.producer.get(access.buffer)
            if producer not in group or not aligned_read(kernel, access):
                continue
            for base in offsets[name]:
                for offset in access.offsets:
                    offsets[producer].add(tuple(b + o for b, o in zip(base, offset, strict=True)))
    return offsets


def remote_evaluations(graph: Graph, members: Sequence[str],
                       evaluated: dict[str, set[tuple[int, ...]]]) -> dict[str, int]:
    """Per member, how many times a register tile evaluates it where a consumer of the group
    reads it at other points than the tile's own (:func:`aligned_read`), given
    :func:`evaluation_points`' answer ``evaluated``: once per such read of each evaluation of
    its consumer, and so on up through what it reads (no sharing counted: an upper bound)."""
    group = set(members)
    counts = dict.fromkeys(members, 0)
    for name in reversed(list(members)):
        kernel = graph.kernel_by_name[name]
        for access in kernel.accesses:
            producer = graph.producer.get(access.buffer)
            if producer not in group:
                continue
            times = counts[name] if aligned_read(kernel, access) else \
                counts[name] + len(evaluated[name])
            counts[producer] += times * len(access.offsets)
    return counts


def tile_reach(graph: Graph, members: Sequence[str], outputs: Sequence[str],
               tile: tuple[int, ...]) -> list[tuple[int, int]]:
    """Per axis, how many points before a thread's first and after its last point (of a
    register tile ``tile``) a thread of the group ``members`` evaluates a member at or
    loads an input from (reads at other points than the kernel's own always map)."""
    points = evaluation_points(graph, members, outputs, tile)
    reached: list[set[int]] = [{p[axis] for evaluated in points.values() for p in evaluated}
                               for axis in range(len(tile))]
    for kernel in (graph.kernel_by_name[name] for name in members):
        if not points[kernel.name]:
            continue  # evaluated only where read at other points: its reads always map
        for access in kernel.accesses:
            if graph.producer.get(access.buffer) in members or access.remapped:
                continue  # intermediates are evaluated points; remapped reads always map
            for position, axis in enumerate(access.dims):
                reached[axis] |= {p[axis] + offset[position] for p in points[kernel.name]
                                  for offset in access.offsets}
    return [(max(0, -min(values)), max(0, max(values) - (tile[axis] - 1)))
            for axis, values in enumerate(reached)]
