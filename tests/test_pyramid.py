"""Reads at another resolution (``x.at(..., down=f)`` / ``up=f``), the sizes of pyramid
levels, and the pyramid operators of kfuse.dsl.pyramid, against NumPy references written
here independently of kfuse (strided slices, np.pad), on the cpu backend: odd sizes, levels of
one element, every boundary mode, fused and unfused."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps.pyramids import downsample_reference, upsample_reference
from kfuse.errors import DslError, ShapeError
from kfuse.ir.sizes import bind_derived, describe_size, scaled_size
from kfuse.schedule.forms import Recompute

MODES = ["clamp", "mirror", "repeat", ("constant", 0.25)]


def _boundary(mode):
    return kf.constant(mode[1]) if isinstance(mode, tuple) else mode


def _pad_read(x: np.ndarray, index: np.ndarray, axis: int, mode) -> np.ndarray:
    """``x`` read at ``index`` along ``axis`` (any distance outside) as ``mode`` says."""
    n = x.shape[axis]
    if isinstance(mode, tuple):
        inside = (index >= 0) & (index < n)
        picked = np.take(x, np.clip(index, 0, n - 1), axis)
        shape = [1] * x.ndim
        shape[axis] = index.size
        return np.where(inside.reshape(shape), picked, mode[1])
    if mode == "clamp":
        mapped = np.clip(index, 0, n - 1)
    elif mode == "repeat":
        mapped = index % n
    else:
        folded = index % (2 * n)
        mapped = np.where(folded < n, folded, 2 * n - 1 - folded)
    return np.take(x, mapped, axis)


@pytest.mark.parametrize(("mode", "shape"), [(mode, (13, 17)) for mode in MODES] +
                         [("clamp", (1, 1)), ("mirror", (2, 5))], ids=str)
def test_downsample_and_upsample_equal_numpy(mode, shape):
    p = kf.Pipeline("levels2")
    x = p.input("x", 2)
    coarse = kf.downsample(x, boundary=_boundary(mode), name="coarse")
    back = kf.upsample(coarse, like=x, boundary=_boundary(mode), name="back")
    near = kf.upsample(coarse, interpolation="nearest", boundary=_boundary(mode), name="near")
    p.output(coarse, back, near)
    values = np.random.default_rng(sum(shape)).random(shape, dtype=np.float32)
    want_coarse = downsample_reference(values.astype(np.float64), mode)
    want_back = upsample_reference(want_coarse, shape, mode)
    want_near = np.repeat(np.repeat(want_coarse, 2, 0), 2, 1)
    for plan in ("unfused", "auto") if shape == (13, 17) else ("auto",):
        got = p.run(backend="cpu", plan=plan, x=values)
        assert got["coarse"].shape == tuple(-(-n // 2) for n in shape)
        np.testing.assert_allclose(got["coarse"], want_coarse, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["back"], want_back, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["near"], want_near, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_raw_reads_down_and_up_by_any_factor_and_offset(mode):
    """``x.at(dy, dx, down=(1, 3))`` reads ``(p + dy, 3 q + dx)``, ``up=(2, 3)`` reads
    ``(p // 2 + dy, q // 3 + dx)``, every distance outside through the mode."""
    p = kf.Pipeline("raw")
    x = p.input("x", 2)
    down = kf.local(x.at(1, -2, down=(1, 3), boundary=_boundary(mode)) * 2.0, name="down")
    up = kf.local(x.at(-1, 2, up=(2, 3), boundary=_boundary(mode)) + 1.0, name="up")
    p.output(down, up)
    values = np.random.default_rng(5).random((5, 7), dtype=np.float32).astype(np.float64)
    got = p.run(backend="cpu", x=values.astype(np.float32))
    rows, columns = np.arange(5) + 1, 3 * np.arange(3) - 2
    want = _pad_read(_pad_read(values, rows, 0, mode), columns, 1, mode) * 2.0
    np.testing.assert_allclose(got["down"], want, rtol=1e-6)
    rows, columns = np.arange(10) // 2 - 1, np.arange(21) // 3 + 2
    want = _pad_read(_pad_read(values, rows, 0, mode), columns, 1, mode) + 1.0
    np.testing.assert_allclose(got["up"], want, rtol=1e-6)


def test_laplacian_pyramid_collapses_back_to_its_input():
    p = kf.Pipeline("roundtrip")
    x = p.input("x", 2)
    levels = kf.laplacian_pyramid(x, 3)
    p.output(kf.collapse(levels, name="again"), levels[-1])
    values = np.random.default_rng(2).random((45, 38), dtype=np.float32)
    got = p.run(backend="cpu", x=values)
    np.testing.assert_allclose(got["again"], values, rtol=1e-5, atol=1e-6)
    assert got[levels[-1].name].shape == (12, 10)  # ceil(ceil(45/2)/2), ceil(ceil(38/2)/2)


def test_three_d_levels_along_some_axes_fused_with_stencils():
    """A volume downsampled along y and x only, then a stencil chain on the coarse grid
    fused with it (the downsampling read inside the fused kernel) and upsampled back."""
    p = kf.Pipeline("volume")
    v = p.input("v", 3)
    coarse = kf.point(kf.downsampled(v, axes=(1, 2)) * 1.5, name="coarse")
    smooth = kf.local((coarse.at(0, 0, 1) + coarse.at(0, 0, -1) + coarse.at(1, 0, 0)
                       + coarse.at(-1, 0, 0)) * 0.25 + coarse, boundary="mirror", name="smooth")
    back = kf.upsample(smooth, axes=(1, 2), like=v, interpolation="nearest", name="back")
    p.output(back, coarse, smooth)
    values = np.random.default_rng(3).random((5, 9, 12), dtype=np.float32)
    # (a short register tile: the default's 64 points take the compilers 20 s here)
    plan = p.fuse([["coarse", "smooth"]], forms=[Recompute(tile=(2, 1, 4))])
    assert len(plan.groups) == 2
    got = p.run(backend="cpu", plan=plan, v=values)
    want = p.run(backend="numpy", v=values)
    np.testing.assert_allclose(got["back"], want["back"], rtol=1e-5)
    for plane in range(5):  # each plane downsampled alone
        level = downsample_reference(values.astype(np.float64)[plane], "clamp")
        np.testing.assert_allclose(got["coarse"][plane], 1.5 * level, rtol=1e-5)
        nearest = np.repeat(np.repeat(got["smooth"][plane], 2, 0), 2, 1)[:9, :12]
        np.testing.assert_array_equal(got["back"][plane], nearest)


def test_reductions_over_a_coarser_grid_in_every_map_reduce_form():
    p = kf.Pipeline("reduced")
    x = p.input("x", 2)
    total = kf.reduce_sum(kf.downsampled(x) * x.at(0, 0, down=2), name="total")
    rows = kf.reduce_max(kf.downsampled(x, 3) + x.at(0, 1, down=3), axis=1, name="rows")
    p.output(total, rows)
    values = np.random.default_rng(4).random((31, 44), dtype=np.float32)
    want = p.run(backend="numpy", x=values)
    from kfuse.search.variants import group_variants

    graph = p.graph()
    for name in ("total", "rows"):
        for variant in [v for v in group_variants(graph, [name]) if v != "auto"][:6]:
            plan = p.fuse([[name]], forms=[variant])
            got = p.run(backend="cpu", plan=plan, x=values)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=variant)


