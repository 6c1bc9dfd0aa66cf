"""Generated variants of each app's matrix-row (or vector) group against torch.compile, in
alternating rounds (GPU experiment).

For each app, the program the planner picks is timed beside torch.compile, then the same
program with its row-streaming group (the group whose planned implementation is a stream
variant; else its first map-reduce group, e.g. the vector kernel of MADD) under other
variants: the ``--top`` best-predicted ones and the ``--picks`` list (warp rows and block
rows by default; picks that do not apply to the group are skipped; ``auto``, ``single`` and
``registers`` run the general templates' kernel). Programs are compiled
for their sizes, as the backend compiles its own, and their outputs checked against the
planned program's first. Prints each label's median over the rounds and its speed-up over
torch.compile. Timing-only patches: ``--hoist`` (a row sum's scalar factor multiplied once
per row), ``--plain-loads`` (inputs without ``__restrict__``), ``--chunk-dots`` (a chunk's
products summed first, then added to the row's partial sum, as in the hand-written GEMV),
``--straight`` (no grid-stride loop over the row groups and the pointers taken as aligned,
so that only the whole-step path is compiled: the hand-written GEMV's structure);
``--masked-twins`` times each program also with its straight passes turned off (every tile
or chunk masked).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/stream_variant_bench.py [app ...] [--top 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from kfuse.bench.experiment import (
    device_case,
    masked_only,
    normalized_variants,
    planned_run,
    run_checked,
    studied_group,
)
from kfuse.codegen import generate
from kfuse.fusion.mapreduce import MapReduceGroup
from kfuse.runtime import get_backend
from kfuse.search.variants import ImplementationSpace
from kfuse.tune.timing import print_rounds, time_alternating

TEMPLATES = ("auto", "single", "registers")  # picks run by the general templates
PICKS = ("32x4:r1:i1:w:stream:u16", "32x4:r1:i1:w:stream:u8",
         "512x1:r1:i1:w8:stream:u16", "512x1:r1:i1:w8:stream:u8", "512x1:r1:i1:w:stream:u8",
         "1024x1:r1:i1:w8:stream:u8", "256x1:r1:i1:w8:stream:u16", "256x1:r1:i1:w:stream:u16",
         "256x1:r1:i1:w8:stream:u32")


def hoist_factors(source: str) -> str:
    """Timing only: a row sum of ``p * term`` (``p`` a scalar parameter) accumulates the terms
    and multiplies the row's total by ``p`` once (``sum(p f) = p sum(f)``; rounding differs)."""
    factors = {}
    for var, value in re.findall(r"kf_racc_(\w+)\[kf_k\]\[(?:kf_u|0)\] = kf_combine<0, float>"
                                 r"\(kf_racc_\1\[kf_k\]\[(?:kf_u|0)\], (?:\S+ \? )?\(float\)(v\d+)",
                                 source):
        found = re.search(rf"const float {value} = (p_\w+) \* (v\d+);", source)
        if found:
            factors[var] = found.group(1)
            source = source.replace(found.group(0), f"const float {value} = {found.group(2)};")
    for var, factor in factors.items():
        source = re.sub(rf"((kf_row_{var}|kf_part) = kf_(?:mr_warp|block)_reduce<[^;]*;)",
                        rf"\1 \2 *= {factor};", source)
    return source


def chunk_dots(source: str) -> str:
    """Timing only: consecutive accumulations of one partial sum
    (``acc = kf_combine<0, float>(acc, (float)a); acc = ...(acc, (float)b);``) become one,
    ``acc = kf_combine<0, float>(acc, (float)a + (float)b)`` (the hand kernel's ``acc +=
    dot(a, x)``; rounding differs)."""
    line = r"( *)(kf_racc_\w+\[kf_k\]\[0\]) = kf_combine<0, float>\(\2, (\(float\)v\d+)\);\n"
    pair = re.compile(line + r"\1\2 = kf_combine<0, float>\(\2, (\(float\)v\d+)\);\n")
    return pair.sub(r"\1\2 = kf_combine<0, float>(\2, \3 + \4);\n", source)


def straight(source: str, parts: str = "grid,aligned") -> str:
    """Timing only (the grid covers every row group; aligned arrays): ``grid``: each block
    takes the row group of its index without a grid-stride loop; ``aligned``: ``kf_vec`` is
    ``true``."""
    if "aligned" in parts:
        source = re.sub(r"const bool kf_vec = [^;]*;", "const bool kf_vec = true;", source)
    if "grid" not in parts:
        return source
    source = re.sub(r"for \(int kf_by = blockIdx\.x; kf_by < kf_row_blocks; "
                    r"kf_by \+= gridDim\.x\) \{",
                    "{ const int kf_by = blockIdx.x;", source)
    source = re.sub(r"for \(kf_index_t kf_b = blockIdx\.x; kf_b < kf_blocks; "
                    r"kf_b \+= gridDim\.x\) \{",
                    "{ const kf_index_t kf_b = blockIdx.x;", source)
    return source


