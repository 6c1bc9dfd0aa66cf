"""Normalisations written as a user of two-byte floats writes them (not kfuse's apps): the
inputs and the output in float16 or bfloat16, the statistics in float32. Each is planned at
16384 x 4096 (log-softmax also 4096 x 32768), checked against its unfused program, and its
compiled call timed beside the unfused one and torch.compile's in alternating rounds; the
floor is every input read once and every output written once.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/half_heldout_experiment.py [rmsnorm_residual ...]
        [--dtypes float16,bfloat16] [--profile]
"""

from __future__ import annotations

import argparse

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.normalise import build_cross_entropy_of_labels


def rmsnorm_residual(dtype: str) -> kf.Pipeline:
    """A residual add, then RMSNorm of the sum (both stored)."""
    p = kf.Pipeline("rmsnorm_residual")
    x = p.input("x", ndim=2, dtype=dtype)
    r = p.input("r", shape=x.shape, dtype=dtype)
    g = p.input("g", shape=(x.shape[1],), dtype=dtype)
    inv_n = p.param("inv_n")
    h = kf.point(x + r, name="h")
    s = kf.reduce_sum(h * h, axis=1, name="s")
    y = kf.point(kf.astype(h * kf.rsqrt(s.at(0, dims=(0,)) * inv_n + 1e-6)
                           * g.at(0, dims=(1,)), dtype), name="y")
    p.output(h, y)
    return p


def layernorm(dtype: str) -> kf.Pipeline:
    p = kf.Pipeline("layernorm_half")
    x = p.input("x", ndim=2, dtype=dtype)
    g = p.input("g", shape=(x.shape[1],), dtype=dtype)
    b = p.input("b", shape=(x.shape[1],), dtype=dtype)
    inv_n = p.param("inv_n")
    mean = kf.reduce_sum(x, axis=1, name="mean")
    centred = x - mean.at(0, dims=(0,)) * inv_n
    var = kf.reduce_sum(centred * centred, axis=1, name="var")
    y = kf.point(kf.astype(centred * kf.rsqrt(var.at(0, dims=(0,)) * inv_n + 1e-5)
                           * g.at(0, dims=(1,)) + b.at(0, dims=(1,)), dtype), name="y")
    p.output(y)
    return p


def softmax(dtype: str) -> kf.Pipeline:
    p = kf.Pipeline("softmax_half")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    e = kf.exp(x - top.at(0, dims=(0,)))
    total = kf.reduce_sum(e, axis=1, name="total")
    p.output(kf.point(kf.astype(e / total.at(0, dims=(0,)), dtype), name="y"))
    return p


def logsoftmax(dtype: str) -> kf.Pipeline:
    p = kf.Pipeline("logsoftmax_half")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    p.output(kf.point(kf.astype(x - top.at(0, dims=(0,)) - kf.log(total.at(0, dims=(0,))),
                                dtype), name="y"))
    return p


def l2norm(dtype: str) -> kf.Pipeline:
    p = kf.Pipeline("l2norm_half")
    x = p.input("x", ndim=2, dtype=dtype)
    s = kf.reduce_sum(x * x, axis=1, name="s")
    p.output(kf.point(kf.astype(x * kf.rsqrt(s.at(0, dims=(0,)) + 1e-12), dtype), name="y"))
    return p


PIPELINES = {"rmsnorm_residual": (rmsnorm_residual, (16384, 4096)),
             "layernorm": (layernorm, (16384, 4096)),
             "softmax": (softmax, (16384, 4096)),
             "logsoftmax": (logsoftmax, (16384, 4096)),
             "logsoftmax_long": (logsoftmax, (4096, 32768)),
             "l2norm": (l2norm, (16384, 4096)),
             "cross_entropy_labels": (build_cross_entropy_of_labels, (16384, 4096))}


