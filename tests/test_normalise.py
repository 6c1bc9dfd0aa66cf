"""Normalisations (issue 29): reductions along rows read back across them in one kernel.

The held-row form in phases: each phase reads the row reductions of the phases before it
(a log-softmax's maximum, then its sum of exponentials, then the map), all while the block
holds the row in registers. The cpu backend runs the generated CUDA C against the NumPy
references on odd sizes, fused and unfused."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors
from kfuse.apps.normalise import build_column_softmax, build_gelu_layernorm
from kfuse.errors import LaunchError
from kfuse.fusion.legality import (
    epilogue_violations,
    held_row_phases,
    online_centred_sums,
    online_rescaled_sums,
)
from kfuse.fusion.mapreduce import MapReduceGroup

NORM = [app.name for app in list_apps("norm")]
ROWS = ["rmsnorm", "layernorm", "logsoftmax", "softmax", "crossentropy", "logsumexp"]  # axis 1
# a small block holding rows of at most 128 x 4 x 3 = 1536 columns
SMALL_HELD = "mapreduce:128x1:r1:i1:w:stream:g3:u3:hr"


def cpu_or_skip():
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def check(name: str, plan: object, size: tuple[int, int], seed: int = 0) -> None:
    app = get_app(name)
    arrays, params = app.make_inputs(size, np.random.default_rng(seed), "float32")
    pipeline = app.build()
    if callable(plan):
        plan = plan(pipeline)
    outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
    errors = reference_errors(app, arrays, params, outputs)
    assert max(errors.values()) <= app.tolerance, (name, size, plan, errors)


@pytest.mark.integration
@pytest.mark.parametrize("name", NORM)
def test_normalisations_equal_numpy_planned_and_unfused(name):
    cpu_or_skip()
    sizes = ((13, 133), (5, 7), (1, 1)) if get_app(name).ndim == 2 else \
        ((4099,), (7,), (1,))
    for size in sizes:
        check(name, "auto", size, seed=size[-1])
    check(name, "unfused", sizes[0], seed=3)


def test_two_statistics_of_a_vector_share_one_pass_before_the_map():
    """Sibling full reductions (a sum and a sum of squares) are one kernel; the map that
    reads both is the second (a reduction over everything is complete only after every
    block finished)."""
    app = get_app("standardise")
    pipeline = app.build()
    graph = pipeline.graph()
    plan = pipeline.plan(sizes=app.sizes(graph, app.bench_size))
    assert [sorted(g.members) for g in plan.groups] == [["squares", "total"], ["y"]]


@pytest.mark.integration
@pytest.mark.parametrize("name", ROWS)
def test_row_normalisations_in_one_held_kernel_at_odd_lengths(name):
    """Rows far shorter than the block holds, of a few columns past a whole access, and
    exactly as long as it holds (every element of every thread's accesses used)."""
    cpu_or_skip()

    def held(pipeline):
        members = tuple(k.name for k in pipeline.graph().kernels)
        return pipeline.fuse([members], forms=[SMALL_HELD])

    for size in ((3, 5), (17, 1031), (6, 1536)):
        check(name, held, size, seed=size[0])


def test_rows_longer_than_the_variant_holds_are_refused_by_name():
    cpu_or_skip()
    app = get_app("layernorm")
    pipeline = app.build()
    members = tuple(k.name for k in pipeline.graph().kernels)
    arrays, params = app.make_inputs((4, 1537), np.random.default_rng(0), "float32")
    with pytest.raises(LaunchError, match="1536, not 1537"):
        pipeline.run(backend="cpu", plan=pipeline.fuse([members], forms=[SMALL_HELD]),
                     **arrays, **params)


@pytest.mark.parametrize("name", ROWS)
def test_row_normalisations_plan_one_kernel_at_benchmark_sizes(name):
    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    plan = pipeline.plan(sizes=app.sizes(graph, app.bench_size))
    assert [sorted(g.members) for g in plan.groups] == [sorted(graph.kernel_by_name)], \
        plan.explain()
    assert ":hr" in plan.groups[0].variant


def test_rows_too_long_for_a_block_go_in_segments():
    """Rows longer than any block holds plan as one kernel holding them in segments, the
    sum of exponentials in the maximum's pass (online rescaling), and the explanation says
    so; a group with column reductions cannot take segments and stays split, with the
    reason."""
    app = get_app("logsoftmax")
    pipeline = app.build()
    graph = pipeline.graph()
    plan = pipeline.plan(sizes=app.sizes(graph, (64, 131072)))
    assert len(plan.groups) == 1 and ":sg" in plan.groups[0].variant, plan.explain()
    text = plan.explain()
    assert "'total' goes in the same pass over the row's segments as 'top'" in text, text
    assert ":sg" not in pipeline.plan(sizes=app.sizes(graph, (64, 4096))).groups[0].variant
    p = kf.Pipeline("long_columns")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    columns = kf.reduce_sum(x - top.at(0, dims=(0,)), axis=0, name="columns")
    p.output(columns)
    graph = p.graph()
    plan = p.plan(sizes={"x.0": 64, "x.1": 131072})
    assert len(plan.groups) == 2
    assert "rows held in segments cannot keep the column reductions" in plan.explain(), \
        plan.explain()


def test_rows_in_segments_are_read_again_from_l2_where_it_is_large():
    """Where the device's L2 holds the rows in flight (an H200's 60 MiB), rows in segments
    take no stash and four accesses per thread and segment (read again from L2); a smaller
    L2 stashes the first segments in shared memory."""
    from kfuse.model.device import default_profile, h200_like_profile
    from kfuse.schedule.forms import MapReduceVariant
    from kfuse.search import default_plan

    for name, size in (("rmsnorm", (1024, 65536)), ("logsoftmax", (512, 131072)),
                       ("layernorm", (1024, 65536))):  # (LayerNorm: its row, gamma, beta)
        app = get_app(name)
        graph = app.build().graph()
        for profile, stashed in ((h200_like_profile(), False), (default_profile(), True)):
            plan = default_plan(graph, sizes=app.sizes(graph, size), profile=profile)
            (group,) = plan.groups
            variant = MapReduceVariant.parse(group.variant)
            assert variant.segmented, plan.explain()
            assert (variant.stash > 0) == stashed, (name, profile.name, group.variant)
            assert variant.unroll == (2 if stashed else 4), (name, profile.name, group.variant)


# a small block holding 64 x 4 x 2 = 512 columns at a time
SMALL_SEGMENTS = "mapreduce:64x1:r1:i1:w:stream:g3:u2:hr:sg"


@pytest.mark.integration
@pytest.mark.parametrize("name", [name for name in ROWS if name != "softmax"])  # (logsoftmax's)
@pytest.mark.parametrize("variant", [SMALL_SEGMENTS, "mapreduce:64x1:r1:i1:s:stream:g4:u1:hr:sg:st2"])
def test_rows_in_segments_at_odd_lengths(name, variant):
    """Rows of one partial segment, several with a partial last one, and a whole number of
    segments; vector and scalar accesses; blocks walking rows."""
    cpu_or_skip()

    def segments(pipeline):
        members = tuple(k.name for k in pipeline.graph().kernels)
        return pipeline.fuse([members], forms=[variant])

    for size in ((3, 5), (5, 1001), (4, 1024), (2, 2999)):
        check(name, segments, size, seed=size[1])


def test_online_rescaling_is_recognised_only_where_it_holds():
    """A sum of exp(e - m), m a row maximum of the group read at its row and e reading no
    result of m's pass, through maps of the group too; not a product past the exponential,
    nor a shifted value reading a result of the maximum's own pass."""
    graph = get_app("logsoftmax").build().graph()
    members = [k.name for k in graph.kernels]
    assert online_rescaled_sums(graph, members) == {"total": "top"}
    group = MapReduceGroup(graph, members, ["y"])
    assert [[k.name for k in phase] for phase in group.segment_phases] == [
        ["top", "total"], ["y"]]
    assert [[k.name for k in phase] for phase in group.phases] == [["top"], ["total"], ["y"]]

    p = kf.Pipeline("online_kinds")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    mean = kf.reduce_sum(x, axis=1, name="mean")
    shifted = kf.point(x - top.at(0, dims=(0,)), name="shifted")
    through = kf.reduce_sum(kf.exp(shifted), axis=1, name="through")
    scaled = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))) * 2.0, axis=1, name="scaled")
    same_pass = kf.reduce_sum(kf.exp(x * mean.at(0, dims=(0,)) - top.at(0, dims=(0,))),
                              axis=1, name="same_pass")
    p.output(through, scaled, same_pass)
    graph = p.graph()
    members = [k.name for k in graph.kernels]
    assert online_rescaled_sums(graph, members) == {"through": "top"}


