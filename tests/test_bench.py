"""kfuse.bench and kfuse.model.device without a GPU: floor, profiles, reports, PyTorch baseline."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

import kfuse
from kfuse.bench import (
    BenchRow,
    KernelRow,
    Timing,
    device_inputs,
    dram_floor_bytes,
    floor_seconds,
    from_json,
    input_sets_needed,
    launch_bytes,
    max_relative_error,
    print_report,
    to_json,
    to_markdown,
)
from kfuse.model import DeviceProfile, current_profile, default_profile
from kfuse.model import device as device_module
from kfuse.runtime.numpy_backend import NumpyBackend

# ---------------------------------------------------------------------------------------------
# The DRAM floor
# ---------------------------------------------------------------------------------------------


def _floor_pipeline() -> kfuse.Pipeline:
    p = kfuse.Pipeline("floor")
    a = p.input("a", ndim=2)  # float32
    b = p.input("b", ndim=2, dtype="int32")
    t = kfuse.point(a * 2.0, name="t")  # intermediate: not part of the floor
    c = kfuse.point(kfuse.where(b > 0, t, 0.0), name="c")  # float32 output
    m = kfuse.point(a > 0.5, name="m")  # bool output: 1 byte per element
    s = kfuse.reduce_sum(a, name="s")  # 0-d float32 output
    d = kfuse.point(a.at(0, 0) * 1.0, name="d", dtype="float64")  # float64 output
    p.output(c, m, s, d)
    return p


def test_floor_bytes_by_hand():
    graph = _floor_pipeline().graph()
    h, w = 5, 7
    sizes = graph.bind_shapes({"a": (h, w), "b": (h, w)})
    # read a (4 B) and b (4 B); write c (4 B), m (1 B), d (8 B) per element, and s (4 B once)
    expected = h * w * (4 + 4) + h * w * (4 + 1 + 8) + 4
    assert dram_floor_bytes(graph, sizes) == expected == 739


def test_floor_seconds_uses_copy_bandwidth():
    profile = dataclasses.replace(default_profile(), copy_bandwidth_bytes_per_s=2.0e12)
    assert floor_seconds(4.0e9, profile) == pytest.approx(2.0e-3)


def test_launch_bytes_count_each_kernels_reads_and_write_once():
    from kfuse.codegen import generate_unfused

    graph = _floor_pipeline().graph()
    sizes = graph.bind_shapes({"a": (5, 7), "b": (5, 7)})
    program = generate_unfused(graph)
    by_operator = {spec.operators[0]: launch_bytes(graph, spec, sizes) for spec in program.launches}
    n = 35
    assert by_operator["t"] == 4 * n + 4 * n  # reads a, writes t
    assert by_operator["c"] == (4 + 4) * n + 4 * n  # reads b and t, writes c
    assert by_operator["m"] == 4 * n + 1 * n
    assert by_operator["s"] == 4 * n + 4
    assert by_operator["d"] == 4 * n + 8 * n


# ---------------------------------------------------------------------------------------------
# Device profiles
# ---------------------------------------------------------------------------------------------


def test_profile_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    profile = dataclasses.replace(default_profile(), name="Test GPU 9000",
                                  copy_bandwidth_bytes_per_s=1.25e12, launch_overhead_s=3.5e-6,
                                  measured_at="2026-01-02", notes={"copy_method": "kernel"})
    path = profile.save()
    assert path == tmp_path / "devices" / "test-gpu-9000.json"
    assert (tmp_path / "devices" / "latest.json").exists()
    loaded = DeviceProfile.load("Test GPU 9000")
    assert loaded == profile
    assert loaded.notes == {"copy_method": "kernel"}
    assert DeviceProfile.load() == profile  # latest
    assert current_profile("Test GPU 9000").copy_bandwidth_bytes_per_s == 1.25e12
    assert loaded.measured and loaded.arch == "sm_90"

    other = dataclasses.replace(profile, name="Other GPU", sm_count=7)
    other.save()
    assert DeviceProfile.load().name == "Other GPU"
    assert DeviceProfile.load("Test GPU 9000").sm_count == profile.sm_count

    explicit = other.save(tmp_path / "elsewhere" / "mine.json")
    assert DeviceProfile.load(explicit) == other
    data = json.loads(explicit.read_text())
    assert data["measured_at"] == "2026-01-02" and data["compute_capability"] == "9.0"


def test_profile_missing_falls_back_to_nominal(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device_module, "_VISIBLE_GPU_SOURCE", [lambda: None])  # no GPU
    with pytest.raises(FileNotFoundError):
        DeviceProfile.load()
    with pytest.raises(FileNotFoundError):
        DeviceProfile.load("No Such GPU")
    fallback = current_profile()
    assert fallback.measured_at is None and not fallback.measured
    assert fallback.sm_count == 132 and fallback.l2_bytes == 50 * 2**20
    assert "not measured" in fallback.summary() or "nominal" in fallback.summary()


H200_PROPERTIES = {"name": "NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132,
                   "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,
                   "regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048,
                   "l2CacheSize": 62914560, "memoryClockRate": 3134000, "memoryBusWidth": 6144,
                   "sharedMemPerBlockOptin": 232448, "totalGlobalMem": 150109880320}


def test_a_gpu_nobody_calibrated_is_planned_with_its_own_figures(tmp_path, monkeypatch):
    """Its properties, and the copy bandwidth estimated from its DRAM peak (the nominal H100
    figures planned SGEMV's rows 0.9% slower on an H200); a calibration, once stored, wins."""
    from kfuse.apps import get_app
    calibrate = importlib.import_module("kfuse.tune.calibrate")  # (the package's
    # ``calibrate`` is the function)
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "device_properties", lambda device_id=None: H200_PROPERTIES)
    estimated = calibrate.estimated_profile()
    peak = 2 * 3134000e3 * 6144 / 8  # 4814 GB/s, as calibrate reports it
    assert estimated.peak_bandwidth_bytes_per_s == pytest.approx(peak)
    assert estimated.copy_bandwidth_bytes_per_s == pytest.approx(
        calibrate.COPY_FRACTION_OF_PEAK * peak)
    assert 4.2e12 < estimated.copy_bandwidth_bytes_per_s < 4.3e12  # measured: 4248-4276 GB/s
    assert estimated.l2_bytes == 60 * 2**20 and not estimated.measured
    monkeypatch.setattr(device_module, "_VISIBLE_GPU_SOURCE", [lambda: estimated])
    assert current_profile() == estimated
    app = get_app("sgemv")
    graph = app.build().graph()
    plan = app.planner(graph, app.sizes(graph, app.bench_size), current_profile())
    assert plan.groups[0].variant.startswith("mapreduce:512x1:")  # block rows, as measured
    calibrated = dataclasses.replace(estimated, copy_bandwidth_bytes_per_s=4.25e12,
                                     measured_at="2026-11-24")
    calibrated.save()
    assert current_profile() == calibrated


