// kfuse_cpu_shim.h -- run kfuse's generated CUDA C on the host CPU.
//
// Included by generated sources when __CUDACC__ is not defined. Every CUDA thread of a block
// has a stack and registers of its own, so __syncthreads, __shared__ memory, atomics, warp
// shuffles and named partial barriers (KF_BAR_SYNC) behave as on the GPU. The blocks of a grid
// run one after another: each thread of the block walks every block in order (z, y, x; x
// fastest), with an internal rendezvous so a block is complete before the next starts.
//
// Two ways to run a block's threads:
//   * fibers (the default on x86-64 Linux with GCC or Clang, KF_SHIM_FIBERS=1): the CUDA
//     threads are user-space contexts that the launching OS thread runs one at a time. A thread
//     that waits (barrier, warp intrinsic, end of block) switches to the next one, round robin,
//     until the thing it waits for has happened: a barrier costs tens (-O2) to hundreds (-O0)
//     of nanoseconds a thread instead of waking every OS thread of the block through the
//     kernel. Stacks are KF_SHIM_FIBER_STACK_KB KiB (environment; default 512, a GPU thread's
//     local memory at most), below each a guard page.
//   * OS threads (elsewhere; with -DKF_SHIM_FIBERS=0; at run time with KF_SHIM_THREADS=1 in the
//     environment, read at every launch): one OS thread per CUDA thread, kept between launches
//     in a pool. Barrier waits yield a few times (KF_SHIM_SPIN, default 4), then sleep on a
//     futex (Linux) or a condition variable (elsewhere, or with -DKF_SHIM_USE_CONDVAR).
// Both keep what they made for a launch (fiber stacks, OS threads) for the next one and give
// it back once unused for KF_SHIM_IDLE_S seconds (default 2).
//
// A program compiled with -DKF_SHIM_LINKED (as kfuse compiles its programs) is linked against
// the shim's runtime library: this header compiled once with -DKF_SHIM_RUNTIME and the same
// flags, which holds the per-CUDA-thread variables and the launch machinery (pools, fibers),
// so that a program compiles only its kernels and the device functions they call (the launch
// machinery was about half of a program's compile time at -O0). Without either, this header
// is all a program needs.
//
// Launch from an extern "C" host function:
//
//     extern "C" int run(const float* in, float* out, int n) {
//       return kf_cpu::launch(dim3((n + 255) / 256), dim3(256), 0, [&] { my_kernel(in, out, n); });
//     }
//
// Per-CUDA-thread storage: `thread_local` is per OS thread, which fibers share; use
// kf_cpu::per_thread<T>() (a T per thread of the launch, in both ways of running).
//
// Limitations:
//   * __shared__ is `static`: one instance per .so shared by all threads; it is NOT reset or
//     poisoned between blocks or launches (on the GPU its content is undefined there anyway).
//     Launches are serialised by a process-wide mutex so concurrent launches cannot share it.
//   * Dynamic shared memory must be declared at function scope with KF_DYNAMIC_SHARED (not with
//     `extern __shared__`). It is poisoned with 0xFF bytes at the start of every block.
//   * Warp intrinsics assume that the threads named in `mask` reach the same intrinsic (full
//     warps, or the block's last partial warp, minus threads that have returned). Lanes of one
//     warp using disjoint masks at the same time are merged into one exchange; that is still
//     correct for shuffles but not guaranteed for arbitrary divergent code. A source lane
//     outside the caller's `width` segment yields the caller's own value (as in CUDA); one that
//     does not exist, has returned or is not in the exchange yields 0 (CUDA: undefined; an H200
//     gives 0 for the missing lanes of a partial warp).
//     __activemask() reports the lanes that have not returned (no divergence tracking).
//   * KF_BAR_SYNC(0, n) uses its own barrier, distinct from __syncthreads (on the GPU both are
//     hardware barrier 0). Arrivals count threads; a partial last warp counts as 32 once all its
//     lanes have arrived. Threads that returned do not count (as on the GPU: it then hangs).
//   * A wait longer than KF_SHIM_TIMEOUT_S seconds (environment; default 60) at any barrier is
//     reported as a deadlock on stderr and the process aborts; an exception escaping a kernel
//     thread aborts too. Invalid launch configurations return an error code instead.
//   * Standard headers that this header does not include itself must be included before it
//     (its keyword macros such as __noinline__ would break them).
//   * Fibers are not preempted: a thread spinning on memory that another thread of its block
//     writes, with no barrier, warp intrinsic or __nanosleep in the loop (those switch), hangs
//     (generated kernels have no such loop). Blocking calls (sleep_for, I/O) block the block.
//   * No half precision, textures, surfaces, cooperative groups, clusters, dynamic parallelism.
//
// Fault injection (for tests proving that tests can fail): KF_SHIM_FAULT_BARRIER (__syncthreads
// does nothing), KF_SHIM_FAULT_SHARED (__shared__ is per thread: thread_local, so it runs on OS
// threads), KF_SHIM_FAULT_ATOMIC (atomics are racy load/yield/store; with fibers the yield
// switches to the next fiber), KF_SHIM_FAULT_SHUFFLE (shuffles return the caller's own value),
// KF_SHIM_FAULT_NAMED_BARRIER (KF_BAR_SYNC does nothing).

#ifndef KFUSE_CPU_SHIM_H
#define KFUSE_CPU_SHIM_H

#if defined(__CUDACC__)
#error "kfuse_cpu_shim.h is for host C++ compilers; nvcc/NVRTC must not include it"
#endif

#if __cplusplus < 202002L
#error "kfuse_cpu_shim.h needs C++20 (-std=c++20)"
#endif

// Standard headers first: the keyword macros below (e.g. __noinline__) would break them.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <semaphore>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>  // getpid: a forked child's pool of threads (POSIX)

#define KF_CPU_SHIM 1

#if defined(__linux__) && !defined(KF_SHIM_USE_CONDVAR)
#define KF_SHIM_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#else
#define KF_SHIM_FUTEX 0
#endif

// Fibers where the context switch below exists (x86-64 System V, GCC or Clang on Linux), unless
// a sanitizer that tracks stacks or threads (ASan, TSan) is on, or __shared__ is thread_local
// (KF_SHIM_FAULT_SHARED: every fiber would see the same copy).
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KF_SHIM_STACK_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KF_SHIM_STACK_SANITIZER 1
#endif
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__)
#define KF_SHIM_FIBERS_SUPPORTED 1
#else
#define KF_SHIM_FIBERS_SUPPORTED 0
#endif
#ifndef KF_SHIM_FIBERS
#if KF_SHIM_FIBERS_SUPPORTED && !defined(KF_SHIM_STACK_SANITIZER)
#define KF_SHIM_FIBERS 1
#else
#define KF_SHIM_FIBERS 0
#endif
#endif
#if defined(KF_SHIM_FAULT_SHARED)
#undef KF_SHIM_FIBERS
#define KF_SHIM_FIBERS 0
#endif
#if KF_SHIM_FIBERS && !KF_SHIM_FIBERS_SUPPORTED
#error "KF_SHIM_FIBERS needs x86-64 Linux and GCC or Clang"
#endif
#if KF_SHIM_FIBERS
#include <sys/mman.h>
#endif

#ifndef KF_SHIM_DEFAULT_SPIN
#define KF_SHIM_DEFAULT_SPIN 4
#endif

// Stack of a fiber in KiB (KF_SHIM_FIBER_STACK_KB overrides it): the suite compiles kernels at
// -O0, and a CUDA thread may hold sizeable local arrays.
#ifndef KF_SHIM_DEFAULT_FIBER_STACK_KB
#define KF_SHIM_DEFAULT_FIBER_STACK_KB 512
#endif

