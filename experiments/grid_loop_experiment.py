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

import dataclasses
import os
import re
from dataclasses import replace

from kfuse.bench.experiment import device_case, time_sources
from kfuse.cli.arguments import alternating_main
from kfuse.codegen import generate
from kfuse.schedule import Recompute

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
        groups = case.plan.kernel_groups
        if config:  # the recompute groups of 2-D chains with this tile and block
            tile, threads = config.split(":")
            form = Recompute(tuple(int(t) for t in tile.split("x")),
                             tuple(int(t) for t in threads.split("x")))  # type: ignore[arg-type]
            groups = [dataclasses.replace(g, form=form)
                      if isinstance(g.form, Recompute) and len(g.tile or ()) == 2 else g
                      for g in groups]
        program = generate(case.graph, groups, fixed_sizes=case.sizes)
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