def test_a_coarse_input_binds_to_a_derived_size_and_a_wrong_one_is_named():
    p = kf.Pipeline("coarse_input")
    x = p.input("x", 2)
    detail = p.input("detail", 2)
    p.output(kf.point(kf.downsampled(x) + detail, name="sum"))
    assert p.graph().buffers["detail"].shape == ("x.0/2", "x.1/2")
    got = p.run(backend="cpu", x=np.ones((9, 4), np.float32),
                detail=np.full((5, 2), 2.0, np.float32))
    np.testing.assert_allclose(got["sum"], 3.0)
    with pytest.raises(ShapeError, match=r"'detail' must have 5 elements .* ceil\(x.0/2\)"):
        p.run(backend="cpu", x=np.ones((9, 4), np.float32),
              detail=np.ones((4, 2), np.float32))
    plan = p.plan(sizes={"x.0": 9, "x.1": 4})  # the level's sizes follow from the base's
    assert plan.groups


def test_levels_that_cannot_be_proved_equal_are_refused_by_name():
    p = kf.Pipeline("unrelated")
    x, y = p.input("x", 2), p.input("y", 2)
    with pytest.raises(ShapeError, match=r"operator .mixed.*ceil\(y.0/2\) and ceil\(x.0/2\)"):
        kf.point(kf.downsampled(x) + kf.downsampled(y), name="mixed")
    with pytest.raises(ShapeError, match=r"operator 'levels'.*ceil\(x.0/2\) and x.0,"):
        kf.point(x + kf.downsampled(x), name="levels")
    same = p.input("same", shape=("h", "w"))
    other = p.input("other", shape=("h", "w"))
    p.output(kf.point(kf.downsampled(same) - kf.downsampled(other), name="fine"),
             kf.point(x + y, name="plain"))
    assert p.graph().kernel_by_name["fine"].domain == ("h/2", "w/2")