// Largest dynamic shared memory per block a launch may ask for (sm_90: 227 KiB, with opt-in).
#ifndef KF_SHIM_MAX_DYNAMIC_SHARED
#define KF_SHIM_MAX_DYNAMIC_SHARED (227u * 1024u)
#endif

#ifndef KF_SHIM_DEFAULT_TIMEOUT_S
#define KF_SHIM_DEFAULT_TIMEOUT_S 60.0
#endif

// ---------------------------------------------------------------------------------------------
// CUDA keywords
// ---------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#if defined(KF_SHIM_FAULT_SHARED)
#define __shared__ static thread_local  // fault: every thread gets its own copy
#else
#define __shared__ static  // blocks run one after another, so one instance serves every block
#endif

// Everything the shim defines stays inside the .so (no interposition between kfuse libraries),
// but what a linked program shares with the runtime library (KF_SHIM_SHARED).
#pragma GCC visibility push(hidden)
#define KF_SHIM_EXPORT __attribute__((visibility("default")))
// The waits a kernel calls (barriers, warp exchanges): the runtime library's in a linked
// program, declared only (KF_SHIM_WAIT: how they are defined elsewhere).
#if defined(KF_SHIM_RUNTIME)
#define KF_SHIM_WAIT KF_SHIM_EXPORT
#else
#define KF_SHIM_WAIT inline
#endif
#if defined(KF_SHIM_LINKED)
#define KF_SHIM_SHARED(declaration, ...) extern KF_SHIM_EXPORT declaration;
#elif defined(KF_SHIM_RUNTIME)
#define KF_SHIM_SHARED(declaration, ...) KF_SHIM_EXPORT declaration __VA_ARGS__;
#else
#define KF_SHIM_SHARED(declaration, ...) inline declaration __VA_ARGS__;
#endif

// ---------------------------------------------------------------------------------------------
// Vector types, dim3, built-in indices
// ---------------------------------------------------------------------------------------------
#define KF_SHIM_VEC(name, T, A2, A4)                                                          \
  struct __attribute__((aligned(A2))) name##2 { T x, y; };                                    \
  struct name##3 { T x, y, z; };                                                               \
  struct __attribute__((aligned(A4))) name##4 { T x, y, z, w; };                              \
  inline constexpr name##2 make_##name##2(T x, T y) { return name##2{x, y}; }                 \
  inline constexpr name##3 make_##name##3(T x, T y, T z) { return name##3{x, y, z}; }         \
  inline constexpr name##4 make_##name##4(T x, T y, T z, T w) { return name##4{x, y, z, w}; }
KF_SHIM_VEC(char, signed char, 2, 4)
KF_SHIM_VEC(uchar, unsigned char, 2, 4)
KF_SHIM_VEC(short, short, 4, 8)
KF_SHIM_VEC(ushort, unsigned short, 4, 8)
KF_SHIM_VEC(int, int, 8, 16)
KF_SHIM_VEC(uint, unsigned int, 8, 16)
KF_SHIM_VEC(longlong, long long, 16, 16)
KF_SHIM_VEC(ulonglong, unsigned long long, 16, 16)
KF_SHIM_VEC(float, float, 8, 16)
KF_SHIM_VEC(double, double, 16, 16)
#undef KF_SHIM_VEC

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

KF_SHIM_SHARED(thread_local uint3 threadIdx, {0, 0, 0})
KF_SHIM_SHARED(thread_local uint3 blockIdx, {0, 0, 0})
KF_SHIM_SHARED(thread_local dim3 blockDim, {1, 1, 1})
KF_SHIM_SHARED(thread_local dim3 gridDim, {1, 1, 1})
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Runtime internals
// ---------------------------------------------------------------------------------------------
namespace kf_cpu {
namespace detail {

using Clock = std::chrono::steady_clock;

// Print "kfuse cpu shim: <message>" to stderr and abort. Only the first caller prints.
[[noreturn]] inline void die(const char* fmt, ...) {
  static std::atomic<bool> dying{false};
  if (dying.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the first one aborts
  }
  char msg[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, args);
  va_end(args);
  std::fprintf(stderr, "kfuse cpu shim: %s\n", msg);
  std::fflush(stderr);
  std::abort();
}

#if KF_SHIM_FIBERS
// The fibers of the launch running on this OS thread (null on an OS thread of the pool, and
// outside launches): Round and the atomic fault ask it whether to switch or to sleep.
struct Fibers;
KF_SHIM_SHARED(thread_local Fibers* tls_fibers, = nullptr)
// Switch to the next fiber of the ring (round robin); returns when this one runs again.
inline void fiber_yield();
// Deadlines are checked every this many switches of a waiting fiber (Clock::now is slower).
constexpr unsigned kFiberClockEvery = 256;
#endif

// Give the other CUDA threads a turn: the next fiber, or the OS scheduler.
inline void yield_now() {
#if KF_SHIM_FIBERS
  if (tls_fibers != nullptr) return fiber_yield();
#endif
  std::this_thread::yield();
}

// A generation counter that threads sleep on until it moves. Each barrier keeps its bookkeeping
// under its own short-lived mutex; only the sleeping happens here, without that mutex, so that
// a release wakes every waiter without making them queue on the mutex again. Linux: a futex
// with a timeout; elsewhere (or with KF_SHIM_USE_CONDVAR): a mutex and a condition variable.
struct Round {
  std::atomic<uint32_t> gen{0};
#if !KF_SHIM_FUTEX
  std::mutex m;
  std::condition_variable cv;
#endif

  // Current generation; call while holding the barrier's mutex.
  uint32_t current() const { return gen.load(std::memory_order_relaxed); }

  // Start the next generation; call while holding the barrier's mutex, then call wake().
  void advance() {
#if KF_SHIM_FUTEX
    gen.fetch_add(1, std::memory_order_release);
#else
    std::lock_guard<std::mutex> lk(m);
    gen.fetch_add(1, std::memory_order_release);
#endif
  }

  void wake() {
#if KF_SHIM_FIBERS
    if (tls_fibers != nullptr) return;  // waiting fibers look at the generation themselves
#endif
#if KF_SHIM_FUTEX
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
#else
    cv.notify_all();
#endif
  }

  // Wait until the generation differs from `mine`: yield `spins` times, then sleep; after
  // `timeout`, call report() (which must not return). A fiber switches to the next one until
  // the generation has moved; fibers that all wait (a deadlock) go round until the timeout,
  // counted from the wait's kFiberClockEvery-th switch, has passed.
  template <class Report>
  void wait(uint32_t mine, std::chrono::nanoseconds timeout, int spins, Report&& report) {
#if KF_SHIM_FIBERS
    if (tls_fibers != nullptr) {
      Clock::time_point deadline{};
      for (uint64_t n = 1; gen.load(std::memory_order_acquire) == mine; ++n) {
        fiber_yield();
        if (n % kFiberClockEvery == 0) {
          const auto now = Clock::now();
          if (n == kFiberClockEvery) deadline = now + timeout;
          else if (now >= deadline) report();
        }
      }
      return;
    }
#endif
    for (int i = 0; i < spins; ++i) {  // a few yields first: sleeping costs far more
      if (gen.load(std::memory_order_acquire) != mine) return;
      std::this_thread::yield();
    }
    const auto deadline = Clock::now() + timeout;
#if KF_SHIM_FUTEX
    while (gen.load(std::memory_order_acquire) == mine) {
      const auto left = deadline - Clock::now();
      if (left <= std::chrono::nanoseconds::zero()) report();
      const long long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen), FUTEX_WAIT_PRIVATE, mine, &ts,
              nullptr, 0);
    }
#else
    std::unique_lock<std::mutex> lk(m);
    while (gen.load(std::memory_order_acquire) == mine) {
      if (cv.wait_until(lk, deadline) == std::cv_status::timeout &&
          gen.load(std::memory_order_acquire) == mine) {
        lk.unlock();
        report();
      }
    }
#endif
  }
};

