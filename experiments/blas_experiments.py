"""Why do the matrix-vector kernels read the matrix slower than ~4.6 TB/s? Time candidates.

For GESUMMV, GEMVER, SGEMV, ATAX, SGEMVT and BiCGK (float32, 16384 x 16384 by default;
BiCGK to see that its plan did not regress), every
*matrix group* of the planner's plan (the kernels that stream a matrix) is timed under a set
of candidate implementations, one group at a time, the other groups kept at the planner's
choice:

- ``plan``: the planner's variant (``app.planner``, the predicted best);
- ``before``: the planner's choice before the stream mapping existed (nominal profile);
- ``tile``: the best-predicted variant of the tile mapping (what the planner chose before
  the stream mapping existed: 32 x by threads own a 128-column tile and walk down the rows);
- ``rank<i>``: the ``--top`` best-predicted variants;
- ``pick``: hand-picked configurations (stream: warps walking along their rows with 2-16
  16-byte loads per row and thread in flight, 2-16 warps per block, persistent grids of a
  multiple of the SM count looping over the rows (``g``); tile: more rows in flight per
  thread). Stream variants without a column span (``:c``) store whole rows plainly: no
  atomics and no fill of their outputs. Where the plan fuses an elementwise *epilogue*
  into a row reduction (SGEMV ``[z_prod+z]``, GESUMMV ``[Ax+Bx+y]``: the warp owning a row
  evaluates ``z = alpha A x + beta y`` at that row), the candidates are those whole-row
  stream variants only, and the whole program is also timed with the epilogue split off
  into its own kernel (``split``: one launch and the intermediate's write and read more).

Each candidate's group time is the median of ``--repeat`` CUDA-event timings (after
warm-up) of its kernel launch plus the fills of its atomically combined outputs; GB/s counts
the bytes the kernel must move (its inputs read once, its outputs written once). Every
candidate's whole program is then checked against the float64 NumPy reference (norm-wise
relative error; ``ok`` at <= 1e-5; outputs larger than 2^24 elements are compared on a fixed
sample of rows). At the end, per app: the planner's whole-program time and the sum of the
best measured groups, next to torch.compile's time on the H200 (issue 5 numbers).

Usage (repo root, on the GPU machine)::

    PYTHONPATH=. python3 experiments/blas_experiments.py [apps ...] [--size 16384] [--top 8]
        [--repeat 30] [--budget 210] [--no-calibrate] [--resources] [--json out.json]
    PYTHONPATH=. python3 experiments/blas_experiments.py --dry-run [--h200] [--resources]
        # no GPU: plans, candidates, generated sources (--resources: registers via nvcc;
        # --h200: rank with an H200-like profile, copy 4275 GB/s)

Writes ``$OUT/blas_experiments.json`` when ``$OUT`` is set (or ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfuse.apps import get_app
from kfuse.apps.check import relative_error
from kfuse.bench.floor import launch_bytes
from kfuse.codegen import generate
from kfuse.errors import KfuseError
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.runtime.binding import bind
from kfuse.schedule.forms import MapReduceVariant, is_variant_text
from kfuse.search.variants import ImplementationSpace

APPS = ("gesummv", "gemver", "sgemv", "atax", "sgemvt", "bicgk")  # most wanted first
# issue 5 / lead's H200 numbers (ms at 16384^2): kfuse before this change, torch.compile
H200_BEFORE = {"gesummv": 0.589, "sgemv": 0.245, "atax": 0.482, "sgemvt": 0.486,
               "gemver": 0.871, "bicgk": 0.288}
H200_COMPILE = {"gesummv": 0.461, "sgemv": 0.233, "atax": 0.469, "sgemvt": 0.469,
                "gemver": 0.803, "bicgk": 0.51}
GEMVER_TARGET_MS = 0.835  # 1.1 x its three-pass floor (0.759 ms)
BEFORE = {"Ax+Bx": "32x4:r4:i16:w:shuffle", "z_prod": "32x4:r8:i8:w:smem:o=NAME",
          "t": "32x4:r8:i8:w:smem:o=NAME", "w": "32x4:r8:i8:w:smem:o=NAME",
          "y": "32x8:r2:i16:w:shuffle", "x_prod": "32x8:r2:i16:w:shuffle",
          "B+x_prod": "32x8:r4:i16:w:shuffle", "q+s": "32x4:r8:i8:w:smem:o=NAME"}
TOLERANCE = 1e-5
SAMPLE_ROWS = 512          # rows compared for outputs larger than BIG elements
BIG = 1 << 24

STREAM_PICKS = ("32x4:r1:i1:w:stream:u4", "32x4:r1:i1:w:stream:u8", "32x8:r1:i1:w:stream:u4",
                "32x4:r4:i1:w:stream:u2", "32x4:r1:i1:w:stream:u4:c4096",
                # round 2: 8 warps x u8, u16, 2 warps per block, persistent grids (GSMS:
                # the device's SM count times the number after it), 2 row groups per block
                "32x8:r1:i1:w:stream:u8", "32x4:r1:i1:w:stream:u16", "32x2:r1:i1:w:stream:u4",
                "32x2:r1:i1:w:stream:u8", "32x8:r1:i2:w:stream:u4",
                "32x4:r1:i1:w:stream:GSMS8:u4", "32x8:r1:i1:w:stream:GSMS4:u4",
                "32x4:r1:i1:w:stream:GSMS4:u8", "32x16:r1:i1:w:stream:u4")
TILE_PICKS = ("32x8:r2:i16:w:shuffle", "32x4:r4:i16:w:shuffle", "32x8:r4:i8:w:shuffle",
              "32x4:r8:i8:w:shuffle", "32x8:r8:i4:w:shuffle", "32x16:r4:i4:w:shuffle")


@dataclass
class Candidate:
    label: str
    variant: str
    predicted_ms: float | None = None
    rank: int | None = None
    registers: int | None = None
    spills: int | None = None
    ms: float | None = None
    gbps: float | None = None
    error: float | None = None
    note: str = ""


@dataclass
class GroupStudy:
    members: tuple[str, ...]
    candidates: list[Candidate] = field(default_factory=list)


def log(text: str) -> None:
    print(text, flush=True)


def matrix_groups(graph, plan) -> list[tuple[tuple[str, ...], tuple[str, ...], str]]:
    """(members, outputs, variant) of the plan's groups that iterate over a matrix."""
    found = []
    for group in plan.groups:
        members = tuple(group.members)
        if len(graph.kernel_by_name[members[0]].domain) == 2:
            found.append((members, tuple(group.outputs), group.variant))
    return found


