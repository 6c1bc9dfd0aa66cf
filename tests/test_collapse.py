"""Adjacent axes every operator reads at its own point, merged before planning
(kfuse.ir.collapse): normalisations over (batch, seq, hidden) plan as the matrix pipelines
they are (one kernel) and equal NumPy on the cpu backend; what must keep axes apart does."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse.dsl as kf
from kfuse.errors import BindError, ShapeError
from kfuse.ir.collapse import axis_collapse
from kfuse.model.device import h200_like_profile
from kfuse.runtime.cpu_backend import CpuBackend
from kfuse.search import default_plan


def cpu_or_skip() -> None:
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def rmsnorm_3d() -> kf.Pipeline:
    """RMSNorm of activations (batch, seq, hidden), the row statistics an output too."""
    p = kf.Pipeline("rmsnorm_3d")
    x = p.input("x", ndim=3)
    g = p.input("g", shape=(x.shape[2],))
    inv_n = p.param("inv_n")
    s = kf.reduce_sum(x * x, axis=2, name="s")
    p.output(kf.point(x * kf.rsqrt(s.at(0, 0, dims=(0, 1)) * inv_n + 1e-6)
                      * g.at(0, dims=(2,)), name="y"), s)
    return p


def cross_entropy_3d() -> kf.Pipeline:
    """A token's cross-entropy over (batch, seq, vocab) logits and (batch, seq) labels."""
    p = kf.Pipeline("cross_entropy_3d")
    x = p.input("x", ndim=3)
    labels = p.input("labels", shape=(x.shape[0], x.shape[1]), dtype="int32")
    top = kf.reduce_max(x, axis=2, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, 0, dims=(0, 1))), axis=2, name="total")
    p.output(kf.point(top + kf.log(total) - x.at(0, 0, 0, index={2: labels}), name="loss"))
    return p


def group_norm() -> kf.Pipeline:
    """Statistics over the last axis of (batch, group, channels x pixels), centred first."""
    p = kf.Pipeline("group_norm")
    x = p.input("x", ndim=3)
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(x, axis=2, name="mean")
    centred = x - mean.at(0, 0, dims=(0, 1)) * inv_n
    var = kf.reduce_sum(centred * centred, axis=2, name="var")
    p.output(kf.point(centred * kf.rsqrt(var.at(0, 0, dims=(0, 1)) * inv_n + 1e-5), name="y"))
    return p


@pytest.mark.parametrize("build", [rmsnorm_3d, cross_entropy_3d, group_norm])
def test_normalisations_over_three_axes_are_one_kernel(build):
    """The first two axes merge into rows; the map-reduce search then holds each row (one
    kernel) at sizes users run; the plan of :meth:`Pipeline.plan` is the one run takes."""
    pipeline = build()
    collapse = axis_collapse(pipeline.graph())
    assert collapse is not None and collapse.merged == (("x.0", "x.1"),)
    shapes = {"x": (8, 2048, 4096), "g": (4096,), "labels": (8, 2048)}
    graph = collapse.graph
    plan = default_plan(graph, sizes=collapse.input_sizes(
        {name: shapes[name] for name in graph.inputs}), profile=h200_like_profile())
    assert len(plan.groups) == 1 and plan.groups[0].form.held_rows, plan.explain()
    sizes = {"x.0": 8, "x.1": 2048, "x.2": 4096}
    assert len(pipeline.plan(sizes=sizes).groups) == 1


@pytest.mark.parametrize("shape", [(3, 5, 77), (1, 7, 300), (4, 1, 9)])
def test_merged_runs_equal_numpy(shape):
    cpu_or_skip()
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    wide = x.astype(np.float64)
    g = rng.standard_normal(shape[2]).astype(np.float32)
    got = rmsnorm_3d().run(backend="cpu", x=x, g=g, inv_n=1.0 / shape[2])
    squares = (wide * wide).sum(axis=2)
    assert got["s"].shape == shape[:2] and got["y"].shape == shape
    np.testing.assert_allclose(got["s"], squares, rtol=2e-6)
    np.testing.assert_allclose(got["y"], wide / np.sqrt(squares[..., None] / shape[2] + 1e-6)
                               * g, rtol=2e-5, atol=2e-6)
    labels = rng.integers(0, shape[2], shape[:2]).astype(np.int32)
    loss = cross_entropy_3d().run(backend="cpu", x=x, labels=labels)["loss"]
    top = wide.max(axis=2)
    want = top + np.log(np.exp(wide - top[..., None]).sum(axis=2)) \
        - np.take_along_axis(wide, labels[..., None], axis=2)[..., 0]
    np.testing.assert_allclose(loss, want, rtol=2e-6, atol=2e-6)
    centred = wide - wide.mean(axis=2, keepdims=True)
    np.testing.assert_allclose(
        group_norm().run(backend="cpu", x=x, inv_n=1.0 / shape[2])["y"],
        centred / np.sqrt((centred * centred).mean(axis=2, keepdims=True) + 1e-5),
        rtol=2e-5, atol=2e-5)


