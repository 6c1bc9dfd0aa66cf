"""Capsule-endoscopy enhancement: geometric-mean filter, gain, gamma correction (a 3-kernel chain).

Kernels (``img`` is the grey input, positive)::

    geomean       = local 3x3 geometric mean: exp(sum(log(img at the 9 taps)) / 9)
    amplify       = point gain * geomean                  (runtime parameter ``gain``)
    gamma_correct = point pow(amplify, gamma)             (runtime parameter ``gamma``)

Definition choices. The thesis (Qiao 2021, §3.7.2) cites Suman et al. 2014 (geometric-mean
filter and gamma correction for wireless capsule endoscopy images) and describes a local
operator followed by two point operators with no recomputation when fused. Hipacc's fusion
sample (``samples/6_Kernel_Fusion/enhancement``) orders the chain filter -> global gain ->
gamma correction, with gain 2 and gamma 0.6, but uses a 3x3 *arithmetic* mean as a stand-in
for the filter; kfuse computes the geometric mean the thesis names. The input must be
positive (log); so must a constant boundary value. :func:`make_inputs` draws [0.1, 1.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image, taps

WINDOW = 3


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The enhance pipeline: input ``img`` (2-D), parameters ``gain``, ``gamma``."""
    p = kf.Pipeline("enhance")
    img = p.input("img", ndim=2, dtype=dtype)
    gain = p.param("gain", dtype=dtype)
    gamma = p.param("gamma", dtype=dtype)
    r = WINDOW // 2
    log_sum = None
    for oy in range(-r, r + 1):
        for ox in range(-r, r + 1):
            term = kf.log(img.at(oy, ox))
            log_sum = term if log_sum is None else log_sum + term
    geomean = kf.local(kf.exp(log_sum * (1.0 / WINDOW**2)), boundary=boundary,
                          name="geomean")
    amplify = kf.point(gain * geomean, name="amplify")
    gamma_correct = kf.point(kf.pow(amplify, gamma), name="gamma_correct")
    p.output(gamma_correct)
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Geometric mean, gain and gamma in float64 with plain NumPy."""
    img = as_float64(arrays)["img"]
    r = WINDOW // 2
    at = taps(img, r, boundary)  # pad the image itself: a constant pads values, not logs
    log_sum = sum(np.log(at(oy, ox)) for oy in range(-r, r + 1) for ox in range(-r, r + 1))
    geomean = np.exp(log_sum / WINDOW**2)
    amplify = float(params["gain"]) * geomean
    return {"gamma_correct": amplify ** float(params["gamma"])}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A positive random grey image in [0.1, 1.1); gain 2 and gamma 0.6 as in Hipacc."""
    return {"img": positive_image(size, rng, dtype)}, {"gain": 2.0, "gamma": 0.6}


APP = App(
    name="enhance",
    title="Endoscopy enhancement: 3x3 geometric mean, gain, gamma correction",
    origin="Qiao 2021 (Hipacc thesis) §3.7.2-3.7.3 (Enhance, [SHM+14]), Tab. 3.4",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
