"""Hand-written elementwise kernels with L2 prefetch-size hints (GPU experiment, issue 5).

The four elementwise sequences of Filipovič et al. 2015 (VADD, MADD, WAXPBY, SSCAL) tie torch.compile at
the copy bandwidth (sessions 7-12 tried shapes, evict-first loads, streaming stores and the
bulk copy engine). Not tried before: loads that ask L2 to fetch 128 or 256 bytes around the
missed sector (``ld.global.nc.L2::128B`` / ``L2::256B``), loads that skip L1
(``L1::no_allocate``), and one access per thread in Inductor's exact shape beside kfuse's.
Each kernel is one vector access of ``VEC`` per input and thread, one block per
``THREADS x VEC`` chunk (Inductor's form), checked against the planned program, then timed in
alternating rounds beside the planned program and torch.compile.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/elementwise_hints_probe.py [vadd madd waxpby sscal]
        [--rounds 5] [--runs 30]
"""

from __future__ import annotations

import numpy as np

from kfuse.bench.experiment import device_case, planned_run
from kfuse.cli.arguments import alternating_main
from kfuse.runtime import get_backend
from kfuse.tune.timing import print_rounds, time_alternating

# Loads of a float2/float4 with a PTX cache qualifier; the qualifier is spliced in.
LOADS = r"""
__device__ __forceinline__ float2 load(const float2* p) {
  float2 v;
  asm("ld.global.nc%s.v2.f32 {%%0, %%1}, [%%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 load(const float4* p) {
  float4 v;
  asm("ld.global.nc%s.v4.f32 {%%0, %%1, %%2, %%3}, [%%4];"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
"""

QUALIFIERS = {"plain": "", "pf128": ".L2::128B", "pf256": ".L2::256B",
              "noL1": ".L1::no_allocate", "noL1+pf256": ".L1::no_allocate.L2::256B"}

# Per app: (inputs, scalar parameters, output, the expression of one lane ``k``).
APPS = {
    "vadd": (("w", "y", "z"), (), "x", "w_.k + y_.k + z_.k"),
    "madd": (("A", "B"), (), "C", "A_.k + B_.k"),
    "waxpby": (("x", "y"), ("alpha", "beta"), "w", "alpha * x_.k + beta * y_.k"),
    "sscal": (("x",), ("alpha",), "sx", "alpha * x_.k"),
}
LANES = {"float2": "xy", "float4": "xyzw"}
SHAPES = (("float2", 128), ("float2", 256), ("float4", 128), ("float4", 256))


def kernel_source(app: str, vector: str, threads: int, qualifier: str) -> str:
    inputs, params, _, lane = APPS[app]
    arguments = [f"const {vector}* __restrict__ {name}" for name in inputs]
    arguments += [f"float {name}" for name in params]
    arguments += [f"{vector}* __restrict__ out", "long long count"]
    loads = "".join(f"    const {vector} {name}_ = load({name} + i);\n" for name in inputs)
    lanes = ", ".join(lane.replace(".k", f".{k}") for k in LANES[vector])
    return (LOADS.replace("%s", qualifier).replace("%%", "%")
            + f'extern "C" __global__ void __launch_bounds__({threads}) probe(\n    '
            + ", ".join(arguments) + ") {\n"
            + f"  const long long i = (long long)blockIdx.x * {threads} + threadIdx.x;\n"
            + "  if (i < count) {\n" + loads
            + f"    out[i] = make_{vector}({lanes});\n  }}\n}}\n")


def compare(app: str, rounds: int, runs: int) -> None:
    import cupy

    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(app)
    executable, expected = planned_run(case, get_backend("cuda"))
    inputs, params, output, _ = APPS[app]
    total = case.given[inputs[0]].size
    out = cupy.empty(total, dtype=cupy.float32)
    runs_by_label = {"planned": executable.launch_all,
                     "compile": compiled_on(case.graph, case.given)}
    for vector, threads in SHAPES:
        width = len(LANES[vector])
        for hint, qualifier in QUALIFIERS.items():
            if hint != "plain" and (vector, threads) not in (("float2", 128), ("float4", 256)):
                continue
            source = kernel_source(app, vector, threads, qualifier)
            kernel = cupy.RawModule(code=source, options=("-std=c++17",)).get_function("probe")
            count = total // width
            arguments = tuple(case.given[name] for name in inputs) + tuple(
                np.float32(case.given[name]) for name in params) + (out, np.int64(count))

            def run(kernel=kernel, threads=threads, count=count, arguments=arguments):
                kernel((-(-count // threads),), (threads,), arguments)

            run()
            reference = expected[output].ravel()
            error = float(cupy.abs(out - reference).max() / cupy.abs(reference).max())
            label = f"{hint} {threads}x{vector}"
            print(f"{app} {label}: registers {kernel.num_regs}, error {error:.1e}", flush=True)
            if error < 1e-5:
                runs_by_label[label] = run
    print_rounds(app, time_alternating(runs_by_label, rounds, repeat=runs), "compile")


if __name__ == "__main__":
    alternating_main(__doc__.splitlines()[0], compare, tuple(APPS), rounds=5, runs=30)
