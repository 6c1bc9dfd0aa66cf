"""Producers evaluated where their consumers read them (Halide's inlining): a fused group may
hold an operator read at another resolution, at computed indices or through a transposed
index, evaluated at the point the read lands on after the read's boundary mode. The
generated C runs on the cpu backend against the numpy backend (the truth), on odd sizes,
levels of one element and every boundary mode."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import FusionError
from kfuse.fusion.legality import group_violations
from kfuse.schedule.forms import Staged, Streamed, evaluated_where_read

MODES = ["clamp", "mirror", "repeat", ("constant", 0.25)]


def _boundary(mode):
    return kf.constant(mode[1]) if isinstance(mode, tuple) else mode


def _check(pipeline: kf.Pipeline, groups: list[list[str]], **arrays: np.ndarray) -> None:
    plan = pipeline.fuse(groups)
    got = pipeline.run(backend="cpu", plan=plan, **arrays)
    want = pipeline.run(backend="numpy", **arrays)
    for name, values in want.items():
        np.testing.assert_allclose(got[name], values, rtol=2e-6, atol=2e-6, err_msg=name)


def _levels(mode) -> kf.Pipeline:
    """A stencil's output read down and up a level: the stencil evaluated where read."""
    p = kf.Pipeline("levels")
    x = p.input("x", 2)
    boundary = _boundary(mode)
    smooth = kf.local(0.5 * x + 0.25 * (x.at(0, -1, boundary=boundary)
                                        + x.at(1, 1, boundary=boundary)), name="smooth")
    coarse = kf.downsample(smooth, boundary=boundary, name="coarse")
    p.output(kf.upsample(coarse, like=x, boundary=boundary, name="fine"), coarse)
    return p


@pytest.mark.parametrize(("mode", "shape"), [(mode, (13, 17)) for mode in MODES]
                         + [("clamp", (2, 2)), ("mirror", (2, 5)), ("repeat", (3, 2))],
                         ids=str)
def test_a_stencil_evaluated_at_a_coarser_levels_reads(mode, shape):
    p = _levels(mode)
    assert evaluated_where_read(p.graph(), ["smooth", "coarse"]) == ("smooth",)
    values = np.random.default_rng(0).random(shape, dtype=np.float32)
    _check(p, [["smooth", "coarse"]], x=values)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_a_level_evaluated_at_a_finer_levels_reads(mode):
    p = kf.Pipeline("up")
    x = p.input("x", 2)
    boundary = _boundary(mode)
    half = kf.downsample(x, boundary=boundary, name="half")
    scaled = kf.point(half * 3.0 - 1.0, name="scaled")
    p.output(kf.point(x - kf.upsampled(scaled, boundary=boundary), name="detail"))
    values = np.random.default_rng(1).random((11, 9), dtype=np.float32)
    _check(p, [["scaled", "detail"]], x=values)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_a_producer_evaluated_at_computed_indices(mode):
    p = kf.Pipeline("gathered")
    x = p.input("x", 1)
    doubled = kf.local(x * 2.0 + x.at(1, boundary=_boundary(mode)), name="doubled")
    # indices from -6 to 26: outside the table on both sides
    index = kf.astype(x * 32.0, "int32") - 6
    p.output(kf.point(kf.lookup(doubled, index, boundary=_boundary(mode)) + x, name="picked"))
    values = np.random.default_rng(2).random(21).astype(np.float32)
    _check(p, [["doubled", "picked"]], x=values)


def test_a_plane_chosen_per_point_from_a_stack_computed_in_the_kernel():
    p = kf.Pipeline("stack")
    image = p.input("image", 2)
    stack = kf.point(image.at(0, 0, dims=(1, 2)) * kf.astype(kf.coord(0), "float32") + 1.0,
                     name="stack", shape=(5, "h", "w"))
    chosen = kf.astype(image * 7.0, "int32") - 1  # -1 .. 5: outside the stack too
    p.output(kf.point(stack.at(0, 0, 0, index={0: chosen}, boundary="mirror")
                      + stack.at(1, 0, 0, index={0: chosen}, boundary=kf.constant(-2.0)),
                      name="picked"))
    assert group_violations(p.graph(), ["stack", "picked"]) == []
    values = np.random.default_rng(3).random((7, 10), dtype=np.float32)
    _check(p, [["stack", "picked"]], image=values)