def test_the_measured_block_of_elementwise_kernels_is_kept_and_planned_with(tmp_path,
                                                                            monkeypatch):
    """``kfuse calibrate`` stores the block its elementwise kernel ran fastest in; plans for
    that device take it, and a profile stored before there was one loads without it."""
    from kfuse.apps import get_app
    from kfuse.model.device import h200_like_profile

    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    forms = ((1, 1024, 16, 2), (2, 1024, 8, 4))
    measured = dataclasses.replace(h200_like_profile(), map_block_threads=512,
                                   row_block_forms=forms, measured_at="2026-11-25")
    path = measured.save()
    assert DeviceProfile.load(path).map_block_threads == 512
    assert DeviceProfile.load(path).row_block_forms == forms
    hash(DeviceProfile.load(path))  # a profile stays hashable (frozen)
    older = json.loads(path.read_text())
    del older["map_block_threads"], older["row_block_forms"]
    assert DeviceProfile.from_dict(older).map_block_threads is None
    assert DeviceProfile.from_dict(older).row_block_forms is None
    app = get_app("waxpby")
    graph = app.build().graph()
    sizes = app.sizes(graph, app.bench_size)
    assert [g.variant for g in app.planner(graph, sizes, measured).groups] == [
        "mapreduce:512x1:r1:i1:w8:shuffle"]
    assert [g.variant for g in app.planner(graph, sizes, h200_like_profile()).groups] == [
        "mapreduce:128x1:r1:i1:w8:shuffle"]


# ---------------------------------------------------------------------------------------------
# Timing statistics (no clock involved)
# ---------------------------------------------------------------------------------------------


