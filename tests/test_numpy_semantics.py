"""The generated code computes what NumPy computes where NumPy's meaning is not the obvious
one: whole powers, sums of conditions, NaN in minima and maxima (the ``cpu`` backend runs the
generated CUDA C; the ``numpy`` backend interprets the IR)."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.bench.harness import max_relative_error
from kfuse.ir.expr import Binary, Const, Unary, as_expr

SHAPE = (7, 9)
# the generated code on the host compiler, and on the GPU where there is one
compiled = pytest.mark.parametrize("backend", [
    "cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def run_both(backend: str, pipeline: kf.Pipeline, **arrays) -> tuple[np.ndarray, np.ndarray]:
    """The single output on ``backend`` (generated code) and on the numpy backend."""
    (name,) = pipeline.graph().outputs
    return (np.asarray(pipeline.run(backend=backend, **arrays)[name]),
            pipeline.run(backend="numpy", **arrays)[name])


@pytest.mark.parametrize("exponent", [2, 3, 5, 8, -1, -2, 2.0])
@compiled
def test_whole_powers_are_products(exponent, backend):
    """x ** n for a constant whole n is multiplications (x ** 2 exact as NumPy's square),
    not the approximate general pow."""
    image = np.random.default_rng(3).uniform(-20.0, 21.0, SHAPE).astype(np.float32)
    p = kf.Pipeline("power")
    x = p.input("x", ndim=2)
    p.output(kf.point(x ** exponent, name="y"))
    ours, interpreted = run_both(backend, p, x=image)
    expected = image.astype(np.float64) ** exponent
    assert max_relative_error(ours, expected) <= 4e-7 * abs(exponent)
    if exponent == 2:
        np.testing.assert_array_equal(ours, image * image)
    if exponent > 0:  # products: IEEE on every backend (the GPU's float32 division is not)
        np.testing.assert_array_equal(ours, interpreted)


@compiled
@pytest.mark.parametrize("exponent", [0, 2, 3, 9, 13])
def test_powers_of_integers_stay_integers(exponent, backend):
    """int32 ** n for a whole n >= 0 is int32 and exact, wrapping around as NumPy's."""
    values = np.random.default_rng(4).integers(-30, 31, SHAPE).astype(np.int32)
    p = kf.Pipeline("cube")
    x = p.input("x", ndim=2, dtype="int32")
    p.output(kf.point(x ** exponent + x, name="y"))
    ours, interpreted = run_both(backend, p, x=values)
    assert ours.dtype == np.int32
    with np.errstate(over="ignore"):
        expected = values ** exponent + values
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(interpreted, expected)


@compiled
@pytest.mark.parametrize("op", ["add", "sub", "mul", "neg", "abs", "sum"])
def test_int32_arithmetic_wraps_around_as_numpy(op, backend, request):
    """int32 sums, differences, products, negations and absolute values that overflow wrap
    around (in C a signed overflow is undefined: the generated code computes them unsigned;
    on the cpu backend UBSan watches for one)."""
    report = request.getfixturevalue("ubsan") if backend == "cpu" else None
    rng = np.random.default_rng(11)
    a = rng.integers(-2**31, 2**31, SHAPE, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, SHAPE, dtype=np.int64).astype(np.int32)
    a[0, 0], b[0, 0] = np.iinfo(np.int32).min, np.iinfo(np.int32).max  # -INT_MIN too
    p = kf.Pipeline("wrap")
    x, y = p.input("x", ndim=2, dtype="int32"), p.input("y", ndim=2, dtype="int32")
    result = {"add": lambda: kf.point(x + y, name="z"), "sub": lambda: kf.point(x - y, name="z"),
              "mul": lambda: kf.point(x * y, name="z"),
              "neg": lambda: kf.point(-x + y * 0, name="z"),
              "abs": lambda: kf.point(kf.abs(x) + y * 0, name="z"),
              "sum": lambda: kf.reduce_sum(kf.point(x + y), axis=1, name="z")}[op]()
    p.output(result)
    ours, interpreted = run_both(backend, p, x=a, y=b)
    with np.errstate(over="ignore"):
        expected = {"add": a + b, "sub": a - b, "mul": a * b, "neg": -a + b * 0,
                    "abs": np.abs(a) + b * 0,
                    "sum": (a + b).sum(axis=1, dtype=np.int32)}[op]
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(interpreted, expected)
    if report is not None:
        assert "runtime error" not in report()


def test_other_exponents_keep_the_general_pow():
    x = kf.Pipeline("p").input("x", ndim=2)
    for exponent in (0.25, 9, 0, -1.5):
        node = as_expr(x ** exponent)
        assert isinstance(node, Binary) and node.op == "pow"
        assert isinstance(node.b, Const)
    half = as_expr(x ** 0.5)  # NumPy's square root (its -0.0 and -inf)
    assert isinstance(half, Unary) and half.op == "sqrt"


@pytest.mark.parametrize("op,axis", [("sum", None), ("sum", 1), ("max", 0), ("min", 1)])
@compiled
def test_conditions_fold_as_integers(op, axis, backend):
    """A sum of a condition counts where it holds (int32), as NumPy's; min and max give 0/1."""
    image = np.random.default_rng(5).uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    p = kf.Pipeline("count")
    x = p.input("x", ndim=2)
    p.output(kf.reduce(x > 0.25, op, axis, name="n"))
    ours, interpreted = run_both(backend, p, x=image)
    expected = getattr(np, op)((image > 0.25).astype(np.int32), axis=axis)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(interpreted, expected)


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("axis", [None, 0, 1])
@compiled
def test_nan_is_the_minimum_and_maximum_as_in_numpy(op, axis, backend):
    """A NaN anywhere in what a min/max folds is the result, wherever it sits in the fold."""
    image = np.random.default_rng(6).uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    image[0, 0] = image[3, 4] = image[6, 8] = np.nan
    p = kf.Pipeline("nan_fold")
    x = p.input("x", ndim=2)
    p.output(kf.reduce(x * 2.0, op, axis, name="m"))
    ours, interpreted = run_both(backend, p, x=image)
    expected = getattr(np, op)(image * 2.0, axis=axis)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    np.testing.assert_array_equal(ours, interpreted)
    np.testing.assert_allclose(ours, expected, rtol=1e-6)


@pytest.mark.parametrize("op", ["minimum", "maximum"])
def test_minimum_and_maximum_of_equal_values_give_the_second_as_numpy(op):
    """Signed zeros show which side a tie takes: 1 / -0 is -inf. (float32 on the GPU takes -0
    as below +0, one instruction; only the sign of a zero result differs there.)"""
    rng = np.random.default_rng(8)
    a = rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    a[1, :], b[1, :] = 0.0, -0.0
    a[4, :], b[4, :] = -0.0, 0.0
    p = kf.Pipeline("signed_zeros")
    x = p.input("a", ndim=2)
    y = p.input("b", shape=x.shape)
    p.output(kf.point(1.0 / getattr(kf, op)(x, y), name="c"))
    ours, interpreted = run_both("cpu", p, a=a, b=b)
    with np.errstate(divide="ignore"):
        expected = 1.0 / getattr(np, op)(a, b)
    assert np.isneginf(expected).sum() == SHAPE[1] and np.isposinf(expected).sum() == SHAPE[1]
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(interpreted, expected)


@compiled
def test_pointwise_minimum_and_maximum_keep_nan_on_either_side(backend):
    rng = np.random.default_rng(7)
    a = rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)
    a[1, ::2] = np.nan
    b[2, 1::2] = np.nan
    p = kf.Pipeline("nan_pointwise")
    x = p.input("a", ndim=2)
    y = p.input("b", shape=x.shape)
    p.output(kf.point(kf.minimum(x, y) + kf.maximum(y, x), name="c"))
    ours, interpreted = run_both(backend, p, a=a, b=b)
    expected = np.minimum(a, b) + np.maximum(b, a)
    assert np.isnan(expected).sum() == 9
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(interpreted, expected)


