"""The literature apps (kfuse.apps): every pipeline against its independent NumPy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kfuse
from kfuse.apps import get_app, list_apps, relative_error
from kfuse.errors import DslError

try:
    import kfuse.runtime.host_compiler  # noqa: F401 - only probing for the cpu backend
    HAVE_HOST_COMPILER = True
except ImportError:
    HAVE_HOST_COMPILER = False

TOLERANCE = 1e-5
BOUNDARIES = ["clamp", "mirror", "repeat", kfuse.constant(0.5)]
EXTRA_2D_SIZE = (19, 71)
APP_NAMES = [app.name for app in list_apps()]

# The kernels of each app, in program order (kernel names are part of the apps' contract).
KERNELS = {
    "harris": ["dx", "dy", "sx", "sy", "sxy", "gx", "gy", "gxy", "hc"],
    "shi_tomasi": ["dx", "dy", "sx", "sy", "sxy", "gx", "gy", "gxy", "st"],
    "sobel": ["dx", "dy", "mag"],
    "unsharp": ["blur", "sharp", "ratio", "unsharp"],
    "enhance": ["geomean", "amplify", "gamma_correct"],
    "night": ["atrous0", "atrous1", "scoto"],
    "diffusion3d": ["u1", "u2"],
    "levels": ["blur0", "detail0", "blur1", "detail1", "blur2", "detail2", "blur3", "detail3"],
}

# Apps with several outputs (the others output their last kernel)
OUTPUTS = {"levels": ("detail0", "detail1", "detail2", "detail3")}


def _cases() -> list:
    cases = []
    for app in list_apps():
        sizes = [app.test_size] + ([EXTRA_2D_SIZE] if app.ndim == 2 else [])
        for size in sizes:
            for boundary in BOUNDARIES:
                cases.append(pytest.param(app.name, size, boundary,
                                          id=f"{app.name}-{'x'.join(map(str, size))}-{boundary}"))
    return cases


def _check(name: str, size: tuple[int, ...], boundary: object, backend: str,
           dtype: str = "float32", tolerance: float = TOLERANCE) -> None:
    app = get_app(name)
    arrays, params = app.make_inputs(size, np.random.default_rng(1234), dtype)
    outputs = app.build(dtype=dtype, boundary=boundary).run(backend=backend, **arrays, **params)
    references = app.reference({k: v.astype(np.float64) for k, v in arrays.items()}, params,
                               boundary)
    assert set(outputs) == set(references)
    for output, ref in references.items():
        assert np.asarray(outputs[output]).shape == ref.shape
        error = relative_error(outputs[output], ref)
        assert error <= tolerance, (f"{name} ({boundary}, {size}): output '{output}' has "
                                    f"relative error {error:.3e} > {tolerance:g}")


@pytest.mark.parametrize(("name", "size", "boundary"), _cases())
def test_numpy_backend_matches_reference(name, size, boundary):
    _check(name, size, boundary, "numpy")


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=str)
@pytest.mark.parametrize("name", APP_NAMES)
def test_float64_pipeline_matches_reference_tightly(name, boundary):
    _check(name, get_app(name).test_size, boundary, "numpy", dtype="float64", tolerance=1e-11)


# One boundary mode per app, rotating so that every mode is compiled at least once while the
# test stays fast (each case compiles the generated CUDA C with the host compiler).
@pytest.mark.skipif(not HAVE_HOST_COMPILER, reason="kfuse.runtime.host_compiler is not there yet")
@pytest.mark.parametrize(("name", "boundary"),
                         [(name, BOUNDARIES[i % len(BOUNDARIES)])
                          for i, name in enumerate(APP_NAMES)], ids=str)
def test_cpu_backend_matches_reference(name, boundary, default_optimisation):
    from kfuse.runtime.cpu_backend import CpuBackend
    if not CpuBackend.available():
        pytest.skip("no host C++ compiler")
    _check(name, get_app(name).test_size, boundary, "cpu")


def test_registry_lists_every_app_once():
    assert APP_NAMES == ["harris", "shi_tomasi", "sobel", "unsharp", "enhance", "night",
                         "diffusion3d", "levels"]
    for app in list_apps():
        assert get_app(app.name) is app
        assert len(app.test_size) == len(app.bench_size) == app.ndim
        assert all(n % 8 != 0 for n in app.test_size), "test sizes must not be multiples of 8"
        assert app.title and app.origin


def test_unknown_app_raises_dsl_error_with_the_names():
    with pytest.raises(DslError) as info:
        get_app("nope")
    assert "nope" in str(info.value)
    for name in APP_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", APP_NAMES)
def test_kernel_names_and_output(name):
    app = get_app(name)
    graph = app.build().graph()
    assert [k.name for k in graph.kernels] == KERNELS[name]
    assert graph.outputs == OUTPUTS.get(name, (KERNELS[name][-1],))


@pytest.mark.parametrize("name", APP_NAMES)
def test_inputs_are_random_positive_and_typed(name):
    app = get_app(name)
    arrays, params = app.make_inputs(app.test_size, np.random.default_rng(0), "float32")
    pipeline = app.build()
    assert set(arrays) == set(pipeline.inputs)
    assert set(params) == set(pipeline.params)
    shapes = {name: tuple(pipeline.graph().shape_of(name, app.sizes(pipeline.graph(),
                                                                     app.test_size)))
              for name in arrays}
    for name, array in arrays.items():
        assert array.dtype == np.float32 and array.shape == shapes[name]
        assert array.min() > 0.0 and np.ptp(array) > 0.1
    assert app.test_size in shapes.values()


def test_harris_graph_is_the_dag_of_the_thesis():
    graph = get_app("harris").build().graph()
    dag = graph.order_dag()
    assert set(dag.nodes) == {"dx", "dy", "sx", "sy", "sxy", "gx", "gy", "gxy", "hc"}
    assert set(dag.edges) == {
        ("dx", "sx"), ("dy", "sy"), ("dx", "sxy"), ("dy", "sxy"),
        ("sx", "gx"), ("sy", "gy"), ("sxy", "gxy"),
        ("gx", "hc"), ("gy", "hc"), ("gxy", "hc"),
    }
    kinds = {kernel.name: kernel.kind for kernel in graph.kernels}
    assert {n for n, kind in kinds.items() if kind == "local"} == {"dx", "dy", "gx", "gy", "gxy"}
    assert {n for n, kind in kinds.items() if kind == "point"} == {"sx", "sy", "sxy", "hc"}
    assert graph.inputs == ("img",) and graph.consumers["img"] == ("dx", "dy")
    assert dict(graph.params) == {"k": "float32"}


@pytest.mark.parametrize("name", APP_NAMES)
def test_references_tell_boundary_modes_apart(name):
    """Guard against a blind test: the modes must change the result at the borders.

    Clamp and mirror agree for radius-1 stencils (both read the edge pixel at -1), so they
    are told apart only by the apps with a larger radius (unsharp 5x5, night dilated).
    """
    app = get_app(name)
    arrays, params = app.make_inputs(app.test_size, np.random.default_rng(5), "float32")
    results = {str(b): next(iter(app.reference(arrays, params, b).values()))
               for b in BOUNDARIES}
    for a, b in [("clamp", "repeat"), ("clamp", "constant(0.5)"), ("repeat", "constant(0.5)")]:
        assert relative_error(results[a], results[b]) > 1e-3
    if name in ("unsharp", "night"):
        assert relative_error(results["mirror"], results["clamp"]) > 1e-3


def test_relative_error():
    ref = np.array([3.0, 4.0])
    assert relative_error(ref, ref) == 0.0
    assert relative_error(np.array([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert relative_error(np.array([np.nan, 4.0]), ref) == math.inf
    assert not relative_error(np.array([3.0, np.inf]), ref) <= TOLERANCE
    assert relative_error(np.array([0.0, 2.0]), np.zeros(2)) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        relative_error(np.zeros(3), np.zeros(2))