def candidates_for(graph, space: ImplementationSpace, members, outputs, plan_variant: str,
                   top: int, sms: int = 132) -> list[Candidate]:
    choices = space.choices(members)
    predicted = {c.variant: (i + 1, c.prediction.time_s * 1e3) for i, c in enumerate(choices)}
    result: list[Candidate] = []
    seen: set[str] = set()

    def add(label: str, variant: str) -> None:
        try:
            group = MapReduceGroup(graph, members, outputs)
            if is_variant_text(variant):
                variant = group.normalize(MapReduceVariant.parse(variant)).text()
        except KfuseError as error:
            log(f"    (skipped {label} {variant}: {error})")
            return
        if variant in seen:
            return
        seen.add(variant)
        rank, ms = predicted.get(variant, (None, None))
        result.append(Candidate(label, variant, ms, rank))

    add("plan", plan_variant)
    name = "+".join(members)
    if name in BEFORE:  # the planner's choice before the stream mapping (nominal profile)
        add("before", "mapreduce:" + BEFORE[name].replace("NAME", members[0]))
    tiles = [c.variant for c in choices if is_variant_text(c.variant)
             and MapReduceVariant.parse(c.variant).rowsum != "stream"]
    if tiles:
        add("tile", tiles[0])
    for index, choice in enumerate(choices[:top], start=1):
        add(f"rank{index}", choice.variant)
    group = MapReduceGroup(graph, members, outputs)
    picks = TILE_PICKS if group.col_reductions() else STREAM_PICKS + TILE_PICKS[:2]
    if group.epilogue:  # a row reduction and its epilogue: whole-row stream variants only
        picks = tuple(p for p in STREAM_PICKS if ":c" not in p)
    for pick in picks:
        pick = re.sub(r"GSMS(\d+)", lambda m: f"g{int(m.group(1)) * sms}", pick)
        add("pick", "mapreduce:" + pick)
    return result


