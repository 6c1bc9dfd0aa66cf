"""User CUDA kernels as operators (kf.user_kernel): declarations, ordering among generated
kernels, both backends' semantics (the cpu backend runs the user's source through the shim),
NumPy references, and the check mode that catches writes outside the declarations."""

from __future__ import annotations

import numpy as np
import pytest

import kfuse as kf
from kfuse.errors import BackendUnavailable, DslError, FusionError, LaunchError, ShapeError

SCALE_ADD = r"""
// y = alpha * x + offset, one element per thread (a 2-D array seen flat)
__global__ void scale_add(const float* x, float* y, int count, float alpha, float offset) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) y[i] = alpha * x[i] + offset;
}
"""

# two outputs: the running maximum of each row (a 2-D grid: one block row per image row) and
# the count of elements above a threshold (atomics into a counter that starts at 0)
ROW_STATS = r"""
__global__ void row_stats(const float* x, float* row_max, int* above, int rows, int columns,
                          float threshold) {
  KF_DYNAMIC_SHARED(float, partial);
  const int row = blockIdx.y;
  float best = -INFINITY;
  int count = 0;
  for (int c = threadIdx.x; c < columns; c += blockDim.x) {
    const float v = x[row * columns + c];
    best = v > best ? v : best;
    count += v > threshold;
  }
  partial[threadIdx.x] = best;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half && partial[threadIdx.x + half] > partial[threadIdx.x])
      partial[threadIdx.x] = partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) row_max[row] = partial[0];
  atomicAdd(above, count);
}
"""


def _scale_add_pipeline() -> kf.Pipeline:
    p = kf.Pipeline("user_scale")
    x = p.input("x", 2)
    alpha = p.param("alpha")
    a = kf.point(x * 2.0 + 1.0, name="a")
    y = kf.user_kernel(SCALE_ADD, "scale_add",
                       [kf.read(a, radius=0), kf.written("y", like=a), kf.size(a), alpha, 0.25],
                       block=(128,), grid=[(kf.size(a), 128)],
                       numpy=lambda a, alpha: alpha * a + 0.25)
    p.output(kf.point(y * x, name="c"))
    return p


@pytest.mark.parametrize("plan", ["auto", "unfused"])
def test_a_user_kernel_between_generated_operators_computes_what_numpy_does(plan):
    p = _scale_add_pipeline()
    x = np.random.default_rng(1).uniform(-1, 1, (37, 53)).astype(np.float32)
    got = p.run(backend="cpu", plan=plan, x=x, alpha=0.75)["c"]
    want = (0.75 * (x.astype(np.float64) * 2 + 1) + 0.25) * x
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert np.array_equal(got, p.run(backend="numpy", x=x, alpha=0.75)["c"].astype(np.float32)) \
        or np.allclose(got, p.run(backend="numpy", x=x, alpha=0.75)["c"], rtol=1e-6)


def test_the_plan_keeps_a_user_kernel_alone_and_says_why():
    p = _scale_add_pipeline()
    text = p.plan(sizes={"x.0": 64, "x.1": 64}).explain()
    assert "kernel [scale_add]" in text
    assert "user CUDA kernel, which runs alone" in text
    with pytest.raises(FusionError, match="user CUDA kernel"):
        p.fuse([["a", "scale_add"]])


def _row_stats_pipeline() -> kf.Pipeline:
    p = kf.Pipeline("user_rows")
    x = p.input("x", shape=("rows", "columns"))
    threshold = p.param("threshold")
    row_max, above = kf.user_kernel(
        ROW_STATS, "row_stats",
        [x, kf.written("row_max", shape=("rows",)),
         kf.written("above", shape=(1,), dtype="int32", elementwise=False, initial=0),
         kf.size(x, 0), kf.size(x, 1), threshold],
        block=(64,), grid=[1, (kf.size(x, 0), 1)], shared_bytes=64 * 4,
        numpy=lambda x, t: (x.max(axis=1), np.array([np.sum(x > t)])))
    p.output(kf.point(row_max * 2.0, name="doubled"), above)
    return p


@pytest.mark.parametrize("shape", [(1, 1), (7, 200), (33, 45)], ids=str)
def test_two_outputs_a_2d_grid_dynamic_shared_memory_and_an_initial_value(shape):
    p = _row_stats_pipeline()
    x = np.random.default_rng(2).uniform(-1, 1, shape).astype(np.float32)
    got = p.run(backend="cpu", x=x, threshold=0.1)
    np.testing.assert_array_equal(got["doubled"], x.max(axis=1) * 2)
    assert int(got["above"][0]) == int(np.sum(x > 0.1))
    want = p.run(backend="numpy", x=x, threshold=0.1)
    np.testing.assert_array_equal(want["above"], got["above"])


def test_one_kernel_used_twice_gets_two_operators_and_runs_twice():
    p = kf.Pipeline("twice")
    x = p.input("x", 1)
    first = kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y1", like=x), kf.size(x),
                                                    2.0, 1.0], grid=[(kf.size(x), 256)])
    second = kf.user_kernel(SCALE_ADD, "scale_add", [first, kf.written("y2", like=x),
                                                     kf.size(x), 3.0, -1.0],
                            grid=[(kf.size(x), 256)])
    p.output(second)
    assert [k.name for k in p.graph().kernels] == ["scale_add", "scale_add_2"]
    x = np.random.default_rng(3).uniform(-1, 1, 1001).astype(np.float32)
    np.testing.assert_allclose(p.run(backend="cpu", x=x)["y2"], 3 * (2 * x + 1) - 1, rtol=1e-6)


