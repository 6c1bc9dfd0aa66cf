"""BLAS-1/2 fusion (Filipovič et al. 2015): DSL operators, fusibility, map-reduce code, the implementation
space, and the eleven sequences of Table 1 on the cpu backend against float64 references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors, relative_error
from kfuse.codegen import generate
from kfuse.codegen.barriers import (
    Routine,
    SharedAccess,
    SharedElement,
    barrier_reason,
    place_barriers,
)
from kfuse.errors import FusionError, ShapeError
from kfuse.fusion.legality import group_violations, rule_same_nesting_depth
from kfuse.fusion.mapreduce import MapReduceGroup, claims
from kfuse.fusion.plan import check_groups
from kfuse.runtime import get_backend
from kfuse.schedule.forms import MapReduceVariant
from kfuse.search.variants import (
    MAP_VARIANTS,
    MEASURED_FORM_CREDIT,
    RANK_RESOLUTION,
    ImplementationSpace,
    covers,
    enumerate_variants,
    fusible_groups,
    group_variants,
    prune_variants,
)
from kfuse.tune.autotune import autotune

BLAS = [app.name for app in list_apps("blas")]
TABLE_1 = ["axpydot", "atax", "bicgk", "sgemv", "sgemvt", "sscal", "gemver", "gesummv", "madd",
           "vadd", "waxpby"]


def cpu_or_skip():
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def random_size(app, rng: np.random.Generator, aligned: bool) -> tuple[int, ...]:
    """Non-square, not a multiple of 32; ``aligned``: rows a multiple of 4 (16-byte path)."""
    def draw(low: int, high: int) -> int:
        while True:
            n = int(rng.integers(low, high))
            if n % 32 and (n % 4 == 0) == aligned:
                return n
    if app.ndim == 1:
        return (draw(1500, 7000),)
    rows = draw(33, 90)  # (held rows of 1024 threads: a block per row on the cpu backend)
    while True:
        cols = draw(33, 300)
        if cols != rows:
            return (rows, cols)


def check(app, plan, size, seed: int = 0) -> None:
    pipeline = app.build()
    arrays, params = app.make_inputs(size, np.random.default_rng(seed), "float32")
    outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
    errors = reference_errors(app, arrays, params, outputs)
    assert max(errors.values()) <= app.tolerance, (app.name, size, errors)


# ---------------------------------------------------------------------------------------------
# The eleven sequences
# ---------------------------------------------------------------------------------------------

def test_table_1_is_registered():
    assert BLAS == TABLE_1
    assert [a.name for a in list_apps()] == ["harris", "shi_tomasi", "sobel", "unsharp",
                                             "enhance", "night", "diffusion3d", "levels"]
    assert [a.name for a in list_apps("blas")] == TABLE_1
    for name in TABLE_1:
        app = get_app(name)
        assert app.family == "blas" and app.operations and app.reference
        assert len(app.test_size) == len(app.bench_size) == app.ndim
        assert all(n % 32 for n in app.test_size)
    assert get_app("bicgk").bench_size == (16384, 16384)
    assert get_app("axpydot").bench_size == (2**27,)


@pytest.mark.parametrize("name", TABLE_1)
def test_sequence_matches_reference_fused_and_unfused(name):
    """The predicted-best plan at the benchmark size (what the GPU runs) and the unfused
    program, on random non-square sizes that are not multiples of 32, both alignments."""
    cpu_or_skip()
    app = get_app(name)
    graph = app.build().graph()
    fused = app.planner(graph, app.sizes(graph, app.bench_size))
    rng = np.random.default_rng(TABLE_1.index(name))
    for aligned in (False, True):
        size = random_size(app, rng, aligned)
        check(app, "unfused", size)
        check(app, fused, size, seed=1)


def test_fusions_the_paper_expects():
    """BiCGK reads A once; GEMVER makes three passes; SGEMVT cannot fuse (F2); SGEMV and
    GESUMMV fuse their elementwise epilogue into the row reduction (whole rows); ATAX reads A
    once, its blocks holding whole rows (the row's A x feeds Aᵀ t at that row)."""
    expected = {
        "sgemv": [["z_prod", "z"]],
        "bicgk": [["q", "s"]],
        "axpydot": [["z", "r"]],
        "vadd": [["wy", "x"]],
        "waxpby": [["by", "w"]],
        "gemver": [["B", "x_prod"], ["x"], ["w"]],
        "atax": [["t", "y"]],
        "gesummv": [["Ax", "Bx", "y"]],
    }
    for name, groups in expected.items():
        app = get_app(name)
        graph = app.build().graph()
        plan = app.planner(graph, app.sizes(graph, app.bench_size))
        assert [list(g.members) for g in plan.groups] == groups, name


def test_default_plan_of_a_users_blas_pipeline_reads_the_matrix_once():
    """plan="auto" (and Pipeline.plan()) of a pipeline of maps and reductions is Filipovič et al. 2015's
    predicted-best implementation: BiCGK written by hand shares one pass over A (the greedy
    search alone keeps the two products apart); image pipelines keep the greedy search."""
    cpu_or_skip()
    from kfuse.search import is_map_reduce_graph

    p = kf.Pipeline("my_bicgk")
    a = p.input("A", ndim=2)
    x = p.input("p", ndim=1)
    r = p.input("r", ndim=1)
    p.output(a @ x, a.T @ r)
    graph = p.graph()
    assert is_map_reduce_graph(graph)
    assert not is_map_reduce_graph(get_app("harris").build().graph())
    plan = p.plan(sizes=graph.bind_shapes({"A": (45, 37), "p": (37,), "r": (45,)}))
    assert plan.strategy == "variants" and [sorted(g.members) for g in plan.groups] == [
        sorted(k.name for k in graph.kernels)]
    assert len(p.plan(strategy="greedy").groups) == 2  # what the default used to run
    rng = np.random.default_rng(2)
    matrix = rng.standard_normal((45, 37)).astype(np.float32)
    vector_p = rng.standard_normal(37).astype(np.float32)
    vector_r = rng.standard_normal(45).astype(np.float32)
    out = p.run(backend="cpu", A=matrix, p=vector_p, r=vector_r)
    for name, expected in ((graph.outputs[0], matrix.astype(np.float64) @ vector_p),
                           (graph.outputs[1], matrix.T.astype(np.float64) @ vector_r)):
        assert relative_error(out[name], expected) <= 1e-5


@pytest.mark.parametrize("name", TABLE_1)
def test_fused_traffic_is_table_3(name):
    """DRAM words of the predicted-best plan equal Filipovič et al. 2015's fused words (vectors aside);
    ATAX's held rows read A once where Filipovič et al. 2015 reads it twice."""
    app = get_app(name)
    graph = app.build().graph()
    space = ImplementationSpace(graph, app.sizes(graph, app.bench_size))
    best = space.best()
    words = sum(choice.prediction.dram_bytes for choice in best.choices) / 4
    expected = app.words(app.bench_size)
    if name == "atax":
        rows, cols = app.bench_size
        expected = rows * cols + rows + cols  # A once, x read, y written
    assert expected <= words <= expected * 1.01, (words, expected)


# ---------------------------------------------------------------------------------------------
# DSL
# ---------------------------------------------------------------------------------------------

def test_matvec_is_a_nested_map_reduce():
    p = kf.Pipeline("mv")
    a = p.input("A", ndim=2)
    x = p.input("x", ndim=1)
    r = p.input("r", ndim=1)
    q = a @ x
    s = a.T @ r
    p.output(q, s)
    graph = p.graph()
    qk, sk = graph.kernels
    assert (qk.name, sk.name) == ("q", "s")
    assert qk.domain == sk.domain == graph.buffers["A"].shape
    assert qk.reduction.axes == (1,) and sk.reduction.axes == (0,)
    assert {a.buffer: a.dims for a in qk.accesses} == {"A": (0, 1), "x": (1,)}
    assert {a.buffer: a.dims for a in sk.accesses} == {"A": (0, 1), "r": (0,)}
    assert graph.buffers["x"].shape == (graph.buffers["A"].shape[1],)
    assert graph.buffers["s"].shape == (graph.buffers["A"].shape[1],)
    assert "test_blas.py" in qk.where


def test_level_1_and_rank_1_operators_compute_numpy():
    p = kf.Pipeline("ops")
    a = p.input("A", ndim=2)
    u = p.input("u", shape=(a.shape[0],))
    v = p.input("v", shape=(a.shape[1],))
    alpha = p.param("alpha")
    b = kf.ger(a, u, v, alpha, name="b")
    c = kf.point(a + kf.outer(u, v), name="c")
    d = kf.geam(2.0, a, -1.0, b, name="d")
    n = kf.nrm2(u, name="n")
    scaled = kf.scal(alpha, u, name="scaled")
    t = kf.dot(scaled, u, name="t")
    w = kf.axpby(alpha, v, 0.5, v, name="w")
    g = kf.gemv(a, v, alpha, 0.5, u, name="g")
    h = kf.matvec_t(a, u, name="h")
    p.output(b, c, d, n, t, w, g, h)
    rng = np.random.default_rng(0)
    A, U, V = rng.random((5, 7)), rng.random(5), rng.random(7)
    out = p.run(backend="numpy", A=A.astype(np.float32), u=U.astype(np.float32),
                v=V.astype(np.float32), alpha=0.5)
    expected = {"b": A + 0.5 * np.outer(U, V), "c": A + np.outer(U, V),
                "d": 2 * A - (A + 0.5 * np.outer(U, V)), "n": np.linalg.norm(U),
                "t": 0.5 * U @ U, "w": V, "g": 0.5 * A @ V + 0.5 * U, "h": A.T @ U}
    for name, value in expected.items():
        # (the numpy backend returns a 0-d point kernel's value with shape (1,))
        assert relative_error(np.reshape(out[name], np.shape(value)), value) < 1e-6, name
    names = [k.name for k in p.graph().kernels]
    assert "n_ss" in names and "g_prod" in names


def test_dsl_errors_name_the_operator_and_line():
    p = kf.Pipeline("bad")
    a = p.input("A", ndim=2)
    x = p.input("x", ndim=1)
    with pytest.raises(ShapeError) as caught:
        kf.dot(a, x, name="d")
    assert "operator 'd'" in str(caught.value) and "test_blas.py" in str(caught.value)
    assert "must be a vector" in str(caught.value)
    with pytest.raises(ShapeError, match="needs a matrix"):
        x @ x  # noqa: B018
    with pytest.raises(ShapeError, match="must be a matrix"):
        kf.matvec(x, x)
    with pytest.raises(kf.DslError, match="offset"):
        kf.matvec(a.at(1, 0, boundary="clamp"), x)


# ---------------------------------------------------------------------------------------------
# Fusibility (Filipovič et al. 2015 F1-F5)
# ---------------------------------------------------------------------------------------------

def test_reduction_consumed_in_its_own_kernel_is_refused_with_the_reason():
    pipeline = get_app("atax").build()
    with pytest.raises(FusionError) as caught:
        pipeline.fuse([["t", "y"]])
    text = str(caught.value)
    assert "no_reduction_consumed_inside" in text
    assert "'y' reads the reduction 't'" in text and "global barrier" in text
    assert "test_blas.py" in text  # the user's line that asked for it
    graph = get_app("sgemvt").build().graph()
    reasons = [v.rule for v in group_violations(graph, ["x_prod", "x", "w"])]
    assert "no_reduction_consumed_inside" in reasons


def test_sibling_reductions_fuse_only_in_map_reduce_groups():
    graph = get_app("bicgk").build().graph()
    assert group_violations(graph, ["q", "s"]) == []
    p = kf.Pipeline("sib")
    x = p.input("x", ndim=1)
    blur = kf.local(x.at(-1) + x.at(1), name="blur")
    a = kf.reduce_sum(blur, name="a")
    b = kf.reduce_max(blur, name="b")
    p.output(a, b)
    (violation, *_) = group_violations(p.graph(), ["blur", "a", "b"])
    assert violation.rule == "reductions_fusible" and "stencil" in violation.reason
    assert group_violations(p.graph(), ["blur", "a"]) == []


def test_different_nesting_depth_is_never_fused():
    graph = get_app("gemver").build().graph()
    assert "nesting depth" in rule_same_nesting_depth(graph, ["x", "w"])
    assert check_groups(graph, [["B", "x_prod", "x"], ["w"]])


def test_fusible_groups_and_covers_of_bicgk():
    graph = get_app("bicgk").build().graph()
    assert fusible_groups(graph) == [("q",), ("s",), ("q", "s")]
    assert sorted(covers(graph, fusible_groups(graph))) == [(("q",), ("s",)), (("q", "s"),)]
    gemver = get_app("gemver").build().graph()
    groups = fusible_groups(gemver)
    assert groups == [("B",), ("x_prod",), ("x",), ("w",), ("B", "x_prod"), ("x_prod", "x"),
                      ("B", "x_prod", "x")]
    # (B, w) is not convex (the path B -> x_prod -> x -> w leaves it); x_prod -> x only as a
    # column epilogue (whole-column variants); x -> w never (F2: w reads all of x)


# ---------------------------------------------------------------------------------------------
# Code generation
# ---------------------------------------------------------------------------------------------

def bicgk_source(variant: str) -> str:
    graph = get_app("bicgk").build().graph()
    return generate(graph, [(("q", "s"), ("q", "s"), variant)]).source


def test_bicgk_reads_a_once_with_16_byte_loads():
    source = bicgk_source("mapreduce:32x8:r4:i8:w:shuffle")
    assert "KF_KERNEL void __launch_bounds__(256) bicgk_q_s(" in source
    # A read once per tile pass: straight 16-byte loads where the block's whole column tile
    # is inside and aligned, masked loads otherwise (the same for the whole block)
    assert source.count("kf_mr_load<4>(A + ") == 2
    assert "kf_mr_load<4>(A + (kf_index_t)iy * n_A_1 + ix, 4, true, kf_ld_A[kf_k]);" in source
    assert "const bool kf_full = kf_vec && (kf_bx + 1) * 128 <= n_A_1;" in source
    assert "kf_mr_warp_reduce<0, float>" in source and "kf_atomic_sum(&s[jx], kf_sum_s);" in source
    assert "(n_A_1 % 4 == 0) && kf_pointer_aligned(A, 16)" in source  # scalar fallback otherwise
    assert source.count("kfuse prelude: shared by every generated kernel") == 1


def test_smem_variant_pads_the_tile_and_places_barriers_by_rule():
    source = bicgk_source("mapreduce:32x4:r8:i2:w:smem")
    assert "kf_tile_q + (kf_ty + kf_k * 4) * 132" in source  # 128 columns + 4 padding
    assert "__syncthreads();  // B1: reads 'tile_q'" in source
    assert "__syncthreads();  // B1: reads 'rowpart_q'" in source
    assert "__shared__ __align__(16) unsigned char kf_smem[" in source
    scalar = bicgk_source("mapreduce:32x8:r4:i1:s:smem")
    assert "* 33 + kf_tx * 1" in scalar  # one float of padding for scalar tiles


@pytest.mark.parametrize("variant", ["mapreduce:32x4:r8:i2:w:smem", "mapreduce:32x16:r2:i1:s:smem",
                                     "mapreduce:32x8:r1:i3:w:shuffle",
                                     "mapreduce:32x4:r4:i1:s:shuffle"])
def test_bicgk_variants_compute_the_reference(variant):
    cpu_or_skip()
    app = get_app("bicgk")
    graph = app.build().graph()
    program = generate(graph, [(("q", "s"), ("q", "s"), variant)])
    for size in ((67, 150), (97, 52), (5, 9), (37, 264)):  # (37, 264): full and masked tiles
        arrays, params = app.make_inputs(size, np.random.default_rng(2), "float32")
        out = get_backend("cpu").run(graph, arrays, program=program)
        reference = app.reference(arrays, params, None)
        for name in ("q", "s"):
            assert relative_error(out[name], reference[name]) <= 1e-5, (variant, size, name)


@pytest.mark.parametrize("variant", ["mapreduce:32x4:r2:i2:w:shuffle",
                                     "mapreduce:32x8:r4:i1:w:smem",
                                     "mapreduce:32x2:r1:i3:s:shuffle",
                                     "mapreduce:128x1:r1:i1:w:stream:g4:u3:hr"])
def test_every_matrix_form_folds_row_column_and_full_reductions_together(variant):
    """One group with a reduction of each kind (row, column, over everything) and a stored
    map: every form of the skeleton accumulates and combines each kind (odd sizes: masked
    tiles, rows past the end)."""
    cpu_or_skip()
    p = kf.Pipeline("kinds")
    a = p.input("A", ndim=2)
    x = p.input("x", shape=(a.shape[1],))
    r = p.input("r", shape=(a.shape[0],))
    scaled = kf.point(a * 0.5 - 0.25, name="scaled")
    q = kf.matvec(a, x, name="q")
    s = kf.matvec_t(a, r, name="s")
    total = kf.reduce_sum(a * a + 1.0, name="total")  # (elements past the end would add 1)
    p.output(scaled, q, s, total)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    program = generate(graph, [(members, members, variant)])
    rng = np.random.default_rng(5)
    for rows, cols in ((67, 150), (5, 9), (37, 264)):
        arrays = {"A": rng.standard_normal((rows, cols)).astype(np.float32),
                  "x": rng.standard_normal(cols).astype(np.float32),
                  "r": rng.standard_normal(rows).astype(np.float32)}
        out = get_backend("cpu").run(graph, arrays, program=program)
        matrix = arrays["A"].astype(np.float64)
        expected = {"scaled": matrix * 0.5 - 0.25, "q": matrix @ arrays["x"],
                    "s": matrix.T @ arrays["r"], "total": (matrix * matrix + 1).sum()}
        for name, value in expected.items():
            got = np.reshape(out[name], np.shape(value))
            assert relative_error(got, value) <= 1e-5, (variant, rows, cols, name)


@pytest.mark.parametrize("variant", ["mapreduce:128x1:r1:i2:w:shuffle:g3",
                                     "mapreduce:256x1:r1:i1:s:shuffle"])
def test_vector_variants_compute_the_reference(variant):
    """A persistent grid of 3 blocks looping over the chunks; scalar loads."""
    cpu_or_skip()
    app = get_app("axpydot")
    graph = app.build().graph()
    program = generate(graph, [(("z", "r"), ("z", "r"), variant)])
    assert program.launches[0].grid_size({"w.0": 10**6})[0] == (3 if "g3" in variant else 3907)
    for size in ((5001,), (3,)):
        arrays, params = app.make_inputs(size, np.random.default_rng(2), "float32")
        out = get_backend("cpu").run(graph, {**arrays, **params}, program=program)
        reference = app.reference(arrays, params, None)
        for name in ("z", "r"):
            assert relative_error(out[name], reference[name]) <= 1e-5, (variant, size, name)


def test_min_max_int_and_double_reductions():
    cpu_or_skip()
    p = kf.Pipeline("mixed")
    m = p.input("m", ndim=2, dtype="float64")
    k = p.input("k", shape=m.shape, dtype="int32")
    v = p.input("v", shape=(m.shape[1],), dtype="float64")
    lo = kf.reduce_min(m * kf.along(v, 1) + k, axis=1, name="lo")
    hi = kf.reduce_max(m - kf.along(v, 1), axis=0, name="hi")
    total = kf.reduce_sum(k, name="total")
    top = kf.reduce_max(k, axis=1, name="top")
    p.output(lo, hi, total, top)
    graph = p.graph()
    assert claims(graph, ["lo", "hi", "total", "top"])
    rng = np.random.default_rng(4)
    data = {"m": rng.normal(size=(37, 101)), "k": rng.integers(-50, 50, (37, 101)).astype(np.int32),
            "v": rng.normal(size=101)}
    plan = p.fuse([["lo", "hi", "total", "top"]])
    out = get_backend("cpu").run(graph, data, plan=plan)
    np.testing.assert_allclose(out["lo"], (data["m"] * data["v"] + data["k"]).min(axis=1))
    np.testing.assert_allclose(out["hi"], (data["m"] - data["v"]).max(axis=0))
    assert out["total"] == data["k"].sum() and (out["top"] == data["k"].max(axis=1)).all()


def test_generated_map_reduce_code_is_valid_cuda(nvcc_figures):
    from kfuse.codegen.resources import kernel_resources, nvcc_available
    if not nvcc_available():
        pytest.skip("nvcc is not on PATH")
    for variant in ("mapreduce:32x4:r8:i8:w:smem", "mapreduce:32x8:r4:i8:w:shuffle"):
        figures = kernel_resources(bicgk_source(variant))
        assert figures["bicgk_q_s"].spill_store_bytes == 0
        assert figures["bicgk_q_s"].stack_bytes == 0  # the 16-byte unions stay in registers
    graph = get_app("gemver").build().graph()
    plan = get_app("gemver").planner(graph, {s: 16384 for s in ("A.0", "A.1")})
    program = generate(graph, plan.kernel_groups)
    figures = kernel_resources(program.source)
    assert all(figures[launch.symbol].spill_store_bytes == 0 for launch in program.launches)


# ---------------------------------------------------------------------------------------------
# Barrier rules (Filipovič et al. 2015 §3.3)
# ---------------------------------------------------------------------------------------------

def test_barrier_rules_b1_and_b2():
    tile = SharedElement("tile", 0, 1024)
    part = SharedElement("part", 1024, 128)
    other = SharedElement("other", 512, 1024)
    stage = Routine("stage", ["stage();"], (SharedAccess(tile, True, "column"),))
    same = Routine("same", ["same();"], (SharedAccess(tile, False, "column"),))
    rows = Routine("rows", ["rows();"], (SharedAccess(tile, False, "row"),
                                         SharedAccess(part, True, "row")))
    reuse = Routine("reuse", ["reuse();"], (SharedAccess(other, True, "column"),))
    assert barrier_reason(same, [("stage", stage.accesses[0])]) is None  # same mapping
    assert barrier_reason(rows, [("stage", stage.accesses[0])]).startswith("B1")
    assert barrier_reason(reuse, [("rows", rows.accesses[0])]).startswith("B2")
    lines, state = place_barriers([stage, rows, reuse])
    assert lines == ["stage();", "__syncthreads();  // B1: reads 'tile' written by 'stage' with "
                     "another thread-to-data mapping", "rows();",
                     "__syncthreads();  // B2: writes 'other' over 'tile', accessed by 'rows' "
                     "since the last barrier", "reuse();"]
    # in a loop, the next iteration's staging must wait for this iteration's row sums
    lines, _ = place_barriers([stage, rows], loop=True)
    assert lines[0].startswith("__syncthreads();  // B2")


# ---------------------------------------------------------------------------------------------
# The implementation space (Filipovič et al. 2015 §4)
# ---------------------------------------------------------------------------------------------

def test_variant_text_round_trip_and_errors():
    variant = MapReduceVariant((32, 8), 4, 16, True, "smem", ("q", "w"))
    assert variant.text() == "mapreduce:32x8:r4:i16:w:smem:o=q,w"
    assert MapReduceVariant.parse(variant.text()) == variant
    persistent = MapReduceVariant.parse("mapreduce:256x1:r1:i4:w:shuffle:g1056")
    assert persistent.blocks == 1056 and persistent.text().endswith(":g1056")
    for bad in ("mapreduce:32x8:r4", "mapreduce:axb:r4:i1:w:shuffle", "other:32x8:r1:i1:w:x"):
        with pytest.raises(FusionError):
            MapReduceVariant.parse(bad)
    with pytest.raises(FusionError, match="warps"):
        MapReduceVariant((48, 1))
    graph = get_app("bicgk").build().graph()
    with pytest.raises(FusionError, match="32 x N"):
        generate(graph, [(("q", "s"), ("q", "s"), "mapreduce:256x1:r1:i1:w:shuffle")])


def test_enumeration_prunes_duplicates_and_dominated_orders():
    graph = get_app("gesummv").build().graph()
    group = MapReduceGroup(graph, ["Ax", "Bx"], ["Ax", "Bx"])
    raw = enumerate_variants(group)
    kept = prune_variants(group, raw)
    smem_raw = [v for v in raw if v.rowsum == "smem"]
    smem_kept = [v for v in kept if v.rowsum == "smem"]
    assert {v.order for v in smem_raw} == {("Ax", "Bx"), ("Bx", "Ax")}
    assert len(smem_kept) == len(smem_raw) // 2  # equal on-chip memory: one order survives
    assert len({v.text() for v in kept}) == len(kept)
    assert all(group.shared_bytes(v) <= 48 * 1024 for v in kept)
    texts = group_variants(graph, ["Ax", "Bx"])
    assert len(texts) == len(kept) and "auto" not in texts  # the templates cannot run it
    assert "auto" in group_variants(graph, ["y"])  # a plain vector map: the templates can
    vector = get_app("vadd").build().graph()  # plain maps: MAP_VARIANTS and the templates
    assert len(group_variants(vector, ["wy", "x"])) == len(MAP_VARIANTS) + 1
    dot = get_app("axpydot").build().graph()  # a vector reduction: threads x iters x widths
    assert len(group_variants(dot, ["z", "r"])) == 3 * 5 * 2


def test_plain_maps_plan_the_narrowest_access_that_reaches_the_bytes_per_thread():
    """Plain maps' variants predict equal times (their blocks' fixed work is hidden); the
    narrowest access whose bytes over all inputs reach MAP_THREAD_BYTES ranks first, then
    the fewest threads: 8 bytes for VADD's three inputs and two (MADD, WAXPBY), 16 for
    SSCAL's one."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search.variants import MAP_THREAD_BYTES
    profile = h200_like_profile()
    expected = {"vadd": 8, "madd": 8, "waxpby": 8, "sscal": 16}
    for name, size in expected.items():
        app = get_app(name)
        graph = app.build().graph()
        space = ImplementationSpace(graph, app.sizes(graph, app.bench_size), profile)
        (choice,) = space.best().choices
        variant = MapReduceVariant.parse(choice.variant)
        assert (variant.threads, variant.vector_bytes) == ((128, 1), size), name
        members = choice.members
        times = {c.variant: c.prediction.time_s for c in space.choices(members)}
        assert times[choice.variant] == times["auto"], name  # a tie, broken by the bytes
        assert choice.prediction.thread_bytes >= MAP_THREAD_BYTES


@pytest.mark.parametrize("device_threads", [None, 256, 512])
def test_plain_maps_take_the_block_the_device_streamed_fastest_with(device_threads):
    """A calibrated profile's map_block_threads (the block its elementwise kernel ran fastest
    in) ranks first among the equal predictions; uncalibrated, the fewest threads."""
    import dataclasses

    from kfuse.model.device import h200_like_profile
    profile = dataclasses.replace(h200_like_profile(), map_block_threads=device_threads)
    for name, size in {"madd": 8, "sscal": 16}.items():
        app = get_app(name)
        graph = app.build().graph()
        space = ImplementationSpace(graph, app.sizes(graph, app.bench_size), profile)
        (choice,) = space.best().choices
        variant = MapReduceVariant.parse(choice.variant)
        assert (variant.threads, variant.vector_bytes) == ((device_threads or 128, 1), size)


H100_COPY = 3.02e12  # the copy bandwidth kfuse calibrate measures on an H100 (bytes/s)


@pytest.mark.parametrize(("forms", "copy"), [
    (None, None), (((1, 1024, 16, 2), (2, 1024, 16, 2)), H100_COPY),
    (((1, 512, 8, 16), (2, 1024, 8, 8)), None)], ids=str)
def test_gemv_kernels_take_the_block_row_form_the_device_streamed_fastest_with(forms, copy):
    """A calibrated profile's row_block_forms (per matrices a row reads; an H100's and an
    H200's, with their copy bandwidths) decide among the block rows the model predicts
    within MEASURED_FORM_CREDIT; uncalibrated, the plans are the model's alone."""
    import dataclasses

    from kfuse.model.device import h200_like_profile
    profile = dataclasses.replace(h200_like_profile(), row_block_forms=forms)
    if copy:
        profile = dataclasses.replace(profile, copy_bandwidth_bytes_per_s=copy)
    planned = {}
    for name in ("sgemv", "gesummv", "sgemvt"):
        app = get_app(name)
        graph = app.build().graph()
        space = ImplementationSpace(graph, app.sizes(graph, app.bench_size), profile)
        planned[name] = space.best().choices[-1].variant
    expected = {
        None: ("mapreduce:512x1:r1:i1:w8:stream:u16", "mapreduce:1024x1:r1:i1:w8:stream:u8"),
        1024: ("mapreduce:1024x1:r1:i1:w:stream:u2", "mapreduce:1024x1:r1:i1:w:stream:u2"),
        512: ("mapreduce:512x1:r1:i1:w8:stream:u16", "mapreduce:1024x1:r1:i1:w8:stream:u8"),
    }[forms and forms[0][1]]
    assert (planned["sgemv"], planned["gesummv"]) == expected
    assert planned["sgemvt"] == planned["sgemv"]  # its second kernel is SGEMV's GEMV
    space = ImplementationSpace(get_app("sgemv").build().graph(), {"A.0": 16384, "A.1": 16384},
                                profile)
    ranked = {c.variant: c.prediction for c in space.choices(("z_prod", "z"))}
    first = ranked[expected[0]]
    assert (first.device_form == 0.0) == bool(forms)  # the measured form itself
    assert all(p.time_s >= first.time_s / (1 + MEASURED_FORM_CREDIT) * (1 - RANK_RESOLUTION)
               for p in ranked.values())


