"""The integer dtypes users have (int8, uint8, int16, uint16, int64 beside int32): NumPy's
promotion and wraparound, checked against NumPy itself on random data at every border."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kfuse as kf
from kfuse.bench.harness import max_relative_error
from kfuse.ir.expr import INT_DTYPES, promote_integers

SMALL = ("int8", "uint8", "int16", "uint16")
RNG = np.random.default_rng(8)
# the generated code's backends: the cpu backend in CI, the cuda backend where a GPU is
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def random_integers(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("a", INT_DTYPES)
@pytest.mark.parametrize("b", INT_DTYPES)
def test_integer_promotion_is_numpys(a, b):
    assert promote_integers(a, b) == str(np.result_type(np.dtype(a), np.dtype(b)))


def _wrapping_pipeline(dtype: str, boundary: object) -> kf.Pipeline:
    p = kf.Pipeline("wraps")
    x = p.input("x", ndim=2, dtype=dtype)
    y = p.input("y", ndim=2, dtype=dtype)
    a = kf.point(x + y * 3 - x * y, name="a")
    b = kf.local(a.at(0, 1, boundary=boundary) + a.at(-1, 0, boundary=boundary) - a, name="b")
    c = kf.point(kf.maximum(b, x) + abs(-a), name="c")
    p.output(b, c, kf.reduce_sum(b, name="total"), kf.point(kf.where(x > y, x, y), name="m"))
    return p


def _numpy_wraps(dtype: str, x: np.ndarray, y: np.ndarray, mode: str) -> dict[str, np.ndarray]:
    with np.errstate(over="ignore"):
        a = x + y * np.array(3, dtype) - x * y
        padded = np.pad(a, 1, mode={"clamp": "edge", "mirror": "symmetric", "repeat": "wrap"}[
            mode])
        right, up = padded[1:-1, 2:], padded[:-2, 1:-1]
        b = right + up - a
        c = np.maximum(b, x) + np.abs(-a)
    return {"b": b, "c": c, "total": b.astype(np.int64).sum(), "m": np.where(x > y, x, y)}


@pytest.mark.integration
@pytest.mark.parametrize("code", BACKENDS)
@pytest.mark.parametrize(("dtype", "mode"), [("int8", "clamp"), ("uint8", "mirror"),
                                             ("int16", "repeat"), ("uint16", "clamp"),
                                             ("int64", "mirror")])
def test_integer_arithmetic_wraps_around_as_numpys(dtype, mode, code):
    p = _wrapping_pipeline(dtype, mode)
    x, y = random_integers(dtype, (19, 37)), random_integers(dtype, (19, 37))
    expected = _numpy_wraps(dtype, x, y, mode)
    for backend, plan in (("numpy", None), (code, "unfused"), (code, "auto")):
        result = p.run(x=x, y=y, backend=backend, **({"plan": plan} if plan else {}))
        for name, value in expected.items():
            got = _host(result[name])
            assert got.dtype == np.asarray(value).dtype or name == "total", (name, got.dtype)
            np.testing.assert_array_equal(got, value, err_msg=f"{name} {backend} {plan}")


@pytest.mark.integration
@pytest.mark.parametrize("dtype", SMALL)
def test_small_integers_sum_to_int64_and_fold_their_extremes_in_int32(dtype):
    p = kf.Pipeline("sums")
    x = p.input("x", ndim=2, dtype=dtype)
    p.output(kf.reduce_sum(x, name="total"), kf.reduce_min(x, axis=1, name="low"),
             kf.reduce_max(x, name="high"))
    graph = p.graph()
    assert [graph.buffers[n].dtype for n in ("total", "low", "high")] == \
        ["int64", "int32", "int32"]
    values = random_integers(dtype, (17, 45))
    for backend in ("numpy", "cpu"):
        result = p.run(x=values, backend=backend)
        assert int(result["total"]) == int(values.astype(np.int64).sum())
        np.testing.assert_array_equal(result["low"], values.min(axis=1))
        assert int(result["high"]) == int(values.max())


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_reductions_keep_their_values(backend):
    p = kf.Pipeline("longs")
    x = p.input("x", ndim=2, dtype="int64")
    p.output(kf.reduce_sum(x, name="s"), kf.reduce_min(x, axis=1, name="lo"),
             kf.reduce_max(x, axis=0, name="hi"))
    values = RNG.integers(-2**40, 2**40, size=(23, 41), dtype=np.int64)
    result = {name: np.asarray(_host(value)) for name, value in
              p.run(x=values, backend=backend).items()}
    assert int(result["s"]) == int(values.sum())
    np.testing.assert_array_equal(result["lo"], values.min(axis=1))
    np.testing.assert_array_equal(result["hi"], values.max(axis=0))


@pytest.mark.parametrize(("dtype", "constant"), [("uint8", 300), ("uint8", -1), ("int8", 128),
                                                 ("int16", 2**15), ("uint16", 70000)])
def test_a_constant_that_does_not_fit_the_array_is_refused_as_numpy_refuses_it(dtype,
                                                                               constant):
    p = kf.Pipeline("fits")
    x = p.input("x", ndim=1, dtype=dtype)
    with pytest.raises(kf.DtypeError, match=f"does not fit {dtype}"):
        kf.point(x + constant, name="y")


def test_mixed_integers_and_floats_promote_as_documented():
    p = kf.Pipeline("mixed")
    u = p.input("u", ndim=1, dtype="uint8")
    s = p.input("s", ndim=1, dtype="int8")
    f = p.input("f", ndim=1, dtype="float32")
    assert kf.point(u + s, name="a").dtype == "int16"
    assert kf.point(u * 0.5, name="b").dtype == "float32"
    assert kf.point(u + f, name="c").dtype == "float32"
    assert kf.point(u / u, name="d").dtype == "float32"


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16"])
def test_an_integer_image_through_a_harris_response_matches_float64(dtype, backend):
    """Sobel gradients, their products smoothed, the Harris response: of an integer image,
    computed in float32 (the floor counts the image's own bytes)."""
    sobel = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)
    gauss = np.outer([1, 2, 1], [1, 2, 1]) / 16.0
    p = kf.Pipeline("harris_ints")
    img = p.input("img", ndim=2, dtype=dtype)
    dx = kf.convolve(img, sobel, boundary="mirror", name="dx")
    dy = kf.convolve(img, sobel.T, boundary="mirror", name="dy")
    sxx = kf.convolve(kf.point(dx * dx, name="xx"), gauss, boundary="mirror", name="sxx")
    syy = kf.convolve(kf.point(dy * dy, name="yy"), gauss, boundary="mirror", name="syy")
    p.output(kf.point(sxx * syy - 0.04 * (sxx + syy) ** 2, name="hc"))

    def correlate(a: np.ndarray, mask: np.ndarray) -> np.ndarray:
        padded = np.pad(a, 1, mode="symmetric")
        return sum(mask[i, j] * padded[i:i + a.shape[0], j:j + a.shape[1]]
                   for i in range(3) for j in range(3))

    # (a width of 68 takes the kernels' vector loads of 4 pixels, 67 their scalar ones)
    for shape, plan in (((41, 67), "unfused"), ((41, 67), "auto"), ((43, 68), "unfused"),
                        ((43, 68), "auto")):
        image = RNG.integers(0, 256, size=shape).astype(dtype)
        wide = image.astype(np.float64)
        gx, gy = correlate(wide, sobel), correlate(wide, sobel.T)
        sx, sy = correlate(gx * gx, gauss), correlate(gy * gy, gauss)
        expected = sx * sy - 0.04 * (sx + sy) ** 2
        result = _host(p.run(img=image, backend=backend, plan=plan)["hc"])
        assert result.dtype == np.float32
        assert max_relative_error(result, expected) < 1e-5, (shape, plan)