struct WarpState {
  std::mutex m;
  Round round;
  uint32_t valid_mask = 0;  // lanes that exist in this warp
  uint32_t live_mask = 0;   // lanes that have not returned from the kernel in this block
  uint32_t want = 0;        // OR of the masks given by this round's arrivals
  uint32_t arrived = 0;     // lanes arrived in this round
  uint64_t slots[4][32] = {};  // lane values, by generation % 4
  uint32_t slot_arrived[4] = {};
};

struct NamedBarrier {
  std::mutex m;
  Round round;
  unsigned arrived = 0;          // threads counted so far (a complete partial warp counts 32)
  unsigned partial_arrived = 0;  // arrivals from the block's partial last warp
};

struct Launch {
  Launch(dim3 g, dim3 b, std::size_t dyn_size, double timeout_s, int spin_count)
      : grid(g), block(b), spins(spin_count), dyn_bytes(dyn_size) {
    nthreads = b.x * b.y * b.z;
    nwarps = (nthreads + 31) / 32;
    partial_lanes = nthreads % 32;
    timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(timeout_s));
    warps = std::make_unique<WarpState[]>(nwarps);
    dyn_alloc = std::max<std::size_t>(dyn_size, 16);
    dyn = static_cast<std::byte*>(::operator new(dyn_alloc, std::align_val_t(64)));
    owned = std::make_unique<std::vector<Owned>[]>(nthreads);
    reset_block_state();
  }
  ~Launch() {
    for (unsigned i = 0; i < nthreads; ++i)
      for (const Owned& o : owned[i]) o.destroy(o.object);
    ::operator delete(dyn, std::align_val_t(64));
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // Prepare for the next block; called while every thread waits in the rendezvous.
  void reset_block_state() {
    live = nthreads;
    arrived = 0;
    acc_count = 0, acc_and = 1, acc_or = 0;
    for (unsigned w = 0; w < nwarps; ++w) {
      const unsigned lanes = std::min(32u, nthreads - 32 * w);
      WarpState& W = warps[w];
      W.valid_mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
      W.live_mask = W.valid_mask;
      W.want = 0;
      W.arrived = 0;
    }
    for (NamedBarrier& B : named) B.arrived = 0, B.partial_arrived = 0;
    std::memset(dyn, 0xFF, dyn_alloc);
  }

  dim3 grid, block;
  unsigned nthreads = 0, nwarps = 0, partial_lanes = 0;
  std::chrono::nanoseconds timeout{};
  int spins = 0;  // yields before a barrier wait sleeps

  // __syncthreads: counts the threads still running in this block.
  std::mutex bm;
  Round bround;
  unsigned live = 0, arrived = 0;
  int acc_count = 0, acc_and = 1, acc_or = 0;
  int res_count[2] = {}, res_and[2] = {}, res_or[2] = {};  // results, by generation % 2

  // End-of-block rendezvous of all threads, returned early or not.
  std::mutex rm;
  Round rround;
  unsigned r_arrived = 0;

  std::unique_ptr<WarpState[]> warps;
  NamedBarrier named[16];
  std::byte* dyn = nullptr;
  std::size_t dyn_bytes = 0, dyn_alloc = 0;

  // kf_cpu::per_thread's objects, by linear thread id (each list is its thread's alone).
  struct Owned {
    const void* key;  // &per_thread_key<T>
    void* object;
    void (*destroy)(void*);
  };
  std::unique_ptr<std::vector<Owned>[]> owned;
};

// kf_cpu::per_thread's key for type T (its address).
template <class T>
inline constexpr char per_thread_key = 0;

KF_SHIM_SHARED(thread_local Launch* tls_launch, = nullptr)
KF_SHIM_SHARED(thread_local unsigned tls_lid, = 0)  // linear thread id x + y*bx + z*bx*by

inline Launch& current(const char* what) {
  Launch* L = tls_launch;
  if (L == nullptr) die("%s called outside kf_cpu::launch", what);
  return *L;
}

#if KF_SHIM_FIBERS
// ----- fibers: the CUDA threads of a block as contexts of the launching OS thread ------------
// The ring of fibers that have not finished is walked round robin: a fiber runs until it waits
// (Round::wait, the atomic fault's yield, __nanosleep) or finishes, then the next one runs.
// The per-CUDA-thread thread-locals (threadIdx, blockIdx, blockDim, gridDim, tls_launch,
// tls_lid) are saved and restored at every switch; any other thread_local is shared.
struct FiberSlot {
  void* sp = nullptr;           // its stack pointer while another fiber runs
  unsigned prev = 0, next = 0;  // neighbours in the ring
  uint3 thread_idx{}, block_idx{};
  dim3 block_dim, grid_dim;
  Launch* launch = nullptr;
  unsigned lid = 0;
};

struct Fibers {
  const std::function<void(unsigned)>* work = nullptr;  // run as work(lid) by fiber lid
  std::unique_ptr<FiberSlot[]> slots;
  unsigned cur = 0;         // the running fiber
  unsigned unfinished = 0;  // fibers in the ring
  void* launcher_sp = nullptr;  // the launching thread's context, resumed when all are done
};

// Save the callee-saved registers of the x86-64 System V ABI (rbx, rbp (the frame pointer),
// r12-r15) on the current stack, store the stack pointer in *from, switch to the stack `to`
// and pop the same registers from it; `ret` then resumes the context saved there. It is a real
// call: the compiler keeps caller-saved registers, flags and the red zone (below rsp, which the
// call's return address ends) out of it and assumes memory changed, as for any opaque call.
// Not saved: the mxcsr and x87 control words (callee-saved too) -- every fiber runs on one OS
// thread and nothing here changes them, so they are the same in all fibers.
[[gnu::naked, gnu::noinline]] inline void fiber_switch(void** /*from*/, void* /*to*/) {
  asm("pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret");
}

// Make fiber `to` run: save the running fiber's thread-locals, restore those of `to`, switch.
inline void fiber_switch_to(Fibers& F, unsigned to) {
  if (to == F.cur) return;
  FiberSlot& a = F.slots[F.cur];
  FiberSlot& b = F.slots[to];
  a.thread_idx = threadIdx, a.block_idx = blockIdx, a.block_dim = blockDim, a.grid_dim = gridDim;
  a.launch = tls_launch, a.lid = tls_lid;
  threadIdx = b.thread_idx, blockIdx = b.block_idx, blockDim = b.block_dim, gridDim = b.grid_dim;
  tls_launch = b.launch, tls_lid = b.lid;
  F.cur = to;
  fiber_switch(&a.sp, b.sp);
}

inline void fiber_yield() {
  Fibers& F = *tls_fibers;
  fiber_switch_to(F, F.slots[F.cur].next);
}

// A fiber's first frame: run its work, leave the ring, and switch to the next fiber (or back to
// the launcher after the last one). Never returns: there is nothing to return to.
[[noreturn]] inline void fiber_entry() noexcept {
  Fibers& F = *tls_fibers;
  (*F.work)(F.cur);
  FiberSlot& me = F.slots[F.cur];
  if (--F.unfinished == 0) {
    fiber_switch(&me.sp, F.launcher_sp);
  } else {
    F.slots[me.prev].next = me.next;
    F.slots[me.next].prev = me.prev;
    fiber_switch_to(F, me.next);
  }
  __builtin_unreachable();  // nothing switches back to a finished fiber
}
#endif