def test_named_variants_of_plain_maps_are_honoured():
    """A plan naming a map-reduce variant for a group of plain maps runs that variant (the
    general templates only under ``auto``)."""
    graph = get_app("vadd").build().graph()
    sources = {variant: generate(graph, [(("wy", "x"), ("x",), variant)]).source
               for variant in ("auto", "mapreduce:128x1:r1:i1:w8:shuffle",
                               "mapreduce:256x1:r1:i4:w:shuffle:g1056")}
    assert len(set(sources.values())) == 3
    assert "kf_mr_load<2>" in sources["mapreduce:128x1:r1:i1:w8:shuffle"]
    assert "kf_mr_load" not in sources["auto"]


def test_combinations_are_ranked_best_first_and_counted():
    app = get_app("axpydot")
    graph = app.build().graph()
    space = ImplementationSpace(graph, app.sizes(graph, app.bench_size))
    everything = []
    for cover in space.covers():
        for pick in itertools.product(*(space.choices(g) for g in cover)):
            everything.append(sum(c.prediction.time_s for c in pick))
    assert space.count() == len(everything)
    ranked = space.ranked(25)
    # best first to the model's resolution: equal within RANK_RESOLUTION per group
    slack = (1 + RANK_RESOLUTION) ** max(len(cover) for cover in space.covers())
    assert [i.ranked_s for i in ranked] == sorted(i.ranked_s for i in ranked)
    assert all(i.ranked_s <= i.predicted_s <= i.ranked_s * slack for i in ranked)
    assert max(i.predicted_s for i in ranked) <= sorted(everything)[24] * slack
    assert space.best().predicted_s <= min(everything) * slack


