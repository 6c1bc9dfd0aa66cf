"""Three-tap window sums that share a pair between neighbouring points (kfuse.codegen.cexpr):
found only for shifted copies of one expression, fewer additions, products left as written,
results equal to the reference at every boundary and size on the cpu backend."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps.check import relative_error
from kfuse.codegen import generate, generate_unfused
from kfuse.ir.expr import Coord, Load, as_boundary, shift_between
from kfuse.schedule.tiles import REGISTER_TILES

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.3)]


def read(offsets: tuple[int, ...], buffer: str = "x", boundary: str = "clamp") -> Load:
    return Load(buffer, "float32", offsets, tuple(range(len(offsets))), as_boundary(boundary))


def test_shift_between_finds_the_one_shift_that_moves_every_read():
    assert shift_between(read((-1, 0)), read((0, 0))) == {0: 1, 1: 0}
    difference = read((2, 1)) - read((2, -1))
    assert shift_between(difference, read((3, 1)) - read((3, -1))) == {0: 1, 1: 0}
    assert shift_between(difference, read((3, 1)) - read((2, -1))) is None  # not uniform
    assert shift_between(read((0, 1)), read((0, 1))) is None  # no shift: the same term
    assert shift_between(read((0, 0)), read((0, 1), buffer="y")) is None
    assert shift_between(read((0, 0), boundary="mirror"), read((0, 1))) is None
    assert shift_between(read((0, 0)) * 2.0, read((0, 1)) * 3.0) is None
    assert shift_between(read((0, 0)) + Coord(0, "int32"), read((0, 1)) + Coord(0, "int32")) \
        is None
    assert shift_between(read((0, 0)) - read((0, 1)), read((0, 1)) + read((0, 2))) is None


def box_pipeline(ndim: int, axis: int, boundary: object) -> kf.Pipeline:
    p = kf.Pipeline("box")
    x = p.input("x", ndim=ndim)

    def at(offset: int) -> kf.Array:
        return x.at(*[offset if a == axis else 0 for a in range(ndim)])

    p.output(kf.local(at(-1) + at(0) + at(1), boundary=boundary, name="y"))
    return p


def additions(source: str) -> int:
    return len(re.findall(r"= \w+ \+ \w+;", source[source.index("KF_KERNEL"):]))


def test_a_window_along_the_rows_shares_a_pair_per_two_points(configure):
    """Each column of a thread's register tile adds one pair per two rows it would
    otherwise add (once in the vector path, once in the scalar path of the tile)."""
    graph = box_pipeline(2, 0, "clamp").graph()
    sharing = additions(generate_unfused(graph).source)
    configure(window_sums=False)
    written = additions(generate_unfused(graph).source)
    rows, columns = REGISTER_TILES[("single", 2)]
    assert written - sharing == 2 * columns * (rows // 2)


def test_a_window_of_products_is_summed_as_written(configure):
    p = kf.Pipeline("weighted")
    x = p.input("x", ndim=2)
    y = p.input("y", ndim=2)
    p.output(kf.local(x.at(-1, 0) * y.at(-1, 0) + x * y + x.at(1, 0) * y.at(1, 0), name="z"))
    source = generate_unfused(p.graph()).source
    configure(window_sums=False)
    assert generate_unfused(p.graph()).source == source


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize(("ndim", "axis", "shape"), [
    (1, 0, (37,)), (2, 0, (23, 13)), (2, 1, (11, 29)), (3, 0, (9, 7, 13)), (3, 2, (5, 6, 11)),
])
def test_window_sums_equal_the_reference(boundary, ndim, axis, shape):
    pipeline = box_pipeline(ndim, axis, boundary)
    data = np.random.default_rng(sum(shape)).random(shape, np.float32) + 0.5
    ours = pipeline.run(backend="cpu", plan="unfused", x=data)["y"]
    exact = pipeline.run(backend="numpy", plan="unfused", x=data)["y"]
    assert relative_error(ours, exact) <= 1e-6


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("shape", [(21, 19), (13, 34)])
def test_fused_box_chains_equal_the_reference(configure, boundary, shape):
    """Prewitt derivatives and a box blur of their product, fused: windows of differences
    along the rows and of reads along the columns share pairs in the register tiles."""
    p = kf.Pipeline("box_chain")
    img = p.input("img", ndim=2)
    dx = kf.convolve(img, [[-1, 0, 1]] * 3, boundary=boundary, name="dx")
    dy = kf.convolve(img, [[-1] * 3, [0] * 3, [1] * 3], boundary=boundary, name="dy")
    product = kf.point(dx * dy, name="product")
    p.output(kf.convolve(product, [[1, 1, 1]] * 3, boundary=boundary, name="box"))
    graph = p.graph()
    plan = p.fuse([[k.name for k in graph.kernels]])
    image = np.random.default_rng(sum(shape)).random(shape, np.float32) + 0.1
    ours = p.run(backend="cpu", plan=plan, img=image)["box"]
    exact = p.run(backend="numpy", plan="unfused", img=image)["box"]
    assert relative_error(ours, exact) <= 1e-6
    sharing = additions(generate(graph, plan.kernel_groups).source)
    configure(window_sums=False)
    assert additions(generate(graph, plan.kernel_groups).source) > sharing


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
def test_a_window_whose_partial_sums_are_used_elsewhere(boundary):
    """The first pair of a window also read on its own, and the other pair written out
    elsewhere: every value is still computed (and once)."""
    p = kf.Pipeline("shared_pairs")
    x = p.input("x", ndim=2)
    left = x.at(0, -1) + x
    p.output(kf.local((left + x.at(0, 1)) * left + (x + x.at(0, 1)), boundary=boundary,
                      name="y"))
    data = np.random.default_rng(3).random((13, 17), np.float32) + 0.5
    ours = p.run(backend="cpu", plan="unfused", x=data)["y"]
    exact = p.run(backend="numpy", plan="unfused", x=data)["y"]
    assert relative_error(ours, exact) <= 1e-6
