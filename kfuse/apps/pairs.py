"""Pairs of kernels with no data between them, for horizontal fusion (Li et al. 2022, HFuse).

HFuse fuses two independent kernels side by side in one block; it pays where their
bottlenecks differ (memory against arithmetic, atomics against streaming) or where each
alone leaves the GPU partly idle. Each pair here is a pipeline of two such kernels (user
CUDA kernels and generated ones) with a NumPy reference, at a benchmark size (``scale`` 1)
and a test size (small, odd):

- ``blur_hash``: a 5-point blur of an image (memory) beside an iterative integer hash of
  keys (arithmetic; a user kernel, HFuse's crypto kernels' kind);
- ``hist_sum``: a 256-bin histogram with shared-memory atomics (a user kernel) beside a sum
  of squares (a generated reduction), HFuse's Hist beside Batchnorm's statistics;
- ``small_pair``: a 3x3 box filter of a small image beside a polynomial of a short vector,
  each too small to fill the GPU;
- ``blur_box``: two stencils on two images, both memory bound (where fusion should not pay);
- ``poly_scale``: a degree-32 polynomial (arithmetic, generated) beside a scaled copy (memory);
- ``sobel_hash`` and ``sobel_blur``: kfuse's own Sobel app (three operators fused into one
  kernel) beside the hash, and beside a blur of another image (kfuse's apps that share no
  data).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import correlate
from kfuse.apps.sobel import SOBEL_X, SOBEL_Y

HASH_ROUNDS = 64
HASH_SOURCE = r"""
// An iterative integer hash of each key (a compute-bound kernel: HASH_ROUNDS rounds of a
// xor-shift-multiply), one key per thread, correct at any block size.
__global__ void hash_keys(const unsigned* keys, unsigned* hashed, int count, int rounds) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  unsigned h = keys[i];
  for (int r = 0; r < rounds; ++r) {
    h ^= h >> 16;
    h *= 0x45d9f3bu;
    h ^= h >> 13;
  }
  hashed[i] = h;
}
"""
HISTOGRAM_BINS = 256
HISTOGRAM_SOURCE = r"""
// A 256-bin histogram of values in [0, 256): counts in shared memory per block (atomics),
// then added to the global counts; a grid-stride loop over the values.
__global__ void histogram(const int* values, int* counts, int count) {
  __shared__ int local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    atomicAdd(&local[values[i] & 255], 1);
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    if (local[b]) atomicAdd(&counts[b], local[b]);
}
"""
HISTOGRAM_BLOCKS = 264  # two per multiprocessor of an H100 / H200
POLY_DEGREE = 32


@dataclass(frozen=True)
class Pair:
    """Two kernels with no path between them: ``build()`` the pipeline, ``make_inputs``
    its inputs at a size scale (1: the benchmark's; ``test=True``: small and odd),
    ``reference`` the outputs in float64 (integers exactly)."""

    name: str
    title: str
    build: Callable[[], kf.Pipeline]
    make_inputs: Callable[[np.random.Generator, bool], dict[str, np.ndarray]]
    reference: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def hash_reference(keys: np.ndarray, rounds: int = HASH_ROUNDS) -> np.ndarray:
    """The hash of :data:`HASH_SOURCE`, in NumPy (uint32 arithmetic)."""
    h = keys.view(np.uint32).astype(np.uint64)
    for _ in range(rounds):
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(0x45D9F3B)) & np.uint64(0xFFFFFFFF)
        h ^= h >> np.uint64(13)
    return h.astype(np.uint32).view(np.int32)


def _blur(img: kf.Array, name: str) -> kf.Array:
    return kf.local((img.at(0, -1) + img.at(0, 1) + img.at(-1, 0) + img.at(1, 0)
                     + img) * 0.2, boundary="clamp", name=name)


BLUR_MASK = np.array([[0.0, 0.2, 0.0], [0.2, 0.2, 0.2], [0.0, 0.2, 0.0]])
BOX_MASK = np.full((3, 3), 1.0 / 9.0)


def _hash(keys: kf.Array) -> kf.Array:
    return kf.user_kernel(HASH_SOURCE, "hash_keys",
                          [keys, kf.written("hashed", like=keys), kf.size(keys), HASH_ROUNDS],
                          block=(256,), grid=[(kf.size(keys), 256)], any_block=True,
                          operations=6 * HASH_ROUNDS,
                          numpy=hash_reference, name="hash")


def _build_blur_hash() -> kf.Pipeline:
    p = kf.Pipeline("blur_hash")
    img = p.input("img", 2)
    keys = p.input("keys", 1, dtype="int32")
    p.output(_blur(img, "blur"), _hash(keys))
    return p


def _histogram_reference(values: np.ndarray) -> np.ndarray:
    return np.bincount(values & 255, minlength=HISTOGRAM_BINS).astype(np.int32)


def _build_hist_sum() -> kf.Pipeline:
    p = kf.Pipeline("hist_sum")
    values = p.input("values", 1, dtype="int32")
    x = p.input("x", 1)
    counts = kf.user_kernel(
        HISTOGRAM_SOURCE, "histogram",
        [values, kf.written("counts", shape=(HISTOGRAM_BINS,), dtype="int32",
                            elementwise=False, initial=0), kf.size(values)],
        block=(256,), grid=[HISTOGRAM_BLOCKS], any_block=True, operations=4,
        numpy=_histogram_reference, name="histogram")
    p.output(counts, kf.reduce_sum(x * x, name="squares"))
    return p


def _polynomial(x: kf.Array, name: str) -> kf.Array:
    value = x * 0.0 + 1.0 / (POLY_DEGREE + 1)
    for degree in range(POLY_DEGREE, 0, -1):
        value = value * x + 1.0 / degree
    return kf.point(value, name=name)


def _polynomial_reference(x: np.ndarray) -> np.ndarray:
    value = np.full_like(x, 1.0 / (POLY_DEGREE + 1))
    for degree in range(POLY_DEGREE, 0, -1):
        value = value * x + 1.0 / degree
    return value


def _build_small_pair() -> kf.Pipeline:
    p = kf.Pipeline("small_pair")
    img = p.input("img", 2)
    x = p.input("x", 1)
    p.output(kf.convolve(img, BOX_MASK, name="box"), _polynomial(x, "poly"))
    return p


def _build_blur_box() -> kf.Pipeline:
    p = kf.Pipeline("blur_box")
    a, b = p.input("a", 2), p.input("b", 2)
    p.output(_blur(a, "blur"), kf.convolve(b, BOX_MASK, name="box"))
    return p


def _build_poly_scale() -> kf.Pipeline:
    p = kf.Pipeline("poly_scale")
    x, y = p.input("x", 1), p.input("y", 1)
    p.output(_polynomial(x, "poly"), kf.point(y * 1.5, name="scaled"))
    return p


def _sobel(img: kf.Array) -> kf.Array:
    """kfuse's Sobel app (:mod:`kfuse.apps.sobel`): two 3x3 derivatives and their magnitude,
    one kernel when fused."""
    dx = kf.convolve(img, SOBEL_X, name="dx")
    dy = kf.convolve(img, SOBEL_Y, name="dy")
    return kf.point(kf.sqrt(dx * dx + dy * dy), name="mag")


def _sobel_reference(img: np.ndarray) -> np.ndarray:
    dx = correlate(img, SOBEL_X, "clamp")
    dy = correlate(img, SOBEL_Y, "clamp")
    return np.sqrt(dx * dx + dy * dy)


def _build_sobel_hash() -> kf.Pipeline:
    p = kf.Pipeline("sobel_hash")
    img = p.input("img", 2)
    keys = p.input("keys", 1, dtype="int32")
    p.output(_sobel(img), _hash(keys))
    return p


def _build_sobel_blur() -> kf.Pipeline:
    p = kf.Pipeline("sobel_blur")
    a, b = p.input("a", 2), p.input("b", 2)
    p.output(_sobel(a), _blur(b, "blur"))
    return p


def _image(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.1, 1.1, size=shape).astype(np.float32)


def _keys(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(-2**31, 2**31, size=count, dtype=np.int64).astype(np.int32)


PAIRS = (
    Pair("blur_hash", "5-point blur (memory) beside an iterative hash (arithmetic, user kernel)",
         _build_blur_hash,
         lambda rng, test: {"img": _image(rng, (37, 53) if test else (8192, 8192)),
                            "keys": _keys(rng, 1001 if test else 1 << 21)},
         lambda a: {"blur": correlate(a["img"], BLUR_MASK, "clamp"),
                    "hashed": hash_reference(a["keys"])}),
    Pair("hist_sum", "256-bin histogram (atomics, user kernel) beside a sum of squares",
         _build_hist_sum,
         lambda rng, test: {"values": rng.integers(0, 256, 999 if test else 1 << 26,
                                                   dtype=np.int32),
                            "x": _image(rng, (1001,) if test else (1 << 26,))},
         lambda a: {"counts": _histogram_reference(a["values"]),
                    "squares": np.sum(np.asarray(a["x"], np.float64) ** 2)}),
    Pair("small_pair", "3x3 box of a small image beside a polynomial of a short vector",
         _build_small_pair,
         lambda rng, test: {"img": _image(rng, (37, 53) if test else (512, 512)),
                            "x": _image(rng, (1001,) if test else (1 << 16,))},
         lambda a: {"box": correlate(a["img"], BOX_MASK, "clamp"),
                    "poly": _polynomial_reference(np.asarray(a["x"], np.float64))}),
    Pair("blur_box", "5-point blur and 3x3 box of two images (both memory bound)",
         _build_blur_box,
         lambda rng, test: {"a": _image(rng, (37, 53) if test else (8192, 8192)),
                            "b": _image(rng, (41, 29) if test else (8192, 8192))},
         lambda a: {"blur": correlate(a["a"], BLUR_MASK, "clamp"),
                    "box": correlate(a["b"], BOX_MASK, "clamp")}),
    Pair("poly_scale", "degree-32 polynomial (arithmetic) beside a scaled copy (memory)",
         _build_poly_scale,
         lambda rng, test: {"x": _image(rng, (1001,) if test else (1 << 24,)),
                            "y": _image(rng, (999,) if test else (1 << 26,))},
         lambda a: {"poly": _polynomial_reference(np.asarray(a["x"], np.float64)),
                    "scaled": np.asarray(a["y"], np.float64) * 1.5}),
    Pair("sobel_hash", "kfuse's Sobel app (one fused kernel) beside an iterative hash",
         _build_sobel_hash,
         lambda rng, test: {"img": _image(rng, (37, 53) if test else (8192, 8192)),
                            "keys": _keys(rng, 1001 if test else 1 << 21)},
         lambda a: {"mag": _sobel_reference(a["img"]), "hashed": hash_reference(a["keys"])}),
    Pair("sobel_blur", "kfuse's Sobel app beside a 5-point blur of another image",
         _build_sobel_blur,
         lambda rng, test: {"a": _image(rng, (37, 53) if test else (8192, 8192)),
                            "b": _image(rng, (41, 29) if test else (8192, 8192))},
         lambda a: {"mag": _sobel_reference(a["a"]),
                    "blur": correlate(a["b"], BLUR_MASK, "clamp")}),
)


def get_pair(name: str) -> Pair:
    """The pair called ``name``."""
    for pair in PAIRS:
        if pair.name == name:
            return pair
    raise KeyError(f"no pair {name!r}; choose one of {', '.join(p.name for p in PAIRS)}")


__all__ = ["PAIRS", "Pair", "get_pair", "hash_reference"]
