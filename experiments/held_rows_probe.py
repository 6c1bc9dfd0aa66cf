"""Hand-written probes, before changing the generator (GPU experiment, timing and checks):

- ``atax``: ``y = Aᵀ (A x)`` in ONE pass over ``A``. A block holds each of its rows in
  registers (T threads x U float4 = the whole row), reduces ``A[i,:] x`` over the block
  (``tmp[i]``, complete in the block), then adds ``A[i,:] tmp[i]`` to column accumulators
  that each thread keeps for its own columns over all the block's rows; one atomic per
  column and block at the end. The planned program (two passes) and torch.compile beside.
- ``colsum``: column sums ``Aᵀ v`` with the rows split over ``S`` blocks per column tile
  (atomics), against whole columns (S = 1): is the whole-column kernel held back by 128
  column tiles on 132 SMs?
- ``vadd``: ``x = w + y + z`` with cache hints (evict-first loads, streaming stores) and in
  other shapes (threads per block x 16-byte accesses per thread and array, all loads first)
  against torch.compile and the planned program.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/held_rows_probe.py [atax] [colsum] [vadd] [--rounds 5]
"""

from __future__ import annotations

import argparse

import numpy as np

from kfuse.bench.experiment import device_case, planned_run
from kfuse.runtime import get_backend
from kfuse.tune.timing import print_rounds, time_alternating

COMMON = r"""
__device__ __forceinline__ float warp_sum(float v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}
__device__ __forceinline__ float dot4(float4 a, float4 b, float p) {
  p = fmaf(a.x, b.x, p); p = fmaf(a.y, b.y, p); p = fmaf(a.z, b.z, p); return fmaf(a.w, b.w, p);
}
__device__ __forceinline__ void axpy4(float4& acc, float4 a, float t) {
  acc.x = fmaf(a.x, t, acc.x); acc.y = fmaf(a.y, t, acc.y);
  acc.z = fmaf(a.z, t, acc.z); acc.w = fmaf(a.w, t, acc.w);
}
"""

# T threads, U float4 per thread and row (N == 4 T U), R rows per step, XS: x in shared
# memory (else registers), PF: the next step's rows loaded before this step's reduction.
ATAX = COMMON + r"""
extern "C" __global__ void __launch_bounds__(T) atax_held(
    const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y,
    int M, int N, int rows_per_block) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  __shared__ float part[2][R][T / 32];
#if XS
  extern __shared__ float4 xs[];
  for (int c = t; c < N / 4; c += T) xs[c] = reinterpret_cast<const float4*>(x)[c];
  __syncthreads();
#define XV(u) xs[(u) * T + t]
#else
  float4 xv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) xv[u] = reinterpret_cast<const float4*>(x)[u * T + t];
#define XV(u) xv[u]
#endif
  float4 acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int r0 = blockIdx.x * rows_per_block;
  const int r1 = min(M, r0 + rows_per_block);
  int parity = 0;
  float4 a[R][U];
#if PF
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const float4* row = reinterpret_cast<const float4*>(A + (size_t)min(r0 + k, M - 1) * N);
#pragma unroll
    for (int u = 0; u < U; ++u) a[k][u] = row[u * T + t];
  }
#endif
  for (int r = r0; r < r1; r += R) {
#if !PF
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float4* row = reinterpret_cast<const float4*>(A + (size_t)min(r + k, M - 1) * N);
#pragma unroll
      for (int u = 0; u < U; ++u) a[k][u] = row[u * T + t];
    }
#endif
    float p[R];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      p[k] = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) p[k] = dot4(a[k][u], XV(u), p[k]);
      p[k] = warp_sum(p[k]);
      if (lane == 0) part[parity][k][warp] = p[k];
    }
    __syncthreads();  // one barrier per step: the parts are double-buffered
    float4 cur[R][U];
#if PF
#pragma unroll
    for (int k = 0; k < R; ++k)
#pragma unroll
      for (int u = 0; u < U; ++u) cur[k][u] = a[k][u];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float4* row = reinterpret_cast<const float4*>(
          A + (size_t)min(r + R + k, r1 - 1) * N);
#pragma unroll
      for (int u = 0; u < U; ++u) a[k][u] = row[u * T + t];
    }
#define CUR(k, u) cur[k][u]
#else
#define CUR(k, u) a[k][u]
#endif
#pragma unroll
    for (int k = 0; k < R; ++k) {
      float q = lane < T / 32 ? part[parity][k][lane] : 0.f;
      q = warp_sum(q);
      if (r + k < r1) {
#pragma unroll
        for (int u = 0; u < U; ++u) axpy4(acc[u], CUR(k, u), q);
      }
    }
    parity ^= 1;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float* out = y + (size_t)(u * T + t) * 4;
    atomicAdd(out + 0, acc[u].x); atomicAdd(out + 1, acc[u].y);
    atomicAdd(out + 2, acc[u].z); atomicAdd(out + 3, acc[u].w);
  }
}
"""

