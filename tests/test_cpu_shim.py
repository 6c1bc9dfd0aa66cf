"""Tests of the CPU shim (kfuse_cpu_shim.h) and the host compiler driver.

Hand-written CUDA C kernels (one per shim feature) are compiled with the host compiler and run
on NumPy buffers through ctypes, then checked against NumPy. Each shim fault switch
(KF_SHIM_FAULT_*) is compiled into the same kernels to prove the matching test can fail.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from kfuse.errors import BackendUnavailable, CompileError
from kfuse.runtime import host_compiler
from kfuse.runtime.host_compiler import compile_host_library, load_host_library

PRELUDE = r"""
#if defined(__CUDACC__)
#define KF_BAR_SYNC(id, count) asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory")
#define KF_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
#include "kfuse_cpu_shim.h"
#endif
"""

KERNELS = r"""
#if !defined(__CUDACC__)
#include <chrono>
#include <thread>
// Delay some threads so that a missing barrier shows up as a wrong result (__nanosleep: on
// OS threads a sleep, with fibers a switch to the next one).
#define KT_JITTER(t)                                                           \
  do {                                                                         \
    if ((((unsigned)(t)) * 2654435761u >> 9) % 5u == 0u) __nanosleep(40000);   \
  } while (0)
#else
#define KT_JITTER(t) do { } while (0)
#endif

// ---- __syncthreads: block-wide reversal, tree reduction, count/and/or ---------------------
__global__ void k_reverse(const float* __restrict__ in, float* __restrict__ out) {
  __shared__ float s[256];
  const int t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
  KT_JITTER(g);
  s[t] = in[g];
  __syncthreads();
  out[g] = s[blockDim.x - 1 - t];
}

__global__ void k_tree_sum(const float* in, float* out) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    KT_JITTER(t + 7 * stride);
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

__global__ void k_sync_votes(const int* flags, int* out) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const int f = flags[g];
  out[3 * g + 0] = __syncthreads_count(f & 1);
  out[3 * g + 1] = __syncthreads_and(f & 2);
  out[3 * g + 2] = __syncthreads_or(f & 4);
}

// ---- __shared__: one instance per block, also inside __device__ functions -------------------
__device__ int kt_block_sum(int v) {
  __shared__ int part[256];
  const int t = threadIdx.x;
  part[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    __syncthreads();
  }
  const int total = part[0];
  __syncthreads();
  return total;
}

__global__ void k_shared_scope(const int* in, int* out) {
  __shared__ int token;
  __shared__ int counter;
  const int t = threadIdx.x, b = blockIdx.x, g = b * blockDim.x + t;
  if (t == 0) {
    token = in[g] * 3 + b;
    counter = 0;
  }
  __syncthreads();
  KT_JITTER(g);
  atomicAdd(&counter, 1);
  const int total = kt_block_sum(in[g]);
  out[3 * g + 0] = token;
  out[3 * g + 1] = counter;
  out[3 * g + 2] = total;
}

// ---- dynamic shared memory ---------------------------------------------------------------------
__global__ void k_dynamic(const float* in, float* out, unsigned* probe, int* aligned) {
  KF_DYNAMIC_SHARED(float, smem);
  const int n = blockDim.x, t = threadIdx.x, g = blockIdx.x * n + t;
#if !defined(__CUDACC__)
  probe[g] = reinterpret_cast<unsigned*>(smem)[n + t];  // never written yet in this block
#endif
  __syncthreads();
  smem[t] = in[g];
  smem[n + t] = 2.0f * in[g];
  __syncthreads();
  out[g] = smem[n - 1 - t] + smem[2 * n - 1 - (t + 1) % n];
  if (t == 0) aligned[blockIdx.x] = (reinterpret_cast<unsigned long long>(smem) % 16ull) == 0;
}

// ---- atomics on global and shared memory ----------------------------------------------------
__global__ void k_atomics(const int* vals, int* icnt, float* fcnt, double* dcnt,
                          unsigned long long* ucnt, int* imax, unsigned* umin,
                          long long* lmax, unsigned* bits, int* isub, float* fcas,
                          unsigned* hist_out, int* exch_prev, int* exch, unsigned* wrap) {
  __shared__ unsigned hist[16];
  const int t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
  if (t < 16) hist[t] = 0u;
  __syncthreads();
  for (int i = 0; i < 16; ++i) {
    const int v = vals[g * 16 + i];
    const int c = (g + i) % 7;
    atomicAdd(&icnt[c], v);
    atomicAdd(&fcnt[c], 0.25f * (float)v);
    atomicAdd(&dcnt[c], 0.5 * (double)v);
    atomicAdd(&ucnt[c], (unsigned long long)(v + 1000) << 20);
    atomicMax(&imax[c], v * 1000 + g);
    atomicMin(&umin[c], (unsigned)v * 2654435761u);
    atomicMax(&lmax[c], (long long)v * 4000000000ll);
    atomicOr(&bits[c], 1u << (v & 31));
    atomicXor(&bits[7 + c], (unsigned)v * 40503u);
    atomicAnd(&bits[14 + c], ~(1u << ((v >> 5) & 31)));
    atomicSub(&isub[c], v);
    unsigned* addr = reinterpret_cast<unsigned*>(&fcas[c]);
    unsigned old = *addr, assumed;
    do {
      assumed = old;
      old = atomicCAS(addr, assumed, __float_as_uint(__uint_as_float(assumed) + 0.5f * v));
    } while (old != assumed);
    atomicAdd(&hist[v & 15], 1u);
    atomicInc(wrap, 9u);
  }
  exch_prev[g] = atomicExch(exch, g);
  __syncthreads();
  if (t < 16) atomicAdd(&hist_out[t], hist[t]);
}

