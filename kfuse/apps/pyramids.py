"""Multiresolution pipelines: image pyramids built from downsampling and upsampling reads.

``local_laplacian`` — the local Laplacian filter (Paris, Hasinoff and Kautz 2011) as Halide's
``apps/local_laplacian`` generator defines it: a uint16 RGB image's grey level processed at
``INTENSITY_LEVELS`` intensities (a tone curve ``alpha * fx * exp(-fx^2 / 2)`` quantised to
256 steps per level, and ``beta``), a Laplacian pyramid of each processed image
(``LAPLACIAN_LEVELS`` levels), the output's Laplacian pyramid interpolated per point between
the two processed levels the input's Gaussian pyramid selects (a read at a computed level),
collapsed, and the colour put back. Same definition choices as below; Halide clamps the
input once and extends every level beyond its edges, kfuse reads each level through the
boundary mode (the two agree away from the borders).

``exposure_fusion`` — exposure fusion (Mertens, Kautz and Van Reeth 2007) of
``EXPOSURES`` grey exposures of one scene: each pixel of each exposure weighed by its contrast
(the absolute response of the 4-neighbour Laplacian) and its well-exposedness
(``exp(-(v - 0.5)^2 / (2 * 0.2^2))``), the weights normalised across the exposures per pixel,
and the exposures' Laplacian pyramids mixed level by level with their weights' Gaussian
pyramids, then collapsed (``FUSION_LEVELS`` levels). Grey exposures: Mertens et al.'s
saturation term (the spread of the colour channels) has no grey counterpart (its exponent 0).

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
from kfuse.runtime.numpy_backend import numpy_dtype

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
    la, lb = (laplacian_reference(values[name], BLEND_LEVELS, boundary) for name in "ab")
    gm = gaussian_reference(values["mask"], BLEND_LEVELS, boundary)
    mixed = [m * (x - y) + y for x, y, m in zip(la, lb, gm, strict=True)]
    return {"blended": collapse_reference(mixed, boundary)}


def gaussian_reference(x: np.ndarray, count: int, boundary: object) -> list[np.ndarray]:
    """The ``count`` levels of ``x``'s Gaussian pyramid (float64), finest first."""
    levels = [x]
    for _ in range(count - 1):
        levels.append(downsample_reference(levels[-1], boundary))
    return levels


def laplacian_reference(x: np.ndarray, count: int, boundary: object) -> list[np.ndarray]:
    """The ``count`` levels of ``x``'s Laplacian pyramid (float64): each Gaussian level less
    the next one upsampled, the coarsest as it is."""
    levels = gaussian_reference(x, count, boundary)
    return [fine - upsample_reference(coarse, fine.shape, boundary)
            for fine, coarse in zip(levels[:-1], levels[1:], strict=True)] + [levels[-1]]


def collapse_reference(levels: list[np.ndarray], boundary: object) -> np.ndarray:
    """A Laplacian pyramid's image: from the coarsest level up, each level plus the image so
    far upsampled to it."""
    image = levels[-1]
    for level in reversed(levels[:-1]):
        image = level + upsample_reference(image, level.shape, boundary)
    return image


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

# -- the local Laplacian filter ------------------------------------------------------------

LAPLACIAN_LEVELS = 8      # J, the pyramid's levels (Halide's app: pyramid_levels = 8)
INTENSITY_LEVELS = 8      # K, the intensity levels the image is processed at (levels = 8)
GRAY_WEIGHTS = (0.299, 0.587, 0.114)
COLOR_EPS = 0.01


