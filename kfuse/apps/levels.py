"""Detail enhancement on every level of an image pyramid: independent branches of kernels.

Kernels (``l0`` the finest level, each next level half as large per axis, rounded up)::

    blur_k   = local 3x3 binomial [1 2 1; 2 4 2; 1 2 1] / 16 of l_k
    detail_k = point l_k + amount * (l_k - blur_k)                   for k = 0 .. LEVELS-1

Definition choices. Qiao 2021 §4.1 runs a filter F at each level of a multiresolution
pyramid; F at one level is independent of F at the others, and the coarse levels are too
small to fill the GPU, which is what the thesis's multi-stream model (§4.3) exploits. Here
the levels are given (a pyramid built beforehand) and F is an unsharp-mask detail boost, so
the pipeline is four branches with no path between them: each fuses into one kernel, and
the four kernels may run at once on separate streams where the wave model predicts a gain
(``kf.model.waves``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, check_size, correlate, positive_image

LEVELS = 4
BINOMIAL = np.array([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]])
BINOMIAL_SCALE = 1.0 / 16.0


def level_shape(size: tuple[int, ...], level: int) -> tuple[int, ...]:
    """The shape of pyramid level ``level`` over a base of ``size``."""
    return tuple(-(-n // 2**level) for n in size)


def build(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """Inputs ``l0`` .. ``l3`` (2-D, each its own size), parameter ``amount``; outputs
    ``detail0`` .. ``detail3``."""
    p = kf.Pipeline("levels")
    amount = p.param("amount", dtype)
    for level in range(LEVELS):
        image = p.input(f"l{level}", ndim=2, dtype=dtype)
        blur = kf.convolve(image, BINOMIAL, boundary=boundary, name=f"blur{level}",
                              scale=BINOMIAL_SCALE)
        p.output(kf.point(image + amount * (image - blur), name=f"detail{level}"))
    return p


def reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
              boundary: object) -> dict[str, np.ndarray]:
    """Each level's detail boost in float64 with plain NumPy."""
    levels = as_float64(arrays)
    out = {}
    for level in range(LEVELS):
        image = levels[f"l{level}"]
        blur = correlate(image, BINOMIAL, boundary, BINOMIAL_SCALE)
        out[f"detail{level}"] = image + params["amount"] * (image - blur)
    return out


def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Random levels in [0.1, 1.1), each half the size of the one before; ``amount`` 0.7."""
    return ({f"l{level}": positive_image(level_shape(size, level), rng, dtype)
             for level in range(LEVELS)}, {"amount": 0.7})


class LevelsApp(App):
    """An app whose inputs are the levels of a pyramid: each input has its own shape."""

    def sizes(self, graph: object, size: tuple[int, ...]) -> dict[str, int]:
        size = check_size(size, self.ndim, self.size_form)
        return graph.bind_shapes({f"l{level}": level_shape(size, level)  # type: ignore[attr-defined]
                                  for level in range(LEVELS)})


APP = LevelsApp(
    name="levels",
    title="Detail boost on 4 pyramid levels: independent branches of small kernels",
    origin="Qiao 2021 (Hipacc thesis) §4.1-4.3: the filter F at every level of a pyramid",
    build=build,
    reference=reference,
    make_inputs=make_inputs,
)
