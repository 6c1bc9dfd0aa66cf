"""Cost models: wahib (Wahib & Maruyama 2014 Eqs. 2-10), qiao (Qiao 2021 edge weights), measured, model-check."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from kfuse.errors import BackendUnavailable, FusionError, KfuseError
from kfuse.model import qiao, wahib
from kfuse.model.device import default_profile
from kfuse.model.wahib import Architecture, KernelMetadata, project_group
from kfuse.tune.measured import spearman


def cuda_usable() -> bool:
    from kfuse.runtime.cuda_backend import CudaBackend
    return CudaBackend.available()


# ------------------------------------------------------------------------------------------------
# wahib: the worked example of Wahib & Maruyama 2014 (K20X, double precision)
# ------------------------------------------------------------------------------------------------

def test_worked_example_equations():
    h_th = wahib.halo_per_thread(32, 128)
    assert h_th == 1  # ceil(32 / 128): the ceiling the example needs
    b_sh = wahib.shared_blocking_factor(86, 32, True, h_th, 2)
    assert b_sh == 688
    gflops = wahib.memory_bound_gflops(688, 14, 202.0, 128, 64, 8)
    assert gflops == pytest.approx(688 * 14 * 202 / (8 * 128 * 64))
    assert gflops == pytest.approx(29.69, abs=0.01)
    # the paper's roofline comparison: 0.195 * 202 = 39.39 GFLOPS, of which 75.4% (⚠ 75.8%)
    assert gflops / (0.195 * 202) == pytest.approx(0.754, abs=0.001)
    assert wahib.projected_time(29.69e9, gflops) == pytest.approx(1.0, rel=1e-3)


def example_kernels() -> list[KernelMetadata]:
    """Three kernels sharing two arrays (T, Q), one halo layer needed by one of them."""
    common = dict(threads_per_block=128, blocks=64, active_blocks_per_sm=32, registers=16,
                  flops=1e6, element_size={"T": 8, "Q": 8, "V": 8, "W": 8})
    return [
        KernelMetadata("A", active_threads_per_block=86, reads={"T": 1}, writes=("Q",),
                       runtime_s=1e-4, **common),
        KernelMetadata("B", active_threads_per_block=128, reads={"Q": 3}, writes=("V",),
                       halo=32, runtime_s=1e-4, **common),
        KernelMetadata("C", active_threads_per_block=128, reads={"T": 3}, writes=("W",),
                       runtime_s=1e-4, **common),
    ]


def test_worked_example_through_a_group():
    # Kepler's real limits (16 blocks, 48 KB) forbid the example's BlocksSMX = 32 (a ⚠ of
    # the notes); an architecture that allows it reproduces the printed figures.
    roomy = replace(wahib.PRESETS["k20x"], shared_memory_per_sm=96 * 1024,
                    max_blocks_per_sm=32, max_threads_per_sm=4096)
    projection = project_group(example_kernels(), roomy)
    assert projection.feasible
    assert projection.pivot == ("Q", "T") and projection.shared_list == ("Q", "T")
    assert projection.complex_fusion and projection.halo_per_thread == 1
    assert projection.active_threads == 86 and projection.blocks_per_sm == 32
    assert projection.b_sh == 688
    assert projection.gflops == pytest.approx(29.69, abs=0.01)
    assert projection.b_eff == pytest.approx(1.176, abs=0.001)  # > 1, as the notes flag
    # FLOPs: every member's, plus A recomputing Q on B's halo: Flop(Q) * Hal / Thr (notes
    # 6.6, 6.7)
    assert projection.halo_flops == pytest.approx(1e6 * 32 / 128)
    assert projection.time_s == pytest.approx(3.25e6 / 29.69e9, rel=1e-3)


def test_worked_example_on_real_k20x_limits_lowers_the_blocks():
    projection = project_group(example_kernels(), wahib.PRESETS["k20x"])
    assert projection.feasible
    assert projection.blocks_per_sm == 16  # Kepler's hardware limit
    assert projection.b_sh == 86 * 16 / 4
    assert projection.limited_by in ("blocks per SM", "threads per SM")


def test_halo_flops_and_literal_flag():
    a, b, _ = example_kernels()
    producer = replace(a, writes=("Q",), array_flops={"Q": 4e5})
    consumer = replace(b, halo=64)
    adopted = project_group([producer, consumer], wahib.PRESETS["k20x"])
    assert adopted.complex_fusion
    assert adopted.halo_flops == pytest.approx(4e5 * 64 / 128)  # Flop(Q) * Hal / Thr
    literal = project_group([producer, consumer], wahib.PRESETS["k20x"],
                            wahib.WahibOptions(literal_halo=True))
    assert literal.halo_flops == pytest.approx(4e5 * 64 / (64 * 128))  # Hal / (B * Thr)
    assert literal.time_s < adopted.time_s


def test_constraint_1_7_registers():
    a, b, _ = example_kernels()
    heavy = replace(b, reads={"Q": 300})  # a 300-point stencil needs > 255 registers (Eq. 6)
    projection = project_group([a, heavy], wahib.PRESETS["k20x"])
    assert not projection.feasible and projection.constraint == "1.7"
    assert "255" in projection.reason and math.isinf(projection.time_s)


def test_constraint_1_6_shared_memory():
    # six 1024-thread kernels, each staging its own stencil input, all reading 's': seven
    # staged double arrays need 7 * 8 * 1024 bytes for one block, more than 48 KB
    kernels = [KernelMetadata(f"k{i}", 1024, 64, 1024, 2, 16, 1e6,
                              reads={f"x{i}": 5, "s": 5}, writes=(f"y{i}",),
                              shared_arrays=(f"x{i}",),
                              element_size={f"x{i}": 8, "s": 8, f"y{i}": 8})
               for i in range(6)]
    projection = project_group(kernels, wahib.PRESETS["k20x"])
    assert not projection.feasible and projection.constraint == "1.6"
    assert "shared memory" in projection.reason and "49152" in projection.reason


def test_normalized_variant_needs_bytes_and_caps_efficiency():
    a, b, c = example_kernels()
    with pytest.raises(KfuseError, match="array sizes"):
        project_group([a, b], wahib.PRESETS["k20x"], wahib.WahibOptions(normalized=True))
    sized = [replace(k, array_bytes={x: 8e6 for x in ("T", "Q", "V", "W")}) for k in (a, b)]
    projection = project_group(sized, wahib.PRESETS["k20x"], wahib.WahibOptions(normalized=True))
    # T (read), Q and V (written): 24 MB at <= 202 GB/s
    assert projection.dram_bytes == 24e6
    assert projection.time_s >= 24e6 / 202e9


def test_presets_and_profiles():
    assert wahib.preset("K20X").sm_count == 14
    assert wahib.preset("gtx-750-ti").shared_memory_per_sm == 64 * 1024
    with pytest.raises(KfuseError, match="k20x"):
        wahib.preset("p100")
    arch = Architecture.from_profile(default_profile())
    assert arch.sm_count == 132 and arch.max_blocks_per_sm == 32


# ------------------------------------------------------------------------------------------------
# qiao: Qiao 2021's Harris numbers
# ------------------------------------------------------------------------------------------------

def test_qiao_harris_edge_weights():
    params = qiao.QiaoParameters(t_g=400, c_op=4)  # cycles, as the thesis
    # (sx, gx): 400 - 4 * 2 * 1 * 9 = 328; (sxy, gxy): the producer has two inputs -> 256
    assert qiao.raw_benefit("recompute", 1, 2, 1, 9, params) == 328
    assert qiao.raw_benefit("recompute", 1, 2, 2, 9, params) == 256
    assert qiao.raw_benefit("register", 1, 2, 1, 1, params) == 400
    assert qiao.edge_weight(qiao.raw_benefit("none", 1, 2, 1, 9, params), params) == \
        params.epsilon
    assert qiao.edge_weight(-50.0, params) == params.epsilon  # w_e = max(w + gamma, eps)


def test_qiao_windows_and_scenarios():
    assert qiao.fused_window(9, 9) == 25 and qiao.fused_window(9, 25) == 49
    assert qiao.fused_window(1, 9) == 9  # g(1, sz) = sz: one formula for P->L and L->L
    assert qiao.fused_window_rect((3, 3), (5, 5)) == 49
    assert qiao.fused_window_rect((1, 3), (3, 3)) == 15
    assert qiao.scenario(1, True) == "register"
    assert qiao.scenario(9, False) == "recompute"
    assert qiao.scenario(9, True) == "shared"
    assert qiao.scenario(9, True, consumer_global=True) == "none"
    shared = qiao.QiaoParameters(t_g=400, t_s=400 / 15)
    ratio = replace(shared, ratio=True)
    assert qiao.raw_benefit("shared", 1, 0, 1, 25, shared) == pytest.approx(400 - 400 / 15)
    assert qiao.raw_benefit("shared", 1, 0, 1, 25, ratio) == pytest.approx(15)


def test_qiao_on_the_ir():
    from kfuse.apps import get_app
    from kfuse.model.roofline import nominal_sizes

    graph = get_app("harris").build().graph()
    sizes = nominal_sizes(graph)
    params = qiao.QiaoParameters.for_device(default_profile())
    kind, benefit = qiao.graph_edge_benefit(graph, "sx", "gx", "sx", sizes, params)
    assert kind == "recompute" and benefit > 0
    kind, _ = qiao.graph_edge_benefit(graph, "dx", "sx", "dx", sizes, params)
    assert kind == "register"
    night = get_app("night").build().graph()
    kind, benefit = qiao.graph_edge_benefit(night, "atrous0", "atrous1",
                                            night.kernel_by_name["atrous0"].output,
                                            nominal_sizes(night), params)
    assert kind == "shared" and benefit < 0  # Qiao 2021: Atrous0 -> Atrous1 does not pay
    prediction = qiao.predict_group(graph, ("sx", "gx"), ("gx",), sizes, default_profile())
    assert prediction.time_s < prediction.unfused_s
    assert prediction.time_s >= prediction.floor_s


# ------------------------------------------------------------------------------------------------
# models planning IR graphs
# ------------------------------------------------------------------------------------------------

def test_models_are_registered_for_graphs():
    from kfuse.search.problem import GRAPH_MODELS
    for name in ("roofline", "wahib", "wahib-norm", "qiao", "measured"):
        assert name in GRAPH_MODELS


@pytest.mark.parametrize("model", ["wahib", "wahib-norm", "qiao"])
def test_search_with_each_model_gives_a_legal_plan(model):
    from kfuse.apps import get_app
    from kfuse.fusion.plan import check_groups
    from kfuse.search import search

    graph = get_app("unsharp").build().graph()
    plan = search(graph, "greedy", model)
    assert plan.model == model
    assert not check_groups(graph, [g.members for g in plan.groups])
    assert plan.predicted_time_s <= plan.unfused_predicted_time_s


def test_wahib_on_the_ir_reports_constraints():
    from kfuse.apps import get_app
    from kfuse.model.roofline import nominal_sizes

    graph = get_app("harris").build().graph()
    sizes = nominal_sizes(graph)
    single = wahib.graph_group_time(graph, ("gx",), ("gx",), sizes, default_profile())
    assert single > 0
    fused = wahib.predict_graph_group(graph, ("sx", "gx"), ("gx",), sizes, default_profile())
    assert fused.complex_fusion and "sx" in fused.shared_list and fused.feasible
    tiny = replace(default_profile(), shared_memory_per_sm=1024)
    with pytest.raises(FusionError, match=r"\(1\.6\)"):
        wahib.graph_group_time(graph, ("sx", "gx"), ("gx",), sizes, tiny)


# ------------------------------------------------------------------------------------------------
# measured model and model-check
# ------------------------------------------------------------------------------------------------

def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) is None


@pytest.mark.skipif(cuda_usable(), reason="checks the message on a machine without a GPU")
def test_measured_model_needs_the_cuda_backend():
    from kfuse.apps import get_app
    from kfuse.tune import measured

    graph = get_app("sobel").build().graph()
    with pytest.raises(BackendUnavailable, match="measuring needs the cuda backend"):
        measured.graph_group_time(graph, ("dx",), ("dx",), {"H": 64, "W": 64},
                                  default_profile())


@pytest.mark.gpu
def test_measured_model_times_groups_on_the_gpu():  # pragma: no cover - GPU only
    from kfuse.apps import get_app
    from kfuse.tune.measured import GroupTimer

    graph = get_app("sobel").build().graph()
    sizes = graph.bind_shapes({name: (512, 512) for name in graph.inputs})
    timer = GroupTimer(graph, sizes, repeat=5)
    assert timer.time(("dx", "dy", "mag")) > 0
    assert timer.unfused(("dx", "dy", "mag")) > 0


def test_group_timer_machinery_on_the_cpu_backend():
    """The measured model's timer, run through the host shim: it times a fused group on the
    buffers of the unfused run, and the group's kernel really computes the outputs."""
    import numpy as np

    from kfuse.apps import get_app
    from kfuse.runtime import get_backend
    from kfuse.runtime.binding import to_numpy
    from kfuse.tune.measured import GroupTimer, random_inputs

    graph = get_app("sobel").build().graph()
    sizes = graph.bind_shapes({name: (19, 23) for name in graph.inputs})
    given = random_inputs(graph, sizes)
    timer = GroupTimer(graph, sizes, given, backend="cpu", warmup=0, repeat=2)
    assert timer.time(("dx", "dy", "mag")) > 0 and timer.unfused(("dx", "mag")) > 0
    assert ("dx", "dy", "mag") in timer._times  # cached
    output = graph.outputs[0]
    timer.base.buffers[output].fill(np.nan)
    timer._times.clear()
    timer.time(("dx", "dy", "mag"))
    expected = get_backend("numpy").run(graph, given)[output]
    np.testing.assert_allclose(to_numpy(timer.base.buffers[output]), to_numpy(expected),
                               rtol=1e-5, atol=1e-5)