def test_a_producer_read_through_a_transposed_index():
    p = kf.Pipeline("transposed")
    x = p.input("x", 2)
    blurred = kf.local(x + x.at(0, 1, boundary="mirror"), name="blurred")
    p.output(kf.point(blurred.at(0, 0, dims=(1, 0)) * 2.0, name="flipped",
                      shape=("w", "h")))
    values = np.random.default_rng(4).random((6, 9), dtype=np.float32)
    _check(p, [["blurred", "flipped"]], x=values)


def test_a_reduction_of_a_coarser_level_computed_where_read():
    p = kf.Pipeline("reduced")
    x = p.input("x", 2)
    squared = kf.point(x * x, name="squared")
    coarse = kf.downsample(squared, boundary="mirror", name="coarse")
    p.output(kf.reduce_sum(coarse, name="total"))
    values = np.random.default_rng(5).random((15, 12), dtype=np.float32)
    _check(p, [["squared", "coarse", "total"]], x=values)


def test_what_cannot_be_evaluated_where_read_is_refused_by_name():
    assert group_violations(_levels("clamp").graph(), ["smooth", "coarse"]) == []
    # 'smooth' written to memory for 'other' and evaluated on the coarse grid: two grids
    p2 = kf.Pipeline("both")
    x = p2.input("x", 2)
    smooth = kf.point(x * 2.0, name="smooth")
    coarse = kf.downsample(smooth, name="coarse")
    p2.output(coarse, kf.point(smooth + 1.0, name="other"))
    reasons = [str(v) for v in group_violations(p2.graph(), ["smooth", "coarse"])]
    assert any("iteration spaces differ" in r for r in reasons), reasons
    with pytest.raises(FusionError, match="iteration spaces differ"):
        p2.fuse([["smooth", "coarse"]])
    # a shallower operator is never repeated along the axes it lacks
    p3 = kf.Pipeline("broadcast")
    image = p3.input("image", 2)
    gray = kf.point(image * 0.5, name="gray")
    p3.output(kf.point(gray.at(0, 0, dims=(1, 2)) + kf.astype(kf.coord(0), "float32"),
                       name="planes", shape=(3, "h", "w")))
    reasons = [str(v) for v in group_violations(p3.graph(), ["gray", "planes"])]
    assert any("nesting depth" in r for r in reasons), reasons


def test_forms_that_keep_values_at_their_own_points_say_why_not():
    graph = _levels("clamp").graph()
    for form in (Staged(), Streamed()):
        reason = form.why_not(graph, ["smooth", "coarse"])
        assert reason and "evaluated where read" in reason and "'smooth'" in reason
    plan = _levels("clamp").fuse([["smooth", "coarse"]])
    assert plan.groups[0].variant == "where_read"
    assert "'smooth' is evaluated where 'coarse' reads it (at another resolution)" in \
        plan.explain()


def test_chains_of_reads_at_other_points_are_bounded():
    p = kf.Pipeline("zoom")
    x = p.input("x", 2)
    once = kf.upsample(x, name="once")
    twice = kf.upsample(once, name="twice")
    p.output(kf.upsample(twice, name="thrice"))
    graph = p.graph()
    assert group_violations(graph, ["once", "twice"]) == []  # 9 interpolation taps
    (violation,) = group_violations(graph, ["once", "twice", "thrice"])
    assert violation.rule == "evaluations_where_read_bounded"
    assert "90 times per point ('once' 81 times; at most 32)" in violation.reason
    values = np.random.default_rng(6).random((5, 4), dtype=np.float32)
    _check(p, [["once", "twice"]], x=values)


def test_grids_that_differ_are_named_whatever_else_the_group_holds():
    p = kf.Pipeline("grids")
    image = p.input("image", 2)
    planes = kf.point(image.at(0, 0, dims=(1, 2)) + kf.astype(kf.coord(0), "float32"),
                      name="planes", shape=(3, "h", "w"))
    stack = kf.point(planes * 2.0, name="stack")
    scaled = kf.point(image * 3.0, name="scaled")
    chosen = kf.astype(image * 3.0, "int32")
    p.output(stack, kf.point(stack.at(0, 0, 0, index={0: chosen})
                             + kf.upsampled(kf.downsample(scaled, name="half")),
                             name="picked"))
    reasons = [str(v) for v in group_violations(
        p.graph(), ["planes", "stack", "scaled", "half", "picked"])]
    assert any("iteration spaces differ" in r for r in reasons), reasons