def test_bad_scaled_reads_get_named_errors():
    p = kf.Pipeline("bad")
    x = p.input("x", 2)
    with pytest.raises(DslError, match="either down= or up="):
        x.at(0, 0, down=2, up=2)
    with pytest.raises(DslError, match="whole factor"):
        x.at(0, 0, down=(2,))
    with pytest.raises(DslError, match="whole factor"):
        x.at(0, 0, up=0)
    with pytest.raises(DslError, match="factor must be a whole number >= 2"):
        kf.downsample(x, 1)
    with pytest.raises(DslError, match="interpolation must be one of nearest, linear"):
        kf.upsample(x, interpolation="cubic")
    with pytest.raises(DslError, match="names an axis twice"):
        kf.downsampled(x, axes=(1, -1))


def test_a_scaled_read_of_a_producer_evaluates_it_where_read():
    p = kf.Pipeline("producer")
    x = p.input("x", 2)
    fine = kf.point(x * 2.0, name="fine")
    zoomed = kf.upsample(fine, like=fine, name="zoomed")  # (the same grid, read at p // 2)
    p.output(zoomed)
    values = np.random.default_rng(7).random((9, 6), dtype=np.float32)
    got = p.run(backend="cpu", plan=p.fuse([["fine", "zoomed"]]), x=values)
    np.testing.assert_allclose(got["zoomed"], p.run(backend="numpy", x=values)["zoomed"],
                               rtol=1e-6)