def test_integer_parameters_take_integers():
    p = kf.Pipeline("params")
    x = p.input("x", ndim=1, dtype="int64")
    k = p.param("k", dtype="int64")
    p.output(kf.point(x * k, name="y"))
    values = RNG.integers(-1000, 1000, size=7, dtype=np.int64)
    np.testing.assert_array_equal(p.run(x=values, k=2**40, backend="numpy")["y"],
                                  values * 2**40)
    with pytest.raises(kf.BindError, match="cannot hold"):
        p.run(x=values, k=0.5, backend="numpy")


def _host(value: object) -> np.ndarray:
    """A backend's result on the host (the cuda backend returns CuPy arrays)."""
    return value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) \
        else np.asarray(value)


# -- float16 and bfloat16 ----------------------------------------------------------------------

def _halves(dtype: str) -> tuple[kf.Pipeline, dict[str, np.ndarray]]:
    from kfuse.runtime.numpy_backend import numpy_dtype

    p = kf.Pipeline("halves")
    x = p.input("x", ndim=2, dtype=dtype)
    y = p.input("y", ndim=2, dtype=dtype)
    a = kf.point(x * y + 0.1, name="a")
    b = kf.local(a.at(0, 1, boundary="mirror") + a.at(1, 0, boundary=kf.constant(0.5))
                 - a * 0.5, name="b")
    p.output(b, kf.point(kf.sqrt(kf.abs(b)) + kf.astype(x, "float32"), name="c"))
    arrays = {name: RNG.uniform(-2, 2, (23, 41)).astype(numpy_dtype(dtype))
              for name in ("x", "y")}
    return p, arrays


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_two_byte_floats_are_stored_as_such_and_computed_in_float32(dtype, backend):
    """Fused and unfused kernels give the numpy backend's results bit for bit (each
    operator computed in float32 and rounded to its dtype), and NumPy's own float16
    arithmetic (rounded after each operation) within a few of its ulps."""
    p, arrays = _halves(dtype)
    truth = p.run(backend="numpy", **arrays)
    assert str(truth["b"].dtype) == dtype and truth["c"].dtype == np.float32
    for plan in ("unfused", "auto"):
        result = {name: _host(value) for name, value in
                  p.run(backend=backend, plan=plan, **arrays).items()}
        for name in ("b", "c"):
            assert str(result[name].dtype) == str(truth[name].dtype)
            np.testing.assert_array_equal(result[name].astype(np.float64),
                                          truth[name].astype(np.float64))
    if dtype == "float16":  # against NumPy's own float16 evaluation
        x, y = arrays["x"], arrays["y"]
        a = x * y + np.float16(0.1)
        padded = np.pad(a, 1, mode="symmetric")
        below = np.pad(a, ((0, 1), (0, 0)), constant_values=np.float16(0.5))[1:]
        b = padded[1:-1, 2:] + below - a * np.float16(0.5)
        assert max_relative_error(truth["b"], b) < 4e-3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_two_byte_floats_promote_and_reduce_in_float32(dtype):
    p = kf.Pipeline("promote")
    h = p.input("h", ndim=1, dtype=dtype)
    u = p.input("u", ndim=1, dtype="uint8")
    i = p.input("i", ndim=1, dtype="int32")
    f = p.input("f", ndim=1, dtype="float32")
    assert kf.point(h * 0.5 + 1, name="a").dtype == dtype
    assert kf.point(h + u, name="b").dtype == dtype
    assert kf.point(h + i, name="c").dtype == "float32"
    assert kf.point(h + f, name="d").dtype == "float32"
    other = "bfloat16" if dtype == "float16" else "float16"
    g = p.input("g", ndim=1, dtype=other)
    assert kf.point(h + g, name="e").dtype == "float32"
    assert kf.reduce_sum(h, name="s").dtype == "float32"
    assert kf.reduce_max(h, name="top").dtype == "float32"


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reductions_of_two_byte_floats_are_their_float32_reductions(dtype, backend):
    from kfuse.runtime.numpy_backend import numpy_dtype

    p = kf.Pipeline("half_sums")
    h = p.input("h", ndim=2, dtype=dtype)
    p.output(kf.reduce_sum(h * 2, name="s"), kf.reduce_min(h, axis=0, name="lo"))
    values = RNG.uniform(-2, 2, (19, 33)).astype(numpy_dtype(dtype))
    wide = values.astype(np.float64)
    result = {k: _host(v) for k, v in p.run(h=values, backend=backend).items()}
    assert result["s"].dtype == np.float32
    assert abs(float(result["s"]) - 2 * wide.sum()) < 1e-4 * np.abs(wide).sum()
    np.testing.assert_array_equal(result["lo"], wide.min(axis=0).astype(np.float32))


