"""3-D explicit diffusion, two time steps of the 7-point stencil (a volume L -> L chain).

Kernels (``u0`` is the volume, axes z, y, x)::

    u1 = local u0 + c * (u0[z±1] + u0[y±1] + u0[x±1] - 6 u0)
    u2 = local the same update applied to u1                     (output)

Definition choices. This is not from Qiao 2021 (which is 2-D image processing); it is the
classic memory-bound stencil chain (cf. the time-skewing / temporal-blocking literature) that
exercises kfuse's local-to-local fusion in 3-D. ``c`` (= D dt / h^2) is a runtime parameter;
the scheme is stable for c <= 1/6, and :func:`make_inputs` uses 0.1. Each step applies
``boundary`` to its own input, so the reference pads u0 and then u1 again.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image, taps

NEIGHBOURS = ((-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1))


def _step(u: kf.Array, c: object, boundary: object, name: str) -> kf.Array:
    total = None
    for offset in NEIGHBOURS:
        total = u.at(*offset) if total is None else total + u.at(*offset)
    return kf.local(u + c * (total - 6.0 * u), boundary=boundary, name=name)


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The diffusion pipeline: input ``u0`` (3-D), parameter ``c``, output ``u2``."""
    p = kf.Pipeline("diffusion3d")
    u0 = p.input("u0", ndim=3, dtype=dtype)
    c = p.param("c", dtype=dtype)
    u1 = _step(u0, c, boundary, "u1")
    u2 = _step(u1, c, boundary, "u2")
    p.output(u2)
    return p


def _step_reference(u: np.ndarray, c: float, boundary: object) -> np.ndarray:
    at = taps(u, 1, boundary)
    total = sum(at(*offset) for offset in NEIGHBOURS)
    return u + c * (total - 6.0 * u)


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Two diffusion steps in float64 with plain NumPy."""
    u0 = as_float64(arrays)["u0"]
    c = float(params["c"])
    return {"u2": _step_reference(_step_reference(u0, c, boundary), c, boundary)}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random volume in [0.1, 1.1) and c = 0.1."""
    return {"u0": positive_image(size, rng, dtype)}, {"c": 0.1}


APP = App(
    name="diffusion3d",
    title="3-D diffusion: two explicit 7-point steps u0 -> u1 -> u2",
    origin="kfuse (classic 3-D stencil chain; not in Qiao 2021)",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
    bench_size=(512, 512, 512),
    test_size=(13, 11, 9),
    ndim=3,
)
