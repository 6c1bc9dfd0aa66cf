"""Partitioned border handling (kfuse.schedule.borders; Membarth 2013, ch. 5): threads whose
tile and halo lie inside on every axis read with no boundary modes, the others keep the
edge test. On the cpu backend, stencil kernels so written equal the reference in every
mode, at sizes with an interior region and sizes with none; the benefit model chooses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app
from kfuse.apps.check import reference_errors
from kfuse.codegen.generate import generate
from kfuse.errors import FusionError
from kfuse.schedule import borders
from kfuse.schedule.forms import (
    GroupSchedule,
    Recompute,
    Single,
    Tiled,
    default_form,
    parse_form,
)

MODES = ["clamp", "mirror", "repeat", kf.constant(0.5)]


def partitioned_plan(pipeline: kf.Pipeline, groups: list[list[str]]):
    """``groups`` under their default forms with partitioned borders."""
    graph = pipeline.graph()
    forms = []
    for members in groups:
        form = default_form(graph, members)
        assert isinstance(form, Tiled), form
        forms.append(replace(form, borders="partitioned"))
    return pipeline.fuse(groups, forms=forms)


# (app, groups: "all" in one kernel or "each" operator alone, size with an interior, mode)
CASES = [("harris", "all", (37, 300), mode) for mode in MODES] + [
    ("unsharp", "each", (21, 290), "repeat"), ("unsharp", "each", (21, 290), "clamp"),
    ("diffusion3d", "all", (6, 11, 290), "mirror"),
    ("diffusion3d", "all", (6, 11, 290), kf.constant(-0.25))]


@pytest.mark.parametrize(("name", "grouping", "size", "mode"), CASES, ids=str)
def test_partitioned_kernels_equal_the_reference(name, grouping, size, mode):
    app = get_app(name)
    pipeline = app.build(boundary=mode)
    graph = pipeline.graph()
    names = [k.name for k in graph.kernels]
    groups = [names] if grouping == "all" else [[n] for n in names]
    plan = partitioned_plan(pipeline, groups)
    assert "no boundary modes" in generate(graph, plan.kernel_groups).source
    for shape in (size, (3, 5) if len(size) == 2 else (2, 3, 5)):  # an interior; none
        arrays, params = app.make_inputs(shape, np.random.default_rng(5), "float32")
        outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
        errors = reference_errors(app, arrays, params, outputs, mode)
        assert max(errors.values()) <= 1e-5, (shape, errors)


def _harris_estimate(size, tile=(8, 4), block=(32, 4)):
    graph = get_app("harris").build().graph()
    members = [k.name for k in graph.kernels]
    sizes = get_app("harris").sizes(graph, size)
    return graph, members, borders.estimate(graph, members, graph.outputs, tile, block, sizes)


def test_the_benefit_model_grows_with_the_image_and_stops_at_point_operators():
    _, _, small = _harris_estimate((40, 400))
    _, _, large = _harris_estimate((2048, 2048))
    assert 0 < small.interior_share < large.interior_share < 1
    assert large.checks_left_out > 0 and large.gain > small.gain
    graph = get_app("harris").build().graph()
    point = [k.name for k in graph.kernels if all(a.is_point for a in k.accesses)][0]
    assert borders.estimate(graph, [point], (point,), (8, 4), (32, 4),
                            get_app("harris").sizes(graph, (64, 64))) is None
    assert "nothing beyond" in borders.why_not_partition(
        graph, [point], (point,), (8, 4), (32, 4), get_app("harris").sizes(graph, (64, 64)))


def test_without_an_interior_the_model_predicts_no_gain():
    graph, members, tiny = _harris_estimate((12, 40))
    assert tiny.interior_share == 0 and tiny.gain < 1
    sizes = get_app("harris").sizes(graph, (12, 40))
    reason = borders.why_not_partition(graph, members, graph.outputs, (8, 4), (32, 4), sizes)
    assert "no gain" in reason and "0% of threads interior" in reason
    large = get_app("harris").sizes(graph, (2048, 2048))
    assert borders.why_not_partition(graph, members, graph.outputs, (8, 4), (32, 4),
                                     large) is None


def test_kernels_keep_the_edge_test_unless_their_form_partitions():
    app = get_app("harris")
    graph = app.build().graph()
    names = tuple(k.name for k in graph.kernels)
    fixed = app.sizes(graph, (2048, 2048))
    for form, partitioned in ((Recompute(), False), (Recompute(borders="edge_test"), False),
                              (Recompute(borders="partitioned"), True)):
        groups = [GroupSchedule(names, tuple(graph.outputs), form)]
        for sizes in (fixed, None):
            source = generate(graph, groups, fixed_sizes=sizes).source
            assert ("no boundary modes" in source) == partitioned, (form, sizes)


def test_forms_name_their_borders_and_refuse_others():
    assert parse_form("recompute:partitioned") == Recompute(borders="partitioned")
    assert parse_form(Single(borders="edge_test").text()) == Single(borders="edge_test")
    with pytest.raises(FusionError, match="borders 'inside' is not one of"):
        Recompute(borders="inside")
    with pytest.raises(FusionError, match="takes no borders"):
        parse_form("staged:partitioned")
