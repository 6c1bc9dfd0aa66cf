"""FusionPlan: a partition of a pipeline's kernels into groups, one generated kernel each.

A plan records, for every data edge of the pipeline, whether it was fused and why not
(the legality rule that failed, or the predicted cost), so ``plan.explain()`` can answer
"why is this intermediate still in memory?" in words and numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import networkx as nx

from kfuse.analysis.operations import aligned_read
from kfuse.errors import FusionError
from kfuse.fusion.legality import (
    Violation,
    group_violations,
    online_centred_sums,
    online_rescaled_sums,
    plan_violations,
    quotient_graph,
)
from kfuse.ir.graph import Graph
from kfuse.schedule.forms import (
    Form,
    GroupSchedule,
    HorizontalSchedule,
    MapReduceVariant,
    Staged,
    Streamed,
    Tiled,
    as_form,
    default_form,
    group_outputs,
)


@dataclass(frozen=True)
class Group:
    """Kernels fused into one, in execution order, the buffers written to memory, and how
    the kernel is written: its form (:mod:`kfuse.schedule.forms`: ``single``, no fusion;
    ``registers``, every internal read at the point itself; ``recompute``, stencil reads of
    an intermediate evaluate its producer at each tap, in registers; ``staged``, such
    intermediates are computed once per block into shared memory, halo included;
    ``streamed``, a 2-D chain walked down the rows, every member a row behind its producers;
    a map-reduce variant)."""

    members: tuple[str, ...]
    outputs: tuple[str, ...]
    form: Form
    reason: str = ""

    @property
    def name(self) -> str:
        return "+".join(self.members)

    @property
    def variant(self) -> str:
        """The form's name as plans show it (``recompute``, ``mapreduce:...``)."""
        return self.form.text()

    @property
    def tile(self) -> tuple[int, ...] | None:
        """The register tile of a tiled form (None: the default, or no tile)."""
        return getattr(self.form, "tile", None)

    @property
    def schedule(self) -> GroupSchedule:
        """What code generation takes for this group."""
        return GroupSchedule(self.members, self.outputs, self.form)


@dataclass(frozen=True)
class SideBySide:
    """Groups of a plan (indices, in the order of their threads; consecutive in the plan's
    order) that run side by side in one
    kernel (:class:`~kfuse.schedule.forms.HorizontalSchedule`: threads per part, None for
    its own; blocks per multiprocessor asked of the compiler), and why."""

    parts: tuple[int, ...]
    threads: tuple[int | None, ...] = ()
    least_blocks: int = 0
    reason: str = ""


@dataclass(frozen=True)
class EdgeDecision:
    """One producer -> consumer edge: fused or not, and why."""

    producer: str
    consumer: str
    buffer: str
    fused: bool
    reason: str


