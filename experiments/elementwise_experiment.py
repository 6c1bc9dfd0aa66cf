"""Elementwise kernels in other shapes against kfuse's and torch.compile's (GPU experiment).

MADD (C = A + B, 2^28 elements) and VADD (x = z + (y + w), 2^27) as hand-written kernels:
each thread handles ``per_thread`` groups of ``width`` consecutive elements (one load of
4 * width bytes per group, groups strided by the block), ``threads`` per block, one block
per chunk (no grid-stride loop). Each line is timed against kfuse's generated kernel and
torch.compile's, the three in alternating rounds. Then torch.compile's Triton sources and
PTX are copied to $OUT/triton for reading.

Usage on the device machine (repo root)::

    TRITON_CACHE_DIR=/tmp/triton_cache PYTHONPATH=. python3 experiments/elementwise_experiment.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import auto_plan, get_backend
from kfuse.tune.timing import time_gpu

SOURCE = r"""
template <int WIDTH> struct Vec;
template <> struct Vec<1> { typedef float type; };
template <> struct Vec<2> { typedef float2 type; };
template <> struct Vec<4> { typedef float4 type; };

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float4 add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// C = A + B; ARITY 3: C = D + (A + B)
template <int WIDTH, int PER_THREAD, int ARITY>
__global__ void elementwise(const float* __restrict__ a, const float* __restrict__ b,
                            const float* __restrict__ d, float* __restrict__ c, long long n) {
  typedef typename Vec<WIDTH>::type V;
  const long long first = ((long long)blockIdx.x * PER_THREAD * blockDim.x + threadIdx.x);
  V va[PER_THREAD], vb[PER_THREAD], vd[PER_THREAD];
  #pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const long long i = first + (long long)k * blockDim.x;
    if ((i + 1) * WIDTH <= n) {
      if (ARITY == 3) vd[k] = reinterpret_cast<const V*>(d)[i];
      va[k] = reinterpret_cast<const V*>(a)[i];
      vb[k] = reinterpret_cast<const V*>(b)[i];
    }
  }
  #pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const long long i = first + (long long)k * blockDim.x;
    if ((i + 1) * WIDTH <= n) {
      V sum = add(va[k], vb[k]);
      if (ARITY == 3) sum = add(vd[k], sum);
      reinterpret_cast<V*>(c)[i] = sum;
    }
  }
}
"""

CONFIGS = [(width, per_thread, threads)
           for width in (1, 2, 4) for per_thread in (1, 2, 4) for threads in (128, 256, 512)]


def experiment(name: str, arity: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app(name)
    size = app.bench_size
    graph = app.build().graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    executable = get_backend("cuda").prepare(graph, given, plan=auto_plan(graph, given))
    executable.launch_all()
    output = graph.outputs[0]
    expected = executable.buffers[output].copy()
    compiled = compiled_on(graph, given)
    names = sorted(arrays)  # madd: A, B; vadd: w, y, z -> x = z + (y + w)
    if arity == 2:
        a, b, d = given["A"], given["B"], given["A"]
    else:
        a, b, d = given["y"], given["w"], given["z"]
    n = a.size
    result = cupy.empty_like(a)
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=[
        f"elementwise<{w}, {p}, {arity}>" for w, p, _ in CONFIGS])
    print(f"{name}: inputs {names}, {n} elements", flush=True)

    def reference_pair() -> str:
        ours = time_gpu(executable.launch_all, warmup=3, repeat=30).median_s * 1e3
        theirs = time_gpu(compiled, warmup=3,
                          repeat=30).median_s * 1e3
        return f"kfuse {ours:.4f}  torch.compile {theirs:.4f}"

    print(f"  reference          {reference_pair()}", flush=True)
    for width, per_thread, threads in CONFIGS:
        kernel = module.get_function(f"elementwise<{width}, {per_thread}, {arity}>")
        blocks = -(-n // (width * per_thread * threads))

        def launch(kernel=kernel, blocks=blocks, threads=threads) -> None:
            kernel((blocks,), (threads,), (a, b, d, result, np.int64(n)))

        result.fill(np.nan)
        launch()
        error = float(cupy.abs(result.reshape(expected.shape) - expected).max())
        hand = time_gpu(launch, warmup=3, repeat=30).median_s * 1e3
        print(f"  width {width} x {per_thread} per thread, {threads:4d} threads: "
              f"{hand:.4f} ms (error {error:.1e})   {reference_pair()}", flush=True)


def copy_triton_sources() -> None:
    out = os.environ.get("OUT")
    cache = os.environ.get("TRITON_CACHE_DIR")
    if not out or not cache:
        return
    target = Path(out) / "triton"
    target.mkdir(parents=True, exist_ok=True)
    for path in Path(cache).rglob("*"):
        if path.suffix in (".ptx", ".ttgir", ".json") and path.stat().st_size < 200_000:
            shutil.copy(path, target / f"{path.parent.name[:8]}_{path.name}")


def main() -> None:
    experiment("madd", 2)
    experiment("vadd", 3)
    for name in ("sgemv", "gesummv", "sgemvt"):  # their Triton kernels, for reading
        import cupy

        from kfuse.bench.torch_baseline import compiled_on
        app = get_app(name)
        graph = app.build().graph()
        arrays, params = app.make_inputs((16384, 16384), np.random.default_rng(0), "float32")
        compiled_on(graph, {k: cupy.asarray(v) for k, v in arrays.items()} | params)
    copy_triton_sources()


if __name__ == "__main__":
    main()
