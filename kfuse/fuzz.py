"""Random pipelines under random legal plans, checked against NumPy (``kfuse fuzz``).

Each case is drawn from one integer seed: a family of pipeline (stencil chains with selects
and casts, reductions with full reductions read back and row- or column-wise
normalisations, BLAS-1/2 sequences, pyramid levels read down and up, reads at computed indices), a dimensionality, odd sizes, a dtype and a chain of
operators of that family with random boundary modes; then a random legal plan (random
groups along the data edges, each kept only where legality accepts it) with random forms
where the group has several (recompute or staged, a map-reduce variant of the
implementation space). The compiled backend's results must equal the ``numpy`` backend's
(the truth) and a float64 replay of the same pipeline. A failing case is shrunk: operators,
groups and sizes are taken away while it still fails, and the smallest is reported as a
:class:`Case` that rebuilds it.

    kfuse fuzz --seeds 0:200            # 200 cases on the cpu backend
    kfuse fuzz --seeds 1000:1010 --json # one JSON object per case
"""

from __future__ import annotations

import dataclasses
import random
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

import kfuse.dsl as kf
from kfuse.errors import KfuseError
from kfuse.fusion.legality import epilogue_kind, segment_reason
from kfuse.fusion.plan import check_groups, make_plan
from kfuse.ir.expr import FLOAT_DTYPES, HALF_DTYPES, INT_DTYPES
from kfuse.runtime.numpy_backend import numpy_dtype

FAMILIES = ("stencil", "reduction", "blas", "multires")
MODES = ("clamp", "mirror", "repeat", "constant")
SIZES = {1: (5, 67), 2: (3, 23), 3: (3, 11)}  # per dimensionality, the range of each axis
# The largest relative error (max |result - reference| / max |reference|) a case may show:
# against the same dtype's NumPy evaluation, and against the float64 replay
TOLERANCE = {"float32": (2e-4, 2e-3), "float64": (1e-10, 1e-9), "float16": (4e-3, 2e-2),
             "bfloat16": (3e-2, 1e-1),
             **{dtype: (0.0, 0.0) for dtype in INT_DTYPES}}


@dataclass(frozen=True)
class Op:
    """One operator of a case: its kind, the earlier arrays it reads (indices into the
    case's arrays: inputs first, then each operator's result) and the draws that shape it."""

    kind: str
    reads: tuple[int, ...]
    detail: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Case:
    """A fuzzed pipeline and plan, rebuilt from its fields alone (what shrinking edits)."""

    seed: int
    family: str
    dtype: str
    shape: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]  # each input's shape
    ops: tuple[Op, ...]
    groups: tuple[tuple[int, ...], ...] = ()  # operators fused, by index
    forms: tuple[str | None, ...] = ()  # per group: its form's name (None: the default)

    def describe(self) -> str:
        ops = ", ".join(f"{op.kind}{list(op.reads)}" for op in self.ops)
        return (f"seed {self.seed}: {self.family} {self.dtype} {'x'.join(map(str, self.shape))}"
                f", {len(self.inputs)} inputs, operators [{ops}], groups "
                f"{[list(g) for g in self.groups]} forms {list(self.forms)}")


@dataclass
class Outcome:
    """What one case gave: ``status`` ``ok``, ``mismatch`` or ``error`` (a traceback that is
    no KfuseError, or a KfuseError on a legal case), with the errors measured."""

    case: Case
    status: str
    errors: dict[str, float] = field(default_factory=dict)
    message: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.case.seed, "status": self.status, "case": self.case.describe(),
                "errors": self.errors, "message": self.message,
                "seconds": round(self.seconds, 3)}


# -- drawing a case -----------------------------------------------------------------------------

