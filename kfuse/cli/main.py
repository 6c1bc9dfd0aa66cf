"""The ``kfuse`` command: demo, apps, run, plan, bench, calibrate, project, synth, fidelity,
model-check."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kfuse import __version__ as kfuse_version
from kfuse.cli.arguments import NON_NEGATIVE_INT, NON_NEGATIVE_NUMBER, POSITIVE_INT
from kfuse.errors import KfuseError
from kfuse.runtime.binding import to_numpy


def _console():
    from rich.console import Console
    return Console()


def _parse_size(text: str | None) -> tuple[int, ...] | None:
    """``--size`` as numbers (None when not given); a clear error for text with none."""
    if text is None:
        return None
    try:
        size = tuple(int(part) for part in text.lower().replace("x", ",").split(",") if part)
    except ValueError:
        size = ()
    if not size:
        raise KfuseError(f"--size takes numbers like 1024x768 or 64,64,64, got {text!r}")
    return size


def _app_size(app, text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """The size ``--size`` gives ``app`` (``default`` when not given), checked against the
    app's rank before anything is built for it."""
    size = _parse_size(text)
    return app.check_size(default if size is None else size)


def _make_inputs(app, size: tuple[int, ...], seed: int) -> tuple[dict, dict]:
    """``app``'s random inputs at ``size``; a clear error when they cannot be allocated."""
    try:
        return app.make_inputs(size, np.random.default_rng(seed), "float32")
    except (MemoryError, ValueError) as error:  # numpy: "array is too big", "Unable to ..."
        raise KfuseError(f"cannot make {app.name}'s inputs at size "
                         f"{'x'.join(map(str, size))}: {error}") from None


def _output_file(text: str | None, option: str) -> Path | None:
    """The file an output option names (None when not given), checked before any work is
    done: it must not be a directory and its directory must exist and be writable (a bad
    path would otherwise end the command with a traceback after the work)."""
    if text is None:
        return None
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        problem = "is a directory"
    elif not folder.is_dir():
        problem = f"directory {str(folder)!r} does not exist"
    elif not os.access(folder, os.W_OK):
        problem = f"directory {str(folder)!r} is not writable"
    else:
        return path
    raise KfuseError(f"{option} {text!r}: {problem}")


def _backend_name(requested: str) -> str:
    from kfuse.runtime import get_backend
    return get_backend(requested).name


# ------------------------------------------------------------------------------------------------
# kfuse demo
# ------------------------------------------------------------------------------------------------

