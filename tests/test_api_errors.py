"""Bad input to the Python API gets a named KfuseError at the user's line, never a traceback
from deep inside or a silently wrong answer; the features these fixes added give the
answers NumPy gives."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import (
    BindError,
    BoundaryError,
    CacheError,
    DslError,
    DtypeError,
    FusionError,
    ShapeError,
)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(15)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "float32"
                 ) -> np.ndarray:
    """Values in [0.5, 1.5): never zero, so a result that ignores an input shows."""
    return (rng.random(shape) + 0.5).astype(dtype)


# -- fixed sizes in shape= -------------------------------------------------------------------

def fixed_size_pipeline() -> kf.Pipeline:
    p = kf.Pipeline("fixed")
    y = p.input("y", shape=(7, 9))
    w = p.input("w", shape=(7, "n"))
    z = kf.local(y.at(0, 1) + y.at(-1, 0) * w, boundary="mirror")
    p.output(z)
    return p


def test_fixed_sizes_run_on_the_cpu_backend_as_numpy(rng):
    p = fixed_size_pipeline()
    y, w = random_array(rng, (7, 9)), random_array(rng, (7, 9))
    expected = p.run(backend="numpy", y=y, w=w)["z"]
    reference = np.pad(y, 1, mode="edge")
    assert np.allclose(expected, reference[1:-1, 2:] + reference[:-2, 1:-1] * w)
    out = p.run(backend="cpu", y=y, w=w)["z"]
    assert out.shape == (7, 9)
    assert np.allclose(out, expected, rtol=1e-6)


def test_an_array_of_another_size_than_the_fixed_one_is_refused(rng):
    p = fixed_size_pipeline()
    with pytest.raises(ShapeError, match="'y' must have 9 elements along axis 1"):
        p.run(backend="cpu", y=random_array(rng, (7, 8)), w=random_array(rng, (7, 8)))
    # w was declared (7, "n"): its n is 9 through the operator that adds it to y
    with pytest.raises(ShapeError, match=r"'w' must have 9 elements along axis 1 \(a fixed "
                                         r"size: given in its shape=, or that of an array"):
        p.run(backend="cpu", y=random_array(rng, (7, 9)), w=random_array(rng, (7, 8)))


@pytest.mark.parametrize("size", [0, -1, "-2"])
def test_non_positive_fixed_sizes_are_refused_at_the_declaration(size):
    with pytest.raises(ShapeError, match="axis 0 must have a positive size") as caught:
        kf.Pipeline("p").input("y", shape=(size, 3))
    assert "test_api_errors.py" in str(caught.value)


def test_a_size_that_is_neither_a_name_nor_an_integer_is_refused():
    with pytest.raises(DslError, match="axis 1 needs a size symbol"):
        kf.Pipeline("p").input("y", shape=(3, 2.5))


def test_axes_of_two_different_fixed_sizes_do_not_combine():
    p = kf.Pipeline("p")
    u, v = p.input("u", shape=(9,)), p.input("v", shape=(8,))
    with pytest.raises(ShapeError, match="fixed sizes 8 and 9"):
        kf.point(u + v.at(0, dims=(0,)))


def test_a_refused_operator_leaves_the_sizes_as_they_were(rng):
    """x + y would make n = 9 before z's 5 refuses the operator; n must stay free."""
    p = kf.Pipeline("p")
    x, y, z = p.input("x", shape=("n",)), p.input("y", shape=(9,)), p.input("z", shape=(5,))
    with pytest.raises(ShapeError, match="fixed sizes"):
        kf.point(x + y + z)
    p.output(kf.point(x * 2.0, name="twice"), kf.point(y + 1.0), kf.point(z + 1.0))
    data = random_array(rng, (7,))
    assert np.allclose(p.run(backend="numpy", x=data, y=random_array(rng, (9,)),
                             z=random_array(rng, (5,)))["twice"], 2 * data)


def test_a_refused_operator_of_two_kernels_leaves_neither(rng):
    """gemv with y is a product kernel and a sum kernel: the sum's refusal (y of 5 rows for
    7) must take the product with it, so that the same call fails the same way again."""
    p = kf.Pipeline("p")
    a, x = p.input("A", shape=(7, "n")), p.input("x", shape=("n",))
    w, y = p.input("w", shape=(5,)), p.input("y", shape=("m",))
    for _ in range(2):
        with pytest.raises(ShapeError, match="fixed sizes 5 and 7"):
            kf.gemv(a, x, y=w)
    p.output(kf.gemv(a, x, y=y, name="g"), kf.point(w + 1.0))
    assert len(p.graph().kernels) == 3  # g's two and the point: nothing left of the refusals
    matrix, vector, addend = (random_array(rng, (7, 4)), random_array(rng, (4,)),
                              random_array(rng, (7,)))
    out = p.run(backend="numpy", A=matrix, x=vector, w=random_array(rng, (5,)), y=addend)
    assert np.allclose(out["g"], matrix @ vector + addend, rtol=1e-5)