@pytest.mark.integration
def test_every_kind_of_member_in_every_pass():
    """Pass 1 a row maximum with a sum of exponentials past it (online) and a full sum; pass
    2 a stored map and a row sum reading both; pass 3 a map reading that sum: on rows of one
    and of several segments, blocks walking rows."""
    cpu_or_skip()
    p = kf.Pipeline("passes")
    x = p.input("x", ndim=2)
    w = p.input("w", shape=(x.shape[1],))
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    everything = kf.reduce_sum(x * x, name="everything")
    prob = kf.point(kf.exp(x - top.at(0, dims=(0,))) / total.at(0, dims=(0,)), name="prob")
    spread = kf.reduce_sum(prob * w.at(0, dims=(1,)), axis=1, name="spread")
    y = kf.point(x * spread.at(0, dims=(0,)), name="y")
    p.output(top, total, everything, prob, spread, y)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert [[k.name for k in phase] for phase in group.segment_phases] == [
        ["top", "everything", "total"], ["prob", "spread"], ["y"]]
    plan = p.fuse([members], forms=[SMALL_SEGMENTS])
    rng = np.random.default_rng(5)
    for rows, cols in ((9, 37), (7, 1201)):
        x_value = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        w_value = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        out = p.run(backend="cpu", plan=plan, x=x_value, w=w_value)
        v = x_value.astype(np.float64)
        m = v.max(axis=1, keepdims=True)
        e = np.exp(v - m)
        s = e.sum(axis=1, keepdims=True)
        spread_value = (e / s * w_value).sum(axis=1)
        expected = {"top": m[:, 0], "total": s[:, 0], "everything": (v * v).sum(),
                    "prob": e / s, "spread": spread_value, "y": v * spread_value[:, None]}
        for name, value in expected.items():
            got = np.reshape(out[name], np.shape(value))
            scale = max(np.abs(value).max(), 1.0)
            assert np.abs(got - value).max() / scale <= 2e-5, (rows, cols, name)


def test_segments_refuse_column_reductions_by_name():
    p = kf.Pipeline("segment_columns")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    columns = kf.reduce_sum(x - top.at(0, dims=(0,)), axis=0, name="columns")
    p.output(columns)
    with pytest.raises(kf.KfuseError, match="column reductions \\['columns'\\]"):
        p.fuse([("top", "columns")], forms=[SMALL_SEGMENTS])


