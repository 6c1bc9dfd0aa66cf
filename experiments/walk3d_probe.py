"""heat3d's 4 steps in one kernel that walks the planes (GPU probe, hand-written CUDA).

A block of 32 x WY threads owns a tile of 128 columns x WY*R rows of every plane (its
outputs and the chain's lateral halo of K = 4 points each side) and a chunk of planes.
Each thread keeps 4 columns x R rows. Per iteration one input plane arrives (cp.async into
a ring of planes in shared memory, PF planes ahead) and every level computes one plane,
level l at plane p - l: its neighbours along z from the thread's queues of registers (3
planes a level), along x from the thread's registers and, at its 4 columns' ends, from the
lanes beside by shuffles, along y from its own rows and, at their ends, from the rows the
threads above and below published to shared memory in the previous iteration (two buffers
a level, by parity): one barrier an iteration. Clamp borders: blocks that touch the grid's
edge select the centre where a neighbour lies outside (a block-uniform branch).

Checked against NumPy at small odd sizes and the planned program at 512^3, then timed
beside the planned program (two recompute kernels) and torch.compile.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/walk3d_probe.py [--shapes WYxRxPFxZCHUNK ...]
"""

from __future__ import annotations

import argparse

import numpy as np

SOURCE = r"""
#ifndef WY
#define WY 16
#endif
#ifndef R
#define R 2
#endif
#ifndef PF
#define PF 2
#endif
#ifndef SKIP
#define SKIP 1
#endif
#define K 4
#define TX 128
#define TY (WY * R)
#define OX (TX - 2 * K)
#define OY (TY - 2 * K)
#define NRING (PF + 2)

struct Queues { float4 q[K][3][R]; };  // level l's plane (slot) at the thread's rows

__device__ __forceinline__ float& col(float4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ float colc(const float4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ float update(float u, float xm, float xp, float ym, float yp,
                                        float zm, float zp, float c) {
  return u + c * ((xm + xp) + (ym + yp) + (zm + zp) - 6.0f * u);
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
__device__ __forceinline__ int clampi(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

// the input plane p (clamped) of the block's tile into ring slot `slot`
__device__ __forceinline__ void fetch(float* ring, int slot, const float* __restrict__ in,
                                      int p, int x0, int y0, int nx, int ny, int nz,
                                      bool aligned) {
  const int z = clampi(p, nz);
  float* plane = ring + slot * (TY * TX);
  const int t = threadIdx.x + 32 * threadIdx.y;
  for (int chunk = t; chunk < TY * TX / 4; chunk += 32 * WY) {
    const int row = chunk / (TX / 4), c4 = (chunk % (TX / 4)) * 4;
    const int y = clampi(y0 + row, ny), x = x0 + c4;
    const float* src = in + ((long long)z * ny + y) * nx;
    float* dst = plane + row * TX + c4;
    if (aligned && x >= 0 && x + 3 < nx) {
      cp_async16(dst, src + x);
    } else {
      for (int j = 0; j < 4; ++j) cp_async4(dst + j, src + clampi(x + j, nx));
    }
  }
}

// Level l at one plane from level l - 1's planes below, at and above it. Clamp borders:
// a neighbour outside the grid is the point itself. Along x (EDGE blocks) a select per row
// at the columns 0 and nx - 1 (x0 is a multiple of 4: column 0 is a thread's first;
// column nx - 1 its last where nx is, else every column of the thread holding it is
// tested); along y the rows are warp-uniform (a branch taken by the edge warps only); along
// z a select per point in EDGE blocks.
template <bool EDGE>
__device__ __forceinline__ void level_step(float4 (&result)[R], const float4 (&below)[R],
                                           const float4 (&centre)[R], const float4 (&above)[R],
                                           const float4& up_row, const float4& down_row,
                                           float c, int xfirst, int yfirst, int plane, int nx,
                                           int ny, int nz) {
  const bool zlo = EDGE && plane == 0, zhi = EDGE && plane == nz - 1;  // (block-uniform)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4 cen = centre[r];
    float left = __shfl_up_sync(0xffffffffu, cen.w, 1);
    float right = __shfl_down_sync(0xffffffffu, cen.x, 1);
    float4 ym = r == 0 ? up_row : centre[r - 1];
    float4 yp = r == R - 1 ? down_row : centre[r + 1];
    if (EDGE) {
      left = xfirst == 0 ? cen.x : left;
      right = xfirst + 3 == nx - 1 ? cen.w : right;
      if (yfirst + r == 0) ym = cen;        // (warp-uniform)
      if (yfirst + r == ny - 1) yp = cen;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float u = colc(cen, j);
      float xm = j == 0 ? left : colc(cen, j - 1);
      float xp = j == 3 ? right : colc(cen, j + 1);
      if (EDGE && (nx & 3) && j < 3) xp = xfirst + j == nx - 1 ? u : xp;
      const float zm = zlo ? u : colc(below[r], j), zp = zhi ? u : colc(above[r], j);
      col(result[r], j) = update(u, xm, xp, colc(ym, j), colc(yp, j), zm, zp, c);
    }
  }
}

// One iteration: input plane p arrives; level l computes plane p - l. S = iteration % 3.
template <int S, bool EDGE>
__device__ __forceinline__ void iteration(Queues& s, float* ring, float* edges,
                                          const float* __restrict__ in, float* __restrict__ out,
                                          int it, int p, int iterations, int x0, int y0,
                                          int zbeg, int zend, int nx, int ny, int nz, float c,
                                          bool aligned, bool store_vec) {
  constexpr int NEW = S, OLD1 = (S + 2) % 3, OLD2 = (S + 1) % 3;  // p, p-1, p-2 of each queue
  const int lane = threadIdx.x, wy = threadIdx.y;
  const int row0 = wy * R, xfirst = x0 + 4 * lane, yfirst = y0 + row0;
  if (it + PF < iterations) cp_wait<PF - 1>(); else cp_wait<0>();
  __syncthreads();
  if (it + PF < iterations) {
    fetch(ring, (it + PF) % NRING, in, p + PF, x0, y0, nx, ny, nz, aligned);
  }
  cp_commit();
  // level 0: plane p from the ring into the registers
  const float* plane = ring + (it % NRING) * (TY * TX);
#pragma unroll
  for (int r = 0; r < R; ++r)
    s.q[0][NEW][r] = *reinterpret_cast<const float4*>(plane + (row0 + r) * TX + 4 * lane);
  const int up = row0 > 0 ? row0 - 1 : 0, down = row0 + R < TY ? row0 + R : TY - 1;
  // level 1 at p - 1 from the input: rows beside from the ring's plane p - 1
  {
    const float* mid = ring + ((it + NRING - 1) % NRING) * (TY * TX);
    const float4 u_row = *reinterpret_cast<const float4*>(mid + up * TX + 4 * lane);
    const float4 d_row = *reinterpret_cast<const float4*>(mid + down * TX + 4 * lane);
    level_step<EDGE>(s.q[1][NEW], s.q[0][OLD2], s.q[0][OLD1], s.q[0][NEW], u_row, d_row, c,
                   xfirst, yfirst, p - 1, nx, ny, nz);
  }
  float* publish = edges + (it & 1) * ((K - 1) * TY * TX);
  const float* read = edges + ((it + 1) & 1) * ((K - 1) * TY * TX);
  // levels 2 .. K at p - l: the rows beside from what level l - 1 published last iteration
#pragma unroll
  for (int l = 2; l <= K; ++l) {
    // a warp whose rows lie in the tile's halo deeper than level l skips it (warp-uniform)
    if (SKIP && (row0 + R - 1 < l || row0 >= TY - l)) continue;
    const float* prev = read + (l - 2) * TY * TX;
    const float4 u_row = *reinterpret_cast<const float4*>(prev + up * TX + 4 * lane);
    const float4 d_row = *reinterpret_cast<const float4*>(prev + down * TX + 4 * lane);
    if (l < K) {
      level_step<EDGE>(s.q[l][NEW], s.q[l - 1][OLD2], s.q[l - 1][OLD1], s.q[l - 1][NEW],
                     u_row, d_row, c, xfirst, yfirst, p - l, nx, ny, nz);
    } else {
      float4 result[R];
      level_step<EDGE>(result, s.q[l - 1][OLD2], s.q[l - 1][OLD1], s.q[l - 1][NEW],
                     u_row, d_row, c, xfirst, yfirst, p - l, nx, ny, nz);
      const int z = p - K;
      if (z >= zbeg && z < zend && lane >= 1 && lane <= 30) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int y = yfirst + r;
          if (row0 + r >= K && row0 + r < TY - K && y < ny) {
            float* dst = out + ((long long)z * ny + y) * nx + xfirst;
            if (store_vec && xfirst + 3 < nx) {
              *reinterpret_cast<float4*>(dst) = result[r];
            } else {
              for (int j = 0; j < 4; ++j) if (xfirst + j < nx) dst[j] = col(result[r], j);
            }
          }
        }
      }
    }
  }
  // publish levels 1 .. K-1 of this iteration (read by the next)
#pragma unroll
  for (int l = 1; l < K; ++l) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      *reinterpret_cast<float4*>(publish + (l - 1) * TY * TX + (row0 + r) * TX + 4 * lane) =
          s.q[l][NEW][r];
  }
}

template <bool EDGE>
__device__ __forceinline__ void walk(float* ring, float* edges, const float* __restrict__ in,
                                     float* __restrict__ out, int x0, int y0, int zbeg,
                                     int zend, int nx, int ny, int nz, float c, bool aligned,
                                     bool store_vec) {
  Queues s;
  const int first = zbeg - K, iterations = (zend - zbeg) + 2 * K;
  for (int k = 0; k < PF; ++k) {
    fetch(ring, k, in, first + k, x0, y0, nx, ny, nz, aligned);
    cp_commit();
  }
  int it = 0;
  for (; it + 3 <= iterations; it += 3) {
    iteration<0, EDGE>(s, ring, edges, in, out, it, first + it, iterations, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, store_vec);
    iteration<1, EDGE>(s, ring, edges, in, out, it + 1, first + it + 1, iterations, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, store_vec);
    iteration<2, EDGE>(s, ring, edges, in, out, it + 2, first + it + 2, iterations, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, store_vec);
  }
  if (it < iterations)
    iteration<0, EDGE>(s, ring, edges, in, out, it, first + it, iterations, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, store_vec);
  if (it + 1 < iterations)
    iteration<1, EDGE>(s, ring, edges, in, out, it + 1, first + it + 1, iterations, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, store_vec);
}

extern "C" __global__ void __launch_bounds__(32 * WY, 1)
heat_walk(const float* __restrict__ in, float* __restrict__ out, int nx, int ny, int nz,
          float c, int zchunk) {
  extern __shared__ __align__(16) float shared[];
  float* ring = shared;
  float* edges = shared + NRING * TY * TX;
  const int x0 = blockIdx.x * OX - K, y0 = blockIdx.y * OY - K;
  const int zbeg = blockIdx.z * zchunk, zend = min(nz, zbeg + zchunk);
  const bool aligned = (nx % 4) == 0;
  const bool edge = x0 < 0 || y0 < 0 || x0 + TX > nx || y0 + TY > ny || zbeg - K < 0 || zend + K > nz;
  if (edge) walk<true>(ring, edges, in, out, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, aligned);
  else walk<false>(ring, edges, in, out, x0, y0, zbeg, zend, nx, ny, nz, c, aligned, aligned);
}
"""


