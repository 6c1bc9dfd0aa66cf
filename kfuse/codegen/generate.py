"""Generate the CUDA C of a whole pipeline: one kernel per group of a fusion plan."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from math import prod

from kfuse import config
from kfuse.codegen import block_order, mapreduce, user
from kfuse.codegen.horizontal import horizontal_kernel
from kfuse.codegen.kernels import KernelGroup, group_kernel
from kfuse.codegen.prelude import PRELUDE
from kfuse.codegen.program import KernelSource, LaunchSpec, Program
from kfuse.codegen.specialise import specialise_kernel
from kfuse.errors import CompileError
from kfuse.fusion.mapreduce import claims
from kfuse.ir.collapse import check_compiled_axes
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import (
    GroupSchedule,
    HorizontalSchedule,
    Tiled,
    default_form,
    group_schedule,
)


def generate(graph: Graph, groups: Sequence[GroupSchedule | Sequence] | None = None,
             *, wide_index: bool = False, fixed_sizes: Mapping[str, int] | None = None,
             march: bool = False, array_alignment: int = 1) -> Program:
    """CUDA C for ``graph``; ``groups`` lists its kernels in order, each a
    :class:`~kfuse.schedule.forms.GroupSchedule` (members, written buffers, form) or a tuple
    (members, written buffers[, form or its name[, register tile]]).

    Each group is lowered by its form: map-reduce variants (and, by default, the reductions
    the general templates do not cover well) by :mod:`kfuse.codegen.mapreduce`, the staged
    form by :mod:`kfuse.codegen.staged`, the tiled forms by :mod:`kfuse.codegen.kernels`
    (and :mod:`kfuse.codegen.marching`).

    Without groups every operator gets its own kernel (the unfused program). With
    ``fixed_sizes`` (size symbol -> size) the kernels are compiled for those sizes
    (:mod:`kfuse.codegen.specialise`) and the program must only run at them. ``march``:
    3-D recompute groups have their threads march along z (for devices where that pays,
    :func:`kfuse.schedule.marching.pays_on`; the ``march`` switch of :mod:`kfuse.config`
    overrides it).
    ``array_alignment``: bytes (a power of two) every array's address is known to be a
    multiple of, so that kernels need not test their pointers before vector accesses; the
    program must only run on such arrays (1: any).
    """
    if array_alignment < 1 or array_alignment & (array_alignment - 1):
        raise CompileError(f"array_alignment must be a power of two, not {array_alignment}")
    check_compiled_axes(graph)
    for kernel in graph.kernels:
        axes = () if kernel.reduction is None else kernel.reduction.axes
        if 1 < len(axes) < kernel.ndim:
            raise CompileError(
                f"a reduction over the axes {axes} of {kernel.ndim} compiles where they merge "
                "into one (adjacent axes every operator reads at its own point, "
                "kfuse.ir.collapse), and this program is generated for the pipeline unmerged "
                "(a plan made for it, or an out= array a reshape would copy): plan it with "
                "Pipeline.plan, give C-contiguous outputs, or run it on the numpy backend",
                operator=kernel.name, where=kernel.where)
    if config.current().march is not None:
        march = config.current().march
    if groups is None:
        groups = [((k.name,), k.writes) for k in graph.topological_kernels()]
    groups = [group if isinstance(group, HorizontalSchedule) else group_schedule(group)
              for group in groups]
    fused = sum(1 for group in groups if len(group.members) > 1)
    known = [] if array_alignment == 1 else [
        f"#define KF_ARRAYS_ALIGNED {array_alignment}  // compiled for arrays aligned to "
        f"{array_alignment} bytes (runs on no others)"]
    parts = [*known, PRELUDE,
             f"// Pipeline '{graph.name}': {len(graph.kernels)} operators in {len(groups)} "
             f"kernels ({fused} fused).",
             f"typedef {'long long' if wide_index else 'int'} kf_index_t;", ""]
    launches, last_first, symbols = [], [], set()
    serpentine = block_order.Serpentine(graph)
    for group in groups:
        members, outputs = group.members, group.outputs
        if isinstance(group, HorizontalSchedule):
            kernel, launch = horizontal_kernel(
                graph, group,
                # (parts never march: a marching grid fills one wave of its own blocks)
                lambda part, threads: lower_group(graph, part, False, fixed_sizes, threads))
        else:
            kernel, launch = lower_group(graph, group, march, fixed_sizes)
        if launch.symbol in symbols:  # another group's name spells the same (a, b and a_b)
            unique = next(f"{launch.symbol}_{n}" for n in itertools.count(2)
                          if f"{launch.symbol}_{n}" not in symbols)
            kernel, launch = replace(kernel, symbol=unique), replace(launch, symbol=unique)
        symbols.add(launch.symbol)
        reason = serpentine.place(launch.symbol, members, outputs, launch.blocks_walk)
        if reason:
            kernel = block_order.reverse_blocks(kernel, reason)
        last_first.append(reason or "")
        parts.extend([*kernel.lines(), ""])
        launches.append(launch)
    return Program(graph.name, "\n".join(parts), tuple(launches), wide_index,
                   tuple(sorted(fixed_sizes.items())) if fixed_sizes is not None else None,
                   array_alignment, tuple(last_first))


def lower_group(graph: Graph, group: GroupSchedule, march: bool = False,
                fixed_sizes: Mapping[str, int] | None = None, threads: int | None = None
                ) -> tuple[KernelSource, LaunchSpec]:
    """The kernel of one group and its launch, by its form (compiled for ``fixed_sizes``
    where given), before its place in the program (block order, unique symbol).
    ``threads``: blocks of so many threads instead of the form's own, for a part of a
    horizontally fused kernel (:func:`resizes` says which groups allow it)."""
    members, outputs, form = group.members, group.outputs, group.form
    opaque = [graph.kernel_by_name[m] for m in members
              if graph.kernel_by_name[m].kind == "opaque"]
    if opaque:
        if len(members) > 1:
            raise CompileError(f"group {list(members)}: user kernel '{opaque[0].name}' "
                               "runs alone (it is not fused vertically)")
        kernel, launch = user.user_kernel(graph, opaque[0], threads)  # (resized there)
    elif claims(graph, members, form):
        kernel, launch = mapreduce.group_kernel(graph, members, outputs, form)
    else:
        kernel, launch = group_kernel(KernelGroup(graph, members, outputs), form, march)
    if threads is not None and threads != prod(launch.block):  # a generated group
        if not resizes(graph, group):
            raise CompileError(f"group {list(members)} keeps its blocks of {launch.block} "
                               "threads (a tiled form, or a user kernel declared "
                               "any_block=True, takes another number)")
        rows = launch.block[1]  # (a tiled form: its rows of threads stay)
        if threads % rows or launch.block[2] != 1:
            raise CompileError(f"group {list(members)}: {threads} threads make no rows "
                               f"of {rows} threads")
        tiled = form or default_form(graph, members)
        kernel, launch = group_kernel(KernelGroup(graph, members, outputs),
                                      replace(tiled, block=(threads // rows, rows)), march)
    if fixed_sizes is not None:
        domain = graph.kernel_by_name[members[-1]].domain
        kernel = specialise_kernel(kernel, launch, domain, fixed_sizes)
    return kernel, launch


def resizes(graph: Graph, group: GroupSchedule) -> bool:
    """Whether ``group``'s kernel may take another number of threads per block (HFuse's
    "tunable" kernels): a tiled form keeps its rows of threads and takes more or fewer
    columns of them; a user kernel, where declared ``any_block``, a 1-D block."""
    kernels = [graph.kernel_by_name[m] for m in group.members]
    if any(k.kind == "opaque" for k in kernels):
        return len(kernels) == 1 and bool(kernels[0].opaque and kernels[0].opaque.any_block)
    if claims(graph, group.members, group.form):
        return False
    form = group.form or default_form(graph, group.members)
    return isinstance(form, Tiled) and all(k.reduction is None for k in kernels)


def generation_switches() -> tuple[tuple[str, object], ...]:
    """The switches that change generated code (:mod:`kfuse.config`): part of the key a
    generated program is stored under."""
    return config.current().key()


def generate_unfused(graph: Graph, *, wide_index: bool = False) -> Program:
    """One kernel per operator, in execution order."""
    return generate(graph, None, wide_index=wide_index)