def test_prediction_prefers_reading_the_matrix_once():
    app = get_app("bicgk")
    graph = app.build().graph()
    space = ImplementationSpace(graph, app.sizes(graph, app.bench_size))
    fused = space.choices(("q", "s"))[0].prediction
    apart = [space.choices((n,))[0].prediction for n in ("q", "s")]
    assert fused.dram_bytes == pytest.approx(16384 * 16384 * 4, rel=1e-3)
    assert fused.time_s < 0.6 * sum(p.time_s for p in apart)
    worst = space.choices(("q", "s"))[-1].prediction
    assert worst.time_s > fused.time_s  # the ranking means something


def test_autotune_times_the_top_implementations():
    cpu_or_skip()
    app = get_app("waxpby")
    graph = app.build().graph()
    arrays, params = app.make_inputs((3001,), np.random.default_rng(0), "float32")
    result = autotune(graph, {**arrays, **params}, 2, backend="cpu", warmup=0, repeat=1,
                      per_group=False)
    assert [m.rank for m in result.measured] == [1, 2]
    assert all(m.measured_s > 0 for m in result.measured)
    assert result.count > 2 and result.plan.strategy == "variants"
    assert result.plan.groups[0].variant == result.best.implementation.choices[0].variant
    check(app, result.plan, (3001,))