def test_numpy_integer_sizes_are_fixed_sizes():
    y = kf.Pipeline("p").input("y", shape=(np.int64(3), "h"))
    assert y.shape == ("3", "h")


# -- plan(sizes=...) -------------------------------------------------------------------------

def test_plan_sizes_with_an_unknown_name_lists_the_pipelines_sizes():
    p = kf.Pipeline("p")
    x = p.input("x", ndim=2)
    p.output(kf.point(x * 2.0))
    with pytest.raises(ShapeError, match=r"no size named 'H'; its sizes are 'x.0', 'x.1'"):
        p.plan(sizes={"H": 100})
    with pytest.raises(ShapeError, match="sizes must give 'x.1'"):
        p.plan(sizes={"x.0": 100})
    assert p.plan(sizes={"x.0": 100, "x.1": 50}).groups


def test_plan_sizes_may_name_a_size_unified_with_another_and_leave_out_fixed_ones():
    p = fixed_size_pipeline()
    assert p.plan(sizes={"n": 9}).groups
    with pytest.raises(ShapeError, match="'7' is fixed at 7, not 8"):
        p.plan(sizes={"7": 8})


def test_a_square_fixed_size_matrix_runs_on_the_cpu_backend(rng):
    """A domain of one size twice ('6', '6') passes that size once to the kernel."""
    p = kf.Pipeline("square")
    a, v = p.input("A", shape=(6, 6)), p.input("v", shape=(6,))
    p.output(kf.matvec(a, v, name="av"), kf.matvec_t(a, v, name="atv"))
    matrix, vector = random_array(rng, (6, 6)), random_array(rng, (6,))
    out = p.run(backend="cpu", A=matrix, v=vector)
    assert np.allclose(out["av"], matrix @ vector, rtol=1e-5)
    assert np.allclose(out["atv"], matrix.T @ vector, rtol=1e-5)


# -- == and != are elementwise ---------------------------------------------------------------

def test_equality_is_elementwise_and_runs_on_the_cpu_backend_as_numpy(rng):
    p = kf.Pipeline("equal")
    x, y = p.input("x", ndim=2, dtype="int32"), p.input("y", ndim=2, dtype="int32")
    same = kf.point(kf.where(x == y, 1.0, 0.0))
    differ = kf.point(kf.where(2 != x, x * 3, y))
    p.output(same, differ)
    xs = rng.integers(1, 4, (7, 9)).astype("int32")
    ys = rng.integers(1, 4, (7, 9)).astype("int32")
    for backend in ("numpy", "cpu"):
        out = p.run(backend=backend, x=xs, y=ys)
        assert np.array_equal(out["same"], np.where(xs == ys, 1.0, 0.0))
        assert np.array_equal(out["differ"], np.where(xs != 2, xs * 3, ys))
    assert 0 < out["same"].sum() < out["same"].size  # both branches taken


def test_arrays_and_expressions_stay_hashable_and_compare_to_non_operands_by_identity():
    p = kf.Pipeline("hashable")
    x = p.input("x", ndim=1)
    expr = x + 1.0
    assert {x: 1, expr: 2}[expr] == 2
    assert (x == None) is False and (expr != "text") is True  # noqa: E711
    with pytest.raises(DslError, match="no truth value"):
        bool(x == 0.5)


# -- coord -----------------------------------------------------------------------------------

def test_coord_of_an_axis_the_operator_lacks_is_refused_at_the_operator():
    p = kf.Pipeline("coords")
    x = p.input("x", ndim=2)
    with pytest.raises(DslError, match=r"coord\(2\) names no axis of its 2-D") as caught:
        kf.point(x + kf.coord(2))
    assert "test_api_errors.py" in str(caught.value)


@pytest.mark.parametrize("axis", ["a", -1, 1.0])
def test_coord_takes_an_axis_number(axis):
    with pytest.raises(DslError, match="coord\\(\\) takes an axis number"):
        kf.coord(axis)


# -- constant borders ------------------------------------------------------------------------

def test_a_constant_border_takes_a_number():
    with pytest.raises(BoundaryError, match="a constant border takes a number, got 'a'"):
        kf.constant("a")
    with pytest.raises(BoundaryError, match="parameter's value is not known"):
        kf.constant(kf.Pipeline("p").param("c"))