@dataclass(frozen=True)
class FusionPlan:
    """Groups in execution order plus the decision on every edge."""

    graph: Graph = field(repr=False)
    groups: tuple[Group, ...]
    strategy: str
    model: str
    decisions: tuple[EdgeDecision, ...] = ()
    predicted_time_s: float | None = None
    unfused_predicted_time_s: float | None = None
    # groups run side by side in one kernel (horizontal fusion); their parts consecutive
    side_by_side: tuple[SideBySide, ...] = ()
    # pairs of groups that could run side by side and do not, and why (plan.explain())
    apart: tuple[tuple[tuple[int, ...], str], ...] = ()

    def group_of(self, kernel: str) -> Group:
        for group in self.groups:
            if kernel in group.members:
                return group
        raise KeyError(kernel)

    @property
    def kernel_groups(self) -> list[GroupSchedule | HorizontalSchedule]:
        """The kernels as code generation takes them, in order: a group (members, outputs,
        form) or groups side by side (:class:`~kfuse.schedule.forms.HorizontalSchedule`)."""
        fused = {min(fusion.parts): fusion for fusion in self.side_by_side}
        inside = {index for fusion in self.side_by_side for index in fusion.parts}
        kernels: list[GroupSchedule | HorizontalSchedule] = []
        for index, group in enumerate(self.groups):
            if index in fused:
                fusion = fused[index]
                kernels.append(HorizontalSchedule(
                    tuple(self.groups[i].schedule for i in fusion.parts), fusion.threads,
                    fusion.least_blocks))
            elif index not in inside:
                kernels.append(group.schedule)
        return kernels

    def run_side_by_side(self, *operators: str, threads: Sequence[int | None] = (),
                         least_blocks: int = 0, reason: str = "") -> FusionPlan:
        """This plan with the groups of ``operators`` (one operator of each) run side by
        side in one kernel (horizontal fusion; Li et al. 2022): ``threads`` per part (None:
        its own block's), ``least_blocks`` per multiprocessor asked of the compiler (the
        register cap). Refused with a FusionError naming why (a path between two of them,
        a buffer both write, a group already side by side)."""
        try:
            parts = tuple(self.groups.index(self.group_of(name)) for name in operators)
        except KeyError as missing:
            raise FusionError(f"run_side_by_side(): no operator {missing} in this plan") from None
        if len(set(parts)) != len(parts):
            raise FusionError("run_side_by_side(): two operators of one group; name one "
                              "operator of each group")
        taken = {index for fusion in self.side_by_side for index in fusion.parts}
        if taken & set(parts):
            raise FusionError(f"run_side_by_side(): [{' + '.join(self.groups[min(taken & set(parts))].members)}] "
                              "already runs side by side with another group")
        schedule = HorizontalSchedule(tuple(self.groups[i].schedule for i in parts),
                                      tuple(threads), least_blocks)
        why = schedule.why_not(self.graph)
        if why:
            raise FusionError(f"illegal horizontal fusion: {why}")
        fusions = [*self.side_by_side, SideBySide(parts, tuple(threads), least_blocks,
                                                  reason or "asked by hand")]
        order = _order_with_parts_together(self.graph, self.groups, [f.parts for f in fusions])
        moved = {old: new for new, old in enumerate(order)}
        fusions = [replace(f, parts=tuple(moved[i] for i in f.parts)) for f in fusions]
        apart = tuple(pair for pair in self.apart
                      if not set(pair[0]) & {i for i in parts})
        return replace(self, groups=tuple(self.groups[i] for i in order),
                       side_by_side=tuple(fusions),
                       apart=tuple((tuple(moved[i] for i in pair), why)
                                   for pair, why in apart))

    def explain(self) -> str:
        """Every group and every edge's decision, in words."""
        kernels = len(self.groups) - sum(len(f.parts) - 1 for f in self.side_by_side)
        lines = [f"plan for '{self.graph.name}' ({self.strategy} search, {self.model} model): "
                 f"{len(self.graph.kernels)} operators in {kernels} kernels"]
        if self.predicted_time_s is not None and self.unfused_predicted_time_s is not None:
            lines.append(f"  predicted {self.predicted_time_s * 1e3:.3f} ms fused vs "
                         f"{self.unfused_predicted_time_s * 1e3:.3f} ms unfused")
        for group, order in zip(self.groups, self.block_orders, strict=True):
            outputs = ", ".join(group.outputs)
            variant = group.variant + (f", {'x'.join(map(str, group.tile))} points per thread"
                                       if group.tile else "")
            if self._marches(group):
                variant += ("; on GPUs with much DRAM bandwidth per multiprocessor cycle (an "
                            "H200), at volumes that one wave of blocks covers in long chunks, "
                            "its threads march along z instead, 4x4 points a plane")
            lines.append(f"  kernel [{' + '.join(group.members)}] ({variant}) "
                         f"writes {outputs}" + (f": {group.reason}" if group.reason else ""))
            if order:
                lines.append(f"    blocks last-first: {order}")
        for fusion in self.side_by_side:
            schedule = HorizontalSchedule(tuple(self.groups[i].schedule for i in fusion.parts),
                                          fusion.threads, fusion.least_blocks)
            names = " | ".join(f"[{' + '.join(self.groups[i].members)}]" for i in fusion.parts)
            lines.append(f"  side by side {names} in one kernel ({schedule.text()}): "
                         f"{fusion.reason}")
        for pair, why in self.apart:
            names = ", ".join(f"[{' + '.join(self.groups[i].members)}]" for i in pair)
            lines.append(f"  not side by side {names}: {why}")
        for decision in self.decisions:
            mark = "fused   " if decision.fused else "not fused"
            lines.append(f"  {mark} {decision.producer} -> {decision.consumer} "
                         f"('{decision.buffer}'): {decision.reason}")
        for branches in self.independent_groups:
            names = ", ".join(f"[{' + '.join(self.groups[i].members)}]" for i in branches)
            lines.append(f"  branches {names}: no path between them; on the GPU they run on "
                         "separate streams where the wave model (kfuse.model.waves) predicts "
                         "it pays at the call's sizes: too few blocks to fill the device "
                         "(compiled.explain() gives the decision and its numbers)")
        return "\n".join(lines)

    @property
    def independent_groups(self) -> list[list[int]]:
        """Sets of groups (indices, at least two) with no path between any two of them: the
        levels of the groups' dependence graph (Qiao 2021, §4: what may run concurrently)."""
        from kfuse.analysis.order import independent_sets

        writer = {name: index for index, group in enumerate(self.groups)
                  for name in group.members}
        dependencies = {
            index: {writer[self.graph.producer[b]]
                    for member in group.members
                    for b in self.graph.kernel_by_name[member].reads
                    if self.graph.producer.get(b) in writer
                    and writer[self.graph.producer[b]] != index}
            for index, group in enumerate(self.groups)}
        return [level for level in independent_sets(dependencies, len(self.groups))
                if len(level) > 1]

    @cached_property
    def block_orders(self) -> tuple[str, ...]:
        """Per group: why its kernel visits its blocks last-first ("": first-to-last), as
        code generation decides (:mod:`kfuse.codegen.block_order`; asked once)."""
        from kfuse.schedule.lowering import lowering

        per_kernel = iter(lowering().last_first(self.graph, self.kernel_groups))
        later = {i for fusion in self.side_by_side for i in fusion.parts
                 if i != min(fusion.parts)}
        orders: list[str] = []
        for index in range(len(self.groups)):  # the parts of a kernel side by side share it
            orders.append(orders[-1] if index in later else next(per_kernel))
        return tuple(orders)

    def _marches(self, group: Group) -> bool:
        """Whether the group's threads march along z on devices where that pays (3-D
        stencil chains, :mod:`kfuse.schedule.marching`)."""
        from kfuse.schedule.marching import marches

        return marches(self.graph, group.members, group.outputs, group.form)

    def to_dict(self) -> dict:
        return {
            "pipeline": self.graph.name,
            "groups": [list(g.members) for g in self.groups],
            "variants": [g.variant for g in self.groups],
            # per group: its threads march along z on GPUs where that pays (kfuse.codegen.marching)
            "marching": [self._marches(g) for g in self.groups],
            # per group: why its blocks run last-first ("": first-to-last; block_order)
            "last_first": list(self.block_orders),
            # groups (indices) run side by side in one kernel, their threads and register cap
            "side_by_side": [{"parts": list(f.parts), "threads": list(f.threads),
                              "least_blocks": f.least_blocks, "reason": f.reason}
                             for f in self.side_by_side],
            "strategy": self.strategy,
            "model": self.model,
            "predicted_time_s": self.predicted_time_s,
            "unfused_predicted_time_s": self.unfused_predicted_time_s,
            "fused": [{"producer": d.producer, "consumer": d.consumer, "buffer": d.buffer,
                       "reason": d.reason} for d in self.decisions if d.fused],
            "rejected": [{"producer": d.producer, "consumer": d.consumer, "buffer": d.buffer,
                          "reason": d.reason} for d in self.decisions if not d.fused],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_dot(self) -> str:
        """The fused graph in Graphviz: one cluster per kernel, data edges between operators."""
        lines = [f'digraph "{self.graph.name}" {{', "  rankdir=TB; node [shape=box];"]
        for index, group in enumerate(self.groups):
            lines.append(f'  subgraph cluster_{index} {{ label="{group.variant}"; '
                         + " ".join(f'"{m}";' for m in group.members) + " }")
        for decision in self.decisions:
            style = "solid" if decision.fused else "dashed"
            lines.append(f'  "{decision.producer}" -> "{decision.consumer}" '
                         f'[label="{decision.buffer}", style={style}];')
        lines.append("}")
        return "\n".join(lines)


def _order_with_parts_together(graph: Graph, groups: Sequence[Group],
                               together: Sequence[Sequence[int]]) -> list[int]:
    """An executable order of ``groups`` (their indices) in which each set of ``together``
    (groups with no path between them) is consecutive: the order of the groups' quotient
    graph with each set one node, the original order where free."""
    node_of = list(range(len(groups)))
    for parts in together:
        for index in parts:
            node_of[index] = min(parts)
    nodes = sorted(set(node_of))
    indices = [[i for i in range(len(groups)) if node_of[i] == node] for node in nodes]
    quotient = quotient_graph(graph, [[m for i in held for m in groups[i].members]
                                      for held in indices])
    order = nx.lexicographical_topological_sort(quotient, key=lambda k: max(indices[k]))
    return [index for node in order for index in indices[node]]


def order_groups(graph: Graph, groups: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Groups in an executable order, members in program order."""
    position = {k.name: i for i, k in enumerate(graph.kernels)}
    groups = [tuple(sorted(g, key=position.__getitem__)) for g in groups]
    quotient = quotient_graph(graph, groups)
    order = nx.lexicographical_topological_sort(quotient, key=lambda i: position[groups[i][0]])
    return [groups[i] for i in order]


def check_groups(graph: Graph, groups: Sequence[Sequence[str]],
                 variants: Mapping[frozenset[str], Form | str] | None = None
                 ) -> list[Violation]:
    """All violations of a proposed partition (structural rules per group, then plan rules).

    ``variants`` (members -> implementation) where known: a row (column) reduction's
    epilogue is legal only under a whole-row stream (whole-column) variant
    (:func:`group_violations`).
    """
    found = []
    for group in groups:
        variant = (variants or {}).get(frozenset(group))
        for violation in group_violations(graph, list(group), variant):
            found.append(Violation(violation.rule, f"group {list(group)}: {violation.reason}"))
    return found + plan_violations(graph, groups)


def make_plan(graph: Graph, groups: Sequence[Sequence[str]], *, strategy: str = "manual",
              model: str = "none", reasons: dict[tuple[str, str], str] | None = None,
              predicted_time_s: float | None = None,
              unfused_predicted_time_s: float | None = None,
              where: str | None = None, check_resources: bool = True,
              variants: Mapping[frozenset[str], Form | str] | None = None,
              sizes: Mapping[str, int] | None = None) -> FusionPlan:
    """Build a plan from groups (kernels left out get their own group); refuse illegal ones.

    ``reasons`` may say why an edge was left unfused, keyed by (producer, consumer);
    ``where`` is the user's line that asked for the plan (for the error message);
    ``check_resources`` compiles fused groups with nvcc (when present) to check registers,
    spills and shared memory against the device limits; the register tile of a recompute
    group is always the largest that fits; ``variants`` (members -> form, or its name) are set
    on the groups they name and judge their legality (a row reduction's epilogue needs a
    whole-row stream variant, a column reduction's a whole-column one). ``sizes``: the
    sizes the plan is for (register tiles are checked compiled for them), None for any.
    """
    listed = {name for group in groups for name in group}
    groups = [list(g) for g in groups if g] + [[k.name] for k in graph.kernels
                                               if k.name not in listed]
    violations = check_groups(graph, groups, variants)
    if violations:
        first = violations[0]
        raise FusionError(f"illegal fusion ({first.rule}): {first.reason}", where=where)
    ordered = order_groups(graph, groups)
    reasons = reasons or {}
    chosen = {members: as_form(form) for members, form in (variants or {}).items()}
    built = [Group(members, group_outputs(graph, members),
                   chosen.get(frozenset(members)) or default_form(graph, members))
             for members in ordered]
    from kfuse.fusion.resources import fitting_tile
    for index, group in enumerate(built):
        if not group.form.grows:
            continue
        # the largest register tile that fits (ptxas figures, cached; searches that checked
        # the groups already pass check_resources=False and only get the tile)
        tile, violation = fitting_tile(graph, group.members, group.outputs, group.form,
                                       sizes)
        if violation and check_resources:
            raise FusionError(f"illegal fusion ({violation.rule}): group "
                              f"{list(group.members)}: {violation.reason}", where=where)
        if isinstance(group.form, Tiled):
            built[index] = replace(group, form=replace(group.form, tile=tile))
    decisions = []
    membership = {name: g for g in built for name in g.members}
    merged_passes: dict[int, tuple[dict, dict]] = {}  # (online sums of each segmented group)
    for source, target, data in graph.order_dag().edges(data=True):
        for buffer in data["buffers"]:
            fused = membership[source] is membership[target]
            if fused:
                group = membership[source]
                if id(group) not in merged_passes and isinstance(group.form, MapReduceVariant) \
                        and (group.form.segmented or group.form.held_columns):
                    merged_passes[id(group)] = (online_rescaled_sums(graph, group.members),
                                                online_centred_sums(graph, group.members))
                reason = _fused_reason(graph, source, target, buffer, group.form,
                                       merged_passes.get(id(group), ({}, {})))
            else:
                reason = reasons.get((source, target)) or _unfused_reason(
                    graph, membership[source].members, membership[target].members)
            decisions.append(EdgeDecision(source, target, buffer, fused, reason))
    return FusionPlan(graph, tuple(built), strategy, model, tuple(decisions), predicted_time_s,
                      unfused_predicted_time_s)


def _fused_reason(graph: Graph, source: str, target: str, buffer: str,
                  form: Form | None = None, merged: tuple[dict, dict] = ({}, {})) -> str:
    """Why the edge is fused, in words; ``merged``: the group's online rescaled and centred
    sums (:func:`online_rescaled_sums`, :func:`online_centred_sums`), for segmented forms."""
    consumer = graph.kernel_by_name[target]
    if isinstance(form, MapReduceVariant) and (form.segmented or form.held_columns) \
            and graph.kernel_by_name[source].reduction is not None:
        rescaled, centred_sums = merged
        if rescaled.get(target) == source:
            return (f"'{target}' goes in the same pass over the row's segments as "
                    f"'{buffer}', its sum rescaled as the running maximum grows (online)")
        centred = centred_sums.get(target)
        if centred is not None and centred.total == source:
            return (f"'{target}' goes in the same pass as '{buffer}': its squares about the "
                    f"first segment's mean, moved to the centre once '{buffer}' is complete "
                    "(online centring)")
        walked = "every row of the block's strip of columns" if form.held_columns \
            else "the row's segments"
        return (f"'{buffer}' is complete in the block after a pass over {walked}; the next "
                "pass reads them again (from shared memory or L2 where they still are)")
    elsewhere = [access for access in consumer.accesses if access.buffer == buffer
                 and not aligned_read(consumer, access)]
    if elsewhere:
        how = ("at computed indices" if elsewhere[0].gathered else "at another resolution"
               if elsewhere[0].scales else "through a broadcast or transposed index")
        return f"'{source}' is evaluated where '{target}' reads it ({how}), in registers"
    radius = consumer.halo_radius(buffer)
    if radius and any(radius):
        window = "x".join(str(2 * r + 1) for r in radius)
        if isinstance(form, Staged):
            return (f"'{buffer}' is staged in shared memory over the block's tile and its "
                    f"halo, computed once per point and read at the {window} window's taps")
        if isinstance(form, Streamed):
            return (f"'{buffer}' is computed once per point as the block walks down the rows: "
                    f"the {window} window's rows stay in registers, its neighbours in a row "
                    "come from shared memory")
        return (f"'{buffer}' stays in registers; '{source}' is recomputed at each of "
                f"{consumer.thread_load(buffer)} taps of the {window} window")
    return f"'{buffer}' stays in a register"


def _unfused_reason(graph: Graph, producer_group: Sequence[str],
                    consumer_group: Sequence[str]) -> str:
    merged = list(producer_group) + [m for m in consumer_group if m not in producer_group]
    violations = group_violations(graph, merged)
    if violations:
        return f"illegal: {violations[0]}"
    return "not chosen by the plan"


def unfused_plan(graph: Graph) -> FusionPlan:
    """One kernel per operator."""
    return make_plan(graph, [[k.name] for k in graph.kernels], strategy="none",
                     check_resources=False)