def test_autotune_compares_implementations_on_the_same_buffers(monkeypatch):
    """Every candidate runs on the first one's buffers (one allocation; where an output lies
    moves a streaming kernel's time), each timed in alternating rounds."""
    cpu_or_skip()
    from kfuse.runtime.cpu_backend import CpuExecutable

    allocations, timed = [], []
    allocate = CpuExecutable.allocate
    monkeypatch.setattr(CpuExecutable, "allocate",
                        lambda self: (allocations.append(self), allocate(self))[1])
    import kfuse.tune.timing as timing

    def clock(function, warmup=0, repeat=1):
        timed.append(function)
        function()
        return timing.Timing(1e-3, 1e-3, 0.0, 0.0, 1)

    monkeypatch.setattr(timing, "time_host", clock)
    app = get_app("sgemvt")
    graph = app.build().graph()
    arrays, params = app.make_inputs((9, 45), np.random.default_rng(0), "float32")
    result = autotune(graph, {**arrays, **params}, 3, backend="cpu", rounds=2)
    assert len(allocations) == 1 and len(result.measured) >= 3
    first_round = timed[:3]
    assert timed[3:6] == first_round  # the three best-predicted, in turn, twice
    check(app, result.plan, (9, 45))
    with pytest.raises(ValueError, match="same graph"):
        get_backend("cpu").prepare(app.build().graph(), {**arrays, **params},
                                   buffers_of=allocations[0])


def test_autotune_per_group_keeps_each_groups_fastest_variant(monkeypatch):
    """Each group's k best variants are timed on their own and the fastest kept; the
    assembled combination (rank 0) wins only if it is timed fastest whole. A fake clock makes
    every later measurement faster, so the last option of each group must win."""
    cpu_or_skip()
    import kfuse.tune.timing as timing

    calls = []

    def clock(function, warmup=0, repeat=1):
        function()
        calls.append(function)
        return timing.Timing(1.0 / len(calls), 1.0 / len(calls), 0.0, 0.0, 1)

    monkeypatch.setattr(timing, "time_host", clock)
    # (SGEMVT: two groups. GESUMMV and ATAX are one kernel each, so their per-group tuning
    # would time the same implementations as the whole-combination ranking)
    app = get_app("sgemvt")
    graph = app.build().graph()
    arrays, params = app.make_inputs((9, 45), np.random.default_rng(0), "float32")
    space = ImplementationSpace(graph, app.sizes(graph, (9, 45)))
    result = autotune(graph, {**arrays, **params}, 2, backend="cpu", warmup=0, repeat=1,
                      space=space)
    assert result.best.rank == 0 and [m.rank for m in result.measured] == [1, 2, 0]
    start = result.measured[1].implementation  # the fastest of the two whole ones
    for tuned, original in zip(result.best.implementation.choices, start.choices, strict=True):
        options = space.choices(original.members)[:2]
        if original not in options:
            options.append(original)
        assert tuned == (options[-1] if len(options) > 1 else original)
    check(app, result.plan, (9, 45))


# ---------------------------------------------------------------------------------------------
# Baselines and the command line
# ---------------------------------------------------------------------------------------------

def test_every_sequence_has_a_cublas_baseline():
    from kfuse.bench.cublas_baseline import SEQUENCES, has_sequence
    assert sorted(SEQUENCES) == sorted(TABLE_1)
    assert all(has_sequence(name) for name in TABLE_1) and not has_sequence("harris")


@pytest.mark.parametrize("name", ["bicgk", "gemver", "axpydot"])
def test_torch_translation_of_blas_ops(name):
    torch = pytest.importorskip("torch")
    from kfuse.bench.torch_baseline import translate
    app = get_app(name)
    arrays, params = app.make_inputs(app.test_size, np.random.default_rng(0), "float32")
    out = translate(app.build().graph())(**{k: torch.from_numpy(v) for k, v in arrays.items()},
                                         **params)
    for key, value in app.reference(arrays, params, None).items():
        assert relative_error(out[key].numpy(), value) <= app.tolerance


