"""The one prelude every generated source starts with.

It makes the same text compile under NVRTC/nvcc (``__CUDACC__`` defined) and under the
host C++ compiler with kfuse's CPU shim, and holds the small device helpers generated
kernels share: boundary index maps, reduction combiners, block reductions and atomics.
"""

PRELUDE = r"""// ===== kfuse prelude: shared by every generated kernel =====
#if defined(__CUDACC__)
  // GPU (NVRTC or nvcc)
  #define KF_BAR_SYNC(id, count) asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory")
  #define KF_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
  // Host C++ compiler: every CUDA thread of a block is a real thread (kfuse CPU shim)
  #include "kfuse_cpu_shim.h"
#endif

#define KF_KERNEL extern "C" __global__
#define KF_DEVICE __device__ __forceinline__

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
// float32 division and square root the way Triton (torch.compile) emits them:
// div.full.f32 (at most 2 ulp over the full range) and sqrt.approx.f32. Both are
// branch-free; IEEE division and sqrtf branch to an out-of-line slow path, which keeps the
// compiler from issuing a thread's loads together (measured: Unsharp, Shi-Tomasi, Sobel).
// float64 keeps IEEE division and sqrt. The host compiler computes them exactly.
#if defined(__CUDACC__)
KF_DEVICE float kf_divf(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}
KF_DEVICE float kf_sqrtf(float x) {
  float r;
  asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#else
KF_DEVICE float kf_divf(float a, float b) { return a / b; }
KF_DEVICE float kf_sqrtf(float x) { return sqrtf(x); }
#endif
// float32 exp and pow on the hardware's base-2 units (ex2.approx, lg2.approx), the way
// Triton emits exp, with the rounding of the exponent's product carried to first order:
// exp(x) = 2^(hi + lo) with hi = x * log2(e) rounded and lo its rounding error (an fma)
// plus x times log2(e)'s own rounding, evaluated as ex2(hi) * (1 + lo ln 2). A plain
// ex2(x * log2 e) (Triton, __expf) loses |x log2 e| * 2^-24 relatively (95 ulp at x = 80);
// this keeps a few ulp over the whole range. pow |x|^y = 2^(y lg2|x|) the same way:
// lg2.approx's absolute error (2^-22.6) becomes a relative error of |y| 2^-22.6 ln 2 in the
// result. scripts/fp32_math_check.py measures both on the GPU. Branch-free: the special
// cases of C99 pow (signs of negative bases, NaN for a negative base and a non-integer
// exponent, pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1) are selects. The host compiler
// calls expf and powf.
#if defined(__CUDACC__)
KF_DEVICE float kf_exp2_parts(float hi, float lo) {  // 2^(hi + lo), |lo| far below 1
  float power;
  asm("ex2.approx.f32 %0, %1;" : "=f"(power) : "f"(hi));
  lo = fabsf(hi) < INFINITY ? lo : 0.0f;  // infinities and NaN: no correction (no NaN)
  return fmaf(power, lo * 0.693147181f, power);
}
KF_DEVICE float kf_expf(float x) {
  const float hi = x * 1.44269502f;  // log2(e) rounded to float32
  const float lo = fmaf(x, 1.44269502f, -hi) + x * 1.92596299e-8f;  // + x (log2 e - 1.44269502)
  return kf_exp2_parts(hi, lo);
}
KF_DEVICE float kf_pow_magnitude(float x, float y) {  // |x|^y
  float log2_x;
  asm("lg2.approx.f32 %0, %1;" : "=f"(log2_x) : "f"(fabsf(x)));
  const float hi = y * log2_x;
  return kf_exp2_parts(hi, fmaf(y, log2_x, -hi));
}
#else
KF_DEVICE float kf_expf(float x) { return expf(x); }
KF_DEVICE float kf_pow_magnitude(float x, float y) { return powf(fabsf(x), y); }
#endif
KF_DEVICE float kf_powf(float x, float y) {
  const float magnitude = kf_pow_magnitude(x, y);
  const bool integer = floorf(y) == y;  // false for NaN, true for +-inf
  const bool odd = integer && fabsf(y) < 16777216.0f && ((int)y & 1);
  float result = (__float_as_int(x) < 0 && odd) ? -magnitude : magnitude;
  result = (x < 0.0f && x > -INFINITY && !integer) ? NAN : result;
  return (y == 0.0f || x == 1.0f || (x == -1.0f && fabsf(y) == INFINITY)) ? 1.0f : result;
}
#define KF_INT_MAX 2147483647
#define KF_INT_MIN (-2147483647 - 1)

// Boundary modes map an index that is at most one array length outside [0, n) back
// inside (kfuse checks |offset| < n before launching).
KF_DEVICE int kf_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
KF_DEVICE int kf_mirror(int i, int n) { return i < 0 ? -i - 1 : (i >= n ? 2 * n - i - 1 : i); }
KF_DEVICE int kf_repeat(int i, int n) { return i < 0 ? i + n : (i >= n ? i - n : i); }
KF_DEVICE bool kf_inside(int i, int n) { return (unsigned)i < (unsigned)n; }

// Reduction combiners: 0 = sum, 1 = min, 2 = max.
template <int OP, typename T> KF_DEVICE T kf_combine(T a, T b) {
  if (OP == 0) return a + b;
  if (OP == 1) return b < a ? b : a;
  return b > a ? b : a;
}

// Reduce a value over the whole thread block; the result is valid in thread 0.
template <int OP, typename T> KF_DEVICE T kf_block_reduce(T value, T identity) {
  __shared__ T kf_warp_partials[32];
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int lane = tid & 31, warp = tid >> 5;
  for (int delta = 16; delta > 0; delta >>= 1)
    value = kf_combine<OP, T>(value, __shfl_down_sync(0xffffffffu, value, delta));
  if (lane == 0) kf_warp_partials[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < (threads + 31) / 32 ? kf_warp_partials[lane] : identity;
    for (int delta = 16; delta > 0; delta >>= 1)
      value = kf_combine<OP, T>(value, __shfl_down_sync(0xffffffffu, value, delta));
  }
  __syncthreads();  // kf_warp_partials may be reused by the next call
  return value;
}

// Atomic combiners into an output element that was initialised with the identity.
KF_DEVICE void kf_atomic_sum(float* out, float v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_sum(double* out, double v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_sum(int* out, int v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_min(int* out, int v) { atomicMin(out, v); }
KF_DEVICE void kf_atomic_max(int* out, int v) { atomicMax(out, v); }
KF_DEVICE void kf_atomic_min(float* out, float v) {
  int* word = (int*)out;
  int seen = *word, expected;
  do {
    expected = seen;
    if (!(v < __int_as_float(expected))) return;
    seen = atomicCAS(word, expected, __float_as_int(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_max(float* out, float v) {
  int* word = (int*)out;
  int seen = *word, expected;
  do {
    expected = seen;
    if (!(v > __int_as_float(expected))) return;
    seen = atomicCAS(word, expected, __float_as_int(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_min(double* out, double v) {
  unsigned long long* word = (unsigned long long*)out;
  unsigned long long seen = *word, expected;
  do {
    expected = seen;
    if (!(v < __longlong_as_double((long long)expected))) return;
    seen = atomicCAS(word, expected, (unsigned long long)__double_as_longlong(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_max(double* out, double v) {
  unsigned long long* word = (unsigned long long*)out;
  unsigned long long seen = *word, expected;
  do {
    expected = seen;
    if (!(v > __longlong_as_double((long long)expected))) return;
    seen = atomicCAS(word, expected, (unsigned long long)__double_as_longlong(v));
  } while (seen != expected);
}
// ===== end of kfuse prelude =====
"""