// ---- warp shuffles and votes ---------------------------------------------------------------------
__global__ void k_shuffle(const float* fin, const int* iin, const double* din, float* o_down,
                          int* o_xor, unsigned* o_up8, long long* o_up, double* o_idx,
                          double* o_idx16, unsigned long long* o_xor8, unsigned* o_ballot,
                          int* o_vote) {
  const unsigned full = 0xffffffffu;
  const int t = threadIdx.x, g = blockIdx.x * blockDim.x + t, lane = t % 32;
  KT_JITTER(g);
  float f = fin[g];
  for (int off = 16; off > 0; off >>= 1) f += __shfl_down_sync(full, f, off);
  o_down[g] = f;
  int x = iin[g];
  for (int m = 1; m < 32; m <<= 1) x += __shfl_xor_sync(full, x, m);
  o_xor[g] = x;
  unsigned u = (unsigned)iin[g];
  for (int d = 1; d < 8; d <<= 1) u += __shfl_up_sync(full, u, d, 8);
  o_up8[g] = u;
  long long ll = (long long)iin[g] * 1000003ll;
  for (int d = 1; d < 32; d <<= 1) ll += __shfl_up_sync(full, ll, d);
  o_up[g] = ll;
  const double dv = din[g];
  o_idx[g] = __shfl_sync(full, dv, (lane * 5 + 3) & 31);
  o_idx16[g] = __shfl_sync(full, dv, lane * 3 + 1, 16);
  const unsigned long long q = (unsigned long long)(unsigned)iin[g] * 0x9E3779B97F4A7C15ull;
  o_xor8[g] = __shfl_xor_sync(full, q, 8, 8) + 3ull * __shfl_xor_sync(full, q, 5, 8);
  o_ballot[g] = __ballot_sync(full, fin[g] > 0.0f);
  __syncwarp();
  o_vote[g] = (__any_sync(full, iin[g] % 61 == 0) ? 1 : 0) |
              (__all_sync(full, fin[g] > -0.95f) ? 2 : 0);
}

// A block of 48 threads: warp 1 has 16 lanes.
__global__ void k_partial_warp(const float* in, unsigned* out) {
  const int t = threadIdx.x;
  const unsigned active = __activemask();
  out[3 * t + 0] = active;
  out[3 * t + 1] = __ballot_sync(active, in[t] > 0.0f);
  out[3 * t + 2] = __shfl_down_sync(active, (unsigned)t * 10u, 1);
}

// ---- named partial barriers ----------------------------------------------------------------------
// Two independent groups of 64 threads, each with its own barrier id and round count.
__global__ void k_named_groups(const int* in, int* out) {
  __shared__ int buf[128];
  const int t = threadIdx.x, grp = t / 64, k = t % 64;
  const int g = blockIdx.x * blockDim.x + t;
  int v = in[g];
  const int rounds = 3 + 2 * grp;
  for (int r = 0; r < rounds; ++r) {
    KT_JITTER(g + 131 * r);
    buf[t] = v;
    KF_BAR_SYNC(1 + grp, 64);
    v = buf[grp * 64 + (k + 1) % 64] + r;
    KF_BAR_SYNC(1 + grp, 64);
  }
  out[g] = v;
}

// Producer warps 0-1 fill a stage buffer, consumer warps 2-3 drain it: barrier 1 = "full",
// barrier 2 = "empty".
__global__ void k_named_pipeline(const float* in, float* out, int iters) {
  __shared__ float stage[64];
  const int t = threadIdx.x, k = t % 64;
  const bool producer = t < 64;
  float acc = 0.0f;
  for (int it = 0; it < iters; ++it) {
    if (producer) {
      KT_JITTER(t + 64 * it);
      stage[k] = in[(blockIdx.x * iters + it) * 64 + k] * (float)(it + 1);
      KF_BAR_SYNC(1, 128);
      KF_BAR_SYNC(2, 128);
    } else {
      KF_BAR_SYNC(1, 128);
      KT_JITTER(t + 64 * it);
      acc += stage[63 - k];
      KF_BAR_SYNC(2, 128);
    }
  }
  if (!producer) out[blockIdx.x * 64 + k] = acc;
}

// Only one warp reaches a barrier that waits for two: must abort, not hang.
__global__ void k_deadlock() {
  if (threadIdx.x < 32) KF_BAR_SYNC(3, 64);
}

// ---- threads returning early -------------------------------------------------------------------
__global__ void k_early_exit(const float* in, float* out, int n) {
  __shared__ float s[128];
  const int t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
  if (g >= n) {
#if !defined(__CUDACC__)
    __nanosleep(2000000);  // others wait already
#endif
    return;
  }
  s[t] = in[g];
  __syncthreads();
  const int valid = min(n - (int)(blockIdx.x * blockDim.x), (int)blockDim.x);
  const float v = s[valid - 1 - t];
  __syncthreads();
  s[t] = 2.0f * v;
  const int positive = __syncthreads_count(v > 0.0f);
  out[g] = s[(t + 1) % valid] + (float)positive;
}