def test_a_bad_border_in_any_form_names_the_users_line():
    p = kf.Pipeline("borders")
    x = p.input("x", ndim=2)
    with pytest.raises(BoundaryError, match=r"operator 'sx', at test_api_errors.py:\d+: .*"
                                            r"a constant border takes a number"):
        kf.local(x.at(0, 1) - x, boundary=("constant", "a"), name="sx")
    with pytest.raises(BoundaryError, match=r"at test_api_errors.py:\d+: .*'wrap'"):
        x.at(0, 1, boundary="wrap")
    with pytest.raises(BoundaryError, match=r"operator 'blur', at test_api_errors.py:\d+"):
        kf.convolve(x, [[1, 2, 1]], boundary=("constant", None), name="blur")


def border_pipeline(dtype: str, value: float) -> kf.Pipeline:
    p = kf.Pipeline("border")
    x = p.input("x", ndim=2, dtype=dtype)
    p.output(kf.local(x.at(0, 1) + x.at(-1, 0), boundary=kf.constant(value), name="z"))
    return p


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_infinite_and_nan_borders_of_float_arrays_run_as_numpy(rng, value):
    p = border_pipeline("float32", value)
    x = random_array(rng, (7, 9))
    expected = p.run(backend="numpy", x=x)["z"]
    assert np.array_equal(np.isnan(expected[0]), np.isnan(value + x[0]))  # row 0 hits the border
    assert np.allclose(p.run(backend="cpu", x=x)["z"], expected, equal_nan=True)


@pytest.mark.parametrize(("dtype", "value"), [("int32", float("inf")), ("int32", 1e10),
                                              ("int32", 0.5), ("float32", 1e39),
                                              ("float32", 3.41e38)])
def test_a_border_the_arrays_dtype_cannot_hold_is_refused(dtype, value):
    with pytest.raises(DtypeError, match=f"is not representable in {dtype}") as caught:
        border_pipeline(dtype, value)
    assert "operator 'z'" in str(caught.value)


@pytest.mark.parametrize("value", [3.4028235e38, -3.4028235e38, 1e-46])
def test_float32_borders_that_round_to_a_float32_are_taken(rng, value):
    """The printed float32 maximum is a float32 (it rounds to it), as is a value that
    underflows to zero."""
    p = border_pipeline("float32", value)
    x = random_array(rng, (7, 9))
    expected = x[0, 1:] + np.float32(value)  # row 0's x.at(-1, 0) is the border
    with np.errstate(over="ignore"):
        assert np.allclose(p.run(backend="cpu", x=x)["z"][0, :-1], expected)


# -- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2**40, 2.7, float("nan")])
def test_an_int32_parameter_refuses_values_it_cannot_hold(value):
    p = kf.Pipeline("params")
    x, c = p.input("x", ndim=1, dtype="int32"), p.param("c", "int32")
    p.output(kf.point(x + c))
    with pytest.raises(BindError, match="parameter 'c' is int32, which cannot hold"):
        p.run(backend="numpy", x=np.ones(3, "int32"), c=value)


# -- plans -----------------------------------------------------------------------------------

def doubling_pipeline() -> kf.Pipeline:
    p = kf.Pipeline("doubling")
    x = p.input("x", ndim=1)
    p.output(kf.point(x * 2.0, name="y"))
    return p


@pytest.mark.parametrize("plan", [123, "bogus"])
def test_run_with_a_plan_that_is_no_plan_says_what_plan_takes(plan):
    with pytest.raises(FusionError, match="plan must be 'auto', 'unfused', None or a FusionPlan"):
        doubling_pipeline().run(backend="numpy", plan=plan, x=np.ones(3, "float32"))


@pytest.mark.parametrize("groups", [None, [["y"], 3]])
def test_fuse_with_groups_that_are_no_list_of_names_is_refused(groups):
    with pytest.raises(FusionError, match="fuse\\(\\) takes a list of groups"):
        doubling_pipeline().fuse(groups)


# -- convolve masks --------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [[[1, 2, 3], [1, 2]], "abc", [[1, float("nan"), 1]]])
def test_convolve_refuses_masks_that_are_no_grid_of_numbers(mask):
    x = kf.Pipeline("masks").input("x", ndim=2)
    with pytest.raises(DslError, match="the mask") as caught:
        kf.convolve(x, mask)
    assert "test_api_errors.py" in str(caught.value)


# -- the cache folder ------------------------------------------------------------------------

def test_an_unusable_cache_folder_is_named(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(not_a_folder))
    with pytest.raises(CacheError, match="cannot create the cache folder .*file/cpu"):
        doubling_pipeline().run(backend="cpu", x=np.ones(3, "float32"))


# -- transposed matrices in arithmetic -------------------------------------------------------

def test_a_transposed_matrix_takes_part_in_arithmetic(rng):
    p = kf.Pipeline("transposed")
    a, b = p.input("A", shape=("n", "n")), p.input("B", shape=("n", "n"))
    p.output(kf.point(a.T * 2.0 + b, name="z"))
    matrix, other = random_array(rng, (5, 5)), random_array(rng, (5, 5))
    assert np.allclose(p.run(backend="cpu", A=matrix, B=other)["z"], 2 * matrix.T + other)


