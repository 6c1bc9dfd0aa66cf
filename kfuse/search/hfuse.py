"""Which independent kernels of a plan run side by side in one block (horizontal fusion;
Li et al. 2022, HFuse), and with how many threads each.

HFuse profiles, for a pair of kernels, every split of a 1024-thread block in steps of 128
and each with and without a register cap (``__launch_bounds__`` asking for as many blocks
per multiprocessor as the parts had alone), and keeps the fastest. Here the same candidates
are predicted by :mod:`kfuse.model.horizontal` (parts whose kernels take another block size:
tiled forms and user kernels declared ``any_block``; others keep their own), and a pair of
groups with no path between them is fused where the best candidate is predicted faster than
both one after another and two streams. ``kfuse.tune.autotune_side_by_side`` measures the
candidates instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from kfuse.cuda_limits import MAX_BLOCK_THREADS
from kfuse.errors import CompileError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.expr import ITEM_SIZE
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile, current_profile
from kfuse.model.horizontal import (
    PartShape,
    SideBySidePrediction,
    capped_registers,
    predict,
    resident_blocks,
)
from kfuse.model.roofline import arithmetic_rate, predict_group
from kfuse.schedule.forms import GroupSchedule, HorizontalSchedule
from kfuse.schedule.lowering import LaunchShape, lowering

SPLIT_STEP = 128  # HFuse's step: one warpgroup
BLOCK_THREADS = MAX_BLOCK_THREADS  # the fused block HFuse splits: the largest
TIE = 0.01  # candidates predicted this close count as equal
PARTNERS_SEARCHED = 2  # per group, the pairs its bound ranks best are searched
UNKNOWN_REGISTERS = 32  # per thread, where no compiler reports a kernel's
# the bytes a thread reads count as in flight at once up to this many (the loads of a
# register tile; a thread that loops over more waits between its iterations; stores do not
# keep a thread waiting)
MOST_BYTES_IN_FLIGHT_PER_THREAD = 256


@dataclass(frozen=True)
class Candidate:
    """One way of running parts side by side: threads per part (None: its own) and the
    blocks per multiprocessor asked of the compiler (0: none)."""

    threads: tuple[int | None, ...]
    least_blocks: int = 0


def part_shape(graph: Graph, group: GroupSchedule, sizes: Mapping[str, int],
               profile: DeviceProfile, threads: int | None = None,
               compiled: bool = True, shape: LaunchShape | None = None,
               like: PartShape | None = None) -> PartShape:
    """What the model needs of one group's kernel at ``sizes`` (in blocks of ``threads``);
    ``compiled=False``: without the compiler's figures (registers assumed); ``shape``: the
    kernel as already lowered (at ``threads``); ``like``: the same kernel compiled at its own
    block size, whose registers and static shared memory this one is taken to have (the code
    of a thread is the same; the compiler is not run again)."""
    shape = shape or lowering().launch_shape(graph, group, sizes, threads)
    figures = (lowering().figures(shape.kernel)
               if compiled and like is None and lowering().measures() else None)
    registers = figures.registers if figures else like.registers if like else \
        UNKNOWN_REGISTERS
    static_shared = figures.shared_bytes if figures else \
        like.static_shared_bytes if like else 0
    shared = shape.dynamic_shared_bytes + static_shared
    kernels = [graph.kernel_by_name[m] for m in group.members]
    threads_in_all = shape.threads * shape.blocks
    if kernels[0].kind == "opaque":
        spec = kernels[0].opaque
        accessed = (*spec.reads, *spec.writes)
        dram = sum(graph.nbytes(a.buffer, sizes) for a in accessed)
        operations = spec.operations_per_thread * threads_in_all
        if any(axis.blocks for axis in spec.grid):  # a grid-stride loop: an element at a time
            in_flight = float(sum(ITEM_SIZE[graph.buffers[a.buffer].dtype] for a in spec.reads))
        else:
            in_flight = sum(graph.nbytes(a.buffer, sizes) for a in spec.reads) / threads_in_all
    else:
        prediction = predict_group(graph, group.members, group.outputs, sizes, profile,
                                   group.form)
        dram, operations = prediction.dram_bytes, prediction.operations
        inside = set(group.members)
        read = {b for k in kernels for b in k.reads if graph.producer.get(b) not in inside}
        in_flight = sum(graph.nbytes(b, sizes) for b in read) / threads_in_all
    return PartShape("+".join(group.members), shape.blocks, shape.threads, registers, shared,
                     dram / profile.copy_bandwidth_bytes_per_s,
                     operations / arithmetic_rate(profile),
                     min(in_flight, MOST_BYTES_IN_FLIGHT_PER_THREAD),
                     static_shared_bytes=static_shared)


def candidates(graph: Graph, parts: Sequence[GroupSchedule],
               shapes: Sequence[PartShape], profile: DeviceProfile,
               caps: bool = True) -> list[Candidate]:
    """HFuse's candidates for ``parts`` (their shapes alone): the parts' own blocks, and
    for two parts where either takes another block size, every split of
    :data:`BLOCK_THREADS` in steps of :data:`SPLIT_STEP`; each without and (``caps``) with
    the register cap (as many fused blocks per multiprocessor as the parts had alone)."""
    splits: list[tuple[int | None, ...]] = [tuple(None for _ in parts)]
    if len(parts) == 2:
        own = [shape.threads for shape in shapes]
        resizable = [lowering().resizes(graph, part) for part in parts]
        for first in range(SPLIT_STEP, BLOCK_THREADS, SPLIT_STEP):
            split = (first, BLOCK_THREADS - first)
            if all(r or t == o for r, t, o in zip(resizable, split, own, strict=True)):
                splits.append(tuple(None if t == o else t
                                    for t, o in zip(split, own, strict=True)))
    found = []
    for split in dict.fromkeys(splits):
        found.append(Candidate(split))
        threads = sum(t or s.threads for t, s in zip(split, shapes, strict=True))
        alone = min(resident_blocks(s.threads, s.registers, s.shared_bytes, profile)
                    for s in shapes)
        least = max(1, min(alone, profile.max_threads_per_sm // threads))
        if caps and capped_registers(threads, least, profile) < max(s.registers for s in shapes):
            found.append(Candidate(split, least))
    return found


def resized(shape: LaunchShape, threads: int) -> LaunchShape | None:
    """``shape`` in blocks of ``threads``: as many blocks as cover its threads (None where
    its shared memory depends on the block: the kernel is lowered again there)."""
    if shape.dynamic_shared_bytes:
        return None
    return replace(shape, threads=threads,
                   blocks=max(1, -(-shape.blocks * shape.threads // threads)))


def screened(graph: Graph, parts: Sequence[GroupSchedule], sizes: Mapping[str, int],
             profile: DeviceProfile, lowered: Sequence[LaunchShape] | None = None
             ) -> SideBySidePrediction:
    """A bound for ``parts`` side by side, from the parts as written alone (nothing
    compiled): a pair that no split could make pay is not searched (planning stays fast
    where branches abound). ``lowered``: the parts already lowered at their own blocks."""
    lowered = lowered or [lowering().launch_shape(graph, part, sizes) for part in parts]
    return predict([part_shape(graph, part, sizes, profile, compiled=False, shape=shape)
                    for part, shape in zip(parts, lowered, strict=True)], profile, ideal=True)


def cannot_pay(bound: SideBySidePrediction, parts: int
               ) -> tuple[Candidate, SideBySidePrediction]:
    """The answer for parts whose :func:`screened` bound does not pay: their own blocks,
    and the bound with the reason."""
    return Candidate(tuple(None for _ in range(parts))), replace(
        bound, reason=f"cannot pay at any split: {bound.reason}")


def best_side_by_side(graph: Graph, parts: Sequence[GroupSchedule], sizes: Mapping[str, int],
                      profile: DeviceProfile | None = None,
                      lowered: Sequence[LaunchShape] | None = None,
                      bound: SideBySidePrediction | None = None
                      ) -> tuple[Candidate, SideBySidePrediction] | None:
    """The candidate predicted fastest for ``parts`` side by side, and its prediction
    (None where none can be written: a part that cannot run beside another). ``lowered``:
    the parts already lowered at their own blocks; ``bound``: their :func:`screened` bound.
    Each part is compiled once, at its own block; a split's parts at other blocks are taken
    to need the registers they need there (the compiler is run on the winner when the plan
    is checked)."""
    profile = profile or current_profile()
    try:
        lowered = lowered or [lowering().launch_shape(graph, part, sizes) for part in parts]
        bound = bound or screened(graph, parts, sizes, profile, lowered)
        if not bound.pays:
            return cannot_pay(bound, len(parts))
        alone = [part_shape(graph, part, sizes, profile, shape=shape)
                 for part, shape in zip(parts, lowered, strict=True)]
    except CompileError:
        return None
    predicted: list[tuple[Candidate, SideBySidePrediction]] = []
    # no register caps: the compiler then spills, which the model does not see (measured
    # slower on every benchmark pair: docs/journal/benchmarks.md, session 28); autotuning
    # measures them
    for candidate in candidates(graph, parts, alone, profile, caps=False):
        try:
            shapes = [shape if threads is None else
                      part_shape(graph, part, sizes, profile, threads, like=shape,
                                 shape=resized(own, threads))
                      for part, shape, own, threads in zip(parts, alone, lowered,
                                                           candidate.threads, strict=True)]
        except CompileError:
            continue
        if sum(shape.threads for shape in shapes) > BLOCK_THREADS:
            continue
        predicted.append((candidate, predict(shapes, profile, candidate.least_blocks)))
    if not predicted:
        return None
    # of the candidates within TIE of the fastest, HFuse's block: all of BLOCK_THREADS, split
    # most evenly (measured best where the model cannot tell splits apart: blur beside hash)
    fastest = min(p.fused_s for _, p in predicted)
    near = [item for item in predicted if item[1].fused_s <= fastest * (1 + TIE)]
    return min(near, key=lambda item: (sum(item[1].threads) != BLOCK_THREADS,
                                       max(item[1].threads) - min(item[1].threads)))


def side_by_side_plan(plan: FusionPlan, sizes: Mapping[str, int] | None,
                      profile: DeviceProfile | None = None) -> FusionPlan:
    """``plan`` with pairs of its groups that have no path between them run side by side
    where that is predicted to pay (the best pair first, each group in one pair at most);
    the pairs left apart are kept with the reason (``plan.explain()``)."""
    if sizes is None:
        return plan
    profile = profile or current_profile()
    levels = plan.independent_groups
    if not levels:
        return plan
    judged = []
    skipped: list[tuple[tuple[int, int], str]] = []  # pairs not searched, and why
    taken = {index for fusion in plan.side_by_side for index in fusion.parts}
    lowered: dict[int, LaunchShape | None] = {}  # each group lowered once, at its own block

    def lowered_alone(index: int) -> LaunchShape | None:
        if index not in lowered:
            try:
                lowered[index] = lowering().launch_shape(
                    plan.graph, plan.groups[index].schedule, sizes)
            except CompileError:
                lowered[index] = None
        return lowered[index]

    for level in levels:
        # every pair screened by its bound (nothing compiled); the pairs the bound ranks
        # best searched, at most PARTNERS_SEARCHED per group (a pyramid's levels make
        # hundreds of pairs, and a group runs beside one other at most)
        bounds = []
        for first, second in combinations(level, 2):
            if taken & {first, second}:
                continue
            parts = (plan.groups[first].schedule, plan.groups[second].schedule)
            shapes = (lowered_alone(first), lowered_alone(second))
            if None in shapes or HorizontalSchedule(parts).why_not(plan.graph):
                continue
            bound = screened(plan.graph, parts, sizes, profile, shapes)
            bounds.append((bound.fused_s - bound.best_apart_s, (first, second), parts,
                           shapes, bound))
        searched: dict[int, int] = {}
        for _, pair, parts, shapes, bound in sorted(bounds, key=lambda item: item[0]):
            if not bound.pays:
                judged.append((pair, *cannot_pay(bound, 2)))
                continue
            if any(searched.get(index, 0) >= PARTNERS_SEARCHED for index in pair):
                skipped.append((pair, f"not searched: a part had {PARTNERS_SEARCHED} "
                                "partners its bound ranked higher"))
                continue
            for index in pair:
                searched[index] = searched.get(index, 0) + 1
            best = best_side_by_side(plan.graph, parts, sizes, profile, shapes, bound)
            if best is not None:
                judged.append((pair, *best))
    judged.sort(key=lambda item: item[2].fused_s - item[2].best_apart_s)
    used: set[int] = set()
    fusions, apart = [], []
    for pair, candidate, prediction in judged:
        if prediction.pays and not used & set(pair):
            used.update(pair)
            fusions.append((pair, candidate, prediction))
        else:
            apart.append((pair, prediction.reason if not prediction.pays else
                          "each already runs side by side with another"))
    apart += skipped
    names = [(plan.groups[a].members[0], plan.groups[b].members[0]) for (a, b), *_ in fusions]
    apart_names = [((plan.groups[a].members[0], plan.groups[b].members[0]), why)
                   for (a, b), why in apart]
    for (first, second), (_, candidate, prediction) in zip(names, fusions, strict=True):
        plan = plan.run_side_by_side(first, second, threads=candidate.threads,
                                     least_blocks=candidate.least_blocks,
                                     reason=prediction.reason)
    index = {m: i for i, group in enumerate(plan.groups) for m in group.members}
    return replace(plan, apart=tuple(((index[a], index[b]), why)
                                     for (a, b), why in apart_names))


__all__ = ["Candidate", "best_side_by_side", "candidates", "cannot_pay", "part_shape",
           "screened", "side_by_side_plan"]