// Seconds from the environment variable `name`, or `fallback` where it is unset, not a number
// or below `least` (or equal to it, where `least` is excluded).
inline double env_seconds(const char* name, double fallback, double least, bool least_ok) {
  if (const char* s = std::getenv(name)) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && (v > least || (least_ok && v == least))) return v;
  }
  return fallback;
}

inline double timeout_seconds() {
  return env_seconds("KF_SHIM_TIMEOUT_S", KF_SHIM_DEFAULT_TIMEOUT_S, 0.0, false);
}

inline int spin_count() {
  if (const char* s = std::getenv("KF_SHIM_SPIN")) return std::max(0, std::atoi(s));
  return KF_SHIM_DEFAULT_SPIN;
}

// Report a barrier wait that timed out and abort.
[[noreturn]] inline void deadlock(const Launch& L, const char* what, unsigned have,
                                  unsigned need) {
  die("deadlock or hang: %s waited %.1f s in block (%u,%u,%u), thread (%u,%u,%u); "
      "%u of %u threads had arrived. A thread skipped a barrier, waits at another one, or is "
      "stuck (set KF_SHIM_TIMEOUT_S to wait longer). Aborting.",
      what, std::chrono::duration<double>(L.timeout).count(), blockIdx.x, blockIdx.y, blockIdx.z,
      threadIdx.x, threadIdx.y, threadIdx.z, have, need);
}

// ----- __syncthreads ------------------------------------------------------------------------
struct SyncResult {
  int count, all, any;
};

// Caller holds L.bm. Completes the current __syncthreads round; then call L.bround.wake().
inline void release_block_barrier(Launch& L) {
  const unsigned g = L.bround.current() & 1u;
  L.res_count[g] = L.acc_count, L.res_and[g] = L.acc_and, L.res_or[g] = L.acc_or;
  L.acc_count = 0, L.acc_and = 1, L.acc_or = 0;
  L.arrived = 0;
  L.bround.advance();
}

#if defined(KF_SHIM_LINKED)
KF_SHIM_EXPORT SyncResult block_sync(int pred);
#else
KF_SHIM_WAIT SyncResult block_sync(int pred) {
#if defined(KF_SHIM_FAULT_BARRIER)
  const int p = pred != 0;
  return {p, p, p};
#else
  Launch& L = current("__syncthreads");
  std::unique_lock<std::mutex> lk(L.bm);
  L.acc_count += pred != 0;
  L.acc_and &= pred != 0;
  L.acc_or |= pred != 0;
  const uint32_t mine = L.bround.current();
  const unsigned g = mine & 1u;
  if (++L.arrived >= L.live) {
    release_block_barrier(L);
    lk.unlock();
    L.bround.wake();
  } else {
    lk.unlock();
    L.bround.wait(mine, L.timeout, L.spins, [&] {
      std::unique_lock<std::mutex> hold(L.bm);
      deadlock(L, "__syncthreads", L.arrived, L.live);
    });
  }
  // Safe without the lock: generation mine + 2 cannot complete before this thread arrives.
  return {L.res_count[g], L.res_and[g], L.res_or[g]};
#endif
}
#endif  // KF_SHIM_LINKED

// ----- warp exchange (shuffles, votes, __syncwarp) ------------------------------------------
// Caller holds W.m. Completes the round if every wanted live lane has arrived; returns whether
// it did (then call W.round.wake()).
inline bool try_release_warp(WarpState& W) {
  if (W.arrived == 0 || (W.want & W.live_mask & ~W.arrived) != 0) return false;
  W.slot_arrived[W.round.current() & 3u] = W.arrived;
  W.want = 0;
  W.arrived = 0;
  W.round.advance();
  return true;
}

// Publish `value` for this lane, wait for the live lanes in `mask`; the values of that round
// (slots[32]) and the lanes that took part (*arrived).
#if defined(KF_SHIM_LINKED)
KF_SHIM_EXPORT const uint64_t* warp_round(uint32_t mask, uint64_t value, uint32_t* arrived);
#else
KF_SHIM_WAIT const uint64_t* warp_round(uint32_t mask, uint64_t value, uint32_t* arrived) {
  Launch& L = current("warp intrinsic");
  const unsigned lane = tls_lid & 31u;
  WarpState& W = L.warps[tls_lid >> 5];
  const uint32_t bit = 1u << lane;
  std::unique_lock<std::mutex> lk(W.m);
  const uint32_t mine = W.round.current();
  const unsigned slot = mine & 3u;
  W.slots[slot][lane] = value;
  W.arrived |= bit;
  W.want |= mask | bit;
  if (try_release_warp(W)) {
    lk.unlock();
    W.round.wake();
  } else {
    lk.unlock();
    W.round.wait(mine, L.timeout, L.spins, [&] {
      std::unique_lock<std::mutex> hold(W.m);
      deadlock(L, "warp intrinsic (shuffle/vote/__syncwarp)",
               static_cast<unsigned>(std::popcount(W.arrived)),
               static_cast<unsigned>(std::popcount(W.want & W.live_mask)));
    });
  }
  // Slot `mine % 4` is rewritten only 4 rounds later, which needs this lane to arrive again.
  *arrived = W.slot_arrived[slot];
  return W.slots[slot];
}
#endif  // KF_SHIM_LINKED

// warp_round, then read(slots[32], arrived_mask) for the values of that round.
template <class Read>
inline auto warp_exchange(uint32_t mask, uint64_t value, Read&& read) {
  uint32_t arrived = 0;
  const uint64_t* slots = warp_round(mask, value, &arrived);
  return read(slots, arrived);
}

enum class Shfl { Idx, Up, Down, Xor };

// Source lane of a shuffle (PTX shfl semantics), or -1 when the caller keeps its own value.
inline int shfl_source(Shfl mode, unsigned lane, unsigned arg, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    die("shuffle width %d is not a power of two in [1, 32]", width);
  const unsigned w = static_cast<unsigned>(width);
  const unsigned first = lane & ~(w - 1);
  const unsigned last = first | (w - 1);
  switch (mode) {
    case Shfl::Idx: return static_cast<int>(first | (arg & (w - 1)));
    case Shfl::Up: return lane - first >= arg ? static_cast<int>(lane - arg) : -1;
    case Shfl::Down: return arg <= last - lane ? static_cast<int>(lane + arg) : -1;
    case Shfl::Xor: {
      const unsigned j = lane ^ arg;
      return j <= last ? static_cast<int>(j) : -1;
    }
  }
  return -1;
}

template <class T>
concept Shufflable = std::is_arithmetic_v<T> && sizeof(T) <= 8;

template <Shufflable T>
inline T shuffle(Shfl mode, uint32_t mask, T var, unsigned arg, int width) {
#if defined(KF_SHIM_FAULT_SHUFFLE)
  (void)mode, (void)mask, (void)arg, (void)width;
  return var;
#else
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  const int src = shfl_source(mode, tls_lid & 31u, arg, width);
  const uint64_t got = warp_exchange(mask, bits, [&](const uint64_t* s, uint32_t arrived) {
    // Outside the caller's segment: own value (CUDA). A source lane that does not exist, has
    // returned or did not take part: 0 (undefined in CUDA; an H200 gives 0 for missing lanes).
    if (src < 0) return bits;
    return ((arrived >> src) & 1u) ? s[src] : uint64_t{0};
  });
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
#endif
}

// Call f(lane, value) for every lane set in `lanes`; used by votes and reductions.
template <class F>
inline void for_lanes(const uint64_t* s, uint32_t lanes, F&& f) {
  while (lanes) {
    const int l = std::countr_zero(lanes);
    f(l, s[l]);
    lanes &= lanes - 1;
  }
}

