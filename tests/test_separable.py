"""Separable stencils (kfuse.ir.separable): a weighted sum of taps whose weights are an outer
product is rewritten as sums down one axis weighted along the other, with the same weight
on every tap (the linear forms agree), and anything else is left as it is."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse.dsl as kf
from kfuse.ir.separable import linear_form, outer_factors, separated


def body_of(weights: dict[tuple[int, int], float], extra: float = 0.0, dtype: str = "float32"):
    p = kf.Pipeline("weights")
    u = p.input("u", ndim=2, dtype=dtype)
    c = p.param("c", dtype)
    total = None
    for (dy, dx), weight in weights.items():
        term = u.at(dy, dx) * weight
        total = term if total is None else total + term
    if extra:
        total = total + c * u.at(0, 1) + extra
    y = kf.local(total, name="y")
    p.output(y)
    return p.graph().kernel_by_name["y"].body


def taps_of(body) -> dict[tuple, float]:
    form = linear_form(body)
    return {key[4]: weight for key, weight in form.taps.items() if weight != 0.0}


@pytest.mark.parametrize("seed", range(4))
def test_a_rank_one_stencil_is_summed_down_its_columns_with_the_same_weights(seed):
    rng = np.random.default_rng(seed)
    down, across = rng.uniform(0.1, 1.0, 3), rng.uniform(-1.0, 1.0, 3)
    weights = {(dy, dx): float(down[dy + 1] * across[dx + 1])
               for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    body = body_of(weights, extra=0.5)
    rewritten = separated(body, inner_axis=0)
    assert rewritten is not body
    before, after = taps_of(body), taps_of(rewritten)
    assert before.keys() == after.keys()
    for offsets, weight in before.items():
        assert after[offsets] == pytest.approx(weight, rel=1e-6), offsets
    assert linear_form(rewritten).constant == pytest.approx(0.5)
    assert len(linear_form(rewritten).others) == 1  # c * u(0, 1), untouched


def test_stencils_of_higher_rank_and_integer_ones_are_left_as_they_are():
    laplacian = {(-1, 0): 1.0, (1, 0): 1.0, (0, -1): 1.0, (0, 1): 1.0, (0, 0): -4.0}
    body = body_of(laplacian)
    assert separated(body) is body
    row = {(0, -1): 1.0, (0, 0): 2.0, (0, 1): 1.0}  # one row only: nothing to share
    body = body_of(row)
    assert separated(body) is body
    box = {(dy, dx): 1.0 for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    body = body_of(box, dtype="int32")
    assert separated(body) is body


def test_outer_factors_scale_out_the_common_weight():
    weights = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16
    a, b, scale = outer_factors(weights)
    assert list(a) == [1.0, 2.0, 1.0] and list(b) == [1.0, 2.0, 1.0] and scale == 1 / 16
    assert np.allclose(scale * np.outer(a, b), weights)
    assert outer_factors(np.array([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])) is None
    zero_first = np.outer([0.0, 1.0, 3.0], [2.0, 0.0, 1.0])
    a, b, scale = outer_factors(zero_first)
    assert np.allclose(scale * np.outer(a, b), zero_first)


def test_the_switch_keeps_streamed_steps_summed_as_written():
    from kfuse.apps import get_app
    from kfuse.codegen import generate
    from kfuse.config import configured
    from kfuse.schedule.forms import GroupSchedule, Streamed, group_outputs

    graph = get_app("smooth2d").build().graph()
    members = tuple(k.name for k in graph.kernels)
    groups = [GroupSchedule(members, group_outputs(graph, members), Streamed())]
    with configured(separable_sums=False):
        flat = generate(graph, groups).source
    assert generate(graph, groups).source != flat
    assert separated(graph.kernels[0].body) is not graph.kernels[0].body
