"""SGEMV (z = alpha A x + beta y, 16384^2) in hand-written shapes against kfuse and
torch.compile (GPU experiment).

kfuse's stream kernel gives each warp one row: every step, each lane loads ``U`` 16-byte
pieces of the row and of x, waits, multiplies, and only then loads the next step. Here:

- ``plain U R``: that shape by hand (U pieces per lane and step, R warps = rows per block);
- ``pipelined U R``: the loads of step s + 1 issued before step s is multiplied (two
  register buffers), so a warp always has a step in flight;
- ``x-smem U W B``: persistent blocks of W warps (B per SM) copy all of x into shared memory
  once, then each warp walks rows (pipelined), reading x from shared memory: the only
  global loads are the matrix's.

Each line is timed beside kfuse's generated kernel and torch.compile's, on the same arrays.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/gemv_experiment.py
"""

from __future__ import annotations

import numpy as np

from kfuse.apps import get_app
from kfuse.runtime import auto_plan, get_backend
from kfuse.tune.timing import time_gpu

SOURCE = r"""
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// a lane's share of one row's dot product with x, the row's loads of step s + 1 issued
// before step s is multiplied (two register buffers)
template <int U>
__device__ __forceinline__ float row_dot_pipelined(const float4* a, const float4* xv, int lane,
                                                   int steps) {
  float acc = 0.0f;
  float4 cur[U];
  #pragma unroll
  for (int u = 0; u < U; ++u) cur[u] = a[u * 32 + lane];
  for (int s = 0; s < steps; ++s) {
    float4 nxt[U];
    if (s + 1 < steps) {
      #pragma unroll
      for (int u = 0; u < U; ++u) nxt[u] = a[((s + 1) * U + u) * 32 + lane];
    }
    #pragma unroll
    for (int u = 0; u < U; ++u) acc += dot4(cur[u], xv[(s * U + u) * 32 + lane]);
    #pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = nxt[u];
  }
  return acc;
}

// one warp per row; rows * steps * U * 32 * 4 == m (the experiment's sizes divide)
template <int U, bool PIPELINED>
__global__ void gemv_rows(const float* __restrict__ A, const float* __restrict__ x,
                          const float* __restrict__ y, float* __restrict__ z, int n, int m,
                          float alpha, float beta) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= n) return;
  const int lane = threadIdx.x;
  const float4* a = reinterpret_cast<const float4*>(A + (size_t)row * m);
  const float4* xv = reinterpret_cast<const float4*>(x);
  const int steps = m / (128 * U);
  float acc = 0.0f;
  if (!PIPELINED) {
    for (int s = 0; s < steps; ++s) {
      float4 va[U], vx[U];
      #pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = (s * U + u) * 32 + lane;
        va[u] = a[i];
        vx[u] = xv[i];
      }
      #pragma unroll
      for (int u = 0; u < U; ++u) acc += dot4(va[u], vx[u]);
    }
  } else {
    acc = row_dot_pipelined<U>(a, xv, lane, steps);
  }
  acc = warp_sum(acc);
  if (lane == 0) z[row] = alpha * acc + beta * y[row];
}

// persistent blocks: x staged in shared memory once, warps walk rows (pipelined)
template <int U>
__global__ void gemv_x_smem(const float* __restrict__ A, const float* __restrict__ x,
                            const float* __restrict__ y, float* __restrict__ z, int n, int m,
                            float alpha, float beta) {
  extern __shared__ float4 xs[];
  const int threads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = tid; i < m / 4; i += threads) xs[i] = reinterpret_cast<const float4*>(x)[i];
  __syncthreads();
  const int lane = threadIdx.x;
  const int steps = m / (128 * U);
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < n; row += gridDim.x * blockDim.y) {
    const float4* a = reinterpret_cast<const float4*>(A + (size_t)row * m);
    const float acc = warp_sum(row_dot_pipelined<U>(a, xs, lane, steps));
    if (lane == 0) z[row] = alpha * acc + beta * y[row];
  }
}
"""

ROWS = [(f"gemv_rows<{u}, {'true' if p else 'false'}>", u, r, p)
        for p in (False, True) for u in (4, 8, 16) for r in (1, 2, 4, 8)
        if not (p and u == 16)]
SMEM = [(u, w, b) for u in (2, 4, 8) for w in (8, 16, 32) for b in (1, 2, 3)]


def main() -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app("sgemv")
    graph = app.build().graph()
    arrays, params = app.make_inputs((16384, 16384), np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    executable = get_backend("cuda").prepare(graph, given, plan=auto_plan(graph, given))
    executable.launch_all()
    expected = executable.buffers["z"].copy()
    compiled = compiled_on(graph, given)
    a, x, y = given["A"], given["x"], given["y"]
    n, m = a.shape
    alpha, beta = np.float32(params["alpha"]), np.float32(params["beta"])
    z = cupy.empty_like(y)
    names = list(dict.fromkeys([name for name, *_ in ROWS]
                               + [f"gemv_x_smem<{u}>" for u in (2, 4, 8)]))
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]

    def reference_pair() -> str:
        ours = time_gpu(executable.launch_all, warmup=3, repeat=30).median_s * 1e3
        theirs = time_gpu(compiled, warmup=3,
                          repeat=30).median_s * 1e3
        return f"kfuse {ours:.4f}  torch.compile {theirs:.4f}"

    def run(label: str, launch) -> None:
        z.fill(np.nan)
        launch()
        error = float(cupy.abs(z - expected).max() / cupy.abs(expected).max())
        hand = time_gpu(launch, warmup=3, repeat=30).median_s * 1e3
        print(f"  {label:34s} {hand:.4f} ms (error {error:.1e})   {reference_pair()}",
              flush=True)

    print(f"  reference {reference_pair()}", flush=True)
    for name, u, rows, pipelined in ROWS:
        kernel = module.get_function(name)
        run(f"{'pipelined' if pipelined else 'plain'} U={u} rows/block={rows}",
            lambda kernel=kernel, rows=rows: kernel(
                (n // rows,), (32, rows), (a, x, y, z, np.int32(n), np.int32(m), alpha, beta)))
    for u, warps, per_sm in SMEM:
        kernel = module.get_function(f"gemv_x_smem<{u}>")
        kernel.max_dynamic_shared_size_bytes = m * 4
        run(f"x-smem U={u} warps={warps} blocks/SM={per_sm}",
            lambda kernel=kernel, warps=warps, per_sm=per_sm: kernel(
                (sms * per_sm,), (32, warps), (a, x, y, z, np.int32(n), np.int32(m), alpha,
                                               beta), shared_mem=m * 4))


if __name__ == "__main__":
    main()