// ----- named barriers (PTX bar.sync id, count) ----------------------------------------------
#if defined(KF_SHIM_LINKED)
KF_SHIM_EXPORT void bar_sync(unsigned id, unsigned count);
#else
KF_SHIM_WAIT void bar_sync(unsigned id, unsigned count) {
#if defined(KF_SHIM_FAULT_NAMED_BARRIER)
  (void)id, (void)count;
#else
  Launch& L = current("KF_BAR_SYNC");
  if (id >= 16) die("KF_BAR_SYNC: barrier id %u is not in [0, 15]", id);
  if (count == 0 || count % 32 != 0)
    die("KF_BAR_SYNC(%u, %u): the thread count must be a positive multiple of 32", id, count);
  if (count > L.nwarps * 32)
    die("KF_BAR_SYNC(%u, %u): the block has only %u threads", id, count, L.nthreads);
  NamedBarrier& B = L.named[id];
  std::unique_lock<std::mutex> lk(B.m);
  const uint32_t mine = B.round.current();
  B.arrived += 1;
  if (L.partial_lanes != 0 && (tls_lid >> 5) == L.nwarps - 1 &&
      ++B.partial_arrived == L.partial_lanes)
    B.arrived += 32 - L.partial_lanes;  // a complete partial warp counts as a full warp
  if (B.arrived >= count) {
    B.arrived = 0;
    B.partial_arrived = 0;
    B.round.advance();
    lk.unlock();
    B.round.wake();
    return;
  }
  lk.unlock();
  B.round.wait(mine, L.timeout, L.spins, [&] {
    char what[64];
    std::snprintf(what, sizeof what, "KF_BAR_SYNC(%u, %u)", id, count);
    std::unique_lock<std::mutex> hold(B.m);
    deadlock(L, what, B.arrived, count);
  });
#endif
}
#endif  // KF_SHIM_LINKED

// ----- per-thread driver --------------------------------------------------------------------
// The thread has returned from the kernel body for this block: barriers stop counting it.
inline void thread_exit(Launch& L, unsigned lid) {
  {
    std::unique_lock<std::mutex> lk(L.bm);
    --L.live;
    if (L.arrived > 0 && L.arrived >= L.live) {
      release_block_barrier(L);
      lk.unlock();
      L.bround.wake();
    }
  }
  WarpState& W = L.warps[lid >> 5];
  std::unique_lock<std::mutex> lk(W.m);
  W.live_mask &= ~(1u << (lid & 31u));
  if (try_release_warp(W)) {
    lk.unlock();
    W.round.wake();
  }
}

// Wait for all threads of the launch; the last one resets per-block state.
inline void end_of_block(Launch& L) {
  std::unique_lock<std::mutex> lk(L.rm);
  const uint32_t mine = L.rround.current();
  if (++L.r_arrived == L.nthreads) {
    L.reset_block_state();
    L.r_arrived = 0;
    L.rround.advance();
    lk.unlock();
    L.rround.wake();
    return;
  }
  lk.unlock();
  // Twice the timeout, so that a thread stuck at a barrier reports first.
  L.rround.wait(mine, 2 * L.timeout, L.spins, [&] {
    std::unique_lock<std::mutex> hold(L.rm);
    deadlock(L, "end of block (waiting for the block's other threads to finish)",
             L.r_arrived, L.nthreads);
  });
}

template <class Body>
inline void thread_main(Launch& L, unsigned lid, Body& body) {
  tls_launch = &L;
  tls_lid = lid;
  const unsigned bx = L.block.x, by = L.block.y;
  threadIdx = uint3{lid % bx, (lid / bx) % by, lid / (bx * by)};
  blockDim = L.block;
  gridDim = L.grid;
  for (unsigned z = 0; z < L.grid.z; ++z)
    for (unsigned y = 0; y < L.grid.y; ++y)
      for (unsigned x = 0; x < L.grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        try {
          body();
        } catch (const std::exception& e) {
          die("exception in kernel thread (%u,%u,%u) of block (%u,%u,%u): %s", threadIdx.x,
              threadIdx.y, threadIdx.z, x, y, z, e.what());
        } catch (...) {
          die("unknown exception in kernel thread (%u,%u,%u) of block (%u,%u,%u)", threadIdx.x,
              threadIdx.y, threadIdx.z, x, y, z);
        }
        thread_exit(L, lid);
        end_of_block(L);
      }
  tls_launch = nullptr;
}

// ----- the host threads, kept between launches ----------------------------------------------
// Creating the OS threads of a block at every launch costs far more than the kernels the tests
// run (about 0.1 ms a thread in a container: 25 ms for a block of 256). The shim keeps them:
// a launch hands its work to the first `nthreads` threads of the process's pool, creating any
// that are missing; a thread idle for KF_SHIM_IDLE_S seconds (default 2) exits.
struct PoolThread {
  std::binary_semaphore go{0};  // released once per launch that uses this thread
  bool alive = false;           // under Pool::m
};

struct Pool {
  std::mutex m;
  std::vector<std::unique_ptr<PoolThread>> threads;
  const std::function<void(unsigned)>* work = nullptr;  // the current launch's, per thread id
  std::atomic<unsigned> pending{0};                      // its threads still running
  pid_t pid = getpid();
};

