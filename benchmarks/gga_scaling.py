"""GGA scaling: time per problem size and gap to the exact optimum where exact is feasible.

Problems come from :func:`kfuse.search.problem.random_problem` (a random dataflow DAG
with a roofline-like cost and a monotone shared-memory rule), not from ``kfuse synth``.
Each instance is solved by ``gga`` on one core (wall and CPU seconds are printed: on a
shared machine the CPU figure is the one-core time) and, up to ``--exact-max`` kernels, by
``exact`` (HiGHS) on a fresh copy of the problem (so neither reuses the other's memoised
evaluations); greedy is shown for scale.

With ``--suite`` the problems are ``kfuse synth`` instances instead (Wahib & Maruyama 2014 Table V:
``2 * kernels`` arrays, copies, sharing-set size, thread load and kinship drawn per
instance from the table's ranges, the literal ``wahib`` model), as ``kfuse fidelity
--table-v`` draws them. The header line gives the CPUs the process may use and the load
average: pin it to one core (``taskset -c 1``) for one-core figures.

    python benchmarks/gga_scaling.py                       # 50, 100 and 1000 kernels
    python benchmarks/gga_scaling.py --sizes 50 100 --instances 10 --json out.json
    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/gga_scaling.py --suite --sizes 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from kfuse.errors import KfuseError
from kfuse.search.problem import FusionProblem, random_problem, solve


def suite_problem(n: int, seed: int) -> FusionProblem:
    """A ``kfuse synth`` instance (Table V attributes drawn per instance), wahib model."""
    from kfuse.project.fidelity import TABLE_V, vary_spec
    from kfuse.project.problem import AppProblem
    from kfuse.project.synth import SynthSpec, synthesize

    spec = vary_spec(SynthSpec(kernels=n, arrays=2 * n, seed=seed), TABLE_V)
    return AppProblem(synthesize(spec), "wahib").fusion_problem()


def measure(n: int, seed: int, exact_max: int, options: dict, suite: bool = False) -> dict:
    """One instance: gga, greedy and (small enough) exact times and objectives."""
    make = suite_problem if suite else (lambda size, s: random_problem(size, seed=s))
    row: dict = {"kernels": n, "seed": seed}
    problem = make(n, seed)
    started, cpu = time.perf_counter(), time.process_time()
    gga = solve(problem, "gga", seed=seed, **options)
    row["gga_s"] = time.perf_counter() - started
    row["gga_cpu_s"] = time.process_time() - cpu
    row["gga_time_s"] = gga.predicted_time_s
    row["gga_stats"] = {k: gga.stats[k] for k in ("runs", "generations", "evaluations",
                                                  "stopped")}
    row["speedup"] = gga.speedup
    row["greedy_time_s"] = solve(make(n, seed), "greedy").predicted_time_s
    if n <= exact_max:
        problem = make(n, seed)
        started = time.perf_counter()
        try:
            exact = solve(problem, "exact")
        except KfuseError as error:
            row["exact_error"] = str(error)
        else:
            row["exact_s"] = time.perf_counter() - started
            row["exact_time_s"] = exact.predicted_time_s
            row["gap"] = gga.predicted_time_s / exact.predicted_time_s - 1
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 1000])
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--exact-max", type=int, default=150,
                        help="largest size solved by exact for the gap (default 150)")
    parser.add_argument("--option", action="append", default=[],
                        help="gga option NAME=VALUE (JSON value), e.g. region_size=16")
    parser.add_argument("--json", help="write every row to this file")
    parser.add_argument("--suite", action="store_true",
                        help="kfuse synth instances (Table V) instead of random problems")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"problems: {'kfuse synth (Table V, wahib)' if args.suite else 'random_problem'}; "
          f"cpus allowed {cpus}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    options = {}
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = json.loads(value)
    rows = []
    print(f"{'kernels':>7} {'seed':>4} {'gga s':>8} {'cpu s':>8} {'gap %':>8} {'exact s':>8} "
          f"{'greedy gap %':>12} {'speedup':>8} {'runs':>5} {'evals':>8}")
    for n in args.sizes:
        for seed in range(args.instances):
            row = measure(n, seed, args.exact_max, options, args.suite)
            rows.append(row)
            reference = row.get("exact_time_s", row["gga_time_s"])
            gap = f"{row['gap'] * 100:8.3f}" if "gap" in row else f"{'-':>8}"
            exact_s = f"{row['exact_s']:8.2f}" if "exact_s" in row else f"{'-':>8}"
            print(f"{n:>7} {seed:>4} {row['gga_s']:8.2f} {row['gga_cpu_s']:8.2f} {gap} {exact_s} "
                  f"{(row['greedy_time_s'] / reference - 1) * 100:12.2f} "
                  f"{row['speedup']:8.3f} {row['gga_stats']['runs']:>5} "
                  f"{row['gga_stats']['evaluations']:>8}", flush=True)
    print()
    for n in args.sizes:
        sized = [r for r in rows if r["kernels"] == n]
        gaps = [r["gap"] for r in sized if "gap" in r]
        times = [r["gga_s"] for r in sized]
        cpu = [r["gga_cpu_s"] for r in sized]
        summary = (f"{n} kernels: gga mean {statistics.mean(times):.2f} s, "
                   f"max {max(times):.2f} s (cpu mean {statistics.mean(cpu):.2f} s, "
                   f"max {max(cpu):.2f} s)")
        if gaps:
            optimal = sum(g <= 1e-9 for g in gaps)
            summary += (f"; optimal {optimal}/{len(gaps)}, within 1% "
                        f"{sum(g <= 0.01 for g in gaps)}/{len(gaps)}, "
                        f"worst gap {max(gaps) * 100:.3f}%")
        print(summary)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
