"""Reports of benchmark rows: rich tables, JSON, Markdown, a bar chart."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kfuse.bench.harness import ERROR_TOLERANCE, BenchRow

MISSING = "—"
COLUMNS = ("app", "size", "fused ms", "unfused ms", "fusion speedup", "floor ms",
           "fused/floor", "eager ms", "compile ms", "compile/fused", "eager/fused", "GB/s",
           "max err")
KERNEL_COLUMNS = ("app", "kernel", "operators", "ms", "MB", "GB/s", "of copy")
HALIDE_COLUMNS = ("app", "size", "kfuse ms", "Halide manual ms", "manual/kfuse",
                  "Halide auto ms", "auto/kfuse", "compile/kfuse", "max err")
CALL_COLUMNS = ("app", "size", "launches", "kernels us", "run us", "compiled us",
                "no graphs us", "torch.compile us", "compiled/kernels")


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}x" if abs(value) >= 100 else f"{value:.2f}x"


def _error(row: BenchRow) -> str:
    if row.max_error is None:
        return MISSING
    text = f"{row.max_error:.1e}"
    return text if row.error_ok else f"{text} (> {ERROR_TOLERANCE:g}!)"


def _size(size: Sequence[int]) -> str:
    return "x".join(str(s) for s in size)


def cells(row: BenchRow) -> list[str]:
    """The main table's cells of one row, in :data:`COLUMNS` order."""
    return [row.app, _size(row.size), _num(row.kfuse_ms), _num(row.unfused_ms),
            _ratio(row.fusion_speedup), _num(row.floor_ms),
            _ratio(row.kfuse_over_floor), _num(row.eager_ms), _num(row.compile_ms),
            _ratio(row.compile_over_kfuse), _ratio(row.eager_over_kfuse),
            _num(row.kfuse_gbps, 0), _error(row)]


def call_cells(row: BenchRow) -> list[list[str]]:
    """The call-cost table's rows of one app (one per size measured)."""
    lines = []
    for call in row.calls:
        kernels = call.get("kernels_us")
        lines.append([row.app, _size(call["size"]), str(call.get("launches", "")),
                      _num(kernels, 1), _num(call.get("run_us"), 1),
                      _num(call.get("compiled_us"), 1), _num(call.get("direct_us"), 1),
                      _num(call.get("torch_compile_us"), 1),
                      _ratio(call["compiled_us"] / kernels if kernels else None)])
    return lines


def halide_cells(row: BenchRow) -> list[list[str]]:
    """The Halide table's row of one app (none when Halide did not run on it)."""
    if row.halide_ms is None and row.halide_auto_ms is None:
        return []
    auto = _num(row.halide_auto_ms) + (f" ({row.halide_auto})" if row.halide_auto else "")
    error = MISSING if row.halide_error is None else f"{row.halide_error:.1e}"
    return [[row.app, _size(row.size), _num(row.kfuse_ms), _num(row.halide_ms),
             _ratio(row.halide_over_kfuse), auto, _ratio(row.halide_auto_over_kfuse),
             _ratio(row.compile_over_kfuse), error]]


def _percent(fraction: float | None) -> str:
    if fraction is None or math.isnan(fraction):
        return MISSING
    return f"{fraction * 100:.0f}%"


def kernel_cells(row: BenchRow) -> list[list[str]]:
    """Per-kernel table cells of one row, in :data:`KERNEL_COLUMNS` order."""
    return [[row.app, k.name, ", ".join(k.operators), _num(k.ms), _num(k.bytes / 1e6, 1),
             _num(k.gbps, 0), _percent(k.fraction_of_copy)] for k in row.kernels]


def device_line(rows: Sequence[BenchRow]) -> str:
    """``Device: NAME (copy 2900 GB/s)`` for the devices of the rows."""
    seen: dict[str, BenchRow] = {}
    for row in rows:
        seen.setdefault(row.device, row)
    if not seen:
        return "Device: none (no rows)"
    parts = []
    for name, row in seen.items():
        kind = "measured" if row.bandwidth_measured else "nominal, not measured"
        parts.append(name + (f" (copy bandwidth {row.copy_gbps:.0f} GB/s, {kind})"
                             if row.copy_gbps else ""))
    return "Device: " + "; ".join(parts)


def _compile_mode(rows: Sequence[BenchRow]) -> str | None:
    modes = sorted({row.compile_mode for row in rows if row.compile_mode})
    return ", ".join(modes) if modes else None


# ---------------------------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------------------------

