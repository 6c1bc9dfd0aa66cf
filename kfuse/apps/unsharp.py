"""Unsharp masking: a Gaussian blur and three point kernels that all read the input.

Kernels (``img`` is the grey input)::

    blur    = local 5x5 binomial Gaussian ([1 4 6 4 1] outer [1 4 6 4 1]) / 256 of img
    sharp   = point 2 * img - blur
    ratio   = point sharp / img
    unsharp = point ratio * img

Definition choices. The thesis (Qiao 2021, §3.7.2-3.7.3) says only: one local blur, then three
point kernels amplifying high frequencies, all four reading the input (the shape of
Fig. 3.2b). The kernel names of Hipacc's fusion sample (``GaussBlur``, ``SharpKernel``,
``RatioKernel``, ``UnsharpKernel``) match Halide's classic unsharp app, whose stages are the
ones above (there the ratio restores colour from grey; on a grey image ``unsharp`` equals
``sharp`` up to rounding, but the dataflow, the one that matters for fusion, is kept). The
5x5 binomial mask (sigma about 1) is our choice. Inputs must be non-zero (``ratio``
divides by ``img``); :func:`make_inputs` draws them from [0.1, 1.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, correlate, positive_image

_BINOMIAL = np.array([1.0, 4.0, 6.0, 4.0, 1.0])
GAUSS5 = np.outer(_BINOMIAL, _BINOMIAL)
GAUSS5_SCALE = 1.0 / 256.0


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The unsharp pipeline: input ``img`` (2-D), output ``unsharp``."""
    p = kf.Pipeline("unsharp")
    img = p.input("img", ndim=2, dtype=dtype)
    blur = kf.convolve(img, GAUSS5, boundary=boundary, name="blur", scale=GAUSS5_SCALE)
    sharp = kf.point(2.0 * img - blur, name="sharp")
    ratio = kf.point(sharp / img, name="ratio")
    unsharp = kf.point(ratio * img, name="unsharp")
    p.output(unsharp)
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Unsharp masking in float64 with plain NumPy."""
    img = as_float64(arrays)["img"]
    blur = correlate(img, GAUSS5, boundary, GAUSS5_SCALE)
    sharp = 2.0 * img - blur
    ratio = sharp / img
    return {"unsharp": ratio * img}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random grey image in [0.1, 1.1) (non-zero: ``ratio`` divides by it)."""
    return {"img": positive_image(size, rng, dtype)}, {}


APP = App(
    name="unsharp",
    title="Unsharp masking: 5x5 Gaussian blur, then sharp, ratio, unsharp (all read the input)",
    origin="Qiao 2021 (Hipacc thesis) §3.7.2-3.7.3, Fig. 3.2b shape, Tab. 3.4",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