def test_the_numpy_backend_needs_a_reference():
    p = kf.Pipeline("no_reference")
    x = p.input("x", 1)
    p.output(kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x), kf.size(x),
                                                      1.0, 0.0]))
    with pytest.raises(BackendUnavailable, match="'scale_add'.*without a NumPy reference"):
        p.run(backend="numpy", x=np.ones(5, np.float32))


def test_a_reference_of_the_wrong_shape_is_refused_by_name():
    p = kf.Pipeline("wrong_reference")
    x = p.input("x", 1)
    p.output(kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x), kf.size(x),
                                                      1.0, 0.0], numpy=lambda x: x[:-1]))
    with pytest.raises(ShapeError, match="'scale_add'.*shape"):
        p.run(backend="numpy", x=np.ones(5, np.float32))


OUT_OF_BOUNDS = r"""
__global__ void past_the_end(const float* x, float* y, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= count) y[i] = x[i] + 1.0f;  // one element too far
}
"""
UNDECLARED = r"""
__global__ void writes_its_input(float* x, float* y, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) { y[i] = x[i]; x[i] = -x[i]; }
}
"""


@pytest.mark.parametrize("source, entry, message", [
    (OUT_OF_BOUNDS, "past_the_end", "wrote outside array 'y'"),
    (UNDECLARED, "writes_its_input", "wrote into 'x', which it does not declare"),
    (SCALE_ADD, "scale_add", None),
])
def test_check_writes_catches_writes_outside_the_declarations(configure, source, entry, message):
    p = kf.Pipeline("checked")
    x = p.input("x", 1)
    extra = [1.0, 0.0] if entry == "scale_add" else []
    p.output(kf.user_kernel(source, entry, [x, kf.written("y", like=x), kf.size(x), *extra],
                            grid=[(kf.size(x), 128)]))
    values = np.random.default_rng(4).uniform(1, 2, 1000).astype(np.float32)
    configure(check_writes=True)
    if message is None:
        np.testing.assert_array_equal(p.run(backend="cpu", x=values.copy())["y"], values)
        return
    with pytest.raises(LaunchError, match=f"operator '{entry}'.*{message}"):
        p.run(backend="cpu", x=values.copy())


def _array(name="x"):
    p = kf.Pipeline("bad")
    return p, p.input(name, 1)


@pytest.mark.parametrize("build, message", [
    (lambda x: kf.user_kernel("", "f", [x, kf.written("y", like=x)]), "CUDA C source"),
    (lambda x: kf.user_kernel(SCALE_ADD, "not a name", [x, kf.written("y", like=x)]),
     "kernel function's name"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.size(x)]), "kf.written"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x)],
                              block=(64, 32)), "at most 1024"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x)],
                              block=(16, 16), any_block=True), "1-D block of whole warps"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x)],
                              grid=["many"]), "grid axis"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x), "n"]),
     "argument 2"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("x", like=x)]),
     "already used"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", shape=("m",))]),
     "no size of the pipeline"),
    (lambda x: kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x)],
                              numpy="reference"), "numpy= takes a function"),
    (lambda x: kf.read(x, radius=(1, 1)), "radius"),
    (lambda x: kf.written("y", like=x, initial=float("nan")), "finite"),
])
def test_bad_declarations_are_refused_by_name(build, message):
    p, x = _array()
    with pytest.raises(kf.KfuseError, match=message) as error:
        build(x)
    assert "test_user_kernels.py" in str(error.value)
    assert [k.name for k in p._kernels] == []  # nothing of a refused operator stays


def test_arrays_of_another_pipeline_are_refused():
    _, x = _array()
    _, other = _array("z")
    with pytest.raises(DslError, match="different pipelines"):
        kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=other)])


def test_sizes_unified_after_the_kernel_are_named_as_the_graph_names_them():
    p = kf.Pipeline("unified")
    x = p.input("x", 1)
    y = kf.user_kernel(SCALE_ADD, "scale_add", [x, kf.written("y", like=x), kf.size(x),
                                                 2.0, 0.0], grid=[(kf.size(x), 64)])
    n = p.input("n_vec", shape=("n",))
    p.output(kf.point(y + n, name="total"))  # unifies x.0 with n
    (kernel,) = [k for k in p.graph().kernels if k.kind == "opaque"]
    sizes = {a.ref for a in kernel.opaque.arguments if a.role == "size"}
    assert sizes == set(kernel.domain) and kernel.opaque.grid[0].symbols == kernel.domain
    values = np.random.default_rng(5).uniform(0, 1, 77).astype(np.float32)
    np.testing.assert_allclose(p.run(backend="cpu", x=values, n_vec=values)["total"],
                               3 * values, rtol=1e-6)


def test_a_graph_with_a_user_kernel_has_a_fingerprint_without_its_reference():
    first, second = _scale_add_pipeline().graph(), _scale_add_pipeline().graph()
    assert first.fingerprint == second.fingerprint  # (their numpy= lambdas differ)
