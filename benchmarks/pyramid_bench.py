"""The pyramid apps on the GPU beside torch.compile and Halide, in one run (issue 31's
targets): local Laplacian (Halide's parameters, 4K RGB uint16) and pyramid blending.

Run on the GPU machine with the halide package importable (tools/gpu_halide.sh unpacks it);
writes the rows as JSON and Markdown to ``--out`` (each row's notes say how long planning
took: cold on a fresh machine). ``KFUSE_HALIDE_SCHEDULES`` picks Halide's
schedules (kfuse.bench.halide_baseline).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kfuse.apps.pyramids import BLEND, EXPOSURE_FUSION, LOCAL_LAPLACIAN
from kfuse.bench import bench_apps
from kfuse.bench.report import print_report, to_json, to_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--apps", default="local_laplacian,blend")
    parser.add_argument("--no-calls", action="store_true")
    parser.add_argument("--baselines", default="torch eager,torch.compile,halide",
                        help="comma-separated, of kfuse.bench.harness.BASELINES")
    args = parser.parse_args()
    apps = {"local_laplacian": LOCAL_LAPLACIAN, "blend": BLEND,
            "exposure_fusion": EXPOSURE_FUSION}
    chosen = [apps[name] for name in args.apps.split(",")]
    start = time.perf_counter()
    rows = bench_apps(chosen, baselines=tuple(args.baselines.split(",")),
                      progress=True, calls=not args.no_calls)
    args.out.mkdir(parents=True, exist_ok=True)
    to_json(rows, args.out / "pyramid_bench.json")
    (args.out / "pyramid_bench.md").write_text(to_markdown(rows))
    print_report(rows)
    print(f"benchmark took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