def draw_case(seed: int) -> Case:
    """The case of ``seed`` (the same on every machine)."""
    rng = random.Random(seed)
    # one seed in four draws a pyramid; the others the first three families by seed % 3, as
    # they did before the fourth came (a seed's case stays the case it was)
    family = "multires" if seed % 4 == 3 else FAMILIES[seed % 3]
    if family == "blas":
        rows, columns = rng.randint(3, 45), rng.randint(3, 45)
        dtype = rng.choice(FLOAT_DTYPES)
        inputs = ((rows, columns), (columns,), (rows,), (columns,))
        ops = _blas_ops(rng)
        return Case(seed, family, dtype, (rows, columns), inputs, ops)
    if family == "multires":
        return _multires_case(seed, rng)
    ndim = rng.randint(1, 3)
    shape = tuple(rng.randint(*SIZES[ndim]) for _ in range(ndim))
    dtype = rng.choice(("float32", "float32", "float64", "int32", rng.choice(INT_DTYPES),
                        rng.choice(HALF_DTYPES)))
    folds = ("sum", "min", "max")  # (of small integers: int64 sums, int32 extremes)
    count = rng.randint(2, 6)
    ops: list[Op] = []
    arrays = 2  # the inputs, then each operator's result
    maps = [0, 1]  # the arrays of the whole shape (later operators read these)
    scalars: list[int] = []  # full reductions (0-d results) later maps may read
    for index in range(count):
        reads = (rng.choice(maps), rng.choice(maps)) if index else (0, 1)
        kind = "point" if index == 0 else rng.choice(
            ("point", "local", "local", "select", "cast") if family == "stencil"
            else ("point", "local", "reduce", "reduce", "select") +
            (("normalize", "normalize") if ndim == 2 else ()))
        if kind == "point":
            scalar = rng.choice(scalars) if scalars and rng.random() < 0.5 else None
            ops.append(Op("point", reads + ((scalar,) if scalar is not None else ()),
                          (rng.randrange(6), scalar is not None)))
            maps.append(arrays)
            arrays += 1
        elif kind == "local":
            taps = tuple((tuple(rng.randint(-2, 2) for _ in range(ndim)), rng.choice(MODES))
                         for _ in range(rng.randint(1, 4)))
            ops.append(Op("local", reads[:1], (taps, rng.choice((0.25, 0.5, 1.0)))))
            maps.append(arrays)
            arrays += 1
        elif kind in ("select", "cast", "normalize"):
            detail = {"select": (), "cast": (rng.choice(("float32", "float64", "int32")),),
                      "normalize": (rng.choice(folds), rng.randint(0, 1))}
            extra = {"select": (0, 1), "cast": (0,), "normalize": ()}[kind]  # inputs read
            ops.append(Op(kind, reads + extra, detail[kind]))
            maps.append(arrays)
            arrays += 1
        else:
            axis = rng.choice((None, *range(ndim)))
            ops.append(Op("reduce", reads, (rng.choice(folds), axis)))
            if axis is None:
                scalars.append(arrays)
            arrays += 1
    return Case(seed, family, dtype, shape, (shape, shape), tuple(ops))