def test_phases_follow_the_chain_of_row_reductions():
    graph = get_app("crossentropy").build().graph()
    members = [k.name for k in graph.kernels]
    assert held_row_phases(graph, members) == {"top": 0, "total": 1, "loss": 2}
    group = MapReduceGroup(graph, members, ["loss"])
    assert [[k.name for k in phase] for phase in group.phases] == [["top"], ["total"],
                                                                   ["loss"]]
    assert [r.kind for r in group.reductions] == ["row", "row", "row"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_held_row_stores_two_byte_floats_rounded(dtype):
    """RMSNorm written back in its input's dtype (every array two bytes: eight to a 16-byte
    access): one kernel, equal to NumPy and to the unfused kernels on odd rows and on rows
    of whole vectors."""
    from kfuse.apps.check import relative_error
    from kfuse.model.device import h200_like_profile
    from kfuse.runtime.numpy_backend import numpy_dtype
    from kfuse.search import default_plan

    p = kf.Pipeline("rmsnorm_in_its_dtype")
    x = p.input("x", ndim=2, dtype=dtype)
    g = p.input("g", shape=(x.shape[1],), dtype=dtype)
    inv_n = p.param("inv_n")
    squares = kf.reduce_sum(x * x, axis=1, name="squares")
    scale = 1.0 / kf.sqrt(squares.at(0, dims=(0,)) * inv_n + 1e-6)
    p.output(kf.point(kf.astype(x * scale * g.at(0, dims=(1,)), dtype), name="y"))
    graph = p.graph()
    plan = default_plan(graph, sizes=graph.bind_shapes({"x": (16384, 4096), "g": (4096,)}),
                        profile=h200_like_profile())
    assert len(plan.groups) == 1, plan.explain()
    cpu_or_skip()
    rng = np.random.default_rng(3)
    for shape in ((37, 133), (19, 136)):
        values = (rng.standard_normal(shape) * 2).astype(numpy_dtype(dtype))
        gains = rng.uniform(0.5, 1.5, shape[1]).astype(numpy_dtype(dtype))
        given = {"x": values, "g": gains, "inv_n": 1.0 / shape[1]}
        fused = p.run(backend="cpu", plan=plan, **given)["y"]
        assert fused.dtype == numpy_dtype(dtype)
        wide = values.astype(np.float64)
        expected = wide / np.sqrt((wide * wide).mean(axis=1, keepdims=True) + 1e-6) \
            * gains.astype(np.float64)
        assert relative_error(fused, expected) <= HALF_TOLERANCE[dtype], shape
        apart = p.run(backend="cpu", plan="unfused", **given)["y"]
        assert relative_error(fused, apart) <= HALF_TOLERANCE[dtype] / 2, shape


def test_held_rows_leave_no_thread_idle_where_a_smaller_block_spans_the_row():
    """Only blocks whose one access spans at most the row are proposed: rows of 4096
    float32, 4 a thread, are spanned by 256 and by 1024 threads (in two-byte floats, 8 a
    thread, 1024 threads would span 8192 columns; such rows are read in segments instead,
    :func:`test_rows_of_two_byte_floats_are_read_in_segments_again_from_l2`)."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search.variants import held_row_variants

    graph = get_app("crossentropy").build().graph()
    group = MapReduceGroup(graph, [k.name for k in graph.kernels], ["loss"])
    variants = held_row_variants(group, h200_like_profile(), 4096, rows=16384)
    assert variants
    assert all(v.threads[0] * group.width(v) <= 4096 for v in variants), variants
    assert {v.threads[0] for v in variants} == {256, 1024}
    assert not any(v.segmented for v in variants)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rows_of_two_byte_floats_are_read_in_segments_again_from_l2(dtype):
    """Rows of two-byte floats that a block could hold are read in segments, the later
    passes again from L2: one access a thread where 128 or 256 threads cut the row into at
    most four segments (rows of 4096: 256 threads), else two accesses a thread with the
    fewest threads that cut it into at most four (rows of 32768: 1024); rows too long for
    that keep the segment forms of any row; columns of them take their own segment form; float32
    keeps its held forms; rows of 16-byte accesses (every array two bytes) written back
    stay held up to 256 threads of two accesses. The plan equals NumPy on rows of several
    segments and a ragged last one."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search import default_plan
    from kfuse.search.variants import (
        HALF_COLUMN_SEGMENT_FORM,
        HALF_ROW_SEGMENT_UNROLL,
        held_row_variants,
    )

    profile = h200_like_profile()
    app = get_app("rmsnorm")
    graph = app.build(dtype=dtype).graph()
    group = MapReduceGroup(graph, [k.name for k in graph.kernels], list(graph.outputs))
    for columns, threads, unroll in ((4096, 256, 1), (32768, 1024, HALF_ROW_SEGMENT_UNROLL)):
        (variant,) = held_row_variants(group, profile, columns, rows=4096)
        assert variant.segmented and not variant.stash, variant
        assert (variant.threads[0], variant.unroll) == (threads, unroll)
        assert math.ceil(columns / group.step(variant)) <= 4
    losses = get_app("crossentropy").build(dtype=dtype).graph()  # (row results only)
    losses_group = MapReduceGroup(losses, [k.name for k in losses.kernels],
                                  list(losses.outputs))
    (variant,) = held_row_variants(losses_group, profile, 4096, rows=16384)
    assert (variant.threads[0], variant.unroll) == (128, 1), variant
    long_rows = held_row_variants(group, profile, 131072, rows=1024)
    assert long_rows and all(v.unroll != HALF_ROW_SEGMENT_UNROLL or v.threads[0] == 1024
                             for v in long_rows)
    narrow = kf.Pipeline("rmsnorm_in_its_dtype")
    x = narrow.input("x", ndim=2, dtype=dtype)
    squares = kf.reduce_sum(x * x, axis=1, name="squares")
    narrow.output(kf.point(kf.astype(x * kf.rsqrt(squares.at(0, dims=(0,)) + 1e-6), dtype),
                           name="y"))
    narrow_graph = narrow.graph()
    narrow_group = MapReduceGroup(narrow_graph, ["squares", "y"], ["y"])
    (held,) = held_row_variants(narrow_group, profile, 4096, rows=16384)
    assert not held.segmented and held.threads[0] * narrow_group.width(held) * held.unroll \
        == 4096, held
    (longer,) = held_row_variants(narrow_group, profile, 32768, rows=4096)
    assert longer.segmented, longer
    wide = get_app("rmsnorm").build().graph()
    wide_group = MapReduceGroup(wide, [k.name for k in wide.kernels], list(wide.outputs))
    assert not any(v.segmented for v in held_row_variants(wide_group, profile, 4096, 16384))
    columns_app = get_app("colstandardise")
    columns_graph = columns_app.build(dtype=dtype).graph()
    columns_plan = default_plan(columns_graph, profile=profile, sizes=columns_app.sizes(
        columns_graph, columns_app.bench_size))
    (column_form,) = [g.form for g in columns_plan.groups]
    assert (*column_form.threads, column_form.unroll) == HALF_COLUMN_SEGMENT_FORM
    plan = default_plan(graph, sizes=app.sizes(graph, app.bench_size), profile=profile)
    assert len(plan.groups) == 1 and plan.groups[0].form.segmented, plan.explain()
    cpu_or_skip()
    for size in ((5, 2309), (3, 4096)):  # three segments, the last ragged; four whole
        arrays, params = app.make_inputs(size, np.random.default_rng(size[1]), dtype)
        fused = app.build(dtype=dtype).run(backend="cpu", plan=plan, **arrays, **params)
        errors = reference_errors(app, arrays, params, fused)
        assert max(errors.values()) <= HALF_TOLERANCE[dtype], (size, errors)


@pytest.mark.integration
@pytest.mark.parametrize("variant", [SMALL_HELD, "mapreduce:256x1:r1:i1:w:stream:g40:u2:hr"])
def test_every_kind_of_member_in_every_phase(variant):
    """Phase 0 a row maximum; phase 1 a stored map, a row sum of it and a sum over
    everything; phase 2 column sums reading the row sum: each stored, on rows shorter and
    longer than a chunk, a resident grid (blocks walk rows) and one block per row."""
    cpu_or_skip()
    p = kf.Pipeline("phases")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    shifted = kf.point(kf.exp(x - top.at(0, dims=(0,))), name="shifted")
    total = kf.reduce_sum(shifted, axis=1, name="total")
    everything = kf.reduce_sum(x - top.at(0, dims=(0,)), name="everything")
    columns = kf.reduce_sum(shifted / total.at(0, dims=(0,)), axis=0, name="columns")
    p.output(top, shifted, total, everything, columns)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert [[k.name for k in phase] for phase in group.phases] == [
        ["top"], ["shifted", "total", "everything"], ["columns"]]
    plan = p.fuse([members], forms=[variant])
    rng = np.random.default_rng(4)
    for rows, cols in ((45, 37), (7, 1201)):
        x_value = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        out = p.run(backend="cpu", plan=plan, x=x_value)
        v = x_value.astype(np.float64)
        m = v.max(axis=1, keepdims=True)
        e = np.exp(v - m)
        expected = {"top": m[:, 0], "shifted": e, "total": e.sum(axis=1),
                    "everything": (v - m).sum(), "columns": (e / e.sum(axis=1,
                                                                       keepdims=True)).sum(0)}
        for name, value in expected.items():
            got = np.reshape(out[name], np.shape(value))
            scale = max(np.abs(value).max(), 1.0)
            assert np.abs(got - value).max() / scale <= 2e-5, (variant, rows, cols, name)


def softmax_with_mask() -> kf.Pipeline:
    """A masked softmax whose map also reads the row: the exponential is computed again
    (keeping it would hold the row's values and the exponentials both)."""
    p = kf.Pipeline("softmax_with_row")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    e = kf.exp(x - top.at(0, dims=(0,)))
    total = kf.reduce_sum(e, axis=1, name="total")
    p.output(kf.point(e / total.at(0, dims=(0,)) + 0.25 * x, name="y"))
    return p


@pytest.mark.parametrize("variant", [SMALL_HELD, "mapreduce:256x1:r1:i1:w:stream:g40:u2:hr"])
def test_values_a_later_phase_reads_again_are_kept_in_registers(variant):
    """The GELU of a layer norm is computed once (in the mean's phase) and the centred value
    once (in the variance's), kept in registers for the phases after; where a later phase
    reads the row besides, nothing is kept. Each equals NumPy at odd sizes."""
    from kfuse.codegen import generate

    rng = np.random.default_rng(5)
    for build, kept in ((build_gelu_layernorm, True), (softmax_with_mask, False)):
        p = build()
        graph = p.graph()
        plan = p.fuse([tuple(k.name for k in graph.kernels)], forms=[variant])
        source = generate(graph, plan.kernel_groups).source
        assert ("kf_keep_0" in source) is kept
        # (at each of a thread's 4 elements, in one phase where kept, in two where not)
        assert source.count("erff(") + source.count("expf(") == 4 * (1 if kept else 2)
        cpu_or_skip()
        for rows, cols in ((45, 37), (7, 301)):
            x = (rng.standard_normal((rows, cols)) * 2).astype(np.float32)
            got = p.run(backend="cpu", plan=plan, x=x, inv_n=1.0 / cols)["y"] if kept else \
                p.run(backend="cpu", plan=plan, x=x)["y"]
            v = x.astype(np.float64)
            if kept:
                h = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
                c = h - h.mean(axis=1, keepdims=True)
                want = c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5)
            else:
                e = np.exp(v - v.max(axis=1, keepdims=True))
                want = e / e.sum(axis=1, keepdims=True) + 0.25 * v
            np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