// ---- 2-D and 3-D blocks and grids -----------------------------------------------------------------
#define KT_TILE 16
__global__ void k_transpose(const float* __restrict__ in, float* __restrict__ out, int rows,
                            int cols) {
  __shared__ float tile[KT_TILE][KT_TILE + 1];
  int x = blockIdx.x * KT_TILE + threadIdx.x;
  int y = blockIdx.y * KT_TILE + threadIdx.y;
  KT_JITTER(threadIdx.y * KT_TILE + threadIdx.x + 3 * blockIdx.x);
  for (int j = 0; j < KT_TILE; j += blockDim.y)
    if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * KT_TILE + threadIdx.x;
  y = blockIdx.x * KT_TILE + threadIdx.y;
  for (int j = 0; j < KT_TILE; j += blockDim.y)
    if (x < rows && y + j < cols) out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

__global__ void k_index3d(int* out, int nx, int ny, int nz) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int z = blockIdx.z * blockDim.z + threadIdx.z;
  const int lid = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  const int next = __shfl_down_sync(0xffffffffu, lid, 1);  // warps are 32 consecutive lids
  if (x < nx && y < ny && z < nz) {
    int* o = out + 4 * ((z * ny + y) * nx + x);
    o[0] = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    o[1] = lid;
    o[2] = next;
    o[3] = (blockDim.x * 100 + blockDim.y * 10 + blockDim.z) * 1000 +
           gridDim.x * 100 + gridDim.y * 10 + gridDim.z;
  }
}

// ---- math helpers --------------------------------------------------------------------------------
__global__ void k_math(const float* in, float* out, int* iout) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = in[g];
  const float a = fabsf(x) + 0.5f;
  out[8 * g + 0] = rsqrtf(a);
  out[8 * g + 1] = __fdividef(x, a);
  out[8 * g + 2] = __expf(x) + __logf(a);
  out[8 * g + 3] = __sinf(x) * __cosf(x);
  out[8 * g + 4] = __saturatef(2.0f * x);
  out[8 * g + 5] = __powf(a, 1.5f) + __fsqrt_rn(a);
  out[8 * g + 6] = fmaxf(x, 0.0f) + fminf(x, 0.0f) + max(x, 0.25f) + min(x, -0.25f);
  out[8 * g + 7] = __int_as_float(__float_as_int(x)) + (float)__double_as_longlong(0.0);
  iout[2 * g + 0] = min(g, 37) + max((unsigned)g, 40u) + (int)max(-3ll, (long long)g);
  iout[2 * g + 1] = (int)(__float_as_uint(__ldg(&in[g])) >> 1) - (int)__float_as_uint(1.0f);
}

// ---- how the threads run, per-thread storage, fiber stacks (the shim alone) ----------------------
#if !defined(__CUDACC__)
__global__ void k_os_thread(unsigned long long* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] =
      std::hash<std::thread::id>{}(std::this_thread::get_id());
}

// Counts the blocks each thread ran in this launch: per CUDA thread (a thread_local would be
// shared by a block's fibers).
__global__ void k_per_thread(int* out) {
  int& blocks_seen = kf_cpu::per_thread<int>();
  blocks_seen += 1;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = blocks_seen;
}

// 128 KiB of locals, written from the top down (an overflow meets the guard page first).
__global__ void k_deep_stack(int* out) {
  volatile unsigned char local[128 * 1024];
  for (int i = (int)sizeof(local) - 1; i >= 0; i -= 512) local[i] = (unsigned char)(i >> 9);
  out[threadIdx.x] = local[sizeof(local) - 1 - 512 * threadIdx.x];
}
#endif