# Column sums: block 32 x BY, 4 columns per thread, rows of its split strided by BY.
COLSUM = COMMON + r"""
extern "C" __global__ void __launch_bounds__(32 * BY) colsum(
    const float* __restrict__ A, const float* __restrict__ v, float* __restrict__ out,
    int M, int N, int rows_per_split) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = (blockIdx.x * 32 + tx) * 4;
  const int r0 = blockIdx.y * rows_per_split, r1 = min(M, r0 + rows_per_split);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int r = r0 + ty; r < r1; r += BY) {
    const float4 a = *reinterpret_cast<const float4*>(A + (size_t)r * N + col);
    axpy4(acc, a, v[r]);
  }
  __shared__ float4 part[BY][32];
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0) {
    for (int j = 1; j < BY; ++j) {
      float4 o = part[j][tx];
      acc.x += o.x; acc.y += o.y; acc.z += o.z; acc.w += o.w;
    }
    if (gridDim.y == 1) {
      *reinterpret_cast<float4*>(out + col) = acc;
    } else {
      atomicAdd(out + col, acc.x); atomicAdd(out + col + 1, acc.y);
      atomicAdd(out + col + 2, acc.z); atomicAdd(out + col + 3, acc.w);
    }
  }
}
"""

# x = w + y + z: ITEMS float4 per thread and array (all loads first, THREADS apart);
# LOAD / STORE pick the cache hints.
VADD = r"""
extern "C" __global__ void __launch_bounds__(THREADS) vadd(
    const float4* __restrict__ w, const float4* __restrict__ y, const float4* __restrict__ z,
    float4* __restrict__ x, long long n4) {
  const long long base = (long long)blockIdx.x * THREADS * ITEMS + threadIdx.x;
  float4 a[ITEMS], b[ITEMS], c[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const long long i = base + k * THREADS;
    if (i < n4) { a[k] = LOAD(w + i); b[k] = LOAD(y + i); c[k] = LOAD(z + i); }
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const long long i = base + k * THREADS;
    if (i < n4) STORE(x + i, make_float4(a[k].x + b[k].x + c[k].x, a[k].y + b[k].y + c[k].y,
                                         a[k].z + b[k].z + c[k].z, a[k].w + b[k].w + c[k].w));
  }
}
"""
VADD_SHAPES = ((128, 1), (128, 2), (256, 1), (256, 2), (256, 4), (512, 1), (512, 2),
               (1024, 1))  # (threads, float4 per thread and array)
VADD_HINTS = {
    "plain": ("*", "PLAIN_STORE"),
    "ldg": ("__ldg", "PLAIN_STORE"),
    "ldcs": ("__ldcs", "PLAIN_STORE"),
    "stcs": ("*", "__stcs"),
    "ldcs+stcs": ("__ldcs", "__stcs"),
    "ldlu+stcs": ("__ldlu", "__stcs"),
}


def compiled(source: str, name: str, defines: dict[str, int | str]):
    import cupy

    header = "".join(f"#define {key} {value}\n" for key, value in defines.items())
    header += "#define PLAIN_STORE(p, v) (*(p) = (v))\n"
    return cupy.RawModule(code=header + source, options=("-std=c++17",)).get_function(name)