def test_a_held_group_never_reads_a_column_reduction_of_its_own():
    """A column sum is complete only after every block finished: a member of the same
    held-row group reading it is refused with the reason."""
    p = kf.Pipeline("cols_inside")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    shifted = x - top.at(0, dims=(0,))
    columns = kf.reduce_sum(shifted, axis=0, name="columns")
    y = kf.point(shifted * columns.at(0, dims=(1,)), name="y")
    p.output(y)
    graph = p.graph()
    reasons = [v.reason for v in epilogue_violations(graph, ["top", "columns", "y"], None)]
    assert any("'columns', a reduction combined over blocks" in r for r in reasons), reasons
    assert not epilogue_violations(graph, ["top", "columns"], None)


# held columns: strips of 2 x 4 columns, 32 x 2 rows a segment, or 4 x 1, 16 x 3 and a stash
HELD_COLUMNS = ["mapreduce:2x32:r1:i1:w:shuffle:u2:hc",
                "mapreduce:4x16:r1:i1:s:shuffle:u3:hc:st3"]


@pytest.mark.integration
@pytest.mark.parametrize("variant", HELD_COLUMNS)
def test_column_standardisation_in_one_held_column_kernel(variant):
    """Columns of one partial segment and of several, strips cut by the last column, a
    single element; vector and scalar accesses; a stash of the first segments."""
    cpu_or_skip()

    def held(pipeline):
        members = tuple(k.name for k in pipeline.graph().kernels)
        return pipeline.fuse([members], forms=[variant])

    for size in ((5, 3), (1001, 37), (257, 129), (1, 1)):
        check("colstandardise", held, size, seed=size[0])