def synthetic_image(height: int, width: int) -> np.ndarray:
    """A deterministic test picture with corners, edges, smooth shading and mild noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    squares = ((x // max(width // 8, 1) + y // max(height // 8, 1)) % 2) * 0.6
    disc = ((x - 0.7 * width) ** 2 + (y - 0.3 * height) ** 2 < (0.15 * min(height, width)) ** 2)
    shading = 0.2 * np.sin(x / max(width, 1) * 6.0) * np.cos(y / max(height, 1) * 4.0)
    noise = np.random.default_rng(2026).uniform(0.0, 0.05, size=(height, width))
    return (0.1 + squares + 0.3 * disc + shading + noise).astype(np.float32)


def command_demo(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.apps.check import reference_errors

    console = _console()
    backend = _backend_name(args.backend)
    height, width = (2048, 2048) if backend == "cuda" else (96, 128)
    app = get_app("harris")
    pipeline = app.build()
    image = synthetic_image(height, width)
    _, params = app.make_inputs((height, width), np.random.default_rng(0), "float32")
    graph = pipeline.graph()
    if not args.json:
        console.print(f"[bold]kfuse demo[/bold]: Harris corners ({len(graph.kernels)} operators) "
                      f"on a {height}x{width} synthetic image, backend [cyan]{backend}[/cyan]")
    plan = pipeline.plan(sizes=app.sizes(graph, (height, width)))
    started = time.perf_counter()
    with console.status("compiling and running the generated CUDA C..."):
        outputs = pipeline.run(backend=backend, plan=plan, img=image, **params)
    elapsed = time.perf_counter() - started
    response = to_numpy(outputs["hc"])
    error = reference_errors(app, {"img": image}, params, outputs)["hc"]
    corners = int(np.sum(response > 0.01 * float(np.max(response))))
    verified = bool(error <= app.tolerance)
    if args.json:
        print(json.dumps({"app": "harris", "backend": backend, "image": [height, width],
                          "operators": len(graph.kernels), "kernels": len(plan.groups),
                          "wall_time_s": round(elapsed, 4), "corner_pixels": corners,
                          "max_rel_error": error, "verified": verified}))
        return 0 if verified else 1
    from rich.table import Table
    table = Table(show_header=True)
    for column in ("backend", "image", "operators", "fused kernels", "wall time",
                   "corner pixels", "max_rel_error"):
        table.add_column(column)
    table.add_row(backend, f"{height}x{width}", str(len(graph.kernels)), str(len(plan.groups)),
                  f"{elapsed:.2f} s", str(corners), f"{error:.2e}")
    console.print(table)
    console.print("[green]verified[/green]" if verified else "[red]NOT verified[/red]")
    return 0 if verified else 1


# ------------------------------------------------------------------------------------------------
# kfuse apps / run
# ------------------------------------------------------------------------------------------------

def command_apps(args: argparse.Namespace) -> int:
    from rich.table import Table

    from kfuse.apps import list_apps
    rows = [{"name": app.name, "kernels": len(app.build().graph().kernels), "what": app.title,
             "benchmark_size": list(app.bench_size), "test_size": list(app.test_size),
             "from": app.origin} for app in list_apps("all")]
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title="kfuse apps")
    for column in ("name", "kernels", "what", "benchmark size", "test size", "from"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], str(row["kernels"]), row["what"],
                      "x".join(map(str, row["benchmark_size"])),
                      "x".join(map(str, row["test_size"])), row["from"])
    _console().print(table)
    return 0


def command_run(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.apps.check import reference_errors
    from kfuse.codegen import generate
    from kfuse.runtime import compiles_for_sizes
    from kfuse.search import search

    app = get_app(args.app)
    backend = _backend_name(args.backend)
    size = _app_size(app, args.size, app.bench_size if backend == "cuda" else app.test_size)
    if args.autotune and args.unfused:
        raise KfuseError("--autotune picks among fused implementations; it does not combine "
                         "with --unfused")
    pipeline = app.build(boundary=args.boundary)
    graph = pipeline.graph()
    inputs = _make_inputs(app, size, args.seed) if args.autotune else None  # timed and run
    plan, timed = (None, None) if args.unfused else _plan_for(app, graph, size, args, backend,
                                                               search, inputs)
    groups = plan.kernel_groups if plan else None
    # the source as the backend compiles it (the GPU's: for the run's sizes), for the
    # aligned arrays kfuse allocates for the app
    from kfuse.runtime.backend import VECTOR_ALIGNMENT
    built_for = {"fixed_sizes": app.sizes(graph, size) if compiles_for_sizes(backend) else None,
                 "array_alignment": VECTOR_ALIGNMENT}
    if args.show_source:
        print(generate(graph, groups, **built_for).source)
        return 0
    if args.resources:
        return _print_resources(graph, groups, built_for)
    arrays, params = inputs or _make_inputs(app, size, args.seed)
    started = time.perf_counter()
    outputs = pipeline.run(backend=backend, plan=plan or "unfused", **arrays, **params)
    elapsed = time.perf_counter() - started
    result = {"app": app.name, "backend": backend, "size": list(size),
              "boundary": args.boundary, "operators": len(graph.kernels),
              "kernels": len(groups) if groups else len(graph.kernels),
              "groups": [list(group.members) for group in groups] if groups else None,
              "wall_time_s": round(elapsed, 4)}
    if timed is not None:
        result["autotune"] = timed
    if args.verify or args.json:
        worst = max(reference_errors(app, arrays, params, outputs, args.boundary).values())
        result.update(max_rel_error=worst, verified=bool(worst <= app.tolerance))
    if args.json:
        print(json.dumps(result))
    else:
        console = _console()
        console.print({key: value for key, value in result.items() if key != "autotune"})
        if "verified" in result:
            console.print("[green]verified[/green]" if result["verified"]
                          else "[red]NOT verified[/red]")
    return 0 if result.get("verified", True) else 1


def _plan_for(app, graph, size: tuple[int, ...], args: argparse.Namespace, backend: str,
              search, inputs: tuple[dict, dict] | None
              ) -> tuple[Any, list[dict] | None]:
    """``kfuse run``'s plan: autotuned (``--autotune K``, timed on ``inputs``), the app's
    planner, or the search; with the autotuner's timings (None when it did not run)."""
    sizes = app.sizes(graph, size)
    if getattr(args, "autotune", 0):
        from kfuse.tune.autotune import autotune
        if backend == "cpu":
            print("kfuse: note: --autotune on the cpu backend times the host shim with the "
                  "wall clock, which says nothing about a GPU", file=sys.stderr)
        arrays, params = inputs
        result = autotune(graph, {**arrays, **params}, args.autotune, backend=backend,
                          sizes=sizes)
        plan, table = result.plan, result.table()
        if not getattr(args, "json", False):
            for row in table:
                print(f"  #{row['rank']}: predicted {row['predicted_ms']:.3f} ms, measured "
                      f"{row['measured_ms']:.3f} ms  {row['implementation']}")
        if plan.independent_groups:  # HFuse's candidates side by side, measured
            from kfuse.tune.side_by_side import autotune_side_by_side
            given = {**arrays, **params}
            if backend == "cuda":  # (on the device: a call would copy host arrays in)
                import cupy
                given = {name: cupy.asarray(value) if name in arrays else value
                         for name, value in given.items()}
            plan, pairs = autotune_side_by_side(graph, given, plan, backend=backend)
            for pair in pairs:
                table.append({"side_by_side": list(pair.parts), "kept": pair.kept,
                              "measured_ms": pair.milliseconds})
                if not getattr(args, "json", False):
                    print(f"  {' | '.join(pair.parts)}: kept {pair.kept} "
                          f"({pair.milliseconds[pair.kept]:.3f} ms)")
        return plan, table
    planner = getattr(app, "planner", None)
    if planner is not None:
        return planner(graph, sizes), None
    return search(graph, sizes=sizes), None


