"""Write ``docs/results.md`` from the benchmark JSON that ``kfuse bench --json`` records
(``docs/journal/bench/``): for each recorded run, the report of
:func:`kfuse.bench.report.to_markdown` (device, times against the DRAM floor and the
baselines, fusion plans). ``tests/test_docs.py`` checks that the page is what this writes.

    PYTHONPATH=. python3 tools/results_page.py            # rewrite docs/results.md
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results.md"

# The runs shown, newest first: (title, JSON file under docs/journal/bench/, command).
RUNS = (
    ("Time-stepped stencils: columns beside by warp shuffles, separable steps (H200, "
     "2026-11-29, session 37)",
     "2026-11-29-session37-final-steps.json",
     "kfuse bench smooth2d wave2d --no-calls --json F"),
    ("Statistics and their map in one kernel: log-sum-exp of each row (H200, 2026-11-29, "
     "session 37)",
     "2026-11-29-session37-lse.json",
     "kfuse bench logsumexp --json F"),
    ("Normalisations over long rows: LayerNorm at four accesses per segment (H200, "
     "2026-11-29, session 36)",
     "2026-11-29-session36-long-rows-h200.json",
     "kfuse bench rmsnorm layernorm --size 1024x65536 --no-calls --json F"),
    ("Normalisations over long rows: read again from L2 with eviction priorities (H200, "
     "2026-11-29, session 35)",
     "2026-11-29-session35-long-rows-a-h200.json",
     "kfuse bench rmsnorm layernorm --size 1024x65536 --no-calls --json F"),
    ("Normalisations over long rows, continued (H200, 2026-11-29, session 35)",
     "2026-11-29-session35-long-rows-b-h200.json",
     "kfuse bench logsoftmax crossentropy --size 512x131072 --no-calls --json F"),
    ("Softmax over a 128 K vocabulary (H200, 2026-11-29, session 35)",
     "2026-11-29-session35-long-rows-c-h200.json",
     "kfuse bench softmax --no-calls --json F"),
    ("Normalisations at their benchmark sizes (H200, 2026-11-29, session 35)",
     "2026-11-29-session35-norm-std-h200.json",
     "kfuse bench colstandardise layernorm rmsnorm logsoftmax --no-calls --json F"),
    ("Pyramid apps beside Halide and torch.compile: resampled reads shared across register "
     "tiles (H200, 2026-11-28, session 33)",
     "2026-11-28-session33-pyramids-halide.json",
     "KFUSE_HALIDE_SCHEDULES=manual python3 benchmarks/pyramid_bench.py --apps "
     "blend,local_laplacian --baselines torch.compile,halide --no-calls --out D "
     "(tools/gpu_halide.sh)"),
    ("Pyramid apps beside Halide and torch.compile (H200, 2026-11-28, session 32)",
     "2026-11-28-session32-pyramids-halide.json",
     "python3 benchmarks/pyramid_bench.py --apps local_laplacian,blend --baselines "
     "torch.compile,halide --no-calls --out D (tools/gpu_halide.sh)"),
    ("Local Laplacian filter: calls from Python (H200, 2026-11-28, session 32)",
     "2026-11-28-session32-local_laplacian-calls.json",
     "KFUSE_HALIDE_SCHEDULES=manual python3 benchmarks/pyramid_bench.py --apps local_laplacian "
     "--baselines torch.compile,halide --out D (tools/gpu_halide.sh)"),
    ("Local Laplacian filter beside Halide and torch.compile (H200, 2026-11-28, session 30)",
     "2026-11-28-session30-local_laplacian-halide.json",
     "python3 benchmarks/pyramid_bench.py --apps local_laplacian --no-calls --out D "
     "(tools/gpu_halide.sh)"),
    ("Pyramid blending (H200, 2026-11-28, session 29)",
     "2026-11-28-session29-run3-bench_blend_4096.json",
     "kfuse bench blend --no-calls --json F"),
    ("Normalisations: rows in segments, held columns (H100, 2026-11-27, session 27)",
     "2026-11-27-session27-final-h100-norm.json",
     "kfuse bench rmsnorm layernorm logsoftmax softmax crossentropy colstandardise --json F"),
    ("Time-stepped stencils, one streamed kernel (H200, 2026-11-27, session 27)",
     "2026-11-27-session27-steps-h200.json",
     "kfuse bench smooth2d wave2d heat3d stencil27 --json F"),
    ("Normalisations (H200, 2026-11-27, session 27)", "2026-11-27-session27-norm-h200.json",
     "kfuse bench rmsnorm layernorm logsoftmax softmax crossentropy colstandardise --json F"),
    ("Time-stepped stencils, one streamed kernel (H100, 2026-11-27)",
     "2026-11-27-session26-h100-steps-last.json", "kfuse bench smooth2d wave2d --json F"),
    ("Normalisations (H100, 2026-11-27)", "2026-11-27-session26-h100-norm.json",
     "kfuse bench rmsnorm layernorm logsoftmax crossentropy colstandardise --json F"),
    ("Normalisations and statistics (H200, 2026-11-27)", "2026-11-27-session25-norm-h200.json",
     "kfuse bench standardise rmsnorm layernorm logsoftmax crossentropy colstandardise "
     "--no-calls --json F"),
    ("Image and stencil apps (H200, 2026-11-27, later)", "2026-11-27-session25-bench-h200.json",
     "kfuse bench harris shi_tomasi sobel unsharp enhance night diffusion3d --json F"),
    ("Image and stencil apps (H200, 2026-11-27)", "2026-11-27-session22-bench-final-h200.json",
     "kfuse bench harris shi_tomasi sobel unsharp enhance night diffusion3d --no-calls "
     "--json F"),
    ("Image and stencil apps (H200, 2026-11-24)", "2026-11-24-h200-session16-bench.json",
     "kfuse bench harris shi_tomasi sobel unsharp enhance night diffusion3d --json F"),
)

# Kernels side by side (horizontal fusion): runs of benchmarks/hfuse_bench.py (title, raw
# file, command, whether the run timed every candidate split)
PAIR_RUNS = (
    ("Kernels side by side: the final planner (H100, 2026-11-28, session 29)",
     "2026-11-28-session29-run1-hfuse_quick.json",
     "python3 benchmarks/hfuse_bench.py --quick --json F", False),
    ("Kernels side by side: the final planner (H200, 2026-11-27, session 28)",
     "2026-11-27-session28-run5-final-hfuse_bench.json",
     "python3 benchmarks/hfuse_bench.py --quick --rounds 3 --repeat 20 --json F", False),
    ("Kernels side by side: every split (H100, 2026-11-27, session 28)",
     "2026-11-27-session28-run3-hfuse_bench.json",
     "python3 benchmarks/hfuse_bench.py --rounds 3 --repeat 20 --app levels --json F", True),
    ("Kernels side by side: every split (H200, 2026-11-27, session 28)",
     "2026-11-27-session28-run1-hfuse_bench.json",
     "python3 benchmarks/hfuse_bench.py --rounds 3 --repeat 20 --json F", True),
)


def pairs_table(path: Path, every_split: bool) -> str:
    """A run of benchmarks/hfuse_bench.py as a table: each pair one after another, on two
    streams, as the planner of the run planned it, and (``every_split``) side by side at the
    fastest split measured."""
    import json

    header = ("| pair | one after another ms | two streams ms | planner's plan ms | x two streams "
              "| planner puts side by side |")
    rule = "|---|---:|---:|---:|---:|---|"
    if every_split:
        header += " fastest split | ms | x one after another | x two streams |"
        rule += "---|---:|---:|---:|"
    lines = [header, rule]
    for row in json.loads(path.read_text())["rows"]:
        if "pair" not in row:
            continue
        ms = row["ms"]
        line = (f"| {row['pair']} | {ms['one after another']:.4f} | {ms['two streams']:.4f} | "
                f"{ms['auto']:.4f} | {ms['two streams'] / ms['auto']:.2f} | "
                f"{'yes' if row['auto_side_by_side'] else 'no'} |")
        if every_split:
            best = row["best_side_by_side"]
            line += (f" {best.removeprefix('side by side ')} | {ms[best]:.4f} | "
                     f"{ms['one after another'] / ms[best]:.2f} | "
                     f"{ms['two streams'] / ms[best]:.2f} |")
        lines.append(line)
    return "\n".join(lines)


def page() -> str:
    """The text of ``docs/results.md``."""
    from kfuse.bench.report import from_json, to_markdown

    parts = ["# Results", "",
             "Generated by `tools/results_page.py` from the JSON that `kfuse bench --json` "
             "recorded; every run's numbers were measured side by side in one run on one GPU. "
             "How each was made, and every other measurement, is in the "
             "[journal](journal/benchmarks.md). The BLAS-1/2 sequences' latest results "
             "(H100 and H200, against cuBLAS and torch.compile) were recorded by "
             "`benchmarks/blas_bench.py`, in another format: journal, sessions 17-19.", ""]
    for title, name, command in RUNS:
        rows = from_json(ROOT / "docs" / "journal" / "bench" / name)
        parts += [f"## {title}", "", f"`{command}` (raw: `docs/journal/bench/{name}`)", "",
                  to_markdown(rows).rstrip(), ""]
    for title, name, command, every_split in PAIR_RUNS:
        parts += [f"## {title}", "", f"`{command}` (raw: `docs/journal/bench/{name}`); the "
                  "planner's plan is the one the model of that run chose", "",
                  pairs_table(ROOT / "docs" / "journal" / "bench" / name, every_split), ""]
    return "\n".join(parts)


def main() -> int:
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