def run_cli(capsys, *argv):
    from kfuse.cli.main import main
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.skipif(cuda_usable(), reason="checks the message on a machine without a GPU")
def test_model_check_without_gpu_says_why(capsys):
    code, _, err = run_cli(capsys, "model-check", "harris")
    assert code == 2
    assert "measuring needs the cuda backend" in err and "--no-measure" in err


def test_model_check_no_measure_prints_predictions(capsys):
    code, out, _ = run_cli(capsys, "model-check", "sobel", "unsharp", "--no-measure", "--json")
    assert code == 0
    report = json.loads(out)
    groups = report["groups"]
    assert groups and {row["app"] for row in groups} == {"sobel", "unsharp"}
    for row in groups:
        assert len(row["group"]) >= 2 and row["measured"] is None
        for model in ("roofline", "wahib", "qiao"):
            entry = row["predicted"][model]
            assert entry["unfused_s"] > 0
            assert entry["fused_s"] is None or entry["fused_s"] > 0
    code, out, _ = run_cli(capsys, "model-check", "sobel", "--no-measure",
                           "--candidates", "pairs")
    assert code == 0 and "roofline" in out and "dx+mag" in out.replace("\n", "")


def test_the_roofline_predicts_the_register_tile_a_form_names():
    """A recompute group's shared taps depend on its register tile: the model counts the
    tile the form gives (the generator's), not the default one."""
    from kfuse.apps import get_app
    from kfuse.model import roofline
    from kfuse.schedule.forms import Recompute

    app = get_app("harris")
    graph = app.build().graph()
    sizes = app.sizes(graph, app.bench_size)
    members = tuple(kernel.name for kernel in graph.kernels)
    outputs = tuple(graph.outputs)
    profile = default_profile()

    def predicted(tile):
        return roofline.predict_group(graph, members, outputs, sizes, profile,
                                      Recompute(tile=tile))

    assert predicted(None) == roofline.predict_group(graph, members, outputs, sizes, profile)
    # one point per thread recomputes the window sums at every tap; a tall tile shares rows
    one, tall = predicted((1, 1)), predicted((8, 1))
    assert one.operations > tall.operations > 0
    assert one.cached_loads > tall.cached_loads > 0