def test_integer_floor_division_and_remainder_follow_numpy():
    p = kf.Pipeline("phases")
    x = p.input("x", 1, dtype="int32")
    p.output(kf.point((x - 7) // 3 + (x - 7) % 4 * 100, name="phase"))
    values = np.arange(-9, 12, dtype=np.int32)
    got = p.run(backend="cpu", x=values)
    np.testing.assert_array_equal(got["phase"], (values - 7) // 3 + (values - 7) % 4 * 100)
    y = p.input("y", 1)
    with pytest.raises(DslError, match="integer expression on the left"):
        y // 2
    with pytest.raises(DslError, match="positive integer constant"):
        x % 0
    with pytest.raises(DslError, match="positive integer constant"):
        x // x


def test_derived_size_symbols():
    assert scaled_size("n", "/", 2) == "n/2" and scaled_size("9", "/", 2) == "5"
    assert scaled_size("n/2", "*", 3) == "n/2*3" and scaled_size("n", "/", 1) == "n"
    assert describe_size("n/2/2") == "ceil(ceil(n/2)/2)"
    sizes = {"n": 9, "n/2/2": 3}
    assert bind_derived(["n/2/2", "n*2"], sizes) == []
    assert sizes == {"n": 9, "n/2": 5, "n/2/2": 3, "n*2": 18}
    assert bind_derived(["n/2/2"], {"n": 9, "n/2/2": 4}) == [("n/2/2", 4, 3)]


def test_scaled_reads_change_the_fingerprint():
    def built(factor: int):
        p = kf.Pipeline("same")
        x = p.input("x", 2)
        p.output(kf.point(x.at(0, 0, up=factor) * 2.0, name="y"))
        return p.graph()

    assert built(2).fingerprint != built(3).fingerprint


def test_one_array_read_at_the_point_and_at_another_resolution_stays_two_reads():
    """Reads that differ only in their scale are different reads (never one value)."""
    p = kf.Pipeline("both")
    x = p.input("x", 2)
    p.output(kf.point(x + x.at(0, 0, up=2) * 10.0, name="mixed"),
             kf.point(x.at(0, 0, down=(1, 1)) - x.at(0, 0, up=(1, 3)), name="columns"))
    values = np.random.default_rng(6).random((7, 9), dtype=np.float32)
    got = p.run(backend="cpu", x=values)
    coarse = values[np.arange(7) // 2][:, np.arange(9) // 2]
    np.testing.assert_allclose(got["mixed"], values + coarse * 10.0, rtol=1e-6)
    np.testing.assert_allclose(got["columns"], values - values[:, np.arange(9) // 3], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("size", [(37, 53), (1, 1), (6, 5)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_local_laplacian_filter_as_written_equals_its_numpy_reference(mode, size):
    """The app's pipeline (levels, intensity stacks, reads at computed levels, uint16 in and
    out) evaluated by kfuse's truth, against the independent reference."""
    from kfuse.apps.check import reference_errors
    from kfuse.apps.pyramids import LOCAL_LAPLACIAN

    arrays, params = LOCAL_LAPLACIAN.make_inputs(size, np.random.default_rng(9), "float32")
    outputs = LOCAL_LAPLACIAN.build(boundary=_boundary(mode)).run(backend="numpy", **arrays,
                                                                  **params)
    errors = reference_errors(LOCAL_LAPLACIAN, arrays, params, outputs, mode)
    assert max(errors.values()) <= LOCAL_LAPLACIAN.tolerance, errors


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_exposure_fusion_equals_its_numpy_reference(mode):
    """The third pyramid app (Mertens et al. 2007): kfuse's truth in every mode at odd sizes
    and at the smallest image its 3x3 contrast allows (levels of 1x1 below). Its kinds of
    operator run fused and unfused in every mode through the cpu backend in the blend
    app's tests and the tests above (its own default plan is 110,000 lines of C: a minute of
    the host compiler, more than the suite can give it)."""
    from kfuse.apps.check import reference_errors
    from kfuse.apps.pyramids import EXPOSURE_FUSION as app

    pipeline = app.build(boundary=_boundary(mode))
    for size in ((37, 53), (2, 2), (6, 5)):
        arrays, params = app.make_inputs(size, np.random.default_rng(11))
        errors = reference_errors(app, arrays, params,
                                  pipeline.run(backend="numpy", **arrays), mode)
        assert max(errors.values()) <= app.tolerance, (size, errors)


def test_a_register_tile_resamples_with_constant_phases_and_shared_points():
    """A tile starts at a multiple of its shape: an upsampled read's phase in it is a
    constant (no ``%`` left, selects resolved) and a downsampled tap reached from two points
    is one index; the program still equals NumPy (above) in every mode."""
    from kfuse.codegen import generate

    p = kf.Pipeline("tile")
    x = p.input("x", 2)
    coarse = kf.downsample(x, name="coarse")
    p.output(kf.point(x - kf.upsampled(coarse), name="detail"))
    graph = p.graph()
    source = generate(graph, [(["detail"], ["detail"])], fixed_sizes={"x.0": 64, "x.1": 64})
    tile = source.source.split("register tile")[1].split("} else {")[0]
    assert "% 2" not in tile and "?" not in tile
    down = generate(graph, [(["coarse"], ["coarse"])], fixed_sizes={"x.0": 64, "x.1": 64})
    tile = down.source.split("register tile")[1].split("} else {")[0]
    columns = re.findall(r"kf_clamp\((ix[^,]*), n_x_1\)", tile)
    assert columns and len(columns) == len(set(columns))  # each column index once
    assert len(set(columns)) == 2 * 4 + 2  # 4 columns of taps 2p-1 .. 2p+2, shared


def test_constant_operations_fold_as_c_computes_them():
    from kfuse.codegen.cexpr import folded_value
    from kfuse.ir.expr import Binary, Cast, Const, Unary

    def binary(op, a, b, dtype):
        return folded_value(Binary(op, Const(a, dtype), Const(b, dtype), dtype), [a, b])

    assert binary("mul", 2, 3, "int32") == 6 and binary("mod", -3, 2, "int32") == 1
    assert binary("floordiv", -3, 2, "int32") == -2
    assert binary("mul", 2**20, 2**12, "int32") is None  # wraps in C: left to the device
    assert binary("add", 0.1, 0.2, "float32") == float(np.float32(0.1) + np.float32(0.2))
    assert folded_value(Binary("lt", Const(1, "int32"), Const(2, "int32"), "bool"),
                        [1, 2]) is True
    assert folded_value(Cast(Const(3, "int32"), "float32"), [3]) == 3.0
    assert folded_value(Cast(Const(2**25, "int32"), "float32"), [2**25]) is None
    assert folded_value(Unary("abs", Const(-0.5, "float32"), "float32"), [-0.5]) == 0.5
    assert folded_value(Binary("add", Const(1.0, "float64"), Const(2.0, "float64"),
                               "float64"), [1.0, 2.0]) is None  # only bool, int32, float32


def test_coarse_levels_get_tiles_that_fill_the_gpu():
    """Where the GPU runs a plan, 2-D tiled kernels over few points (a pyramid's coarse
    levels) get smaller register tiles, so that their grids fill the device; the finest
    level keeps its tile, the cpu backend's plans the default ones, and the program still
    equals NumPy."""
    from kfuse.apps import get_app
    from kfuse.model.device import default_profile
    from kfuse.runtime import planned
    from kfuse.schedule.tiles import FILL_THREADS_PER_SM, filling_tile
    from kfuse.search import default_plan

    sms = default_profile().sm_count
    assert filling_tile((8, 4), 8192 * 8192, sms) == (8, 4)
    assert filling_tile((8, 4), 1024 * 1024, 132) == (1, 4)  # 262144 threads
    assert filling_tile((10, 4), 64 * 64, 132) == (1, 1)
    app = get_app("blend")
    graph = app.build().graph()
    sizes = app.sizes(graph, (4096, 4096))
    plain = default_plan(graph, sizes)
    filled = default_plan(graph, sizes, fill_device=True)
    tiles = {group.members: group.tile for group in filled.groups}
    assert all(group.tile == tiles[group.members] or "too few to fill" in
               filled.group_of(group.members[0]).reason for group in plain.groups)
    assert tiles[plain.group_of("blended").members] is None  # the finest level: as it was
    level2 = filled.group_of("b_g2")  # 1024 x 1024 points: 1 x 4 tiles
    assert "too few to fill" in level2.reason
    points = sizes["a.0/2/2"] * sizes["a.1/2/2"]
    assert level2.tile == filling_tile((8, 4), points, sms)
    assert points // (level2.tile[0] * level2.tile[1]) >= sms * FILL_THREADS_PER_SM
    assert filled.group_of("b_g4").tile == (1, 1)  # 256 x 256: one point a thread
    small = (45, 67)
    arrays, params = app.make_inputs(small, np.random.default_rng(5), "float32")
    pipeline = app.build()
    gpu_plan = planned(pipeline.graph(), app.sizes(pipeline.graph(), small), "auto", "cuda")
    assert any(group.tile for group in gpu_plan.groups)
    got = pipeline.run(backend="cpu", plan=gpu_plan, **arrays, **params)
    want = app.reference(arrays, params, "clamp")
    np.testing.assert_allclose(got["blended"], want["blended"], rtol=1e-4, atol=1e-5)
    cpu_plan = planned(pipeline.graph(), app.sizes(pipeline.graph(), small), "auto", "cpu")
    assert not any("too few to fill" in group.reason for group in cpu_plan.groups)
