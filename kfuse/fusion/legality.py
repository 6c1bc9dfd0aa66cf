"""Legality of fusing a set of kernels into one: one function per rule, each giving a reason.

A rule returns ``None`` when the group satisfies it and a sentence saying why not
otherwise. Rules come from Wahib & Maruyama 2014 (constraints 1.3, 1.5-1.7: convexity, kinship,
on-chip memory, registers), Qiao 2021 (dependency, header and granularity rules; no
global barrier inside a kernel) and Filipovič et al. 2015 (map/reduce fusibility F1-F3: sibling
reductions in map/reduce groups, equal nesting depth). Plan-level rules look at all groups
together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from kfuse.analysis.operations import evaluation_points, remote_evaluations
from kfuse.analysis.order import Reachability
from kfuse.cuda_limits import MAX_REGISTERS_PER_THREAD
from kfuse.errors import FusionError
from kfuse.ir.expr import Binary, Coord, Expr, Load, Unary, loads, transform
from kfuse.ir.fingerprint import canonical
from kfuse.ir.graph import Access, Graph
from kfuse.schedule.forms import (
    Form,
    MapReduceVariant,
    as_form,
    evaluated_where_read,
    group_outputs,
    is_variant_text,
)

# Hopper limits (an H100/H200 block): used when no device profile says otherwise.
MAX_SHARED_BYTES_PER_BLOCK = 227 * 1024


@dataclass(frozen=True)
class Violation:
    """A failed rule: its name and the reason in words."""

    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


def reachability(graph: Graph) -> Reachability:
    """Who is above and below whom among ``graph``'s kernels (bit ``i``: kernel ``i``),
    worked out once per graph."""
    return graph.remembered(("reachability",), lambda: Reachability(
        graph.order_dag(), [kernel.name for kernel in graph.kernels]))


def rule_convex(graph: Graph, members: Sequence[str]) -> str | None:
    """No path leaves the group and comes back (Wahib & Maruyama 2014 constraint 1.3)."""
    between = reachability(graph).first_between(members)
    if between is not None:
        return (f"not convex: '{between}' depends on the group and the group depends on it; "
                f"fusing would need '{between}' inside the kernel too")
    return None


def rule_connected(graph: Graph, members: Sequence[str]) -> str | None:
    """Members are linked by data they share (Wahib & Maruyama 2014 constraint 1.5, degree of kinship > 0)."""
    if len(members) < 2:
        return None
    sharing = nx.Graph()
    sharing.add_nodes_from(members)
    for index, first in enumerate(members):
        a = graph.kernel_by_name[first]
        for second in members[index + 1:]:
            b = graph.kernel_by_name[second]
            if set(a.reads + a.writes) & set(b.reads + b.writes):
                sharing.add_edge(first, second)
    if not nx.is_connected(sharing):
        parts = [sorted(c) for c in nx.connected_components(sharing)]
        return f"kernels {parts[0]} and {parts[1]} share no data (degree of kinship 0)"
    return None


def rule_no_reduction_consumed_inside(graph: Graph, members: Sequence[str]) -> str | None:
    """A reduction's result needs every block done (a global barrier): never read in its kernel.

    The one exception (:func:`epilogue_violations`) needs the implementation to be known:
    a row reduction computed by a stream variant whose warps own whole rows (a column
    reduction by a variant whose blocks walk whole columns) may feed an elementwise epilogue
    reading it at the same row (column), and a row reduction whose block holds each whole
    row (held rows) may feed members over the same row of the matrix. Without a variant the
    rule holds.
    """
    group = set(members)
    for name in members:
        kernel = graph.kernel_by_name[name]
        if kernel.reduction is None:
            continue
        readers = [c for c in graph.consumers.get(kernel.output, ()) if c in group]
        if readers:
            text = (f"'{readers[0]}' reads the reduction '{name}' in the same kernel; a "
                    "reduction is complete only after every block finished (a global barrier)")
            kind = epilogue_kind(graph, members)
            if kind and epilogue_violations(graph, members, None) == []:
                text += f"; {EPILOGUE_OWNERS[kind]}: it may feed its epilogue in one kernel"
            return text
    return None


def _kernel_domains(graph: Graph, members: Sequence[str], remote: Sequence[str]
                    ) -> set[tuple[str, ...]]:
    """Iteration spaces of the members a kernel evaluates at its own points."""
    return {graph.kernel_by_name[n].domain for n in members if n not in remote}


def rule_same_iteration_space(graph: Graph, members: Sequence[str]) -> str | None:
    """Members evaluated at the kernel's points share one iteration space (Qiao 2021 header
    compatibility, Eq. 3.3); a member read only at other points (another resolution,
    computed indices, a broadcast) is evaluated where read and may have its own
    (:func:`~kfuse.schedule.forms.evaluated_where_read`)."""
    domains = _kernel_domains(graph, members, evaluated_where_read(graph, members))
    if len(domains) > 1:
        shapes = " vs ".join(str(d) for d in domains)
        return (f"iteration spaces differ ({shapes}) between operators written to memory or "
                "read at their consumers' points")
    return None


# Evaluations where read are code: each is written out for every point of a thread's tile
# and none is shared, so a chain of them grows as the product of its taps (a collapse's
# levels fused: nine interpolation taps a level, sixteen a downsample). Beyond this many per
# point a group is refused: the local Laplacian filter's levels fused three deep made a
# kernel of 110,000 lines of C that nvcc took minutes to compile.
MAX_EVALUATIONS_WHERE_READ = 32


def rule_evaluations_where_read_bounded(graph: Graph, members: Sequence[str]) -> str | None:
    """Members evaluated where read (:func:`~kfuse.schedule.forms.evaluated_where_read`) are
    evaluated at most :data:`MAX_EVALUATIONS_WHERE_READ` times per point of the kernel."""
    remote = evaluated_where_read(graph, members)
    if not remote or len(_kernel_domains(graph, members, remote)) > 1:
        return None  # (grids that differ are rule_same_iteration_space's to name)
    ordered = graph.in_program_order(members)
    points = evaluation_points(graph, ordered, group_outputs(graph, ordered))
    counts = remote_evaluations(graph, ordered, points)
    total = sum(counts.values())
    if total > MAX_EVALUATIONS_WHERE_READ:
        most = max(remote, key=counts.__getitem__)
        return (f"its kernel would evaluate operators where read {total} times per point "
                f"('{most}' {counts[most]} times; at most {MAX_EVALUATIONS_WHERE_READ}): "
                "chained reads at other points multiply their taps")
    return None


def rule_no_opaque(graph: Graph, members: Sequence[str]) -> str | None:
    """Opaque user kernels keep their own launch and are not fused vertically."""
    opaque = [n for n in members if graph.kernel_by_name[n].kind == "opaque"]
    if opaque and len(members) > 1:
        return (f"'{opaque[0]}' is a user CUDA kernel, which runs alone: what it computes "
                "between its declared reads and writes is not known to kfuse")
    return None


# ---------------------------------------------------------------------------------------------
# Map / reduce / nested map-reduce groups (Filipovič et al. 2015: BLAS-1/2 fusion)
# ---------------------------------------------------------------------------------------------

MAPREDUCE_MAX_DEPTH = 2  # Filipovič et al. 2015 §2.1: nesting depth at most 2 (vectors and matrices)
MAPREDUCE_REDUCTION_DTYPES = ("float32", "float64", "int32")  # combined with atomics


def mapreduce_shape_reason(graph: Graph, members: Sequence[str]) -> str | None:
    """Why ``members`` is not a (nested) map/reduce group; ``None`` if it is one.

    A map/reduce group (Filipovič et al. 2015 §2.1) iterates over a vector (depth 1) or a matrix
    (depth 2), every member is a map or a reduction (over one axis, or all), and every
    read is at the point itself, possibly broadcast (a vector along the rows or the columns
    of a matrix, a 0-d scalar): then all members share one thread-to-data and one
    block-to-data mapping (F1), and sibling reductions can share one kernel.
    """
    kernels = [graph.kernel_by_name[name] for name in members]
    domains = {kernel.domain for kernel in kernels}
    if len(domains) > 1:
        return "iteration spaces differ"
    depth = len(kernels[0].domain)
    if not 1 <= depth <= MAPREDUCE_MAX_DEPTH:
        return (f"a {depth}-D iteration space: map/reduce nesting is at most "
                f"{MAPREDUCE_MAX_DEPTH} deep (vectors and matrices)")
    for kernel in kernels:
        if kernel.body is None or kernel.kind == "opaque":
            return f"'{kernel.name}' is an opaque user kernel, not a map or a reduce"
        for access in kernel.accesses:
            if not access.is_point:
                return (f"'{kernel.name}' reads '{access.buffer}' at offsets (a stencil), "
                        "not at its own point")
        if kernel.reduction is not None:
            dtype = graph.buffers[kernel.output].dtype
            if dtype not in MAPREDUCE_REDUCTION_DTYPES:
                return (f"'{kernel.name}' reduces {dtype} values; partial results are "
                        f"combined with atomics on {', '.join(MAPREDUCE_REDUCTION_DTYPES)}")
    return None


def gathers_inputs(graph: Graph, name: str) -> bool:
    """Whether ``name`` is a map of vectors or matrices whose reads are all at its own point
    but for reads of pipeline inputs at computed indices along some axes (gathers, read
    from memory where they are: a cross-entropy's ``x[row, label[row]]``)."""
    kernel = graph.kernel_by_name[name]
    if kernel.reduction is not None or kernel.body is None or kernel.kind == "opaque" \
            or not 1 <= len(kernel.domain) <= MAPREDUCE_MAX_DEPTH:
        return False
    return all(access.is_point or _input_gather(graph, access) for access in kernel.accesses)


def _input_gather(graph: Graph, access: Access) -> bool:
    """A read of a pipeline input at computed indices, its other axes at the point."""
    return bool(access.gathered) and access.scales is None \
        and access.buffer in graph.inputs and all(not any(o) for o in access.offsets)


def rule_reductions_fusible(graph: Graph, members: Sequence[str]) -> str | None:
    """Sibling reductions share a kernel only in a map/reduce group (Filipovič et al. 2015 §3.1).

    Reductions sharing inputs (BiCGK's ``A p`` and ``Aᵀ r``) fuse when every member is a
    map or a reduction read at its own point; each block combines its partial results into
    the outputs with atomics.
    """
    reductions = [n for n in members if graph.kernel_by_name[n].reduction is not None]
    if len(reductions) < 2:
        return None
    reason = mapreduce_shape_reason(graph, members)
    if reason:
        return f"reductions {reductions} share one kernel only in a map/reduce group: {reason}"
    return None


def rule_same_nesting_depth(graph: Graph, members: Sequence[str]) -> str | None:
    """No operator is fused into a consumer of more axes (Filipovič et al. 2015 F3).

    Fusing a vector operator into a matrix one would repeat it for every row or column
    and save no memory traffic; a consumer of fewer axes (a plane chosen by a computed
    index, a reduction of it) evaluates its producer no more often than it has points.
    Operators evaluated at the kernel's points share its space, hence its depth.
    """
    group = set(members)
    for name in members:
        kernel = graph.kernel_by_name[name]
        for buffer in kernel.reads:
            producer = graph.producer.get(buffer)
            if producer in group and graph.kernel_by_name[producer].ndim < kernel.ndim:
                return (f"iteration spaces differ in nesting depth ('{producer}' has "
                        f"{graph.kernel_by_name[producer].ndim} axes, '{name}' {kernel.ndim}): "
                        "the shallower operator would be repeated and save no traffic")
    return None


# ---------------------------------------------------------------------------------------------
# Reduction epilogues: the one exception to F2 (needs the implementation to be known)
# ---------------------------------------------------------------------------------------------

# What an epilogue reads, by the kind of reduction: the variants that own such a result whole
EPILOGUE_OWNERS = {
    "row": ("only a stream variant whose warps own whole rows (no ':c' column span) has a "
            "row's reduction complete inside one warp"),
    "col": ("only a whole-column variant (':wc': one block walks every row of its columns) "
            "has a column's reduction complete inside one block"),
    "held": ("only a held-row variant (':hr': the block holds each whole row in registers) "
             "has a row's reduction complete while the row is still on chip"),
    "held_col": ("only a held-column variant (':hc': one block walks every row of its strip "
                 "of columns, a pass per phase) has a column's reduction complete in the "
                 "block"),
}
# the axis a held group's reductions fold, and the one its members read their results along
HELD_AXES = {"held": ((1,), (0,)), "held_col": ((0,), (1,))}


def split_epilogue(graph: Graph, members: Sequence[str]
                   ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(core, epilogue) of a group: the epilogue is every member that depends, through the
    group, on a reduction of the group; the core is the rest (members in the given order).
    An empty epilogue means no reduction is consumed inside the group."""
    group = set(members)
    dependent: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in members:
            if name in dependent:
                continue
            kernel = graph.kernel_by_name[name]
            for buffer in kernel.reads:
                producer = graph.producer.get(buffer)
                if producer in group and (producer in dependent or
                                          graph.kernel_by_name[producer].reduction is not None):
                    dependent.add(name)
                    changed = True
                    break
    return (tuple(n for n in members if n not in dependent),
            tuple(n for n in members if n in dependent))


def is_epilogue_group(graph: Graph, members: Sequence[str]) -> bool:
    """True when some member consumes a reduction of the group (the epilogue is not empty)."""
    return len(members) > 1 and bool(split_epilogue(graph, members)[1])


def epilogue_kind(graph: Graph, members: Sequence[str]) -> str | None:
    """``"row"`` when the group's epilogue is a map over the reduced vector reading only row
    reductions of its core (``alpha A x + beta y``), ``"col"`` when only column reductions
    (``beta Aᵀ y + z``); ``"held"`` when it iterates over the core's matrix again and reads
    only row reductions (ATAX's ``Aᵀ (A x)``: a second phase over each row), ``"held_col"``
    when it does so reading only column reductions (a column standardisation), in both
    cases possibly with a *tail* of maps over the reduced vector after the phases (a row's
    log-sum-exp after its maximum and its sum of exponentials: :func:`split_tail`); ``None``
    otherwise (no epilogue, or other reads: :func:`epilogue_violations` says what is
    wrong)."""
    core, epilogue = split_epilogue(graph, members)
    if not core or not epilogue:
        return None
    kinds = set()
    for name in epilogue:
        for buffer in graph.kernel_by_name[name].reads:
            producer = graph.producer.get(buffer)
            reduction = graph.kernel_by_name[producer].reduction if producer in core else None
            if reduction is not None:
                kinds.add({(1,): "row", (0,): "col"}.get(reduction.axes, "all"))
    if len(kinds) != 1 or not kinds <= {"row", "col"}:
        return None
    domain = graph.kernel_by_name[core[0]].domain
    over_matrix = [graph.kernel_by_name[name].domain == domain and len(domain) == 2
                   for name in epilogue]
    kind = kinds.pop()
    if not any(over_matrix):
        return kind
    reduced = domain[:1] if kind == "row" else domain[1:]
    if all(over or graph.kernel_by_name[name].domain == reduced
           for name, over in zip(epilogue, over_matrix, strict=True)):
        return "held" if kind == "row" else "held_col"
    return None


def split_tail(graph: Graph, members: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fed, tail) of a group's epilogue: the members that iterate over the core's matrix
    again (a held group's later phases) and the maps over the reduced vector (a row or
    column epilogue; in a held group, evaluated once per row or column after its last
    phase, from the results still in registers)."""
    core, epilogue = split_epilogue(graph, members)
    if not core:
        return (), tuple(epilogue)
    domain = graph.kernel_by_name[core[0]].domain
    fed = tuple(n for n in epilogue if graph.kernel_by_name[n].domain == domain)
    return fed, tuple(n for n in epilogue if n not in fed)


def epilogue_variant_reason(variant: object, kind: str = "row") -> str | None:
    """Why ``variant`` cannot compute a ``kind`` (``"row"``, ``"col"``, ``"held"``) reduction
    and its epilogue in one kernel (``None``: it can: a stream variant without a column span
    has whole rows in one warp or block, a whole-column variant whole columns in one block,
    a held-row variant whole rows still in registers)."""
    need = EPILOGUE_OWNERS[kind]
    wanted = {"row": "stream", "col": "whole-column", "held": "held-row",
              "held_col": "held-column"}[kind]
    if isinstance(variant, MapReduceVariant):
        parsed = variant
    elif isinstance(variant, Form) or not is_variant_text(variant):
        name = variant.text() if isinstance(variant, Form) else variant
        return f"the implementation {name!r} is not a map-reduce {wanted} variant; {need}"
    else:
        try:
            parsed = MapReduceVariant.parse(str(variant))
        except FusionError as error:
            return str(error)
    if kind == "col":
        if parsed.whole_columns:
            return None
        return (f"variant {variant} combines column results of several blocks with atomics "
                f"(a global barrier before the epilogue); {need}")
    if kind == "held_col":
        if parsed.held_columns:
            return None
        return (f"variant {variant} does not walk every row of its columns; {need}")
    if kind == "held":
        if parsed.held_rows:
            return None
        return (f"variant {variant} lets go of each part of a row before the row's "
                f"reductions are complete; {need}")
    if parsed.whole_rows:
        return None
    if parsed.rowsum != "stream":
        return (f"variant {variant} combines row results of several blocks with atomics "
                f"(a global barrier before the epilogue); {need}")
    return (f"variant {variant} splits rows into column spans of {parsed.span} combined "
            f"with atomics (a global barrier before the epilogue); {need}")


def epilogue_violations(graph: Graph, members: Sequence[str],
                        variant: object) -> list[Violation]:
    """Rules for a map/reduce group plus an elementwise *epilogue* consuming its reductions.

    The exception to F2: when one warp (or block) owns whole rows (a stream variant without
    column spans), each row's reduction is complete there, and it can go on to evaluate a
    map over the reduced vector at the same row; likewise a block that walks every row of
    its columns (a whole-column variant) owns whole column reductions. Allowed only when the
    core (members not depending on a reduction) is a matrix map/reduce group (without column
    reductions for a row epilogue), and every epilogue member is a map over the reduced
    vector that reads the group's reductions, all of one kind, only at its own row (column):
    a point access, no offsets, no other index. Members that iterate over the matrix again
    and read row reductions at their row (held rows) are checked by
    :func:`_held_row_violations`. ``variant`` ``None`` checks the structure only. ``[]``
    when legal.
    """
    rule = "reduction_epilogue"
    core, epilogue = split_epilogue(graph, members)
    if not epilogue:
        return [Violation(rule, "no member consumes a reduction of the group (not an epilogue)")]
    if not core:
        return [Violation(rule, "every member depends on a reduction of the group")]
    kernels = {name: graph.kernel_by_name[name] for name in members}
    found = []
    for check in (rule_no_opaque, rule_convex, rule_connected):
        reason = check(graph, members)
        if reason:
            found.append(Violation(check.__name__.removeprefix("rule_"), reason))
    shape = mapreduce_shape_reason(graph, core)
    domain = kernels[core[0]].domain
    if shape is None and len(domain) != 2:
        shape = ("it is not a matrix group (an epilogue follows reductions along matrix rows "
                 "or columns)")
    if shape is not None:
        found.append(Violation(rule, f"the epilogue's producers {list(core)} are not one "
                                     f"matrix map/reduce group: {shape}"))
        return found
    kind = epilogue_kind(graph, members)
    if kind in HELD_AXES:
        fed, tail = split_tail(graph, members)
        found += _held_violations(graph, core, fed, kind)
        if tail:
            found += _reduced_vector_violations(graph, (*core, *fed), tail,
                                                "row" if kind == "held" else "col", held=True)
    else:
        found += _reduced_vector_violations(graph, core, epilogue, kind)
    if len(core) > 1:
        found += group_violations(graph, core)
    if variant is not None and not found and kind is not None:
        reason = epilogue_variant_reason(variant, kind)
        if reason:
            what = "column" if kind in ("col", "held_col") else "row"
            found.append(Violation(rule, f"a {what} reduction feeds {list(epilogue)} in its "
                                         f"own kernel: {reason}"))
        elif kind == "held" and _segmented(variant):  # (held columns: always segmented)
            reason = segment_reason(graph, members)
            if reason:
                found.append(Violation(rule, f"variant {variant}: {reason}"))
    return found


def segment_reason(graph: Graph, members: Sequence[str]) -> str | None:
    """Why a held-row group cannot hold its rows in segments (``None``: it can)."""
    columns = [name for name in members if graph.kernel_by_name[name].reduction is not None
               and graph.kernel_by_name[name].reduction.axes == (0,)]
    if columns:
        return (f"rows held in segments cannot keep the column reductions {columns} (a "
                "thread's columns change with the segment)")
    return None


def _segmented(variant: object) -> bool:
    """Whether ``variant`` (a held-row variant or its text) holds rows in segments."""
    if isinstance(variant, MapReduceVariant):
        return variant.segmented
    return MapReduceVariant.parse(str(variant)).segmented


def _reduced_vector_violations(graph: Graph, core: Sequence[str], epilogue: Sequence[str],
                               kind: str | None, held: bool = False) -> list[Violation]:
    """Rules for an epilogue over the reduced vector (``kind`` ``"row"`` or ``"col"``): maps
    over the core's rows (columns) reading its reductions of that kind at their own row
    (column) only; a row epilogue beside column reductions is refused, except after held
    rows (``held``: the tail of a held group, whose blocks own whole rows and fold column
    reductions over them apart)."""
    rule = "reduction_epilogue"
    kernels = {name: graph.kernel_by_name[name] for name in (*core, *epilogue)}
    domain = kernels[core[0]].domain
    found = []
    axis = {"row": 0, "col": 1}.get(kind or "row", 0)  # the reduced vector's matrix axis
    what = "row" if axis == 0 else "column"
    columns = [n for n in core if kernels[n].reduction is not None
               and kernels[n].reduction.axes != (1,)  # type: ignore[union-attr]
               and len(kernels[n].reduction.axes) == 1]  # type: ignore[union-attr]
    if columns and kind == "row" and not held:
        found.append(Violation(rule, f"the group reduces along columns ({columns}): no warp "
                                     "walks whole rows, so no epilogue can follow in the "
                                     "same kernel"))
    read_kinds = set()
    for name in epilogue:
        kernel = kernels[name]
        if kernel.reduction is not None or kernel.body is None:
            found.append(Violation(rule, f"'{name}' consumes a reduction of the group but is "
                                         "not an elementwise map (an epilogue is a map)"))
            continue
        for access in kernel.accesses:
            producer = graph.producer.get(access.buffer)
            if producer not in kernels:
                if not access.is_point and not _input_gather(graph, access):
                    found.append(Violation(rule, f"epilogue '{name}' reads '{access.buffer}' "
                                                 "at offsets, not at its own point"))
                continue  # (an input read at computed indices: from memory, where it is)
            source = kernels[producer]
            reduction = source.reduction
            if producer in core and reduction is None:
                found.append(Violation(rule, f"epilogue '{name}' reads the matrix map "
                                             f"'{producer}', not a {what} result"))
            elif reduction is not None and len(reduction.axes) == len(source.domain):
                found.append(Violation(rule, f"'{name}' reads '{producer}', a full reduction: "
                                             "it is complete only after every block finished "
                                             "(a global barrier), never in its own kernel"))
            elif reduction is not None:
                read_kinds.add("row" if reduction.axes == (1,) else "column")
                if access.dims != (0,) or not access.is_point:
                    found.append(Violation(rule, f"epilogue '{name}' reads '{access.buffer}' "
                                                 f"at another {what} (an offset or another "
                                                 f"index): a {'warp' if axis == 0 else 'block'}"
                                                 f" holds only its own {what}s' results"))
        if kernel.domain != domain[axis:axis + 1]:
            found.append(Violation(rule, f"epilogue '{name}' iterates over {kernel.domain}, "
                                         f"not over the reduced vector's {what}s "
                                         f"{domain[axis:axis + 1]}"))
    if len(read_kinds) > 1:
        found.append(Violation(rule, f"the epilogue {list(epilogue)} reads both row and "
                                     "column reductions: no block owns whole rows and whole "
                                     "columns at once"))
    return found


def _held_violations(graph: Graph, core: Sequence[str], fed: Sequence[str], kind: str
                     ) -> list[Violation]:
    """Rules for a *held-row* group (``kind`` ``"held"``): its ``fed`` members iterate over
    the core's matrix again and read row reductions of the group at their own row (ATAX's
    ``Aᵀ (A x)``, a normalisation's ``x / sum(x)``). A block that holds each whole row in
    registers completes the row's reductions, then goes on over the same row in phases
    (:func:`held_row_phases`): maps, further row reductions of the held values (a softmax's
    sum of exponentials after its maximum, a variance after its mean), read in turn by a
    later phase, and column or full reductions accumulated across its rows (combined over
    blocks with atomics, so never read inside the kernel). A *held-column* group
    (``"held_col"``) is the same along the columns: column reductions read at their own
    column, a block per strip of columns walking every row in each phase; it keeps no row
    reductions (another block holds the rest of each row)."""
    rule = "reduction_epilogue"
    found = []
    members = [*core, *fed]
    shape = mapreduce_shape_reason(graph, members)
    if shape is not None:
        found.append(Violation(rule, f"{members} is not one matrix map/reduce group: {shape}"))
    folded, read_along = HELD_AXES[kind]
    what = "row" if kind == "held" else "column"
    group = set(members)
    if kind == "held_col":
        for name in members:
            reduction = graph.kernel_by_name[name].reduction
            if reduction is not None and reduction.axes == (1,):
                found.append(Violation(rule, f"'{name}' reduces along rows: a block holding "
                                             "a strip of columns has only part of each row"))
    for name in fed:
        kernel = graph.kernel_by_name[name]
        for access in kernel.accesses:
            producer = graph.producer.get(access.buffer)
            if producer not in group:
                continue
            reduction = graph.kernel_by_name[producer].reduction
            if reduction is None:
                continue
            if reduction.axes != folded:
                found.append(Violation(rule, f"'{name}' reads '{producer}', a reduction "
                                             "combined over blocks (a global barrier), in "
                                             "its own kernel"))
            elif access.dims != read_along or not access.is_point:
                found.append(Violation(rule, f"'{name}' reads the {what} reduction "
                                             f"'{access.buffer}' at another {what} (an offset "
                                             "or another index): a block holds only its own "
                                             f"{what}s' results"))
    return found


def held_row_phases(graph: Graph, members: Sequence[str],
                    online: Mapping[str, str] | None = None) -> dict[str, int]:
    """The phase of each member of a held-row group: 0 for the core, else one more than the
    latest phase of a row reduction of the group it reads (through maps of the group). A
    phase's row reductions are complete, over the block, before the next phase starts.
    ``online`` (:func:`online_rescaled_sums`): sums that go in the phase of the maximum they
    read (its running value rescales them)."""
    group = set(members)
    online = online or {}
    phases: dict[str, int] = {}

    def phase(name: str) -> int:
        if name not in phases:
            phases[name] = 0  # (the group is acyclic: a placeholder, never read back)
            latest = 0
            for buffer in graph.kernel_by_name[name].reads:
                producer = graph.producer.get(buffer)
                if producer not in group:
                    continue
                reduced = graph.kernel_by_name[producer].reduction is not None
                step = 0 if online.get(name) == producer else int(reduced)
                latest = max(latest, phase(producer) + step)
            phases[name] = latest
        return phases[name]

    for name in members:
        phase(name)
    return phases


def _inlined_body(graph: Graph, members: Sequence[str], name: str) -> Expr:
    """``name``'s body with the group's maps read at the point replaced by their bodies."""
    group = set(members)

    def rewrite(node: Expr) -> Expr | None:
        if not isinstance(node, Load) or not node.is_centered:
            return None
        producer = graph.producer.get(node.buffer)
        if producer not in group:
            return None
        kernel = graph.kernel_by_name[producer]
        if kernel.reduction is not None or node.dims != tuple(range(len(kernel.domain))):
            return None
        return _inlined_body(graph, members, producer)

    return transform(graph.kernel_by_name[name].body, rewrite)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CentredSum:
    """A sum of squares of centred values, ``sum((e - c)²)``, ``c`` read from the group's sum
    ``total`` of the same ``e`` (along the same axis): ``value`` is ``e``, ``centre`` is
    ``c`` (it reads ``total`` and nothing that varies along the axis)."""

    total: str
    value: Expr
    centre: Expr


def online_centred_sums(graph: Graph, members: Sequence[str]) -> dict[str, CentredSum]:
    """Sums of squares of values centred by a centre read from another sum of the group over
    the same values along the same axis (a variance after its mean: ``sum((x - mean)²)``,
    ``mean = sum(x) / n``), each to what it needs: computed in the pass of that sum, as the
    sum of squares about the first segment's mean, moved to the centre once the sum is
    complete (``q = b + 2 (k - c)(s - n k) + n (k - c)²``: shifted data, no cancellation where
    the shift is near the mean), so rows or columns held in segments are read once for both."""
    phases = held_row_phases(graph, members)
    group = set(members)
    kind = epilogue_kind(graph, members)
    if kind not in HELD_AXES:
        return {}
    folded, read_along = HELD_AXES[kind]
    bodies = {name: canonical(_inlined_body(graph, members, name)) for name in members
              if graph.kernel_by_name[name].reduction is not None}
    found = {}
    for name in members:
        kernel = graph.kernel_by_name[name]
        if kernel.reduction is None or kernel.reduction.op != "sum" \
                or kernel.reduction.axes != folded:
            continue
        body = _inlined_body(graph, members, name)
        if not (isinstance(body, Binary) and body.op == "mul"
                and canonical(body.a) == canonical(body.b) and isinstance(body.a, Binary)
                and body.a.op == "sub"):
            continue
        value, centre = body.a.a, body.a.b
        totals = [graph.producer.get(load.buffer) for load in loads(centre)]
        total = totals[0] if totals else None
        if total not in group or total == name:
            continue
        reduction = graph.kernel_by_name[total].reduction
        if reduction is None or reduction.op != "sum" or reduction.axes != folded \
                or bodies.get(total) != canonical(value):
            continue
        fine = True  # the centre: results complete before the total's pass, params, numbers
        for load in loads(centre):
            source = graph.producer.get(load.buffer)
            if source not in group or load.dims != read_along or not load.is_centered \
                    or graph.kernel_by_name[source].reduction is None \
                    or (source != total and phases[source] >= phases[total]):
                fine = False
        for load in loads(value):  # the value: nothing of the total's pass or later
            source = graph.producer.get(load.buffer)
            if source in group and graph.kernel_by_name[source].reduction is not None \
                    and phases[source] >= phases[total]:
                fine = False
        if fine and not any(isinstance(node, Coord) for node in centre.walk()):
            found[name] = CentredSum(total, value, centre)
    return found


def online_rescaled_sums(graph: Graph, members: Sequence[str]) -> dict[str, str]:
    """Row (column) sums of exponentials past a row (column) maximum of the group
    (``sum(exp(e - m))``, ``m`` the maximum read at its row, ``e`` reading only results
    complete before ``m``'s phase), each to its maximum: computed in the maximum's pass with
    a running maximum that rescales the sum whenever it grows (Milakov and Gimelshein 2018,
    the online normaliser of softmax), so rows held in segments (a strip of columns walked
    down its rows) are read once for both."""
    phases = held_row_phases(graph, members)
    group = set(members)
    found = {}
    for name in members:
        kernel = graph.kernel_by_name[name]
        if kernel.reduction is None or kernel.reduction.op != "sum" \
                or kernel.reduction.axes not in ((1,), (0,)) or kernel.ndim != 2:
            continue
        kept_axis = 1 - kernel.reduction.axes[0]  # (the axis the result lies along)
        body = _inlined_body(graph, members, name)
        if not (isinstance(body, Unary) and body.op == "exp" and isinstance(body.x, Binary)
                and body.x.op == "sub" and isinstance(body.x.b, Load)):
            continue
        top = body.x.b
        producer = graph.producer.get(top.buffer)
        if producer not in group or top.dims != (kept_axis,) or not top.is_centered:
            continue
        reduction = graph.kernel_by_name[producer].reduction
        if reduction is None or reduction.op != "max" \
                or reduction.axes != kernel.reduction.axes or top.dtype != body.dtype:
            continue
        complete = True  # the shifted value reads no row result of the maximum's phase
        for load in loads(body.x.a):
            source = graph.producer.get(load.buffer)
            if source in group and graph.kernel_by_name[source].reduction is not None \
                    and phases[source] >= phases[producer]:
                complete = False
        if complete:
            found[name] = producer
    return found


GROUP_RULES: tuple[Callable[[Graph, Sequence[str]], str | None], ...] = (
    rule_no_opaque,
    rule_same_iteration_space,
    rule_convex,
    rule_connected,
    rule_no_reduction_consumed_inside,
    rule_reductions_fusible,
    rule_same_nesting_depth,
    rule_evaluations_where_read_bounded,
)


def group_violations(graph: Graph, members: Sequence[str],
                     variant: object = None) -> list[Violation]:
    """Every structural rule the group breaks (resources are checked on generated code).

    ``variant`` (the group's form or its name, when known; :mod:`kfuse.schedule.forms`)
    must be able to implement it, and a group in which a reduction
    feeds an elementwise epilogue is judged by :func:`epilogue_violations` under it;
    without one (every search but the BLAS implementation space) such a group is refused.
    """
    unknown = [n for n in members if n not in graph.kernel_by_name]
    if unknown:
        return [Violation("known_kernels", f"no operator named {unknown[0]!r}")]
    form = as_form(variant)
    if form is not None:  # (a plan made for another pipeline may name it)
        reason = form.why_not(graph, members)
        if reason:
            return [Violation("variant", reason)]
    if len(members) < 2:
        return []
    if variant is not None and is_epilogue_group(graph, members):  # ("auto" too: named)
        return epilogue_violations(graph, members, form if form is not None else variant)
    found = []
    for rule in GROUP_RULES:
        reason = rule(graph, members)
        if reason:
            found.append(Violation(rule.__name__.removeprefix("rule_"), reason))
    return found


# A few bytes spilled per thread (ptxas's spill stores: what each thread keeps in local
# memory) stay in L1 and cost little; more means the group does not fit. Measured on an H100:
# the 3-D diffusion fused with 8 bytes spilled ran as fast as without; with constant borders
# its 8 x 2 x 4 register tile spilling 24 bytes (44 bytes of spill loads) ran 1.38x faster
# than the 4 x 2 x 4 tile, which spills nothing (docs/journal/benchmarks.md, session 15).
SPILL_TOLERANCE_BYTES = 32


def resource_violation(registers: int, shared_bytes: int, spill_bytes: int,
                       max_shared: int = MAX_SHARED_BYTES_PER_BLOCK,
                       max_registers: int = MAX_REGISTERS_PER_THREAD) -> Violation | None:
    """Shared memory per block and registers per thread within the device's limits (1.6, 1.7)."""
    if shared_bytes > max_shared:
        return Violation("resources", f"needs {shared_bytes} bytes of shared memory per block, "
                                      f"the device allows {max_shared}")
    if registers > max_registers or spill_bytes > SPILL_TOLERANCE_BYTES:
        return Violation("resources", f"needs more than {max_registers} registers per thread "
                                      f"({spill_bytes} bytes spilled)")
    return None


def quotient_graph(graph: Graph, groups: Sequence[Sequence[str]]) -> nx.DiGraph:
    """Groups (by index) linked where a kernel of one feeds a kernel of another."""
    index = {name: i for i, group in enumerate(groups) for name in group}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(groups)))
    for source, target in graph.order_dag().edges:
        if index[source] != index[target]:
            quotient.add_edge(index[source], index[target])
    return quotient


def plan_violations(graph: Graph, groups: Iterable[Sequence[str]]) -> list[Violation]:
    """Rules on the whole partition: every kernel once, and groups can run in some order."""
    groups = [list(g) for g in groups]
    seen: dict[str, int] = {}
    found = []
    for index, group in enumerate(groups):
        for name in group:
            if name in seen:
                found.append(Violation("partition", f"'{name}' is in two groups"))
            seen[name] = index
    missing = [k.name for k in graph.kernels if k.name not in seen]
    if missing:
        found.append(Violation("partition", f"{missing} are in no group"))
    if found:
        return found
    quotient = quotient_graph(graph, groups)
    if not nx.is_directed_acyclic_graph(quotient):
        cycle = nx.find_cycle(quotient)
        names = [groups[edge[0]] for edge in cycle]
        found.append(Violation("acyclic", f"groups {names} depend on each other in a cycle"))
    return found
