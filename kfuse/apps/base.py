"""The :class:`App` record every application module fills in, and the NumPy reference helpers.

The helpers here are deliberately independent of kfuse's IR and NumPy backend: references
pad with ``np.pad`` and slice, so that they can catch bugs in kfuse's own border handling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kfuse.dsl.pipeline import Pipeline
from kfuse.errors import ShapeError
from kfuse.ir.expr import as_boundary
from kfuse.runtime.numpy_backend import numpy_dtype

# kfuse boundary mode -> np.pad mode. kfuse mirror repeats the edge (-1 -> 0), which is
# NumPy's 'symmetric' (NumPy's 'reflect' would skip the edge element).
_NP_PAD_MODES = {"clamp": "edge", "mirror": "symmetric", "repeat": "wrap",
                 "constant": "constant"}


@dataclass(frozen=True)
class App:
    """A pipeline from the literature with an independent float64 NumPy reference."""

    name: str
    title: str
    origin: str
    build: Callable[..., Pipeline]  # build(dtype="float32", boundary="clamp")
    reference: Callable[[Mapping[str, np.ndarray], Mapping[str, float], Any],
                        dict[str, np.ndarray]]
    make_inputs: Callable[[tuple[int, ...], np.random.Generator, str],
                          tuple[dict[str, np.ndarray], dict[str, float]]]
    bench_size: tuple[int, ...] = (8192, 8192)  # fills an H100/H200
    test_size: tuple[int, ...] = (37, 53)      # odd, not a multiple of any block size
    ndim: int = 2
    tolerance: float = 1e-5  # norm-wise relative error of the checks against the reference

    @property
    def size_form(self) -> str:
        """What a size of this app looks like, for errors about a wrong one."""
        example = "x".join(map(str, self.test_size))
        return f"{self.name} takes a {self.ndim}-D size like {example}"

    def check_size(self, size: tuple[int, ...]) -> tuple[int, ...]:
        """``size`` as ints if it fits the app (``ndim`` positive numbers); a
        :class:`~kfuse.errors.ShapeError` saying what fits otherwise (a wrong size would
        surface later as a missing size symbol deep inside the graph)."""
        return check_size(size, self.ndim, self.size_form)

    def parameters(self, size: tuple[int, ...]) -> dict[str, float] | None:
        """The runtime parameters at ``size`` where they depend on it (``None``: they do not,
        and ``make_inputs`` at any size gives them)."""
        return None

    def sizes(self, graph: Any, size: tuple[int, ...]) -> dict[str, int]:
        """Size symbols of the app's graph at ``size``: every input has that shape (the BLAS
        apps bind vectors too, :class:`kfuse.apps.blas.BlasApp`)."""
        size = self.check_size(size)
        return graph.bind_shapes({name: size for name in graph.inputs})


def check_size(size: Sequence[int], ndim: int, form: str) -> tuple[int, ...]:
    """``size`` as a tuple of ints when it has ``ndim`` positive entries, else a
    :class:`~kfuse.errors.ShapeError` of ``form`` (what a right size looks like)."""
    values = tuple(int(n) for n in size)
    if len(values) != ndim or any(n < 1 for n in values):
        raise ShapeError(f"{form}, got {'x'.join(map(str, values)) or 'nothing'}")
    return values


def pad(x: np.ndarray, radius: Sequence[int] | int, boundary: object) -> np.ndarray:
    """Pad ``x`` by ``radius`` per axis as kfuse's boundary mode ``boundary`` reads outside it."""
    bound = as_boundary(boundary)
    radii = (radius,) * x.ndim if isinstance(radius, int) else tuple(radius)
    widths = [(r, r) for r in radii]
    mode = _NP_PAD_MODES[bound.mode]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=bound.value)
    return np.pad(x, widths, mode=mode)


def taps(x: np.ndarray, radius: Sequence[int] | int, boundary: object
         ) -> Callable[..., np.ndarray]:
    """Pad ``x`` once; return ``at(*offsets)``, the whole array read at a constant offset."""
    radii = (radius,) * x.ndim if isinstance(radius, int) else tuple(radius)
    padded = pad(x, radii, boundary)

    def at(*offsets: int) -> np.ndarray:
        index = tuple(slice(r + o, r + o + n)
                      for r, o, n in zip(radii, offsets, x.shape, strict=True))
        return padded[index]

    return at


def correlate(x: np.ndarray, mask: Any, boundary: object, scale: float = 1.0) -> np.ndarray:
    """``scale * sum_k mask[k] * x[p + k - centre]`` with ``boundary`` padding (float64)."""
    weights = np.asarray(mask, dtype=np.float64)
    centre = tuple(n // 2 for n in weights.shape)
    at = taps(np.asarray(x, dtype=np.float64), centre, boundary)
    out = np.zeros(x.shape, dtype=np.float64)
    for index in np.ndindex(*weights.shape):
        if weights[index] != 0.0:
            out += weights[index] * at(*(i - c for i, c in zip(index, centre, strict=True)))
    return scale * out


def as_float64(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every array upcast to float64 (references compute in double precision)."""
    return {name: np.asarray(value, dtype=np.float64) for name, value in arrays.items()}


def positive_image(size: tuple[int, ...], rng: np.random.Generator, dtype: str,
                   low: float = 0.1, high: float = 1.1) -> np.ndarray:
    """Random data in ``[low, high)``: positive, so log, sqrt and division are safe."""
    return rng.uniform(low, high, size=size).astype(numpy_dtype(dtype))
