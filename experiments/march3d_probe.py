"""diffusion3d by threads that march along z with their planes in registers (GPU probe).

The generated 3-D kernel gives each thread a tile of 8 planes x 2 rows x 4 columns and
reads, for it, 12 planes of the input (two steps of halo above and below) and computes the
intermediate on 10. Here each thread owns 4 columns x TY rows and walks CZ planes: each
step loads one new input plane (its rows as aligned vectors, the halo columns as scalars,
all row offsets computed once), computes the intermediate on one plane (the thread's rows
and columns grown by one) and the output on one plane; the planes below and above stay in
registers. Clamp borders only (the app's default), with Qiao 2021's index exchange: an
intermediate outside the volume takes the value at the clamped point. Checked against the
planned program, then timed beside it and torch.compile in alternating rounds.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/march3d_probe.py [--rounds 5] [--runs 30] [--shapes TYxBXxBYxCZ[xDEPTH] ...]
        [--generated PLANESxAHEAD[xNEWEST][:FALLBACK_TILE] ...]
"""

from __future__ import annotations

import argparse

COMMON = r"""
struct Plane {           // one input plane around the thread's TY x 4 points
  float4 v[TY + 4];      // rows -2 .. TY+1, the thread's 4 columns
  float l1[TY + 2], r1[TY + 2];  // columns -1 and 4, rows -1 .. TY
  float l2[TY], r2[TY];          // columns -2 and 5, rows 0 .. TY-1
};
struct Mid {             // the intermediate on one plane, the thread's points grown by one
  float c[TY + 2][4];    // rows -1 .. TY, the thread's columns
  float l[TY], r[TY];    // columns -1 and 4, the thread's rows
};

__device__ __forceinline__ float at(const float4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
__device__ __forceinline__ float step(float u, float zm, float zp, float ym, float yp,
                                      float xm, float xp, float c) {
  const float total = zm + zp + ym + yp + xm + xp;
  return u + c * (total - 6.0f * u);
}

__device__ __forceinline__ void mid(Mid& m, const Plane& b, const Plane& p, const Plane& a, float c) {
#pragma unroll
  for (int s = -1; s <= TY; ++s) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float xm = j > 0 ? at(p.v[s + 2], j - 1) : p.l1[s + 1];
      const float xp = j < 3 ? at(p.v[s + 2], j + 1) : p.r1[s + 1];
      m.c[s + 1][j] = step(at(p.v[s + 2], j), at(b.v[s + 2], j), at(a.v[s + 2], j),
                           at(p.v[s + 1], j), at(p.v[s + 3], j), xm, xp, c);
    }
  }
#pragma unroll
  for (int s = 0; s < TY; ++s) {
    m.l[s] = step(p.l1[s + 1], b.l1[s + 1], a.l1[s + 1], p.l1[s], p.l1[s + 2], p.l2[s], p.v[s + 2].x, c);
    m.r[s] = step(p.r1[s + 1], b.r1[s + 1], a.r1[s + 1], p.r1[s], p.r1[s + 2], p.v[s + 2].w, p.r2[s], c);
  }
}

// one step: the intermediate on plane j + 1, the output on plane j (from j >= k0)
#define MARCH_STEP()                                                                 \
    mid(n, b, p, a, c);  /* the intermediate on plane j + 1 */                        \
_Pragma("unroll")                                                                                   \
    for (int s = 0; s < TY; ++s) {  /* index exchange at the volume's sides */        \
      if (left) n.l[s] = n.c[s + 1][0];                                                             \
      if (right) n.r[s] = n.c[s + 1][3];                                                            \
    }                                                                                               \
_Pragma("unroll")                                                                                   \
    for (int q = 0; q < 4; ++q) {                                                                   \
      if (top) n.c[0][q] = n.c[1][q];                                                               \
      if (bottom) n.c[TY + 1][q] = n.c[TY][q];                                                      \
    }                                                                                               \
    if (j + 1 == N) n = cur;   /* plane N is plane N - 1 */                           \
    if (j + 1 == 0) cur = n;   /* plane -1 is plane 0 */                              \
    if (j >= k0) {             /* the output on plane j */                            \
      float* out = u2 + (size_t)j * plane_size;                                                     \
_Pragma("unroll")                                                                                   \
      for (int s = 0; s < TY; ++s) {                                                                \
        float o[4];                                                                                 \
_Pragma("unroll")                                                                                   \
        for (int q = 0; q < 4; ++q) {                                                               \
          const float xm = q > 0 ? cur.c[s + 1][q - 1] : cur.l[s];                                  \
          const float xp = q < 3 ? cur.c[s + 1][q + 1] : cur.r[s];                                  \
          o[q] = step(cur.c[s + 1][q], below[s][q], n.c[s + 1][q], cur.c[s][q], cur.c[s + 2][q],    \
                      xm, xp, c);                                                                   \
        }                                                                                           \
        *reinterpret_cast<float4*>(out + (iy + s) * N + ix) = make_float4(o[0], o[1], o[2], o[3]);  \
      }                                                                                             \
    }                                                                                               \
_Pragma("unroll")                                                                                   \
    for (int s = 0; s < TY; ++s)                                                                    \
_Pragma("unroll")                                                                                   \
      for (int q = 0; q < 4; ++q) below[s][q] = cur.c[s + 1][q];                                    \
    cur = n;
"""

