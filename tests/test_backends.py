"""The generated CUDA C, run on the cpu backend, equals the float64 NumPy reference.

Every code shape of the unfused generator is exercised: flat point kernels, 1-D/2-D/3-D
stencils with every boundary mode, broadcast reads, coordinates, parameters, reductions
over all axes and over each single axis, for float32, float64 and int32.
"""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps.check import relative_error
from kfuse.runtime import get_backend
from kfuse.runtime.numpy_backend import NumpyBackend

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.75)]
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "int32": 0.0}


def random_array(rng, shape, dtype="float32", low=0.1, high=1.1):
    if dtype == "int32":
        return rng.integers(-50, 50, size=shape).astype(np.int32)
    return rng.uniform(low, high, size=shape).astype(dtype)


def check(pipeline: kf.Pipeline, given: dict, backend: str = "cpu") -> dict:
    """Run on ``backend`` and on the float64 reference; assert they agree; return errors."""
    graph = pipeline.graph()
    out = get_backend(backend).run(graph, given)
    ref = NumpyBackend(precision="float64").run(graph, given)
    errors = {}
    for name in graph.outputs:
        dtype = graph.buffers[name].dtype
        assert out[name].shape == ref[name].shape, name
        assert out[name].dtype == np.dtype(dtype), name
        errors[name] = relative_error(out[name], ref[name])
        assert errors[name] <= TOLERANCE[dtype], (name, errors[name])
    return errors


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_stencil_1d(boundary, rng):
    p = kf.Pipeline("s1")
    x = p.input("x", ndim=1)
    y = kf.local(0.25 * x.at(-3) + 0.5 * x.at(0) - x.at(2) + x.at(1) * x.at(-1),
                 boundary=boundary)
    p.output(y)
    check(p, {"x": random_array(rng, (101,))})


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_stencil_2d_every_mode(boundary, rng):
    p = kf.Pipeline("s2")
    img = p.input("img", ndim=2)
    blur = kf.convolve(img, [[1, 2, 1], [2, 4, 2], [1, 2, 1]], boundary=boundary, scale=1 / 16)
    edge = kf.local(blur.at(-2, 1) - blur.at(1, -2) + blur.at(0, 0), boundary=boundary)
    p.output(blur, edge)
    check(p, {"img": random_array(rng, (37, 53))})


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_stencil_3d_every_mode(boundary, rng):
    p = kf.Pipeline("s3")
    u = p.input("u", ndim=3)
    c = p.param("c")
    lap = kf.local(u.at(-1, 0, 0) + u.at(1, 0, 0) + u.at(0, -1, 0) + u.at(0, 1, 0)
                   + u.at(0, 0, -1) + u.at(0, 0, 2) - 6.0 * u, boundary=boundary)
    out = kf.point(u + c * lap)
    p.output(out)
    check(p, {"u": random_array(rng, (13, 11, 9)), "c": 0.1})


def test_mixed_boundary_modes_in_one_operator(rng):
    p = kf.Pipeline("mixed")
    x = p.input("x", ndim=2)
    y = kf.local(x.at(-1, 0, boundary="clamp") + x.at(0, 2, boundary="mirror")
                 + x.at(3, -1, boundary="repeat") + x.at(-2, -2, boundary=kf.constant(-1.5)))
    p.output(y)
    check(p, {"x": random_array(rng, (17, 19))})


def test_overhang_up_to_the_array_size(rng):
    p = kf.Pipeline("far")
    x = p.input("x", ndim=1)
    y = kf.local(x.at(-6, boundary="mirror") + x.at(6, boundary="repeat")
                 + x.at(5, boundary="clamp"))
    p.output(y)
    check(p, {"x": random_array(rng, (7,))})


def test_math_functions(rng):
    p = kf.Pipeline("math")
    a = p.input("a", ndim=2)
    b = p.input("b", ndim=2)
    out = kf.point(kf.sqrt(a) + kf.rsqrt(b) + kf.exp(-a) + kf.log(b) + kf.sin(a) * kf.cos(b)
                   + kf.tanh(a - b) + kf.abs(a - b) + kf.floor(a * 3) + kf.ceil(b * 3)
                   + kf.minimum(a, b) - kf.maximum(a, b) + kf.pow(a, b) + a ** 2.0
                   + kf.where((a > b) & ~(b < 0.3), a / b, -b)
                   + kf.astype(kf.astype(a * 10, "int32"), "float32"))
    p.output(out)
    check(p, {"a": random_array(rng, (23, 29)), "b": random_array(rng, (23, 29))})


