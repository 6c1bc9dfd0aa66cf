"""Harris corner detector: the 9-kernel DAG of the Hipacc thesis (Qiao 2021, Figs. 1.4, 3.9, 3.11).

Kernels (``img`` is the grey input, axis 0 = y, axis 1 = x)::

    dx  = local  3x3 derivative along x: [-1 0 1] on each of the 3 rows, / 6
    dy  = local  3x3 derivative along y: the transposed mask, / 6
    sx  = point  dx * dx
    sy  = point  dy * dy
    sxy = point  dx * dy
    gx, gy, gxy = local 3x3 Gaussian [1 2 1; 2 4 2; 1 2 1] / 16 of sx, sy, sxy
    hc  = point  (gx * gy - gxy^2) - k * (gx + gy)^2        (det - k trace^2)

Definition choices. The thesis gives only the DAG and the operator classes; the masks and
scales are those of Hipacc's own fusion benchmark (``samples/6_Kernel_Fusion/harris``),
which uses Prewitt-style derivatives divided by 6 and the binomial Gaussian divided by 16.
That sample thresholds the response into a 0/1 image; kfuse returns the raw response ``hc``
instead (a threshold makes float comparison brittle and hides errors). ``k`` is a runtime
parameter (0.04 in the sample). Every local operator applies ``boundary`` to its own input,
so the reference pads ``img`` for dx/dy and pads sx, sy, sxy again for the Gaussians.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, correlate, positive_image

DERIV_X = np.array([[-1.0, 0.0, 1.0]] * 3)
DERIV_Y = DERIV_X.T.copy()
DERIV_SCALE = 1.0 / 6.0
GAUSS = np.array([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]])
GAUSS_SCALE = 1.0 / 16.0


def structure_tensor(pipeline: kf.Pipeline, img: kf.Array, boundary: object
                     ) -> tuple[kf.Array, kf.Array, kf.Array]:
    """The first 8 kernels shared by Harris and Shi-Tomasi: smoothed gradient products."""
    dx = kf.convolve(img, DERIV_X, boundary=boundary, name="dx", scale=DERIV_SCALE)
    dy = kf.convolve(img, DERIV_Y, boundary=boundary, name="dy", scale=DERIV_SCALE)
    sx = kf.point(dx * dx, name="sx")
    sy = kf.point(dy * dy, name="sy")
    sxy = kf.point(dx * dy, name="sxy")
    gx = kf.convolve(sx, GAUSS, boundary=boundary, name="gx", scale=GAUSS_SCALE)
    gy = kf.convolve(sy, GAUSS, boundary=boundary, name="gy", scale=GAUSS_SCALE)
    gxy = kf.convolve(sxy, GAUSS, boundary=boundary, name="gxy", scale=GAUSS_SCALE)
    return gx, gy, gxy


def structure_tensor_reference(img: np.ndarray, boundary: object
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy float64 version of :func:`structure_tensor` (each stage padded on its own)."""
    dx = correlate(img, DERIV_X, boundary, DERIV_SCALE)
    dy = correlate(img, DERIV_Y, boundary, DERIV_SCALE)
    gx = correlate(dx * dx, GAUSS, boundary, GAUSS_SCALE)
    gy = correlate(dy * dy, GAUSS, boundary, GAUSS_SCALE)
    gxy = correlate(dx * dy, GAUSS, boundary, GAUSS_SCALE)
    return gx, gy, gxy


def build(dtype: str = "float32", boundary: object = "clamp",
          image_dtype: str | None = None) -> kf.Pipeline:
    """The Harris pipeline: input ``img`` (2-D), parameter ``k``, output ``hc``.

    ``image_dtype``: the image's own dtype where it is not ``dtype`` (an 8-bit camera
    image: its gradients are computed in float32)."""
    p = kf.Pipeline("harris")
    img = p.input("img", ndim=2, dtype=image_dtype or dtype)
    k = p.param("k", dtype=dtype)
    gx, gy, gxy = structure_tensor(p, img, boundary)
    trace = gx + gy
    hc = kf.point((gx * gy - gxy * gxy) - k * trace * trace, name="hc")
    p.output(hc)
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Harris response in float64 with plain NumPy."""
    img = as_float64(arrays)["img"]
    gx, gy, gxy = structure_tensor_reference(img, boundary)
    k = float(params["k"])
    return {"hc": (gx * gy - gxy * gxy) - k * (gx + gy) ** 2}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random grey image in [0.1, 1.1) and k = 0.04."""
    return {"img": positive_image(size, rng, dtype)}, {"k": 0.04}


APP = App(
    name="harris",
    title="Harris corner response: 3x3 derivatives, products, 3x3 Gaussians, det - k trace^2",
    origin="Qiao 2021 (Hipacc thesis) §1.1 Fig. 1.4, §3.5 Figs. 3.9/3.11, §3.7 Tab. 3.4",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