// ---- host launchers --------------------------------------------------------------------------------
#if !defined(__CUDACC__)
extern "C" {
int kt_reverse(const float* in, float* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(256), 0, [&] { k_reverse(in, out); });
}
int kt_tree_sum(const float* in, float* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(256), 0, [&] { k_tree_sum(in, out); });
}
int kt_sync_votes(const int* flags, int* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 0, [&] { k_sync_votes(flags, out); });
}
int kt_shared_scope(const int* in, int* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(256), 0, [&] { k_shared_scope(in, out); });
}
int kt_dynamic(const float* in, float* out, unsigned* probe, int* aligned, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 2 * 128 * sizeof(float),
                        [&] { k_dynamic(in, out, probe, aligned); });
}
int kt_atomics(const int* vals, int* icnt, float* fcnt, double* dcnt, unsigned long long* ucnt,
               int* imax, unsigned* umin, long long* lmax, unsigned* bits, int* isub,
               float* fcas, unsigned* hist_out, int* exch_prev, int* exch, unsigned* wrap,
               int blocks) {
  return KF_CPU_LAUNCH(k_atomics, dim3(blocks), dim3(256), 0, vals, icnt, fcnt, dcnt, ucnt, imax,
                       umin, lmax, bits, isub, fcas, hist_out, exch_prev, exch, wrap);
}
int kt_shuffle(const float* fin, const int* iin, const double* din, float* o_down, int* o_xor,
               unsigned* o_up8, long long* o_up, double* o_idx, double* o_idx16,
               unsigned long long* o_xor8, unsigned* o_ballot, int* o_vote, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 0, [&] {
    k_shuffle(fin, iin, din, o_down, o_xor, o_up8, o_up, o_idx, o_idx16, o_xor8, o_ballot,
              o_vote);
  });
}
int kt_partial_warp(const float* in, unsigned* out) {
  return kf_cpu::launch(dim3(1), dim3(48), 0, [&] { k_partial_warp(in, out); });
}
int kt_named_groups(const int* in, int* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 0, [&] { k_named_groups(in, out); });
}
int kt_named_pipeline(const float* in, float* out, int iters, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 0, [&] { k_named_pipeline(in, out, iters); });
}
int kt_deadlock() { return kf_cpu::launch(dim3(1), dim3(64), 0, [&] { k_deadlock(); }); }
int kt_early_exit(const float* in, float* out, int n) {
  return kf_cpu::launch(dim3((n + 127) / 128), dim3(128), 0, [&] { k_early_exit(in, out, n); });
}
int kt_transpose(const float* in, float* out, int rows, int cols) {
  const dim3 grid((cols + KT_TILE - 1) / KT_TILE, (rows + KT_TILE - 1) / KT_TILE);
  return kf_cpu::launch(grid, dim3(KT_TILE, 8), 0, [&] { k_transpose(in, out, rows, cols); });
}
int kt_index3d(int* out, int nx, int ny, int nz) {
  const dim3 block(8, 4, 2);
  const dim3 grid((nx + 7) / 8, (ny + 3) / 4, (nz + 1) / 2);
  return kf_cpu::launch(grid, block, 0, [&] { k_index3d(out, nx, ny, nz); });
}
int kt_math(const float* in, float* out, int* iout, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(64), 0, [&] { k_math(in, out, iout); });
}
int kt_os_thread(unsigned long long* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(64), 0, [&] { k_os_thread(out); });
}
int kt_per_thread(int* out, int blocks) {
  return kf_cpu::launch(dim3(blocks), dim3(128), 0, [&] { k_per_thread(out); });
}
int kt_deep_stack(int* out) {
  return kf_cpu::launch(dim3(1), dim3(32), 0, [&] { k_deep_stack(out); });
}
int kt_fibers_compiled() { return KF_SHIM_FIBERS; }
int kt_bad_launch() { return kf_cpu::launch(dim3(1), dim3(2048), 0, [] {}); }
int kt_bad_shared() { return kf_cpu::launch(dim3(1), dim3(32), 1u << 30, [] {}); }
const char* kt_last_error() { return kf_cpu::last_error(); }
}
#endif
"""

SOURCE = PRELUDE + KERNELS

FAULTS = (
    "KF_SHIM_FAULT_BARRIER",
    "KF_SHIM_FAULT_SHARED",
    "KF_SHIM_FAULT_ATOMIC",
    "KF_SHIM_FAULT_SHUFFLE",
    "KF_SHIM_FAULT_NAMED_BARRIER",
)


# ------------------------------------------------------------------------------------------------
# Compilation: the clean library and one per fault, compiled in parallel, in the disk cache.
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def libs():
    """Return get(fault or None) -> CDLL; all variants compile in the background at once."""
    try:
        host_compiler.find_compiler()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
    futures: dict[str | None, Future] = {
        v: pool.submit(
            compile_host_library, SOURCE, defines=(v,) if v else (), name_hint="test_cpu_shim"
        )
        for v in (None, *FAULTS)
    }

    def get(variant: str | None = None) -> ctypes.CDLL:
        return load_host_library(futures[variant].result())

    yield get
    pool.shutdown(wait=True)


@pytest.fixture(params=("fibers", "threads"))
def mode(request, monkeypatch) -> str:
    """The test's launches run a block's threads as fibers (the default where the shim has
    them) or as OS threads (``KF_SHIM_THREADS=1``, which the shim reads at every launch)."""
    if request.param == "threads":
        monkeypatch.setenv("KF_SHIM_THREADS", "1")
    else:
        monkeypatch.delenv("KF_SHIM_THREADS", raising=False)
    return request.param


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


def call(lib: ctypes.CDLL, name: str, *args) -> None:
    conv = [ptr(a) if isinstance(a, np.ndarray) else ctypes.c_int(a) for a in args]
    rc = getattr(lib, name)(*conv)
    assert rc == 0, f"{name} returned {rc}"


def mismatches(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    """Names of the (got, expected) pairs that differ (floats compared with a tight tolerance)."""
    bad = []
    for name, (got, want) in pairs.items():
        if got.shape != want.shape:
            bad.append(name)
        elif np.issubdtype(want.dtype, np.floating):
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True):
                bad.append(name)
        elif not np.array_equal(got, want):
            bad.append(name)
    return bad


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------------------------------
# Checks: each runs one kernel and returns the names of wrong outputs.
# ------------------------------------------------------------------------------------------------
def check_reverse(lib) -> list[str]:
    blocks = 5
    x = rng(1).uniform(-1, 1, blocks * 256).astype(np.float32)
    out = np.full_like(x, np.nan)
    call(lib, "kt_reverse", x, out, blocks)
    return mismatches({"reverse": (out, x.reshape(blocks, 256)[:, ::-1].ravel())})


def check_tree_sum(lib) -> list[str]:
    blocks = 7
    x = rng(2).uniform(-1, 1, blocks * 256).astype(np.float32)
    out = np.full(blocks, np.nan, np.float32)
    call(lib, "kt_tree_sum", x, out, blocks)
    s = x.reshape(blocks, 256)
    while s.shape[1] > 1:  # the kernel's summation order, in float32
        h = s.shape[1] // 2
        s = s[:, :h] + s[:, h:]
    return mismatches({"tree_sum": (out, s[:, 0])})


def check_sync_votes(lib) -> list[str]:
    blocks = 5
    flags = rng(3).integers(0, 8, blocks * 128).astype(np.int32)
    flags.reshape(blocks, 128)[1] |= 2  # one block where "and" holds
    flags.reshape(blocks, 128)[3] &= ~4  # one block where "or" fails
    out = np.full(blocks * 128 * 3, -7, np.int32)
    call(lib, "kt_sync_votes", flags, out, blocks)
    f = flags.reshape(blocks, 128)
    want = np.stack(
        [(f & 1).astype(bool).sum(1), (f & 2).astype(bool).all(1), (f & 4).astype(bool).any(1)],
        axis=1,
    ).astype(np.int32)
    want = np.repeat(want[:, None, :], 128, axis=1).ravel()
    return mismatches({"votes": (out, want)})


def check_shared_scope(lib) -> list[str]:
    blocks = 5
    x = rng(4).integers(-1000, 1000, blocks * 256).astype(np.int32)
    out = np.full(blocks * 256 * 3, -7, np.int32)
    call(lib, "kt_shared_scope", x, out, blocks)
    o = out.reshape(blocks, 256, 3)
    xb = x.reshape(blocks, 256)
    token = xb[:, 0] * 3 + np.arange(blocks)
    return mismatches(
        {
            "token": (o[:, :, 0], np.repeat(token[:, None], 256, 1)),
            "counter": (o[:, :, 1], np.full((blocks, 256), 256)),
            "block_sum": (o[:, :, 2], np.repeat(xb.sum(1)[:, None], 256, 1)),
        }
    )


def check_atomics(lib) -> list[str]:
    blocks, nt = 3, 256
    total = blocks * nt
    r = rng(5)
    vals = r.integers(-1000, 1000, total * 16).astype(np.int32)
    icnt = r.integers(-100, 100, 7).astype(np.int32)
    fcnt = r.integers(-100, 100, 7).astype(np.float32)
    dcnt = r.integers(-100, 100, 7).astype(np.float64)
    ucnt = r.integers(0, 1 << 40, 7).astype(np.uint64)
    imax = np.full(7, np.iinfo(np.int32).min, np.int32)
    umin = np.full(7, 0xFFFFFFFF, np.uint32)
    lmax = np.full(7, np.iinfo(np.int64).min, np.int64)
    bits = np.concatenate([np.zeros(14, np.uint32), np.full(7, 0xFFFFFFFF, np.uint32)])
    isub = r.integers(-100, 100, 7).astype(np.int32)
    fcas = r.integers(-100, 100, 7).astype(np.float32)
    hist = np.zeros(16, np.uint32)
    exch_prev = np.full(total, -7, np.int32)
    exch = np.array([-1], np.int32)
    wrap = np.zeros(1, np.uint32)
    init = {
        k: v.copy()
        for k, v in dict(icnt=icnt, fcnt=fcnt, dcnt=dcnt, ucnt=ucnt, isub=isub, fcas=fcas).items()
    }
    call(
        lib,
        "kt_atomics",
        vals,
        icnt,
        fcnt,
        dcnt,
        ucnt,
        imax,
        umin,
        lmax,
        bits,
        isub,
        fcas,
        hist,
        exch_prev,
        exch,
        wrap,
        blocks,
    )

    g = np.repeat(np.arange(total), 16)
    v = vals.astype(np.int64)
    c = (g + np.tile(np.arange(16), total)) % 7

    def red(ufunc, start, x, dtype):
        acc = start.astype(dtype).copy()
        ufunc.at(acc, c, x.astype(dtype))
        return acc

    u32 = (v.astype(np.uint64) * 2654435761) & 0xFFFFFFFF
    want_bits = np.concatenate(
        [
            red(np.bitwise_or, np.zeros(7, np.uint32), np.uint32(1) << (v & 31), np.uint32),
            red(np.bitwise_xor, np.zeros(7, np.uint32), (v * 40503) & 0xFFFFFFFF, np.uint32),
            red(
                np.bitwise_and,
                np.full(7, 0xFFFFFFFF),
                ~(np.uint32(1) << ((v >> 5) & 31)),
                np.uint32,
            ),
        ]
    )
    return mismatches(
        {
            "atomicAdd int": (icnt, red(np.add, init["icnt"], v, np.int32)),
            "atomicAdd float": (fcnt, red(np.add, init["fcnt"], 0.25 * v, np.float64)),
            "atomicAdd double": (dcnt, red(np.add, init["dcnt"], 0.5 * v, np.float64)),
            "atomicAdd ull": (ucnt, red(np.add, init["ucnt"], (v + 1000) << 20, np.uint64)),
            "atomicMax int": (
                imax,
                red(np.maximum, np.full(7, np.iinfo(np.int32).min), v * 1000 + g, np.int32),
            ),
            "atomicMin unsigned": (umin, red(np.minimum, np.full(7, 0xFFFFFFFF), u32, np.uint32)),
            "atomicMax long long": (
                lmax,
                red(np.maximum, np.full(7, np.iinfo(np.int64).min), v * 4000000000, np.int64),
            ),
            "atomicOr/Xor/And": (bits, want_bits),
            "atomicSub": (isub, red(np.subtract, init["isub"], v, np.int32)),
            "atomicCAS loop": (fcas, red(np.add, init["fcas"], 0.5 * v, np.float64)),
            "shared histogram": (hist, np.bincount(v & 15, minlength=16).astype(np.uint32)),
            "atomicExch": (
                np.sort(np.concatenate([exch_prev, exch])),
                np.arange(-1, total, dtype=np.int32),
            ),
            "atomicInc": (wrap, np.array([(total * 16) % 10], np.uint32)),
        }
    )


LANE = np.arange(32)


def sh_idx(v, src, width=32):
    return v[..., (LANE & ~(width - 1)) | (np.asarray(src) & (width - 1))]


def sh_up(v, d, width=32):
    return v[..., np.where((LANE & (width - 1)) >= d, LANE - d, LANE)]


def sh_down(v, d, width=32):
    return v[..., np.where((LANE & (width - 1)) + d < width, LANE + d, LANE)]


def sh_xor(v, m, width=32):
    j = LANE ^ m
    return v[..., np.where(j <= ((LANE & ~(width - 1)) | (width - 1)), j, LANE)]


def check_shuffle(lib) -> list[str]:
    blocks, nt = 3, 128
    n = blocks * nt
    r = rng(6)
    fin = r.uniform(-1, 1, n).astype(np.float32)
    iin = r.integers(-50000, 50000, n).astype(np.int32)
    din = r.standard_normal(n)
    outs = dict(
        down=np.full(n, np.nan, np.float32),
        xor=np.zeros(n, np.int32),
        up8=np.zeros(n, np.uint32),
        up=np.zeros(n, np.int64),
        idx=np.full(n, np.nan),
        idx16=np.full(n, np.nan),
        xor8=np.zeros(n, np.uint64),
        ballot=np.zeros(n, np.uint32),
        vote=np.full(n, -1, np.int32),
    )
    call(lib, "kt_shuffle", fin, iin, din, *outs.values(), blocks)

    w = n // 32
    f = fin.reshape(w, 32)
    for off in (16, 8, 4, 2, 1):
        f = f + sh_down(f, off)
    x = iin.reshape(w, 32).astype(np.int64)
    for m in (1, 2, 4, 8, 16):
        x = x + sh_xor(x, m)
    u = iin.reshape(w, 32).astype(np.uint32)
    for d in (1, 2, 4):
        u = u + sh_up(u, d, 8)
    ll = iin.reshape(w, 32).astype(np.int64) * 1000003
    for d in (1, 2, 4, 8, 16):
        ll = ll + sh_up(ll, d)
    dv = din.reshape(w, 32)
    q = (iin.reshape(w, 32).astype(np.uint32).astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15)
    pos = fin.reshape(w, 32) > 0
    ballot = (pos.astype(np.uint64) << LANE.astype(np.uint64)).sum(1).astype(np.uint32)
    anyv = (iin.reshape(w, 32) % 61 == 0).any(1)
    allv = (fin.reshape(w, 32) > np.float32(-0.95)).all(1)
    vote = anyv.astype(np.int32) | (allv.astype(np.int32) << 1)
    return mismatches(
        {
            "down float": (outs["down"], f.ravel()),
            "xor int": (outs["xor"], x.astype(np.int32).ravel()),
            "up unsigned width 8": (outs["up8"], u.ravel()),
            "up long long": (outs["up"], ll.ravel()),
            "idx double": (outs["idx"], sh_idx(dv, (LANE * 5 + 3) & 31).ravel()),
            "idx double width 16": (outs["idx16"], sh_idx(dv, LANE * 3 + 1, 16).ravel()),
            "xor ull width 8": (
                outs["xor8"],
                (sh_xor(q, 8, 8) + np.uint64(3) * sh_xor(q, 5, 8)).ravel(),
            ),
            "ballot": (outs["ballot"], np.repeat(ballot, 32)),
            "any/all": (outs["vote"], np.repeat(vote, 32)),
        }
    )


def check_named_groups(lib) -> list[str]:
    blocks = 3
    x = rng(7).integers(-1000, 1000, blocks * 128).astype(np.int32)
    out = np.zeros_like(x)
    call(lib, "kt_named_groups", x, out, blocks)
    v = x.reshape(blocks, 2, 64).copy()
    for grp, rounds in ((0, 3), (1, 5)):
        for r_ in range(rounds):
            v[:, grp] = np.roll(v[:, grp], -1, axis=1) + r_
    return mismatches({"named groups": (out, v.ravel())})


def check_named_pipeline(lib) -> list[str]:
    blocks, iters = 3, 6
    x = rng(8).uniform(-1, 1, blocks * iters * 64).astype(np.float32)
    out = np.full(blocks * 64, np.nan, np.float32)
    call(lib, "kt_named_pipeline", x, out, iters, blocks)
    stages = x.reshape(blocks, iters, 64)[:, :, ::-1]
    acc = np.zeros((blocks, 64), np.float32)
    for it in range(iters):
        acc = acc + stages[:, it] * np.float32(it + 1)
    return mismatches({"pipeline": (out, acc.ravel())})


# ------------------------------------------------------------------------------------------------
# Feature tests
# ------------------------------------------------------------------------------------------------
def test_syncthreads_reverse(libs, mode):
    assert check_reverse(libs()) == []


def test_syncthreads_tree_reduction(libs, mode):
    assert check_tree_sum(libs()) == []


def test_syncthreads_count_and_or(libs, mode):
    assert check_sync_votes(libs()) == []


def test_shared_is_per_block_and_shared_by_its_threads(libs, mode):
    assert check_shared_scope(libs()) == []


def test_dynamic_shared_memory(libs):
    blocks, nt = 3, 128
    x = rng(9).uniform(-1, 1, blocks * nt).astype(np.float32)
    out = np.full_like(x, np.nan)
    probe = np.zeros(blocks * nt, np.uint32)
    aligned = np.zeros(blocks, np.int32)
    call(libs(), "kt_dynamic", x, out, probe, aligned, blocks)
    xb = x.reshape(blocks, nt)
    t = np.arange(nt)
    want = xb[:, nt - 1 - t] + 2 * xb[:, nt - 1 - (t + 1) % nt]
    assert mismatches({"dynamic": (out, want.ravel())}) == []
    assert (probe == 0xFFFFFFFF).all(), "dynamic shared memory is not poisoned at block start"
    assert aligned.tolist() == [1] * blocks


def test_atomics(libs, mode):
    assert check_atomics(libs()) == []


def test_warp_shuffles_and_votes(libs, mode):
    assert check_shuffle(libs()) == []


def test_partial_last_warp(libs, mode):
    x = rng(10).uniform(-1, 1, 48).astype(np.float32)
    out = np.zeros(48 * 3, np.uint32)
    call(libs(), "kt_partial_warp", x, out)
    o = out.reshape(48, 3)
    pos = (x > 0).astype(np.uint64) << (np.arange(48) % 32).astype(np.uint64)
    t = np.arange(48)
    # Lane 31 shuffles from outside its segment: own value. Thread 47's source lane does not
    # exist: 0, as on an H200 (CUDA leaves it undefined).
    nxt = np.where(t % 32 == 31, t, t + 1) * 10
    nxt[47] = 0
    assert (o[:32, 0] == 0xFFFFFFFF).all() and (o[32:, 0] == 0xFFFF).all()
    assert (o[:32, 1] == pos[:32].sum()).all() and (o[32:, 1] == pos[32:].sum()).all()
    assert o[:, 2].tolist() == nxt.tolist()


def test_named_barriers_independent_groups(libs, mode):
    assert check_named_groups(libs()) == []


def test_named_barriers_producer_consumer(libs, mode):
    assert check_named_pipeline(libs()) == []


def test_early_return_then_syncthreads(libs, mode):
    n = 2 * 128 + 77
    x = rng(11).uniform(-1, 1, n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    call(libs(), "kt_early_exit", x, out, n)
    want = []
    for b in range(0, n, 128):
        xb = x[b : b + 128]
        s = 2 * xb[::-1]
        want.append(np.roll(s, -1) + np.float32((xb > 0).sum()))
    assert mismatches({"early exit": (out, np.concatenate(want))}) == []


def test_2d_blocks_transpose_odd_grid(libs):
    rows, cols = 37, 53
    x = rng(12).uniform(-1, 1, (rows, cols)).astype(np.float32)
    out = np.full((cols, rows), np.nan, np.float32)
    call(libs(), "kt_transpose", x, out, rows, cols)
    assert np.array_equal(out, x.T)


def test_3d_blocks_and_grid_indices(libs, mode):
    nx, ny, nz = 21, 7, 9
    out = np.full((nz, ny, nx, 4), -7, np.int32)
    call(libs(), "kt_index3d", out, nx, ny, nz)
    z, y, x = np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx), indexing="ij")
    gx, gy, gz = 3, 2, 5
    block_id = ((z // 2) * gy + (y // 4)) * gx + (x // 8)
    lid = (x % 8) + (y % 4) * 8 + (z % 2) * 32
    nxt = np.where(lid % 32 == 31, lid, lid + 1)
    dims = 842 * 1000 + gx * 100 + gy * 10 + gz
    assert np.array_equal(out[..., 0], block_id)
    assert np.array_equal(out[..., 1], lid)
    assert np.array_equal(out[..., 2], nxt)
    assert (out[..., 3] == dims).all()


def test_math_helpers(libs):
    blocks = 2
    x = rng(13).uniform(-2, 2, blocks * 64).astype(np.float32)
    out = np.zeros(blocks * 64 * 8, np.float32)
    iout = np.zeros(blocks * 64 * 2, np.int32)
    call(libs(), "kt_math", x, out, iout, blocks)
    a = np.abs(x) + np.float32(0.5)
    want = np.stack(
        [
            1 / np.sqrt(a),
            x / a,
            np.exp(x) + np.log(a),
            np.sin(x) * np.cos(x),
            np.clip(2 * x, 0, 1),
            a**1.5 + np.sqrt(a),
            np.maximum(x, 0) + np.minimum(x, 0) + np.maximum(x, 0.25) + np.minimum(x, -0.25),
            x,
        ],
        axis=1,
    )
    assert np.allclose(out.reshape(-1, 8), want, rtol=1e-5, atol=1e-6)
    g = np.arange(blocks * 64)
    bits = (x.view(np.uint32) >> 1).astype(np.int64) - 0x3F800000
    iwant = np.stack([np.minimum(g, 37) + np.maximum(g, 40) + g, bits], axis=1)
    assert np.array_equal(iout.reshape(-1, 2), iwant)


def test_invalid_launch_configuration_reports_error(libs):
    lib = libs()
    lib.kt_last_error.restype = ctypes.c_char_p
    assert lib.kt_bad_launch() == 9
    assert b"invalid block" in lib.kt_last_error()
    assert lib.kt_bad_shared() == 9
    assert b"dynamic shared memory" in lib.kt_last_error()


def test_programs_are_linked_to_the_runtime_library_and_the_header_stands_alone(libs,
                                                                               tmp_path):
    """kfuse's programs compile their kernels only and find the shim's runtime library
    beside them (its launch machinery compiled once); the header alone still makes a
    whole program (a user compiling it without kfuse)."""
    libs()
    path = compile_host_library(SOURCE, name_hint="test_cpu_shim")
    readelf = shutil.which("readelf")
    if readelf:
        dynamic = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True,
                                 check=True).stdout
        assert "libkfuse_shim-" in dynamic and "$ORIGIN" in dynamic, dynamic
    alone = tmp_path / "alone.so"
    source = tmp_path / "alone.cu"
    source.write_text(SOURCE)
    subprocess.run([*host_compiler.find_compiler(), *host_compiler.base_flags(),
                    f"-I{host_compiler.shim_include_dir()}", "-x", "c++", str(source), "-x",
                    "none", "-o", str(alone)], check=True, capture_output=True, timeout=300)
    for lib in (load_host_library(path), ctypes.CDLL(str(alone))):
        assert check_reverse(lib) == [] and check_tree_sum(lib) == []


def test_launches_reuse_threads_and_a_forked_child_launches_too(libs, mode):
    """The shim keeps its host threads (a pool) or fiber stacks between launches: many
    launches in a row stay correct, and a child made by fork, which has none of its parent's
    threads, starts threads of its own instead of waiting on the parent's."""
    lib = libs()
    for _ in range(20):
        assert check_reverse(lib) == [] and check_tree_sum(lib) == []
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its launch computed the right result
        code = 1
        try:
            code = 0 if check_reverse(lib) == [] else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("a launch in a forked child hung (waiting on the parent's threads)")


