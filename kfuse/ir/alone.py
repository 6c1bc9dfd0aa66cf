"""A group of operators alone, under canonical names: what its kernel is, whatever the
pipeline around it calls things.

A fused group's kernel depends on what its operators compute, on the arrays they touch and
on the sizes, not on the names the user gave them. Two groups that differ only in names
(the pairs of a chain of identical stencils, the same filter in two pipelines) have kernels
alike up to names, so they fit the device alike: what is measured of one (a compile) holds
for the others. :func:`group_alone` gives the group as a pipeline of its own whose names are
given in order of first appearance (arrays ``b0, b1, ...``, operators ``k0, ...``, sizes
``n0, ...``); parameters keep their relative order (``p000, ...``), as kernels list them
sorted by name.

Floating-point constants other than a few the compiler treats specially (0, 1, 2, 0.5 and
their negatives: ``x * 1`` and ``x * 2`` may become no operation or an addition) become
representative values, one per distinct constant in order of first appearance (equal
constants stay equal, so that what code generation and the compiler share between them is
shared alike): a multiplication by 0.2 or by 0.21 takes the same registers, so a chain of
stencils whose weights differ is measured once, too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kfuse.ir.expr import REAL_DTYPES, Const, Expr, Load, Param, transform
from kfuse.ir.graph import Buffer, Graph, Kernel, fixed_size

SPECIAL_CONSTANTS = frozenset({0.0, 1.0, 2.0, 0.5, -1.0, -2.0, -0.5})
FIRST_REPRESENTATIVE = 3.0  # then 4.0, 5.0, ...: exact in every float dtype, none special


@dataclass(frozen=True)
class GroupAlone:
    """A group as a pipeline of its own (:func:`group_alone`)."""

    graph: Graph
    members: tuple[str, ...]
    outputs: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...] | None  # the fixed sizes of its symbols, if any
    kernel_names: tuple[tuple[str, str], ...] = ()  # (the pipeline's name, the group's)

    def kernel_name(self, name: str) -> str:
        """The group's name for the pipeline's operator ``name``."""
        return dict(self.kernel_names).get(name, name)


def group_alone(graph: Graph, members: Sequence[str], outputs: Sequence[str],
                sizes: Mapping[str, int] | None = None) -> GroupAlone:
    """The operators ``members`` of ``graph`` writing ``outputs``, alone and under canonical
    names (``sizes``: size symbol -> size, kept for the group's symbols). Opaque operators
    keep their names (their source names what they touch)."""
    kernels = [graph.kernel_by_name[name] for name in members]
    if any(kernel.body is None for kernel in kernels):
        return GroupAlone(graph, tuple(members), tuple(outputs),
                          None if sizes is None else tuple(sorted(sizes.items())))
    buffer_names: dict[str, str] = {}
    symbol_names: dict[str, str] = {}

    def symbol(name: str) -> str:
        if fixed_size(name) is not None:
            return name
        return symbol_names.setdefault(name, f"n{len(symbol_names)}")

    def buffer(name: str) -> str:
        if name not in buffer_names:
            buffer_names[name] = f"b{len(buffer_names)}"
            for size in graph.buffers[name].shape:
                symbol(size)
        return buffer_names[name]

    for kernel in kernels:
        for size in kernel.domain:
            symbol(size)
        for name in (*kernel.reads, *kernel.writes):
            buffer(name)
    param_names = {name: f"p{rank:03d}" for rank, name in enumerate(
        sorted({p.name for kernel in kernels for p in kernel.params}))}

    constants: dict[tuple[str, float], float] = {}

    def rename(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            return replace(node, buffer=buffer_names[node.buffer], origin=None)
        if isinstance(node, Param):
            return Param(param_names[node.name], node.dtype)
        if (isinstance(node, Const) and node.dtype in REAL_DTYPES
                and node.value not in SPECIAL_CONSTANTS and node.value == node.value
                and abs(node.value) != float("inf")):
            key = (node.dtype, float(node.value))
            value = constants.setdefault(key, FIRST_REPRESENTATIVE + len(constants))
            return Const(value, node.dtype, node.weak)
        return None

    renamed_kernels = tuple(
        Kernel(f"k{index}", kernel.kind, tuple(symbol(s) for s in kernel.domain),
               transform(kernel.body, rename), tuple(buffer_names[b] for b in kernel.writes),
               kernel.reduction)
        for index, kernel in enumerate(kernels))
    buffers = {new: Buffer(new, graph.buffers[old].dtype,
                           tuple(symbol(s) for s in graph.buffers[old].shape))
               for old, new in buffer_names.items()}
    written = {name for kernel in kernels for name in kernel.writes}
    alone = Graph("group", buffers, renamed_kernels,
                  tuple(new for old, new in buffer_names.items() if old not in written),
                  tuple(buffer_names[name] for name in outputs),
                  {new: graph.params[old] for old, new in param_names.items()})
    kernel_names = {kernel.name: f"k{index}" for index, kernel in enumerate(kernels)}
    fixed = None if sizes is None else tuple(sorted(
        (new, sizes[old]) for old, new in symbol_names.items() if old in sizes))
    return GroupAlone(alone, tuple(kernel_names[name] for name in members),
                      tuple(buffer_names[name] for name in outputs), fixed,
                      tuple(kernel_names.items()))