KERNEL = r"""
#ifndef N
#define N 512
#endif
__device__ __forceinline__ int clampi(int i) { return i < 0 ? 0 : (i >= N ? N - 1 : i); }
// COMMON

__device__ __forceinline__ void load(Plane& p, const float* __restrict__ plane,
    const int* row, int cm2, int cm1, int cp4, int cp5, int ix) {
#pragma unroll
  for (int r = 0; r < TY + 4; ++r) p.v[r] = __ldg(reinterpret_cast<const float4*>(plane + row[r] + ix));
#pragma unroll
  for (int r = 0; r < TY + 2; ++r) { p.l1[r] = __ldg(plane + row[r + 1] + cm1); p.r1[r] = __ldg(plane + row[r + 1] + cp4); }
#pragma unroll
  for (int r = 0; r < TY; ++r) { p.l2[r] = __ldg(plane + row[r + 2] + cm2); p.r2[r] = __ldg(plane + row[r + 2] + cp5); }
}

extern "C" __global__ void __launch_bounds__(BX * BY) march(const float* __restrict__ u0,
                                                            float* __restrict__ u2, const float c) {
  const int ix = (blockIdx.x * BX + threadIdx.x) * 4;
  const int iy = (blockIdx.y * BY + threadIdx.y) * TY;
  const int k0 = blockIdx.z * CZ;
  int row[TY + 4];
#pragma unroll
  for (int r = 0; r < TY + 4; ++r) row[r] = clampi(iy - 2 + r) * N;
  const int cm2 = clampi(ix - 2), cm1 = clampi(ix - 1), cp4 = clampi(ix + 4), cp5 = clampi(ix + 5);
  const bool top = iy == 0, bottom = iy + TY == N, left = ix == 0, right = ix + 4 == N;
  const size_t plane_size = (size_t)N * N;
  Plane b, p, a, next;
  load(b, u0 + clampi(k0 - 2) * plane_size, row, cm2, cm1, cp4, cp5, ix);
  load(p, u0 + clampi(k0 - 1) * plane_size, row, cm2, cm1, cp4, cp5, ix);
  load(a, u0 + clampi(k0) * plane_size, row, cm2, cm1, cp4, cp5, ix);
  Mid cur, n;
  float below[TY][4];
#pragma unroll 1
  for (int j = k0 - 2; j < k0 + CZ; ++j) {
    load(next, u0 + clampi(j + 3) * plane_size, row, cm2, cm1, cp4, cp5, ix);
    MARCH_STEP();
    b = p; p = a; a = next;
  }
}
"""

