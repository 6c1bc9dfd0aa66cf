"""Held rows on the normalisation apps: which block size and grid reach the floor?

Each row normalisation (``rmsnorm``, ``layernorm``, ``logsoftmax``, ``crossentropy``) is one
held-row group. This times the group under named held-row variants — threads per block
``T`` (128 to 1024), 16- or 8-byte accesses, and a grid of as many blocks as the device
holds at once (``resident``: contiguous rows per block) or one block per row (``rows``) —
each checked against the planned program, beside torch.compile, in alternating rounds.
``--occupancy`` times the planned program instead with ``__launch_bounds__(T, k)``: at
least ``k`` blocks per SM, which caps each thread's registers (a source patch).
``--segments`` times rows in segments read again from L2 (no stash) where a block holds
the row too (beside the planned variant). ``--l2-hints`` (with ``--size`` of rows in segments) times the planned program and rows in
segments without a stash, each also with the L2 eviction priorities of their loads (the
first pass's keep their lines in L2, evict_last; the last pass's let them go, evict_first:
what torch.compile's reductions that read a row twice emit) patched out.
``--size MxN`` with rows longer than a block holds times rows held in segments instead:
``T`` threads, ``unroll`` accesses per segment, no stash, the most segments that fit shared
memory, or half as many (two blocks per SM); column standardisation's held columns
(strips, threads, rows per segment, stash) the same way.

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/held_rows_norm_experiment.py [app ...] [--rounds 3]
        [--size 1024x65536] [--l2-hints] [--dtype float16]
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from kfuse.bench.experiment import (
    device_case,
    normalized_variants,
    planned_program,
    time_sources,
)
from kfuse.codegen import generate
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.model.device import current_profile
from kfuse.runtime.backend import VECTOR_ALIGNMENT


def without_l2_hints(source: str) -> str:
    """``source`` with the L2 eviction priorities of rows in segments taken out (plain loads,
    as before they were adopted)."""
    return re.sub(r"kf_mr_load_l2<(\d+), \d>", r"kf_mr_load<\1>", source)


APPS = ("rmsnorm", "layernorm", "logsoftmax", "crossentropy")
THREADS = (128, 256, 512, 1024)


def variants(group: MapReduceGroup, rows: int, cols: int) -> dict[str, str]:
    """Labelled held-row variants of ``group`` whose rows of ``cols`` fit one block."""
    profile = current_profile()
    texts = {}
    for threads in THREADS:
        for size, width in ((16, 4), (8, 2)):
            unroll = -(-cols // (threads * width))
            if unroll * width > 32:
                continue  # more than 32 words a thread: registers spill
            per_sm = max(1, min(profile.max_threads_per_sm // threads, 8))
            access = "w" if size == 16 else "w8"
            for grid, blocks in (("resident", per_sm * profile.sm_count), ("rows", rows)):
                texts[f"T{threads} {size}B {grid}"] = (
                    f"mapreduce:{threads}x1:r1:i1:{access}:stream:g{blocks}:u{unroll}:hr")
    kept = normalized_variants(group, texts.values(), group.graph.name)
    return {label: text for label, text in texts.items() if text in kept}


def segment_variants(group: MapReduceGroup, rows: int, cols: int, stashed: bool = True
                     ) -> dict[str, str]:
    """Labelled variants holding rows of ``cols`` in segments (``stashed``: also with the
    most segments that fit shared memory stashed, and half as many)."""
    from kfuse.schedule.forms import MapReduceVariant

    texts = {}
    for threads in (128, 256, 512, 1024):
        for unroll in (1, 2, 4, 8):
            base = f"mapreduce:{threads}x1:r1:i1:w:stream:g{rows}:u{unroll}:hr:sg"
            variant = MapReduceVariant.parse(base)
            if unroll * 4 * max(1, len(group.tile_inputs) + len(group.col_inputs)) > 48:
                continue
            per_segment = group.stash_bytes(variant, 1)
            most = min(-(-cols // group.step(variant)), 224 * 1024 // per_segment) \
                if per_segment else 0
            stashes = (("none", 0), ("most", most), ("half", most // 2)) if stashed else \
                (("none", 0),)
            for label, stash in stashes:
                text = f"{base}:st{stash}" if stash else base
                texts[f"T{threads} u{unroll} stash {label} ({stash})"] = text
    kept = normalized_variants(group, texts.values(), group.graph.name)
    labels: dict[str, str] = {}
    for label, text in texts.items():  # (each text once)
        if text in kept and text not in labels.values():
            labels[label] = text
    return labels


def column_variants(group: MapReduceGroup, rows: int) -> dict[str, str]:
    """Labelled held-column variants: strips of 8 to 32 columns, 128 to 512 threads, 2 to 8
    rows per thread and segment, no stash or the most that fits 100 KB."""
    from kfuse.schedule.forms import MapReduceVariant

    texts = {}
    for across, down in ((2, 128), (4, 64), (4, 128), (8, 32), (8, 64), (2, 256)):
        for unroll in (2, 4, 8):
            base = f"mapreduce:{across}x{down}:r1:i1:w:shuffle:u{unroll}:hc"
            variant = MapReduceVariant.parse(base)
            per_segment = group.stash_bytes(variant, 1)
            most = min(-(-rows // group.tile(variant)[0]), 100 * 1024 // per_segment) \
                if per_segment else 0
            for label, stash in (("none", 0), ("most", most)):
                text = f"{base}:st{stash}" if stash else base
                texts[f"{across}x{down} u{unroll} stash {label} ({stash})"] = text
    kept = normalized_variants(group, texts.values(), group.graph.name)
    return {label: text for label, text in texts.items() if text in kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*", default=APPS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--occupancy", action="store_true")
    parser.add_argument("--size", help="MxN (default: the app's benchmark size)")
    parser.add_argument("--l2-hints", action="store_true")
    parser.add_argument("--dtype", default="float32", help="float32 or float16")
    parser.add_argument("--segments", action="store_true",
                        help="time rows in segments (no stash: read again from L2) even "
                             "where a block holds the row")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x")) if args.size else None
    for name in args.apps:
        case = device_case(name, size=size, dtype=args.dtype)
        members = tuple(k.name for k in case.graph.kernels)
        group = MapReduceGroup(case.graph, members, list(case.graph.outputs))
        rows, cols = case.sizes[group.domain[0]], case.sizes[group.domain[1]]
        planned = case.plan.groups[0].variant if len(case.plan.groups) == 1 else "?"
        print(f"== {name} {rows}x{cols}: planned {planned}", flush=True)
        if args.occupancy:
            program = planned_program(case)
            programs = {"planned": program}
            for least in (4, 5, 6, 8):
                source = re.sub(r"__launch_bounds__\((\d+)\)",
                                rf"__launch_bounds__(\1, {least})", program.source)
                programs[f"planned, {least} blocks/SM"] = replace(program, source=source)
            time_sources(case, programs, args.rounds, args.runs)
            continue
        if args.l2_hints:
            programs = {"planned": planned_program(case)}
            for threads, unroll in ((1024, 2), (1024, 4), (1024, 6), (1024, 8), (512, 4), (512, 8)):
                text = f"mapreduce:{threads}x1:r1:i1:w:stream:g{rows}:u{unroll}:hr:sg"
                programs[f"T{threads} u{unroll} no stash"] = generate(
                    case.graph, [(members, tuple(case.graph.outputs), text)],
                    fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)
            for label in list(programs):
                program = programs[label]
                programs[f"{label}, no L2 hints"] = replace(
                    program, source=without_l2_hints(program.source))
            time_sources(case, programs, args.rounds, args.runs)
            continue
        if ":hc" in planned:
            named = column_variants(group, rows)
        elif ":sg" in planned or args.segments:
            named = segment_variants(group, rows, cols, stashed=not args.segments)
            if args.segments:
                named = {"planned": planned} | named
        else:
            named = variants(group, rows, cols)
        programs = {label: generate(case.graph, [(members, tuple(case.graph.outputs), text)],
                                    fixed_sizes=case.sizes, array_alignment=VECTOR_ALIGNMENT)
                    for label, text in named.items()}
        time_sources(case, programs, args.rounds, args.runs)


if __name__ == "__main__":
    main()