@pytest.mark.integration
def test_every_kind_of_member_in_held_columns():
    """Pass 1 a column maximum, a stored map reading a vector along the columns and a full
    sum; pass 2 a column sum of exponentials past the maximum weighted by a vector along
    the rows; pass 3 the map reading it: against NumPy on strips and segments cut short."""
    cpu_or_skip()
    p = kf.Pipeline("column_passes")
    x = p.input("x", ndim=2)
    r = p.input("r", shape=(x.shape[0],))
    c = p.input("c", shape=(x.shape[1],))
    top = kf.reduce_max(x, axis=0, name="top")
    scaled = kf.point(x * c.at(0, dims=(1,)), name="scaled")
    everything = kf.reduce_sum(x * x, name="everything")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(1,))) * r.at(0, dims=(0,)), axis=0,
                          name="total")
    y = kf.point(x / total.at(0, dims=(1,)), name="y")
    p.output(top, scaled, everything, total, y)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert group.epilogue_kind == "held_col"
    assert [[k.name for k in phase] for phase in group.segment_phases] == [
        ["top", "scaled", "everything"], ["total"], ["y"]]
    rng = np.random.default_rng(6)
    for variant in HELD_COLUMNS:
        plan = p.fuse([members], forms=[variant])
        for rows, cols in ((9, 5), (301, 23)):
            x_value = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
            r_value = rng.uniform(0.5, 1.5, rows).astype(np.float32)
            c_value = rng.uniform(0.5, 1.5, cols).astype(np.float32)
            out = p.run(backend="cpu", plan=plan, x=x_value, r=r_value, c=c_value)
            v = x_value.astype(np.float64)
            m = v.max(axis=0)
            t = (np.exp(v - m) * r_value[:, None]).sum(axis=0)
            expected = {"top": m, "scaled": v * c_value, "everything": (v * v).sum(),
                        "total": t, "y": v / t}
            for name, value in expected.items():
                got = np.reshape(out[name], np.shape(value))
                scale = max(np.abs(value).max(), 1.0)
                assert np.abs(got - value).max() / scale <= 2e-5, (variant, rows, cols, name)


def test_held_columns_refuse_row_reductions_and_other_reads():
    """A block holding a strip of columns has part of each row: a row reduction in the group
    is refused by name, as is a column result read at another column."""
    p = kf.Pipeline("columns_refused")
    x = p.input("x", ndim=2)
    total = kf.reduce_sum(x, axis=0, name="total")
    rows = kf.reduce_sum(x, axis=1, name="rows")
    y = kf.point(x - total.at(0, dims=(1,)), name="y")
    shifted = kf.local(x - total.at(1, dims=(1,)), name="shifted")
    p.output(rows, y, shifted)
    graph = p.graph()
    reasons = [v.reason for v in epilogue_violations(graph, ["total", "rows", "y"], None)]
    assert any("'rows' reduces along rows" in r for r in reasons), reasons
    reasons = [v.reason for v in epilogue_violations(graph, ["total", "shifted"], None)]
    assert any("at another column" in r for r in reasons), reasons
    assert not epilogue_violations(graph, ["total", "y"], "mapreduce:8x64:r1:i1:w:shuffle:u8:hc")
    reasons = [v.reason for v in epilogue_violations(graph, ["total", "y"],
                                                     "mapreduce:32x8:r4:i8:w:shuffle")]
    assert any("held-column variant" in r for r in reasons), reasons


def test_column_standardisation_plans_one_kernel():
    """At the benchmark size (columns longer than registers hold: segments) and where a
    column of the strip fits in registers (read once); the explanation says how."""
    app = get_app("colstandardise")
    pipeline = app.build()
    graph = pipeline.graph()
    for size, unroll in ((app.bench_size, ":u8:"), ((2048, 32768), ":u8:")):
        plan = pipeline.plan(sizes=app.sizes(graph, size))
        assert len(plan.groups) == 1 and ":hc" in plan.groups[0].variant, plan.explain()
        assert unroll in plan.groups[0].variant, plan.groups[0].variant
    assert "after a pass over every row of the block's strip of columns" in plan.explain()


def batch_standardisation() -> kf.Pipeline:
    """Each feature standardised over a batch of few rows (``(batch, features)``)."""
    p = kf.Pipeline("batch_standardisation")
    x = p.input("x", ndim=2)
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(x, axis=0, name="mean")
    centred = x - mean.at(0, dims=(1,)) * inv_n
    var = kf.reduce_sum(centred * centred, axis=0, name="var")
    p.output(kf.point(centred * kf.rsqrt(var.at(0, dims=(1,)) * inv_n + 1e-5), name="y"))
    return p