def test_fibers_run_a_block_on_the_launching_thread(libs, mode):
    """With fibers (compiled in, KF_SHIM_THREADS unset) one OS thread runs every thread of
    the block; with KF_SHIM_THREADS=1 each CUDA thread has an OS thread of its own."""
    lib = libs()
    out = np.zeros(2 * 64, np.uint64)
    call(lib, "kt_os_thread", out, 2)
    if lib.kt_fibers_compiled() and mode == "fibers":
        assert len(set(out.tolist())) == 1
    else:
        assert len(set(out[:64].tolist())) == 64


def test_per_thread_storage_is_per_cuda_thread_and_per_launch(libs, mode):
    lib = libs()
    for _ in range(2):  # a second launch starts from fresh (value-initialised) objects
        out = np.zeros(3 * 128, np.int32)
        call(lib, "kt_per_thread", out, 3)
        assert (out.reshape(3, 128) == np.arange(1, 4)[:, None]).all()


def test_fiber_stacks_hold_large_locals_and_end_at_a_guard_page(libs, monkeypatch):
    """128 KiB of locals a thread fit the default stacks (512 KiB); in 64 KiB stacks
    (KF_SHIM_FIBER_STACK_KB) they fault on the guard page instead of running over into the
    next fiber's stack."""
    monkeypatch.delenv("KF_SHIM_THREADS", raising=False)
    monkeypatch.delenv("KF_SHIM_FIBER_STACK_KB", raising=False)
    lib = libs()
    out = np.zeros(32, np.int32)
    call(lib, "kt_deep_stack", out)
    assert (out == 255 - np.arange(32)).all()
    if not lib.kt_fibers_compiled():
        pytest.skip("the shim runs on OS threads here")
    path = host_compiler.compile_host_library(SOURCE, name_hint="test_cpu_shim")
    code = (f"import ctypes; ctypes.CDLL({str(path)!r}).kt_deep_stack("
            "ctypes.create_string_buffer(128))")
    env = dict(os.environ, KF_SHIM_FIBER_STACK_KB="64")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr)


