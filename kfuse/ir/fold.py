"""Reductions over several axes that do not merge, folded one axis at a time.

A batch norm's statistics over ``(N, HW)`` of an ``(N, C, HW)`` activation fold two axes that
are not adjacent: no merge (:mod:`kfuse.ir.collapse`) makes them one, and the kernel forms
reduce along one axis or all of them. A sum (minimum, maximum) over several axes is the
sum over one of the sums over the others, so such a reduction becomes a chain: the innermost
axis first (along the rows, where the reads are contiguous), its partial result an array of
its own, then each outer axis of that (as Inductor splits a reduction it cannot do in one
loop). Axes that merge stay together in one link (a batch norm over (N, H, W) of an NCHW
activation folds (H, W), which merge into one axis of pixels, then N). The last link keeps
the operator's name and array: readers and outputs are unchanged. Reductions whose axes
merge are left whole (the merged graph reduces one axis).
"""

from __future__ import annotations

from kfuse.ir.expr import Boundary, Load
from kfuse.ir.graph import Buffer, Graph, Kernel, Reduction


def fold_reductions(graph: Graph) -> Graph:
    """``graph`` with every reduction over several (but not all) axes that the axis merge
    leaves apart folded into a chain of one-axis reductions; ``graph`` itself where there
    is none."""
    from kfuse.ir.collapse import axis_collapse

    while True:
        collapse = axis_collapse(graph)
        apart = _unmerged(graph, collapse)
        if not apart:
            return graph
        graph = _folded(graph, apart, [] if collapse is None else collapse.merged)


def _unmerged(graph: Graph, collapse) -> set[str]:
    """The operators reducing over several axes that no merged run makes one."""
    runs = [] if collapse is None else [set(run) for run in collapse.merged]
    names = set()
    for kernel in graph.kernels:
        axes = () if kernel.reduction is None else kernel.reduction.axes
        if 1 < len(axes) < kernel.ndim and \
                {kernel.domain[axis] for axis in axes} not in runs:
            names.add(kernel.name)
    return names


def _units(kernel: Kernel, runs) -> list[tuple[int, ...]]:
    """The reduction's axes in the links they fold in, outermost first: each merged run
    inside them one link, every other axis its own."""
    axes = set(kernel.reduction.axes)  # type: ignore[union-attr]
    units = []
    for run in runs:
        found = tuple(a for a, symbol in enumerate(kernel.domain) if symbol in run)
        if len(found) == len(run) and set(found) <= axes:
            units.append(found)
            axes -= set(found)
    units += [(axis,) for axis in axes]
    return sorted(units)


def _folded(graph: Graph, names: set[str], runs) -> Graph:
    buffers = dict(graph.buffers)
    taken = set(buffers) | {kernel.name for kernel in graph.kernels}
    kernels: list[Kernel] = []
    for kernel in graph.kernels:
        if kernel.name not in names:
            kernels.append(kernel)
            continue
        reduction = kernel.reduction
        dtype = graph.buffers[kernel.output].dtype
        domain, body = kernel.domain, kernel.body
        units = _units(kernel, runs)
        while len(units) > 1:
            unit = units.pop()  # the innermost left: its partial sums an array of their own
            label = "_".join(map(str, unit))
            name = _fresh(f"{kernel.name}_{'axes' if len(unit) > 1 else 'axis'}{label}", taken)
            partial = tuple(symbol for index, symbol in enumerate(domain) if index not in unit)
            buffers[name] = Buffer(name, dtype, partial)
            kernels.append(Kernel(name, kernel.kind, domain, body, (name,),
                                  Reduction(reduction.op, unit), where=kernel.where))
            domain = partial
            body = Load(name, dtype, (0,) * len(partial), tuple(range(len(partial))),
                        Boundary("clamp"))
        kernels.append(Kernel(kernel.name, kernel.kind, domain, body, kernel.writes,
                              Reduction(reduction.op, units[0]), kernel.opaque,
                              kernel.where))
    return Graph(graph.name, buffers, tuple(kernels), graph.inputs, graph.outputs,
                 dict(graph.params)).validate()


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or with a number after it where an array or operator has it already."""
    found, number = name, 1
    while found in taken:
        number += 1
        found = f"{name}_{number}"
    taken.add(found)
    return found


__all__ = ["fold_reductions"]
