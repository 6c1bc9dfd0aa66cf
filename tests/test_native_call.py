"""The C call path (kfuse.runtime.native): it takes the calls it can, gives the results of
the Python path bit for bit, and leaves everything else to Python (cpu backend)."""

from __future__ import annotations

import gc
import sysconfig
import weakref
from pathlib import Path

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app
from kfuse.runtime import native
from kfuse.runtime.numpy_backend import NumpyBackend


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path) -> Path:
    from kfuse.runtime.cpu_backend import CpuBackend

    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def shift_pipeline(param_dtype: str = "float32") -> kf.Pipeline:
    p = kf.Pipeline(f"shift_{param_dtype}")
    x = p.input("x", ndim=2)
    s = p.param("s", param_dtype)
    blur = kf.convolve(x, np.arange(9.0).reshape(3, 3) / 36.0, boundary="mirror", name="blur")
    p.output(kf.point(blur * s + x, name="y"))
    return p


def reference(pipeline: kf.Pipeline, given: dict) -> dict:
    return NumpyBackend(precision="float64").run(pipeline.graph(), given)


def test_the_c_path_is_built_wherever_python_has_its_headers():
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        pytest.skip("this Python has no headers")
    assert native.module() is not None


@pytest.mark.parametrize("name", ["waxpby", "sgemv", "gemver", "harris", "levels"])
def test_the_c_path_gives_the_python_paths_results_bit_for_bit(name, rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    app = get_app(name)
    size = (257,) if app.bench_size and len(app.bench_size) == 1 else (19, 23)
    inputs, params = app.make_inputs(size, rng, "float32")
    pipeline = app.build()
    fast = pipeline.compile("cpu")
    slow = pipeline.compile("cpu", native=False)
    for round_ in range(3):
        # new parameter values each round: the C path writes them into the arguments
        changed = {key: value * (1.0 + 0.25 * round_) if isinstance(value, float) else value
                   for key, value in params.items()}
        given = {**inputs, **changed}
        want = slow(**given)
        got = fast(**given)
        assert set(got) == set(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            assert got[key] is not given.get(key)
    assert fast.stats.native == 2  # the first call compiled; the others went through C
    assert slow.stats.native == 0
    assert fast.stats.calls == slow.stats.calls == 3
    assert fast.stats.hits == slow.stats.hits == 2


def test_what_the_c_path_does_not_take_python_does(rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    p = shift_pipeline()
    compiled = p.compile("cpu")
    x = rng.random((21, 17), dtype=np.float32)
    compiled(x=x, s=0.5)
    compiled(x=x, s=0.5)
    assert compiled.stats.native == 1
    cases = {
        "an integer for a float parameter": {"x": x, "s": 2},
        "a NumPy scalar parameter": {"x": x, "s": np.float32(1.5)},
        "a view that is not contiguous": {"x": np.asarray(rng.random((21, 34)),
                                                          dtype=np.float32)[:, ::2], "s": 0.5},
    }
    for what, given in cases.items():
        before = compiled.stats.native
        out = compiled(**given)
        assert compiled.stats.native == before, what
        want = reference(p, {"x": np.ascontiguousarray(given["x"]), "s": float(given["s"])})
        np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6, err_msg=what)
    with pytest.raises(kf.BindError, match="float32, which cannot hold"):
        compiled(x=x, s=1e39)  # beyond float32: refused by name, not written as inf
    with pytest.raises(kf.BindError, match="needs 's'"):
        compiled(x=x)
    target = np.empty_like(x)
    before = compiled.stats.native
    compiled(x=x, s=0.5, out=target)  # out= arrays: the Python path checks them
    assert compiled.stats.native == before
    np.testing.assert_allclose(target, reference(p, {"x": x, "s": 0.5})["y"], rtol=1e-5)


@pytest.mark.parametrize(("dtype", "value"), [("float64", 0.75), ("int32", -3), ("int64", 7),
                                              ("bool", True)])
def test_parameters_of_each_dtype_reach_the_kernels(dtype, value, rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    p = kf.Pipeline(f"param_{dtype}")
    x = p.input("x", ndim=1, dtype="float64")
    s = p.param("s", dtype)
    p.output(kf.point(x * s + 1.0, name="y"))
    compiled = p.compile("cpu")
    data = rng.random(53)
    for each in (value, value if dtype == "bool" else value * 2, not value
                 if dtype == "bool" else value):
        out = compiled(x=data, s=each)
        np.testing.assert_allclose(out["y"], data * float(each) + 1.0, rtol=1e-12)
    assert compiled.stats.native == 2


def test_a_changed_pipeline_is_called_again_through_python_first(rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    p = kf.Pipeline("grows")
    x = p.input("x", ndim=1)
    p.output(kf.point(x * 2.0, name="y"))
    compiled = p.compile("cpu")
    data = rng.random(40, dtype=np.float32)
    compiled(x=data)
    compiled(x=data)
    assert compiled.stats.native == 1
    p.output(kf.point(x + 3.0, name="z"))  # the pipeline changed: a new graph
    out = compiled(x=data)
    np.testing.assert_allclose(out["z"], data + 3.0, rtol=1e-6)
    assert compiled.stats.native == 1
    out = compiled(x=data)
    assert set(out) == {"y", "z"} and compiled.stats.native == 2


def test_signatures_let_go_leave_the_c_path_too(rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    p = shift_pipeline()
    compiled = p.compile("cpu", max_signatures=1)
    small, large = rng.random((9, 8), dtype=np.float32), rng.random((12, 7), dtype=np.float32)
    for data in (small, small, large, large, small, small):
        out = compiled(x=data, s=0.5)
        np.testing.assert_allclose(out["y"], reference(p, {"x": data, "s": 0.5})["y"],
                                   rtol=1e-5)
    assert compiled.stats.evicted == 2 and compiled.stats.native == 3
    assert len(compiled._hot) == 1


def test_a_compiled_pipeline_let_go_is_collected(rng):
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    compiled = shift_pipeline().compile("cpu")
    x = rng.random((8, 8), dtype=np.float32)
    compiled(x=x, s=1.0)
    compiled(x=x, s=1.0)
    assert compiled.stats.native == 1
    gone = weakref.ref(compiled)
    del compiled
    gc.collect()
    assert gone() is None


def test_kfuse_native_call_0_keeps_calls_in_python(monkeypatch, rng):
    monkeypatch.setenv("KFUSE_NATIVE_CALL", "0")
    compiled = shift_pipeline().compile("cpu")
    x = rng.random((8, 8), dtype=np.float32)
    for _ in range(3):
        compiled(x=x, s=1.0)
    assert compiled.stats.native == 0 and compiled.stats.hits == 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["waxpby", "sgemv", "gemver", "harris", "levels"])
def test_on_the_gpu_the_c_path_gives_the_python_paths_results(name, rng):
    """CuPy arrays in: the C path launches or replays CUDA graphs; the results are those of
    the Python path bit for bit (one stream, so that side streams' atomics keep one order)."""
    cupy = pytest.importorskip("cupy")
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    app = get_app(name)
    size = (65536,) if app.bench_size and len(app.bench_size) == 1 else (256, 256)
    inputs, params = app.make_inputs(size, rng, "float32")
    given = {key: cupy.asarray(value) for key, value in inputs.items()} | params
    pipeline = app.build()
    fast = pipeline.compile("cuda", streams=False)
    slow = pipeline.compile("cuda", streams=False, native=False)
    for _ in range(4):
        want = slow(**given)
        got = fast(**given)
        for key in want:
            assert isinstance(got[key], cupy.ndarray)
            if name == "gemver":  # column sums by atomics: their order varies
                cupy.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
            else:
                cupy.testing.assert_array_equal(got[key], want[key])
    assert fast.stats.native == 3


@pytest.mark.gpu
def test_on_the_gpu_torch_tensors_take_the_c_path_on_the_callers_stream(rng):
    torch = pytest.importorskip("torch")
    if native.module() is None:
        pytest.skip("the C call path is not built here")
    app = get_app("harris")
    inputs, params = app.make_inputs((512, 512), rng, "float32")
    image = torch.as_tensor(inputs["img"], device="cuda")
    compiled = app.build().compile("cuda")
    wanted = app.build().compile("cuda", native=False)(img=image * 2.0, **params)["hc"]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the input is made on the side stream and used at once
        for _ in range(10):
            got = compiled(img=image * 2.0, **params)["hc"]
    side.synchronize()
    assert isinstance(got, torch.Tensor) and got.device.type == "cuda"
    assert torch.equal(got, wanted)
    assert compiled.stats.native == 9
