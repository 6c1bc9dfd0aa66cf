"""Generated source: readable, one kernel per operator, valid CUDA for nvcc."""

from __future__ import annotations

import pytest

import kfuse as kf
from kfuse.apps import list_apps
from kfuse.codegen import generate_unfused
from kfuse.codegen.prelude import PRELUDE
from kfuse.codegen.resources import kernel_resources, nvcc_available, parse_ptxas


def test_one_named_kernel_per_operator():
    p = kf.Pipeline("demo")
    img = p.input("img", ndim=2)
    blur = kf.convolve(img, [[1, 1, 1]] * 3, scale=1 / 9)
    total = kf.reduce_sum(blur)
    p.output(kf.point(blur / total, name="normalised"))
    program = generate_unfused(p.graph())
    assert [spec.symbol for spec in program.launches] == ["demo_blur", "demo_total",
                                                          "demo_normalised"]
    assert program.source.count(PRELUDE) == 1
    for spec in program.launches:
        assert f"void __launch_bounds__({spec.block[0] * spec.block[1]}) {spec.symbol}(" \
            in program.source
    assert "written at test_codegen.py" in program.source
    (total_spec,) = [s for s in program.launches if s.symbol == "demo_total"]
    assert total_spec.initial_values == (("total", 0),)


def test_buffer_names_that_clash_with_generated_names_are_renamed():
    p = kf.Pipeline("clash")
    x = p.input("ix", ndim=2)
    v = kf.point(x * 2, name="v1")
    p.output(v)
    source = generate_unfused(p.graph()).source
    assert "const float* __restrict__ ix_buf" in source
    assert "float* __restrict__ v1_buf" in source


def test_wide_index_uses_64_bit_offsets():
    p = kf.Pipeline("wide")
    x = p.input("x", ndim=2)
    p.output(kf.local(x.at(1, 0) + x, name="y"))
    assert "typedef long long kf_index_t;" in generate_unfused(p.graph(), wide_index=True).source
    assert "typedef int kf_index_t;" in generate_unfused(p.graph()).source


PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    figures = parse_ptxas(PTXAS_LOG)
    assert figures["k_a"].registers == 40 and figures["k_a"].shared_bytes == 256
    assert figures["k_a"].spill_store_bytes == 8 and figures["k_a"].barriers == 1
    assert figures["k_b"].registers == 12 and figures["k_b"].shared_bytes == 0


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize("app", [a.name for a in list_apps()])
def test_every_app_compiles_with_nvcc(app):
    from kfuse.apps import get_app
    graph = get_app(app).build().graph()
    program = generate_unfused(graph)
    figures = kernel_resources(program.source)
    assert {spec.symbol for spec in program.launches} <= set(figures)
    for spec in program.launches:
        assert figures[spec.symbol].spill_store_bytes == 0