def test_timing_statistics_and_text():
    timing = Timing.from_samples([5e-3, 1e-3, 2e-3, 4e-3, 3e-3])
    assert timing.median_s == pytest.approx(3e-3)
    assert timing.min_s == pytest.approx(1e-3)
    assert timing.p10 == pytest.approx(1.4e-3)
    assert timing.p90 == pytest.approx(4.6e-3)
    assert timing.runs == 5
    assert str(timing).startswith("3.000 ms median (min 1.000 ms")
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_input_sets_needed():
    l2 = 50 * 2**20
    assert input_sets_needed(256 * 2**20, l2) == 1  # 8192^2 float32: far beyond L2
    assert input_sets_needed(4 * 2**20, l2) == 8  # capped
    assert input_sets_needed(40 * 2**20, l2) == 4  # ceil(100 / 40) + 1


def test_max_relative_error():
    ref = np.array([1.0, -4.0, 2.0])
    assert max_relative_error(ref.astype(np.float32), ref) == 0.0
    assert max_relative_error(np.array([1.0, -4.0, 2.4]), ref) == pytest.approx(0.1)
    assert max_relative_error(np.array([1.0, np.nan, 2.0]), ref) == math.inf
    assert max_relative_error(np.array([True, False]), np.array([True, True])) == 0.5
    with pytest.raises(ValueError):
        max_relative_error(np.zeros(3), np.zeros(4))


# ---------------------------------------------------------------------------------------------
# Reports from synthetic rows
# ---------------------------------------------------------------------------------------------


def _rows() -> list[BenchRow]:
    full = BenchRow(
        app="harris", size=(64, 64), device="Fake GPU", backend="cuda", kfuse_ms=2.0,
        unfused_ms=5.0, plan_groups=[["dx"], ["hc"]], floor_ms=1.0, floor_bytes=2_000_000_000, eager_ms=10.0, compile_ms=1.5,
        max_error=3e-7, compile_error=1e-7, launches=2, input_sets=1,
        compile_mode="torch.compile(mode='default', dynamic=False)", copy_gbps=2000.0,
        kernels=[KernelRow("harris_dx", ("dx",), 0.5, 500_000_000, 1000.0, 0.5),
                 KernelRow("harris_hc", ("hc",), 1.25, 2_000_000_000, 1600.0, 0.8)],
        timings={"kfuse": {"median_s": 2e-3, "min_s": 1.9e-3, "p10": 1.95e-3, "p90": 2.1e-3,
                           "runs": 50}},
        notes=["inputs made on the device"],
        calls=[{"size": [64, 64], "launches": 2, "kernels_us": 2000.0, "run_us": 2020.0,
                "compiled_us": 2010.0, "direct_us": 2015.0, "torch_compile_us": 2600.0,
                "graph_replays": 40},
               {"size": [256, 256], "launches": 2, "kernels_us": 4.0, "run_us": 30.0,
                "compiled_us": 20.0, "direct_us": 24.0, "torch_compile_us": None,
                "graph_replays": 40}])
    bare = BenchRow(app="sobel", size=(32, 48), device="Fake GPU", kfuse_ms=4.0, floor_ms=0.5,
                    floor_bytes=1_000_000, copy_gbps=2000.0,
                    notes=["PyTorch is not installed: baselines skipped"])
    bad = BenchRow(app="night", size=(8, 8), device="Fake GPU", kfuse_ms=1.0, floor_ms=1.0,
                   eager_ms=1.0, max_error=0.5, copy_gbps=2000.0)
    return [full, bare, bad]


def test_row_ratios():
    full, bare, bad = _rows()
    assert full.kfuse_over_floor == pytest.approx(2.0)
    assert full.compile_over_kfuse == pytest.approx(0.75)
    assert full.eager_over_kfuse == pytest.approx(5.0)
    assert full.kfuse_gbps == pytest.approx(1000.0)
    assert full.kernels_ms == pytest.approx(1.75)
    assert full.error_ok is True and bad.error_ok is False and bare.error_ok is None
    assert bare.eager_over_kfuse is None and bare.compile_over_kfuse is None