@pytest.mark.parametrize("rows", [1, 3, 8, 37, 200])
def test_columns_of_few_rows_are_held_by_blocks_a_warp_wide(rows):
    """Statistics over a batch of a few rows: one held-columns kernel whose block is a warp
    across and a quarter of the rows down (each thread about four rows, none idle),
    planned at a large batch of features, equal to NumPy on the cpu backend."""
    from kfuse.search.variants import few_row_forms

    across, down = few_row_forms(rows)[0] if rows < 256 else (0, 0)
    pipeline = batch_standardisation()
    plan = pipeline.plan(sizes={"x.0": rows, "x.1": 1 << 22})
    assert len(plan.groups) == 1 and ":hc" in plan.groups[0].variant, plan.explain()
    assert plan.groups[0].variant.startswith(f"mapreduce:{across}x{down}:"), plan.explain()
    found = re.search(r":u(\d+)", plan.groups[0].variant)
    unroll = int(found.group(1)) if found else 1
    assert across == 32 and down * unroll >= rows > down * (unroll - 1) and down <= 16
    cpu_or_skip()
    x = np.random.default_rng(rows).standard_normal((rows, 77)).astype(np.float32) * 3 + 1
    got = pipeline.run(backend="cpu", plan=plan, x=x, inv_n=1.0 / rows)["y"]
    wide = x.astype(np.float64)
    centred = wide - wide.mean(axis=0)
    np.testing.assert_allclose(got, centred / np.sqrt((centred ** 2).mean(axis=0) + 1e-5),
                               rtol=2e-4, atol=2e-4)


@pytest.mark.integration
@pytest.mark.parametrize("variant", HELD_COLUMNS + ["mapreduce:8x64:r1:i1:w:shuffle:u8:hc"])
def test_column_sums_of_exponentials_go_in_the_maximums_pass(variant):
    """Down the columns as along the rows: the sum of exp(x - m) is rescaled as each
    thread's running column maximum grows (then to the block's), so held columns read the
    matrix twice, not three times; equal to NumPy on columns of one partial segment and of
    several, strips cut by the last column, a single element; values spread wide (the
    running maximum grows often)."""
    p = build_column_softmax()
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    assert online_rescaled_sums(graph, members) == {"total": "top"}
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert [[k.name for k in phase] for phase in group.segment_phases][0] == ["top", "total"]
    plan = p.fuse([members], forms=[variant])
    cpu_or_skip()
    rng = np.random.default_rng(9)
    for shape in ((1001, 37), (5, 3), (257, 129), (1, 1)):
        x = (rng.standard_normal(shape) * 6 + np.arange(shape[0])[:, None] * 0.01).astype(
            np.float32)
        out = p.run(backend="cpu", plan=plan, x=x)
        v = x.astype(np.float64)
        e = np.exp(v - v.max(axis=0))
        np.testing.assert_allclose(out["y"], e / e.sum(axis=0), rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(out["lse"], v.max(axis=0) + np.log(e.sum(axis=0)),
                                   rtol=2e-6, atol=2e-6)


def test_online_centring_is_recognised_only_where_it_holds():
    """A sum of squares of values centred by a centre read from the sum of the same values
    along the same axis goes in that sum's pass; other squares and centres do not."""
    for name in ("layernorm", "colstandardise"):
        graph = get_app(name).build().graph()
        members = [k.name for k in graph.kernels]
        found = online_centred_sums(graph, members)
        assert list(found) == ["spread"] and found["spread"].total == "total", found
        group = MapReduceGroup(graph, members, ["y"])
        assert [[k.name for k in phase] for phase in group.segment_phases] == [
            ["total", "spread"], ["y"]]
    p = kf.Pipeline("centring_kinds")
    x = p.input("x", ndim=2)
    total = kf.reduce_sum(x, axis=1, name="total")
    mean = total.at(0, dims=(0,)) * 0.5
    other = kf.reduce_sum((x * 2.0 - mean) * (x * 2.0 - mean), axis=1, name="other")
    mixed = kf.reduce_sum((x - mean) * (x + mean), axis=1, name="mixed")
    varying = kf.reduce_sum((x - x * mean) * (x - x * mean), axis=1, name="varying")
    good = kf.reduce_sum((x - mean) * (x - mean), axis=1, name="good")
    p.output(other, mixed, varying, good)
    graph = p.graph()
    assert list(online_centred_sums(graph, [k.name for k in graph.kernels])) == ["good"]


@pytest.mark.integration
@pytest.mark.parametrize("variant", [SMALL_SEGMENTS, HELD_COLUMNS[0]])
def test_online_centring_keeps_its_precision_far_from_zero(variant):
    """Values of mean 1000 and spread 1 (where a sum of squares less the squared sum loses
    every digit): the centred sums of squares and the normalised values, stored, against
    float64, for rows in segments and held columns."""
    cpu_or_skip()
    axis = 0 if ":hc" in variant else 1
    p = kf.Pipeline("centring_precision")
    x = p.input("x", ndim=2)
    inv_n = p.param("inv_n")
    total = kf.reduce_sum(x, axis=axis, name="total")
    centred = x - total.at(0, dims=(1 - axis,)) * inv_n
    spread = kf.reduce_sum(centred * centred, axis=axis, name="spread")
    y = kf.point(centred * kf.rsqrt(spread.at(0, dims=(1 - axis,)) * inv_n + 1e-5), name="y")
    p.output(spread, y)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    assert list(MapReduceGroup(graph, members, ["spread", "y"]).centred) == ["spread"]
    plan = p.fuse([members], forms=[variant])
    rng = np.random.default_rng(8)
    for shape in ((1201, 7) if axis == 0 else (7, 1201),):  # (long along the axis)
        x_value = (1000.0 + rng.standard_normal(shape)).astype(np.float32)
        out = p.run(backend="cpu", plan=plan, x=x_value, inv_n=1.0 / shape[axis])
        v = x_value.astype(np.float64)
        c = v - v.mean(axis=axis, keepdims=True)
        squares = (c * c).sum(axis=axis)
        assert np.abs(out["spread"] - squares).max() / squares.max() <= 1e-3, shape
        expected = c / np.sqrt((c * c).mean(axis=axis, keepdims=True) + 1e-5)
        assert np.abs(out["y"] - expected).max() <= 2e-3, shape


# ------------------------------------------------------------------------------------------------
# The tail: maps over the reduced vector after a held group's last phase
# ------------------------------------------------------------------------------------------------
def row_statistics() -> kf.Pipeline:
    """A row's log-sum-exp (its maximum, its sum of exponentials past it), its standard
    deviation (a centred sum of squares) and a weighted mix of both through a second tail
    member and a vector along the rows; the centred values stored too (a fed map)."""
    p = kf.Pipeline("row_statistics")
    x = p.input("x", ndim=2)
    w = p.input("w", shape=(x.shape[0],))
    inv_n = p.param("inv_n")
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    mean = kf.reduce_sum(x, axis=1, name="mean")
    centred = kf.point(x - mean.at(0, dims=(0,)) * inv_n, name="centred")
    spread = kf.reduce_sum(centred * centred, axis=1, name="spread")
    lse = kf.point(top + kf.log(total), name="lse")
    deviation = kf.point(kf.sqrt(spread * inv_n), name="deviation")
    mixed = kf.point(lse * w - deviation, name="mixed")
    p.output(centred, lse, mixed)
    return p


@pytest.mark.integration
@pytest.mark.parametrize("variant", [SMALL_HELD, SMALL_SEGMENTS,
                                     "mapreduce:64x1:r1:i1:s:stream:g4:u1:hr:sg:st2"])
def test_maps_of_row_results_follow_held_rows_in_one_kernel(variant):
    """The tail reads row reductions of every phase (and a centred sum of squares, online in
    segments), another tail member and a vector at its row: equal to NumPy on rows of a
    partial access, several segments and a single element."""
    cpu_or_skip()
    p = row_statistics()
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert group.epilogue_kind == "held"
    assert [k.name for k in group.tail] == ["lse", "deviation", "mixed"]
    assert group.epilogue_stores == ["lse", "mixed"] and group.fed_stores == ["centred"]
    plan = p.fuse([members], forms=[variant])
    assert len(plan.groups) == 1
    rng = np.random.default_rng(8)
    sizes = ((3, 5), (17, 1031), (1, 1)) if ":sg" not in variant else \
        ((3, 5), (5, 1001), (2, 2999))
    for rows, cols in sizes:
        x_value = (rng.standard_normal((rows, cols)) * 3 + 1).astype(np.float32)
        w_value = rng.uniform(0.5, 1.5, rows).astype(np.float32)
        out = p.run(backend="cpu", plan=plan, x=x_value, w=w_value, inv_n=1.0 / cols)
        v = x_value.astype(np.float64)
        m = v.max(axis=1)
        lse = m + np.log(np.exp(v - m[:, None]).sum(axis=1))
        expected = {"centred": v - v.mean(axis=1, keepdims=True), "lse": lse,
                    "mixed": lse * w_value - v.std(axis=1)}
        for name, value in expected.items():
            got = np.reshape(out[name], np.shape(value))
            scale = max(np.abs(value).max(), 1.0)
            assert np.abs(got - value).max() / scale <= 2e-5, (variant, rows, cols, name)


@pytest.mark.integration
@pytest.mark.parametrize("variant", HELD_COLUMNS)
def test_maps_of_column_results_follow_held_columns_in_one_kernel(variant):
    """A column's log-sum-exp and a map of it with a vector along the columns, after the
    passes of a held-column kernel: strips cut by the last column, one row, one column."""
    cpu_or_skip()
    p = kf.Pipeline("column_statistics")
    x = p.input("x", ndim=2)
    c = p.input("c", shape=(x.shape[1],))
    top = kf.reduce_max(x, axis=0, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(1,))), axis=0, name="total")
    lse = kf.point(top + kf.log(total), name="lse")
    scaled = kf.point(lse * c, name="scaled")
    p.output(total, scaled)
    graph = p.graph()
    members = tuple(k.name for k in graph.kernels)
    group = MapReduceGroup(graph, members, list(graph.outputs))
    assert group.epilogue_kind == "held_col" and [k.name for k in group.tail] == \
        ["lse", "scaled"]
    plan = p.fuse([members], forms=[variant])
    rng = np.random.default_rng(9)
    for rows, cols in ((9, 5), (301, 23), (1, 1), (4, 70)):
        x_value = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        c_value = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        out = p.run(backend="cpu", plan=plan, x=x_value, c=c_value)
        v = x_value.astype(np.float64)
        m = v.max(axis=0)
        t = np.exp(v - m).sum(axis=0)
        for name, value in {"total": t, "scaled": (m + np.log(t)) * c_value}.items():
            got = np.reshape(out[name], np.shape(value))
            scale = max(np.abs(value).max(), 1.0)
            assert np.abs(got - value).max() / scale <= 2e-5, (variant, rows, cols, name)


