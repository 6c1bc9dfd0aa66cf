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
  // the dynamic shared memory from byte `offset` on (kernels side by side in one block)
  #define KF_DYNAMIC_SHARED_AT(type, name, offset) \
    extern __shared__ __align__(16) unsigned char kf_dynamic_shared_bytes[]; \
    type* const name = reinterpret_cast<type*>(kf_dynamic_shared_bytes + (offset))
#else
  // Host C++ compiler: the kfuse CPU shim runs every CUDA thread of a block (as a fiber)
  #include "kfuse_cpu_shim.h"
#endif

#define KF_KERNEL extern "C" __global__
// What __global__ and __launch_bounds__ stand for here: a user's kernel source is compiled
// with them redefined (kfuse.codegen.user), and they are defined again as these after it
// (NVRTC ignores #pragma push_macro / pop_macro).
#if defined(__CUDACC__)
  #define KF_GLOBAL_SPELLING __attribute__((global))
  #define KF_LAUNCH_BOUNDS_SPELLING(...) __attribute__((launch_bounds(__VA_ARGS__)))
#else
  #define KF_GLOBAL_SPELLING
  #define KF_LAUNCH_BOUNDS_SPELLING(...)
#endif
#define KF_DEVICE __device__ __forceinline__

// Vector accesses need aligned pointers: kf_pointer_aligned tests one on the device.
// A program compiled for arrays known to be aligned (the runtime checks every array's address
// when it takes the program or new arrays) defines KF_ARRAYS_ALIGNED to that many bytes, and
// kf_aligned is then known at compile time; kernels call it where that was measured to pay
// (the 1-D map-reduce chunks: plain maps and their dot products).
#ifndef KF_ARRAYS_ALIGNED
#define KF_ARRAYS_ALIGNED 1
#endif
KF_DEVICE bool kf_pointer_aligned(const void* p, unsigned long long bytes) {
  return ((unsigned long long)p & (bytes - 1)) == 0;
}
KF_DEVICE bool kf_aligned(const void* p, unsigned long long bytes) {
  return bytes <= KF_ARRAYS_ALIGNED || kf_pointer_aligned(p, bytes);
}

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
// float32 pow: |x|^y = exp2(y * lg2|x|) with the hardware's base-2 logarithm
// (lg2.approx, about 20 instructions fewer than log2f: Enhance 0.334 -> 0.267 ms on an
// H200), a relative error of at most (2 + |y log2 x| + |y|) float32 ulp at 1 (the |y| term:
// lg2.approx's absolute error, which dominates for x near 1; benchmarks/fp32_math_check.py
// measures it on the GPU). Branch-free: the special cases of C99 pow (signs of negative
// bases, NaN for a negative base and a non-integer exponent, pow(x, 0) = pow(1, y) =
// pow(-1, +-inf) = 1) are selects. The host compiler uses log2f.
#if defined(__CUDACC__)
KF_DEVICE float kf_log2_approx(float x) {
  float result;
  asm("lg2.approx.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}
#else
KF_DEVICE float kf_log2_approx(float x) { return log2f(x); }
#endif
KF_DEVICE float kf_powf(float x, float y) {
  const float magnitude = exp2f(y * kf_log2_approx(fabsf(x)));
  const bool integer = floorf(y) == y;  // false for NaN, true for +-inf
  const bool odd = integer && fabsf(y) < 16777216.0f && ((int)y & 1);
  float result = (__float_as_int(x) < 0 && odd) ? -magnitude : magnitude;
  result = (x < 0.0f && x > -INFINITY && !integer) ? NAN : result;
  return (y == 0.0f || x == 1.0f || (x == -1.0f && fabsf(y) == INFINITY)) ? 1.0f : result;
}
// float32 log whose result only reaches an exp through sums, differences and constant
// factors (exp(sum c_i log x_i): a geometric mean, a weighted product of powers), where
// an absolute error in the log is a relative error of the exp: lg2.approx times ln 2, an
// absolute error of at most 2^-21.41 for x in [0.5, 2] and 3 ulp elsewhere (CUDA's __logf
// bounds), so the exp gains at most sum |c_i| (2^-21.41 + 3 ulp of log x_i) of relative
// error (Enhance's geometric mean: 0.266 -> 0.162 ms on an H200). logf anywhere else (its
// relative accuracy matters near x = 1). The host compiler uses logf.
#if defined(__CUDACC__)
KF_DEVICE float kf_logf_in_exp(float x) { return kf_log2_approx(x) * 0.693147180559945309f; }
#else
KF_DEVICE float kf_logf_in_exp(float x) { return logf(x); }
#endif
#define KF_INT_MAX 2147483647
#define KF_INT_MIN (-2147483647 - 1)
#define KF_LONG_MAX 9223372036854775807LL
#define KF_LONG_MIN (-9223372036854775807LL - 1)

// Boundary modes map an index that is at most one array length outside [0, n) back
// inside (kfuse checks |offset| < n before launching).
KF_DEVICE int kf_clamp(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
KF_DEVICE int kf_mirror(int i, int n) { return i < 0 ? -i - 1 : (i >= n ? 2 * n - i - 1 : i); }
KF_DEVICE int kf_repeat(int i, int n) { return i < 0 ? i + n : (i >= n ? i - n : i); }
KF_DEVICE bool kf_inside(int i, int n) { return (unsigned)i < (unsigned)n; }
// The same for any distance outside (reads at another resolution, levels of one element).
KF_DEVICE int kf_mirror_any(int i, int n) {
  int folded = ((i % (2 * n)) + 2 * n) % (2 * n);
  return folded < n ? folded : 2 * n - 1 - folded;
}
KF_DEVICE int kf_repeat_any(int i, int n) { return ((i % n) + n) % n; }
// i // d for d > 0, rounding down as NumPy's (C's division truncates towards zero).
KF_DEVICE int kf_floor_div(int i, int d) { return i >= 0 ? i / d : -((d - 1 - i) / d); }

// Minimum and maximum as NumPy's: a NaN on either side is the result (fminf/fmaxf and a
// bare comparison would drop it, or not, depending on the side it comes from), and of two
// equal values the second (min(+0, -0) is -0, min(-0, +0) is +0).
template <typename T> KF_DEVICE T kf_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> KF_DEVICE T kf_max(T a, T b) { return (a > b || a != a) ? a : b; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// float32 on the GPU: one instruction (the comparisons above cost Night 2.3% on an H200);
// only the sign of a zero result can differ from NumPy's: -0 is below +0 (IEEE 754-2019)
KF_DEVICE float kf_min(float a, float b) {
  float d; asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d;
}
KF_DEVICE float kf_max(float a, float b) {
  float d; asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d;
}
#endif

// int32 arithmetic wraps around as NumPy's (a signed overflow is undefined in C and C++;
// unsigned arithmetic wraps, and the same instructions run).
KF_DEVICE int kf_iadd(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
KF_DEVICE int kf_isub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
KF_DEVICE int kf_imul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
KF_DEVICE int kf_ineg(int a) { return (int)(0u - (unsigned)a); }
KF_DEVICE int kf_iabs(int a) { return a < 0 ? kf_ineg(a) : a; }
// Two-byte floats in memory: float16 (IEEE binary16) and bfloat16 (the upper half of a
// float32), as bits that no arithmetic takes by mistake; kernels compute in float32 and
// round to nearest (ties to even) where a value is stored or an operator's result formed.
struct kf_half { unsigned short bits; };
struct kf_bfloat16 { unsigned short bits; };
// On the GPU the conversions are the hardware's (cvt, round to nearest even, as below).
KF_DEVICE float kf_value(kf_bfloat16 h) { return __uint_as_float((unsigned)h.bits << 16); }
KF_DEVICE kf_bfloat16 kf_to_bfloat16(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  return kf_bfloat16{bits};
#else
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kf_bfloat16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return kf_bfloat16{(unsigned short)(u >> 16)};
#endif
}
KF_DEVICE float kf_value(kf_half h) {
#if defined(__CUDA_ARCH__)
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(h.bits));
  return value;
#else
  const unsigned sign = ((unsigned)h.bits & 0x8000u) << 16, exponent = (h.bits >> 10) & 0x1fu,
                 mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  const float subnormal = (float)mantissa * 5.9604644775390625e-8f;  // mantissa * 2^-24
  return sign ? -subnormal : subnormal;
#endif
}
KF_DEVICE kf_half kf_to_half(float x) {
#if defined(__CUDA_ARCH__)
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  return kf_half{bits};
#else
  const unsigned u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return kf_half{(unsigned short)(sign | 0x7e00u)};  // NaN
  if (magnitude >= 0x477ff000u) return kf_half{(unsigned short)(sign | 0x7c00u)};  // to inf
  if (magnitude < 0x38800000u) {  // a subnormal half (or zero): round x * 2^24 to an integer
    const float scaled = __uint_as_float(magnitude) * 16777216.0f;
    float whole = (float)(unsigned)scaled;
    const float rest = scaled - whole;
    if (rest > 0.5f || (rest == 0.5f && ((unsigned)whole & 1u))) whole += 1.0f;
    return kf_half{(unsigned short)(sign | (unsigned)whole)};
  }
  unsigned rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return kf_half{(unsigned short)(sign | ((rounded - 0x38000000u) >> 13))};
#endif
}
KF_DEVICE float kf_round_half(float x) { return kf_value(kf_to_half(x)); }
KF_DEVICE float kf_round_bfloat16(float x) { return kf_value(kf_to_bfloat16(x)); }

// int64 likewise.
KF_DEVICE long long kf_ladd(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
KF_DEVICE long long kf_lsub(long long a, long long b) {
  return (long long)((unsigned long long)a - (unsigned long long)b);
}
KF_DEVICE long long kf_lmul(long long a, long long b) {
  return (long long)((unsigned long long)a * (unsigned long long)b);
}
KF_DEVICE long long kf_lneg(long long a) { return (long long)(0ull - (unsigned long long)a); }
KF_DEVICE long long kf_labs(long long a) { return a < 0 ? kf_lneg(a) : a; }
template <typename T> KF_DEVICE T kf_plus(T a, T b) { return a + b; }
KF_DEVICE int kf_plus(int a, int b) { return kf_iadd(a, b); }
KF_DEVICE long long kf_plus(long long a, long long b) { return kf_ladd(a, b); }

// Reduction combiners: 0 = sum, 1 = min, 2 = max.
template <int OP, typename T> KF_DEVICE T kf_combine(T a, T b) {
  if (OP == 0) return kf_plus(a, b);
  if (OP == 1) return kf_min(a, b);
  return kf_max(a, b);
}

// The block helpers below read threadIdx, blockIdx and their sizes and synchronise the
// block: a kernel that runs beside another in one block (kfuse.codegen.horizontal) defines
// them again under its own names, where those words mean its part of the block.
#define KF_BLOCK_HELPERS(reversed_block, block_reduce)                                      \
  /* The block index of a kernel that visits its blocks last-first                        \
     (kfuse.codegen.block_order): its first blocks read what the kernel before it left    \
     in L2. */                                                                             \
  KF_DEVICE uint3 reversed_block() {                                                       \
    return uint3{gridDim.x - 1 - blockIdx.x, gridDim.y - 1 - blockIdx.y,                   \
                 gridDim.z - 1 - blockIdx.z};                                              \
  }                                                                                        \
  /* Reduce a value over the whole thread block; the result is valid in thread 0. */      \
  template <int OP, typename T> KF_DEVICE T block_reduce(T value, T identity) {            \
    __shared__ T kf_warp_partials[32];                                                     \
    const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);   \
    const int threads = blockDim.x * blockDim.y * blockDim.z;                              \
    const int lane = tid & 31, warp = tid >> 5;                                            \
    for (int delta = 16; delta > 0; delta >>= 1)                                           \
      value = kf_combine<OP, T>(value, __shfl_down_sync(0xffffffffu, value, delta));       \
    if (lane == 0) kf_warp_partials[warp] = value;                                         \
    __syncthreads();                                                                       \
    if (warp == 0) {                                                                       \
      value = lane < (threads + 31) / 32 ? kf_warp_partials[lane] : identity;             \
      for (int delta = 16; delta > 0; delta >>= 1)                                         \
        value = kf_combine<OP, T>(value, __shfl_down_sync(0xffffffffu, value, delta));     \
    }                                                                                      \
    __syncthreads(); /* kf_warp_partials may be reused by the next call */                 \
    return value;                                                                          \
  }
KF_BLOCK_HELPERS(kf_reversed_block, kf_block_reduce)

// The thread index of a kernel running beside others in one 1-D block (kfuse.codegen.horizontal):
// threads [Offset, Offset + X * Y * Z) run it as a block of X x Y x Z threads.
template <unsigned Offset, unsigned X, unsigned Y> KF_DEVICE uint3 kf_part_thread() {
  const unsigned thread = threadIdx.x - Offset;
  return uint3{thread % X, (thread / X) % Y, thread / (X * Y)};
}

// A user kernel's array argument, whatever pointer type its function declares for it
// (const or not, __half* for a float16 array): kfuse passes the array's address.
struct kf_any_pointer {
  void* address;
  template <typename T> KF_DEVICE operator T*() const { return static_cast<T*>(address); }
};

// Atomic combiners into an output element that was initialised with the identity.
KF_DEVICE void kf_atomic_sum(float* out, float v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_sum(double* out, double v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_sum(int* out, int v) { atomicAdd(out, v); }
KF_DEVICE void kf_atomic_min(int* out, int v) { atomicMin(out, v); }
KF_DEVICE void kf_atomic_max(int* out, int v) { atomicMax(out, v); }
KF_DEVICE void kf_atomic_sum(long long* out, long long v) {
  atomicAdd((unsigned long long*)out, (unsigned long long)v);  // wraps as NumPy's int64
}
KF_DEVICE void kf_atomic_min(long long* out, long long v) { atomicMin(out, v); }
KF_DEVICE void kf_atomic_max(long long* out, long long v) { atomicMax(out, v); }
KF_DEVICE void kf_atomic_min(float* out, float v) {
  int* word = (int*)out;
  int seen = *word, expected;
  do {
    expected = seen;
    if (v == v && !(v < __int_as_float(expected))) return;  // a NaN is written, then kept
    seen = atomicCAS(word, expected, __float_as_int(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_max(float* out, float v) {
  int* word = (int*)out;
  int seen = *word, expected;
  do {
    expected = seen;
    if (v == v && !(v > __int_as_float(expected))) return;
    seen = atomicCAS(word, expected, __float_as_int(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_min(double* out, double v) {
  unsigned long long* word = (unsigned long long*)out;
  unsigned long long seen = *word, expected;
  do {
    expected = seen;
    if (v == v && !(v < __longlong_as_double((long long)expected))) return;
    seen = atomicCAS(word, expected, (unsigned long long)__double_as_longlong(v));
  } while (seen != expected);
}
KF_DEVICE void kf_atomic_max(double* out, double v) {
  unsigned long long* word = (unsigned long long*)out;
  unsigned long long seen = *word, expected;
  do {
    expected = seen;
    if (v == v && !(v > __longlong_as_double((long long)expected))) return;
    seen = atomicCAS(word, expected, (unsigned long long)__double_as_longlong(v));
  } while (seen != expected);
}
// Asynchronous 16-byte (and 4-byte) copies from global to shared memory, in groups (cp.async):
// marching and streamed kernels stage input planes or rows a few ahead of their use. A group's data may be read
// once kf_copy_async_wait<N> (at most N later groups still in flight) and a barrier have
// passed. The host compiler queues each thread's copies and makes them at that wait, so
// a read that comes too early sees the slot's old content there too.
#if defined(__CUDACC__)
KF_DEVICE void kf_copy_async16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::
               "r"((unsigned)__cvta_generic_to_shared(shared)), "l"(global) : "memory");
}
KF_DEVICE void kf_copy_async4(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::
               "r"((unsigned)__cvta_generic_to_shared(shared)), "l"(global) : "memory");
}
KF_DEVICE void kf_copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int Pending> KF_DEVICE void kf_copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(Pending) : "memory");
}
#else
struct KfCopy {
  void* shared;
  const void* global;
  std::size_t bytes;
};
struct KfCopyGroups {
  std::vector<std::vector<KfCopy>> groups{{}};  // the last is open
};
// The calling CUDA thread's groups (not a thread_local: the shim's fibers share OS threads).
inline std::vector<std::vector<KfCopy>>& kf_copy_groups() {
  return kf_cpu::per_thread<KfCopyGroups>().groups;
}
inline void kf_copy_async16(void* shared, const void* global) {
  kf_copy_groups().back().push_back({shared, global, 16});
}
inline void kf_copy_async4(void* shared, const void* global) {
  kf_copy_groups().back().push_back({shared, global, 4});
}
inline void kf_copy_async_commit() { kf_copy_groups().emplace_back(); }
template <int Pending> inline void kf_copy_async_wait() {
  auto& groups = kf_copy_groups();
  while ((int)groups.size() - 1 > Pending) {  // committed groups beyond the last Pending
    for (auto& copy : groups.front()) std::memcpy(copy.shared, copy.global, copy.bytes);
    groups.erase(groups.begin());
  }
}
#endif
// ===== end of kfuse prelude =====
"""