inline std::chrono::milliseconds idle_time() {
  const double seconds = env_seconds("KF_SHIM_IDLE_S", 2.0, 0.0, true);
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// The process's pool (never destroyed: its idle threads are detached). A child made by fork
// has none of its parent's threads, so it starts a pool of its own.
inline Pool& pool() {
  static Pool* instance = nullptr;
  if (instance == nullptr || instance->pid != getpid()) instance = new Pool();
  return *instance;
}

inline void pool_thread_main(Pool* P, PoolThread* T, unsigned lid) {
  const auto idle = idle_time();
  for (;;) {
    if (!T->go.try_acquire_for(idle)) {
      std::lock_guard<std::mutex> lk(P->m);
      if (!T->go.try_acquire()) {  // no launch released it meanwhile: exit
        T->alive = false;
        return;
      }
    }
    (*P->work)(lid);
    if (P->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) P->pending.notify_all();
  }
}

// Run `work(lid)` for lid in [0, nthreads) on the pool's threads and wait for all of them.
// Returns false (nothing run) if a missing thread could not be created (`why` says why).
inline bool run_on_pool(unsigned nthreads, const std::function<void(unsigned)>& work,
                        std::string& why) {
  Pool& P = pool();
  {
    std::lock_guard<std::mutex> lk(P.m);
    while (P.threads.size() < nthreads) P.threads.push_back(std::make_unique<PoolThread>());
    try {
      for (unsigned i = 0; i < nthreads; ++i) {
        PoolThread* T = P.threads[i].get();
        if (!T->alive) {
          std::thread(pool_thread_main, &P, T, i).detach();
          T->alive = true;
        }
      }
    } catch (const std::exception& e) {
      why = e.what();
      return false;
    }
    P.work = &work;
    P.pending.store(nthreads, std::memory_order_release);
    for (unsigned i = 0; i < nthreads; ++i) P.threads[i]->go.release();
  }
  for (unsigned left; (left = P.pending.load(std::memory_order_acquire)) != 0;)
    P.pending.wait(left, std::memory_order_acquire);
  return true;
}

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

#if KF_SHIM_FIBERS
// ----- fiber stacks, kept between launches ----------------------------------------------------
// One mapping holds `count` stacks of `bytes` each, with a PROT_NONE guard page below each
// (an overflow faults instead of writing into the next stack). Mapping and first touching
// them costs far more than a launch of the tests' kernels, so they are kept; but every kfuse
// library has its own (the shim is hidden in each) and a process loads hundreds, each stack
// being two kernel mappings (of at most 65530 by default) and its touched pages staying
// resident, so a reaper thread gives them back once unused for KF_SHIM_IDLE_S seconds, as the
// pool's idle threads exit.
struct FiberStacks {
  std::mutex m;  // between the launch using them (which holds launch_mutex too) and the reaper
  std::byte* base = nullptr;
  std::size_t count = 0, bytes = 0, page = 0;
  bool in_use = false, reaper = false;
  Clock::time_point last_used{};
  pid_t pid = getpid();

  std::byte* top(unsigned i) const { return base + (i + 1) * (page + bytes); }

  void release() {
    if (base != nullptr) munmap(base, count * (page + bytes));
    base = nullptr, count = 0;
  }

  // `n` stacks of `stack_bytes` each (mapped anew if there are fewer, or of another size).
  bool reserve(unsigned n, std::size_t stack_bytes, std::string& why) {
    page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    stack_bytes = (stack_bytes + page - 1) / page * page;
    if (base != nullptr && count >= n && bytes == stack_bytes) return true;
    release();
    const std::size_t each = page + stack_bytes;
    void* p = mmap(nullptr, n * each, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) {
      why = std::strerror(errno);
      return false;
    }
    base = static_cast<std::byte*>(p), count = n, bytes = stack_bytes;
    for (unsigned i = 0; i < n; ++i) {
      if (mprotect(base + i * each, page, PROT_NONE) != 0) {
        why = std::strerror(errno);
        release();
        return false;
      }
    }
    return true;
  }
};

// The process's stacks; call while holding launch_mutex(). A child made by fork starts afresh
// (leaving its copy of the parent's mapping alone): its copy of the mutex may have been taken
// by the parent's reaper, a thread the child does not have.
inline FiberStacks& fiber_stacks() {
  static FiberStacks* instance = nullptr;
  if (instance == nullptr || instance->pid != getpid()) instance = new FiberStacks();
  return *instance;
}

inline std::size_t fiber_stack_bytes() {
  long kib = KF_SHIM_DEFAULT_FIBER_STACK_KB;
  if (const char* s = std::getenv("KF_SHIM_FIBER_STACK_KB")) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end != s && v >= 16 && v <= (1l << 22)) kib = v;  // 16 KiB to 4 GiB
  }
  return static_cast<std::size_t>(kib) * 1024u;
}

// The reaper: gives the stacks back once no launch has used them for KF_SHIM_IDLE_S seconds.
inline void reap_fiber_stacks(FiberStacks* S) {
  const auto idle = idle_time();
  for (;;) {
    std::this_thread::sleep_for(idle);
    std::lock_guard<std::mutex> lk(S->m);
    if (!S->in_use && Clock::now() - S->last_used >= idle) {
      S->release();
      S->reaper = false;
      return;
    }
  }
}

// Run `work(lid)` for lid in [0, nthreads) as fibers on this thread and return once all have
// finished. Returns false (nothing run) if the stacks could not be mapped (`why` says why).
// The caller holds launch_mutex().
inline bool run_on_fibers(unsigned nthreads, const std::function<void(unsigned)>& work,
                          std::string& why) {
  FiberStacks& S = fiber_stacks();
  {
    std::lock_guard<std::mutex> lk(S.m);
    if (!S.reserve(nthreads, fiber_stack_bytes(), why)) return false;
    S.in_use = true;
  }
  Fibers F;
  F.work = &work;
  F.slots = std::make_unique<FiberSlot[]>(nthreads);
  F.unfinished = nthreads;
  for (unsigned i = 0; i < nthreads; ++i) {
    FiberSlot& f = F.slots[i];
    f.prev = (i + nthreads - 1) % nthreads, f.next = (i + 1) % nthreads;
    // The frame fiber_switch pops: six registers (zero: rbp ends frame-pointer walks), then
    // fiber_entry as the return address, then a null return address for fiber_entry itself,
    // so that it starts with rsp = 8 (mod 16) like any called function.
    void** sp = reinterpret_cast<void**>(S.top(i)) - 8;  // top(i) is page-aligned
    for (int r = 0; r < 6; ++r) sp[r] = nullptr;
    sp[6] = reinterpret_cast<void*>(&fiber_entry);
    sp[7] = nullptr;
    f.sp = sp;
  }
  // The launching thread's own thread-locals, which the fibers change.
  const uint3 thread_idx = threadIdx, block_idx = blockIdx;
  const dim3 block_dim = blockDim, grid_dim = gridDim;
  Launch* const launch = tls_launch;
  const unsigned lid = tls_lid;
  tls_fibers = &F;
  F.cur = 0;
  fiber_switch(&F.launcher_sp, F.slots[0].sp);  // back here once every fiber has finished
  tls_fibers = nullptr;
  threadIdx = thread_idx, blockIdx = block_idx, blockDim = block_dim, gridDim = grid_dim;
  tls_launch = launch, tls_lid = lid;

  std::lock_guard<std::mutex> lk(S.m);
  S.in_use = false;
  S.last_used = Clock::now();
  if (!S.reaper) {
    try {
      std::thread(reap_fiber_stacks, &S).detach();
      S.reaper = true;
    } catch (const std::exception&) {  // no thread to spare: the stacks stay until a later try
    }
  }
  return true;
}
#endif

// KF_SHIM_THREADS (environment, read at every launch): any value but "" and "0" runs a
// block's threads on OS threads even where fibers are compiled in.
inline bool use_fibers() {
#if KF_SHIM_FIBERS
  const char* s = std::getenv("KF_SHIM_THREADS");
  return s == nullptr || s[0] == '\0' || std::strcmp(s, "0") == 0;
#else
  return false;
#endif
}

inline std::string& last_error_text() {
  static std::string s;
  return s;
}

inline int fail(int code, const char* fmt, ...) {
  char msg[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, args);
  va_end(args);
  last_error_text() = msg;
  return code;
}

// Atomic read-modify-write through a CAS loop (or, under the fault, a racy load/yield/store).
template <class T, class Op>
inline T atomic_update(T* address, Op op) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
#if defined(KF_SHIM_FAULT_ATOMIC)
  yield_now();
  ref.store(op(old), std::memory_order_relaxed);
#else
  while (!ref.compare_exchange_weak(old, op(old), std::memory_order_seq_cst,
                                    std::memory_order_relaxed)) {
  }
#endif
  return old;
}

#if defined(KF_SHIM_FAULT_ATOMIC)
#define KF_SHIM_RMW(T, address, fast, expr) \
  return ::kf_cpu::detail::atomic_update<T>(address, [&](T old) { return static_cast<T>(expr); })
#else
#define KF_SHIM_RMW(T, address, fast, expr) return std::atomic_ref<T>(*(address)).fast
#endif

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Launch API
// ---------------------------------------------------------------------------------------------

#if defined(KF_SHIM_LINKED)
// The runtime library's launch of a body called through ``call`` and its last error.
KF_SHIM_EXPORT int launch_erased(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
                                 void (*call)(void*), void* body);
KF_SHIM_EXPORT const char* last_error_of_runtime();

// Message of the last failed launch ("" if none).
inline const char* last_error() { return last_error_of_runtime(); }

// Run `body` (a callable invoking the kernel) on every thread of every block of `grid` (in
// the runtime library: see launch below).
template <class F>
int launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, F&& body) {
  using Body = std::remove_reference_t<F>;
  return launch_erased(grid, block, dynamic_shared_bytes,
                       [](void* called) { (*static_cast<Body*>(called))(); },
                       const_cast<void*>(static_cast<const void*>(&body)));
}
#else
// Message of the last failed launch ("" if none).
inline const char* last_error() { return detail::last_error_text().c_str(); }