def test_out_arrays_merged_in_place_or_the_call_runs_unmerged():
    """``out=`` arrays C-contiguous are written through their merged views (the caller's
    own arrays come back); one a reshape would copy sends the call down the unmerged path,
    which writes it; an input of the wrong size is named by the pipeline's own axes."""
    cpu_or_skip()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 33)).astype(np.float32)
    g = rng.standard_normal(33).astype(np.float32)
    compiled = rmsnorm_3d().compile(backend="cpu")
    want = compiled(x=x, g=g, inv_n=1.0 / 33)
    out = {"y": np.empty_like(x), "s": np.empty((3, 4), np.float32)}
    got = compiled(out=out, x=x, g=g, inv_n=1.0 / 33)
    assert got["y"] is out["y"] and got["s"] is out["s"]
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-6)
    strided = np.empty((3, 8, 33), np.float32)[:, ::2]  # (not C-contiguous: unmerged, where
    with pytest.raises(BindError, match="must be C-contiguous"):  # it is refused by name)
        compiled(out={"y": strided}, x=x, g=g, inv_n=1.0 / 33)
    assert "axes merged" in compiled.explain()
    with pytest.raises(ShapeError, match="must agree in size 'x.2'"):
        compiled(x=x, g=g[:5], inv_n=1.0)


def test_what_keeps_axes_apart():
    """A stencil along an axis, a coordinate read along one, a vector along part of a run and
    a reduction over part of it keep those axes apart; 2-D pipelines are left as they are."""
    p = kf.Pipeline("z_smooth")  # reads along z: only (y, x) merge
    x = p.input("x", ndim=3)
    p.output(kf.local((x.at(-1, 0, 0) + x + x.at(1, 0, 0)) / 3.0, boundary="clamp",
                      name="smooth"))
    assert axis_collapse(p.graph()).merged == (("x.1", "x.2"),)
    q = kf.Pipeline("causal")  # a mask from coordinates of the last two axes: none merge
    y = q.input("y", ndim=3)
    q.output(kf.point(kf.where(kf.coord(2) <= kf.coord(1), y, 0.0), name="masked"))
    assert axis_collapse(q.graph()) is None
    r = kf.Pipeline("per_batch")  # a value per batch: (seq, hidden) merge, not batch
    z = r.input("z", ndim=3)
    scale = r.input("scale", shape=(z.shape[0],))
    r.output(kf.point(z * scale.at(0, dims=(0,)), name="scaled"))
    assert axis_collapse(r.graph()).merged == (("z.1", "z.2"),)
    s = kf.Pipeline("middle")  # a reduction over the middle axis only: nothing merges
    w = s.input("w", ndim=3)
    s.output(kf.reduce_sum(w, axis=1, name="columns"))
    assert axis_collapse(s.graph()) is None
    t = kf.Pipeline("flat")
    v = t.input("v", ndim=2)
    t.output(kf.point(v * 2.0, name="doubled"))
    assert axis_collapse(t.graph()) is None
    cpu_or_skip()
    values = np.random.default_rng(4).standard_normal((4, 5, 6)).astype(np.float32)
    masked = q.run(backend="cpu", y=values)["masked"]
    i, j = np.meshgrid(np.arange(5), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(masked, np.where(j <= i, values, 0.0))
    factors = np.arange(1, 5, dtype=np.float32)
    np.testing.assert_allclose(r.run(backend="cpu", z=values, scale=factors)["scaled"],
                               values * factors[:, None, None], rtol=1e-6)


def test_merged_normalisations_on_dask_chunks():
    """Chunks of (batch, seq, hidden) cut along batch and seq: each chunk's call merges its
    axes (the plan made once for the merged graph)."""
    da = pytest.importorskip("dask.array")
    cpu_or_skip()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6, 40)).astype(np.float32)
    g = rng.standard_normal(40).astype(np.float32)
    pipeline = rmsnorm_3d()
    want = pipeline.run(backend="cpu", plan="unfused", x=x, g=g, inv_n=1.0 / 40)
    got = pipeline.run(backend="cpu", x=da.from_array(x, chunks=(3, 4, 40)),
                       g=da.from_array(g, chunks=40), inv_n=1.0 / 40)
    for name, value in want.items():
        np.testing.assert_allclose(got[name].compute(scheduler="threads"), value, rtol=2e-5,
                                   atol=2e-6, err_msg=name)


