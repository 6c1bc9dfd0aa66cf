"""The wave model (Qiao 2021, §4.3) and the stream schedule of a program's launches: which
kernels have no path between them, when separate streams are predicted to pay, and which
events order kernels on different streams. (Launching on streams needs a GPU; what is
launched where is decided here, on any machine.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import kfuse as kf
from kfuse.analysis.order import independent_sets
from kfuse.apps import get_app
from kfuse.codegen import generate
from kfuse.model.device import default_profile
from kfuse.model.waves import KernelShape, decide, waves
from kfuse.runtime.streams import kernel_shape, launch_dependencies, one_stream, schedule

PROFILE = default_profile()


def small(name: str, blocks: int = 16, seconds: float = 5e-6) -> KernelShape:
    return KernelShape(name, blocks, 256, 32, 0, seconds)


def test_waves_count_blocks_against_what_the_device_holds():
    # 256 threads of 32 registers: 8 blocks a multiprocessor, 132 x 8 at once
    assert waves(small("a", blocks=132 * 8), PROFILE) == 1.0
    assert waves(small("a", blocks=132 * 4), PROFILE) == 0.5
    heavy = KernelShape("b", 132, 1024, 64, 0, 1e-5)  # 64 x 1024 registers: one a multiprocessor
    assert waves(heavy, PROFILE) == 1.0


def test_small_independent_kernels_run_concurrently():
    decision = decide([small("a"), small("b"), small("c")], PROFILE, event_overhead_s=1e-6)
    assert decision.concurrent
    assert decision.multi_s < decision.single_s == pytest.approx(15e-6)
    assert "fit 1 wave(s) together" in decision.reason and "us" in decision.reason


def test_kernels_that_fill_the_device_stay_on_one_stream():
    full = [small(name, blocks=132 * 8 * 3, seconds=1e-3) for name in "abc"]
    decision = decide(full, PROFILE)
    assert not decision.concurrent
    assert decision.multi_s == decision.single_s
    assert "3 fill the device alone" in decision.reason


def test_event_costs_can_outweigh_the_overlap():
    decision = decide([small("a", seconds=1e-6), small("b", seconds=1e-6)], PROFILE,
                      event_overhead_s=5e-6)
    assert not decision.concurrent and "not less than" in decision.reason
    assert not decide([small("a")], PROFILE).concurrent
    assert decide([small("a"), small("b"), small("c")], PROFILE).concurrent  # nominal O_event


def test_kernels_that_do_not_fit_together_take_several_waves():
    wide = [KernelShape(name, 132 * 6, 256, 32, 0, 5e-6) for name in "ab"]
    decision = decide(wide, PROFILE)  # 6 + 6 blocks of 8 a multiprocessor: two waves
    assert "fit 2 wave(s)" in decision.reason and not decision.concurrent


def test_levels_are_sets_with_no_path_between_them():
    # 0 -> 1, 0 -> 2, (1, 2) -> 3, 4 alone
    assert independent_sets({1: {0}, 2: {0}, 3: {1, 2}}, 5) == [[0, 4], [1, 2], [3]]


def diamond() -> kf.Pipeline:
    p = kf.Pipeline("diamond")
    x = p.input("x", ndim=2)
    a = kf.local(x.at(0, 1) + x.at(0, -1), boundary="clamp", name="a")
    b = kf.point(a * 2.0, name="b")
    c = kf.local(a.at(1, 0) - a.at(-1, 0), boundary="mirror", name="c")
    p.output(kf.point(b + c, name="d"))
    return p


def test_launch_dependencies_follow_the_buffers():
    program = generate(diamond().graph())  # unfused: a, b, c, d
    assert launch_dependencies(program.launches) == {0: set(), 1: {0}, 2: {0}, 3: {1, 2}}
    assert one_stream(program).side_streams == 0


def test_a_concurrent_level_waits_for_the_other_stream():
    graph = diamond().graph()
    program = generate(graph)
    sizes = {symbol: 40 for symbol in graph.size_symbols}
    cheap_events = replace(PROFILE, notes={"event_overhead_s": 1e-7})
    plan = schedule(program, lambda i, spec: kernel_shape(graph, spec, sizes, cheap_events,
                                                          spec.grid_size(sizes), 32, 0),
                    cheap_events)
    assert plan.streams == (0, 0, 1, 0)  # b and c at once; d after both
    assert plan.waits == ((), (), (0,), (2,))
    assert plan.recorded == {0, 2} and plan.side_streams == 1
    assert "separate streams" in plan.explain()
    slow_events = replace(PROFILE, notes={"event_overhead_s": 1.0})
    serial = schedule(program, lambda i, spec: kernel_shape(graph, spec, sizes, slow_events,
                                                            spec.grid_size(sizes), 32, 0),
                      slow_events)
    assert serial.streams == (0, 0, 0, 0) and serial.waits == ((),) * 4
    assert "one stream" in serial.explain()


def test_the_levels_app_explains_its_branches():
    app = get_app("levels")
    pipeline = app.build()
    plan = pipeline.plan(sizes=app.sizes(pipeline.graph(), (256, 256)))
    assert plan.independent_groups == [[0, 1, 2, 3]]
    assert "no path between them" in plan.explain()
    assert get_app("harris").build().plan().independent_groups == []


def test_a_cpu_compiled_pipeline_explains_it_runs_on_the_host(tmp_path, monkeypatch):
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        return
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    app = get_app("levels")
    compiled = app.build().compile(backend="cpu")
    assert compiled.explain() == "nothing compiled yet"
    inputs, params = app.make_inputs((21, 30), np.random.default_rng(4), "float32")
    compiled(**inputs, **params)
    assert "l0 21x30" in compiled.explain() and "4 launch(es)" in compiled.explain()


@pytest.mark.parametrize("seed", [32, 83, 146, 254])
def test_every_launch_of_a_blas_sequence_has_a_predicted_time(seed):
    """The wave model asks the roofline model for each launch's time; launches of reductions
    whose points have fewer axes than their reads once raised a raw IndexError there (the
    fuzzer found it on the GPU, where streams are decided)."""
    import math

    from kfuse import fuzz
    from kfuse.codegen import generate
    from kfuse.model.device import default_profile
    from kfuse.runtime.binding import bind
    from kfuse.runtime.streams import predicted_seconds

    (case,) = fuzz.cases([seed])
    pipeline, inputs = fuzz.build(case)
    graph = pipeline.graph()
    plan = fuzz.plan_of(case, pipeline)
    program = generate(graph, None if plan == "unfused" else plan.kernel_groups)
    sizes = bind(graph, inputs).sizes
    for spec in program.launches:
        seconds = predicted_seconds(graph, spec, sizes, default_profile())
        assert math.isfinite(seconds) and seconds > 0