def test_a_tail_reads_only_results_at_its_own_row():
    """A tail map reading a map of the matrix, a row result at another row, or a column
    result after held rows is refused with the reason; a tail over the other axis makes no
    held group at all."""
    p = kf.Pipeline("tails_refused")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    shifted = kf.local(top.at(1) + kf.log(total), name="shifted")
    cols = kf.reduce_sum(x - top.at(0, dims=(0,)), axis=0, name="cols")
    across = kf.point(cols * 2.0, name="across")
    p.output(shifted, across)
    graph = p.graph()

    def reasons(members):
        return [v.reason for v in epilogue_violations(graph, members, None)]

    assert any("at another row" in r for r in reasons(["top", "total", "shifted"]))
    assert not reasons(["top", "total", "cols"])
    assert reasons(["top", "total", "cols", "across"])


@pytest.mark.parametrize("axis", [1, 0])
def test_statistics_then_their_map_plan_one_kernel(axis):
    """A log-sum-exp per row (per column) at the benchmark size: one held kernel, where the
    map of the results would otherwise be a second launch."""
    p = kf.Pipeline("lse")
    x = p.input("x", ndim=2)
    top = kf.reduce_max(x, axis=axis, name="top")
    at = top.at(0, dims=(1 - axis,))
    total = kf.reduce_sum(kf.exp(x - at), axis=axis, name="total")
    p.output(kf.point(top + kf.log(total), name="lse"))
    graph = p.graph()
    plan = p.plan(sizes=graph.bind_shapes({"x": get_app("rmsnorm").bench_size}))
    assert len(plan.groups) == 1, plan.explain()
    assert (":hr" if axis == 1 else ":hc") in plan.groups[0].variant


