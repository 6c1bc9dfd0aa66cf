"""diffusion3d: the marching kernel with each register-tile fallback beside the register tiles
(GPU experiment, timing only; alternating rounds beside torch.compile).

Usage on the device machine (repo root)::

    PYTHONPATH=. python3 scripts/march_fallback_experiment.py
"""

from kfuse.bench.experiment import device_case, time_sources
from kfuse.codegen import generate, marching

case = device_case("diffusion3d")
members = (("u1", "u2"), ("u2",), "recompute")
programs = {}
for label, on, tile in [("tiles 8x2x4", False, (8, 2, 4)), ("march, fallback 8x2x4", True, (8, 2, 4)),
                        ("march, fallback 4x2x4", True, (4, 2, 4))]:
    marching.ENABLED = on
    programs[label] = generate(case.graph, [(*members, tile)], fixed_sizes=case.sizes)
marching.ENABLED = False
time_sources(case, programs, 7, 30)
