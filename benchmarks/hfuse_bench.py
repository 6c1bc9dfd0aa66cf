"""Horizontal fusion on the GPU: each benchmark pair (kfuse.apps.pairs) one after another, on
two streams and side by side at every candidate split and register cap (HFuse's search),
timed in alternating rounds in one run; the model's prediction beside each; the results
checked against the NumPy reference.

    PYTHONPATH=. python3 benchmarks/hfuse_bench.py --json out.json
    PYTHONPATH=. python3 benchmarks/hfuse_bench.py --sanitize   # small sizes, for compute-sanitizer
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import numpy as np

import kfuse
from kfuse.apps.pairs import PAIRS
from kfuse.fusion.plan import FusionPlan
from kfuse.model.device import current_profile
from kfuse.model.horizontal import predict
from kfuse.search.hfuse import best_side_by_side, candidates, part_shape


def apart_plan(pipeline: kfuse.Pipeline, sizes: dict) -> FusionPlan:
    """The pair's plan without kernels side by side (each part fused vertically as the
    search fuses it: Sobel's three operators are one kernel)."""
    return replace(pipeline.plan(sizes=sizes), side_by_side=(), apart=())


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def app_row(name: str, options, backend, upload, download, synchronize, timer,
            time_alternating) -> dict:
    """An app's default plan with its groups side by side against the same plan without
    them (its branches then on streams where the wave model says so), checked and timed."""
    from kfuse.apps import get_app
    from kfuse.apps.check import reference_errors
    from kfuse.search import default_plan

    app_name, _, size_text = name.partition(":")
    app = get_app(app_name)
    size = tuple(int(n) for n in size_text.split("x")) if size_text else (
        app.test_size if options.sanitize else app.bench_size)
    pipeline = app.build()
    graph = pipeline.graph()
    arrays, params = app.make_inputs(size, np.random.default_rng(0), "float32")
    plan = default_plan(graph, app.sizes(graph, size))
    plans = {"side by side": plan, "apart": replace(plan, side_by_side=(), apart=())}
    given = {**{k: upload(v) for k, v in arrays.items()}, **params}
    runs = {label: pipeline.compile(backend, chosen) for label, chosen in plans.items()}
    errors = {}
    for label, run in runs.items():
        got = {k: download(v) for k, v in run(**given).items()}
        synchronize()
        errors[label] = max(reference_errors(app, arrays, params, got, "clamp").values())
    row = {"app": app_name, "size": list(size), "side_by_side": [
        [list(plan.groups[i].members) for i in f.parts] for f in plan.side_by_side],
        "max_relative_error": errors}
    if not options.sanitize:
        times = time_alternating({label: (lambda run=run: run(**given))
                                  for label, run in runs.items()},
                                 options.rounds, repeat=options.repeat, timer=timer)
        row["ms"] = {label: float(np.median(values)) for label, values in times.items()}
    print(f"== app {app_name} {'x'.join(map(str, size))}: side by side "
          f"{row['side_by_side']}; ms {row.get('ms')}; errors {errors}")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", help="pairs to run (default: all)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--backend", default="cuda", help="cuda, or cpu for a dry run")
    parser.add_argument("--quick", action="store_true",
                        help="side by side only at the parts' own blocks (and as planned)")
    parser.add_argument("--app", action="append", default=[],
                        help="an app (name or name:MxN) whose default plan runs groups side "
                             "by side: timed against the same plan without them")
    parser.add_argument("--sanitize", action="store_true",
                        help="run every candidate once at the test size (for compute-sanitizer)")
    options = parser.parse_args()
    from kfuse.tune.timing import time_alternating, time_gpu, time_host
    if options.backend == "cuda":
        import cupy
        upload, download, timer = cupy.asarray, cupy.asnumpy, time_gpu

        def synchronize() -> None:
            cupy.cuda.get_current_stream().synchronize()
    else:
        upload = download = np.asarray
        timer = time_host

        def synchronize() -> None:
            pass
    backend = options.backend
    profile = current_profile()
    rng = np.random.default_rng(0)
    rows = []
    for pair in PAIRS:
        if options.pairs and pair.name not in options.pairs:
            continue
        pipeline = pair.build()
        graph = pipeline.graph()
        host = pair.make_inputs(rng, options.sanitize)
        reference = pair.reference(host)
        inputs = {name: upload(value) for name, value in host.items()}
        sizes = graph.bind_shapes({name: value.shape for name, value in host.items()})
        apart = apart_plan(pipeline, sizes)
        parts = [group.schedule for group in apart.groups]
        names = [group.members[0] for group in apart.groups]
        shapes = [part_shape(graph, part, sizes, profile) for part in parts]
        runs = {"one after another": pipeline.compile(backend, apart, streams=False),
                "two streams": pipeline.compile(backend, apart, streams=True)}
        predicted = {}
        chosen = candidates(graph, parts, shapes, profile)
        if options.sanitize:  # the parts' own blocks and an even split, with and without a cap
            chosen = [c for c in chosen if all(t in (None, 512) for t in c.threads)]
        if options.quick:  # the planner's choice alone (the "auto" run), and the parts' own
            chosen = [c for c in chosen if not c.least_blocks
                      and all(t is None for t in c.threads)]
        for candidate in chosen:
            label = "side by side " + "/".join(
                str(t or s.threads) for t, s in zip(candidate.threads, shapes, strict=True)) + (
                f" cap{candidate.least_blocks}" if candidate.least_blocks else "")
            plan = apart.run_side_by_side(*names, threads=candidate.threads,
                                          least_blocks=candidate.least_blocks)
            try:
                runs[label] = pipeline.compile(backend, plan, streams=False)
                resized = [s if t is None else part_shape(graph, p, sizes, profile, t)
                           for p, s, t in zip(parts, shapes, candidate.threads, strict=True)]
                predicted[label] = predict(resized, profile, candidate.least_blocks)
            except kfuse.KfuseError as error:
                print(f"{pair.name}: {label}: {error}", file=sys.stderr)
        auto = pipeline.plan(sizes=sizes)
        runs["auto"] = pipeline.compile(backend, auto)
        errors = {}
        for label, run in runs.items():
            got = run(**inputs)
            synchronize()
            errors[label] = max(relative_error(download(got[name]), reference[name])
                                for name in reference)
        if options.sanitize:
            print(pair.name, "checked", {k: f"{v:.1e}" for k, v in errors.items()})
            continue
        times = time_alternating({label: (lambda run=run, given=inputs: run(**given))
                                  for label, run in runs.items()},
                                 options.rounds, repeat=options.repeat, timer=timer)
        medians = {label: float(np.median(values)) for label, values in times.items()}
        best_apart = min(medians["one after another"], medians["two streams"])
        fused = {label: t for label, t in medians.items() if label.startswith("side by side")}
        if auto.side_by_side:  # the planner's own split counts as measured side by side
            fused["auto"] = medians["auto"]
        best_label = min(fused, key=fused.__getitem__)
        chosen = best_side_by_side(graph, parts, sizes, profile)
        row = {"pair": pair.name, "title": pair.title, "sizes": dict(sizes),
               "ms": medians, "rounds": times, "max_relative_error": errors,
               "best_side_by_side": best_label,
               "speedup_over_sequential": medians["one after another"] / fused[best_label],
               "speedup_over_streams": medians["two streams"] / fused[best_label],
               "measured_pays": fused[best_label] < best_apart * 0.98,
               "predicted_pays": bool(chosen and chosen[1].pays),
               "predicted": {label: {"fused_ms": p.fused_s * 1e3, "sequential_ms":
                                     p.sequential_s * 1e3, "streams_ms": p.streams_s * 1e3}
                             for label, p in predicted.items()},
               "auto_side_by_side": [list(f.parts) for f in auto.side_by_side],
               "auto_reason": auto.explain().splitlines()}
        rows.append(row)
        print(f"== {pair.name}: {pair.title}")
        for label, value in medians.items():
            note = ""
            if label in predicted:
                note = f"  (predicted {predicted[label].fused_s * 1e3:.4f})"
            print(f"  {label:28s} {value:.4f} ms  {best_apart / value:.3f}x best apart{note}"
                  f"  err {errors[label]:.1e}")
        print(f"  best side by side: {best_label}; measured pays: {row['measured_pays']}; "
              f"predicted pays: {row['predicted_pays']}; auto fuses: {row['auto_side_by_side']}")
    for name in options.app:
        rows.append(app_row(name, options, backend, upload, download, synchronize, timer,
                            time_alternating))
    if rows:
        rows_of_pairs = [row for row in rows if "pair" in row]
        right = sum(row["measured_pays"] == row["predicted_pays"] for row in rows_of_pairs)
        print(f"prediction right on {right} of {len(rows_of_pairs)} pairs")
    if options.json:
        with open(options.json, "w") as file:
            json.dump({"device": profile.name, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
