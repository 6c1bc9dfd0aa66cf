"""Time-stepped stencils (issue 29): k steps of a stencil update, against NumPy.

Every app of ``kfuse.apps.timesteps`` on the cpu backend (the generated CUDA C) in every
boundary mode, on odd sizes, planned and unfused; the 2-D chains also with every step in one
kernel (the staged form: each step over the tile grown by the halo the later steps need)."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import reference_errors

STEPS = [app.name for app in list_apps("steps")]
BOUNDARIES = ["clamp", "mirror", "repeat", kfuse.constant(0.5)]


def cpu_or_skip():
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")


def check(name: str, boundary: object, plan: object, size: tuple[int, ...] | None = None
          ) -> None:
    app = get_app(name)
    pipeline = app.build(boundary=boundary)
    arrays, params = app.make_inputs(size or app.test_size, np.random.default_rng(11),
                                     "float32")
    if callable(plan):
        plan = plan(pipeline)
    outputs = pipeline.run(backend="cpu", plan=plan, **arrays, **params)
    errors = reference_errors(app, arrays, params, outputs, boundary)
    assert max(errors.values()) <= app.tolerance, (name, boundary, plan, errors)


def in_pairs(pipeline):
    """Consecutive steps fused two by two (the planner's choice at benchmark sizes)."""
    members = [k.name for k in pipeline.graph().kernels]
    return pipeline.fuse([members[i:i + 2] for i in range(0, len(members), 2)])


@pytest.mark.integration
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("name", STEPS)
def test_time_steps_equal_numpy_in_every_boundary_mode(name, boundary):
    """(The 27-point pair fused takes the host compiler a minute a mode: it is checked
    fused as planned, under clamp, below; its other modes unfused.)"""
    cpu_or_skip()
    if name != "stencil27":
        check(name, boundary, in_pairs)
    check(name, boundary, "unfused")


@pytest.mark.integration
@pytest.mark.parametrize("name", STEPS)
def test_time_steps_as_planned_equal_numpy(name):
    cpu_or_skip()
    check(name, "clamp", "auto")


@pytest.mark.integration
@pytest.mark.parametrize("name", [n for n in STEPS if get_app(n).ndim == 2])
def test_every_step_in_one_staged_kernel(name):
    cpu_or_skip()

    def all_steps(pipeline):
        members = [k.name for k in pipeline.graph().kernels]
        return pipeline.fuse([members], forms=["staged"])

    explained = all_steps(get_app(name).build()).explain()
    assert "staged in shared memory over the block's tile" in explained, explained
    for boundary in BOUNDARIES:
        if boundary == "repeat":  # (the staged form reads no periodic borders)
            with pytest.raises(kfuse.FusionError, match="periodic"):
                check(name, boundary, all_steps, (41, 67))
            continue
        check(name, boundary, all_steps, (41, 67))
    check(name, "clamp", all_steps, (3, 2))  # smaller than the steps' halo


STREAMED_SIZES = [(41, 67), (70, 131), (3, 2), (2, 5)]


@pytest.mark.integration
@pytest.mark.parametrize("name", [n for n in STEPS if get_app(n).ndim == 2])
def test_every_step_in_one_streamed_kernel(name):
    """Every step walked down the rows in one kernel: blocks narrower than the grid (32
    threads, 128 columns less the halo) and chunks of 16 rows, so blocks meet across
    columns and rows, and chunks hold iterations both near the grid's top and bottom and
    away from them (the unrolled phases)."""
    cpu_or_skip()
    form = kfuse.schedule.forms.Streamed(threads=32, chunk_rows=16)

    def all_steps(pipeline):
        members = [k.name for k in pipeline.graph().kernels]
        return pipeline.fuse([members], forms=[form])

    explained = all_steps(get_app(name).build()).explain()
    assert "walks down the rows" in explained, explained
    for boundary in BOUNDARIES:  # (periodic: rows and columns beyond the edges wrapped)
        for size in STREAMED_SIZES:
            check(name, boundary, all_steps, size)


def test_the_planner_walks_time_steps_down_the_rows():
    """At benchmark sizes every step of the 2-D chains is one streamed kernel."""
    for name in [n for n in STEPS if get_app(n).ndim == 2]:
        app = get_app(name)
        pipeline = app.build()
        graph = pipeline.graph()
        shape = graph.buffers[graph.inputs[0]].shape
        plan = pipeline.plan(sizes=dict(zip(shape, app.bench_size, strict=True)))
        assert [group.form.name for group in plan.groups] == ["streamed"], plan.explain()