def test_markdown_report():
    text = to_markdown(_rows())
    lines = text.splitlines()
    assert lines[0].startswith("**Device: Fake GPU")
    assert ("| app | size | fused ms | unfused ms | fusion speedup | floor ms | fused/floor | "
            "eager ms | compile ms |") in text
    assert ("| harris | 64x64 | 2.000 | 5.000 | 2.50x | 1.000 | 2.00x | 10.000 | 1.500 | 0.75x "
            "| 5.00x | 1000 | 3.0e-07 |") in text
    assert "| sobel | 32x48 | 4.000 | — | — | 0.500 | 8.00x | — | — | — |" in text
    assert "- harris: dx | hc" in text
    assert "5.0e-01 (> 0.0001!)" in text
    assert "| harris | harris_hc | hc | 1.250 | 2000.0 | 1600 | 80% |" in text
    assert "- sobel: PyTorch is not installed: baselines skipped" in text
    assert "torch.compile(mode='default', dynamic=False)" in text
    assert ("| harris | 64x64 | 2 | 2000.0 | 2020.0 | 2010.0 | 2015.0 | 2600.0 | 1.00x |"
            in text)
    assert "| harris | 256x256 | 2 | 4.0 | 30.0 | 20.0 | 24.0 | — | 5.00x |" in text


def test_json_round_trip(tmp_path):
    rows = _rows()
    rows[2].max_error = math.inf
    path = tmp_path / "out" / "bench.json"
    to_json(rows, path)
    data = json.loads(path.read_text())
    assert data["rows"][0]["kfuse_over_floor"] == pytest.approx(2.0)
    assert data["rows"][2]["max_error"] == "inf"
    back = from_json(path)
    assert back == rows
    assert from_json(to_json(rows)) == rows


def test_print_report():
    from rich.console import Console

    console = Console(record=True, width=200)
    print_report(_rows(), console)
    text = console.export_text()
    assert text.splitlines()[0].startswith("Device: Fake GPU (copy bandwidth 2000 GB/s")
    for expected in ("harris", "sobel", "night", "harris_hc", "0.75x", "2.00x",
                     "baselines skipped", "a call from Python", "2010.0", "5.00x"):
        assert expected in text


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from kfuse.bench import plot

    path = plot(_rows(), tmp_path / "bench.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


# ---------------------------------------------------------------------------------------------
# Inputs made "on the device" (NumPy stands in for CuPy)
# ---------------------------------------------------------------------------------------------


def test_device_inputs_follow_the_apps_ranges():
    app = SimpleNamespace(
        name="fake", test_size=(5, 6), bench_size=(40, 30), ndim=2,
        make_inputs=lambda size, rng, dtype: (
            {"x": rng.uniform(0.1, 1.1, size).astype(dtype),
             "y": rng.uniform(-3, -2, size).astype(dtype)}, {"k": 0.5}))
    p = kfuse.Pipeline("fake")
    x, y = p.input("x", ndim=2), p.input("y", ndim=2)
    p.output(kfuse.point(x + y, name="z"))
    sets, params, how = device_inputs(app, p.graph(), (40, 30), None, np, 50 * 2**20)
    assert params == {"k": 0.5} and len(sets) == 8 and "numpy" in how
    for one in sets:
        assert one["x"].shape == (40, 30) and one["x"].dtype == np.float32
        assert 0.1 <= one["x"].min() and one["x"].max() <= 1.1
        assert -3.0 <= one["y"].min() and one["y"].max() <= -2.0
    assert not np.array_equal(sets[0]["x"], sets[1]["x"])


def test_device_inputs_take_the_parameters_of_the_timed_size():
    """A normalisation's ``1 / n`` follows the size timed, not the small probe's."""
    from kfuse.apps import get_app
    app = get_app("rmsnorm")
    _, params, _ = device_inputs(app, app.build().graph(), (6, 40), None, np, 2**20)
    assert params == {"inv_n": 1 / 40}
    app = get_app("logsoftmax")
    assert device_inputs(app, app.build().graph(), (6, 40), None, np, 2**20)[1] == {}


# ---------------------------------------------------------------------------------------------
# The PyTorch translation against the NumPy backend (CPU torch)
# ---------------------------------------------------------------------------------------------


def _mixed_pipeline() -> kfuse.Pipeline:
    """Every boundary mode; 1-D, 2-D and 3-D stencils; reductions; broadcast reads; dtypes."""
    p = kfuse.Pipeline("mixed")
    x = p.input("x", ndim=2)
    v = p.input("v", ndim=1)
    w = p.input("w", ndim=3)
    k = p.param("k")
    y = kfuse.local(x.at(-1, 0) + 2.0 * x.at(0, 2, boundary="mirror")
                    - x.at(1, -1, boundary="repeat") + x.at(2, 1, boundary=kfuse.constant(0.5))
                    + x.at(-2, -3, boundary="mirror") + 0.25 * x, boundary="clamp", name="y")
    u = kfuse.local(v.at(-2) * v.at(1, boundary="mirror") + v.at(3, boundary="repeat")
                    - v.at(-1, boundary=kfuse.constant(-1.0)), name="u")
    z = kfuse.local(w.at(-1, 0, 1) + w.at(1, 1, -1, boundary="mirror")
                    + w.at(0, -2, 0, boundary="repeat")
                    + w.at(0, 0, 2, boundary=kfuse.constant(2.0)) - w, name="z")
    s = kfuse.reduce_sum(y * y, name="s")  # 0-d
    r = kfuse.reduce_max(y, axis=1, name="r")  # per row
    zmin = kfuse.reduce_min(z, axis=0, name="zmin")  # leading axis of a 3-D volume
    # broadcast reads: the 0-d sum, a per-row vector and a per-column vector
    out = kfuse.point(y / s + k * r.at(0, dims=(0,)) - v.at(0, dims=(1,))
                      + kfuse.astype(kfuse.coord(1), "float32") * 0.01, name="out")
    sel = kfuse.point(kfuse.where(kfuse.coord(0) > 2, y, -y), name="sel")
    mask = kfuse.point(y > 1.0, name="mask")  # bool array
    count = kfuse.point(kfuse.astype(y > 0.5, "int32") * 3 - 1, name="count")  # int32 array
    ints = kfuse.local(count.at(1, 0) + count.at(0, -1, boundary="repeat")
                       + count.at(-1, 1, boundary="mirror")
                       + count.at(0, 2, boundary=kfuse.constant(7)), name="ints")
    bools = kfuse.local(mask.at(1, 0) & mask.at(0, 1, boundary=kfuse.constant(1.0))
                        | mask.at(-1, -1, boundary="mirror") & ~mask.at(0, -2, boundary="repeat"),
                        name="bools")
    total = kfuse.reduce_sum(kfuse.astype(bools, "int32"), name="total")
    p.output(out, sel, u, z, zmin, ints, bools, total)
    return p


def _mixed_inputs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.uniform(-1, 2, (9, 11)).astype(np.float32),
            "v": rng.uniform(-1, 1, 11).astype(np.float32),
            "w": rng.uniform(0, 1, (5, 6, 7)).astype(np.float32),
            "k": np.float32(0.75)}


