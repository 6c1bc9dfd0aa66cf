"""diffusion3d: forms of the marching kernel beside the register tiles (GPU experiment;
alternating rounds beside torch.compile, every form checked against the planned program).

Forms: the register tiles; marching with one wave of blocks (the default where it marches);
marching in chunks of 64 planes (several waves, chunks restart so neighbouring blocks stay
close in z); each marching form also with streaming stores (``__stcs``: the output marked
evict-first in L2, leaving L2 to the input planes that neighbouring blocks read as halo);
marching with the 4 x 2 x 4 register tile as fallback; marching in blocks of 32 x 8 threads
(less halo per block; its register-tile fallback would be wrong, so timing only at sizes
that march).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 experiments/march_experiment.py [--rounds 5] [--runs 30] [--size DxHxW]
        [--forms "tiles 8x2x4;march, one wave"] [--boundary constant:0.5]
"""

import argparse
import re
from dataclasses import replace

from kfuse.bench.experiment import device_case, time_sources
from kfuse.cli.arguments import POSITIVE_INT
from kfuse.codegen import generate
from kfuse.config import configured, current

VECTOR_STORE = re.compile(r"\*reinterpret_cast<float4\*>\(&(\w+)\[(.*?)\]\) = (float4\{.*?\});")


def streaming_stores(program):
    """``program`` with its 16-byte stores as streaming (evict-first) stores."""
    source, count = VECTOR_STORE.subn(r"__stcs(reinterpret_cast<float4*>(&\1[\2]), \3);",
                                      program.source)
    print(f"streaming stores: {count} patched", flush=True)
    return replace(program, source=source)


def planned_marches(case) -> bool:
    """Whether the cuda backend, left to decide, runs ``case``'s plan with marching kernels
    (the device's bandwidth, the volume, and no spills in the marching kernel)."""
    from kfuse.runtime import get_backend

    executable = get_backend("cuda").prepare(case.graph, case.given, plan=case.plan)
    return "threads march" in executable.program.source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--runs", type=POSITIVE_INT, default=30)
    parser.add_argument("--size", default=None, help="DxHxW (default: the benchmark size)")
    parser.add_argument("--boundary", default=None,
                        help="clamp, mirror or constant:VALUE (default: the app's)")
    parser.add_argument("--forms", default=None,
                        help="labels to time, separated by semicolons (default: every form)")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    boundary = args.boundary
    if boundary and boundary.startswith("constant:"):
        boundary = ("constant", float(boundary.partition(":")[2]))
    case = device_case("diffusion3d", size=size, boundary=boundary)
    print(f"diffusion3d {tuple(case.sizes.values())} {boundary or 'clamp'}: the device "
          f"{'marches' if planned_marches(case) else 'keeps the register tiles'}", flush=True)
    members = (("u1", "u2"), ("u2",), "recompute")
    planes, least = current().march_planes, current().march_least_planes

    def program(on: bool, tile=(8, 2, 4), chunk: int | None = None, rows_of_threads: int = 0):
        # rows_of_threads: taller blocks, less halo per block (the fallback tiles assume the
        # usual block: timing only)
        with configured(march=on, march_planes=chunk or planes,
                        march_least_planes=1 if chunk else least,
                        march_block_rows=rows_of_threads or current().march_block_rows):
            return generate(case.graph, [(*members, tile)], fixed_sizes=case.sizes)

    wave, chunks = program(True), program(True, chunk=64)
    programs = {"tiles 8x2x4": program(False), "march, one wave": wave,
                "march, one wave, streaming stores": streaming_stores(wave),
                "march, 64-plane chunks": chunks,
                "march, 64-plane chunks, streaming stores": streaming_stores(chunks),
                "march, fallback 4x2x4": program(True, (4, 2, 4)),
                "march, blocks of 32 x 8 threads": program(True, rows_of_threads=8)}
    if args.forms:
        programs = {label: programs[label] for label in args.forms.split(";")}
    time_sources(case, programs, args.rounds, args.runs)


if __name__ == "__main__":
    main()