def _print_resources(graph, groups=None, built_for: dict | None = None) -> int:
    """ptxas's figures for each kernel of the program (``built_for``: generate's options)."""
    from rich.table import Table

    from kfuse.codegen import generate
    from kfuse.codegen.resources import kernel_resources
    figures = kernel_resources(generate(graph, groups, **(built_for or {})).source)
    table = Table(title=f"{graph.name}: ptxas -v, sm_90")
    for column in ("kernel", "registers", "shared bytes", "spill stores", "spill loads",
                   "barriers"):
        table.add_column(column)
    for symbol, r in sorted(figures.items()):
        table.add_row(symbol, str(r.registers), str(r.shared_bytes), str(r.spill_store_bytes),
                      str(r.spill_load_bytes), str(r.barriers))
    _console().print(table)
    return 0


def command_plan(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.search import plan_for

    app = get_app(args.app)
    dot = _output_file(args.dot, "--dot")
    graph = app.build().graph()
    size = _app_size(app, args.size, app.bench_size)
    plan = plan_for(graph, args.strategy, args.model, app.sizes(graph, size),
                    seed=args.seed)
    if dot is not None:
        dot.write_text(plan.to_dot() + "\n")
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print(plan.explain())
    return 0


# ------------------------------------------------------------------------------------------------
# kfuse bench / calibrate
# ------------------------------------------------------------------------------------------------

def command_bench(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.bench import bench_apps, plot, print_report, to_json

    # everything the user typed is checked before the GPU is asked for and the timing starts
    apps = [get_app(name) for name in args.apps]
    size = _parse_size(args.size)
    for app in apps if size is not None else ():
        app.check_size(size)
    json_file, plot_file = _output_file(args.json, "--json"), _output_file(args.plot, "--plot")
    _require_gpu()
    rows = bench_apps(apps, size=size, baselines=not args.no_baselines, autotune=args.autotune,
                      calls=not args.no_calls)
    print_report(rows)
    if json_file is not None:
        to_json(rows, json_file)
    if plot_file is not None:
        plot(rows, plot_file)
    return 0


def _require_gpu() -> None:
    """A clear :class:`~kfuse.errors.BackendUnavailable` when no GPU is usable here."""
    from kfuse.runtime import get_backend
    get_backend("cuda")


def command_calibrate(args: argparse.Namespace) -> int:
    from kfuse.tune import calibrate
    _require_gpu()
    profile = calibrate()
    path = profile.save()
    if args.json:
        print(json.dumps({**profile.to_dict(), "saved_to": str(path)}))
        return 0
    _console().print(profile)
    _console().print(f"saved to {path}")
    return 0


# ------------------------------------------------------------------------------------------------
# kfuse project / synth / fidelity / model-check
# ------------------------------------------------------------------------------------------------

def _number_list(text: str, option: str, kind: type = float) -> list:
    """``"20,30,40"`` as numbers of ``kind``; a clear error for anything else."""
    try:
        values = [kind(part) for part in str(text).replace(" ", "").split(",") if part]
    except ValueError:
        example = "20,30,40" if kind is int else "4,8,12"
        raise KfuseError(f"{option} takes numbers like {example}, got {text!r}") from None
    if not values:
        raise KfuseError(f"{option} needs at least one number")
    return values


def _int_list(text: str, option: str) -> list[int]:
    return _number_list(text, option, int)


def command_project(args: argparse.Namespace) -> int:
    from kfuse.project import load_app, project_app

    app = load_app(args.app)
    result = project_app(app, args.strategy, args.model, seed=args.seed,
                         progress=args.progress and not args.json)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.explain())
    return 0


def command_synth(args: argparse.Namespace) -> int:
    from kfuse.project.metadata import app_yaml, dump_app
    from kfuse.project.synth import SynthSpec, synthesize

    output = _output_file(args.output, "--output")
    spec = SynthSpec(kernels=args.kernels, arrays=args.arrays, copies=args.copies,
                     sharing=args.sharing, thread_load=args.thread_load, kinship=args.kinship,
                     seed=args.seed, device=args.device)
    started = time.perf_counter()

    def progress(step: str) -> None:  # said once construction takes more than a second
        if time.perf_counter() - started > 1.0:
            print(f"kfuse synth: {time.perf_counter() - started:.0f} s, {step}",
                  file=sys.stderr, flush=True)

    app = synthesize(spec, progress)
    if output is None:
        print(app_yaml(app), end="")
        return 0
    path = dump_app(app, output)
    achieved = app.synth["achieved"]
    print(f"wrote {path}: {len(app.kernels)} kernels, {len(app.arrays)} arrays, "
          f"{achieved['copies']} copies, mean sharing set {achieved['mean_sharing_set']}, "
          f"mean thread load {achieved['mean_thread_load']}, kinship {achieved['kinship']}")
    return 0


def command_fidelity(args: argparse.Namespace) -> int:
    from kfuse.project.fidelity import TABLE_V, format_table, run_fidelity, total_row
    from kfuse.project.synth import SynthSpec

    given = {"copies": _int_list(args.copies, "--copies"),
             "sharing": _int_list(args.sharing, "--sharing"),
             "thread_load": _number_list(args.thread_load, "--thread-load"),
             "kinship": _int_list(args.kinship, "--kinship")}
    vary = {name: TABLE_V[name] for name in TABLE_V} if args.table_v else {}
    vary.update({name: values for name, values in given.items() if len(values) > 1})
    base = SynthSpec(copies=given["copies"][0], sharing=given["sharing"][0],
                     thread_load=given["thread_load"][0], kinship=given["kinship"][0],
                     seed=args.seed, device=args.device)
    console = _console()
    status = None if args.json else console.status("solving...")

    def show(spec) -> None:
        if status is not None:
            status.update(f"solving {spec.name} with {args.strategy} and {args.reference}")

    if status is not None:
        status.start()
    try:
        rows = run_fidelity(_int_list(args.kernels, "--kernels"),
                            _int_list(args.arrays, "--arrays"), args.instances, base,
                            strategy=args.strategy, reference=args.reference,
                            model=args.model, tolerance=args.tolerance, seed=args.seed,
                            on_instance=show, vary=vary or None)
    finally:
        if status is not None:
            status.stop()
    if args.json:
        data = [row.to_dict() for row in rows]
        if len(rows) > 1:
            data.append({**total_row(rows).to_dict(), "total": True})
        print(json.dumps(data))
    else:
        console.print(format_table(rows, args.strategy, args.reference, args.tolerance,
                                   total=len(rows) > 1))
        if vary:
            console.print("varied per instance: " + ", ".join(
                f"{name} in {{{', '.join(f'{v:g}' for v in values)}}}"
                for name, values in vary.items()))
        below = [note for row in rows for note in row.notes]
        for note in below:
            console.print(f"  {note}")
    return 0


def command_model_check(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.fusion.legality import group_violations
    from kfuse.model.device import current_profile
    from kfuse.search import search
    from kfuse.tune.measured import GroupTimer, check_groups, cuda_backend, summarize

    apps = [get_app(name) for name in args.apps]  # names and sizes before the GPU
    app_sizes = [_app_size(app, args.size, app.bench_size) for app in apps]
    if not args.no_measure:
        try:
            cuda_backend()
        except KfuseError as error:
            raise type(error)(f"{error.detail}; pass --no-measure to print the predictions only") \
                from None
    profile = current_profile()
    report = []
    for app, size in zip(apps, app_sizes, strict=True):
        graph = app.build().graph()
        sizes = app.sizes(graph, size)
        plan = search(graph, args.strategy, args.model, sizes=sizes)
        groups = [g.members for g in plan.groups if len(g.members) > 1]
        if args.candidates == "pairs":
            for source, target in graph.order_dag().edges:
                pair = tuple(sorted((source, target), key=[k.name for k in graph.kernels].index))
                if pair not in groups and not group_violations(graph, list(pair)):
                    groups.append(pair)
        timer = None
        if not args.no_measure:
            arrays, params = _make_inputs(app, size, 0)
            timer = GroupTimer(graph, sizes, {**arrays, **params})
        for row in check_groups(graph, groups, sizes, profile, timer):
            report.append({"app": app.name, "size": list(size), **row})
    summary = summarize(report)
    if args.json:
        print(json.dumps({"device": profile.name, "groups": report, "summary": summary}))
        return 0
    _print_model_check(report, summary, profile, measured=not args.no_measure)
    return 0


def _print_model_check(report, summary, profile, measured: bool) -> None:
    from rich.table import Table

    from kfuse.tune.timing import format_seconds
    table = Table(title=f"model check on {profile.name}: predicted vs "
                        f"{'measured' if measured else '(not measured)'} per fused group")
    columns = ["app", "group", "roofline", "wahib", "qiao"]
    if measured:
        columns += ["measured", "speedup r/w/q/meas"]
    else:
        columns += ["speedup r/w/q"]
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in report:
        cells = [row["app"], "+".join(row["group"])]
        speedups = []
        for model in ("roofline", "wahib", "qiao"):
            entry = row["predicted"][model]
            cells.append(format_seconds(entry["fused_s"]) if entry["fused_s"] is not None
                         else "infeasible")
            speedups.append(f"{entry['speedup']:.2f}" if entry["speedup"] else "-")
        if measured:
            cells.append(format_seconds(row["measured"]["fused_s"]))
            speedups.append(f"{row['measured']['speedup']:.2f}")
        cells.append(" / ".join(speedups))
        table.add_row(*cells)
    console = _console()
    console.print(table)
    if not report:
        console.print("no fused groups in these plans")
    if measured:
        for model, figures in summary.items():
            error = figures["median_rel_error"]
            rho = figures["spearman_speedup"]
            console.print(f"{model}: median |pred - meas| / meas "
                          f"{'-' if error is None else f'{error:.1%}'}, Spearman of speedups "
                          f"{'-' if rho is None else f'{rho:.2f}'} over {figures['groups']} groups")


# ------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfuse", description="Automatic kernel fusion for "
                                     "memory-bound GPU pipelines.")
    parser.add_argument("--version", action="version", version=f"kfuse {kfuse_version}")
    commands = parser.add_subparsers(dest="command", required=True)
    backends = ("auto", "cuda", "cpu", "numpy")

    demo = commands.add_parser("demo", help="run Harris corners and verify it")
    demo.add_argument("--backend", default="auto", choices=backends)
    demo.add_argument("--json", action="store_true", help="print one JSON value")
    demo.set_defaults(handler=command_demo)

    apps = commands.add_parser("apps", help="list the built-in pipelines")
    apps.add_argument("--json", action="store_true", help="print one JSON value")
    apps.set_defaults(handler=command_apps)

    run = commands.add_parser("run", help="run one app")
    run.add_argument("app")
    run.add_argument("--backend", default="auto", choices=backends)
    run.add_argument("--size", help="e.g. 1024x768 or 64,64,64 (default: the app's)")
    run.add_argument("--boundary", default="clamp",
                     choices=("clamp", "mirror", "repeat", "constant"))
    run.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    run.add_argument("--verify", action="store_true", help="compare with the NumPy reference")
    # one kind of output each: source text and tables do not go inside the JSON object
    output = run.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true",
                        help="print one JSON object (not with --show-source or --resources)")
    output.add_argument("--show-source", action="store_true",
                        help="print the generated CUDA C instead of running")
    output.add_argument("--resources", action="store_true",
                        help="registers, shared memory, spills per kernel (needs nvcc) "
                             "instead of running")
    run.add_argument("--unfused", action="store_true", help="one kernel per operator")
    run.add_argument("--autotune", type=NON_NEGATIVE_INT, default=0, metavar="K",
                     help="time the K best-predicted implementations, run the fastest (0: off; "
                          "cuda, or cpu to exercise it: the timings go into --json)")
    run.set_defaults(handler=command_run)

    plan = commands.add_parser("plan", help="show the fusion plan of an app and why")
    plan.add_argument("app")
    plan.add_argument("--strategy", default="auto",
                      help="auto (default: 'variants' for map/reduce pipelines, else "
                           "greedy), exhaustive, exact, greedy, edges, mincut, gga, or "
                           "'variants' (fusions x implementations, Filipovič et al. 2015)")
    plan.add_argument("--model", default="roofline",
                      help="roofline (default), wahib, wahib-norm, qiao or measured (times "
                           "candidate groups on the GPU)")
    plan.add_argument("--seed", type=NON_NEGATIVE_INT, default=0,
                      help="seed of the randomised strategies (gga); the same seed gives the "
                           "same plan")
    plan.add_argument("--size", help="sizes to predict with (default: the app's benchmark size)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--dot", metavar="FILE",
                      help="write the fused graph (Graphviz) to FILE (its directory must exist)")
    plan.set_defaults(handler=command_plan)

    bench = commands.add_parser("bench", help="time apps on the GPU against baselines")
    bench.add_argument("apps", nargs="+")
    bench.add_argument("--size")
    bench.add_argument("--json", metavar="FILE",
                       help="write the rows as JSON to FILE (its directory must exist)")
    bench.add_argument("--plot", metavar="FILE",
                       help="write a bar chart (.png, .svg) to FILE (its directory must exist)")
    bench.add_argument("--no-baselines", action="store_true")
    bench.add_argument("--autotune", type=NON_NEGATIVE_INT, default=0, metavar="K",
                       help="time the K best-predicted implementations, keep the fastest (0: off)")
    bench.add_argument("--no-calls", action="store_true",
                       help="leave out the microseconds per call from Python")
    bench.set_defaults(handler=command_bench)

    calibrate = commands.add_parser("calibrate", help="measure the GPU (copy bandwidth, ...)")
    calibrate.add_argument("--json", action="store_true", help="print one JSON value")
    calibrate.set_defaults(handler=command_calibrate)

    project = commands.add_parser("project", help="plan an application described by kernel "
                                  "metadata (YAML/JSON) and project its speedup, no code")
    project.add_argument("app", help="application file (see docs/projection.md)")
    project.add_argument("--strategy", default="gga",
                         help="exhaustive, exact, greedy, edges, mincut or gga (default)")
    project.add_argument("--model", default="wahib",
                         choices=("wahib", "wahib-norm", "qiao", "roofline"))
    project.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    project.add_argument("--json", action="store_true", help="print one JSON object")
    project.add_argument("--progress", action="store_true", help="show the search's progress")
    project.set_defaults(handler=command_project)

    synth = commands.add_parser("synth", help="generate a synthetic application (Wahib & Maruyama 2014 "
                                "Table V attributes)")
    synth.add_argument("--kernels", type=int, default=20)
    synth.add_argument("--arrays", type=int, default=40)
    synth.add_argument("--copies", type=int, default=2, help="host<->device data copies")
    synth.add_argument("--sharing", type=int, default=4, help="sharing-set size")
    synth.add_argument("--thread-load", type=float, default=8.0, help="average thread load")
    synth.add_argument("--kinship", type=int, default=3, help="largest degree of kinship")
    synth.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    synth.add_argument("--device", default="k20x",
                       help="k20x (default), k40, gtx750ti, h100, h200 or current")
    synth.add_argument("-o", "--output", metavar="FILE",
                       help="file to write (.yaml or .json; its directory must exist); "
                            "default stdout")
    synth.set_defaults(handler=command_synth)

    fidelity = commands.add_parser("fidelity", help="GGA against the exact optimum over a "
                                   "grid of synthetic instances")
    fidelity.add_argument("--kernels", default="20,30,40,50", help="kernel counts of the grid")
    fidelity.add_argument("--arrays", default="20,40,60", help="array counts of the grid")
    fidelity.add_argument("--instances", type=POSITIVE_INT, default=10,
                          help="instances per cell")
    fidelity.add_argument("--copies", default="2",
                          help="data copies; a list (2,6,10) draws one per instance")
    fidelity.add_argument("--sharing", default="4",
                          help="sharing-set size; a list draws one per instance")
    fidelity.add_argument("--thread-load", default="8",
                          help="average thread load; a list draws one per instance")
    fidelity.add_argument("--kinship", default="3",
                          help="largest degree of kinship; a list draws one per instance")
    fidelity.add_argument("--table-v", action="store_true",
                          help="draw copies, sharing, thread load and kinship per instance "
                               "from Wahib & Maruyama 2014's Table V ranges (lists given override)")
    fidelity.add_argument("--device", default="k20x")
    fidelity.add_argument("--model", default="wahib",
                          choices=("wahib", "wahib-norm", "qiao", "roofline"))
    fidelity.add_argument("--strategy", default="gga", help="strategy under test")
    fidelity.add_argument("--reference", default="exact", help="strategy giving the optimum")
    fidelity.add_argument("--tolerance", type=NON_NEGATIVE_NUMBER, default=0.01,
                          help="relative gap still counted optimal (Wahib & Maruyama 2014b: 1%%)")
    fidelity.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    fidelity.add_argument("--json", action="store_true", help="print the rows as JSON")
    fidelity.set_defaults(handler=command_fidelity)

    fuzz = commands.add_parser("fuzz", help="random pipelines under random legal plans, "
                               "checked against NumPy (kfuse.fuzz)")
    fuzz.add_argument("--seeds", default="0:50", help="a range A:B of case seeds, or a list")
    fuzz.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    fuzz.add_argument("--jobs", type=POSITIVE_INT, default=1, help="processes checking cases")
    fuzz.add_argument("--json", action="store_true", help="one JSON object per case, then a "
                      "summary")
    fuzz.set_defaults(handler=command_fuzz)

    check = commands.add_parser("model-check", help="predicted (roofline, wahib, qiao) vs "
                                "measured time per fused group (measuring needs a GPU)")
    check.add_argument("apps", nargs="+")
    check.add_argument("--size", help="sizes to predict and measure at (default: the app's "
                       "benchmark size)")
    check.add_argument("--strategy", default="greedy", help="search that picks the groups")
    check.add_argument("--model", default="roofline", help="model that search plans with")
    check.add_argument("--candidates", default="plan", choices=("plan", "pairs"),
                       help="the plan's fused groups, or also every legal producer-consumer "
                       "pair")
    check.add_argument("--no-measure", action="store_true", help="print predictions only")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=command_model_check)
    return parser