// Run `body` (a callable invoking the kernel) on every thread of every block of `grid`.
// Returns 0, or a CUDA-like error code (9: invalid configuration, 2: could not create threads)
// with the reason in last_error(). Launches are serialised process-wide.
template <class F>
int launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, F&& body) {
  std::lock_guard<std::mutex> serial(detail::launch_mutex());
  detail::last_error_text().clear();
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
    return detail::fail(9, "invalid grid (%u, %u, %u)", grid.x, grid.y, grid.z);
  if (nthreads == 0 || nthreads > 1024 || block.z > 64)
    return detail::fail(9, "invalid block (%u, %u, %u): 1 to 1024 threads, z <= 64", block.x,
                        block.y, block.z);
  if (dynamic_shared_bytes > KF_SHIM_MAX_DYNAMIC_SHARED)
    return detail::fail(9, "%zu bytes of dynamic shared memory exceed the limit of %zu",
                        dynamic_shared_bytes, std::size_t{KF_SHIM_MAX_DYNAMIC_SHARED});
  detail::Launch L(grid, block, dynamic_shared_bytes, detail::timeout_seconds(),
                   detail::spin_count());
  const std::function<void(unsigned)> work = [&L, &body](unsigned lid) {
    detail::thread_main(L, lid, body);
  };
  std::string why;
  // Fibers, unless KF_SHIM_THREADS says otherwise or their stacks cannot be mapped (then the
  // OS threads run the launch).
#if KF_SHIM_FIBERS
  if (detail::use_fibers() && detail::run_on_fibers(static_cast<unsigned>(nthreads), work, why))
    return 0;
#endif
  if (!detail::run_on_pool(static_cast<unsigned>(nthreads), work, why))
    return detail::fail(2, "could not create %llu threads: %s", nthreads, why.c_str());
  return 0;
}

#if defined(KF_SHIM_RUNTIME)
KF_SHIM_EXPORT int launch_erased(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
                                 void (*call)(void*), void* body) {
  return launch(grid, block, dynamic_shared_bytes, [call, body] { call(body); });
}
KF_SHIM_EXPORT const char* last_error_of_runtime() { return last_error(); }
#endif
#endif  // KF_SHIM_LINKED

// The calling CUDA thread's own T for this launch: value-initialised at its first use, destroyed
// when the launch returns. Use it where a kernel would keep per-thread state in a `thread_local`
// (which fibers share: they run on one OS thread).
template <class T>
T& per_thread() {
  detail::Launch& L = detail::current("kf_cpu::per_thread");
  std::vector<detail::Launch::Owned>& mine = L.owned[detail::tls_lid];
  for (const detail::Launch::Owned& o : mine)
    if (o.key == &detail::per_thread_key<T>) return *static_cast<T*>(o.object);
  auto object = std::make_unique<T>();
  mine.push_back({&detail::per_thread_key<T>, object.get(),
                  [](void* p) { delete static_cast<T*>(p); }});
  return *object.release();
}

}  // namespace kf_cpu

// kernel<<<grid, block, shmem>>>(args...) for the CPU: KF_CPU_LAUNCH(kernel, grid, block, shmem,
// args...). Evaluates to the launch's return code.
#define KF_CPU_LAUNCH(kernel, grid, block, shmem, ...) \
  ::kf_cpu::launch((grid), (block), (shmem), [&] { kernel(__VA_ARGS__); })

// ---------------------------------------------------------------------------------------------
// Synchronisation
// ---------------------------------------------------------------------------------------------
inline void __syncthreads() { (void)kf_cpu::detail::block_sync(0); }
inline int __syncthreads_count(int pred) { return kf_cpu::detail::block_sync(pred).count; }
inline int __syncthreads_and(int pred) { return kf_cpu::detail::block_sync(pred).all; }
inline int __syncthreads_or(int pred) { return kf_cpu::detail::block_sync(pred).any; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// PTX `bar.sync id, count`: the first `count` threads to arrive at barrier `id` (0..15) are
// released together and the barrier resets. `count` is a positive multiple of 32.
#define KF_BAR_SYNC(id, count) \
  ::kf_cpu::detail::bar_sync(static_cast<unsigned>(id), static_cast<unsigned>(count))

// Declare `type* const name` pointing at the launch's dynamic shared memory (16-byte aligned,
// filled with 0xFF bytes at the start of every block). Use at function scope.
#define KF_DYNAMIC_SHARED(type, name)                               \
  type* const name = reinterpret_cast<type*>(                       \
      ::kf_cpu::detail::current("KF_DYNAMIC_SHARED").dyn)
// The same from byte `offset` of it on (kernels side by side in one block).
#define KF_DYNAMIC_SHARED_AT(type, name, offset)                    \
  type* const name = reinterpret_cast<type*>(                       \
      ::kf_cpu::detail::current("KF_DYNAMIC_SHARED").dyn + (offset))

// ---------------------------------------------------------------------------------------------
// Warp intrinsics (warp = 32 consecutive linear thread ids)
// ---------------------------------------------------------------------------------------------
template <kf_cpu::detail::Shufflable T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  return kf_cpu::detail::shuffle(kf_cpu::detail::Shfl::Idx, mask, var,
                                 static_cast<unsigned>(srcLane), width);
}
template <kf_cpu::detail::Shufflable T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return kf_cpu::detail::shuffle(kf_cpu::detail::Shfl::Up, mask, var, delta, width);
}
template <kf_cpu::detail::Shufflable T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return kf_cpu::detail::shuffle(kf_cpu::detail::Shfl::Down, mask, var, delta, width);
}
template <kf_cpu::detail::Shufflable T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  return kf_cpu::detail::shuffle(kf_cpu::detail::Shfl::Xor, mask, var,
                                 static_cast<unsigned>(laneMask), width);
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  kf_cpu::detail::warp_exchange(mask, 0, [](const uint64_t*, uint32_t) { return 0; });
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
  return kf_cpu::detail::warp_exchange(mask, pred != 0, [&](const uint64_t* s, uint32_t arrived) {
    unsigned r = 0;
    kf_cpu::detail::for_lanes(s, arrived & mask, [&](int l, uint64_t v) {
      if (v) r |= 1u << l;
    });
    return r;
  });
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
  return kf_cpu::detail::warp_exchange(mask, pred != 0, [&](const uint64_t* s, uint32_t arrived) {
    int all = 1;
    kf_cpu::detail::for_lanes(s, arrived & mask, [&](int, uint64_t v) { all &= v != 0; });
    return all;
  });
}

// Lanes of the caller's warp that have not returned (the GPU may report fewer when diverged).
inline unsigned __activemask() {
  kf_cpu::detail::Launch& L = kf_cpu::detail::current("__activemask");
  kf_cpu::detail::WarpState& W = L.warps[kf_cpu::detail::tls_lid >> 5];
  std::lock_guard<std::mutex> lk(W.m);
  return W.live_mask;
}

#define KF_SHIM_WARP_REDUCE(name, T, init, combine)                                          \
  inline T name(unsigned mask, T value) {                                                     \
    uint64_t bits = 0;                                                                        \
    std::memcpy(&bits, &value, sizeof(T));                                                    \
    return kf_cpu::detail::warp_exchange(mask, bits, [&](const uint64_t* s, uint32_t arr) {  \
      T acc = init;                                                                           \
      kf_cpu::detail::for_lanes(s, arr & mask, [&](int, uint64_t b) {                         \
        T v;                                                                                  \
        std::memcpy(&v, &b, sizeof(T));                                                       \
        acc = combine;                                                                        \
      });                                                                                     \
      return acc;                                                                             \
    });                                                                                       \
  }
