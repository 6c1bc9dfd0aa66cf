"""Reductions over several axes that do not merge, folded one axis at a time.

A batch norm's statistics over ``(N, HW)`` of an ``(N, C, HW)`` activation fold two axes that
are not adjacent: no merge (:mod:`kfuse.ir.collapse`) makes them one, and the kernel forms
reduce along one axis or all of them. A sum (minimum, maximum) over several axes is the
sum over one of the sums over the others, so such a reduction becomes a chain: the innermost
axis first (along the rows, where the reads are contiguous), its partial result an array of
its own, then each outer axis of that (as Inductor splits a reduction it cannot do in one
loop). The last link keeps the operator's name and array: readers and outputs are
unchanged. Reductions whose axes merge are left whole (the merged graph reduces one axis).
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
        apart = _unmerged(graph, axis_collapse(graph))
        if not apart:
            return graph
        graph = _folded(graph, apart)


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


def _folded(graph: Graph, names: set[str]) -> Graph:
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
        axes = sorted(reduction.axes)
        while len(axes) > 1:
            axis = axes.pop()  # the innermost left: its partial sums an array of their own
            name = _fresh(f"{kernel.name}_axis{axis}", taken)
            partial = tuple(symbol for index, symbol in enumerate(domain) if index != axis)
            buffers[name] = Buffer(name, dtype, partial)
            kernels.append(Kernel(name, kernel.kind, domain, body, (name,),
                                  Reduction(reduction.op, (axis,)), where=kernel.where))
            domain = partial
            body = Load(name, dtype, (0,) * len(partial), tuple(range(len(partial))),
                        Boundary("clamp"))
        kernels.append(Kernel(kernel.name, kernel.kind, domain, body, kernel.writes,
                              Reduction(reduction.op, tuple(axes)), kernel.opaque,
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