@pytest.mark.parametrize("axes", [(1, 2), (0, 1), (0, 2)])
def test_reductions_over_several_axes(axes):
    """A layer norm over (channels, pixels) of (batch, channels, pixels), and statistics over
    the first two axes: the axes merge and the pipeline is one kernel, equal to NumPy;
    axes that do not merge (a batch norm's (batch, pixels)) fold one axis at a time
    (kfuse.ir.fold: the innermost first, the operator's own name last) and equal NumPy."""
    rng = np.random.default_rng(sum(axes))
    x = rng.standard_normal((4, 5, 9)).astype(np.float32)
    wide = x.astype(np.float64)
    kept = tuple(a for a in range(3) if a not in axes)
    p = kf.Pipeline("several_axes")
    values = p.input("x", ndim=3)
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(values, axis=axes, name="mean")
    centred = values - mean.at(0, dims=kept) * inv_n
    var = kf.reduce_sum(centred * centred, axis=axes, name="var")
    p.output(kf.point(centred * kf.rsqrt(var.at(0, dims=kept) * inv_n + 1e-5), name="y"))
    count = int(np.prod([x.shape[a] for a in axes]))
    centred_values = wide - wide.mean(axis=axes, keepdims=True)
    want = centred_values / np.sqrt((centred_values ** 2).mean(axis=axes, keepdims=True) + 1e-5)
    np.testing.assert_allclose(p.run(backend="numpy", x=x, inv_n=1.0 / count)["y"], want,
                               rtol=2e-5, atol=2e-5)
    if axes == (0, 2):
        assert axis_collapse(p.graph()) is None
        assert [(k.name, k.reduction.axes) for k in p.graph().kernels if k.reduction] == [
            ("mean_axis2", (2,)), ("mean", (0,)), ("var_axis2", (2,)), ("var", (0,))]
    else:
        assert len(p.plan(sizes={"x.0": 32, "x.1": 256, "x.2": 3136}).groups) == 1
    cpu_or_skip()
    np.testing.assert_allclose(p.run(backend="cpu", x=x, inv_n=1.0 / count)["y"], want,
                               rtol=2e-5, atol=2e-5)


def test_several_axes_named_once():
    from kfuse.errors import DslError

    p = kf.Pipeline("twice")
    x = p.input("x", ndim=3)
    with pytest.raises(DslError, match=r"names an axis twice"):
        kf.reduce_sum(x, axis=(1, 1), name="twice")
    with pytest.raises(DslError):
        kf.reduce_sum(x, axis=(1, 5), name="outside")


def test_folded_reductions_of_every_op_equal_numpy():
    """A maximum, a minimum and a count of a condition over axes that do not merge, folded
    one axis at a time: each equals NumPy's over both axes at odd sizes (a length-1 axis
    among them), read back at every point, on the cpu backend as on numpy."""
    for shape in [(3, 5, 7), (1, 4, 9), (6, 1, 5)]:
        rng = np.random.default_rng(sum(shape))
        x = rng.standard_normal(shape).astype(np.float32)
        p = kf.Pipeline("folded_ops")
        values = p.input("x", ndim=3)
        top = kf.reduce_max(values, axis=(0, 2), name="top")
        low = kf.reduce_min(values, axis=(0, 2), name="low")
        count = kf.reduce_sum(values > 0.25, axis=(0, 2), name="count")
        p.output(kf.point((values - low.at(0, dims=(1,))) / (top.at(0, dims=(1,)) -
                          low.at(0, dims=(1,)) + 1.0), name="scaled"), count, top)
        want_top, want_low = x.max(axis=(0, 2)), x.min(axis=(0, 2))
        for backend in ("numpy", "cpu"):
            if backend == "cpu":
                cpu_or_skip()
            got = p.run(backend=backend, x=x)
            np.testing.assert_array_equal(got["top"], want_top)
            np.testing.assert_array_equal(got["count"], (x > 0.25).sum(axis=(0, 2)))
            np.testing.assert_allclose(
                got["scaled"], (x - want_low[:, None]) / (want_top - want_low + 1.0)[:, None],
                rtol=1e-6, atol=1e-6)