KF_SHIM_WARP_REDUCE(__reduce_add_sync, int, 0, static_cast<int>(0u + acc + v))
KF_SHIM_WARP_REDUCE(__reduce_add_sync, unsigned, 0u, acc + v)
KF_SHIM_WARP_REDUCE(__reduce_min_sync, int, INT_MAX, std::min(acc, v))
KF_SHIM_WARP_REDUCE(__reduce_min_sync, unsigned, UINT_MAX, std::min(acc, v))
KF_SHIM_WARP_REDUCE(__reduce_max_sync, int, INT_MIN, std::max(acc, v))
KF_SHIM_WARP_REDUCE(__reduce_max_sync, unsigned, 0u, std::max(acc, v))
KF_SHIM_WARP_REDUCE(__reduce_and_sync, unsigned, ~0u, acc & v)
KF_SHIM_WARP_REDUCE(__reduce_or_sync, unsigned, 0u, acc | v)
KF_SHIM_WARP_REDUCE(__reduce_xor_sync, unsigned, 0u, acc ^ v)
#undef KF_SHIM_WARP_REDUCE

// ---------------------------------------------------------------------------------------------
// Atomics (global and shared memory alike; return the old value)
// ---------------------------------------------------------------------------------------------
#define KF_SHIM_ATOMIC_ADD_SUB(T)                                                    \
  inline T atomicAdd(T* address, T val) {                                            \
    KF_SHIM_RMW(T, address, fetch_add(val), old + val);                              \
  }
KF_SHIM_ATOMIC_ADD_SUB(int)
KF_SHIM_ATOMIC_ADD_SUB(unsigned int)
KF_SHIM_ATOMIC_ADD_SUB(unsigned long long)
KF_SHIM_ATOMIC_ADD_SUB(float)
KF_SHIM_ATOMIC_ADD_SUB(double)
#undef KF_SHIM_ATOMIC_ADD_SUB

inline int atomicSub(int* address, int val) { KF_SHIM_RMW(int, address, fetch_sub(val), old - val); }
inline unsigned atomicSub(unsigned* address, unsigned val) {
  KF_SHIM_RMW(unsigned, address, fetch_sub(val), old - val);
}

#define KF_SHIM_ATOMIC_MINMAX(T)                                                             \
  inline T atomicMin(T* address, T val) {                                                    \
    return kf_cpu::detail::atomic_update<T>(address, [&](T old) { return std::min(old, val); }); \
  }                                                                                          \
  inline T atomicMax(T* address, T val) {                                                    \
    return kf_cpu::detail::atomic_update<T>(address, [&](T old) { return std::max(old, val); }); \
  }
KF_SHIM_ATOMIC_MINMAX(int)
KF_SHIM_ATOMIC_MINMAX(unsigned int)
KF_SHIM_ATOMIC_MINMAX(long long)
KF_SHIM_ATOMIC_MINMAX(unsigned long long)
#undef KF_SHIM_ATOMIC_MINMAX

#define KF_SHIM_ATOMIC_EXCH(T) \
  inline T atomicExch(T* address, T val) { KF_SHIM_RMW(T, address, exchange(val), val); }
KF_SHIM_ATOMIC_EXCH(int)
KF_SHIM_ATOMIC_EXCH(unsigned int)
KF_SHIM_ATOMIC_EXCH(unsigned long long)
KF_SHIM_ATOMIC_EXCH(float)
#undef KF_SHIM_ATOMIC_EXCH

#define KF_SHIM_ATOMIC_CAS(T)                                                         \
  inline T atomicCAS(T* address, T compare, T val) {                                  \
    return kf_cpu::detail::atomic_update<T>(                                           \
        address, [&](T old) { return old == compare ? val : old; });                  \
  }
KF_SHIM_ATOMIC_CAS(int)
KF_SHIM_ATOMIC_CAS(unsigned int)
KF_SHIM_ATOMIC_CAS(unsigned short)
KF_SHIM_ATOMIC_CAS(unsigned long long)
#undef KF_SHIM_ATOMIC_CAS

#define KF_SHIM_ATOMIC_BITS(T)                                                                \
  inline T atomicAnd(T* address, T val) { KF_SHIM_RMW(T, address, fetch_and(val), old & val); } \
  inline T atomicOr(T* address, T val) { KF_SHIM_RMW(T, address, fetch_or(val), old | val); }   \
  inline T atomicXor(T* address, T val) { KF_SHIM_RMW(T, address, fetch_xor(val), old ^ val); }
KF_SHIM_ATOMIC_BITS(int)
KF_SHIM_ATOMIC_BITS(unsigned int)
KF_SHIM_ATOMIC_BITS(unsigned long long)
#undef KF_SHIM_ATOMIC_BITS

inline unsigned atomicInc(unsigned* address, unsigned val) {
  return kf_cpu::detail::atomic_update<unsigned>(
      address, [&](unsigned old) { return old >= val ? 0u : old + 1u; });
}
inline unsigned atomicDec(unsigned* address, unsigned val) {
  return kf_cpu::detail::atomic_update<unsigned>(
      address, [&](unsigned old) { return (old == 0u || old > val) ? val : old - 1u; });
}
#undef KF_SHIM_RMW

// ---------------------------------------------------------------------------------------------
// Bit casts, math, integer intrinsics, loads
// ---------------------------------------------------------------------------------------------
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
inline double rcbrt(double x) { return 1.0 / std::cbrt(x); }
inline float fdividef(float a, float b) { return a / b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x), *c = std::cos(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline double __dsqrt_rn(double x) { return std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
// Clamp to [0, 1]; NaN gives 0.
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
inline float sinpif(float x) { return std::sin(3.14159265358979323846f * x); }
inline float cospif(float x) { return std::cos(3.14159265358979323846f * x); }
inline double sinpi(double x) { return std::sin(3.14159265358979323846 * x); }
inline double cospi(double x) { return std::cos(3.14159265358979323846 * x); }

inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i, x >>= 1) r = (r << 1) | (x & 1u);
  return r;
}
inline int __mulhi(int a, int b) { return static_cast<int>((1ll * a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((1ull * a * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  __extension__ using u128 = unsigned __int128;
  return static_cast<unsigned long long>((static_cast<u128>(a) * b) >> 64);
}

// CUDA's min/max for mixed arithmetic types (usual arithmetic conversions; fmin/fmax for
// floating point, which return the non-NaN operand).
template <class A, class B>
  requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) return std::fmin(C(a), C(b));
  else return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B>
  requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) return std::fmax(C(a), C(b));
  else return C(a) < C(b) ? C(b) : C(a);
}

template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldca(const T* p) { return *p; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline T __ldlu(const T* p) { return *p; }
template <class T>
inline T __ldcv(const T* p) { return *p; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
template <class T>
inline void __stwt(T* p, T v) { *p = v; }

inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             kf_cpu::detail::Clock::now().time_since_epoch())
      .count();
}
// With fibers, a switch to the next one instead (a wait loop backing off lets the others run).
inline void __nanosleep(unsigned ns) {
#if KF_SHIM_FIBERS
  if (kf_cpu::detail::tls_fibers != nullptr) return kf_cpu::detail::fiber_yield();
#endif
  std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}
[[noreturn]] inline void __trap() { kf_cpu::detail::die("__trap() called in a kernel"); }

#pragma GCC visibility pop

#endif  // KFUSE_CPU_SHIM_H