def program_for(graph, plan, members, variant: str, fixed_sizes=None):
    """The plan's program with one group under ``variant`` (compiled for ``fixed_sizes``,
    as the cuda backend compiles the programs it generates itself)."""
    groups = []
    for group in plan.groups:
        chosen = variant if tuple(group.members) == members else group.variant
        groups.append((tuple(group.members), tuple(group.outputs), chosen))
    return generate(graph, groups, fixed_sizes=fixed_sizes)


def annotate_resources(graph, plan, study: GroupStudy) -> None:
    from kfuse.codegen.resources import kernel_resources, nvcc_available
    if not nvcc_available():
        return
    for candidate in study.candidates:
        try:
            program = program_for(graph, plan, study.members, candidate.variant)
            index = [tuple(g.members) for g in plan.groups].index(study.members)
            symbol = program.launches[index].symbol
            figures = kernel_resources(program.source)[symbol]
            candidate.registers = figures.registers
            candidate.spills = figures.spill_store_bytes
        except Exception as error:  # keep going: resources are informative
            candidate.note = f"resources: {error}"


def compare(outputs: dict[str, Any], reference: dict[str, np.ndarray], rows: np.ndarray
            ) -> float:
    import cupy
    worst = 0.0
    for name, expected in reference.items():
        got = outputs[name]
        if expected.size > BIG and expected.ndim == 2:
            got = cupy.asnumpy(got[cupy.asarray(rows)])
            expected = expected[rows]
        else:
            got = cupy.asnumpy(got)
        worst = max(worst, relative_error(got, expected))
    return worst


