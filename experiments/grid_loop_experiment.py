"""Grid-stride loops that run once: do they cost time? (GPU experiment, timing only).

kfuse's general kernel templates (and, before session 10, its map-reduce kernels) walk their
rows or chunks in grid-stride loops (``for (iy = first; iy < n; iy += gridDim.y * ...)``),
so that a grid capped by the hardware still covers every point. Where the grid covers every
point, each loop runs once. Here every such loop of an app's planned program is patched to
stop after its first pass (``iy += step`` becomes ``iy = n``) and the two programs are timed
in alternating rounds beside torch.compile; the outputs must agree.

``TILES=10x4:32x2,9x4:32x2`` (register tile : threads of 2-D ``recompute`` groups, the
kind Harris and Shi-Tomasi plan) times each such configuration with and without the loops.
``FTZ=1`` also times each program with its float32 square roots flushing subnormal
arguments to zero (``sqrt.approx.ftz.f32``: no scaling of subnormal arguments, three
instructions fewer per root; a result off by at most 1.1e-19 there).

Usage on the device machine (repo root)::

    [TILES=..] [FTZ=1] PYTHONPATH=. python3 experiments/grid_loop_experiment.py [app ...]
        [--rounds 3]
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import kfuse.codegen.kernels as kernels
from kfuse.bench.experiment import device_case, time_sources
from kfuse.cli.arguments import alternating_main
from kfuse.codegen import generate

LOOP = re.compile(r"(for \((?:int|kf_index_t) (\w+) = [^;]+;\s*\2 < (\w+);\s*)"
                  r"\2 \+= (?:[^)]*gridDim[^)]*|step)\)")


def once(source: str) -> tuple[str, int]:
    """``source`` with every grid-stride loop stopped after its first pass, and how many."""
    return LOOP.subn(r"\1\2 = \3)", source)


def flush_subnormal_roots(source: str) -> str:
    """``source`` with its float32 square roots flushing subnormal arguments to zero."""
    return source.replace('"sqrt.approx.f32 ', '"sqrt.approx.ftz.f32 ')


def compare(name: str, rounds: int, runs: int) -> None:
    case = device_case(name)
    programs = {}
    configs = [c for c in os.environ.get("TILES", "").split(",") if c] or [""]
    for config in configs:
        saved = dict(kernels.REGISTER_TILES), dict(kernels.TILED_BLOCKS)
        if config:
            tile, threads = config.split(":")
            kernels.REGISTER_TILES[("recompute", 2)] = tuple(int(t) for t in tile.split("x"))
            kernels.TILED_BLOCKS[("recompute", 2)] = tuple(int(t) for t in threads.split("x"))
        try:
            groups = [(*g[:3], kernels.REGISTER_TILES[("recompute", 2)])
                      if config and g[2] == "recompute" and len(g[3] or ()) == 2 else g
                      for g in case.plan.kernel_groups]  # (the plan fixed its tile)
            program = generate(case.graph, groups, fixed_sizes=case.sizes)
        finally:
            kernels.REGISTER_TILES.update(saved[0])
            kernels.TILED_BLOCKS.update(saved[1])
        patched, count = once(program.source)
        print(f"{name} {config or 'defaults'}: {count} grid-stride loop(s) patched", flush=True)
        sources = {f"plan {config}": program.source}
        if count:
            sources[f"loops run once {config}"] = patched
        if os.environ.get("FTZ"):
            sources |= {f"{label} ftz": flush_subnormal_roots(text)
                        for label, text in sources.items()
                        if flush_subnormal_roots(text) != text}
        programs |= {label: replace(program, source=text) for label, text in sources.items()}
    time_sources(case, programs, rounds, runs)


def main() -> None:
    alternating_main(__doc__.splitlines()[0], compare,
                     ["shi_tomasi", "harris", "sobel", "unsharp", "enhance", "diffusion3d",
                      "vadd", "madd"])


if __name__ == "__main__":
    main()