def test_a_transposed_matrix_alone_says_what_it_can_be_used_for():
    a = kf.Pipeline("transposed").input("A", ndim=2)
    with pytest.raises(DslError, match=r"combine it with one \(B \+ A.T\), or use A.T @ y"):
        kf.point(a.T * 1.0)


# -- outputs ---------------------------------------------------------------------------------

def test_an_input_as_output_is_refused_at_the_users_line():
    p = kf.Pipeline("passthrough")
    x = p.input("x", ndim=1)
    with pytest.raises(DslError, match="an output must be computed by an operator") as caught:
        p.output(x)
    assert "test_api_errors.py" in str(caught.value)


# -- NumPy integer scalars -------------------------------------------------------------------

def test_numpy_integers_are_accepted_where_python_integers_are(rng):
    p = kf.Pipeline("numpy_ints")
    x = p.input("x", ndim=2, dtype="int32")
    scaled = kf.local(np.int64(3) * x.at(np.int64(1), 0) + x * np.int32(2), name="scaled")
    assert scaled.dtype == "int32"
    total = kf.reduce_sum(scaled, axis=np.int64(0), name="total")
    p.output(scaled, total)
    xs = rng.integers(1, 9, (7, 9)).astype("int32")
    below = np.concatenate([xs[1:], xs[-1:]])  # clamp
    out = p.run(backend="cpu", x=xs)
    assert np.array_equal(out["scaled"], 3 * below + 2 * xs)
    assert np.array_equal(out["total"], (3 * below + 2 * xs).sum(axis=0))


@pytest.mark.parametrize("size", ["+-5", " ", "n m", ""])
def test_size_names_are_names(size):
    with pytest.raises(DslError, match="axis 0 needs a size symbol"):
        kf.Pipeline("p").input("y", shape=(size, 3))


def test_numbers_past_every_range_are_refused_clearly(rng):
    p = kf.Pipeline("huge")
    x = p.input("x", ndim=1)
    s = p.param("s", "int32")
    p.output(kf.point(x * s, name="y"))
    with pytest.raises(BindError, match="cannot hold"):
        p.run(backend="numpy", x=random_array(rng, (5,)), s=10**400)
    with pytest.raises(BoundaryError, match="past any float"):
        kf.constant(10**400)
    with pytest.raises(DslError, match="out of range"):
        kf.point(x ** 10**400, name="z")


@pytest.mark.parametrize("value", [2, 0.5, float("nan")])
def test_a_bool_parameter_takes_only_true_or_false(value, rng):
    p = kf.Pipeline("flag")
    x = p.input("x", ndim=1)
    on = p.param("on", "bool")
    p.output(kf.point(kf.where(on, x, -x), name="y"))
    data = random_array(rng, (6,))
    np.testing.assert_array_equal(p.run(backend="numpy", x=data, on=True)["y"], data)
    np.testing.assert_array_equal(p.run(backend="numpy", x=data, on=0)["y"], -data)
    with pytest.raises(BindError, match="cannot hold"):
        p.run(backend="numpy", x=data, on=value)


# -- every error names the user's line --------------------------------------------------------

def test_errors_outside_operators_name_the_users_line(rng):
    """Expression, declaration and run-time errors carry the line that caused them."""
    p = kf.Pipeline("lines")
    x = p.input("x", ndim=2)
    p.output(kf.point(x * 2.0, name="y"))
    mistakes = {
        DtypeError: lambda: kf.where(x, 1.0, 0.0),                    # a float condition
        DslError: lambda: x + None,                                    # no kfuse value
        BindError: lambda: p.run(backend="numpy", x=np.ones((3, 3))),  # float64 for float32
    }
    for kind, mistake in mistakes.items():
        with pytest.raises(kind, match="at test_api_errors.py:[0-9]+: .*lambda") as caught:
            mistake()
        assert caught.value.where and "test_api_errors.py" in caught.value.where


@pytest.mark.parametrize("name", [3, None, "my pipe"])
def test_a_pipeline_name_that_is_no_identifier_is_refused(name):
    with pytest.raises(DslError, match="pipeline name must be an identifier"):
        kf.Pipeline(name)


@pytest.mark.parametrize("ndim", [2.0, True, "2", 7, -1])
def test_an_input_ndim_that_is_no_integer_from_0_to_6_is_refused(ndim):
    with pytest.raises(DslError, match=f"give ndim \\(an integer, 0 to 6\\) or shape, got "
                                       f"ndim={ndim!r}"):
        kf.Pipeline("dims").input("x", ndim=ndim)
    assert kf.Pipeline("dims").input("x", ndim=np.int64(2)).ndim == 2
    assert kf.Pipeline("dims").input("x", ndim=4).ndim == 4