def print_report(rows: Sequence[BenchRow], console: Any = None, *, kernels: bool = True) -> None:
    """Print the device, the main table, the per-kernel table and the notes."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 160))
    console.print(f"[bold]{device_line(rows)}[/bold]")
    mode = _compile_mode(rows)
    if mode:
        console.print(f"baseline: {mode}; floor = inputs read once + outputs written once "
                      "at the measured copy bandwidth")
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD)
    for index, column in enumerate(COLUMNS):
        table.add_column(column, justify="left" if index < 2 else "right")
    for row in rows:
        table.add_row(*cells(row))
    console.print(table)
    def detail(title: str, columns: Sequence[str], lines: list[list[str]], left: int) -> None:
        if not lines:
            return
        table = Table(title=title, show_header=True, header_style="bold", box=box.SIMPLE_HEAD)
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index < left else "right")
        for line in lines:
            table.add_row(*line)
        console.print(table)

    if kernels:
        detail("kfuse unfused program, each kernel timed alone", KERNEL_COLUMNS,
               [line for row in rows for line in kernel_cells(row)], 3)
    detail("Halide (its own GPU schedule, its best GPU autoscheduler), same inputs",
           HALIDE_COLUMNS, [line for row in rows for line in halide_cells(row)], 2)
    detail("a call from Python, microseconds per call (calls back to back)", CALL_COLUMNS,
           [line for row in rows for line in call_cells(row)], 2)
    for row in rows:
        for note in row.notes:
            console.print(f"[dim]{row.app}: {note}[/dim]")


def print_table(rows: Sequence[BenchRow], console: Any = None) -> None:
    """The device line and the main table only."""
    print_report(rows, console, kernels=False)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def to_json(rows: Sequence[BenchRow], path: str | os.PathLike | None = None) -> str:
    """Rows as JSON (derived ratios included); written to ``path`` when given."""
    text = json.dumps({"rows": [row.to_dict() for row in rows]}, indent=2) + "\n"
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return text


def from_json(source: str | os.PathLike) -> list[BenchRow]:
    """Rows back from :func:`to_json` output (a path or the JSON text itself)."""
    text = str(source)
    if not text.lstrip().startswith("{"):
        text = Path(source).read_text()
    data = json.loads(text)
    return [BenchRow.from_dict(_unjson(row)) for row in data.get("rows", [])]


def _unjson(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("max_error", "compile_error"):
        if row.get(key) == "inf":
            row[key] = math.inf
    return row


def to_markdown(rows: Sequence[BenchRow]) -> str:
    """A Markdown report (for docs/journal/benchmarks.md): device, main table, kernels, notes."""
    lines = [f"**{device_line(rows)}**", ""]
    mode = _compile_mode(rows)
    if mode:
        lines += [f"Baselines: PyTorch eager and {mode}, on the same arrays.", ""]
    lines += ["Floor: every input read once and every output written once at the measured "
              "copy bandwidth. GB/s: floor bytes / fused time. Max err: kfuse fused vs PyTorch "
              "eager, max|a-b| / max|b|.", ""]
    plans = [f"- {row.app}: " + " | ".join("+".join(g) for g in row.plan_groups)
             for row in rows if row.plan_groups]
    if plans:
        lines += ["Fusion plans (greedy search, roofline model), one kernel per group:", ""]
        lines += plans + [""]
    lines += _md_table(COLUMNS, [cells(row) for row in rows])
    details = (
        ("Each kernel of kfuse's unfused program timed alone (its reads once + its write "
         "once):", KERNEL_COLUMNS, kernel_cells),
        ("Halide on the same inputs, in the same run (Halide's own GPU schedule and its "
         "fastest GPU autoscheduler; host-timed, kfuse.bench.halide_baseline; max err away "
         "from the borders):", HALIDE_COLUMNS, halide_cells),
        ("A call from Python, microseconds per call (calls back to back, the device waited "
         "on once; kernels: the program alone, replayed in a CUDA graph):", CALL_COLUMNS,
         call_cells))
    for title, columns, cells_of in details:
        body = [line for row in rows for line in cells_of(row)]
        if body:
            lines += ["", title, ""] + _md_table(columns, body)
    notes = [f"- {row.app}: {note}" for row in rows for note in row.notes]
    if notes:
        lines += ["", "Notes:", ""] + notes
    return "\n".join(lines) + "\n"


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    def clean(text: str) -> str:
        return str(text).replace("|", "\\|")
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(clean(c) for c in line) + " |" for line in body]
    return out


def plot(rows: Sequence[BenchRow], path: str | os.PathLike) -> Path:
    """Bar chart (PNG/SVG by extension): per app, floor, kfuse, eager, compile in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("floor", "floor_ms", "#999999"), ("kfuse fused", "kfuse_ms", "#1f77b4"),
              ("kfuse unfused", "unfused_ms", "#9ecae1"),
              ("torch eager", "eager_ms", "#ff7f0e"), ("torch.compile", "compile_ms", "#2ca02c")]
    apps = [f"{row.app}\n{_size(row.size)}" for row in rows]
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.5))
    values_seen = []
    for index, (label, attribute, color) in enumerate(series):
        values = [getattr(row, attribute) for row in rows]
        heights = [v if v is not None else 0.0 for v in values]
        values_seen += [v for v in values if v]
        positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(rows))]
        axes.bar(positions, heights, width, label=label, color=color)
    axes.set_xticks(range(len(rows)))
    axes.set_xticklabels(apps)
    axes.set_ylabel("time per run (ms)")
    if values_seen and max(values_seen) / max(min(values_seen), 1e-12) > 30:
        axes.set_yscale("log")
    devices = ", ".join(dict.fromkeys(row.device for row in rows)) or "no device"
    axes.set_title(f"kfuse vs the DRAM floor and PyTorch\n{devices}", fontsize=10)
    legend = axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(series),
                         frameon=False, fontsize=9)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=120, bbox_extra_artists=(legend,), bbox_inches="tight")
    plt.close(figure)
    return target
