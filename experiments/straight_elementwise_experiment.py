"""VADD (x = z + (y + w), 2^27) as straight-line hand kernels against kfuse and torch.compile
(GPU experiment).

torch.compile's VADD kernel is straight-line: the size compiled in, no grid-stride loop, no
bounds check (the size is a multiple of its block), one 8- or 16-byte load per thread and
input, plain ``ld.global``. kfuse's generated kernels keep a grid-stride loop and masks. Here,
by hand, with ``THREADS`` threads and ``WIDTH`` floats per thread: ``straight`` (as
torch.compile), ``straight nc`` (loads through the read-only path), ``masked`` (a bounds
check), ``looped`` (a grid-stride loop over the chunks, grid covering them once). All timed
in alternating rounds.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/straight_elementwise_experiment.py [--rounds 3]
"""

from __future__ import annotations

import argparse

import numpy as np

from kfuse.apps import get_app
from kfuse.cli.arguments import POSITIVE_INT
from kfuse.runtime import auto_plan, get_backend
from kfuse.tune.timing import print_rounds, time_alternating

SOURCE = r"""
#define N {n}
#define WIDTH {width}
typedef {vec} vec_t;
__device__ __forceinline__ float2 add(float2 a, float2 b) {{ return make_float2(a.x + b.x, a.y + b.y); }}
__device__ __forceinline__ float4 add(float4 a, float4 b) {{
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }}
__device__ __forceinline__ vec_t load(const float* p, long long i) {{
#if {nc}
  return __ldg(reinterpret_cast<const vec_t*>(p) + i);
#else
  return reinterpret_cast<const vec_t*>(p)[i];
#endif
}}
extern "C" __global__ void vadd(const float* w, const float* y, const float* z, float* x) {{
#if {looped}
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N / WIDTH;
       i += (long long)gridDim.x * blockDim.x) {{
#else
  {{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
#endif
#if {masked}
    if (i < N / WIDTH)
#endif
    reinterpret_cast<vec_t*>(x)[i] = add(load(z, i), add(load(y, i), load(w, i)));
  }}
}}
"""

SHAPES = [  # (label, threads, width, nc, masked, looped)
    ("straight 256x4", 256, 4, 0, 0, 0), ("straight 256x2", 256, 2, 0, 0, 0),
    ("straight 128x2", 128, 2, 0, 0, 0), ("straight nc 256x4", 256, 4, 1, 0, 0),
    ("masked 256x4", 256, 4, 0, 1, 0), ("looped 256x4", 256, 4, 0, 1, 1),
    ("looped nc 256x4", 256, 4, 1, 1, 1),
]


def main() -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=3)
    parser.add_argument("--runs", type=POSITIVE_INT, default=30)
    args = parser.parse_args()
    app = get_app("vadd")
    graph = app.build().graph()
    arrays, params = app.make_inputs((2**27,), np.random.default_rng(0), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    executable = get_backend("cuda").prepare(graph, given, plan=auto_plan(graph, given))
    executable.launch_all()
    expected = executable.buffers["x"].copy()
    runs = {"compile": compiled_on(graph, given), "kfuse": executable.launch_all}
    n = given["w"].size
    result = cupy.empty_like(expected)
    for label, threads, width, nc, masked, looped in SHAPES:
        source = SOURCE.format(n=n, width=width, vec=f"float{width}", nc=nc, masked=masked,
                               looped=looped)
        kernel = cupy.RawModule(code=source).get_function("vadd")
        blocks = n // (threads * width)

        def launch(kernel=kernel, blocks=blocks, threads=threads) -> None:
            kernel((blocks,), (threads,), (given["w"], given["y"], given["z"], result))

        result.fill(np.nan)
        launch()
        error = float(cupy.abs(result - expected).max() / cupy.abs(expected).max())
        print(f"{label} r{kernel.num_regs}: error against kfuse {error:.1e}", flush=True)
        runs[f"{label} r{kernel.num_regs}"] = launch
    print_rounds("vadd", time_alternating(runs, args.rounds, repeat=args.runs), "compile")


if __name__ == "__main__":
    main()
