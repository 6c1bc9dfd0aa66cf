"""Multiresolution pipelines: image pyramids built from downsampling and upsampling reads.

``blend`` — Laplacian pyramid blending (Burt and Adelson 1983, "A multiresolution spline
with application to image mosaics"): two images ``a`` and ``b`` and a ``mask`` in [0, 1]::

    la = Laplacian pyramid of a, lb = of b        (LEVELS levels)
    gm = Gaussian pyramid of mask
    blended_k = gm_k * la_k + (1 - gm_k) * lb_k
    out = collapse(blended)                        (coarsest up: level + upsampled coarser)

Definition choices. Each level is ``ceil(n/2)`` of the one before per axis. Downsampling is
Burt and Adelson's 4-tap binomial ``[1, 3, 3, 1] / 8`` at ``2p - 1 .. 2p + 2`` on both axes;
upsampling is linear with half-pixel centres (``0.75`` of the coarse point ``p // 2`` and
``0.25`` of its neighbour towards ``p``), as Halide's ``local_laplacian`` app downsamples and
upsamples. Every read outside a level follows the boundary mode at that level (Halide
instead extends each level's function beyond its edges; inside, the two agree).

The reference below is plain NumPy (``np.pad`` and strided slices), independent of kfuse's
operators.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, positive_image
from kfuse.ir.expr import as_boundary

BLEND_LEVELS = 7
DOWN_WEIGHTS = (1 / 8, 3 / 8, 3 / 8, 1 / 8)  # at 2p-1 .. 2p+2


def build_blend(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """Inputs ``a``, ``b``, ``mask`` (2-D, one shape); output ``blended``."""
    p = kf.Pipeline("blend")
    a = p.input("a", ndim=2, dtype=dtype)
    b = p.input("b", ndim=2, dtype=dtype)
    mask = p.input("mask", ndim=2, dtype=dtype)
    la = kf.laplacian_pyramid(a, BLEND_LEVELS, boundary=boundary, name="a")
    lb = kf.laplacian_pyramid(b, BLEND_LEVELS, boundary=boundary, name="b")
    gm = kf.gaussian_pyramid(mask, BLEND_LEVELS, boundary=boundary, name="mask")
    levels = [kf.point(m * (x - y) + y, name=f"mixed{level}")
              for level, (x, y, m) in enumerate(zip(la, lb, gm, strict=True))]
    p.output(kf.collapse(levels, boundary=boundary, name="blended"))
    return p


def downsample_reference(x: np.ndarray, boundary: object) -> np.ndarray:
    """The next Gaussian level of ``x`` (float64): the binomial taps at ``2p - 1 .. 2p + 2``
    on every axis, read through ``boundary``."""
    for axis in range(x.ndim):
        coarse = -(-x.shape[axis] // 2)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (1, 3)
        padded = _pad_axis(x, widths, boundary)
        total = 0.0
        for tap, weight in enumerate(DOWN_WEIGHTS):
            index = [slice(None)] * x.ndim
            index[axis] = slice(tap, tap + 2 * coarse, 2)
            total = total + weight * padded[tuple(index)]
        x = total
    return x


def upsample_reference(x: np.ndarray, shape: tuple[int, ...], boundary: object) -> np.ndarray:
    """``x`` linearly interpolated up to ``shape`` (float64): point ``p`` takes 0.75 of
    coarse point ``p // 2`` and 0.25 of ``p // 2 - 1`` (``p`` even) or ``p // 2 + 1`` (odd)."""
    for axis, size in enumerate(shape):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (1, 1)
        padded = _pad_axis(x, widths, boundary)
        points = np.arange(size)
        near = points // 2 + 1  # (index into the padded axis)
        far = np.where(points % 2 == 0, near - 1, near + 1)
        x = 0.75 * np.take(padded, near, axis) + 0.25 * np.take(padded, far, axis)
    return x


def _pad_axis(x: np.ndarray, widths: list[tuple[int, int]], boundary: object) -> np.ndarray:
    """``x`` padded as ``boundary`` reads outside it, by ``widths`` (before, after) per axis
    (np.pad's modes as kfuse's; wider than the array too: levels of one element)."""
    mode = as_boundary(boundary)
    if mode.mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=mode.value)
    return np.pad(x, widths, mode={"clamp": "edge", "mirror": "symmetric",
                                   "repeat": "wrap"}[mode.mode])


def blend_reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
                    boundary: object) -> dict[str, np.ndarray]:
    """Pyramid blending in float64 with plain NumPy."""
    values = as_float64(arrays)

    def gaussian(x: np.ndarray) -> list[np.ndarray]:
        levels = [x]
        for _ in range(BLEND_LEVELS - 1):
            levels.append(downsample_reference(levels[-1], boundary))
        return levels

    def laplacian(x: np.ndarray) -> list[np.ndarray]:
        levels = gaussian(x)
        return [fine - upsample_reference(coarse, fine.shape, boundary)
                for fine, coarse in zip(levels[:-1], levels[1:], strict=True)] + [levels[-1]]

    la, lb, gm = laplacian(values["a"]), laplacian(values["b"]), gaussian(values["mask"])
    mixed = [m * (x - y) + y for x, y, m in zip(la, lb, gm, strict=True)]
    image = mixed[-1]
    for level in range(BLEND_LEVELS - 2, -1, -1):
        image = mixed[level] + upsample_reference(image, mixed[level].shape, boundary)
    return {"blended": image}


def blend_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Two random images in [0.1, 1.1) and a random mask in [0, 1)."""
    return ({"a": positive_image(size, rng, dtype), "b": positive_image(size, rng, dtype),
             "mask": positive_image(size, rng, dtype, 0.0, 1.0)}, {})


BLEND = App(
    name="blend",
    title=f"Laplacian pyramid blending of two images with a mask ({BLEND_LEVELS} levels)",
    origin="Burt and Adelson 1983; the pyramids of Halide's local_laplacian app",
    build=build_blend,
    reference=blend_reference,
    make_inputs=blend_inputs,
    bench_size=(4096, 4096),
    test_size=(37, 53),
)

PYRAMID_APPS = (BLEND,)