def test_the_staged_form_says_it_keeps_no_two_byte_floats_and_map_reduce_takes_them():
    from kfuse.schedule import MapReduceVariant, Staged

    p, _ = _halves("float16")
    graph = p.graph()
    members = [k.name for k in graph.kernels]
    assert MapReduceVariant().why_not(graph, members) is None
    assert "4 and 8 bytes" in Staged().why_not(graph, members[:2])


def test_python_float_and_int_name_numpys_dtypes():
    p = kf.Pipeline("names")
    assert p.input("a", ndim=1, dtype=float).dtype == str(np.dtype(float)) == "float64"
    assert p.input("b", ndim=1, dtype=int).dtype == str(np.dtype(int)) == "int64"
    assert p.input("c", ndim=1, dtype=np.uint8).dtype == "uint8"
    assert p.input("d", ndim=1, dtype="half").dtype == "float16"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_two_byte_floats_come_back_as_torch_tensors_of_their_dtype(dtype):
    """On the GPU, torch tensors of two-byte floats in, torch tensors of that dtype out,
    with the numpy backend's values."""
    import torch

    p, arrays = _halves(dtype)
    truth = p.run(backend="numpy", **arrays)
    tensors = {name: torch.from_numpy(value.astype(np.float32)).to(
        getattr(torch, dtype)).cuda() for name, value in arrays.items()}
    result = p.run(backend="cuda", **tensors)
    assert isinstance(result["b"], torch.Tensor) and str(result["b"].dtype) == f"torch.{dtype}"
    np.testing.assert_array_equal(result["b"].float().cpu().numpy(),
                                  truth["b"].astype(np.float32))


def test_reduction_identities_come_back_from_the_program_store_exactly():
    """A program stored by one process and loaded by another starts an int64 minimum at
    2**63 - 1 (through a float it became 2**63: no int64, a raw OverflowError)."""
    from kfuse.codegen.generate import generate
    from kfuse.runtime.program_store import program_from_dict, program_to_dict

    p = kf.Pipeline("identities")
    x = p.input("x", ndim=1, dtype="int64")
    f = p.input("f", ndim=1, dtype="float32")
    p.output(kf.reduce_min(x, name="lo"), kf.reduce_max(x, name="hi"),
             kf.reduce_min(f, name="flo"))
    program = generate(p.graph())
    loaded = program_from_dict(json.loads(json.dumps(program_to_dict(program))))
    values = dict(pair for launch in program.launches for pair in launch.initial_values)
    assert values["lo"] == 2**63 - 1 and values["hi"] == -2**63 and values["flo"] == np.inf
    for launch, again in zip(program.launches, loaded.launches, strict=True):
        assert again.initial_values == launch.initial_values
        assert [type(v) for _, v in again.initial_values] == \
            [type(v) for _, v in launch.initial_values]