def test_cli_runs_a_blas_app(capsys):
    import json

    from kfuse.cli.main import main
    cpu_or_skip()
    assert main(["run", "bicgk", "--backend", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verified"] and result["groups"] == [["q", "s"]]
    assert result["size"] == [75, 133]
    assert main(["apps"]) == 0
    assert "gemver" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# The stream mapping (warps walk along their rows: A x without column reductions)
# ---------------------------------------------------------------------------------------------

STREAM_GROUPS = [("gesummv", ("Ax", "Bx")), ("sgemv", ("z_prod",)), ("atax", ("t",)),
                 ("gemver", ("w",)), ("sgemvt", ("w",))]


def run_group_variant(name: str, members: tuple[str, ...], variant: str,
                      sizes: list[tuple[int, int]]) -> None:
    """The app with one group under ``variant`` (the others unfused) against the reference."""
    from kfuse.fusion.plan import group_outputs
    app = get_app(name)
    graph = app.build().graph()
    groups = [(members, group_outputs(graph, members), variant)]
    groups += [((k.name,), group_outputs(graph, (k.name,)), "auto") for k in graph.kernels
               if k.name not in members]
    from kfuse.fusion.plan import order_groups
    order = order_groups(graph, [g[0] for g in groups])  # (an executable order)
    groups.sort(key=lambda group: order.index(tuple(group[0])))
    program = generate(graph, groups)
    for size in sizes:
        arrays, params = app.make_inputs(size, np.random.default_rng(5), "float32")
        out = get_backend("cpu").run(graph, {**arrays, **params}, program=program)
        for key, value in app.reference(arrays, params, None).items():
            assert relative_error(out[key], value) <= 1e-5, (name, variant, size, key)


@pytest.mark.parametrize("variant", [
    "mapreduce:32x4:r2:i1:w:stream:u4",          # whole rows, two rows per warp
    "mapreduce:32x2:r3:i2:w:stream:u2:c256",     # spans, 3 rows, 2 row groups per block
    "mapreduce:32x4:r1:i1:s:stream:u3",          # scalar loads
    "mapreduce:32x8:r1:i3:w:stream:u1:c128",     # more warps than rows at small sizes
])
@pytest.mark.parametrize("name,members", STREAM_GROUPS)
def test_stream_variants_compute_the_reference(name, members, variant):
    """Odd sizes (masked tails, unaligned rows), rows a multiple of 4 with a tail step, and
    sizes with several whole 16-byte steps and a partial one."""
    cpu_or_skip()
    run_group_variant(name, members, variant,
                      [(67, 150), (5, 9), (33, 1031), (130, 516), (9, 1536)])


def test_stream_source_issues_every_load_of_a_step_first():
    graph = get_app("gesummv").build().graph()
    source = generate(graph, [(("Ax", "Bx"), ("Ax", "Bx"),
                               "mapreduce:32x4:r2:i1:w:stream:u4")]).source
    kernel = source[source.index("gesummv_Ax_Bx("):]
    assert "float kf_ld_A[2][4][4];" in kernel and "float kf_ld_B[2][4][4];" in kernel
    assert "kf_mr_load<4>(A + (kf_index_t)iy * n_A_1 + ix, kf_cols, true," in kernel
    assert "for (; kf_cs + 512 <= kf_c1; kf_cs += 512)" in kernel  # whole aligned steps
    # the warp owns whole rows: plain stores, no atomics, no fill of the outputs
    assert "Ax[kf_row0 + kf_k] = kf_part;" in kernel and "kf_atomic" not in kernel
    assert "__syncthreads" not in kernel and "kf_smem" not in kernel
    program = generate(graph, [(("Ax", "Bx"), ("Ax", "Bx"),
                                "mapreduce:32x4:r2:i1:w:stream:u4:c1000")])
    (launch,) = program.launches
    assert launch.grid_size({"A.0": 16384, "A.1": 16384}) == (2048, 16, 1)  # span 1024
    assert "kf_atomic_sum(&Ax[kf_row0 + kf_k], kf_part)" in program.source  # spans: atomics
    assert launch.initial_values == (("Ax", 0), ("Bx", 0))


def test_stream_mapping_is_refused_for_column_reductions_and_enumerated_without():
    graph = get_app("bicgk").build().graph()
    with pytest.raises(FusionError, match="cannot keep the column reductions"):
        generate(graph, [(("q", "s"), ("q", "s"), "mapreduce:32x4:r1:i1:w:stream:u4")])
    assert not any("stream" in v for v in group_variants(graph, ["q", "s"]))
    gesummv = get_app("gesummv").build().graph()
    streams = [v for v in group_variants(gesummv, ["Ax", "Bx"]) if "stream" in v]
    assert streams and all(MapReduceVariant.parse(v).rows * 2 <= 4 for v in streams)
    variant = MapReduceVariant.parse("mapreduce:32x8:r2:i1:w:stream:u4:c4096")
    assert (variant.unroll, variant.span) == (4, 4096)
    assert variant.text() == "mapreduce:32x8:r2:i1:w:stream:u4:c4096"
    with pytest.raises(FusionError, match="stream mapping"):
        MapReduceVariant((32, 8), 4, 1, True, "shuffle", (), 0, 2)
    group = MapReduceGroup(gesummv, ["Ax", "Bx"], ["Ax", "Bx"])
    assert group.normalize(MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:u4:c600")
                           ).span == 1024  # whole steps of 512 columns


def test_stream_mapping_with_stores_row_vectors_dots_and_other_types():
    """The guarded path: a stored map, a vector read along the rows, a dot, min/max, int and
    double (two elements per 16-byte load)."""
    cpu_or_skip()
    p = kf.Pipeline("streamed")
    m = p.input("m", ndim=2, dtype="float64")
    k = p.input("k", shape=m.shape, dtype="int32")
    v = p.input("v", shape=(m.shape[1],), dtype="float64")
    u = p.input("u", shape=(m.shape[0],), dtype="float64")
    scaled = kf.point(m * kf.along(v, 1) + kf.along(u, 0), name="scaled")
    lo = kf.reduce_min(scaled + k, axis=1, name="lo")
    total = kf.reduce_sum(scaled, name="total")
    top = kf.reduce_max(k, axis=1, name="top")
    p.output(scaled, lo, total, top)
    graph = p.graph()
    members = ("scaled", "lo", "total", "top")
    rng = np.random.default_rng(6)
    for variant in ("mapreduce:32x4:r2:i2:w:stream:u2", "mapreduce:32x2:r1:i1:s:stream:u3:c64"):
        program = generate(graph, [(members, members, variant)])
        for rows, cols in ((37, 101), (12, 260), (3, 5)):
            data = {"m": rng.normal(size=(rows, cols)),
                    "k": rng.integers(-50, 50, (rows, cols)).astype(np.int32),
                    "v": rng.normal(size=cols), "u": rng.normal(size=rows)}
            out = get_backend("cpu").run(graph, data, program=program)
            expected = data["m"] * data["v"] + data["u"][:, None]
            np.testing.assert_allclose(out["scaled"], expected, rtol=1e-12)
            np.testing.assert_allclose(out["lo"], (expected + data["k"]).min(axis=1),
                                       rtol=1e-12)
            np.testing.assert_allclose(out["total"], expected.sum(), rtol=1e-9, atol=1e-9)
            assert (out["top"] == data["k"].max(axis=1)).all()


# Whole rows stored plainly (no fill), persistent stream grids, the stream model's ranking
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [
    "mapreduce:32x4:r1:i1:w:stream:u8",          # whole rows: plain stores, no fill
    "mapreduce:32x8:r1:i1:w:stream:g3:u4",       # a persistent grid of 3 blocks
    "mapreduce:32x2:r3:i2:s:stream:g2:u2",       # persistent, 3 rows per warp, scalar loads
    "mapreduce:32x4:r1:i1:w:stream:g5:u2:c128",  # persistent with spans (atomics, a fill)
])
@pytest.mark.parametrize("name,members", [("gesummv", ("Ax", "Bx")), ("sgemv", ("z_prod",))])
def test_plain_stores_and_persistent_stream_grids_compute_the_reference(name, members,
                                                                        variant):
    """Odd, unaligned sizes; outputs start poisoned, so a row left unwritten shows."""
    cpu_or_skip()
    run_group_variant(name, members, variant,
                      [(67, 150), (5, 9), (33, 1031), (130, 517), (1, 3)])


# Block rows (T x 1 stream blocks) and 8-byte accesses: named variants
# ---------------------------------------------------------------------------------------------

EPILOGUE_GROUPS = [("sgemv", ("z_prod", "z")), ("gesummv", ("Ax", "Bx", "y"))]


@pytest.mark.parametrize("variant", [
    "mapreduce:64x1:r1:i1:w8:stream:u4",         # block rows, 8-byte loads, whole rows
    "mapreduce:128x1:r2:i2:w:stream:u2",         # two rows per block, two row groups
    "mapreduce:64x1:r1:i1:s:stream:u3:c256",     # scalar loads, column spans (atomics)
    "mapreduce:64x1:r1:i1:w8:stream:g3:u2",      # a persistent grid of 3 blocks
])
@pytest.mark.parametrize("name,members", STREAM_GROUPS + EPILOGUE_GROUPS)
def test_block_row_variants_compute_the_reference(name, members, variant):
    """A whole block per row: the row combined over the block's warps (thread 0 stores it),
    the columns past the whole steps one chunk at a time; odd and unaligned sizes, rows
    longer than a step, fewer rows than a persistent grid has blocks."""
    cpu_or_skip()
    if ":c" in variant and members in [m for _, m in EPILOGUE_GROUPS]:
        pytest.skip("an epilogue needs whole rows (covered by the legality tests)")
    run_group_variant(name, members, variant, [(67, 150), (5, 9), (33, 1031), (2, 1536)])


def test_block_row_source_and_variant_text():
    graph = get_app("sgemv").build().graph()
    variant = MapReduceVariant.parse("mapreduce:512x1:r1:i1:w8:stream:u16")
    assert (variant.threads, variant.vector_bytes, variant.block_rows) == ((512, 1), 8, True)
    assert variant.text() == "mapreduce:512x1:r1:i1:w8:stream:u16"
    assert MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:u4").vector_bytes == 16
    program = generate(graph, [(("z_prod", "z"), ("z",), variant.text())],
                       fixed_sizes={"A.0": 16384, "A.1": 16384})
    (launch,) = program.launches
    assert launch.block == (512, 1, 1)
    assert launch.grid_size({"A.0": 16384, "A.1": 16384}) == (16384, 1, 1)
    source = program.source[program.source.index("sgemv_z_prod_z("):]  # the kernel
    assert "kf_pointer_aligned(A, 8) && kf_pointer_aligned(x, 8)" in source  # 8-byte accesses
    assert "const int ix = kf_cs + (kf_u * 512 + kf_tx) * 2;" in source
    assert "kf_row_z_prod = kf_block_reduce<0, float>(kf_row_z_prod, 0.0f);" in source
    rest = source.index("the rest: one masked chunk")
    assert "#pragma unroll 1" in source[rest - 80:rest]  # the rest is not unrolled
    assert "kf_atomic" not in source  # the block owns whole rows: plain stores
    group = MapReduceGroup(graph, ["z_prod"], ["z_prod"])
    assert group.step(variant) == 512 * 2 * 16
    for bad, match in (("mapreduce:64x2:r1:i1:w:stream:u2", "T x 1"),
                       ("mapreduce:96x1:r1:i1:w:stream:u2", "power of two"),
                       ("mapreduce:64x1:r1:i1:w:shuffle", "32 x N")):
        with pytest.raises(FusionError, match=match):
            generate(graph, [(("z_prod",), ("z_prod",), bad)])
    for malformed in ("mapreduce:32x4:r1:i1:w4:stream:u2", "mapreduce:32x4:r1:i1:s8:stream"):
        with pytest.raises(FusionError, match="malformed"):
            MapReduceVariant.parse(malformed)


@pytest.mark.parametrize("variant", ["mapreduce:128x1:r1:i1:w8:shuffle",
                                     "mapreduce:64x1:r1:i3:w8:shuffle:g3"])
@pytest.mark.parametrize("name", ["madd", "vadd", "waxpby", "axpydot"])
def test_eight_byte_vector_kernels_compute_the_reference(name, variant):
    """Vector kernels with 8-byte loads and stores: odd sizes leave masked tails."""
    cpu_or_skip()
    from kfuse.fusion.plan import group_outputs
    app = get_app(name)
    graph = app.build().graph()
    members = tuple(k.name for k in graph.topological_kernels())
    program = generate(graph, [(members, group_outputs(graph, members), variant)])
    kernels = program.source.split("// Pipeline")[1]
    assert "kf_aligned(" in kernels and ", 8)" in kernels  # 8-byte accesses where aligned
    for size in ((67, 151), (5, 3)) if app.ndim == 2 else ((1031,), (7,)):
        arrays, params = app.make_inputs(size, np.random.default_rng(2), "float32")
        out = get_backend("cpu").run(graph, {**arrays, **params}, program=program)
        for key, value in app.reference(arrays, params, None).items():
            assert relative_error(out[key], value) <= 1e-5, (name, variant, size, key)


def test_block_rows_enumerated_in_their_measured_forms_and_predicted():
    """The space holds block rows of 512 or 1024 threads with 8- or 16-byte accesses and at most 16
    matrix loads per thread and step (other forms run and are predicted when named); the
    model charges the columns past the whole steps at one chunk in flight."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search.variants import (
        BLOCK_ROW_THREADS,
        BLOCK_ROW_VECTOR_BYTES,
        predict_variant,
    )
    profile = h200_like_profile()
    graph = get_app("sgemv").build().graph()
    blocks = [MapReduceVariant.parse(v) for v in group_variants(graph, ["z_prod"],
                                                                profile=profile)
              if v != "auto" and MapReduceVariant.parse(v).block_rows]
    assert {(v.threads[0], v.vector_bytes, v.unroll) for v in blocks} == {
        (threads, size, unroll) for threads in BLOCK_ROW_THREADS
        for size in BLOCK_ROW_VECTOR_BYTES for unroll in (2, 4, 8, 16)}
    assert all(v.whole_rows for v in blocks)
    # two matrices: at most 8 loads of each per step; GESUMMV plans 1024 threads x 8 (measured
    # 0.4698 ms against 0.4706 for 512 x 16 on an H200)
    gesummv = get_app("gesummv").build().graph()
    members = ("Ax", "Bx", "y")
    two = [MapReduceVariant.parse(v) for v in group_variants(gesummv, members, profile=profile)
           if MapReduceVariant.parse(v).block_rows]
    assert two and max(v.unroll for v in two) == 8
    space = ImplementationSpace(gesummv, {"A.0": 16384, "A.1": 16384}, profile)
    assert space.choices(members)[0].variant == "mapreduce:1024x1:r1:i1:w8:stream:u8"

    def seconds_per_byte(variant: str, cols: int) -> float:
        sizes = {"A.0": 16384, "A.1": cols}
        found = predict_variant(graph, ["z_prod"], ["z_prod"], variant, sizes, profile)
        return found.time_s / found.dram_bytes

    whole = "mapreduce:512x1:r1:i1:w8:stream:u16"  # a step of 16384 columns
    assert seconds_per_byte(whole, 16000) > 1.2 * seconds_per_byte(whole, 16384)
    warps = "mapreduce:32x4:r1:i1:w:stream:u16"  # the rest unrolled like the steps
    assert seconds_per_byte(warps, 16000) < 1.05 * seconds_per_byte(warps, 16384)


def test_whole_rows_need_no_fill_and_spans_do():
    graph = get_app("sgemv").build().graph()
    group = MapReduceGroup(graph, ["z_prod"], ["z_prod"])
    whole = MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:g264:u4")
    assert whole.blocks == 264 and group.normalize(whole).text() == whole.text()
    assert group.stored_rows(whole) and not group.atomic_reductions(whole)
    program = generate(graph, [(("z_prod",), ("z_prod",), whole.text())])
    (launch,) = program.launches
    assert launch.initial_values == ()
    assert launch.grid_size({"A.0": 16384, "A.1": 16384}) == (264, 1, 1)  # capped
    assert "z_prod[kf_row0 + kf_k] = kf_part;" in program.source
    spans = MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:u4:c4096")
    assert not group.stored_rows(spans)
    (launch,) = generate(graph, [(("z_prod",), ("z_prod",), spans.text())]).launches
    assert launch.initial_values == (("z_prod", 0),)
    with pytest.raises(FusionError, match="persistent grid"):
        group.normalize(MapReduceVariant.parse("mapreduce:32x4:r4:i8:w:shuffle:g100"))
    # a dot in a stream group still needs its fill (one atomic per block)
    p = kf.Pipeline("rows_and_dot")
    m = p.input("m", ndim=2)
    p.output(kf.reduce_sum(m, axis=1, name="rows"), kf.reduce_sum(m, name="total"))
    dot_graph = p.graph()
    both = MapReduceGroup(dot_graph, ["rows", "total"], ["rows", "total"])
    assert [r.kernel.name for r in both.atomic_reductions(whole)] == ["total"]


def test_stream_ranking_prefers_one_row_per_warp_and_no_fill():
    """At 16384^2 (H200-like profile) the stream model ranks one row per warp with more
    loads in flight above several rows per warp, and counts no fill for whole rows."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search.variants import predict_variant
    profile = h200_like_profile()
    for name, members in (("gesummv", ("Ax", "Bx")), ("sgemv", ("z_prod",))):
        app = get_app(name)
        graph = app.build().graph()
        sizes = app.sizes(graph, (16384, 16384))
        space = ImplementationSpace(graph, sizes, profile)
        best = MapReduceVariant.parse(space.choices(members)[0].variant)
        assert (best.rowsum, best.rows, best.span) == ("stream", 1, 0), best
        assert best.unroll >= 4
        if len(members) == 1:  # measured on an H200: r1:u16 0.2396 ms, r1:u8 0.2446 ms
            assert best.unroll == 16, best

        def time(variant: str, graph=graph, members=members, sizes=sizes) -> float:
            return predict_variant(graph, members, members, "mapreduce:" + variant, sizes,
                                   profile).time_s

        # measured: GESUMMV r2:u2 2% slower than r1:u8, SGEMV r4:u2 1.4% slower than r1:u4
        several = f"32x4:r{4 // len(members)}:i1:w:stream:u2"
        assert time("32x4:r1:i1:w:stream:u4") < time(several)
        spans = predict_variant(graph, members, members, "mapreduce:32x4:r1:i1:w:stream:u4:"
                                "c4096", sizes, profile)
        assert spans.launches == 1 + len(members) and spans.atomics > 0  # fills, atomics
        found = predict_variant(graph, members, members, "mapreduce:32x4:r1:i1:w:stream:u4",
                                sizes, profile)
        assert found.launches == 1 and found.atomics == 0


def test_tiles_storing_the_matrix_keep_at_most_sixteen_rows():
    """GEMVER's rank-1 update beside a column reduction: tiles of more than
    MAX_STORED_TILE_ROWS rows are not in the space (measured slow); groups storing no
    matrix keep their taller tiles."""
    from kfuse.search.variants import MAX_STORED_TILE_ROWS

    graph = get_app("gemver").build().graph()
    space = ImplementationSpace(graph, {s: 16384 for s in ("A.0", "A.1")})
    stored = [MapReduceVariant.parse(c.variant) for c in space.choices(("B", "x_prod"))]
    assert stored and all(v.threads[1] * v.rows <= MAX_STORED_TILE_ROWS for v in stored)
    alone = [MapReduceVariant.parse(c.variant) for c in space.choices(("x_prod",))
             if c.variant != "auto"]
    assert any(v.rowsum != "stream" and v.threads[1] * v.rows > MAX_STORED_TILE_ROWS
               for v in alone)


@pytest.mark.parametrize("offset", [0.0, 0.5, 0.9999])
def test_predictions_closer_than_the_resolution_rank_by_rows_then_loads(offset):
    """The model is not finer than RANK_RESOLUTION: within it fewer rows per warp and then
    more loads in flight win, wherever the predictions fall on the time axis (also astride
    a multiple of the resolution); beyond it the faster prediction wins."""
    from dataclasses import replace

    from kfuse.search.variants import GroupChoice, VariantPrediction, rank_choices

    def choice(variant: str, time_s: float) -> GroupChoice:
        prediction = VariantPrediction(time_s, 0.0, 0.0, 0.0, 0.0, 1.0, 1, 1, 0, 1, "memory")
        return GroupChoice(("z_prod",), ("z_prod",), "mapreduce:" + variant, prediction)

    start = (1 + RANK_RESOLUTION) ** (-3000 + offset)  # about 2.5 ms
    base = choice("32x4:r2:i1:w:stream:u8", start)
    close = start * (1 + RANK_RESOLUTION / 4)
    ranked = rank_choices([base, choice("32x4:r1:i1:w:stream:u8", close),
                           choice("32x4:r1:i1:w:stream:u16", close)])
    assert [c.variant.split(":")[2:] for c in ranked] == [
        ["r1", "i1", "w", "stream", "u16"], ["r1", "i1", "w", "stream", "u8"],
        ["r2", "i1", "w", "stream", "u8"]]
    slower = replace(ranked[0], prediction=replace(ranked[0].prediction,
                                                   time_s=start * (1 + 3 * RANK_RESOLUTION)))
    assert rank_choices([slower, base])[0] is base


# ---------------------------------------------------------------------------------------------
# Row-reduction epilogues: the warp owning whole rows goes on to the elementwise consumer
# ---------------------------------------------------------------------------------------------

EPILOGUE_GROUPS = [("sgemv", ("z_prod", "z")), ("gesummv", ("Ax", "Bx", "y")),
                   ("gesummv", ("Ax", "y"))]


@pytest.mark.parametrize("variant", [
    "mapreduce:32x8:r1:i1:w:stream:u8",          # the planner's kind of choice
    "mapreduce:32x4:r2:i1:w:stream:u4",          # two rows per warp
    "mapreduce:32x2:r3:i2:s:stream:g2:u2",       # persistent, 3 rows per warp, scalar loads
    "mapreduce:32x4:r1:i3:w:stream:u1",          # several row groups per block
])
@pytest.mark.parametrize("name,members", EPILOGUE_GROUPS)
def test_epilogue_variants_compute_the_reference(name, members, variant):
    """Odd and unaligned sizes (outputs start poisoned: a row left unwritten shows)."""
    cpu_or_skip()
    app = get_app(name)
    graph = app.build().graph()
    from kfuse.fusion.plan import group_outputs
    assert group_outputs(graph, members) == (members[-1],)  # no intermediate is stored
    run_group_variant(name, members, variant,
                      [(37, 45), (1, 3), (129, 7), (67, 150), (33, 1031), (8, 516)])


def test_epilogue_kernel_stores_only_the_epilogue_and_needs_no_fill():
    graph = get_app("sgemv").build().graph()
    program = generate(graph, [(("z_prod", "z"), ("z",), "mapreduce:32x8:r1:i1:w:stream:u8")])
    (launch,) = program.launches
    assert launch.initial_values == () and launch.operators == ("z_prod", "z")
    kernel = program.source[program.source.index("sgemv_z_prod_z("):]
    assert "z[iy] = (float)" in kernel and "z_prod[iy]" not in kernel
    assert "float* __restrict__ z_prod" not in kernel  # no intermediate buffer
    assert "kf_atomic" not in kernel and "y[iy]" in kernel
    # the reduction is also read outside the group: its row is stored too
    both = generate(graph, [(("z_prod", "z"), ("z_prod", "z"),
                             "mapreduce:32x8:r1:i1:w:stream:u8")]).source
    assert "z_prod[iy] = kf_row_z_prod;" in both
    # the variant text says nothing new: the group names the consumer; it round-trips
    text = "mapreduce:32x8:r1:i1:w:stream:u8"
    group = MapReduceGroup(graph, ["z_prod", "z"], ["z"])
    assert [k.name for k in group.epilogue] == ["z"] and group.stores == []
    assert group.normalize(MapReduceVariant.parse(text)).text() == text
    assert group.default_variant().rowsum == "stream" and not group.default_variant().span
    assert claims(graph, ["z_prod", "z"])


def test_epilogue_is_legal_only_under_a_whole_row_stream_variant():
    from kfuse.fusion.plan import make_plan
    graph = get_app("sgemv").build().graph()
    members = ["z_prod", "z"]
    # without a variant (every search but the BLAS implementation space): refused (F2)
    rules = [v.rule for v in group_violations(graph, members)]
    assert "no_reduction_consumed_inside" in rules
    text = next(str(v) for v in group_violations(graph, members)
                if v.rule == "no_reduction_consumed_inside")
    assert "global barrier" in text and "whole rows" in text
    assert group_violations(graph, members, "mapreduce:32x8:r1:i1:w:stream:u8") == []
    for variant, words in (("mapreduce:32x8:r1:i1:w:stream:u8:c4096", "column spans"),
                           ("mapreduce:32x8:r2:i16:w:shuffle", "atomics"),
                           ("mapreduce:32x8:r4:i8:w:smem", "atomics"),
                           ("registers", "not a map-reduce stream variant")):
        (violation,) = group_violations(graph, members, variant)
        assert violation.rule == "reduction_epilogue" and words in violation.reason
        assert "whole rows" in violation.reason
        with pytest.raises(FusionError, match="illegal fusion"):
            make_plan(graph, [members], variants={frozenset(members): variant})
        if variant.startswith("mapreduce"):
            with pytest.raises(FusionError, match="own kernel"):
                generate(graph, [(tuple(members), ("z",), variant)])
    with pytest.raises(FusionError, match="illegal fusion"):
        make_plan(graph, [members])
    plan = make_plan(graph, [members], check_resources=False,
                               variants={frozenset(members): "mapreduce:32x8:r1:i1:w:stream:u8"})
    assert plan.groups[0].variant == "mapreduce:32x8:r1:i1:w:stream:u8"


def test_epilogue_of_a_split_column_reduction_or_another_row_is_refused():
    stream = "mapreduce:32x8:r1:i1:w:stream:u8"
    # a column reduction (SGEMVT's x = beta A^T y + z) split over several blocks completes
    # only after every block: only whole columns may feed the epilogue
    sgemvt = get_app("sgemvt").build().graph()
    for variant in (stream, "mapreduce:32x8:r2:i16:w:shuffle", "single"):
        reasons = " ".join(str(v) for v in group_violations(sgemvt, ["x_prod", "x"], variant))
        assert "column reduction" in reasons and "whole-column" in reasons, variant
    assert "global barrier" in str(group_violations(sgemvt, ["x_prod", "x"],
                                                    "mapreduce:32x8:r2:i16:w:shuffle")[0])
    # ATAX: y = A^T t reduces over the rows (not an elementwise map over the reduced vector)
    atax = get_app("atax").build().graph()
    assert group_violations(atax, ["t", "y"], stream)
    # an epilogue reading the reduced vector at another row
    p = kf.Pipeline("shifted")
    a = p.input("A", ndim=2)
    x = p.input("x", shape=(a.shape[1],))
    r = kf.matvec(a, x, name="r")
    s = kf.point(r.at(1, boundary="clamp") + r, name="s")
    p.output(s)
    graph = p.graph()
    (violation, *_) = group_violations(graph, ["r", "s"], stream)
    assert "another row" in violation.reason
    assert ("r", "s") not in fusible_groups(graph)
    # a full reduction (a dot) never feeds its own kernel
    q = kf.Pipeline("dotted")
    m = q.input("m", ndim=2)
    total = kf.reduce_sum(m, name="total")
    q.output(kf.point(m * total, name="scaled"))
    dotted = q.graph()
    reasons = " ".join(str(v) for v in group_violations(dotted, ["total", "scaled"], stream))
    assert "full reduction" in reasons and "global barrier" in reasons


def test_epilogue_fusions_are_enumerated_and_predicted_one_launch_less():
    from kfuse.model.device import h200_like_profile
    profile = h200_like_profile()
    for name, fused, split in (("sgemv", ("z_prod", "z"), [("z_prod",), ("z",)]),
                               ("gesummv", ("Ax", "Bx", "y"), [("Ax", "Bx"), ("y",)])):
        app = get_app(name)
        graph = app.build().graph()
        assert fused in fusible_groups(graph)
        space = ImplementationSpace(graph, app.sizes(graph, (16384, 16384)), profile)
        choices = space.choices(fused)
        assert choices and all(
            MapReduceVariant.parse(c.variant).rowsum == "stream"
            and not MapReduceVariant.parse(c.variant).span for c in choices)
        best = choices[0].prediction
        apart = [space.choices(g)[0].prediction for g in split]
        assert best.launches == 1 and sum(p.launches for p in apart) == 2
        assert best.dram_bytes < sum(p.dram_bytes for p in apart)
        assert best.time_s < sum(p.time_s for p in apart)
        plan = space.best().plan(graph)
        assert [list(g.members) for g in plan.groups] == [list(fused)], name
        assert plan.groups[0].variant == choices[0].variant
    # the image apps' fusions are unchanged (no reduction feeds an epilogue there)
    harris = get_app("harris").build().graph()
    from kfuse.fusion.legality import is_epilogue_group
    names = [k.name for k in harris.kernels]
    assert not any(is_epilogue_group(harris, names[:k]) for k in range(2, len(names)))


# ---------------------------------------------------------------------------------------------
# Whole columns: a block walks every row of its columns (plain stores, column epilogues)
# ---------------------------------------------------------------------------------------------

WHOLE_COLUMN_GROUPS = [("sgemvt", ("x_prod", "x")), ("sgemvt", ("x_prod",)), ("atax", ("y",)),
                       ("gemver", ("B", "x_prod", "x")), ("bicgk", ("q", "s"))]


@pytest.mark.parametrize("variant", [
    "mapreduce:32x32:r4:i1:w:shuffle:wc",        # an enumerated form
    "mapreduce:32x16:r2:i1:w8:shuffle:wc",       # 8-byte accesses
    "mapreduce:32x1:r3:i1:s:shuffle:wc",         # one warp (no shared combine), 3 rows
    "mapreduce:32x8:r2:i1:w:smem:wc",            # row reductions in the padded tile (BiCGK)
])
@pytest.mark.parametrize("name,members", WHOLE_COLUMN_GROUPS)
def test_whole_column_variants_compute_the_reference(name, members, variant):
    """Odd and unaligned sizes; outputs start poisoned (no fill): a column left unwritten
    shows."""
    cpu_or_skip()
    run_group_variant(name, members, variant,
                      [(37, 45), (1, 3), (129, 7), (67, 150), (33, 1031), (8, 516)])


def test_whole_columns_store_plainly_and_fuse_the_column_epilogue():
    graph = get_app("sgemvt").build().graph()
    text = "mapreduce:32x32:r4:i1:w:shuffle:wc"
    program = generate(graph, [(("x_prod", "x"), ("x",), text)])
    (launch,) = program.launches
    assert launch.initial_values == () and launch.operators == ("x_prod", "x")
    assert launch.grid[1].blocks({"A.0": 100000, "A.1": 64}) == 1  # every row in one block
    kernel = program.source[program.source.index("sgemvt_x_prod_x("):]
    assert "kf_atomic" not in kernel and "x[jx] = (float)" in kernel and "z[jx]" in kernel
    assert "float* __restrict__ x_prod" not in kernel  # the intermediate stays in registers
    both = generate(graph, [(("x_prod", "x"), ("x_prod", "x"), text)]).source
    assert "x_prod[jx] = kf_sum_x_prod;" in both  # also stored where read elsewhere
    # atomics where the columns are split over blocks, and for row reductions anyway
    split = generate(graph, [(("x_prod",), ("x_prod",), "mapreduce:32x8:r2:i16:w:shuffle")])
    assert split.launches[0].initial_values == (("x_prod", 0.0),)
    bicgk = get_app("bicgk").build().graph()
    fused = generate(bicgk, [(("q", "s"), ("q", "s"), "mapreduce:32x8:r2:i1:w:shuffle:wc")])
    assert fused.launches[0].initial_values == (("q", 0.0),)
    # the variant: text round trip, iterations normalised, where it does not apply
    group = MapReduceGroup(graph, ["x_prod", "x"], ["x"])
    assert group.normalize(MapReduceVariant.parse(text)).text() == text
    assert group.normalize(MapReduceVariant.parse(
        "mapreduce:32x4:r1:i8:w:shuffle:wc")).iters == 1
    assert group.default_variant().whole_columns and claims(graph, ["x_prod", "x"])
    with pytest.raises(FusionError, match="tile mapping"):
        MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:u4:wc")
    vadd = get_app("vadd").build().graph()
    with pytest.raises(FusionError, match="matrix kernels"):
        MapReduceGroup(vadd, ["wy", "x"], ["x"]).normalize(
            MapReduceVariant.parse("mapreduce:128x1:r1:i1:w:shuffle:wc"))


def test_column_epilogue_is_legal_only_under_whole_columns():
    from kfuse.fusion.plan import make_plan
    graph = get_app("sgemvt").build().graph()
    members = ["x_prod", "x"]
    text = "mapreduce:32x32:r4:i1:w:shuffle:wc"
    assert group_violations(graph, members, text) == []
    reason = next(str(v) for v in group_violations(graph, members)  # no variant: F2, and why
                  if v.rule == "no_reduction_consumed_inside")
    assert "global barrier" in reason and "whole-column" in reason
    plan = make_plan(graph, [members, ["w"]], check_resources=False,
                     variants={frozenset(members): text})
    assert plan.groups[0].variant == text
    with pytest.raises(FusionError, match="illegal fusion"):
        make_plan(graph, [members, ["w"]],
                  variants={frozenset(members): "mapreduce:32x8:r2:i16:w:shuffle"})
    with pytest.raises(FusionError, match="own kernel"):
        generate(graph, [(tuple(members), ("x",), "mapreduce:32x8:r2:i16:w:shuffle")])
    # an epilogue reading a row and a column reduction: no block owns both
    p = kf.Pipeline("both")
    a = p.input("A", shape=("n", "n"))
    v = p.input("v", shape=("n",))
    rows = kf.matvec_t(a, v, name="rows")
    cols = kf.matvec(a, v, name="cols")
    p.output(kf.point(rows + cols, name="mixed"))
    mixed = p.graph()
    reasons = " ".join(str(x) for x in group_violations(mixed, ["rows", "cols", "mixed"], text))
    assert "both row and column" in reasons


def test_whole_columns_enumerated_only_for_column_epilogues():
    from kfuse.model.device import h200_like_profile
    from kfuse.search.variants import WHOLE_COLUMN_FORMS
    profile = h200_like_profile()
    app = get_app("sgemvt")
    graph = app.build().graph()
    space = ImplementationSpace(graph, app.sizes(graph, (16384, 16384)), profile)
    forms = {(32, by, rows, size) for by, rows, size in WHOLE_COLUMN_FORMS}
    choices = space.choices(("x_prod", "x"))
    found = {(*MapReduceVariant.parse(c.variant).threads, MapReduceVariant.parse(c.variant).rows,
              MapReduceVariant.parse(c.variant).vector_bytes) for c in choices}
    assert found == forms
    assert all(c.prediction.launches == 1 for c in choices)
    apart = space.choices(("x_prod",))[0].prediction.launches + \
        space.choices(("x",))[0].prediction.launches
    assert apart == 3  # the kernel, its fill, the epilogue's kernel
    assert not any(MapReduceVariant.parse(c.variant).whole_columns
                   for c in space.choices(("x_prod",)) if c.variant.startswith("mapreduce"))
    plan = space.best().plan(graph)
    assert [list(g.members) for g in plan.groups] == [["x_prod", "x"], ["w"]]
    # GEMVER's rank-1 update tile keeps at most 16 rows: no whole-column form fits, and the
    # space still plans (a fusion without implementations is left out of every cover)
    gemver = get_app("gemver")
    ggraph = gemver.build().graph()
    gspace = ImplementationSpace(ggraph, gemver.sizes(ggraph, (16384, 16384)), profile)
    assert gspace.choices(("B", "x_prod", "x")) == []
    assert ["B", "x_prod", "x"] not in [list(g.members) for g in gspace.best().plan(ggraph).groups]


@pytest.mark.parametrize("name,members,variant,loops", [
    ("sgemv", ("z_prod", "z"), "mapreduce:512x1:r1:i1:w8:stream:u16", False),
    ("sgemv", ("z_prod", "z"), "mapreduce:32x4:r1:i1:w:stream:g7:u4", True),
    ("vadd", ("wy", "x"), "mapreduce:128x1:r1:i1:w8:shuffle", False),
    ("vadd", ("wy", "x"), "mapreduce:128x1:r1:i2:w:shuffle:g9", True),
    ("atax", ("y",), "mapreduce:32x8:r2:i16:w:shuffle", False),
])
def test_grids_covering_the_work_take_their_block_without_a_loop(name, members, variant, loops):
    """Blocks take the unit of their index (a grid-stride loop measured 1% slower on an H200
    SGEMV); persistent grids loop; a covering grid refuses what it cannot cover."""
    from dataclasses import replace

    from kfuse.errors import LaunchError
    graph = get_app(name).build().graph()
    from kfuse.fusion.plan import group_outputs
    program = generate(graph, [(members, group_outputs(graph, members), variant)])
    source, (launch,) = program.source, program.launches
    kernel = source[source.index(launch.symbol + "("):]
    assert ("gridDim.x" in kernel) == loops
    assert launch.grid[0].covering != loops
    if not loops:
        axis = replace(launch.grid[0], cap=10)
        assert axis.blocks({s: axis.per_block for s in axis.symbols}) <= axis.per_block
        with pytest.raises(LaunchError, match="at most 10"):
            axis.blocks({s: 1 << 20 for s in axis.symbols})


# ---------------------------------------------------------------------------------------------
# Held rows: a block holds each whole row, so a row reduction feeds members over that row
# ---------------------------------------------------------------------------------------------

HELD_VARIANTS = [
    "mapreduce:1024x1:r1:i1:w8:stream:g132:u8:hr",  # the planned form at 16384^2
    "mapreduce:64x1:r1:i1:w:stream:g5:u2:hr",       # 16-byte accesses, rows of <= 512
    "mapreduce:128x1:r1:i1:w8:stream:g64:u1:hr",    # 8-byte accesses, one row per block
    "mapreduce:64x1:r1:i1:s:stream:g3:u3:hr",       # scalar accesses, 3 per thread
]
HELD_SIZES = [(37, 45), (5, 9), (1, 3), (67, 150), (70, 192), (4, 188)]


def held_pipeline() -> kf.Pipeline:
    """Every kind of member around a held row: a core map (stored, and read by the others),
    row reductions that are also outputs (one nonzero where elements past a row's end read
    as 0: a missing mask shows), a fed map stored per point (reading the rows' results, a
    vector along the rows and one along the columns), fed column and full reductions."""
    p = kf.Pipeline("held")
    a = p.input("A", ndim=2)
    x = p.input("x", shape=(a.shape[1],))
    u = p.input("u", shape=(a.shape[0],))
    b = kf.point(a * 2.0 - 0.5, name="B")
    t = kf.matvec(b, x, name="t")
    r = kf.reduce_sum(b + 1.0, axis=1, name="r")
    c = kf.point(b * kf.along(t, 0) + kf.outer(u, x) + kf.along(r, 0), name="C")
    y = kf.matvec_t(b, t, name="y")
    s = kf.reduce_sum(c, name="s")
    p.output(b, t, r, c, y, s)
    return p


def held_reference(arrays: dict) -> dict:
    a, x, u = (arrays[k].astype(np.float64) for k in ("A", "x", "u"))
    b = a * 2.0 - 0.5
    t = b @ x
    r = (b + 1.0).sum(axis=1)
    c = b * t[:, None] + u[:, None] * x[None, :] + r[:, None]
    return {"B": b, "t": t, "r": r, "C": c, "y": b.T @ t, "s": np.array(c.sum())}


def check_held_group(variant: str, sizes: list[tuple[int, int]], seed: int) -> None:
    """The held-row group of :func:`held_pipeline` (every member) under ``variant`` on the
    cpu backend, against the float64 reference at each of ``sizes``."""
    graph = held_pipeline().graph()
    members = ("B", "t", "r", "C", "y", "s")
    assert group_violations(graph, members, variant) == []
    program = generate(graph, [(members, members, variant)])
    rng = np.random.default_rng(seed)
    for rows, cols in sizes:
        arrays = {"A": rng.uniform(0.1, 1.1, (rows, cols)).astype(np.float32),
                  "x": rng.uniform(0.1, 1.1, cols).astype(np.float32),
                  "u": rng.uniform(0.1, 1.1, rows).astype(np.float32)}
        out = get_backend("cpu").run(graph, arrays, program=program)
        for key, expected in held_reference(arrays).items():
            assert relative_error(out[key], expected) <= 1e-5, (variant, rows, cols, key)


@pytest.mark.parametrize("variant", HELD_VARIANTS)
def test_held_row_variants_compute_the_reference(variant):
    """ATAX in one kernel, and a group with every kind of member, at odd and unaligned sizes
    (outputs start poisoned: a row not stored shows)."""
    cpu_or_skip()
    # (1024 threads are 1024 host threads on the cpu backend: the planned form on fewer
    # sizes, odd, one row and wider than a warp's vectors, for the suite's time)
    sizes = HELD_SIZES if not variant.startswith("mapreduce:1024x1") else \
        [(37, 45), (1, 3), (9, 192)]
    run_group_variant("atax", ("t", "y"), variant, sizes)
    check_held_group(variant, sizes, seed=7)


def test_held_rows_read_the_matrix_once_and_store_what_they_must():
    graph = get_app("atax").build().graph()
    text = "mapreduce:1024x1:r1:i1:w:stream:g132:u4:hr"
    program = generate(graph, [(("t", "y"), ("y",), text)])
    (launch,) = program.launches
    assert launch.operators == ("t", "y") and launch.initial_values == (("y", 0.0),)
    assert launch.size_limits == (("A.1", 16384),)
    assert launch.grid_size({"A.0": 16384, "A.1": 16384}) == (132, 1, 1)
    assert launch.grid_size({"A.0": 50, "A.1": 7}) == (50, 1, 1)  # at most one block a row
    kernel = program.source[program.source.index("atax_t_y("):]
    assert kernel.count("__syncthreads()") == 1  # one barrier per row
    assert kernel.count("kf_mr_load<4>(A + ") == 1 and "float* __restrict__ t" not in kernel
    assert "kf_atomic_sum(&y[ix + e]" in kernel
    # a row longer than the block holds is refused at launch, never computed in part
    from kfuse.errors import LaunchError
    with pytest.raises(LaunchError, match="A.1 <= 16384, not 16385"):
        launch.grid_size({"A.0": 4, "A.1": 16385})
    arrays, params = get_app("atax").make_inputs((3, 1100), np.random.default_rng(0),
                                                  "float32")
    small = generate(graph, [(("t", "y"), ("y",), "mapreduce:64x1:r1:i1:w:stream:g5:u2:hr")])
    with pytest.raises(LaunchError, match="atax_t_y"):
        get_backend("cpu").run(graph, {**arrays, **params}, program=small)
    # the row reduction is stored plainly (one store per row, no fill) where it is needed
    both = generate(graph, [(("t", "y"), ("t", "y"), text)])
    assert both.launches[0].initial_values == (("y", 0.0),)
    assert "if (kf_tx == 0) t[iy] = kf_row_t;" in both.source
    # the variant: text round trip; what it needs
    group = MapReduceGroup(graph, ["t", "y"], ["y"])
    assert group.normalize(MapReduceVariant.parse(text)).text() == text
    assert group.default_variant().held_rows and claims(graph, ["t", "y"])
    with pytest.raises(FusionError, match="grid"):
        group.normalize(MapReduceVariant.parse("mapreduce:1024x1:r1:i1:w:stream:u4:hr"))
    with pytest.raises(FusionError, match="block rows"):
        MapReduceVariant.parse("mapreduce:32x4:r1:i1:w:stream:g8:u4:hr")
    sgemv = get_app("sgemv").build().graph()
    with pytest.raises(FusionError, match="reduced vector"):
        MapReduceGroup(sgemv, ["z_prod", "z"], ["z"]).normalize(MapReduceVariant.parse(text))


def test_held_rows_are_the_only_legal_implementation_of_a_fed_row_reduction():
    from kfuse.fusion.legality import epilogue_kind
    graph = get_app("atax").build().graph()
    assert epilogue_kind(graph, ["t", "y"]) == "held"
    reason = next(str(v) for v in group_violations(graph, ["t", "y"])
                  if v.rule == "no_reduction_consumed_inside")
    assert "global barrier" in reason and "held-row" in reason
    for variant in ("mapreduce:512x1:r1:i1:w8:stream:u16", "mapreduce:32x8:r2:i16:w:shuffle",
                    "mapreduce:32x32:r4:i1:w:shuffle:wc", "auto"):
        (violation,) = group_violations(graph, ["t", "y"], variant)
        assert "held-row" in violation.reason, variant
    assert ("t", "y") in fusible_groups(graph)
    # a row reduction of values fed by the row's own result: a later phase over the held row
    p = kf.Pipeline("twice")
    a = p.input("A", ndim=2)
    x = p.input("x", shape=(a.shape[1],))
    t = kf.matvec(a, x, name="t")
    scaled = kf.point(a * kf.along(t, 0), name="scaled")
    r = kf.matvec(scaled, x, name="r")
    p.output(r)
    twice = p.graph()
    text = "mapreduce:64x1:r1:i1:w:stream:g5:u2:hr"
    assert not group_violations(twice, ["t", "scaled", "r"], text)
    assert ("t", "scaled", "r") in fusible_groups(twice)
    # the row's result read at another row, or a fed reduction read inside
    q = kf.Pipeline("shifted_held")
    a = q.input("A", ndim=2)
    x = q.input("x", shape=(a.shape[1],))
    t = kf.matvec(a, x, name="t")
    shifted = kf.point(a * kf.along(t.at(1, boundary="clamp"), 0), name="shifted")
    q.output(kf.matvec_t(shifted, x, name="y"))
    reasons = " ".join(v.reason for v in group_violations(q.graph(), ["t", "shifted", "y"],
                                                          text))
    assert "another row" in reasons


def test_held_rows_are_enumerated_where_the_row_fits_and_planned_for_atax():
    from kfuse.model.device import h200_like_profile
    profile = h200_like_profile()
    graph = get_app("atax").build().graph()
    group = MapReduceGroup(graph, ["t", "y"], ["y"])
    assert enumerate_variants(group, profile) == []  # the forms depend on the rows' length
    forms = enumerate_variants(group, profile, {"A.0": 16384, "A.1": 16384})
    assert [(v.threads[0], v.vector_bytes, v.unroll, v.blocks) for v in forms] == [
        (1024, 8, 8, 132), (1024, 16, 4, 132), (512, 16, 8, 132)]
    assert all(v.held_rows and group.normalize(v) == v for v in forms)
    assert enumerate_variants(group, profile, {"A.0": 16384, "A.1": 65536}) == []  # too long
    space = ImplementationSpace(graph, {"A.0": 16384, "A.1": 16384}, profile)
    best = space.best()
    assert [c.members for c in best.choices] == [("t", "y")]
    assert best.choices[0].variant == "mapreduce:1024x1:r1:i1:w8:stream:g132:u8:hr"
    two = space.choices(("t",))[0].prediction.time_s + space.choices(("y",))[0].prediction.time_s
    assert best.predicted_s < 0.6 * two
    wide = ImplementationSpace(graph, {"A.0": 4096, "A.1": 65536}, profile).best()
    assert [c.members for c in wide.choices] == [("t",), ("y",)]  # rows too long: two passes
    # a plan made without sizes runs at any size: no held rows (they hold one row length)
    unsized = ImplementationSpace(graph, None, profile).best()
    assert [c.members for c in unsized.choices] == [("t",), ("y",)]
    # row and column reductions side by side (BiCGK) get them too, and plan them
    bicgk = get_app("bicgk").build().graph()
    sizes = {"A.0": 16384, "A.1": 16384}
    assert any(v.held_rows for v in enumerate_variants(
        MapReduceGroup(bicgk, ["q", "s"], ["q", "s"]), profile, sizes))
    planned = ImplementationSpace(bicgk, sizes, profile).best().choices
    assert [(c.members, MapReduceVariant.parse(c.variant).held_rows) for c in planned] == [
        (("q", "s"), True)]
    sgemv = get_app("sgemv").build().graph()  # no column reduction: none
    assert not any(v.held_rows for v in enumerate_variants(
        MapReduceGroup(sgemv, ["z_prod"], ["z_prod"]), profile, sizes))


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 40), cols=st.integers(1, 300), threads=st.sampled_from([64, 128]),
       access=st.sampled_from(["s", "w8", "w"]), blocks=st.integers(1, 9),
       spare=st.integers(0, 1))
def test_held_rows_at_random_shapes(rows, cols, threads, access, blocks, spare):
    """Random sizes, accesses, grids and rows that fill the held accesses exactly or leave
    some spare: the group with every kind of member equals the reference."""
    cpu_or_skip()
    width = {"s": 1, "w8": 2, "w": 4}[access]
    unroll = -(-cols // (threads * width)) + spare
    variant = f"mapreduce:{threads}x1:r1:i1:{access}:stream:g{blocks}:u{unroll}:hr"
    check_held_group(variant, [(rows, cols)], seed=rows * 1000 + cols)
