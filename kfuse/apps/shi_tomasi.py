"""Shi-Tomasi features: the Harris DAG with the minimum-eigenvalue response (Qiao 2021, §3.7).

Kernels dx, dy, sx, sy, sxy, gx, gy, gxy are exactly those of :mod:`kfuse.apps.harris`; the
last point kernel ``st`` is the smaller eigenvalue of the smoothed structure tensor
``[[gx, gxy], [gxy, gy]]``::

    st = 0.5 * (gx + gy - sqrt((gx - gy)^2 + 4 gxy^2))

Definition choices: as in Hipacc's ``samples/6_Kernel_Fusion/shiTomasi`` (which computes
both eigenvalues and thresholds their minimum); kfuse returns the raw minimum eigenvalue
instead of a 0/1 threshold image. The sqrt argument is a sum of squares, hence never
negative.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image
from kfuse.apps.harris import structure_tensor, structure_tensor_reference


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The Shi-Tomasi pipeline: input ``img`` (2-D), output ``st``."""
    p = kf.Pipeline("shi_tomasi")
    img = p.input("img", ndim=2, dtype=dtype)
    gx, gy, gxy = structure_tensor(p, img, boundary)
    diff = gx - gy
    st = kf.point(0.5 * (gx + gy - kf.sqrt(diff * diff + 4.0 * gxy * gxy)), name="st")
    p.output(st)
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Minimum eigenvalue in float64 with plain NumPy."""
    img = as_float64(arrays)["img"]
    gx, gy, gxy = structure_tensor_reference(img, boundary)
    return {"st": 0.5 * (gx + gy - np.sqrt((gx - gy) ** 2 + 4.0 * gxy ** 2))}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random grey image in [0.1, 1.1); no parameters."""
    return {"img": positive_image(size, rng, dtype)}, {}


APP = App(
    name="shi_tomasi",
    title="Shi-Tomasi features: Harris DAG with the minimum-eigenvalue response",
    origin="Qiao 2021 (Hipacc thesis) §3.7.2, Tab. 3.4 (same DAG as Harris, Fig. 3.11)",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
