"""The eleven BLAS sequences of Filipovič et al. 2015 on the GPU: verify, compare, rank implementations.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 benchmarks/blas_bench.py [app ...] [--json out.json]
        [--vector-sizes 26,27,28] [--matrix-size 16384] [--rank 20] [--autotune 0]
        [--skip-verify] [--skip-rank] [--no-compile]

1. **verify**: every app at its benchmark size on ``cuda``, fused (the predicted-best plan)
   and unfused, against the float64 NumPy reference (tolerance 1e-5, 1e-4 with reductions);
2. **compare**: ``kfuse.bench.bench_apps`` on one calibrated profile: kfuse fused, unfused,
   the cuBLAS call sequence, ``torch.compile``, the DRAM floor (inputs once, outputs once)
   and the *plan floor* (the bytes the plan must move: GEMVER's three passes over the
   matrix, SGEMVT's two), with the issue's targets checked;
3. **rank** (Filipovič et al. 2015 Table 4): the ``--rank`` best-predicted implementations of each app
   timed; the number of implementations in the space, the predicted rank of the measured
   best (within 0.1% counts as equal), the predicted-first as % of the best, the worst
   timed as % of the best.

Everything printed is also written to ``--json`` (default ``$OUT/blas_bench.json`` when
``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

from kfuse.apps import get_app, list_apps
from kfuse.apps.check import relative_error
from kfuse.bench.floor import dram_floor_bytes, traffic_bytes
from kfuse.bench.harness import bench_apps
from kfuse.runtime import get_backend
from kfuse.runtime.binding import to_numpy
from kfuse.search.variants import ImplementationSpace
from kfuse.tune.timing import time_gpu

EQUAL = 1e-3  # Table 4: implementations within 0.1% perform the same


def app_sizes(app, args) -> list[tuple[int, ...]]:
    if app.ndim == 1:
        return [(2**int(e),) for e in args.vector_sizes.split(",") if e]
    return [(args.matrix_size, args.matrix_size)]


def plan_bytes(graph, groups, sizes: dict[str, int]) -> int:
    """DRAM bytes a plan's groups (lists of members) must move: each group's external reads
    and written buffers once."""
    from kfuse.fusion.plan import group_outputs
    total = 0
    for members in groups:
        inside = set(members)
        reads = [b for m in members for b in graph.kernel_by_name[m].reads
                 if graph.producer.get(b) not in inside]
        total += traffic_bytes(graph, reads, group_outputs(graph, members), sizes)
    return total


def verify(app, size: tuple[int, ...], profile) -> dict[str, Any]:
    """Fused and unfused on cuda against the float64 reference."""
    pipeline = app.build()
    graph = pipeline.graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(7), "float32")
    reference = app.reference(arrays, params, None)
    plan = app.planner(graph, app.sizes(graph, size), profile)
    result: dict[str, Any] = {"app": app.name, "size": list(size), "tolerance": app.tolerance,
                              "plan": [[list(g.members), g.variant] for g in plan.groups]}
    for kind, chosen in (("fused", plan), ("unfused", "unfused")):
        outputs = pipeline.run(backend="cuda", plan=chosen, **arrays, **params)
        errors = {name: relative_error(to_numpy(outputs[name]), reference[name])
                  for name in reference}
        result[kind] = {"errors": errors, "ok": max(errors.values()) <= app.tolerance}
    del reference, arrays
    return result


def rank(app, size: tuple[int, ...], profile, count: int) -> dict[str, Any]:
    """Time the ``count`` best-predicted implementations (Filipovič et al. 2015 Table 4)."""
    import cupy

    graph = app.build().graph()
    sizes = app.sizes(graph, size)
    space = ImplementationSpace(graph, sizes, profile)
    arrays, params = app.make_inputs(size, np.random.default_rng(3), "float32")
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    backend = get_backend("cuda")
    rows = []
    started = time.perf_counter()
    for index, implementation in enumerate(space.ranked(count), start=1):
        plan = implementation.plan(graph)
        executable = backend.prepare(graph, given, plan=plan)
        timing = time_gpu(executable.launch_all, warmup=3, repeat=20)
        rows.append({"rank": index, "predicted_ms": implementation.predicted_s * 1e3,
                     "measured_ms": timing.median_s * 1e3,
                     "implementation": implementation.describe()})
        del executable
    best = min(r["measured_ms"] for r in rows)
    rank_of_best = min(r["rank"] for r in rows if r["measured_ms"] <= best * (1 + EQUAL))
    return {"app": app.name, "size": list(size), "implementations": space.count(),
            "timed": len(rows), "rank_of_best": rank_of_best,
            "first_pct_of_best": 100.0 * best / rows[0]["measured_ms"],
            "worst_timed_pct_of_best": 100.0 * best / max(r["measured_ms"] for r in rows),
            "seconds": time.perf_counter() - started, "rows": rows}


def targets(app: str, row: dict[str, Any]) -> list[str]:
    """The issue's targets for this row, each 'ok' or 'MISSED'."""
    found = []

    def mark(ok: bool | None, text: str) -> None:
        if ok is not None:
            found.append(f"{'ok' if ok else 'MISSED'}: {text}")

    share = row.get("plan_bw_share")
    mark(share is not None and share >= 0.85, f"{(share or 0) * 100:.0f}% of copy bandwidth "
         "for the bytes the plan moves (>= 85%)")
    if row.get("cublas_ms"):
        mark(row["kfuse_ms"] <= row["cublas_ms"], "not slower than the cuBLAS sequence")
    if row.get("compile_ms"):
        mark(row["kfuse_ms"] <= row["compile_ms"], "not slower than torch.compile")
    if app == "bicgk" and row.get("cublas_ms"):
        mark(row["cublas_ms"] / row["kfuse_ms"] >= 1.7, "BiCGK >= 1.7x the two cuBLAS GEMVs")
    if app in ("gemver", "axpydot"):
        mark(row["kfuse_ms"] <= 1.1 * row["plan_floor_ms"], "within 1.1x of its floor")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("apps", nargs="*")
    parser.add_argument("--vector-sizes", default="27", help="exponents of 2, e.g. 26,27,28")
    parser.add_argument("--matrix-size", type=int, default=16384)
    parser.add_argument("--rank", type=int, default=20, help="implementations timed per app")
    parser.add_argument("--autotune", type=int, default=0, help="kfuse runs the fastest of K")
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-rank", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    out_dir = os.environ.get("OUT")
    target = args.json or (os.path.join(out_dir, "blas_bench.json") if out_dir else None)
    names = args.apps or [a.name for a in list_apps("blas")]
    apps = [get_app(name) for name in names]

    from kfuse.tune.calibrate import calibrate
    profile = calibrate(progress=False)
    try:
        profile.save()
    except OSError:
        pass
    report: dict[str, Any] = {"device": profile.name,
                              "copy_gbps": profile.copy_bandwidth_bytes_per_s / 1e9,
                              "verify": [], "compare": [], "rank": []}
    print(f"device: {profile.summary()}", flush=True)

    def save() -> None:
        if target:
            with open(target, "w") as handle:
                json.dump(report, handle, indent=1, default=str)

    if not args.skip_verify:
        print("\n== verify on cuda against the float64 reference", flush=True)
        for app in apps:
            for size in app_sizes(app, args):
                try:
                    result = verify(app, size, profile)
                except Exception as error:  # keep going
                    result = {"app": app.name, "size": list(size), "failed": repr(error),
                              "trace": traceback.format_exc(limit=3)}
                report["verify"].append(result)
                if "failed" in result:
                    print(f"  {app.name:8s} {size}: FAILED {result['failed']}", flush=True)
                    continue
                worst = {k: max(result[k]["errors"].values()) for k in ("fused", "unfused")}
                ok = result["fused"]["ok"] and result["unfused"]["ok"]
                print(f"  {app.name:8s} {'x'.join(map(str, size)):>12s}  fused {worst['fused']:.1e}"
                      f"  unfused {worst['unfused']:.1e}  {'verified' if ok else 'NOT verified'}",
                      flush=True)
                save()

    print("\n== kfuse vs cuBLAS sequence vs torch.compile vs floors", flush=True)
    baselines = ("cublas",) if args.no_compile else ("torch.compile", "cublas")
    header = (f"  {'app':8s} {'size':>12s} {'kfuse':>9s} {'unfused':>9s} {'cuBLAS':>9s} "
              f"{'compile':>9s} {'floor':>9s} {'planfl':>9s} {'%copy':>6s} {'xcuBLAS':>8s} "
              f"{'xcomp':>6s}")
    print(header + "   (ms)", flush=True)
    for app in apps:
        for size in app_sizes(app, args):
            try:
                (row,) = bench_apps([app], size=size, profile=profile, baselines=baselines,
                                    progress=False, autotune=args.autotune)
            except Exception as error:
                report["compare"].append({"app": app.name, "size": list(size),
                                          "failed": repr(error)})
                print(f"  {app.name:8s} FAILED {error!r}", flush=True)
                continue
            data = row.to_dict()
            graph = app.build().graph()
            sizes = app.sizes(graph, size)
            # (the groups as the harness ran them: a fused row-reduction epilogue is legal
            # only under its variant, so no plan is rebuilt here)
            moved = plan_bytes(graph, row.plan_groups or [[k.name] for k in graph.kernels],
                               sizes)
            copy = profile.copy_bandwidth_bytes_per_s
            data["plan_floor_bytes"] = moved
            data["plan_floor_ms"] = moved / copy * 1e3
            data["dram_floor_ms"] = dram_floor_bytes(graph, sizes) / copy * 1e3
            if row.kfuse_ms:
                data["plan_bw_share"] = moved / (row.kfuse_ms / 1e3) / copy
                data["gflops"] = app.flops(size) / (row.kfuse_ms / 1e3) / 1e9
            data["targets"] = targets(app.name, data) if row.kfuse_ms else []
            report["compare"].append(data)

            def ms(value: float | None) -> str:
                return f"{value:9.3f}" if value else f"{'-':>9s}"

            def ratio(a: float | None, b: float | None) -> str:
                return f"{a / b:6.2f}" if a and b else f"{'-':>6s}"

            share = data.get("plan_bw_share")
            print(f"  {app.name:8s} {'x'.join(map(str, size)):>12s} {ms(row.kfuse_ms)} "
                  f"{ms(row.unfused_ms)} {ms(row.cublas_ms)} {ms(row.compile_ms)} "
                  f"{ms(data['dram_floor_ms'])} {ms(data['plan_floor_ms'])} "
                  f"{(share or math.nan) * 100:6.1f} {ratio(row.cublas_ms, row.kfuse_ms):>8s} "
                  f"{ratio(row.compile_ms, row.kfuse_ms)}", flush=True)
            for line in data["targets"]:
                print(f"      {line}")
            for note in row.notes:
                if "failed" in note or "differ" in note or "unavailable" in note:
                    print(f"      note: {note}")
            save()

    if not args.skip_rank and args.rank > 0:
        print(f"\n== implementation ranking (Filipovič et al. 2015 Table 4; the {args.rank} best predicted "
              "timed)", flush=True)
        print(f"  {'app':8s} {'#impl':>10s} {'timed':>6s} {'rank of best':>13s} "
              f"{'first % of best':>16s} {'worst timed %':>14s}", flush=True)
        for app in apps:
            size = app_sizes(app, args)[0]
            try:
                result = rank(app, size, profile, args.rank)
            except Exception as error:
                report["rank"].append({"app": app.name, "failed": repr(error)})
                print(f"  {app.name:8s} FAILED {error!r}", flush=True)
                continue
            report["rank"].append(result)
            print(f"  {app.name:8s} {result['implementations']:10d} {result['timed']:6d} "
                  f"{result['rank_of_best']:13d} {result['first_pct_of_best']:15.1f}% "
                  f"{result['worst_timed_pct_of_best']:13.1f}%", flush=True)
            save()
    save()
    if target:
        print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
