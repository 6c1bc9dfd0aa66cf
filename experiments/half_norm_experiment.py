"""Normalisations in float16 and bfloat16: one map-reduce kernel against one kernel per
operator and torch.compile, in the same dtype.

Each app of ``kfuse.apps.normalise`` built in the dtype, planned at its benchmark size (one
kernel: held rows, rows in segments, held columns, a held group's tail), run on the GPU and
checked against the float64 NumPy reference (four unit roundoffs of the dtype, norm-wise),
then its compiled call timed in alternating rounds beside the unfused plan's and
torch.compile's of the same pipeline; the floor is every input read once and every output
written once at the device's copy bandwidth.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/half_norm_experiment.py [--apps rmsnorm,layernorm]
        [--dtypes float16,bfloat16]
"""

from __future__ import annotations

import argparse

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import reference_errors

HALF_TOLERANCE = {"float16": 4 * 2.0**-11, "bfloat16": 4 * 2.0**-8}


def on_device(array: np.ndarray, dtype: str):
    """A CUDA array of ``array``: CuPy's for float16 and wider, torch's for bfloat16 (CuPy has
    none)."""
    if dtype == "bfloat16":
        import torch
        return torch.from_numpy(array.view(np.uint16)).cuda().view(torch.bfloat16)
    import cupy
    return cupy.asarray(array)


def on_host(array) -> np.ndarray:
    """A NumPy copy of a CUDA output (torch's in float32: NumPy has no bfloat16 of its own)."""
    if hasattr(array, "detach"):
        return array.detach().float().cpu().numpy()
    from kfuse.runtime.binding import to_numpy
    return to_numpy(array)


def main() -> None:
    from kfuse.model.device import current_profile
    from kfuse.runtime import get_backend
    from kfuse.search import default_plan
    from kfuse.tune.timing import print_rounds, time_alternating

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", default="rmsnorm,layernorm,logsoftmax,softmax,crossentropy,"
                                          "logsumexp,colstandardise")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    profile = current_profile()
    for name in args.apps.split(","):
        for dtype in args.dtypes.split(","):
            app = get_app(name)
            pipeline = app.build(dtype=dtype)
            graph = pipeline.graph()
            sizes = app.sizes(graph, app.bench_size)
            plan = default_plan(graph, sizes=sizes, profile=profile)
            arrays, params = app.make_inputs(app.bench_size, np.random.default_rng(0), dtype)
            given = {k: on_device(v, dtype) for k, v in arrays.items()}
            floor = sum(graph.nbytes(n, sizes) for n in (*graph.inputs, *graph.outputs)) \
                / profile.copy_bandwidth_bytes_per_s
            print(f"== {name} {dtype} {app.bench_size}: {len(plan.groups)} kernel(s) "
                  f"{[g.form.text() for g in plan.groups]}, floor {floor * 1e3:.4f} ms",
                  flush=True)
            try:
                outputs = pipeline.run(backend="cuda", plan=plan, **given, **params)
                errors = reference_errors(app, arrays, params,
                                          {k: on_host(v) for k, v in outputs.items()})
                print(f"{name} {dtype}: errors {errors} (tolerance {HALF_TOLERANCE[dtype]:.1e})",
                      flush=True)
                executable = get_backend("cuda").prepare(graph, {**given, **params},
                                                         plan=plan)
                print(f"{name} {dtype}: registers " + ", ".join(
                    f"{f.num_regs}" + (f" ({f.local_size_bytes} B local)"
                                       if f.local_size_bytes else "")
                    for f in executable.functions.values()), flush=True)
                fused = pipeline.compile(backend="cuda", plan=plan)
                apart = pipeline.compile(backend="cuda", plan="unfused")
                arguments = {**given, **params}
                labels = {"one kernel": lambda f=fused, a=arguments: f(**a),
                          "unfused": lambda f=apart, a=arguments: f(**a)}
                try:
                    from kfuse.bench.torch_baseline import compiled_on
                    labels["compile"] = compiled_on(graph, arguments)
                except Exception as exc:  # noqa: BLE001 - reported, the rest still timed
                    print(f"{name} {dtype}: torch.compile failed: {type(exc).__name__}: {exc}")
                times = time_alternating(labels, args.rounds, repeat=args.runs)
                print_rounds(f"{name}-{dtype[:4]}", times, "one kernel")
            except Exception as exc:  # noqa: BLE001 - reported, the next app still runs
                print(f"{name} {dtype}: FAILED {type(exc).__name__}: {str(exc)[:600]}",
                      flush=True)


if __name__ == "__main__":
    main()
