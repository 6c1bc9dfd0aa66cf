"""Constant factors carried out of fused intermediates (kfuse.codegen.scales): applied once
at the outputs, constant-mode borders of scaled intermediates answered with the right value,
intermediates kept within MAX_FACTOR of their true values (no overflow the unfused program
would not have), results equal to the reference on the cpu backend."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.codegen import generate
from kfuse.codegen.scales import MAX_FACTOR, factor_out_constants
from kfuse.ir.expr import Const


def fused_and_reference(pipeline: kf.Pipeline, **given) -> tuple[dict, dict, str]:
    """Everything in one kernel on the cpu backend, the numpy reference, and the source."""
    graph = pipeline.graph()
    plan = pipeline.fuse([[k.name for k in graph.kernels]])
    fused = pipeline.run(backend="cpu", plan=plan, **given)
    exact = pipeline.run(backend="numpy", plan="unfused", **given)
    return fused, exact, generate(graph, plan.kernel_groups).source


def constants_of(body) -> set[float]:
    return {float(node.value) for node in body.walk() if isinstance(node, Const)}


def test_harris_computes_its_intermediates_without_the_masks_scales():
    graph = get_app("harris").build().graph()
    members = [k.name for k in graph.kernels]
    rewritten, factors = factor_out_constants(graph, members)
    assert factors["dx"] == pytest.approx(1 / 6) and factors["gx"] == pytest.approx(1 / 576)
    assert factors["hc"] == pytest.approx((1 / 576) ** 2)
    for kernel in rewritten.kernels:
        assert not constants_of(kernel.body) & {1 / 6, 1 / 16}, kernel.name
    source = generate(graph, [(tuple(members), ("hc",), "recompute")]).source
    assert "0.16666666666666666f" not in source and "0.0625f" not in source
    assert f"{(1 / 576) ** 2!r}f * " in source  # once per stored point


@pytest.mark.parametrize("shape", [(9, 14), (17, 5)])
def test_constant_borders_of_scaled_intermediates(shape):
    """A scaled intermediate read outside the image in constant mode gives the constant
    (the rewritten read answers it divided by the intermediate's factor)."""
    p = kf.Pipeline("scaled_borders")
    img = p.input("img", ndim=2)
    blur = kf.convolve(img, [[1, 2, 1]] * 3, boundary=kf.constant(0.7), scale=1 / 12,
                       name="blur")
    box = kf.convolve(blur, [[1, 1, 1]] * 3, boundary=kf.constant(-0.4), scale=1 / 9,
                      name="box")
    p.output(kf.point(box * box * 3.0 - blur, name="out"))
    image = np.random.default_rng(sum(shape)).random(shape, np.float32) + 0.1
    fused, exact, source = fused_and_reference(p, img=image)
    assert relative_error(fused["out"], exact["out"]) <= 1e-6
    assert "0.08333333333333333f" not in source  # the 1/12 left the blur


def test_intermediates_stay_within_the_bound_of_their_true_values():
    """x ~ 1e20, a = x 1e-7 ~ 1e13, b = a a 1e-20 ~ 1e6: the product of the unscaled a's
    (1e40) would overflow float32, so one operand's factor is multiplied in first (1e33);
    every factor stays bounded."""
    p = kf.Pipeline("large")
    x = p.input("x", ndim=2)
    a = kf.point(x * 1e-7, name="a")
    b = kf.point(a * a * 1e-20, name="b")
    p.output(kf.local(b.at(0, 1) + b * 0.5, boundary="clamp", name="c"))
    values = (np.random.default_rng(5).random((7, 9)) * 9e19 + 1e19).astype(np.float32)
    fused, exact, _ = fused_and_reference(p, x=values)
    assert np.isfinite(fused["c"]).all()
    assert relative_error(fused["c"], exact["c"]) <= 1e-5
    graph = p.graph()
    _, factors = factor_out_constants(graph, [k.name for k in graph.kernels])
    assert all(1 / MAX_FACTOR <= abs(f) <= MAX_FACTOR for f in factors.values())


def test_a_long_chain_of_scalings_multiplies_factors_in_past_the_bound():
    p = kf.Pipeline("chain")
    stage = p.input("img", ndim=2)
    for step in range(8):
        stage = kf.point(stage * 0.0625 + 0.5 * kf.coord(1), name=f"blur{step}")
    stage = kf.convolve(stage, [[1, 2, 1]], scale=1 / 4, name="last")
    p.output(stage)
    graph = p.graph()
    _, factors = factor_out_constants(graph, [k.name for k in graph.kernels])
    exponents = [math.log2(abs(f)) for f in factors.values()]
    assert min(exponents) >= -24 and max(exponents) <= 24
    assert len(set(exponents)) > 1  # factors grew, then were multiplied in
    image = np.random.default_rng(2).random((23, 19), np.float32)
    fused, exact, _ = fused_and_reference(p, img=image)
    assert relative_error(fused["last"], exact["last"]) <= 1e-6


def test_non_float_and_nonlinear_operators_receive_true_values():
    """Comparisons, selects, exp and integer casts see their operands' true values."""
    p = kf.Pipeline("nonlinear")
    x = p.input("x", ndim=2)
    scaled = kf.point(x * 0.125 - 0.25, name="scaled")
    picked = kf.point(kf.where(scaled > 0.0, kf.exp(scaled * 3.0), scaled / 7.0), name="pick")
    p.output(kf.point(kf.astype(picked * 100.0, "int32") + 1, name="ints"))
    p.output(kf.point(kf.sqrt(picked * picked * 0.5) + kf.maximum(scaled, -0.1), name="mix"))
    values = np.random.default_rng(9).uniform(-2.0, 6.0, (11, 13)).astype(np.float32)
    fused, exact, _ = fused_and_reference(p, x=values)
    assert relative_error(fused["mix"], exact["mix"]) <= 1e-6
    assert np.abs(fused["ints"] - exact["ints"]).max() <= 1  # a rounding at a cut may move


def test_a_border_constant_too_large_to_divide_keeps_the_true_value():
    """constant(3e38) around an intermediate of factor 1/16: 3e38 * 16 would overflow
    float32, so that intermediate keeps its true value."""
    p = kf.Pipeline("sentinel")
    x = p.input("x", ndim=2)
    blur = kf.convolve(x, [[1, 2, 1], [2, 4, 2], [1, 2, 1]], scale=1 / 16, boundary="clamp",
                       name="blur")
    p.output(kf.local(blur.at(0, 1) + blur, boundary=kf.constant(3e38), name="out"))
    values = np.random.default_rng(4).random((6, 7), np.float32)
    fused, exact, _ = fused_and_reference(p, x=values)
    assert np.isfinite(fused["out"]).all()
    assert relative_error(fused["out"], exact["out"]) <= 1e-6
    graph = p.graph()
    _, factors = factor_out_constants(graph, [k.name for k in graph.kernels])
    assert factors["blur"] == 1.0


def test_a_sum_with_an_operand_at_its_true_value_stays_at_its_true_value():
    """a = x 1e-6 (factor 1e-6) plus y ~ 1e33 (its true value): the sum keeps factor 1, so
    y is never multiplied by 1e6 (which would overflow float32)."""
    p = kf.Pipeline("ratio")
    x = p.input("x", ndim=2)
    y = p.input("y", ndim=2)
    a = kf.point(x * 1e-6, name="a")
    p.output(kf.point(a + y, name="out"))
    rng = np.random.default_rng(8)
    given = {"x": rng.random((5, 16), np.float32),
             "y": (rng.random((5, 16)) * 1e33 + 1e32).astype(np.float32)}
    fused, exact, _ = fused_and_reference(p, **given)
    assert np.isfinite(fused["out"]).all()
    assert relative_error(fused["out"], exact["out"]) <= 1e-6