def test_int32_and_float64(rng):
    p = kf.Pipeline("types")
    i = p.input("i", ndim=1, dtype="int32")
    d = p.input("d", ndim=1, dtype="float64")
    k = p.param("k", dtype="int32")
    ints = kf.local(i.at(-1) * k + kf.minimum(i, i.at(1)) - kf.abs(i), boundary="repeat")
    mixed = kf.point(d * kf.astype(ints, "float64") + kf.sqrt(d))
    p.output(ints, mixed)
    check(p, {"i": random_array(rng, (45,), "int32"), "d": random_array(rng, (45,), "float64"),
              "k": 3})


def test_coordinates(rng):
    p = kf.Pipeline("coords")
    x = p.input("x", ndim=2)
    y = kf.point(x * kf.astype(kf.coord(0), "float32") + kf.astype(kf.coord(1), "float32"))
    p.output(y)
    check(p, {"x": random_array(rng, (9, 14))})


@pytest.mark.parametrize("op", ["sum", "min", "max"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_full_reduction(op, dtype, rng):
    p = kf.Pipeline("full")
    x = p.input("x", ndim=2, dtype=dtype)
    total = kf.reduce(x * 2 + 1, op)
    p.output(total)
    check(p, {"x": random_array(rng, (61, 47), dtype)})


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_axis_reduction_3d(axis, op, rng):
    p = kf.Pipeline("axis")
    x = p.input("x", ndim=3)
    r = kf.reduce(kf.local(x.at(0, 1, 0) - x.at(0, 0, -1), boundary="mirror") * x, op, axis)
    p.output(r)
    check(p, {"x": random_array(rng, (7, 33, 5))})


def test_axis_reduction_long_rows(rng):
    p = kf.Pipeline("rows")
    x = p.input("x", ndim=2)
    r = kf.reduce_sum(x, axis=1)
    c = kf.reduce_max(x, axis=0)
    p.output(r, c)
    check(p, {"x": random_array(rng, (3, 4099))})


def test_broadcast_reads(rng):
    p = kf.Pipeline("bcast")
    m = p.input("m", ndim=2)
    u = p.input("u", shape=(m.shape[0],))
    v = p.input("v", shape=(m.shape[1],))
    total = kf.reduce_sum(m)
    rows = kf.reduce_sum(m, axis=1)
    out = kf.point(m / total + u.at(0, dims=(0,)) * v.at(0, dims=(1,))
                   - rows.at(0, dims=(0,)))
    shifted = kf.local(v.at(1, dims=(1,), boundary="repeat") + m)
    p.output(out, shifted)
    check(p, {"m": random_array(rng, (19, 23)), "u": random_array(rng, (19,)),
              "v": random_array(rng, (23,))})


def test_every_output_element_is_written(rng):
    # Outputs start poisoned with NaN; a kernel that skipped elements would leave NaN.
    p = kf.Pipeline("cover")
    x = p.input("x", ndim=3)
    y = kf.local(x.at(1, 1, 1) + x, boundary="clamp")
    p.output(y)
    out = get_backend("cpu").run(p.graph(), {"x": random_array(rng, (3, 17, 33))})
    assert not np.isnan(out["y"]).any()


def test_numpy_and_cpu_take_the_same_arguments(rng):
    p = kf.Pipeline("same")
    x = p.input("x", ndim=2)
    s = p.param("s")
    p.output(kf.point(x * s, name="y"))
    data = random_array(rng, (5, 7))
    cpu = p.run(backend="cpu", x=data, s=2.0)["y"]
    ref = p.run(backend="numpy", x=data, s=2.0)["y"]
    np.testing.assert_allclose(cpu, ref, rtol=1e-6)


def test_auto_plan_is_searched_once_per_graph_and_sizes(rng, monkeypatch, tmp_path):
    """plan="auto" plans at the arrays' sizes once; the same pipeline run again on arrays
    of the same shapes reuses the plan, other shapes plan again (and results stay right).
    (An empty cache folder: a program stored on disk would need no plan at all.)"""
    import kfuse.search

    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    calls = []
    original = kfuse.search.default_plan

    def counting(graph, sizes=None, profile=None, **options):
        calls.append(dict(sizes))
        return original(graph, sizes, profile, **options)

    monkeypatch.setattr(kfuse.search, "default_plan", counting)
    p = kf.Pipeline("blur_again")
    x = p.input("x", ndim=2)
    p.output(kf.convolve(x, np.ones((3, 3)) / 9.0, boundary="mirror", name="blur"))
    for shape in ((20, 17), (20, 17), (9, 11)):
        data = rng.random(shape, dtype=np.float32) + 0.5
        out = p.run(backend="cpu", plan="auto", x=data)["blur"]
        want = p.run(backend="numpy", x=data)["blur"]
        assert relative_error(out, want) < 1e-5
    assert [tuple(s.values()) for s in calls] == [(20, 17), (9, 11)]


def test_a_plan_of_an_earlier_build_is_checked_once_per_graph_and_sizes(rng, monkeypatch):
    """A plan made before the pipeline grew an operator is re-checked against the new graph
    once (per sizes, where the backend compiles for them), not on every run."""
    import kfuse.fusion.plan

    calls = []
    original = kfuse.fusion.plan.make_plan

    def counting(graph, groups, **options):
        calls.append([list(g) for g in groups])
        return original(graph, groups, **options)

    p = kf.Pipeline("grown")
    x = p.input("x", ndim=2)
    blur = kf.convolve(x, np.ones((3, 3)) / 9.0, boundary="mirror", name="blur")
    sharp = kf.point(2.0 * x - blur, name="sharp")
    p.output(sharp)
    plan = p.fuse([["blur", "sharp"]])
    p.output(kf.point(sharp * sharp, name="square"))  # a new build: plan.graph is stale
    monkeypatch.setattr(kfuse.fusion.plan, "make_plan", counting)
    for shape in ((20, 17), (20, 17), (9, 11)):
        data = rng.random(shape, dtype=np.float32) + 0.5
        out = p.run(backend="cpu", plan=plan, x=data)
        want = p.run(backend="numpy", x=data)
        for name in ("sharp", "square"):
            assert relative_error(out[name], want[name]) < 1e-5
    assert calls == [[["blur", "sharp"]]]  # the cpu backend's programs run at any size


def _chained_boxes(boundary: str) -> kf.Pipeline:
    p = kf.Pipeline("boxes")
    x = p.input("x", ndim=2)
    a = kf.point(kf.exp(x) * 0.5, name="a")
    b = kf.convolve(a, np.ones((3, 3)), boundary=boundary, scale=1 / 9, name="b")
    c = kf.convolve(b, np.ones((3, 3)), boundary=boundary, scale=1 / 9, name="c")
    p.output(kf.local(c.at(0, 2) - c.at(-2, 0) + b, boundary=boundary, name="d"))
    return p


def test_a_staged_plan_reused_where_it_cannot_stage_is_refused(rng):
    """A plan that stages its group in shared memory over tiles, made with clamped borders;
    the same operators with periodic borders cannot be staged (the tile's halo would wrap),
    so the plan is refused with the reason, never run with wrong borders. (The planner's
    own plan walks the rows, and wraps them where every read is periodic: reused on the
    periodic operators it runs, and equals NumPy.)"""
    from kfuse.codegen import generate
    from kfuse.errors import FusionError
    from kfuse.fusion.plan import make_plan

    clamped = _chained_boxes("clamp")
    planned = clamped.plan()
    assert [g.variant for g in planned.groups] == ["streamed"]  # (else the test shows nothing)
    members = ["a", "b", "c", "d"]
    plan = clamped.fuse([members], forms=["staged"])
    periodic = _chained_boxes("repeat")
    data = rng.random((64, 64), dtype=np.float32) + 0.5
    with pytest.raises(FusionError, match="staged implementation cannot compute it: 'b' "
                                          "reads 'a' with periodic boundaries"):
        periodic.run(backend="cpu", plan=plan, x=data)
    graph = periodic.graph()
    with pytest.raises(FusionError, match="periodic boundaries"):
        make_plan(graph, [members], variants={frozenset(members): "staged"})
    with pytest.raises(FusionError, match="periodic boundaries"):
        generate(graph, [(tuple(members), ("d",), "staged")])
    walked = periodic.run(backend="cpu", plan=planned, x=data)["d"]
    assert relative_error(walked, periodic.run(backend="numpy", x=data)["d"]) < 1e-5
    out = periodic.run(backend="cpu", x=data)["d"]  # its own plan recomputes instead
    assert relative_error(out, periodic.run(backend="numpy", x=data)["d"]) < 1e-5


def test_one_compile_key_holds_every_input_of_a_compile():
    """kfuse.cache.compile_key: the source, the compiler, its version, its options and what
    else the output depends on each change the key."""
    from kfuse.cache import compile_key

    base = ("kernel", ("nvcc",), "12.8", ("-arch=sm_90",), b"header")
    key = compile_key(*base)
    assert key == compile_key(*base) and len(key) == 40
    for index, other in enumerate(("kernel2", ("clang++",), "12.9", ("-arch=sm_100",),
                                   b"header2")):
        changed = list(base)
        changed[index] = other
        assert compile_key(*changed) != key, index
    assert compile_key("a", ("c",), "1", ("x", "y")) != compile_key("a", ("c",), "1", ("xy",))