def build_local_laplacian(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """Input ``image`` (3, h, w) uint16 RGB; parameters ``alpha`` and ``beta``; output
    ``output`` (3, h, w) uint16. ``dtype`` is the type computed in; ``boundary`` every read's
    mode at every level."""
    p = kf.Pipeline("local_laplacian")
    image = p.input("image", shape=(3, "h", "w"), dtype="uint16")
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    levels, intensities = LAPLACIAN_LEVELS, INTENSITY_LEVELS
    channel = [kf.astype(image.at(0, 0, 0, index={0: c}, dims=(-1, 0, 1)), dtype) / 65535.0
               for c in range(3)]
    gray = kf.point(sum(w * c for w, c in zip(GRAY_WEIGHTS, channel, strict=True)),
                    name="gray", shape=("h", "w"))
    # the processed pyramid's finest level, one plane per intensity level k: a tone curve
    # around k / (K - 1), quantised to 256 steps per level as Halide's lookup table is
    level = kf.astype(kf.coord(0), dtype) * (1.0 / (intensities - 1))
    step = kf.minimum(kf.maximum(kf.astype(gray.at(0, 0, dims=(1, 2)) * (
        (intensities - 1) * 256.0), "int32"), 0), (intensities - 1) * 256)
    fx = kf.astype(step - kf.coord(0) * 256, dtype) * (1.0 / 256.0)
    remapped = alpha * fx * kf.exp(-fx * fx * 0.5)
    processed = kf.point(beta * (gray.at(0, 0, dims=(1, 2)) - level) + level + remapped,
                         name="processed", shape=(intensities, "h", "w"))
    spatial = (1, 2)
    laplacian = kf.laplacian_pyramid(processed, levels, axes=spatial, boundary=boundary,
                                     name="processed")
    gray_levels = kf.gaussian_pyramid(gray, levels, boundary=boundary, name="gray")
    # each level of the output's Laplacian pyramid: the processed levels' interpolated at
    # the intensity of the input's Gaussian level there (a read at a computed level)
    output_levels = []
    for j in range(levels):
        value = gray_levels[j] * float(intensities - 1)
        chosen = kf.minimum(kf.maximum(kf.astype(value, "int32"), 0), intensities - 2)
        weight = value - kf.astype(chosen, dtype)
        below = laplacian[j].at(0, 0, 0, index={0: chosen}, boundary=boundary)
        above = laplacian[j].at(1, 0, 0, index={0: chosen}, boundary=boundary)
        output_levels.append(kf.point((1.0 - weight) * below + weight * above,
                                      name=f"out_l{j}"))
    result = kf.collapse(output_levels, boundary=boundary, name="result")
    color = (result.at(0, 0, dims=(1, 2)) * (kf.astype(image, dtype) / 65535.0 + COLOR_EPS)
             / (gray.at(0, 0, dims=(1, 2)) + COLOR_EPS))
    p.output(kf.point(kf.astype(kf.minimum(kf.maximum(color, 0.0), 1.0) * 65535.0, "uint16"),
                      name="output"))
    return p


def local_laplacian_reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
                              boundary: object) -> dict[str, np.ndarray]:
    """The local Laplacian filter in float64 with plain NumPy (Paris et al. 2011 as Halide's
    app computes it, every level's reads through ``boundary``)."""
    image = np.asarray(arrays["image"], dtype=np.float64) / 65535.0
    alpha, beta = float(params["alpha"]), float(params["beta"])
    levels, intensities = LAPLACIAN_LEVELS, INTENSITY_LEVELS
    gray = sum(w * image[c] for c, w in enumerate(GRAY_WEIGHTS))
    k = np.arange(intensities, dtype=np.float64)[:, None, None]
    step = np.clip((gray * ((intensities - 1) * 256.0)).astype(np.int64), 0,
                   (intensities - 1) * 256)
    fx = (step[None] - 256 * k) / 256.0
    processed = beta * (gray[None] - k / (intensities - 1)) + k / (intensities - 1) + \
        alpha * fx * np.exp(-fx * fx / 2.0)

    def down(x: np.ndarray) -> np.ndarray:  # the spatial axes of a stack or an image
        if x.ndim == 3:
            return np.stack([downsample_reference(plane, boundary) for plane in x])
        return downsample_reference(x, boundary)

    def up(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if x.ndim == 3:
            return np.stack([upsample_reference(plane, shape[1:], boundary) for plane in x])
        return upsample_reference(x, shape, boundary)

    gaussian = [processed]
    gray_levels = [gray]
    for _ in range(levels - 1):
        gaussian.append(down(gaussian[-1]))
        gray_levels.append(down(gray_levels[-1]))
    laplacian = [fine - up(coarse, fine.shape)
                 for fine, coarse in zip(gaussian[:-1], gaussian[1:], strict=True)]
    laplacian.append(gaussian[-1])
    outputs = []
    for lap, g in zip(laplacian, gray_levels, strict=True):
        value = g * (intensities - 1)
        chosen = np.clip(value.astype(np.int64), 0, intensities - 2)
        weight = value - chosen
        rows, columns = np.meshgrid(np.arange(g.shape[0]), np.arange(g.shape[1]),
                                    indexing="ij")
        outputs.append((1 - weight) * lap[chosen, rows, columns]
                       + weight * lap[chosen + 1, rows, columns])
    result = outputs[-1]
    for level in range(levels - 2, -1, -1):
        result = outputs[level] + up(result, outputs[level].shape)
    color = result[None] * (image + COLOR_EPS) / (gray[None] + COLOR_EPS)
    return {"output": np.clip(color, 0.0, 1.0) * 65535.0}


def local_laplacian_inputs(size: tuple[int, ...], rng: np.random.Generator,
                           dtype: str = "float32"
                           ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A random RGB image (uint16, 3 x h x w) and the parameters of Halide's default run
    (``process input 8 1 1``: levels 8, alpha 1, beta 1; its driver passes the generator
    ``alpha / (levels - 1)``, the ``alpha`` here)."""
    image = rng.integers(0, 65536, size=(3, *size)).astype(np.uint16)
    return {"image": image}, {"alpha": 1.0 / (INTENSITY_LEVELS - 1), "beta": 1.0}


class LocalLaplacianApp(App):
    """An app whose input is an RGB image of 3 x h x w for a size h x w."""

    def sizes(self, graph: object, size: tuple[int, ...]) -> dict[str, int]:
        size = self.check_size(size)
        return graph.bind_shapes({"image": (3, *size)})  # type: ignore[attr-defined]


LOCAL_LAPLACIAN = LocalLaplacianApp(
    name="local_laplacian",
    title=f"Local Laplacian filter ({LAPLACIAN_LEVELS} levels, {INTENSITY_LEVELS} intensity "
          "levels), uint16 RGB",
    origin="Paris, Hasinoff and Kautz 2011; Halide's apps/local_laplacian",
    build=build_local_laplacian,
    reference=local_laplacian_reference,
    make_inputs=local_laplacian_inputs,
    bench_size=(2160, 3840),
    test_size=(37, 53),
    tolerance=1e-4,
)

# -- exposure fusion ----------------------------------------------------------------------

EXPOSURES = 3
FUSION_LEVELS = 5
WELL_EXPOSED_SIGMA = 0.2
WEIGHT_EPS = 1e-6  # added to every weight: a region flat in every exposure mixes them evenly


def build_exposure_fusion(dtype: str = "float32", boundary: object = "clamp") -> kf.Pipeline:
    """Inputs ``e0`` .. ``e{EXPOSURES-1}`` (2-D, one shape, values in [0, 1]); output
    ``fused``."""
    p = kf.Pipeline("exposure_fusion")
    exposures = [p.input(f"e{k}", ndim=2, dtype=dtype) for k in range(EXPOSURES)]
    weights = []
    for k, e in enumerate(exposures):
        laplacian = e.at(-1, 0) + e.at(1, 0) + e.at(0, -1) + e.at(0, 1) - 4.0 * e
        exposed = kf.exp((e - 0.5) * (e - 0.5) * (-0.5 / WELL_EXPOSED_SIGMA ** 2))
        weights.append(kf.local(kf.abs(laplacian) * exposed + WEIGHT_EPS, boundary=boundary,
                                name=f"weight{k}"))
    total = kf.point(sum(weights[1:], weights[0]), name="total")
    normalised = [kf.point(w / total, name=f"share{k}") for k, w in enumerate(weights)]
    shares = [kf.gaussian_pyramid(w, FUSION_LEVELS, boundary=boundary, name=f"share{k}")
              for k, w in enumerate(normalised)]
    details = [kf.laplacian_pyramid(e, FUSION_LEVELS, boundary=boundary, name=f"e{k}")
               for k, e in enumerate(exposures)]
    mixed = []
    for level in range(FUSION_LEVELS):
        terms = [shares[k][level] * details[k][level] for k in range(EXPOSURES)]
        mixed.append(kf.point(sum(terms[1:], terms[0]), name=f"fused{level}"))
    p.output(kf.collapse(mixed, boundary=boundary, name="fused"))
    return p


def exposure_fusion_reference(arrays: Mapping[str, np.ndarray], params: Mapping[str, float],
                              boundary: object) -> dict[str, np.ndarray]:
    """Exposure fusion in float64 with plain NumPy."""
    values = as_float64(arrays)
    exposures = [values[f"e{k}"] for k in range(EXPOSURES)]
    weights = []
    for e in exposures:
        padded = _pad_axis(e, [(1, 1), (1, 1)], boundary)
        laplacian = (padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2]
                     + padded[1:-1, 2:] - 4.0 * e)
        exposed = np.exp(-((e - 0.5) ** 2) / (2 * WELL_EXPOSED_SIGMA ** 2))
        weights.append(np.abs(laplacian) * exposed + WEIGHT_EPS)
    total = sum(weights)
    fused = [np.zeros(1)] * FUSION_LEVELS
    for e, w in zip(exposures, weights, strict=True):
        shares = gaussian_reference(w / total, FUSION_LEVELS, boundary)
        details = laplacian_reference(e, FUSION_LEVELS, boundary)
        fused = [f + g * d for f, g, d in zip(fused, shares, details, strict=True)]
    return {"fused": collapse_reference(fused, boundary)}


def exposure_fusion_inputs(size: tuple[int, ...], rng: np.random.Generator,
                           dtype: str = "float32"
                           ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """One random scene seen at ``EXPOSURES`` exposures (darker to brighter, clipped to
    [0, 1]), each with its own noise."""
    scene = rng.uniform(0.05, 0.6, size)
    arrays = {}
    for k in range(EXPOSURES):
        gain = 0.5 * 2.0 ** k
        arrays[f"e{k}"] = np.clip(scene * gain + rng.normal(0.0, 0.02, size), 0.0,
                                  1.0).astype(numpy_dtype(dtype))
    return arrays, {}


EXPOSURE_FUSION = App(
    name="exposure_fusion",
    title=f"Exposure fusion of {EXPOSURES} grey exposures ({FUSION_LEVELS} levels)",
    origin="Mertens, Kautz and Van Reeth 2007",
    build=build_exposure_fusion,
    reference=exposure_fusion_reference,
    make_inputs=exposure_fusion_inputs,
    bench_size=(4096, 4096),
    test_size=(37, 53),
)

# The local Laplacian filter is not registered yet: planning it cold takes ~35 s on two
# cores (nvcc's resource checks of its fused groups), more than CI can give it;
# it is checked against its reference on the numpy backend (tests/test_pyramid.py).
PYRAMID_APPS = (BLEND,)