SMEM_KERNEL = r"""
#ifndef N
#define N 512
#endif
#define X (4 * BX)            // the block's columns
#define Y (TY * BY)           // the block's rows
#define PITCH (X + 8)         // a staged row: one float4 of halo each side
#define PLANE ((Y + 4) * PITCH)
#define CHUNKS ((Y + 4) * (PITCH / 4))
#define PER_THREAD ((CHUNKS + BX * BY - 1) / (BX * BY))
__device__ __forceinline__ int clampi(int i) { return i < 0 ? 0 : (i >= N ? N - 1 : i); }
#if defined(__CUDACC__)
__device__ __forceinline__ void copy16(float* shared, const float* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::
               "r"((unsigned)__cvta_generic_to_shared(shared)), "l"(global) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int P> __device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;" :: "n"(P) : "memory");
}
#else
inline void copy16(float* shared, const float* global) { memcpy(shared, global, 16); }
inline void commit() {}
template <int P> inline void wait_pending() {}
#endif
// COMMON

extern "C" __global__ void __launch_bounds__(BX * BY) march_smem(const float* __restrict__ u0,
                                                                 float* __restrict__ u2, const float c) {
#if defined(__CUDACC__)
  extern __shared__ __align__(16) float ring[];  // DEPTH * PLANE floats
#else
  __shared__ __align__(16) float ring[DEPTH * PLANE];
#endif
  const int thread = threadIdx.y * BX + threadIdx.x;
  const int ix0 = blockIdx.x * X, iy0 = blockIdx.y * Y;
  const int ix = ix0 + threadIdx.x * 4, iy = iy0 + threadIdx.y * TY;
  const int k0 = blockIdx.z * CZ;
  const bool top = iy == 0, bottom = iy + TY == N, left = ix == 0, right = ix + 4 == N;
  const size_t plane_size = (size_t)N * N;
  // the chunks this thread copies: offset in a plane and in a staged plane (-1: none)
  int chunk_global[PER_THREAD], chunk_shared[PER_THREAD];
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) {
    const int chunk = thread + i * BX * BY, r = chunk / (PITCH / 4), k = chunk % (PITCH / 4);
    const int col = ix0 + 4 * (k - 1);
    const bool valid = chunk < CHUNKS && col >= 0 && col < N;
    chunk_global[i] = clampi(iy0 - 2 + r) * N + col;
    chunk_shared[i] = valid ? r * PITCH + 4 * k : -1;
  }
  auto issue = [&](int q) {  // plane q into its slot
    if (q <= k0 + CZ + 1) {
      const float* plane = u0 + clampi(q) * plane_size;
      float* slot = ring + ((q - k0 + 2) % DEPTH) * PLANE;
#pragma unroll
      for (int i = 0; i < PER_THREAD; ++i)
        if (chunk_shared[i] >= 0) copy16(slot + chunk_shared[i], plane + chunk_global[i]);
    }
    commit();
  };
  auto take = [&](Plane& p, int q) {  // wait for plane q, read the thread's part, ask for the next
    wait_pending<DEPTH - 2>();
    __syncthreads();
    const float* slot = ring + ((q - k0 + 2) % DEPTH) * PLANE + threadIdx.y * TY * PITCH + 4 * threadIdx.x;
#pragma unroll
    for (int r = 0; r < TY + 4; ++r) {
      p.v[r] = *reinterpret_cast<const float4*>(slot + r * PITCH + 4);
    }
#pragma unroll
    for (int r = 0; r < TY + 2; ++r) {
      const float4 lv = *reinterpret_cast<const float4*>(slot + (r + 1) * PITCH);
      const float4 rv = *reinterpret_cast<const float4*>(slot + (r + 1) * PITCH + 8);
      p.l1[r] = left ? p.v[r + 1].x : lv.w;
      p.r1[r] = right ? p.v[r + 1].w : rv.x;
      if (r >= 1 && r <= TY) {
        p.l2[r - 1] = left ? p.v[r + 1].x : lv.z;
        p.r2[r - 1] = right ? p.v[r + 1].w : rv.y;
      }
    }
    issue(q + DEPTH - 1);
  };
#pragma unroll
  for (int d = 0; d < DEPTH - 1; ++d) issue(k0 - 2 + d);
  Plane b, p, a;
  take(b, k0 - 2);
  take(p, k0 - 1);
  Mid cur, n;
  float below[TY][4];
#pragma unroll 1
  for (int j = k0 - 2; j < k0 + CZ; ++j) {
    take(a, j + 2);
    MARCH_STEP();
    b = p; p = a;
  }
}
"""


def march_kernel(shape: str):
    """The marching kernel for ``shape``: ``TYxBXxBYxCZ`` (planes in registers) or
    ``TYxBXxBYxCZxDEPTH`` (planes staged in shared memory, ``DEPTH`` in flight): ``TY`` rows
    per thread, blocks of ``BX`` x ``BY`` threads, ``CZ`` planes per block."""
    import cupy

    values = [int(v) for v in shape.split("x")]
    names = ("TY", "BX", "BY", "CZ", "DEPTH")
    source = "".join(f"#define {k} {v}\n" for k, v in zip(names, values, strict=False))
    staged = len(values) == 5
    module = cupy.RawModule(code=source + (SMEM_KERNEL if staged else KERNEL).replace(
        "// COMMON", COMMON),
                            options=("-std=c++17",))
    kernel = module.get_function("march_smem" if staged else "march")
    shared = 0
    if staged:
        ty, bx, by, _, depth = values
        shared = depth * (ty * by + 4) * (4 * bx + 8) * 4
        kernel.max_dynamic_shared_size_bytes = shared
    return kernel, values[:4], shared


