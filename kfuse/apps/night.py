"""Night filter: two à-trous bilateral passes (3x3, then 5x5 dilated) and a scotopic tone map.

Kernels (``img`` is the grey input, values about [0, 1])::

    atrous0 = local 3x3:  sum_t w_t * img[p+t] / sum_t w_t,
              w_t = m_t * exp(-(img[p+t] - img[p])^2),  m = the 3x3 mask M below
    atrous1 = local 5x5:  the same on atrous0 with M dilated by 2 (à trous: 9 non-zero taps
              at offsets in {-2, 0, 2}^2)
    scoto   = point: Hipacc's scotopic tone-mapping curve applied to r = g = b = atrous1,
              each channel clamped to [0, 1], returned as Rec. 709 luma

    M = [[0.057118, 0.124758, 0.057118],
         [0.124758, 0.272496, 0.124758],
         [0.057118, 0.124758, 0.057118]]

Definition choices. The thesis (Qiao 2021, §3.7.2-3.7.3) gives the structure (Atrous0 3x3 ->
Atrous1 5x5 -> Scoto, a linear chain; à-trous bilateral filtering; 68 and 89 ALU ops) and no
formulas; the formulas above are those of Hipacc's fusion sample
(``samples/6_Kernel_Fusion/night``), with these changes:

- grey instead of RGB: one kfuse kernel writes one array, and the brief allows grey. The
  bilateral range weight uses the grey difference instead of the RGB distance, and Scoto
  reads r = g = b = the grey value and returns the luma of its clamped RGB output;
- values in [0, 1] instead of 0..255 (the sample divides by 255 inside Atrous anyway), so
  Scoto clamps to [0, 1];
- exact ``exp`` instead of the sample's FAST_EXP ((1 + x/256)^256) approximation; the
  sample's ``weight = min(weight, 1)`` guard is then a no-op and is left out;
- the photopic mixing factor ``s`` (0 in the sample, with ``luma / 2`` commented out) is a
  runtime parameter; :func:`make_inputs` sets 0.25 so that the mixing terms are exercised.

On a grey input the curve is homogeneous of degree 1 (every ratio in it is constant), but
all of the sample's arithmetic is kept, so the kernel's operation count stays realistic.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image, taps

MASK = np.array([[0.057118, 0.124758, 0.057118],
                 [0.124758, 0.272496, 0.124758],
                 [0.057118, 0.124758, 0.057118]])
DILATION = (1, 2)  # atrous0, atrous1
LUMA = (0.2126, 0.7152, 0.0722)


def _taps(dilation: int) -> list[tuple[int, int, float]]:
    """(dy, dx, weight) of the 3x3 mask spread ``dilation`` pixels apart."""
    return [((i - 1) * dilation, (j - 1) * dilation, float(MASK[i, j]))
            for i in range(3) for j in range(3)]


def _atrous(x: kf.Array, dilation: int, boundary: object, name: str) -> kf.Array:
    centre = x.expr()
    weight_sum = value_sum = None
    for dy, dx, m in _taps(dilation):
        pixel = x.at(dy, dx)
        diff = pixel - centre
        weight = m * kf.exp(-(diff * diff))
        weight_sum = weight if weight_sum is None else weight_sum + weight
        value_sum = weight * pixel if value_sum is None else value_sum + weight * pixel
    return kf.local(value_sum / weight_sum, boundary=boundary, name=name)


def _scoto(v: object, s: object) -> object:
    """Hipacc's Scoto curve on r = g = b = v, written once for kfuse expressions."""
    rin = gin = bin_ = v
    x = 0.5149 * rin + 0.3244 * gin + 0.1607 * bin_
    y = (0.2654 * rin + 0.6704 * gin + 0.0642 * bin_) / 3.0
    z = 0.0248 * rin + 0.1248 * gin + 0.8504 * bin_
    v_sc = y * ((((y + z) / x) + 1.0) * 1.33 - 1.68)
    w = x + y + z
    x1 = (1.0 - s) * 0.25 + s * (x / w)
    y1 = (1.0 - s) * 0.25 + s * (y / w)
    y = v_sc * 0.4468 * (1.0 - s) + s * y
    x = (x1 * y) / y1
    z = (x / y1) - x - y
    r = 2.562263 * x + -1.166107 * y + -0.396157 * z
    g = -1.021558 * x + 1.977828 * y + 0.043730 * z
    b = 0.075196 * x + -0.256248 * y + 1.181053 * z
    return r, g, b


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """The night pipeline: input ``img`` (2-D), parameter ``s``, output ``scoto``."""
    p = kf.Pipeline("night")
    img = p.input("img", ndim=2, dtype=dtype)
    s = p.param("s", dtype=dtype)
    atrous0 = _atrous(img, DILATION[0], boundary, "atrous0")
    atrous1 = _atrous(atrous0, DILATION[1], boundary, "atrous1")
    r, g, b = _scoto(atrous1.expr(), s)
    r, g, b = (kf.minimum(kf.maximum(c, 0.0), 1.0) for c in (r, g, b))
    scoto = kf.point(LUMA[0] * r + LUMA[1] * g + LUMA[2] * b, name="scoto")
    p.output(scoto)
    return p


def _atrous_reference(x: np.ndarray, dilation: int, boundary: object) -> np.ndarray:
    at = taps(x, dilation, boundary)
    weight_sum = np.zeros_like(x)
    value_sum = np.zeros_like(x)
    for dy, dx, m in _taps(dilation):
        pixel = at(dy, dx)
        weight = m * np.exp(-((pixel - x) ** 2))
        weight_sum += weight
        value_sum += weight * pixel
    return value_sum / weight_sum


def _scoto_reference(v: np.ndarray, s: float) -> np.ndarray:
    x = (0.5149 + 0.3244 + 0.1607) * v
    y = (0.2654 + 0.6704 + 0.0642) * v / 3.0
    z = (0.0248 + 0.1248 + 0.8504) * v
    v_sc = y * (((y + z) / x + 1.0) * 1.33 - 1.68)
    w = x + y + z
    x1 = (1.0 - s) * 0.25 + s * x / w
    y1 = (1.0 - s) * 0.25 + s * y / w
    y = v_sc * 0.4468 * (1.0 - s) + s * y
    x = x1 * y / y1
    z = x / y1 - x - y
    rgb = np.stack([2.562263 * x - 1.166107 * y - 0.396157 * z,
                    -1.021558 * x + 1.977828 * y + 0.043730 * z,
                    0.075196 * x - 0.256248 * y + 1.181053 * z])
    rgb = np.clip(rgb, 0.0, 1.0)
    return np.tensordot(np.asarray(LUMA), rgb, axes=1)


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Night filter in float64 with plain NumPy (each à-trous pass padded on its own)."""
    img = as_float64(arrays)["img"]
    atrous0 = _atrous_reference(img, DILATION[0], boundary)
    atrous1 = _atrous_reference(atrous0, DILATION[1], boundary)
    return {"scoto": _scoto_reference(atrous1, float(params["s"]))}


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random grey image in [0.1, 1.1) and mixing factor s = 0.25."""
    return {"img": positive_image(size, rng, dtype)}, {"s": 0.25}


APP = App(
    name="night",
    title="Night filter: à-trous bilateral 3x3 and 5x5 (dilated), then scotopic tone map",
    origin="Qiao 2021 (Hipacc thesis) §3.7.2-3.7.3 (Night, [JPS+00], [She92]), Tab. 3.4",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
