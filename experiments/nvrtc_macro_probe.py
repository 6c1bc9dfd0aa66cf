"""Which ways of redefining ``__global__`` around a user's source NVRTC honours: it ignores
``#pragma push_macro`` / ``pop_macro`` (the kernel after them is no kernel: "named symbol not
found"), and ``__global__`` is a macro there, whose spelling ``__attribute__((global))``
defines it again; a file-scope ``__shared__`` array works (the side-by-side parts' places).

    python3 experiments/nvrtc_macro_probe.py   # on a GPU machine
"""

import cupy

variants = {
"pushpop": r'''
#pragma push_macro("__global__")
#undef __global__
#define __global__ __device__ __forceinline__
namespace u { __global__ void f(float* y) { y[threadIdx.x] = 1.0f; } }
#pragma pop_macro("__global__")
extern "C" __global__ void k(float* y) { u::f(y); }
''',
"attribute": r'''
#undef __global__
#define __global__ __device__ __forceinline__
namespace u { __global__ void f(float* y) { y[threadIdx.x] = 2.0f; } }
#undef __global__
#define __global__ __attribute__((global))
extern "C" __global__ void k(float* y) { u::f(y); }
''',
"isdefined": r'''
#if defined(__global__)
extern "C" __global__ void k(float* y) { y[threadIdx.x] = 3.0f; }
#else
extern "C" __global__ void k(float* y) { y[threadIdx.x] = 4.0f; }
#endif
''',
"shared_filescope": r'''
__shared__ uint3 ctx[2];
#define threadIdx_alias 1
extern "C" __global__ void k(float* y) { if (threadIdx.x == 0) ctx[0] = uint3{1,2,3}; __syncthreads(); y[threadIdx.x] = ctx[0].y + 3.0f; }
''',
}
for name, src in variants.items():
    try:
        m = cupy.RawModule(code=src, options=("-std=c++17",))
        f = m.get_function("k")
        y = cupy.zeros(32, cupy.float32)
        f((1,), (32,), (y,))
        print(name, "ok", float(y[0]))
    except Exception as e:
        print(name, "FAIL", type(e).__name__, str(e)[:300])