def main() -> None:
    import cupy
    import numpy as np

    from kfuse.bench.experiment import device_case, planned_program, planned_run, run_checked
    from kfuse.bench.torch_baseline import compiled_on
    from kfuse.codegen import generate
    from kfuse.config import configured
    from kfuse.runtime import get_backend
    from kfuse.schedule.tiles import REGISTER_TILES
    from kfuse.tune.timing import print_rounds, time_alternating

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--shapes", nargs="*", default=["2x32x4x32", "2x32x4x64", "4x32x4x32",
                                                        "2x32x8x32", "2x64x2x32", "1x32x8x32"])
    parser.add_argument("--generated", nargs="*", default=[],
                        help="PLANESxAHEAD[xNEWEST][:FALLBACK_TILE]: the generated kernel "
                             "with chunks of PLANES planes (0: one wave of blocks, as kfuse "
                             "launches it), AHEAD planes copied ahead, intermediates computed "
                             "on their newest plane only (NEWEST 1, the default) or not (0), "
                             "another register tile for sizes marching does not take")
    args = parser.parse_args()
    case = device_case("diffusion3d")  # planned as kfuse plans it (marching on or off)
    backend = get_backend("cuda")
    executable, expected = planned_run(case, backend)
    marches = backend.marches_along_z(case.graph, case.sizes)
    print(f"planned (marching {'on' if marches else 'off'} on this device, tile "
          f"{case.plan.groups[0].tile}): registers", "/".join(str(f.num_regs) for f in executable.functions.values()),
          flush=True)
    u0, c = case.given["u0"], np.float32(case.given["c"])
    out = cupy.empty_like(expected["u2"])
    labels = {"compile": compiled_on(case.graph, case.given), "planned": executable.launch_all}
    tile = REGISTER_TILES[("recompute", 3)]
    groups = [group.with_tile(tile) for group in case.plan.kernel_groups]
    with configured(march=False):  # the register tiles alone
        tiles, error, registers = run_checked(backend, case, generate(
            case.graph, groups, fixed_sizes=case.sizes), expected)
    print(f"register tiles: error {error:.1e}, registers {registers}", flush=True)
    labels["tiles"] = tiles.launch_all
    for shape in args.generated:  # the generated kernel with other chunks and copies ahead
        spec, _, fallback = shape.partition(":")
        planes, ahead, *newest = (int(v) for v in spec.split("x"))
        switches = {"march": True, "march_prefetch": ahead,
                    "march_newest_planes_only": bool(newest[0]) if newest else True}
        if planes:  # chunks of this many planes, not one wave of blocks
            switches.update(march_planes=planes, march_least_planes=1)
        with configured(**switches):
            program = planned_program(case)
            if fallback:  # another register tile for the sizes the marching path does not take
                tile = tuple(int(v) for v in fallback.split("x"))
                groups = [group.with_tile(tile) for group in case.plan.kernel_groups]
                program = generate(case.graph, groups, fixed_sizes=case.sizes)
        other, error, registers = run_checked(backend, case, program, expected)
        print(f"generated {shape}: error {error:.1e}, registers {registers}", flush=True)
        if error < 1e-6:
            labels[f"generated {shape}"] = other.launch_all
    for shape in args.shapes:
        kernel, (ty, bx, by, cz), shared = march_kernel(shape)
        grid = (512 // (4 * bx), 512 // (ty * by), 512 // cz)

        def launch(kernel=kernel, grid=grid, block=(bx, by, 1), shared=shared):
            kernel(grid, block, (u0, out, c), shared_mem=shared)

        out.fill(float("nan"))
        launch()
        error = float(cupy.abs(out - expected["u2"]).max() / cupy.abs(expected["u2"]).max())
        print(f"march {shape}: error {error:.1e}, registers {kernel.num_regs}, "
              f"spill {kernel.local_size_bytes} B", flush=True)
        if error < 1e-6:
            labels[f"march {shape}"] = launch
    print_rounds("diffusion3d", time_alternating(labels, args.rounds, repeat=args.runs), "compile")


if __name__ == "__main__":
    main()