def test_pipelines_over_four_axes_compile_where_they_merge_to_three():
    """An NCHW batch norm (statistics over (N, H, W), a gain and bias per channel): (H, W)
    merge and fold together, N after; a channels-last RMSNorm over (N, H, W, C) merges its
    first three axes (one kernel); a stencil along N and W merges (C, H). Each equals NumPy
    on the cpu backend at odd sizes; a stencil along all four axes runs on the numpy backend
    and is refused by name where it would compile."""
    from kfuse.errors import CompileError

    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5, 7, 9)).astype(np.float32)
    gain, bias = (rng.standard_normal(5).astype(np.float32) for _ in range(2))
    p = kf.Pipeline("batch_norm_nchw")
    values = p.input("x", ndim=4)
    g = p.input("g", shape=(values.shape[1],))
    b = p.input("b", shape=(values.shape[1],))
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(values, axis=(0, 2, 3), name="mean")
    centred = values - mean.at(0, dims=(1,)) * inv_n
    var = kf.reduce_sum(centred * centred, axis=(0, 2, 3), name="var")
    p.output(kf.point(centred * kf.rsqrt(var.at(0, dims=(1,)) * inv_n + 1e-5)
                      * g.at(0, dims=(1,)) + b.at(0, dims=(1,)), name="y"))
    assert [(k.name, k.reduction.axes) for k in p.graph().kernels if k.reduction] == [
        ("mean_axes2_3", (2, 3)), ("mean", (0,)), ("var_axes2_3", (2, 3)), ("var", (0,))]
    plan = p.plan(sizes={"x.0": 32, "x.1": 64, "x.2": 56, "x.3": 56})
    assert all(len(group.domain) <= 3 for group in plan.graph.kernels), plan.explain()
    wide = x.astype(np.float64)
    c = wide - wide.mean(axis=(0, 2, 3), keepdims=True)
    want = c / np.sqrt((c * c).mean(axis=(0, 2, 3), keepdims=True) + 1e-5) \
        * gain[:, None, None] + bias[:, None, None]

    q = kf.Pipeline("rmsnorm_channels_last")
    h = q.input("h", ndim=4)
    s = kf.reduce_sum(h * h, axis=3, name="s")
    q.output(kf.point(h * kf.rsqrt(s.at(0, 0, 0, dims=(0, 1, 2)) * (1.0 / 9) + 1e-6),
                      name="y"))
    assert len(q.plan(sizes={"h.0": 8, "h.1": 64, "h.2": 64, "h.3": 4096}).groups) == 1

    r = kf.Pipeline("along_n_and_w")
    u = r.input("u", ndim=4)
    r.output(kf.local((u.at(-1, 0, 0, 0) + u + u.at(0, 0, 0, 1)) / 3.0, boundary="mirror",
                      name="s"))
    t = kf.Pipeline("along_all_four")
    w = t.input("w", ndim=4)
    t.output(kf.local(w.at(-1, 0, 0, 0) + w.at(0, -1, 0, 0) + w.at(0, 0, -1, 0)
                      + w.at(0, 0, 0, -1), boundary="clamp", name="t"))
    assert t.run(backend="numpy", w=x)["t"].shape == x.shape
    with pytest.raises(CompileError, match=r"operator 't'.*iterates over 4 axes"):
        t.plan(sizes={"w.0": 3, "w.1": 5, "w.2": 7, "w.3": 9})
    cpu_or_skip()
    np.testing.assert_allclose(p.run(backend="cpu", x=x, g=gain, b=bias,
                                     inv_n=1.0 / (3 * 7 * 9))["y"], want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(q.run(backend="cpu", h=x)["y"],
                               wide / np.sqrt((wide * wide).mean(axis=3, keepdims=True) + 1e-6),
                               rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(r.run(backend="cpu", u=x)["s"], r.run(backend="numpy", u=x)["s"],
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(CompileError, match=r"operator 't'.*iterates over 4 axes"):
        t.run(backend="cpu", w=x)