@pytest.mark.parametrize("seed", [0, 1])
def test_torch_translation_matches_numpy_backend(seed):
    torch = pytest.importorskip("torch")
    from kfuse.bench import translate

    graph = _mixed_pipeline().graph()
    given = _mixed_inputs(seed)
    expected = NumpyBackend().run(graph, given)
    program = translate(graph)
    tensors = {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
               for name, value in given.items()}
    got = program(**tensors)
    assert set(got) == set(graph.outputs)
    for name in graph.outputs:
        result = got[name].numpy()
        assert result.shape == expected[name].shape, name
        assert result.dtype == expected[name].dtype, name
        if result.dtype.kind in "biu":
            np.testing.assert_array_equal(result, expected[name], err_msg=name)
        else:
            assert max_relative_error(result, expected[name]) < 1e-6, name


def test_torch_translation_pads_once_and_uses_slices():
    pytest.importorskip("torch")
    from kfuse.bench import translate

    p = kfuse.Pipeline("blur")
    x = p.input("x", ndim=2)
    b = kfuse.convolve(x, np.ones((3, 5)), boundary="mirror", name="b")
    c = kfuse.convolve(x, np.ones((3, 5)), boundary="mirror", name="c", scale=2.0)
    p.output(b, c)
    source = translate(p.graph()).source
    assert source.count("_pad(") == 1  # one padded copy shared by both consumers
    assert "((1, 1), (2, 2)), 'mirror'" in source
    assert "conv" not in source