def _multires_case(seed: int, rng: random.Random) -> Case:
    """Pyramid levels: downsampling (random taps), upsampling to a finer level (nearest,
    linear) and raw reads at another resolution, with maps, stencils and reductions on
    whichever level; operators combine arrays of one shape (levels of one size)."""
    ndim = rng.randint(1, 3)
    shape = tuple(rng.randint(*SIZES[ndim]) for _ in range(ndim))
    dtype = rng.choice(("float32", "float32", "float64"))
    shapes: list[tuple[int, ...]] = [shape, shape]  # each array's, inputs first
    finer: dict[int, int] = {}  # a level's array -> an array of the level it came from
    ops: list[Op] = []
    for index in range(rng.randint(2, 7)):
        maps = [i for i, s in enumerate(shapes) if s is not None]
        first = rng.choice(maps)
        same = [i for i in maps if shapes[i] == shapes[first]]
        kind = "point" if index == 0 else rng.choice(
            ("point", "local", "down", "down", "up", "scaled", "gather", "reduce"))
        if kind == "up" and first not in finer:
            kind = "down"
        mode = rng.choice(MODES)
        result: tuple[int, ...] | None = shapes[first]
        if kind == "point":
            ops.append(Op("point", (first, rng.choice(same)), (rng.randrange(6), False)))
        elif kind == "local":
            taps = tuple((tuple(rng.randint(-2, 2) for _ in range(ndim)), rng.choice(MODES))
                         for _ in range(rng.randint(1, 3)))
            ops.append(Op("local", (first,), (taps, rng.choice((0.25, 0.5)))))
        elif kind == "down":
            weights = tuple(rng.choice((0.125, 0.25, 0.375, 0.5)) for _ in
                            range(rng.randint(1, 4)))
            ops.append(Op("down", (first,), (weights, rng.randint(-2, 1), mode)))
            result = tuple(-(-n // 2) for n in shapes[first])
            finer[len(shapes)] = first
        elif kind == "up":
            ops.append(Op("up", (first, finer[first]), (rng.choice(("nearest", "linear")),
                                                         mode)))
            result = shapes[finer[first]]
        elif kind == "scaled":
            up = rng.random() < 0.5
            factors = tuple(rng.choice((1, 2, 3)) for _ in range(ndim))
            taps = tuple((tuple(rng.randint(-2, 2) for _ in range(ndim)), rng.choice(MODES))
                         for _ in range(rng.randint(1, 3)))
            ops.append(Op("scaled", (first,), (taps, up, factors)))
            result = tuple(n * f if up else -(-n // f)
                           for n, f in zip(shapes[first], factors, strict=True))
        elif kind == "gather":  # one axis read at computed indices: from an input's values
            axis = rng.randrange(ndim)  # (exact in every precision) or from coordinates
            from_input = shapes[first] == shape and rng.random() < 0.7
            ops.append(Op("gather", (first, 0), (axis, from_input, rng.randint(-2, 2),
                                                 rng.choice(MODES))))
        else:
            ops.append(Op("reduce", (first, rng.choice(same)),
                          (rng.choice(("sum", "min", "max")), rng.choice((None,
                                                                          *range(ndim))))))
            result = None
        shapes.append(result)  # type: ignore[arg-type]
    return Case(seed, "multires", dtype, shape, (shape, shape), tuple(ops))


def _blas_ops(rng: random.Random) -> tuple[Op, ...]:
    """A BLAS-1/2 sequence over A (m x n), x (n), y (m), z (n): arrays 0-3."""
    ops: list[Op] = []
    vectors = {"n": [1, 3], "m": [2]}  # array indices by length
    arrays = 4
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(("gemv", "matvec_t", "axpy", "dot_scale", "ger", "nrm2_scale"))
        if kind == "gemv":
            ops.append(Op(kind, (0, rng.choice(vectors["n"]), rng.choice(vectors["m"])),
                          (rng.choice((0.5, 1.0, 2.0)), rng.choice((0.0, 1.0, -0.5)))))
            vectors["m"].append(arrays)
        elif kind == "matvec_t":
            ops.append(Op(kind, (0, rng.choice(vectors["m"]))))
            vectors["n"].append(arrays)
        elif kind == "axpy":
            length = rng.choice(("n", "m"))
            ops.append(Op(kind, (rng.choice(vectors[length]), rng.choice(vectors[length])),
                          (rng.choice((0.5, -1.0, 3.0)),)))
            vectors[length].append(arrays)
        elif kind == "ger":
            ops.append(Op(kind, (0, rng.choice(vectors["m"]), rng.choice(vectors["n"])),
                          (rng.choice((1.0, -0.25)),)))
        else:  # a vector scaled by a reduction of another: dot or nrm2
            length = rng.choice(("n", "m"))
            ops.append(Op(kind, (rng.choice(vectors[length]), rng.choice(vectors[length]),
                                 rng.choice(vectors[length]))))
            vectors[length].append(arrays)
        arrays += 1
    return tuple(ops)


# -- building it --------------------------------------------------------------------------------

def build(case: Case, dtype: str | None = None) -> tuple[kf.Pipeline, dict[str, Any]]:
    """The case's pipeline (in ``dtype`` where given: the float64 replay) and its inputs."""
    dtype = dtype or case.dtype
    p = kf.Pipeline(f"fuzz{case.seed}", names_from_source=False)
    arrays: list[Any] = []
    inputs: dict[str, Any] = {}
    rng = np.random.default_rng(case.seed)
    read = {index for op in case.ops for index in op.reads}
    for index, shape in enumerate(case.inputs):
        name = f"in{index}"
        if index not in read:  # (an input no operator reads is no input)
            arrays.append(None)
            continue
        arrays.append(p.input(name, shape=shape, dtype=dtype))
        values = rng.integers(-9, 10, size=shape) if dtype in INT_DTYPES else \
            rng.uniform(0.5, 1.5, size=shape)
        inputs[name] = np.asarray(values).astype(numpy_dtype(dtype))
    for index, op in enumerate(case.ops):
        arrays.append(_BUILDERS[op.kind](p, op, [arrays[i] for i in op.reads], case,
                                         f"op{index}"))
    for array in arrays[len(case.inputs):]:
        if array is not None:
            p.output(array)
    return p, inputs


def _point(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    x, y = reads[0], reads[1]
    choice, scaled = op.detail
    integer = case.dtype in INT_DTYPES
    # (float bodies are continuous: a comparison or a floor of computed values could take
    # another branch in float64 than in float32, which is no error)
    bodies: list[Callable[[], Any]] = [
        lambda: x + y * 2 if integer else x + y * 0.5,
        lambda: kf.maximum(x, y) - kf.minimum(x, y) * 3 if integer else
        kf.sqrt(kf.abs(x * y) + 0.25),
        lambda: kf.where(x > y, x, y * 3) if integer else kf.maximum(x, y * 0.75),
        lambda: x * y - x if integer else kf.exp(-kf.abs(x) * 0.5) + kf.abs(y - 1.0),
        lambda: kf.minimum(x, y * 2) + 1 if integer else x / (kf.abs(y) + 1.0),
        lambda: x - y if integer else kf.tanh(x - y) * 0.5 + kf.minimum(x, 2.0),
    ]
    body = bodies[choice]()
    if scaled:
        body = body + reads[2] if integer else body * (1.0 / (1.0 + kf.abs(reads[2])))
    return kf.point(body, name=name)


def _local(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    taps, weight = op.detail
    x = reads[0]
    total = None
    shape = tuple(int(s) for s in x.shape) if all(s.isdecimal() for s in x.shape) \
        else case.shape  # (a pyramid level's: its own)
    for offsets, mode in taps:
        integer = case.dtype in INT_DTYPES
        boundary = kf.constant(2 if integer else 0.5) if mode == "constant" else mode
        offsets = tuple(max(-(n - 1), min(n - 1, o)) for o, n in zip(offsets, shape,
                                                                      strict=True))
        term = x.at(*offsets, boundary=boundary)
        total = term if total is None else total + term
    body = total if case.dtype in INT_DTYPES else total * weight
    return kf.local(body, name=name)


def _down(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    weights, first, mode = op.detail
    boundary = kf.constant(0.5) if mode == "constant" else mode
    return kf.downsample(reads[0], 2, weights=weights, first=first, boundary=boundary,
                         name=name)


def _up(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    interpolation, mode = op.detail
    boundary = kf.constant(0.5) if mode == "constant" else mode
    return kf.upsample(reads[0], 2, interpolation=interpolation, like=reads[1],
                       boundary=boundary, name=name)


def _scaled(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    """Taps read at another resolution (``x.at(..., down=f)`` or ``up=f`` per axis)."""
    taps, up, factors = op.detail
    total = None
    for offsets, mode in taps:
        boundary = kf.constant(0.5) if mode == "constant" else mode
        term = reads[0].at(*offsets, boundary=boundary,
                           **({"up": factors} if up else {"down": factors}))
        total = term if total is None else total + term
    return kf.local(total * 0.5, name=name)


def _gather(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    """An axis read at computed indices (``x.at(..., index={axis: ...})``), the others at
    the point: indices from the first input's values times 4 (exact in float32 and float64:
    both truncate alike) or from the point's coordinate."""
    axis, from_input, offset, mode = op.detail
    x, source = reads
    boundary = kf.constant(0.5) if mode == "constant" else mode
    index = kf.astype(source * 4.0, "int32") if from_input else \
        (kf.coord(axis) * 3 + 1) // 2
    offsets = [0] * x.ndim
    offsets[axis] = offset
    dims = tuple(-1 if k == axis else k for k in range(x.ndim))
    read = x.at(*offsets, index={axis: index}, dims=dims, boundary=boundary)
    return kf.point(read * 0.5 + x, name=name)


def _select(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    """Where the first input is above the second (inputs are the same in every replay, so
    the branch taken is too), one array, else the other."""
    x, y, first, second = reads
    return kf.point(kf.where(first > second, x, y), name=name)


def _cast(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    """Through another dtype and back (a float cast to int32 truncates: of inputs only, as
    a truncation of computed values could land on either side in another precision)."""
    (dtype,) = op.detail
    x, y, source = reads
    if dtype == "int32" and case.dtype not in INT_DTYPES:
        return kf.point(kf.astype(kf.astype(source * 4.0, "int32"), case.dtype) * 0.25 + x,
                        name=name)
    return kf.point(kf.astype(kf.astype(x, dtype), case.dtype) + y, name=name)


def _normalize(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    """A reduction along one axis of a matrix read back across that axis (a row- or
    column-wise normalisation); of floats, a maximum is a softmax's (the exponentials past
    it summed and read back too: online rescaling, values kept across phases)."""
    kind, axis = op.detail
    x = reads[0]
    reduced = kf.reduce(x, kind, axis, name=f"{name}_r")
    back = kf.along(reduced, 1 - axis)
    if case.dtype in INT_DTYPES:
        return kf.point(x * 2 - back, name=name)
    if kind == "max":
        shifted = kf.exp(x - back)
        total = kf.reduce_sum(shifted, axis=axis, name=f"{name}_s")
        return kf.point(shifted / kf.along(total, 1 - axis), name=name)
    return kf.point((x - back * 0.5) / (kf.abs(back) + 1.0), name=name)


def _reduce(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    kind, axis = op.detail
    x, y = reads
    body = x * y if kind != "sum" or case.dtype not in INT_DTYPES else x + y
    return kf.reduce(body, kind, axis, name=name)


def _blas(p: kf.Pipeline, op: Op, reads: list[Any], case: Case, name: str) -> Any:
    if op.kind == "gemv":
        alpha, beta = op.detail
        a, x, y = reads
        return kf.gemv(a, x, alpha, beta if beta else None, y if beta else None, name=name)
    if op.kind == "matvec_t":
        return kf.matvec_t(reads[0], reads[1], name=name)
    if op.kind == "axpy":
        return kf.axpy(op.detail[0], reads[0], reads[1], name=name)
    if op.kind == "ger":
        return kf.ger(reads[0], reads[1], reads[2], op.detail[0], name=name)
    reduced = kf.dot(reads[0], reads[1], name=f"{name}_r") if op.kind == "dot_scale" else \
        kf.nrm2(reads[0], name=f"{name}_r")
    return kf.point(reads[2] * (1.0 / (1.0 + kf.abs(reduced))), name=name)


_BUILDERS: dict[str, Callable[..., Any]] = {
    "point": _point, "local": _local, "reduce": _reduce, "select": _select, "cast": _cast,
    "normalize": _normalize, "down": _down, "up": _up, "scaled": _scaled, "gather": _gather,
    "gemv": _blas, "matvec_t": _blas,
    "axpy": _blas, "ger": _blas, "dot_scale": _blas, "nrm2_scale": _blas}


# -- its plan -----------------------------------------------------------------------------------

def draw_plan(case: Case, pipeline: kf.Pipeline) -> Case:
    """``case`` with a random legal plan: random edges between operators merged into groups,
    each group kept where legality accepts it, each given a random one of its forms."""
    rng = random.Random(case.seed * 7919 + 1)
    graph = pipeline.graph()
    names = [k.name for k in graph.kernels]
    edges = [(graph.producer[b], k.name) for k in graph.kernels for b in k.reads
             if b in graph.producer]
    parent = {name: name for name in names}

    def find(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for source, target in rng.sample(edges, rng.randint(0, len(edges))) if edges else ():
        parent[find(source)] = find(target)
    merged: dict[str, list[str]] = {}
    for name in names:
        merged.setdefault(find(name), []).append(name)
    groups: list[list[str]] = []
    forms: list[str | None] = []
    for members in merged.values():
        if len(members) < 2:
            continue
        for form in dict.fromkeys((_draw_form(rng, graph, members), None)):
            chosen = {frozenset(g): f for g, f in zip([*groups, members], [*forms, form],
                                                      strict=True) if f is not None}
            grouped = {name for group in (*groups, members) for name in group}
            partition = [*groups, members, *([name] for name in names if name not in grouped)]
            if not check_groups(graph, partition, chosen):  # legal (else left unfused)
                groups.append(members)
                forms.append(form)
                break
    index = {name: position for position, name in enumerate(names)}
    return replace(case, groups=tuple(tuple(index[m] for m in g) for g in groups),
                   forms=tuple(forms))


# rows held in segments by small blocks (several segments even on the fuzzer's small rows;
# with a stash of two)
SMALL_SEGMENTS = ("mapreduce:64x1:r1:i1:w:stream:g3:u1:hr:sg",
                  "mapreduce:64x1:r1:i1:s:stream:g2:u1:hr:sg:st2")


def _draw_form(rng: random.Random, graph: Any, members: list[str]) -> str | None:
    """A random form among those that can implement the group (None: its default)."""
    from kfuse.schedule.forms import Recompute, Staged, Streamed
    from kfuse.search.variants import group_variants

    choices: list[str | None] = [None]
    for form in (Recompute(), Staged(), Streamed(threads=32, chunk_rows=8)):
        if form.why_not(graph, members) is None:
            choices.append(form.text())
    try:
        choices += [v for v in group_variants(graph, members) if v != "auto"][:40]
    except KfuseError:
        pass
    if len(members) > 1 and epilogue_kind(graph, members) == "held" \
            and segment_reason(graph, members) is None:
        choices += list(SMALL_SEGMENTS)  # (held rows whole need sizes; segments take any)
    return rng.choice(choices)


def plan_of(case: Case, pipeline: kf.Pipeline) -> Any:
    """The case's plan for ``pipeline`` (its groups by operator name, with their forms;
    registers and shared memory are not checked: the host runs any kernel)."""
    graph = pipeline.graph()
    names = [k.name for k in graph.kernels]
    groups = [[names[i] for i in group] for group in case.groups]
    forms = {frozenset(group): form for group, form in zip(groups, case.forms, strict=True)
             if form is not None}
    return make_plan(graph, groups, variants=forms, check_resources=False) if groups \
        else "unfused"


# -- checking it --------------------------------------------------------------------------------

def check(case: Case, backend: str = "cpu") -> Outcome:
    """Run ``case`` on ``backend`` under its plan and compare with the references."""
    started = time.perf_counter()
    try:
        pipeline, inputs = build(case)
        plan = plan_of(case, pipeline)
        result = pipeline.run(backend=backend, plan=plan, **inputs)
        truth = pipeline.run(backend="numpy", **inputs)
        wide, wide_inputs = build(case, "float64") if case.dtype in FLOAT_DTYPES + HALF_DTYPES \
            else (None, None)
        replay = wide.run(backend="numpy", **{k: v.astype("float64") for k, v in
                                              inputs.items()}) if wide else truth
    except KfuseError as error:
        return Outcome(case, "error", message=f"{type(error).__name__}: {error}",
                       seconds=time.perf_counter() - started)
    except Exception as error:  # noqa: BLE001 - a raw traceback is what the fuzzer finds
        frames = traceback.extract_tb(error.__traceback__)
        where = "".join(f" at {frame.filename}:{frame.lineno} in {frame.name}"
                        for frame in frames[-3:])
        return Outcome(case, "error", message=f"raw {type(error).__name__}: {error}{where}",
                       seconds=time.perf_counter() - started)
    errors: dict[str, float] = {}
    same, wide_tolerance = TOLERANCE[case.dtype]
    failed = False
    for name, value in result.items():
        got = np.asarray(value, dtype=np.float64)
        for label, reference, tolerance in (("numpy", truth[name], same),
                                            ("float64", replay[name], wide_tolerance)):
            expected = np.asarray(reference, dtype=np.float64)
            if got.shape != expected.shape:
                return Outcome(case, "mismatch", message=f"'{name}' has shape {got.shape}, "
                               f"{label} {expected.shape}",
                               seconds=time.perf_counter() - started)
            scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
            error = float(np.max(np.abs(got - expected), initial=0.0)) / scale
            if np.isnan(got).any() != np.isnan(expected).any():
                error = float("inf")
            errors[f"{name} vs {label}"] = error
            failed |= error > tolerance
    return Outcome(case, "mismatch" if failed else "ok", errors,
                   seconds=time.perf_counter() - started)


def shrink(case: Case, fails: Callable[[Case], bool], budget: int = 60) -> Case:
    """A smaller case that still fails: operators dropped from the end (their readers read
    an input instead), groups dropped, sizes halved, while ``fails`` holds."""
    for candidate in _smaller(case):
        if budget <= 0:
            break
        budget -= 1
        if fails(candidate):
            return shrink(candidate, fails, budget)
    return case


def _smaller(case: Case) -> Iterator[Case]:
    for index in range(len(case.groups)):
        yield replace(case, groups=case.groups[:index] + case.groups[index + 1:],
                      forms=case.forms[:index] + case.forms[index + 1:])
    for index in reversed(range(len(case.ops))):
        if len(case.ops) > 1:
            yield _without_op(case, index)
    if all(n > 3 for n in case.shape) and case.family != "blas":
        shape = tuple(max(3, n // 2 + 1) for n in case.shape)
        yield replace(case, shape=shape, inputs=tuple(shape for _ in case.inputs))


def _without_op(case: Case, index: int) -> Case:
    """``case`` without operator ``index``: later reads of it read the first input, later
    reads past it move down by one; the plan is dropped (its indices no longer hold)."""
    removed = len(case.inputs) + index

    def moved(read: int) -> int:
        return 0 if read == removed else read - (read > removed)

    ops = [replace(op, reads=tuple(moved(r) for r in op.reads)) for op in case.ops]
    del ops[index]
    return replace(case, ops=tuple(ops), groups=(), forms=())


def cases(seeds: Sequence[int]) -> Iterator[Case]:
    """The drawn cases of ``seeds``, each with its random plan."""
    for seed in seeds:
        case = draw_case(seed)
        try:
            pipeline, _ = build(case)
            pipeline.graph()
        except KfuseError:
            continue  # a draw the DSL refuses (reported by the tests of the DSL, not here)
        yield draw_plan(case, pipeline)


def check_seed(seed: int, backend: str = "cpu") -> Outcome | None:
    """The outcome of ``seed``'s case (None: a draw the DSL refuses), a failing case shrunk
    to the smallest that still fails the same way."""
    found = list(cases([seed]))
    if not found:
        return None
    case = found[0]
    outcome = check(case, backend)
    if outcome.status != "ok":
        status = outcome.status
        smallest = shrink(case, lambda c: check(c, backend).status == status)
        if smallest != case:
            outcome = dataclasses.replace(check(smallest, backend),
                                          message=outcome.message + " (shrunk)")
    return outcome


def run(seeds: Sequence[int], backend: str = "cpu", report: Callable[[Outcome], None] |
        None = None, jobs: int = 1) -> list[Outcome]:
    """Check the cases of ``seeds`` (in ``jobs`` processes); ``report`` sees each outcome."""
    outcomes: list[Outcome] = []

    def collect(found: Iterator[Outcome | None]) -> None:  # as each case comes back
        for outcome in found:
            if outcome is None:
                continue
            outcomes.append(outcome)
            if report is not None:
                report(outcome)

    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fresh processes, not forks: a fork of a process that set up CUDA cannot use it
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            collect(pool.map(check_seed, seeds, [backend] * len(seeds), chunksize=1))
    else:
        collect(check_seed(seed, backend) for seed in seeds)
    return outcomes