def test_deadlock_aborts_with_message_instead_of_hanging(libs, mode):
    libs()  # compiled (and cached) by the fixture
    path = host_compiler.compile_host_library(SOURCE, name_hint="test_cpu_shim")
    code = f"import ctypes; ctypes.CDLL({str(path)!r}).kt_deadlock()"
    env = dict(os.environ, KF_SHIM_TIMEOUT_S="0.5")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode != 0
    assert "deadlock" in proc.stderr and "KF_BAR_SYNC(3, 64)" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------------------------------------
# Each fault breaks the test that covers it: the tests above can fail.
# ------------------------------------------------------------------------------------------------
FAULT_CHECKS: dict[str, list[Callable]] = {
    "KF_SHIM_FAULT_BARRIER": [check_reverse, check_tree_sum],
    "KF_SHIM_FAULT_SHARED": [check_shared_scope],
    "KF_SHIM_FAULT_ATOMIC": [check_atomics],
    "KF_SHIM_FAULT_SHUFFLE": [check_shuffle],
    "KF_SHIM_FAULT_NAMED_BARRIER": [check_named_groups, check_named_pipeline],
}


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_makes_result_wrong(libs, fault, mode):
    lib = libs(fault)
    for check in FAULT_CHECKS[fault]:
        assert check(lib), f"{check.__name__} still passes with {fault}"


