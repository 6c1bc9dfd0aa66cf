"""Sobel edge magnitude: two 3x3 local derivatives sharing one input, then a point magnitude.

Kernels (``img`` is the grey input, axis 0 = y, axis 1 = x)::

    dx  = local 3x3 Sobel along x: [[-1 0 1], [-2 0 2], [-1 0 1]]
    dy  = local 3x3 Sobel along y: the transposed mask
    mag = point sqrt(dx^2 + dy^2)

Definition choices. The thesis (Qiao 2021, §3.7.2, Listing 4.2, §5.6) describes Sobel as x-
and y-derivative local kernels plus a magnitude point kernel; this is the reading the notes
adopt (ambiguity A5: two L->P edges with a shared input). Hipacc's fusion sample splits each
derivative into a separable row and column pass (5 kernels); kfuse uses the unsplit 3x3
masks, which compute the same derivatives up to sign (irrelevant to the magnitude).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, correlate, positive_image

SOBEL_X = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
SOBEL_Y = SOBEL_X.T.copy()


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The Sobel pipeline: input ``img`` (2-D), output ``mag``."""
    p = kf.Pipeline("sobel")
    img = p.input("img", ndim=2, dtype=dtype)
    dx = kf.convolve(img, SOBEL_X, boundary=boundary, name="dx")
    dy = kf.convolve(img, SOBEL_Y, boundary=boundary, name="dy")
    mag = kf.point(kf.sqrt(dx * dx + dy * dy), name="mag")
    p.output(mag)
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Sobel magnitude in float64 with plain NumPy."""
    img = as_float64(arrays)["img"]
    dx = correlate(img, SOBEL_X, boundary)
    dy = correlate(img, SOBEL_Y, boundary)
    return {"mag": np.sqrt(dx * dx + dy * dy)}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random grey image in [0.1, 1.1); no parameters."""
    return {"img": positive_image(size, rng, dtype)}, {}


APP = App(
    name="sobel",
    title="Sobel edge magnitude: 3x3 dx, dy on a shared input, then sqrt(dx^2 + dy^2)",
    origin="Qiao 2021 (Hipacc thesis) §3.7.2, Tab. 3.4; Listing 4.2; §5.6",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