def compare(name: str, top: int, rounds: int, runs: int, picks: tuple[str, ...] = PICKS,
            hoist: bool = False, plain_loads: bool = False, dots: bool = False,
            straighten: str = "", twins: bool = False) -> None:
    from kfuse.bench.torch_baseline import compiled_on

    case = device_case(name)
    graph, given, sizes, plan = case.graph, case.given, case.sizes, case.plan
    backend = get_backend("cuda")
    planned, expected = planned_run(case, backend)
    runs_by_label = {"compile": compiled_on(graph, given),
                     f"plan {[g.variant for g in plan.groups]}": planned.launch_all}
    index = studied_group([(g.members, g.outputs, g.variant) for g in plan.groups])
    chosen = plan.groups[index]
    members, outputs = tuple(chosen.members), tuple(chosen.outputs)
    ranked = [c.variant for c in ImplementationSpace(graph, sizes).choices(members)[:top]]
    group = MapReduceGroup(graph, members, outputs)
    # (the planned one patched is new too)
    patched = hoist or plain_loads or dots or straighten or twins
    templates = [p for p in picks if p in TEMPLATES]  # the general templates' kernels
    candidates = [normal for normal in normalized_variants(
        group, [*ranked, *("mapreduce:" + p for p in picks if p not in TEMPLATES)], name)
        if normal != chosen.variant or patched] + templates
    for variant in candidates:
        groups = [(tuple(g.members), tuple(g.outputs), variant if i == index else g.variant)
                  for i, g in enumerate(plan.groups)]
        program = generate(graph, groups, fixed_sizes=sizes)  # as the backend compiles its own
        if hoist:
            program = replace(program, source=hoist_factors(program.source))
        if straighten:
            program = replace(program, source=straight(program.source, straighten))
        if dots:
            patched = chunk_dots(program.source)
            print(f"{name} {variant}: chunk dots {'patched' if patched != program.source else 'unchanged'}",
                  flush=True)
            program = replace(program, source=patched)
        if plain_loads:  # timing only: inputs not restrict, so loads are plain ld.global
            program = replace(program, source=program.source.replace(
                "const float* __restrict__", "const float*"))
        rank = ranked.index(variant) + 1 if variant in ranked else None
        twin = [(", masked", replace(program, source=masked_only(program.source)))] \
            if twins and variant not in TEMPLATES else []
        for suffix, timed in [("", program), *twin]:
            executable, error, registers = run_checked(backend, case, timed, expected)
            label = f"{variant.removeprefix('mapreduce:')} (rank {rank}, r{registers}){suffix}"
            if variant in TEMPLATES:
                label = f"template {variant} (r{registers})"
            print(f"{name} {label}: error against the plan {error:.1e}", flush=True)
            if error < 1e-4:
                runs_by_label[label] = executable.launch_all
    print_rounds(name, time_alternating(runs_by_label, rounds, repeat=runs), "compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("apps", nargs="*",
                        default=["sgemv", "gesummv", "sgemvt", "atax", "gemver"])
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--picks", default=None, help="comma-separated variants (no prefix)")
    parser.add_argument("--plain-loads", action="store_true",
                        help="timing only: inputs without __restrict__ (plain, not .nc, loads)")
    parser.add_argument("--straight", default="", const="grid,aligned", nargs="?",
                        help="timing only: no grid-stride loop (grid), pointers taken as "
                        "aligned (aligned); both without a value")
    parser.add_argument("--chunk-dots", action="store_true",
                        help="timing only: a chunk's products summed before the row's sum")
    parser.add_argument("--masked-twins", action="store_true",
                        help="timing only: each program also with its straight passes off")
    parser.add_argument("--hoist", action="store_true",
                        help="timing only: row sums of p * term multiply by p once per row")
    args = parser.parse_args()
    picks = tuple(args.picks.split(",")) if args.picks else PICKS
    for name in args.apps:
        compare(name, args.top, args.rounds, args.runs, picks, args.hoist, args.plain_loads,
                args.chunk_dots, args.straight, args.masked_twins)


if __name__ == "__main__":
    main()