# ------------------------------------------------------------------------------------------------
# Host compiler driver
# ------------------------------------------------------------------------------------------------
def test_compile_error_carries_compiler_message(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    bad = PRELUDE + "__global__ void k(float* x) { x[0] = undefined_name_xyz; }\n"
    with pytest.raises(CompileError) as info:
        compile_host_library(bad, name_hint="bad")
    msg = str(info.value)
    assert "undefined_name_xyz" in msg and "error" in msg
    assert info.value.source_path.exists()
    assert info.value.source_path.read_text() == bad


def test_cache_hit_skips_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    src = 'extern "C" int kt_answer(void) { return 42; }\n'
    path = compile_host_library(src, defines=["KT_X=1"])
    assert path.parent == tmp_path / "cpu" and path.suffix == ".so"
    assert load_host_library(path).kt_answer() == 42

    def boom(*args, **kwargs):
        raise AssertionError("compiler called despite cache")

    monkeypatch.setattr(host_compiler.subprocess, "run", boom)
    assert compile_host_library(src, defines=["-DKT_X=1"]) == path
    # (its own temporary files: the module's background compiles of the shim's variants
    # may be writing theirs into this folder while the test's KFUSE_CACHE_DIR is set)
    assert not list((tmp_path / "cpu").glob(".kfuse-*tmp"))


def test_the_optimisation_level_is_the_one_named_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv("KFUSE_CPU_OPT", raising=False)
    assert host_compiler.base_flags() == host_compiler.BASE_FLAGS
    monkeypatch.setenv("KFUSE_CPU_OPT", "-O1")
    flags = host_compiler.base_flags()
    assert "-O1" in flags and "-O2" not in flags and len(flags) == len(host_compiler.BASE_FLAGS)
    monkeypatch.setenv("KFUSE_CPU_OPT", "-O9; rm -rf /")
    with pytest.raises(BackendUnavailable, match="KFUSE_CPU_OPT"):
        compile_host_library("int x;")


def test_missing_compiler_is_backend_unavailable(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/kfuse-c++")
    with pytest.raises(BackendUnavailable):
        compile_host_library("int x;")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernels_are_valid_cuda(tmp_path):
    src = tmp_path / "kernels.cu"
    src.write_text(SOURCE)
    proc = subprocess.run(
        ["nvcc", "-arch=sm_90", "-c", "-x", "cu", str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