# four unit roundoffs of each two-byte float (inputs, the output and an operator's result
# rounded once each)
HALF_TOLERANCE = {"float16": 4 * 2.0**-11, "bfloat16": 4 * 2.0**-8}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["layernorm", "softmax", "logsumexp", "colstandardise"])
def test_half_precision_normalisations_are_one_kernel_and_equal_numpy(name, dtype):
    """Map-reduce forms load two-byte floats as float and store them rounded: held rows
    (LayerNorm), rows in segments (softmax), a held group's tail (log-sum-exp) and held
    columns each plan as one kernel at the benchmark size, and on odd rows and on rows of
    whole vectors equal NumPy and, to a rounding of the output, the unfused kernels."""
    from kfuse.apps.check import relative_error
    from kfuse.model.device import h200_like_profile
    from kfuse.search import default_plan

    app = get_app(name)
    pipeline = app.build(dtype=dtype)
    graph = pipeline.graph()
    plan = default_plan(graph, sizes=app.sizes(graph, app.bench_size),
                        profile=h200_like_profile())
    assert len(plan.groups) == 1, plan.explain()
    cpu_or_skip()
    for size in ((37, 133), (19, 136)):
        arrays, params = app.make_inputs(size, np.random.default_rng(size[1]), dtype)
        fused = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
        errors = reference_errors(app, arrays, params, fused)
        assert max(errors.values()) <= HALF_TOLERANCE[dtype], (size, errors)
        apart = pipeline.run(backend="cpu", plan="unfused", **arrays, **params)
        for output, value in fused.items():
            assert relative_error(value, apart[output]) <= HALF_TOLERANCE[dtype] / 2, output


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cross_entropy_of_labels_is_one_kernel(dtype):
    """The logit at each row's label is read from memory by the held group's tail (a read
    of an input at a computed column): one kernel at rows held whole and rows in segments,
    equal to NumPy at odd sizes, labels outside the row clamped (the read's mode)."""
    from kfuse.apps.normalise import build_cross_entropy_of_labels
    from kfuse.model.device import h200_like_profile
    from kfuse.runtime.numpy_backend import numpy_dtype
    from kfuse.search import default_plan

    p = build_cross_entropy_of_labels(dtype)
    graph = p.graph()
    plans = []
    for shape in ((16384, 4096), (1024, 131072)):
        plan = default_plan(graph, sizes=graph.bind_shapes({"x": shape, "labels": shape[:1]}),
                            profile=h200_like_profile())
        assert len(plan.groups) == 1 and plan.groups[0].form.held_rows, plan.explain()
        plans.append(plan)
    assert plans[1].groups[0].form.segmented
    cpu_or_skip()
    rng = np.random.default_rng(5)
    tolerance = 1e-6 if dtype == "float32" else HALF_TOLERANCE[dtype]
    for plan in plans:
        for rows, columns in ((37, 1001), (3, 4096)):
            x = rng.standard_normal((rows, columns)).astype(numpy_dtype(dtype))
            labels = rng.integers(-3, columns + 3, rows).astype(np.int32)
            loss = p.run(backend="cpu", plan=plan, x=x, labels=labels)["loss"]
            wide = x.astype(np.float64)
            top = wide.max(axis=1)
            want = top + np.log(np.exp(wide - top[:, None]).sum(axis=1)) \
                - wide[np.arange(rows), np.clip(labels, 0, columns - 1)]
            assert np.abs(loss - want).max() <= tolerance * np.abs(want).max(), (rows, columns)


@pytest.mark.parametrize("shape", [(16384, 4096), (64, 100000), (4096, 64)])
def test_epilogues_read_inputs_at_computed_indices(shape):
    """Row and column epilogues (not held) read an input at a computed index from memory:
    planned at sizes that take warp rows, block rows and whole columns, equal to NumPy with
    indices outside the axis clamped."""
    from kfuse.model.device import h200_like_profile
    from kfuse.search import default_plan

    p = kf.Pipeline("gathering_epilogues")
    x = p.input("x", ndim=2)
    labels = p.input("labels", shape=(x.shape[0],), dtype="int32")
    rows = p.input("rows", shape=(x.shape[1],), dtype="int32")
    squares = kf.reduce_sum(x * x, axis=1, name="squares")
    columns = kf.reduce_sum(x, axis=0, name="columns")
    p.output(kf.point(squares - x.at(0, 0, index={1: labels}), name="by_row"),
             kf.point(columns - x.at(0, 0, index={0: rows}), name="by_column"))
    graph = p.graph()
    plan = default_plan(graph, profile=h200_like_profile(), sizes=graph.bind_shapes(
        {"x": shape, "labels": shape[:1], "rows": shape[1:]}))
    assert any(set(group.members) == {"squares", "by_row"} for group in plan.groups), \
        plan.explain()  # (the row epilogue with its reduction; whole columns where they pay)
    cpu_or_skip()
    rng = np.random.default_rng(shape[1])
    x_values = rng.standard_normal((37, 53)).astype(np.float32)
    label_values = rng.integers(-2, 56, 37).astype(np.int32)
    row_values = rng.integers(-2, 40, 53).astype(np.int32)
    got = p.run(backend="cpu", plan=plan, x=x_values, labels=label_values, rows=row_values)
    wide = x_values.astype(np.float64)
    want = {"by_row": (wide * wide).sum(axis=1)
            - wide[np.arange(37), np.clip(label_values, 0, 52)],
            "by_column": wide.sum(axis=0) - wide[np.clip(row_values, 0, 36), np.arange(53)]}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