def held_rows_program(graph, sizes, shape, dtype: str = "float16"):
    """The pipeline as one group held whole in registers by one block per row (256 threads
    up to 4096 columns, else 1024), as such rows were planned before they were read in
    segments; None where the rows do not fit."""
    rows, columns = shape
    threads = 256 if columns <= 4096 else 1024
    per_access = 16 // (2 if dtype in ("float16", "bfloat16") else 4)  # a 16-byte access
    unroll = -(-columns // (threads * per_access))
    if unroll > 8:
        return None
    return one_group(graph, sizes, f"mapreduce:{threads}x1:r1:i1:w:stream:g{rows}:u{unroll}:hr")


def one_group(graph, sizes, form: str):
    """The program of the whole pipeline as one group under the map-reduce ``form``."""
    from kfuse.codegen import generate
    from kfuse.runtime.backend import VECTOR_ALIGNMENT

    members = tuple(k.name for k in graph.kernels)
    return generate(graph, [(members, tuple(graph.outputs), form)], fixed_sizes=sizes,
                    array_alignment=VECTOR_ALIGNMENT)


def main() -> None:
    from experiments.half_norm_experiment import HALF_TOLERANCE, on_device, on_host
    from kfuse.apps.check import relative_error
    from kfuse.model.device import current_profile
    from kfuse.runtime.numpy_backend import numpy_dtype
    from kfuse.search import default_plan
    from kfuse.tune.timing import print_rounds, time_alternating

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=list(PIPELINES))
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--variants", nargs="*", default=[],
                        help="also the pipeline as one group under these map-reduce forms "
                             "('mapreduce:...', with {rows} for the rows), launches alone")
    parser.add_argument("--profile", action="store_true",
                        help="no timing: each program run twice inside a profiler range "
                             "(ncu --profile-from-start off)")
    args = parser.parse_args()
    profile = current_profile()
    for name in args.pipelines:
        build, shape = PIPELINES[name]
        for dtype in args.dtypes.split(","):
            pipeline = build(dtype)
            graph = pipeline.graph()
            rng = np.random.default_rng(0)
            arrays = {n: (rng.standard_normal(shape if len(graph.buffers[n].shape) == 2
                                              else (shape[1],)) + (n == "g"))
                      .astype(numpy_dtype(dtype)) for n in graph.inputs if n != "labels"}
            if "labels" in graph.inputs:  # a class per row
                arrays["labels"] = rng.integers(0, shape[1], shape[0]).astype(np.int32)
            params = {"inv_n": 1.0 / shape[1]} if "inv_n" in graph.params else {}
            sizes = graph.bind_shapes({n: a.shape for n, a in arrays.items()})
            plan = default_plan(graph, sizes=sizes, profile=profile)
            floor = sum(graph.nbytes(n, sizes) for n in (*graph.inputs, *graph.outputs)) \
                / profile.copy_bandwidth_bytes_per_s
            print(f"== {name} {dtype} {shape}: {len(plan.groups)} kernel(s) "
                  f"{[g.form.text() for g in plan.groups]}, floor {floor * 1e3:.4f} ms",
                  flush=True)
            given = {k: on_device(v, "int32" if v.dtype.kind == "i" else dtype)
                     for k, v in arrays.items()}
            fused = pipeline.compile(backend="cuda", plan=plan)
            apart = pipeline.compile(backend="cuda", plan="unfused")
            arguments = {**given, **params}
            outputs, expected = fused(**arguments), apart(**arguments)
            errors = {k: relative_error(on_host(v).astype(np.float64),
                                        on_host(expected[k]).astype(np.float64))
                      for k, v in outputs.items()}
            print(f"{name} {dtype}: against unfused {errors} "
                  f"(tolerance {HALF_TOLERANCE.get(dtype, 1e-6):.1e})", flush=True)
            labels = {"one kernel": lambda f=fused, a=arguments: f(**a),
                      "unfused": lambda f=apart, a=arguments: f(**a)}
            held = held_rows_program(graph, sizes, shape, dtype)
            others = {"held rows": held} if held is not None else {}
            for text in args.variants:  # (the form two-byte rows took before: held rows)
                others[text] = one_group(graph, sizes, text.format(rows=shape[0]))
            for label, program in others.items():
                from kfuse.runtime import get_backend
                executable = get_backend("cuda").prepare(graph, arguments, program=program)
                executable.launch_all()
                error = max(relative_error(on_host(executable.buffers[k]).astype(np.float64),
                                           on_host(expected[k]).astype(np.float64))
                            for k in graph.outputs)
                print(f"{name} {dtype}: {label} against unfused {error:.1e}", flush=True)
                labels[label] = executable.launch_all
            from kfuse.bench.torch_baseline import compiled_on
            try:
                labels["compile"] = compiled_on(graph, arguments)
            except Exception as exc:  # noqa: BLE001 - reported, the rest still timed
                print(f"{name} {dtype}: torch.compile failed: {type(exc).__name__}: {exc}")
            if args.profile:
                import torch
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                for run in (labels["one kernel"], labels["compile"]) * 2:
                    run()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                continue
            times = time_alternating(labels, args.rounds, repeat=args.runs)
            print_rounds(f"{name}-{dtype[:4]}", times, "one kernel")


if __name__ == "__main__":
    main()
