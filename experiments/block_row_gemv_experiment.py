"""Row GEMVs with a whole block per row (inductor's shape) against kfuse and torch.compile
(GPU experiment).

torch.compile's SGEMV and GESUMMV kernels give each row a block of 512 threads, each
thread 16 steps of 2 columns, compiled for 16384 columns: the step loop is unrolled and
every load is issued before the first multiplication. kfuse's stream kernel gives each row
one warp (16 x 16-byte pieces per lane and step, the step loop not unrolled). Here, by
hand, with the sizes compiled in: a block of ``THREADS`` threads per row, ``WIDTH``
columns per load, ``STEPS = columns / (THREADS * WIDTH)`` loads per thread and matrix, all
issued first; the row's sum over the block by warp shuffles and shared memory;
optionally inductor's cache hints (matrix ``evict_first``, x ``evict_last``).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/block_row_gemv_experiment.py [--rounds 3] [--runs 30]
"""

from __future__ import annotations

import numpy as np

from kfuse.apps import get_app
from kfuse.cli.arguments import alternating_main
from kfuse.runtime import auto_plan, get_backend
from kfuse.tune.timing import print_rounds, time_alternating

PRELUDE = r"""
#define COLS {cols}
#define THREADS {threads}
#define WIDTH {width}
#define HINTS {hints}
#define STEPS (COLS / (THREADS * WIDTH))
typedef {vec} vec_t;

__device__ __forceinline__ float dot(float4 a, float4 b) {{
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }}
__device__ __forceinline__ float dot(float2 a, float2 b) {{ return a.x * b.x + a.y * b.y; }}

__device__ __forceinline__ unsigned long long policy(bool first) {{
  unsigned long long p;
  if (first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}}

// one vector of WIDTH floats; with HINTS, inductor's flavour (L1 and L2 eviction hints)
__device__ __forceinline__ vec_t load(const vec_t* p, unsigned long long pol, bool first) {{
#if HINTS
  vec_t v;
#if WIDTH == 2
  if (first) asm volatile("ld.global.L1::evict_first.L2::cache_hint.v2.f32 {{%0,%1}}, [%2], %3;"
      : "=f"(v.x), "=f"(v.y) : "l"(p), "l"(pol));
  else asm volatile("ld.global.L1::evict_last.L2::cache_hint.v2.f32 {{%0,%1}}, [%2], %3;"
      : "=f"(v.x), "=f"(v.y) : "l"(p), "l"(pol));
#else
  if (first) asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.f32 {{%0,%1,%2,%3}}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(pol));
  else asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.f32 {{%0,%1,%2,%3}}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(pol));
#endif
  return v;
#else
  return *p;
#endif
}}

// the sum of v over the block, in thread 0
__device__ __forceinline__ float block_sum(float v) {{
  __shared__ float partial[THREADS / 32];
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  if (THREADS == 32) return v;
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32)
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}}
"""

KERNEL = r"""
// SGEMV: out = alpha A x + beta other (a vector); GESUMMV (SECOND_MATRIX): out = alpha A x +
// beta other x (other a matrix)
extern "C" __global__ void __launch_bounds__(THREADS) block_row(
    const float* __restrict__ A, const float* __restrict__ other, const float* __restrict__ x,
    float* __restrict__ out, float alpha, float beta) {
  const unsigned long long first = HINTS ? policy(true) : 0, last = HINTS ? policy(false) : 0;
  const vec_t* a = reinterpret_cast<const vec_t*>(A + (size_t)blockIdx.x * COLS);
  const vec_t* xv = reinterpret_cast<const vec_t*>(x);
  vec_t av[STEPS], xs[STEPS];
#if SECOND_MATRIX
  const vec_t* b = reinterpret_cast<const vec_t*>(other + (size_t)blockIdx.x * COLS);
  vec_t bv[STEPS];
#endif
  #pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    av[s] = load(a + s * THREADS + threadIdx.x, first, true);
#if SECOND_MATRIX
    bv[s] = load(b + s * THREADS + threadIdx.x, first, true);
#endif
    xs[s] = load(xv + s * THREADS + threadIdx.x, last, false);
  }
  float acc_a = 0.0f;
#if SECOND_MATRIX
  float acc_b = 0.0f;
#endif
  #pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    acc_a += dot(av[s], xs[s]);
#if SECOND_MATRIX
    acc_b += dot(bv[s], xs[s]);
#endif
  }
#if SECOND_MATRIX
  const float acc = block_sum(alpha * acc_a + beta * acc_b);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
#else
  const float acc = block_sum(acc_a);
  if (threadIdx.x == 0) out[blockIdx.x] = alpha * acc + beta * other[blockIdx.x];
#endif
}
"""


def source(app: str, cols: int, threads: int, width: int, hints: int) -> str:
    """The hand-written block-row kernel of ``app`` (sgemv or gesummv)."""
    second = int(app == "gesummv")
    return (f"#define SECOND_MATRIX {second}\n"
            + PRELUDE.format(cols=cols, threads=threads, width=width, hints=hints,
                             vec=f"float{width}") + KERNEL)


CONFIGS = [(512, 2, 0), (512, 2, 1), (256, 4, 0), (256, 4, 1), (512, 4, 0), (1024, 2, 0),
           (1024, 4, 0), (256, 2, 0), (128, 4, 0)]


def compare(name: str, rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    app = get_app(name)
    graph = app.build().graph()
    arrays, params = app.make_inputs((16384, 16384), np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    executable = get_backend("cuda").prepare(graph, given, plan=auto_plan(graph, given))
    executable.launch_all()
    (output,) = graph.outputs
    expected = executable.buffers[output].copy()
    compiled = compiled_on(graph, given)
    rows, cols = given["A"].shape
    alpha, beta = np.float32(params["alpha"]), np.float32(params["beta"])
    result = cupy.empty(rows, dtype=cupy.float32)
    other = given["y"] if name == "sgemv" else given["B"]
    args = (given["A"], other, given["x"], result, alpha, beta)
    runs_by_label = {"kfuse": executable.launch_all, "compile": compiled}
    for threads, width, hints in CONFIGS:
        kernel = cupy.RawModule(code=source(name, cols, threads, width, hints),
                                options=("-std=c++17",)).get_function("block_row")
        label = f"{threads}x{width}{' hints' if hints else ''} r{kernel.num_regs}"

        def launch(kernel=kernel, threads=threads) -> None:
            kernel((rows,), (threads,), args)

        result.fill(np.nan)
        launch()
        error = float(cupy.abs(result - expected).max() / cupy.abs(expected).max())
        print(f"{name} {label}: error against kfuse {error:.1e}", flush=True)
        if not error < 1e-4:
            continue
        runs_by_label[label] = launch
    print_rounds(name, time_alternating(runs_by_label, rounds, repeat=runs), "kfuse")


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare, ("sgemv", "gesummv"))


if __name__ == "__main__":
    main()
