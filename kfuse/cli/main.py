"""The ``kfuse`` command: demo, apps, run, bench, calibrate."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from kfuse.errors import KfuseError
from kfuse.runtime.binding import to_numpy


def _console():
    from rich.console import Console
    return Console()


def _parse_size(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(part) for part in text.lower().replace("x", ",").split(",") if part)
    except ValueError:
        raise KfuseError(f"--size takes numbers like 1024x768 or 64,64,64, got {text!r}") from None


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
    from kfuse.apps.check import relative_error

    console = _console()
    backend = _backend_name(args.backend)
    height, width = (2048, 2048) if backend == "cuda" else (96, 128)
    app = get_app("harris")
    pipeline = app.build()
    image = synthetic_image(height, width)
    _, params = app.make_inputs((height, width), np.random.default_rng(0), "float32")
    graph = pipeline.graph()
    console.print(f"[bold]kfuse demo[/bold]: Harris corners ({len(graph.kernels)} operators) on a "
                  f"{height}x{width} synthetic image, backend [cyan]{backend}[/cyan]")
    plan = pipeline.plan(sizes=_sizes_for(graph, app, (height, width)))
    started = time.perf_counter()
    with console.status("compiling and running the generated CUDA C..."):
        outputs = pipeline.run(backend=backend, plan=plan, img=image, **params)
    elapsed = time.perf_counter() - started
    response = to_numpy(outputs["hc"])
    reference = app.reference({"img": image.astype(np.float64)}, params, "clamp")["hc"]
    error = relative_error(response, reference)
    corners = int(np.sum(response > 0.01 * float(np.max(response))))
    verified = bool(error <= 1e-5)
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
    table = Table(title="kfuse apps")
    for column in ("name", "kernels", "what", "benchmark size", "test size", "from"):
        table.add_column(column)
    for app in list_apps():
        kernels = len(app.build().graph().kernels)
        table.add_row(app.name, str(kernels), app.title, "x".join(map(str, app.bench_size)),
                      "x".join(map(str, app.test_size)), app.origin)
    _console().print(table)
    return 0


def command_run(args: argparse.Namespace) -> int:
    from kfuse.apps import get_app
    from kfuse.apps.check import relative_error
    from kfuse.codegen import generate
    from kfuse.search import search

    app = get_app(args.app)
    backend = _backend_name(args.backend)
    size = _parse_size(args.size) or (app.bench_size if backend == "cuda" else app.test_size)
    pipeline = app.build(boundary=args.boundary)
    graph = pipeline.graph()
    plan = None if args.unfused else search(graph, sizes=_sizes_for(graph, app, size))
    groups = plan.kernel_groups if plan else None
    if args.show_source:
        print(generate(graph, groups).source)
        return 0
    if args.resources:
        return _print_resources(graph, groups)
    arrays, params = app.make_inputs(size, np.random.default_rng(args.seed), "float32")
    started = time.perf_counter()
    outputs = pipeline.run(backend=backend, plan=plan or "unfused", **arrays, **params)
    elapsed = time.perf_counter() - started
    result = {"app": app.name, "backend": backend, "size": list(size),
              "boundary": args.boundary, "operators": len(graph.kernels),
              "kernels": len(groups) if groups else len(graph.kernels),
              "groups": [list(group[0]) for group in groups] if groups else None,
              "wall_time_s": round(elapsed, 4)}
    if args.verify or args.json:
        reference = app.reference({k: np.asarray(v, np.float64) for k, v in arrays.items()},
                                  params, args.boundary)
        errors = {name: relative_error(to_numpy(outputs[name]), reference[name])
                  for name in graph.outputs}
        worst = max(errors.values())
        result.update(max_rel_error=worst, verified=bool(worst <= 1e-5))
    if args.json:
        print(json.dumps(result))
    else:
        console = _console()
        console.print(result)
        if "verified" in result:
            console.print("[green]verified[/green]" if result["verified"]
                          else "[red]NOT verified[/red]")
    return 0 if result.get("verified", True) else 1


def _sizes_for(graph, app, size: tuple[int, ...]) -> dict[str, int]:
    """Size symbols of an app's graph bound from its input size (apps' inputs share it)."""
    return graph.bind_shapes({name: size for name in graph.inputs})


def _print_resources(graph, groups=None) -> int:
    from rich.table import Table

    from kfuse.codegen import generate
    from kfuse.codegen.resources import kernel_resources
    figures = kernel_resources(generate(graph, groups).source)
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
    from kfuse.search import search

    app = get_app(args.app)
    graph = app.build().graph()
    size = _parse_size(args.size) or app.bench_size
    plan = search(graph, args.strategy, args.model, sizes=_sizes_for(graph, app, size))
    if args.dot:
        with open(args.dot, "w") as handle:
            handle.write(plan.to_dot() + "\n")
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        print(plan.explain())
    return 0


# ------------------------------------------------------------------------------------------------
# kfuse bench / calibrate
# ------------------------------------------------------------------------------------------------

def command_bench(args: argparse.Namespace) -> int:
    from kfuse.bench import bench_apps, plot, print_report, to_json
    from kfuse.runtime import get_backend
    get_backend("cuda")  # a clear error when no GPU is usable
    rows = bench_apps(args.apps, size=_parse_size(args.size), baselines=not args.no_baselines)
    print_report(rows)
    if args.json:
        to_json(rows, args.json)
    if args.plot:
        plot(rows, args.plot)
    return 0


def command_calibrate(args: argparse.Namespace) -> int:
    from kfuse.bench import calibrate
    profile = calibrate()
    path = profile.save()
    _console().print(profile)
    _console().print(f"saved to {path}")
    return 0


# ------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfuse", description="Automatic kernel fusion for "
                                     "memory-bound GPU pipelines.")
    commands = parser.add_subparsers(dest="command", required=True)
    backends = ("auto", "cuda", "cpu", "numpy")

    demo = commands.add_parser("demo", help="run Harris corners and verify it")
    demo.add_argument("--backend", default="auto", choices=backends)
    demo.set_defaults(handler=command_demo)

    apps = commands.add_parser("apps", help="list the built-in pipelines")
    apps.set_defaults(handler=command_apps)

    run = commands.add_parser("run", help="run one app")
    run.add_argument("app")
    run.add_argument("--backend", default="auto", choices=backends)
    run.add_argument("--size", help="e.g. 1024x768 or 64,64,64 (default: the app's)")
    run.add_argument("--boundary", default="clamp",
                     choices=("clamp", "mirror", "repeat", "constant"))
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--verify", action="store_true", help="compare with the NumPy reference")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--show-source", action="store_true", help="print the generated CUDA C")
    run.add_argument("--resources", action="store_true",
                     help="registers, shared memory, spills per kernel (needs nvcc)")
    run.add_argument("--unfused", action="store_true", help="one kernel per operator")
    run.set_defaults(handler=command_run)

    plan = commands.add_parser("plan", help="show the fusion plan of an app and why")
    plan.add_argument("app")
    plan.add_argument("--strategy", default="greedy")
    plan.add_argument("--model", default="roofline")
    plan.add_argument("--size", help="sizes to predict with (default: the app's benchmark size)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--dot", help="write the fused graph (Graphviz) to this file")
    plan.set_defaults(handler=command_plan)

    bench = commands.add_parser("bench", help="time apps on the GPU against baselines")
    bench.add_argument("apps", nargs="+")
    bench.add_argument("--size")
    bench.add_argument("--json")
    bench.add_argument("--plot")
    bench.add_argument("--no-baselines", action="store_true")
    bench.set_defaults(handler=command_bench)

    calibrate = commands.add_parser("calibrate", help="measure the GPU (copy bandwidth, ...)")
    calibrate.set_defaults(handler=command_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KfuseError as error:
        print(f"kfuse: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
