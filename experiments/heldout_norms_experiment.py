"""Normalisations written as a user writes them (not kfuse's apps), planned and timed:
each compiled call beside its unfused program and torch.compile's in alternating rounds, at
16384 x 4096 float32 (a centring over a batch at (8, 2048, 4096), a batch norm at (32, 64,
16384)); the floor is every input read once and every output written once at
``--bandwidth`` (default: the calibrated profile's). ``--sweep columns`` times held-column
forms on column normalisations and on a batch of 8 rows; ``--sweep rows`` rows of 4096 held
whole against rows in segments read again from L2; ``--sweep halves`` the same for a
bfloat16 layer norm.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/heldout_norms_experiment.py [case ...]
        [--bandwidth 4.275e12] [--sweep columns|rows]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import kfuse.dsl as kf
from kfuse.apps import get_app
from kfuse.apps.normalise import build_column_softmax, build_gelu_layernorm
from kfuse.errors import KfuseError

CASES: dict[str, Callable[[], kf.Pipeline]] = {}
SHAPES = {"batch_centre": (8, 2048, 4096), "batchnorm": (32, 64, 16384)}
MATRIX = (16384, 4096)


def case(build: Callable[[], kf.Pipeline]) -> Callable[[], kf.Pipeline]:
    """Register a pipeline builder under its name."""
    CASES[build.__name__] = build
    return build


@case
def column_softmax() -> kf.Pipeline:
    return build_column_softmax()


def row_softmax(z) -> kf.Array:
    """The softmax of each row of the expression ``z``."""
    m = kf.reduce_max(z, axis=1, name="m")
    e = kf.exp(z - m.at(0, dims=(0,)))
    s = kf.reduce_sum(e, axis=1, name="s")
    return kf.point(e / s.at(0, dims=(0,)), name="y")


@case
def residual_rmsnorm() -> kf.Pipeline:
    p = kf.Pipeline("residual_rmsnorm")
    x = p.input("x", ndim=2)
    r = p.input("r", ndim=2)
    g = p.input("g", shape=(x.shape[1],))
    inv_n = p.param("inv_n")
    h = kf.point(x + r, name="h")
    s = kf.reduce_sum(h * h, axis=1, name="s")
    p.output(kf.point(h * kf.rsqrt(s.at(0, dims=(0,)) * inv_n + 1e-6) * g.at(0, dims=(1,)),
                      name="y"), h)
    return p


@case
def absmax_quantise() -> kf.Pipeline:
    p = kf.Pipeline("absmax_quantise")
    x = p.input("x", ndim=2)
    a = kf.reduce_max(kf.abs(x), axis=1, name="a")
    p.output(kf.point(kf.round(x * 127.0 / (a.at(0, dims=(0,)) + 1e-12)), name="q"), a)
    return p


@case
def masked_softmax() -> kf.Pipeline:
    p = kf.Pipeline("masked_softmax")
    x = p.input("x", ndim=2)
    mask = p.input("mask", ndim=2, dtype="bool")
    p.output(row_softmax(kf.where(mask, x, -1e30)))
    return p


@case
def column_l2norm() -> kf.Pipeline:
    p = kf.Pipeline("column_l2norm")
    x = p.input("x", ndim=2)
    s = kf.reduce_sum(x * x, axis=0, name="s")
    p.output(kf.point(x / kf.sqrt(s.at(0, dims=(1,)) + 1e-12), name="y"))
    return p


@case
def batch_centre() -> kf.Pipeline:
    """The mean over the batch axis of (batch, seq, hidden) taken away (merged: columns of
    8 rows)."""
    p = kf.Pipeline("batch_centre")
    x = p.input("x", ndim=3)
    inv_n = p.param("inv_n")
    m = kf.reduce_sum(x, axis=0, name="m")
    p.output(kf.point(x - m.at(0, 0, dims=(1, 2)) * inv_n, name="y"))
    return p


@case
def layernorm_bfloat16() -> kf.Pipeline:
    p = kf.Pipeline("layernorm_bfloat16")
    x = p.input("x", ndim=2, dtype="bfloat16")
    inv_n = p.param("inv_n")
    g = p.input("g", shape=(x.shape[1],), dtype="bfloat16")
    b = p.input("b", shape=(x.shape[1],), dtype="bfloat16")
    mu = kf.reduce_sum(x, axis=1, name="mu")
    c = x - mu.at(0, dims=(0,)) * inv_n
    v = kf.reduce_sum(c * c, axis=1, name="v")
    p.output(kf.point(c * kf.rsqrt(v.at(0, dims=(0,)) * inv_n + 1e-5) * g.at(0, dims=(1,))
                      + b.at(0, dims=(1,)), name="y"))
    return p


@case
def minmax_scale() -> kf.Pipeline:
    p = kf.Pipeline("minmax_scale")
    x = p.input("x", ndim=2)
    lo = kf.reduce_min(x, name="lo")
    hi = kf.reduce_max(x, name="hi")
    p.output(kf.point((x - lo) / (hi - lo), name="y"))
    return p


@case
def softmax_temperature() -> kf.Pipeline:
    p = kf.Pipeline("softmax_temperature")
    x = p.input("x", ndim=2)
    p.output(row_softmax(x * p.param("t")))
    return p


@case
def batchnorm() -> kf.Pipeline:
    """Statistics over (N, HW) of (N, C, HW): axes that do not merge (folded)."""
    p = kf.Pipeline("batchnorm")
    x = p.input("x", ndim=3)
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(x, axis=(0, 2), name="mean")
    c = x - mean.at(0, dims=(1,)) * inv_n
    var = kf.reduce_sum(c * c, axis=(0, 2), name="var")
    p.output(kf.point(c * kf.rsqrt(var.at(0, dims=(1,)) * inv_n + 1e-5), name="y"))
    return p


@case
def gelu_layernorm() -> kf.Pipeline:
    return build_gelu_layernorm()


def batch_of_rows() -> kf.Pipeline:
    """A centring over a batch of few rows, as a matrix (batch, features)."""
    p = kf.Pipeline("batch_of_rows")
    x = p.input("x", ndim=2)
    inv_n = p.param("inv_n")
    m = kf.reduce_sum(x, axis=0, name="m")
    p.output(kf.point(x - m.at(0, dims=(1,)) * inv_n, name="y"))
    return p


def arguments(pipeline: kf.Pipeline, shape: tuple[int, ...]) -> dict:
    """Random inputs of ``shape`` (vectors along the last axis; torch tensors for two-byte
    floats) and the parameters (``inv_n`` one over what the statistics fold)."""
    import cupy
    import torch

    graph = pipeline.graph()
    grid = max((k.domain for k in graph.kernels), key=len)
    sizes = dict(zip(grid, shape, strict=True))
    rng = cupy.random.default_rng(0)
    given: dict = {}
    for name in graph.inputs:
        buffer = graph.buffers[name]
        dims = tuple(sizes[symbol] for symbol in buffer.shape)
        if buffer.dtype == "bool":
            given[name] = rng.random(dims, dtype=cupy.float32) > 0.1
        elif buffer.dtype in ("float16", "bfloat16"):
            given[name] = torch.randn(dims, device="cuda", dtype=getattr(torch, buffer.dtype))
        else:
            given[name] = rng.standard_normal(dims, dtype=cupy.float32)
    folded = {"batchnorm": shape[0] * shape[-1], "batch_centre": shape[0],
              "batch_of_rows": shape[0]}.get(pipeline.graph().name, shape[-1])
    for name in graph.params:
        given[name] = 1.0 / folded if name == "inv_n" else 0.7
    return given


def time_cases(names: list[str], bandwidth: float) -> None:
    from kfuse.bench.torch_baseline import compiled_on
    from kfuse.tune.timing import print_rounds, time_alternating

    for name in names:
        pipeline = CASES[name]()
        shape = SHAPES.get(name, MATRIX)
        given = arguments(pipeline, shape)
        fused = pipeline.compile(backend="cuda")
        apart = pipeline.compile(backend="cuda", plan="unfused")
        results = fused(**given)
        moved = sum(value.nbytes for value in (*given.values(), *results.values())
                    if hasattr(value, "nbytes"))
        launches = [line.strip() for line in fused.explain().splitlines() if "launch" in line]
        print(f"== {name} {shape}: floor {moved / bandwidth * 1e3:.4f} ms; {launches}",
              flush=True)
        runs = {"kfuse": lambda fused=fused, given=given: fused(**given),
                "unfused": lambda apart=apart, given=given: apart(**given),
                "compile": compiled_on(pipeline.graph(), given)}
        print_rounds(name, time_alternating(runs, 3, repeat=20), "kfuse")


def largest_difference(a, b) -> float:
    """max |a - b| of two CuPy arrays or two torch tensors (bfloat16 ones have no CuPy
    view)."""
    if hasattr(a, "float"):
        return float((a.float() - b.float()).abs().max())
    import cupy
    return float(cupy.abs(a - b).max())


def sweep(kind: str) -> None:
    """Forms of one group named by hand, each checked against the planned program."""
    from kfuse.tune.timing import print_rounds, time_alternating

    if kind == "columns":
        tall = [f"{form}:r1:i1:w:shuffle:{unroll}:hc" for form, unroll in (
            ("8x64", "u8"), ("4x64", "u8"), ("4x128", "u8"), ("4x64", "u16"), ("2x128", "u8"),
            ("8x32", "u16"), ("16x32", "u8"), ("8x64", "u4"), ("8x128", "u4"))]
        few = [f"{form}:r1:i1:w:shuffle:{unroll}:hc" for form, unroll in (
            ("32x8", "u1"), ("16x8", "u1"), ("8x8", "u1"), ("32x4", "u2"), ("32x2", "u4"),
            ("32x1", "u8"), ("16x4", "u2"))]
        cases = [(column_l2norm(), MATRIX, tall),
                 (get_app("colstandardise").build(), MATRIX, tall),
                 (column_softmax(), MATRIX, tall[:6]),
                 (batch_of_rows(), (8, 1 << 23), few)]
    elif kind == "halves":  # rows of 4096 two-byte floats, in segments from L2
        rows = MATRIX[0]
        forms = [f"{t}x1:r1:i1:w:stream:g{rows}:u{u}:hr:sg" for t, u in (
            (128, 2), (128, 1), (256, 1), (256, 2), (512, 1))]
        cases = [(layernorm_bfloat16(), MATRIX, forms)]
        cases += [(get_app(name).build(dtype=dtype), MATRIX, forms)
                  for name in ("rmsnorm", "layernorm", "logsoftmax", "crossentropy")
                  for dtype in ("float16", "bfloat16")]
    else:
        rows = MATRIX[0]
        forms = [f"{t}x1:r1:i1:w:stream:g{rows}:u{u}:hr:sg" for t, u in (
            (256, 2), (512, 1), (256, 1), (128, 2), (1024, 1))]
        forms += [f"{t}x1:r1:i1:w:stream:g{rows}:u{u}:hr" for t, u in (
            (512, 2), (1024, 1), (128, 8))]
        cases = [(get_app(name).build(), MATRIX, forms)
                 for name in ("rmsnorm", "layernorm", "logsoftmax")]
        cases += [(softmax_temperature(), MATRIX, forms), (absmax_quantise(), MATRIX, forms)]
    for pipeline, shape, forms in cases:
        given = arguments(pipeline, shape)
        members = tuple(k.name for k in pipeline.graph().kernels)
        runs = {"planned": pipeline.compile(backend="cuda")}
        want = runs["planned"](**given)
        for form in forms:
            compiled = pipeline.compile(backend="cuda", plan=pipeline.fuse(
                [members], forms=[f"mapreduce:{form}"]))
            try:
                got = compiled(**given)
            except KfuseError as error:
                print(f"  {form}: {error}")
                continue
            error = max(largest_difference(got[key], want[key]) for key in want)
            if error > 1e-3:
                print(f"  {form}: differs from the planned program by {error:.3g}")
            runs[form] = compiled
        labels = {label: (lambda run=run, given=given: run(**given))
                  for label, run in runs.items()}
        print_rounds(pipeline.graph().name, time_alternating(labels, 3, repeat=20), "planned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", default=list(CASES))
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="bytes per second (default: the calibrated profile's copy)")
    parser.add_argument("--sweep", choices=("columns", "rows", "halves"))
    args = parser.parse_args()
    if args.sweep:
        sweep(args.sweep)
        return
    from kfuse.model.device import current_profile
    time_cases(args.cases, args.bandwidth or current_profile().copy_bandwidth_bytes_per_s)


if __name__ == "__main__":
    main()
