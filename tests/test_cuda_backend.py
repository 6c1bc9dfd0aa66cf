"""The cuda backend on a real GPU (skipped where no GPU with CuPy is usable, as in CI)."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.apps import get_app, list_apps
from kfuse.apps.check import relative_error
from kfuse.runtime.cuda_backend import CudaBackend

pytestmark = pytest.mark.skipif(not CudaBackend.available(), reason="no usable CUDA GPU")

BOUNDARIES = ["clamp", "mirror", "repeat", kf.constant(0.5)]


@pytest.mark.parametrize("plan", ["auto", "unfused"])
@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("app", [a.name for a in list_apps()])
def test_apps_on_cuda_match_the_reference(app, boundary, plan):
    spec = get_app(app)
    arrays, params = spec.make_inputs(spec.test_size, np.random.default_rng(7), "float32")
    outputs = spec.build(boundary=boundary).run(backend="cuda", plan=plan, **arrays, **params)
    reference = spec.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                               boundary)
    for name, expected in reference.items():
        assert relative_error(outputs[name], expected) <= 1e-5, name


def test_cupy_and_torch_inputs_are_not_copied():
    import cupy

    p = kf.Pipeline("inplace")
    x = p.input("x", ndim=2)
    total = kf.reduce_sum(x)
    p.output(kf.point(x / total, name="y"), total)
    data = cupy.random.random((301, 257), dtype=cupy.float32) + 0.5
    executable = CudaBackend().prepare(p.graph(), {"x": data})
    assert executable.buffers["x"].data.ptr == data.data.ptr
    executable.launch_all()
    y = executable.results()["y"]
    assert isinstance(y, cupy.ndarray)
    expected = data.get().astype(np.float64)
    assert relative_error(y.get(), expected / expected.sum()) <= 1e-5

    torch = pytest.importorskip("torch")
    tensor = torch.rand(301, 257, device="cuda") + 0.5
    executable = CudaBackend().prepare(p.graph(), {"x": tensor})
    assert executable.buffers["x"].data.ptr == tensor.data_ptr()
    executable.launch_all()
    y = executable.results()["y"]
    assert isinstance(y, torch.Tensor) and y.is_cuda
    expected = tensor.double().cpu().numpy()
    assert relative_error(y.cpu().numpy(), expected / expected.sum()) <= 1e-5