@pytest.mark.parametrize("mode", ["clamp", "mirror", "repeat", "constant"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_pad_helper_matches_numpy_pad(mode, dtype):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from kfuse.bench.torch_baseline import runtime_helpers

    pad = runtime_helpers(torch, F)["_pad"]
    numpy_mode = {"clamp": "edge", "mirror": "symmetric", "repeat": "wrap",
                  "constant": "constant"}[mode]
    rng = np.random.default_rng(3)
    for shape, pads in [((6,), ((2, 3),)), ((4, 5), ((3, 0), (1, 4))),
                        ((3, 4, 5), ((1, 2), (0, 3), (2, 2)))]:
        array = (rng.uniform(-5, 5, shape)).astype(dtype)
        extra = {"constant_values": 1} if mode == "constant" else {}
        expected = np.pad(array, pads, mode=numpy_mode, **extra)
        got = pad(torch.from_numpy(array), pads, mode, 1.0).numpy()
        np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# The whole harness on the cpu backend (the generated CUDA C through the host shim)
# ---------------------------------------------------------------------------------------------


def _cpu_backend_or_skip():
    from kfuse.errors import BackendUnavailable
    from kfuse.runtime import get_backend

    try:
        get_backend("cpu")
    except (BackendUnavailable, ImportError) as error:
        pytest.skip(f"cpu backend unavailable: {error}")


def _small_app():
    def build(dtype="float32", boundary="clamp"):
        p = kfuse.Pipeline("small")
        img = p.input("img", ndim=2, dtype=dtype)
        gain = p.param("gain", dtype=dtype)
        blur = kfuse.convolve(img, np.ones((3, 3)) / 9.0, boundary=boundary, name="blur")
        p.output(kfuse.point(blur * gain - img, name="out"))
        return p

    def make_inputs(size, rng, dtype="float32"):
        return {"img": rng.uniform(0.1, 1.1, size).astype(dtype)}, {"gain": 2.0}

    return SimpleNamespace(name="small", build=build, make_inputs=make_inputs,
                           bench_size=(24, 40), test_size=(7, 9), ndim=2)


def test_harness_on_cpu_backend():
    _cpu_backend_or_skip()
    from kfuse.bench import bench_apps

    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    profile = dataclasses.replace(default_profile(), name="Host", copy_bandwidth_bytes_per_s=1e10,
                                  measured_at="2026-01-01")
    (row,) = bench_apps([_small_app()], backend="cpu", profile=profile, baselines=("torch eager",),
                        progress=False, warmup=1, repeat=2, sets=2)
    assert not any(note.startswith("failed") for note in row.notes), row.notes
    assert row.device == "Host" and row.size == (24, 40) and row.input_sets == 2
    assert row.floor_bytes == 2 * 24 * 40 * 4
    assert row.floor_ms == pytest.approx(row.floor_bytes / 1e10 * 1e3)
    # the fused plan runs one kernel; the per-kernel rows time the unfused program
    assert row.launches == 1 and row.plan_groups == [["blur", "out"]]
    assert [k.operators for k in row.kernels] == [("blur",), ("out",)]
    assert row.unfused_ms is not None and row.fusion_speedup is not None
    assert not any("differ" in note for note in row.notes), row.notes
    assert [k.bytes for k in row.kernels] == [2 * 24 * 40 * 4, 3 * 24 * 40 * 4]
    assert row.kfuse_ms is not None and row.kfuse_ms > 0
    if have_torch:
        assert row.eager_ms is not None and row.error_ok, row.max_error
        assert row.compile_ms is None
    else:
        assert row.eager_ms is None
        assert any("not installed" in note for note in row.notes), row.notes


def test_harness_times_kfuse_and_the_baselines_in_turn(monkeypatch):
    """kfuse and its unfused program (and the baselines) are timed in alternating rounds, not
    one block of runs each: a row's time is the median of its rounds' medians."""
    _cpu_backend_or_skip()
    import kfuse.bench.harness as harness
    from kfuse.bench import bench_apps

    calls = []

    def clock(run, *, warmup, repeat, rotate=None):
        calls.append((run, repeat))
        run()
        seconds = len(calls) * 1e-3  # a clock that each call finds later
        return Timing(seconds, seconds, seconds, seconds, repeat)

    monkeypatch.setattr(harness, "time_host", clock)
    (row,) = bench_apps([_small_app()], backend="cpu", profile=default_profile(),
                        baselines=False, progress=False, warmup=1, repeat=10, sets=1)
    rounds = calls[:2 * harness.BENCH_ROUNDS]  # (the kernel rows are timed after)
    fused, unfused = rounds[0][0], rounds[1][0]
    assert fused is not unfused
    assert [run for run, _ in rounds] == [fused, unfused] * harness.BENCH_ROUNDS
    assert all(repeat == 10 // harness.BENCH_ROUNDS for _, repeat in rounds)
    assert row.kfuse_ms == pytest.approx(5.0) and row.unfused_ms == pytest.approx(6.0)
    assert row.timings["kfuse"]["runs"] == 10 and row.timings["kfuse"]["min_s"] == 1e-3


def test_a_baseline_that_fails_while_timed_is_dropped_with_a_note():
    import kfuse.bench.harness as harness

    def clock(run, *, warmup, repeat, rotate=None):
        run()
        return Timing(1e-3, 1e-3, 1e-3, 1e-3, repeat)

    def broken():
        raise RuntimeError("triton exploded\nin a long traceback")

    row = harness.BenchRow("app", (4,), "device", "cpu")
    timed = {"kfuse": (lambda: None, [], None), "torch.compile": (broken, [], None)}
    harness._time_side_by_side(row, SimpleNamespace(timer=clock), timed, warmup=0, repeat=5)
    assert row.kfuse_ms == pytest.approx(1.0) and row.compile_ms is None
    assert row.notes == ["torch.compile failed while timed: RuntimeError: triton exploded"]
    with pytest.raises(RuntimeError, match="exploded"):  # kfuse's own failures are not hidden
        harness._time_side_by_side(row, SimpleNamespace(timer=clock),
                                   {"kfuse": (broken, [], None)}, warmup=0, repeat=5)


def test_harness_reports_a_failing_app_and_goes_on():
    _cpu_backend_or_skip()
    from kfuse.bench import bench_apps

    broken = _small_app()
    broken.name = "broken"

    def build(dtype="float32", boundary="clamp"):
        raise RuntimeError("cannot build this")

    broken.build = build
    rows = bench_apps([broken, _small_app()], backend="cpu", profile=default_profile(),
                      baselines=False, progress=False, warmup=1, repeat=2, sets=1)
    assert [row.app for row in rows] == ["broken", "small"]
    assert rows[0].kfuse_ms is None
    assert any("cannot build this" in note for note in rows[0].notes)
    assert rows[1].kfuse_ms is not None
    assert "broken" in to_markdown(rows)


def test_harness_times_a_given_program():
    _cpu_backend_or_skip()
    from kfuse.bench import bench_apps
    from kfuse.codegen import generate_unfused

    chosen = []

    def program(graph):
        chosen.append(graph.name)
        return generate_unfused(graph)

    (row,) = bench_apps([_small_app()], backend="cpu", profile=default_profile(),
                        baselines=False, progress=False, warmup=1, repeat=2, sets=1,
                        program=program)
    assert chosen == ["small"]
    assert not any(note.startswith("failed") for note in row.notes), row.notes
    assert any("kfuse runs program" in note for note in row.notes)
    assert row.kfuse_ms is not None and len(row.kernels) == 2


def test_alternating_rounds_time_each_callable_in_turn(monkeypatch, capsys):
    import kfuse.tune.timing as timing

    order = []

    def fake_time_gpu(fn, *, warmup, repeat):
        order.append(fn())
        return timing.Timing.from_samples([{"a": 2e-3, "b": 1e-3}[order[-1]] * len(order)])

    monkeypatch.setattr(timing, "time_gpu", fake_time_gpu)
    times = timing.time_alternating({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert order == ["a", "b"] * 3
    assert times == {"a": pytest.approx([2.0, 6.0, 10.0]), "b": pytest.approx([2.0, 4.0, 6.0])}
    timing.print_rounds("app", times, "a")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["app", "a", "6.0000", "ms", "1.0000x"]
    assert lines[1].split()[:5] == ["app", "b", "4.0000", "ms", "1.5000x"]


def test_alternating_main_reads_apps_rounds_and_runs(monkeypatch):
    from kfuse.cli.arguments import alternating_main

    calls = []

    def compare(name, rounds, runs):
        calls.append((name, rounds, runs))

    monkeypatch.setattr("sys.argv", ["script"])
    alternating_main("doc", compare, ("sgemv", "vadd"), rounds=5)
    assert calls == [("sgemv", 5, 30), ("vadd", 5, 30)]
    calls.clear()
    monkeypatch.setattr("sys.argv", ["script", "madd", "--rounds", "2", "--runs", "7"])
    alternating_main("doc", compare, ("sgemv",))
    assert calls == [("madd", 2, 7)]


def test_interleaved_calls_take_turns_round_after_round():
    """Per-call times of several calls are measured in rounds (each call's runs taken in
    turn), so a drift of the host's speed reaches every call alike."""
    from kfuse.bench.calls import interleaved_us

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    measured = interleaved_us(calls, seconds=1e-12, least=3, wait=lambda: None, runs=3)
    assert set(measured) == {"a", "b"} and all(v > 0 for v in measured.values())
    timed = order[4:]  # after two warm-up calls each
    runs = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    assert [run[0] for run in runs] == ["a", "b"] * 3
    assert all(len(set(run)) == 1 for run in runs)


def test_halide_schedules_are_the_defaults_or_the_ones_named(monkeypatch):
    from kfuse.bench import halide_baseline as halide

    monkeypatch.delenv(halide.SCHEDULES_VARIABLE, raising=False)
    assert halide.schedules() == halide.DEFAULT_SCHEDULES
    assert "Anderson2021" not in halide.schedules()
    monkeypatch.setenv(halide.SCHEDULES_VARIABLE, "manual, Anderson2021")
    assert halide.schedules() == ("manual", "Anderson2021")
    monkeypatch.setenv(halide.SCHEDULES_VARIABLE, "manual,Adams2019")
    with pytest.raises(ValueError, match="Adams2019"):
        halide.schedules()
    assert halide.has_program("local_laplacian") and halide.has_program("blend")
    assert not halide.has_program("harris")
    assert halide.border_margin("local_laplacian") > 0 == halide.border_margin("blend")


def test_the_halide_baseline_off_the_gpu_is_a_note_not_a_failure():
    import kfuse.bench.harness as harness

    row = harness.BenchRow("blend", (8, 8), "device", "cpu")
    timed: dict = {}
    harness._bench_halide(SimpleNamespace(name="blend"), None, row,
                          SimpleNamespace(backend="cpu"), [], {}, {}, timed,
                          status=lambda text: None)
    assert not timed and len(row.notes) == 1 and "Halide baseline skipped" in row.notes[0]
    harness._bench_halide(SimpleNamespace(name="harris"), None, row,
                          SimpleNamespace(backend="cuda"), [], {}, {}, timed,
                          status=lambda text: None)
    assert not timed and len(row.notes) == 1  # (no Halide program: nothing said)


def test_halide_columns_appear_only_where_halide_ran():
    from kfuse.bench.report import halide_cells, to_markdown

    row = BenchRow("local_laplacian", (64, 64), "device", kfuse_ms=1.0, halide_ms=0.8,
                   halide_auto_ms=6.0, halide_auto="Li2018", halide_error=2e-3)
    (cells,) = halide_cells(row)
    assert cells[3] == "0.800" and cells[4] == "0.80x" and "Li2018" in cells[5]
    assert "Halide on the same inputs" in to_markdown([row])
    assert halide_cells(BenchRow("harris", (64, 64), "device", kfuse_ms=1.0)) == []


def test_halide_timing_takes_the_autoscheduler_that_was_fastest():
    import kfuse.bench.harness as harness

    def clock(seconds):
        def timer(run, *, warmup, repeat, rotate=None):
            return Timing(seconds, seconds, seconds, seconds, repeat)
        return timer

    row = harness.BenchRow("local_laplacian", (4,), "device", "cuda")
    timed = {"kfuse": (lambda: None, [], clock(1e-3)),
             "halide manual": (lambda: None, [], clock(0.8e-3)),
             "halide Li2018": (lambda: None, [], clock(6e-3)),
             "halide Mullapudi2016": (lambda: None, [], clock(4e-3))}
    harness._time_side_by_side(row, SimpleNamespace(timer=clock(1.0)), timed, warmup=0,
                               repeat=5)
    harness._fastest_autoscheduler(row)
    assert row.halide_ms == pytest.approx(0.8) and row.kfuse_ms == pytest.approx(1.0)
    assert row.halide_auto == "Mullapudi2016" and row.halide_auto_ms == pytest.approx(4.0)


def test_the_local_laplacian_translates_to_pytorch_with_its_gathers_and_uint16():
    torch = pytest.importorskip("torch")
    from kfuse.apps.pyramids import LOCAL_LAPLACIAN
    from kfuse.bench.torch_baseline import translate

    graph = LOCAL_LAPLACIAN.build().graph()
    arrays, params = LOCAL_LAPLACIAN.make_inputs((21, 34), np.random.default_rng(3))
    result = translate(graph).function()(**{name: torch.from_numpy(value)
                                            for name, value in arrays.items()}, **params)
    expected = LOCAL_LAPLACIAN.reference(arrays, params, "clamp")["output"]
    got = result["output"]
    assert got.dtype == torch.uint16 and tuple(got.shape) == expected.shape
    # one step of 16 bits: float32 against float64 at the final truncation
    assert np.max(np.abs(got.numpy().astype(np.float64) - expected)) <= 1.0 + 1e-6