def shared_bytes(wy: int, r: int, pf: int) -> int:
    ty = wy * r
    return 4 * ty * 128 * ((pf + 2) + 2 * 3)


def kernel(wy: int, r: int, pf: int):
    import cupy
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17", f"-DWY={wy}", f"-DR={r}",
                                                  f"-DPF={pf}"))
    function = module.get_function("heat_walk")
    function.max_dynamic_shared_size_bytes = shared_bytes(wy, r, pf)
    return function


def launcher(wy: int, r: int, pf: int, zchunk: int, shape, c: float):
    import cupy
    function = kernel(wy, r, pf)
    nz, ny, nx = shape
    grid = (-(-nx // (128 - 8)), -(-ny // (wy * r - 8)), -(-nz // zchunk))

    def run(u, out):
        function(grid, (32, wy, 1), (u, out, np.int32(nx), np.int32(ny), np.int32(nz),
                                     np.float32(c), np.int32(zchunk)),
                 shared_mem=shared_bytes(wy, r, pf))
        return out
    run.registers = function.num_regs
    run.local = function.local_size_bytes
    run.out = lambda: cupy.empty(shape, dtype=cupy.float32)
    return run


def main() -> None:
    import cupy

    from kfuse.apps import get_app
    from kfuse.model.device import current_profile
    from kfuse.search import default_plan
    from kfuse.tune.timing import print_rounds, time_alternating

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["16x2x2x128", "16x2x2x64", "8x4x2x128"])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--profile", action="store_true",
                        help="no checks or timing: each shape run once at --size (for ncu)")
    args = parser.parse_args()
    if args.profile:
        size = (args.size,) * 3
        u = cupy.asarray(np.random.default_rng(0).standard_normal(size).astype(np.float32))
        for wy, r, pf, zchunk in (tuple(int(v) for v in t.split("x")) for t in args.shapes):
            run = launcher(wy, r, pf, zchunk, size, 0.1)
            run(u, run.out())
        cupy.cuda.Device().synchronize()
        return
    app = get_app("heat3d")
    pipeline = app.build()
    c = 0.1
    rng = np.random.default_rng(0)
    configs = [tuple(int(v) for v in text.split("x")) for text in args.shapes]
    # correctness at small odd sizes against the NumPy reference
    for shape in ((37, 45, 131), (9, 30, 250), (20, 64, 128)):
        u = rng.standard_normal(shape).astype(np.float32)
        want = app.reference({"u0": u}, {"c": c})["u4"]
        for wy, r, pf, zchunk in configs:
            run = launcher(wy, r, pf, min(zchunk, 7), shape, c)
            got = cupy.asnumpy(run(cupy.asarray(u), run.out()))
            error = np.abs(got - want).max() / np.abs(want).max()
            print(f"check {shape} {wy}x{r}x{pf}: error {error:.1e}", flush=True)
    size = (args.size,) * 3
    u = cupy.asarray(rng.standard_normal(size).astype(np.float32))
    graph = pipeline.graph()
    profile = current_profile()
    plan = default_plan(graph, sizes=graph.bind_shapes({"u0": size}), profile=profile)
    fused = pipeline.compile(backend="cuda", plan=plan)
    want = fused(u0=u, c=c)["u4"]
    floor = 2 * u.nbytes / profile.copy_bandwidth_bytes_per_s
    print(f"== heat3d {size}: planned {[g.form.text() for g in plan.groups]}, "
          f"floor {floor * 1e3:.4f} ms", flush=True)
    labels = {"planned": lambda: fused(u0=u, c=c)}
    for wy, r, pf, zchunk in configs:
        run = launcher(wy, r, pf, zchunk, size, c)
        out = run.out()
        run(u, out)
        error = float(cupy.abs(out - want).max() / cupy.abs(want).max())
        print(f"walk {wy}x{r}x{pf}x{zchunk}: registers {run.registers} local {run.local}, "
              f"error {error:.1e}", flush=True)
        if error < 1e-5:
            labels[f"walk {wy}x{r}x{pf}x{zchunk}"] = lambda run=run, out=out: run(u, out)
    from kfuse.bench.torch_baseline import compiled_on
    labels["compile"] = compiled_on(graph, {"u0": u, "c": c})
    times = time_alternating(labels, args.rounds, repeat=args.runs)
    print_rounds("heat3d", times, "planned")


if __name__ == "__main__":
    main()