def command_fuzz(args: argparse.Namespace) -> int:
    """Check fuzzed cases; every one that fails is printed (shrunk); exit status 1 if any."""
    from kfuse import fuzz

    seeds = _seed_list(args.seeds)
    started = time.perf_counter()
    counts = {"ok": 0, "mismatch": 0, "error": 0}

    def report(outcome: Any) -> None:
        counts[outcome.status] += 1
        done = sum(counts.values())
        if args.json:
            print(json.dumps(outcome.as_dict()), flush=True)
        elif outcome.status != "ok":
            print(f"{outcome.status.upper()}: {outcome.case.describe()}\n  {outcome.message}"
                  f" {outcome.errors}", flush=True)
        elif done % 25 == 0:
            print(f"  {done} cases, {counts['mismatch']} mismatches, {counts['error']} errors "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    fuzz.run(seeds, args.backend, report, jobs=args.jobs)
    summary = {"seeds": args.seeds, "backend": args.backend, "cases": sum(counts.values()),
               **counts, "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary) if args.json else
          f"{summary['cases']} cases on {args.backend}: {counts['ok']} ok, "
          f"{counts['mismatch']} mismatches, {counts['error']} errors, "
          f"{summary['seconds']} s")
    return 0 if counts["mismatch"] == counts["error"] == 0 else 1


def _seed_list(text: str) -> list[int]:
    """``A:B`` (A to B-1) or ``1,5,9``: a KfuseError for anything else."""
    try:
        if ":" in text:
            first, last = (int(part) for part in text.split(":"))
            if first < 0 or last <= first:
                raise ValueError
            return list(range(first, last))
        seeds = [int(part) for part in text.split(",")]
        if any(seed < 0 for seed in seeds):
            raise ValueError
        return seeds
    except ValueError:
        raise KfuseError(f"--seeds takes a range A:B (0 <= A < B) or a list of seeds, got "
                         f"{text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a reader gone early (``| head``) shows here, handled below
        return code
    except KfuseError as error:
        print(f"kfuse: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _drop_stdout()
        return 1
    except KeyboardInterrupt:
        print("kfuse: interrupted", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Point stdout at the null device after its reader went away, so that Python's final
    flush at exit does not report the broken pipe again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)


if __name__ == "__main__":
    sys.exit(main())
