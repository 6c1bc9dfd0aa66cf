"""Bad input to the Python API gets a named KfuseError at the user's line, never a traceback
from deep inside or a silently wrong answer; the features these fixes added give the
answers NumPy gives."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import DslError, ShapeError


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
    with pytest.raises(ShapeError, match="'y' is declared with 9 elements along axis 1"):
        p.run(backend="cpu", y=random_array(rng, (7, 8)), w=random_array(rng, (7, 8)))


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