def probe_atax(rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    case = device_case("atax")
    backend = get_backend("cuda")
    executable, expected = planned_run(case, backend)
    A, x = case.given["A"], case.given["x"]
    M, N = A.shape
    y = cupy.empty(N, dtype=cupy.float32)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    runs_by_label = {"planned": executable.launch_all, "compile": compiled_on(case.graph,
                                                                             case.given)}
    for T, R, XS, PF, blocks_per_sm in ((1024, 1, 0, 0, 1), (1024, 1, 1, 0, 1),
                                        (1024, 1, 1, 1, 1), (512, 1, 0, 0, 1),
                                        (512, 1, 1, 1, 1), (512, 2, 1, 0, 1),
                                        (1024, 2, 1, 0, 1)):
        U = N // (4 * T)
        try:
            kernel = compiled(ATAX, "atax_held",
                              {"T": T, "U": U, "R": R, "XS": XS, "PF": PF})
        except Exception as error:  # noqa: BLE001 - a probe: report and go on
            print(f"atax T{T} R{R} XS{XS} PF{PF}: does not compile: {error}", flush=True)
            continue
        blocks = sms * blocks_per_sm
        per_block = -(-M // blocks)
        per_block = -(-per_block // R) * R
        grid = -(-M // per_block)
        shared = N * 4 if XS else 0
        if shared > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = shared

        def run(kernel=kernel, grid=grid, per_block=per_block, shared=shared, T=T):
            y.fill(0)
            kernel((grid,), (T,), (A, x, y, np.int32(M), np.int32(N), np.int32(per_block)),
                   shared_mem=shared)

        run()
        error = float(cupy.abs(y - expected["y"]).max() / cupy.abs(expected["y"]).max())
        label = f"T{T} U{U} R{R} xs{XS} pf{PF} grid{grid}"
        print(f"atax {label}: registers {kernel.num_regs}, spills {kernel.local_size_bytes} "
              f"B, error {error:.1e}", flush=True)
        if error < 1e-4:
            runs_by_label[label] = run
    print_rounds("atax", time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def probe_colsum(rounds: int, runs: int) -> None:
    import cupy

    rng = cupy.random.default_rng(1)
    M = N = 16384
    A = rng.random((M, N), dtype=cupy.float32)
    v = rng.random(M, dtype=cupy.float32)
    out = cupy.empty(N, dtype=cupy.float32)
    expected = (A.T.astype(cupy.float64) @ v.astype(cupy.float64))
    runs_by_label = {}
    for BY, S in ((32, 1), (16, 1), (32, 2), (32, 4), (32, 8), (32, 33), (16, 33), (32, 66)):
        kernel = compiled(COLSUM, "colsum", {"BY": BY})
        per_split = -(-M // S)

        def run(kernel=kernel, BY=BY, S=S, per_split=per_split):
            if S > 1:
                out.fill(0)
            kernel((N // 128, S), (32, BY), (A, v, out, np.int32(M), np.int32(N),
                                             np.int32(per_split)))

        run()
        error = float(cupy.abs(out - expected).max() / cupy.abs(expected).max())
        label = f"32x{BY} S{S}"
        print(f"colsum {label}: registers {kernel.num_regs}, error {error:.1e}", flush=True)
        runs_by_label[label] = run
    print_rounds("colsum", time_alternating(runs_by_label, rounds, repeat=runs), "32x32 S1")


def vadd_setup() -> tuple[dict, object, dict, dict]:
    """VADD at its benchmark size on the GPU: (inputs, an output vector for hand-written
    kernels, the planned program's outputs, the planned program and torch.compile by label)."""
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    case = device_case("vadd")
    executable, expected = planned_run(case, get_backend("cuda"))
    out = cupy.empty(case.given["w"].size, dtype=cupy.float32)
    return case.given, out, expected, {"planned": executable.launch_all,
                                       "compile": compiled_on(case.graph, case.given)}


def probe_vadd(rounds: int, runs: int) -> None:
    import cupy

    given, out, expected, runs_by_label = vadd_setup()
    n = given["w"].size
    shapes = [(256, 1, label) for label in VADD_HINTS] + [
        (threads, items, "plain") for threads, items in VADD_SHAPES if (threads, items)
        != (256, 1)]
    for threads, items, hint in shapes:
        load, store = VADD_HINTS[hint]
        kernel = compiled(VADD, "vadd", {"LOAD": load, "STORE": store, "THREADS": threads,
                                         "ITEMS": items})
        n4 = n // 4
        label = f"{hint} {threads}x{items}"

        def run(kernel=kernel, n4=n4, threads=threads, items=items):
            kernel((-(-n4 // (threads * items)),), (threads,),
                   (given["w"], given["y"], given["z"], out, np.int64(n4)))

        run()
        error = float(cupy.abs(out - expected["x"]).max())
        print(f"vadd {label}: error {error:.1e}", flush=True)
        runs_by_label[label] = run
    print_rounds("vadd", time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probes", nargs="*", default=["atax", "colsum", "vadd"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    probes = {"atax": probe_atax, "colsum": probe_colsum, "vadd": probe_vadd}
    for name in args.probes:
        probes[name](args.rounds, args.runs)


if __name__ == "__main__":
    main()