FUNCTIONS = {  # name: (NumPy's function on float64, the inputs' range)
    "round": (np.rint, (-6.0, 6.0)), "trunc": (np.trunc, (-6.0, 6.0)),
    "exp2": (np.exp2, (-8.0, 8.0)), "log2": (np.log2, (0.01, 50.0)),
    "expm1": (np.expm1, (-1e-3, 1e-3)), "log1p": (np.log1p, (-1e-3, 1e-3)),
    "erf": (np.vectorize(__import__("math").erf), (-3.0, 3.0)), "tan": (np.tan, (-1.4, 1.4)),
    "atan": (np.arctan, (-9.0, 9.0)),
    "sigmoid": (lambda v: 1.0 / (1.0 + np.exp(-v)), (-90.0, 90.0)),
    "sign": (np.sign, (-2.0, 2.0)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@compiled
def test_math_functions_equal_numpys(name, dtype, backend):
    """Each of the DSL's newer math functions equals NumPy's (to a few units of the dtype's
    roundoff; round is ties-to-even and exact, halves included; sign of 0 is 0): expm1 and
    log1p keep their precision near 0, where exp(x) - 1 would lose it."""
    want, (low, high) = FUNCTIONS[name]
    rng = np.random.default_rng(len(name))
    values = rng.uniform(low, high, SHAPE)
    if name in ("round", "sign"):
        values[0, :5] = [-2.5, -0.5, 0.0, 0.5, 1.5]
    values = values.astype(dtype)
    p = kf.Pipeline(f"function_{name}")
    x = p.input("x", ndim=2, dtype=dtype)
    p.output(kf.point(getattr(kf, name)(x), name="y"))
    ours, interpreted = run_both(backend, p, x=values)
    expected = want(values.astype(np.float64))
    roundoff = {"float16": 2e-3, "float32": 4e-7, "float64": 1e-14}[dtype]
    for got in (ours, interpreted):
        assert got.dtype == np.dtype(dtype)
        if name in ("round", "trunc", "sign"):
            np.testing.assert_array_equal(got.astype(np.float64), expected)
        else:
            np.testing.assert_allclose(got.astype(np.float64), expected, rtol=4 * roundoff,
                                       atol=4 * roundoff * float(np.abs(expected).max()))