def study_app(name: str, args, profile) -> dict[str, Any]:
    app = get_app(name)
    pipeline = app.build()
    graph = pipeline.graph()
    size = (args.size, args.size)
    sizes = app.sizes(graph, size)
    started = time.perf_counter()
    plan = app.planner(graph, sizes, profile)
    space = ImplementationSpace(graph, sizes, profile)
    log(f"\n== {name}: plan " + " | ".join(f"[{'+'.join(g.members)}] {g.variant}"
                                           for g in plan.groups))
    studies = []
    for members, outputs, variant in matrix_groups(graph, plan):
        study = GroupStudy(members,
                           candidates_for(graph, space, members, outputs, variant, args.top,
                                          profile.sm_count))
        studies.append(study)
        log(f"  group [{'+'.join(members)}]: {len(study.candidates)} candidates "
            f"({len(space.choices(members))} in the space)")
    if args.resources:
        for study in studies:
            annotate_resources(graph, plan, study)
    if args.dry_run:
        for study in studies:
            for candidate in study.candidates:  # generate every source once (checks them)
                program_for(graph, plan, study.members, candidate.variant)
        report = {"app": name, "plan": [[list(g.members), g.variant] for g in plan.groups],
                  "groups": [{"members": list(s.members),
                              "candidates": [c.__dict__ for c in s.candidates]}
                             for s in studies]}
        print_tables(name, studies, None, None)
        return report

    import cupy

    from kfuse.runtime import get_backend
    from kfuse.tune.timing import time_gpu
    arrays, params = app.make_inputs(size, np.random.default_rng(11), "float32")
    computed = time.perf_counter()
    reference = app.reference(arrays, params, None)
    log(f"  reference (float64 NumPy) ... {time.perf_counter() - computed:.1f} s")
    rows = np.sort(np.random.default_rng(0).choice(args.size, SAMPLE_ROWS, replace=False))
    given = {k: cupy.asarray(v) for k, v in arrays.items()} | params
    del arrays
    backend = get_backend("cuda")

    def timed_group(executable, index: int) -> float:
        spec = executable.program.launches[index]
        return time_gpu(lambda: executable.launch_one(spec), warmup=args.warmup,
                        repeat=args.repeat).median_s

    plan_index = {tuple(g.members): i for i, g in enumerate(plan.groups)}
    for study in studies:
        index = plan_index[study.members]
        log(f"  timing [{'+'.join(study.members)}] ({len(study.candidates)} candidates)")
        for number, candidate in enumerate(study.candidates, start=1):
            if time.monotonic() > args.deadline:
                candidate.note = "skipped (--budget spent)"
                continue
            try:
                program = program_for(graph, plan, study.members, candidate.variant,
                                      backend.fixed_sizes(bind(graph, given)))
                executable = backend.prepare(graph, given, program=program)
                executable.launch_all()  # intermediates of earlier groups in place
                seconds = timed_group(executable, index)
                candidate.ms = seconds * 1e3
                moved = launch_bytes(graph, program.launches[index], executable.bound.sizes)
                candidate.gbps = moved / seconds / 1e9
                executable.launch_all()
                candidate.error = compare(executable.results(), reference, rows)
                del executable
            except Exception as error:  # keep going
                candidate.note = f"FAILED {error!r}"[:160]
                traceback.print_exc(limit=2)
            log(f"    {number:2d}/{len(study.candidates)} {candidate.label:6s} "
                f"{candidate.variant:42s} {fmt(candidate.ms, '8.4f')} ms "
                f"{fmt(candidate.gbps, '7.0f')} GB/s err {fmt(candidate.error, '.1e')} "
                f"{candidate.note}")
    # the whole program: the planner's plan, the best measured variant of every group, and
    # (where the plan fuses a row reduction's epilogue) the same with the epilogue split off
    whole = {}
    trials = [("plan", {}, False), ("best", {s.members: best(s).variant for s in studies
                                             if best(s) is not None}, False)]
    if any(MapReduceGroup(graph, m, o).epilogue for m, o, _ in matrix_groups(graph, plan)):
        trials.append(("split", {}, True))
    for label, variants, split in trials:
        groups = [(tuple(g.members), tuple(g.outputs), variants.get(tuple(g.members), g.variant))
                  for g in plan.groups]
        if split:
            groups = split_epilogues(graph, groups)
        executable = backend.prepare(graph, given, program=generate(
            graph, groups, fixed_sizes=backend.fixed_sizes(bind(graph, given))))
        whole[label] = time_gpu(executable.launch_all, warmup=args.warmup,
                                repeat=args.repeat).median_s * 1e3
        executable.launch_all()
        whole[label + "_error"] = compare(executable.results(), reference, rows)
        whole[label + "_groups"] = [[list(g[0]), g[2]] for g in groups]
        del executable
    del given, reference
    cupy.get_default_memory_pool().free_all_blocks()
    print_tables(name, studies, whole, profile)
    log(f"  ({time.perf_counter() - started:.1f} s)")
    return {"app": name, "size": list(size),
            "plan": [[list(g.members), g.variant] for g in plan.groups],
            "groups": [{"members": list(s.members),
                        "candidates": [c.__dict__ for c in s.candidates]} for s in studies],
            "whole": whole}


def split_epilogues(graph, groups):
    """``groups`` (members, outputs, variant) with each reduction's fused epilogue made its
    own kernel again (the core keeps the variant): the comparison for epilogue fusion."""
    from kfuse.fusion.legality import is_epilogue_group, split_epilogue
    from kfuse.fusion.plan import group_outputs
    result = []
    for members, outputs, variant in groups:
        if not is_epilogue_group(graph, members):
            result.append((members, outputs, variant))
            continue
        core, epilogue = split_epilogue(graph, members)
        result.append((core, group_outputs(graph, core), variant))
        result.append((epilogue, group_outputs(graph, epilogue), "auto"))
    return result


def best(study: GroupStudy) -> Candidate | None:
    timed = [c for c in study.candidates if c.ms is not None and c.error is not None
             and c.error <= TOLERANCE]
    return min(timed, key=lambda c: c.ms) if timed else None


