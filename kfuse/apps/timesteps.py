"""Time-stepped stencils: k repetitions of a small stencil update on one grid.

Every explicit time integrator is such a chain; fusing k steps into one kernel is temporal
blocking (each block keeps the halo of ``k x radius`` the steps need). Each step applies the
boundary mode to its own input, as the references do (they pad the input of every step).

| app        | steps                                                                       |
|------------|-----------------------------------------------------------------------------|
| smooth2d   | 4 steps of the 3x3 binomial smoother ``(1 2 1)ᵀ (1 2 1) / 16``              |
| wave2d     | 4 leapfrog steps of ``u⁺ = 2u - u⁻ + c Δu`` (5-point Laplacian, two levels) |
| heat3d     | 4 steps of the 7-point heat update ``u + c (Σ neighbours - 6u)``            |
| stencil27  | 2 steps of a 27-point 3-D stencil (weights by distance from the centre)     |
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image, taps

ORIGIN = "explicit time stepping"
SMOOTH_WEIGHTS = {(dy, dx): (2 - abs(dy)) * (2 - abs(dx)) / 16.0
                  for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
CROSS_2D = ((-1, 0), (1, 0), (0, -1), (0, 1))
CROSS_3D = ((-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1))
CUBE_WEIGHTS = {offset: (0.5, 0.2, 0.1, 0.05)[sum(map(abs, offset))] / 3.3
                for offset in itertools.product((-1, 0, 1), repeat=3)}


def _weighted(u: kf.Array, weights: Mapping[tuple[int, ...], float]) -> object:
    total = None
    for offset, weight in weights.items():
        term = u.at(*offset) * weight
        total = term if total is None else total + term
    return total


def _weighted_reference(u: np.ndarray, weights: Mapping[tuple[int, ...], float],
                        boundary: object) -> np.ndarray:
    at = taps(u, 1, boundary)
    return sum(weight * at(*offset) for offset, weight in weights.items())


# ---------------------------------------------------------------------------------------------
# smooth2d: 4 steps of a 9-point smoother
# ---------------------------------------------------------------------------------------------

SMOOTH_STEPS = 4


def weighted_steps(name: str, ndim: int, weights: Mapping[tuple[int, ...], float],
                   steps: int) -> tuple[Callable[..., kf.Pipeline], Callable[..., dict]]:
    """(build, reference) of ``steps`` applications of the stencil ``weights`` (offset ->
    weight) to ``u0``; the output is ``u<steps>``."""

    def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
        p = kf.Pipeline(name)
        u = p.input("u0", ndim=ndim, dtype=dtype)
        for step in range(1, steps + 1):
            u = kf.local(_weighted(u, weights), boundary=boundary, name=f"u{step}")
        p.output(u)
        return p

    def reference(arrays, params, boundary="clamp"):
        u = as_float64(arrays)["u0"]
        for _ in range(steps):
            u = _weighted_reference(u, weights, boundary)
        return {f"u{steps}": u}

    build.__doc__ = f"{steps} steps of a {len(weights)}-point stencil on a {ndim}-D grid."
    return build, reference


build_smooth2d, ref_smooth2d = weighted_steps("smooth2d", 2, SMOOTH_WEIGHTS, SMOOTH_STEPS)


# ---------------------------------------------------------------------------------------------
# wave2d: 4 leapfrog steps, two time levels
# ---------------------------------------------------------------------------------------------

WAVE_STEPS = 4


def build_wave2d(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """Leapfrog: ``u[n+1] = 2 u[n] - u[n-1] + c (Σ cross neighbours of u[n] - 4 u[n])``
    from the two levels ``u_prev``, ``u_cur``; the last two levels are the outputs."""
    p = kf.Pipeline("wave2d")
    older = p.input("u_prev", ndim=2, dtype=dtype)
    newer = p.input("u_cur", shape=older.shape, dtype=dtype)
    c = p.param("c", dtype=dtype)
    for step in range(1, WAVE_STEPS + 1):
        total = None
        for offset in CROSS_2D:
            total = newer.at(*offset) if total is None else total + newer.at(*offset)
        update = kf.local(2.0 * newer - older + c * (total - 4.0 * newer), boundary=boundary,
                          name=f"w{step}")
        older, newer = newer, update
    p.output(older, newer)
    return p


def ref_wave2d(arrays, params, boundary="clamp"):
    a = as_float64(arrays)
    older, newer, c = a["u_prev"], a["u_cur"], float(params["c"])
    for _ in range(WAVE_STEPS):
        at = taps(newer, 1, boundary)
        lap = sum(at(*offset) for offset in CROSS_2D) - 4.0 * newer
        older, newer = newer, 2.0 * newer - older + c * lap
    return {f"w{WAVE_STEPS - 1}": older, f"w{WAVE_STEPS}": newer}


# ---------------------------------------------------------------------------------------------
# heat3d: 4 steps of the 7-point update; stencil27: 2 steps of a 27-point stencil
# ---------------------------------------------------------------------------------------------

HEAT_STEPS = 4
CUBE_STEPS = 2


def build_heat3d(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """``u0 -> .. -> u4``, each step ``u + c (Σ 6 neighbours - 6 u)``."""
    p = kf.Pipeline("heat3d")
    u = p.input("u0", ndim=3, dtype=dtype)
    c = p.param("c", dtype=dtype)
    for step in range(1, HEAT_STEPS + 1):
        total = None
        for offset in CROSS_3D:
            total = u.at(*offset) if total is None else total + u.at(*offset)
        u = kf.local(u + c * (total - 6.0 * u), boundary=boundary, name=f"u{step}")
    p.output(u)
    return p


def ref_heat3d(arrays, params, boundary="clamp"):
    u, c = as_float64(arrays)["u0"], float(params["c"])
    for _ in range(HEAT_STEPS):
        at = taps(u, 1, boundary)
        u = u + c * (sum(at(*offset) for offset in CROSS_3D) - 6.0 * u)
    return {f"u{HEAT_STEPS}": u}


build_stencil27, ref_stencil27 = weighted_steps("stencil27", 3, CUBE_WEIGHTS, CUBE_STEPS)


def _inputs(names: tuple[str, ...], params: Mapping[str, float]) -> Callable[..., tuple]:
    def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        return {name: positive_image(size, rng, dtype) for name in names}, dict(params)

    return make_inputs


def _app(name: str, title: str, ndim: int, names: tuple[str, ...] = ("u0",),
         params: Mapping[str, float] | None = None) -> App:
    module = globals()
    return App(name=name, title=title, origin=ORIGIN, build=module[f"build_{name}"],
               reference=module[f"ref_{name}"], make_inputs=_inputs(names, params or {}),
               bench_size=(8192, 8192) if ndim == 2 else (512, 512, 512),
               test_size=(37, 53) if ndim == 2 else (13, 11, 9), ndim=ndim)


STEP_APPS: tuple[App, ...] = (
    _app("smooth2d", "4 steps of a 3x3 smoother (2-D)", 2),
    _app("wave2d", "4 leapfrog steps of the 2-D wave equation (two time levels)", 2,
         ("u_prev", "u_cur"), {"c": 0.2}),
    _app("heat3d", "4 steps of the 7-point heat update (3-D)", 3, params={"c": 0.1}),
    _app("stencil27", "2 steps of a 27-point stencil (3-D)", 3),
)

__all__ = ["STEP_APPS"]