def fmt(value: float | None, spec: str) -> str:
    if value is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width) if width else 1)
    return format(value, spec)


def print_tables(name: str, studies: list[GroupStudy], whole: dict | None, profile) -> None:
    copy = profile.copy_bandwidth_bytes_per_s / 1e9 if profile is not None else None
    for study in studies:
        log(f"\n  {name} [{'+'.join(study.members)}]  (sorted by measured time)")
        log(f"    {'label':6s} {'variant':42s} {'pred':>4s} {'pred ms':>8s} {'regs':>4s} "
            f"{'spill':>5s} {'ms':>8s} {'GB/s':>6s} {'err':>8s}")
        order = sorted(study.candidates, key=lambda c: (c.ms is None, c.ms or 0.0))
        fastest = best(study)
        for c in order:
            mark = " <- best" if c is fastest else ""
            if c.error is not None and c.error > TOLERANCE:
                mark += " ERROR>1e-5"
            log(f"    {c.label:6s} {c.variant:42s} {fmt(c.rank, '4d')} "
                f"{fmt(c.predicted_ms, '8.4f')} {fmt(c.registers, '4d')} "
                f"{fmt(c.spills, '5d')} {fmt(c.ms, '8.4f')} {fmt(c.gbps, '6.0f')} "
                f"{fmt(c.error, '8.1e')}{mark} {c.note}")
    if whole:
        log(f"\n  {name} whole program: plan {whole['plan']:.4f} ms (err "
            f"{whole['plan_error']:.1e}), best groups {whole['best']:.4f} ms (err "
            f"{whole['best_error']:.1e})"
            + (f", epilogue split off {whole['split']:.4f} ms" if "split" in whole else "")
            + f"; H200 before {H200_BEFORE.get(name, 0):.3f}, "
            f"torch.compile {H200_COMPILE.get(name, 0):.3f}"
            + (f", GEMVER target {GEMVER_TARGET_MS:.3f}" if name == "gemver" else "")
            + (f"; copy {copy:.0f} GB/s" if copy else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("apps", nargs="*", help=f"default: {' '.join(APPS)}")
    parser.add_argument("--size", type=int, default=16384, help="matrices are SIZE x SIZE")
    parser.add_argument("--top", type=int, default=4, help="best-predicted variants timed")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-calibrate", action="store_true",
                        help="use the stored (or nominal) device profile for the ranking")
    parser.add_argument("--resources", action="store_true",
                        help="registers and spills of every candidate (needs nvcc)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: plans, candidates and generated sources only")
    parser.add_argument("--budget", type=float, default=210.0,
                        help="seconds: candidates not started by then are skipped")
    parser.add_argument("--h200", action="store_true",
                        help="with --dry-run or --no-calibrate: rank with an H200-like profile "
                             "(132 SMs, copy bandwidth 4275 GB/s as measured by the lead)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.deadline = time.monotonic() + args.budget
    names = args.apps or list(APPS)
    out_dir = os.environ.get("OUT")
    target = args.json or (os.path.join(out_dir, "blas_experiments.json") if out_dir else None)
    started = time.perf_counter()
    if args.dry_run or args.no_calibrate:
        from kfuse.model.device import current_profile
        profile = current_profile()
        if args.h200:
            from kfuse.model.device import h200_like_profile
            profile = h200_like_profile()
    else:
        from kfuse.tune.calibrate import calibrate
        log("calibrating ...")
        profile = calibrate(progress=False)
    log(f"device profile: {profile.summary()}")
    report: dict[str, Any] = {"profile": profile.summary(), "apps": []}
    for name in names:
        try:
            report["apps"].append(study_app(name, args, profile))
        except Exception as error:  # keep going with the next app
            traceback.print_exc()
            report["apps"].append({"app": name, "failed": repr(error)})
            log(f"  {name}: FAILED {error!r}")
        if target:
            with open(target, "w") as handle:
                json.dump(report, handle, indent=1, default=str)
    log(f"\ndone in {time.perf_counter() - started:.1f} s"
        + (f"; wrote {target}" if target else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
