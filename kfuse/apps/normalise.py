"""Normalisations: reductions along an axis read back across that axis, as users write them.

Every normalisation layer of a network, and many statistics, reduce along the rows (or the
columns) of a matrix and then read the result back at every element of that row (column),
together with the reduction's own input. Written with kfuse's public DSL as a user would:
``reduce_*(..., axis=1)`` for the statistic and ``stat.at(0, dims=(0,))`` to read it back at
each element's row (``dims=(1,)``: at its column). Each app has a float64 NumPy reference.

| app            | operations (rows of ``x``: ``M x N``)                                 |
|----------------|-----------------------------------------------------------------------|
| rmsnorm        | ``y = x g / sqrt(mean(x²) + eps)``                                    |
| layernorm      | ``mu = mean(x)``, ``var = mean((x - mu)²)``, ``y = (x - mu) / sqrt(var + eps) g + b`` |
| logsoftmax     | ``m = max(x)``, ``s = sum(exp(x - m))``, ``y = x - m - log s``          |
| softmax        | ``y = exp(x - m) / s`` over rows of a 128 K vocabulary: held in segments  |
| crossentropy   | ``loss = -sum(t (x - m - log s))`` per row, ``t`` the target distribution |
| logsumexp      | ``m = max(x)``, ``s = sum(exp(x - m))``, ``lse = m + log s`` per row: a map of the row's results |
| colstandardise | along axis 0: ``y = (x - mean) / sqrt(var + eps)`` per column             |
| standardise    | a vector (``n``): two sums (``Σx``, ``Σx²``) in one pass, then the map        |

The row length enters as the parameter ``inv_n`` (``1 / N``, or ``1 / M`` along columns),
which ``make_inputs`` sets from the size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, as_float64, check_size
from kfuse.apps.blas import bind_sizes
from kfuse.runtime.numpy_backend import numpy_dtype

ORIGIN = "normalisation layers and statistics"
EPS = 1e-5
BENCH = (16384, 4096)   # 256 MB each way: rows of a large language model's hidden size
LONG_ROWS = (4096, 32768)  # rows of 32 K float32 (a vocabulary): the longest held whole
VOCABULARY_ROWS = (1024, 128256)  # rows of a 128 K vocabulary: longer than a block holds
TEST = (37, 133)
VECTOR_TEST = (4099,)


@dataclass(frozen=True)
class NormApp(App):
    """A normalisation: sizes bound from ``(M, N)``; the family ``norm``."""

    family: str = "norm"
    # the axis whose length ``inv_n`` is one over (None: the app takes no ``inv_n``)
    axis: int | None = 1

    def parameters(self, size: tuple[int, ...]) -> dict[str, float] | None:
        return size_parameters(self.check_size(size), self.axis) or None

    @property
    def size_form(self) -> str:
        return size_form(self.ndim)

    def sizes(self, graph: Any, size: tuple[int, ...]) -> dict[str, int]:
        return bind_sizes(graph, self.check_size(size))


def size_form(ndim: int) -> str:
    """What a size of a normalisation of ``ndim`` axes looks like."""
    return "a normalisation takes a size M x N" if ndim == 2 else \
        "a vector's normalisation takes a size n"


def size_parameters(size: tuple[int, ...], axis: int | None) -> dict[str, float]:
    """The parameters that follow the size: ``inv_n``, one over the length along ``axis``."""
    return {} if axis is None else {"inv_n": 1.0 / size[axis]}


def _inputs_maker(build: Callable[..., kf.Pipeline], axis: int | None, ndim: int
                  ) -> Callable[..., tuple]:
    """Standard normal inputs (targets: each row a random distribution), ``inv_n`` from the
    size along ``axis``."""

    def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        graph = build(dtype).graph()
        size = check_size(size, ndim, size_form(ndim))
        sizes = bind_sizes(graph, size)
        arrays = {}
        stored = numpy_dtype(dtype)  # (bfloat16: ml_dtypes')
        for name in graph.inputs:
            shape = graph.shape_of(name, sizes)
            if name == "t":  # a distribution per row
                weights = rng.random(shape)
                arrays[name] = (weights / weights.sum(axis=1, keepdims=True)).astype(stored)
            elif name in ("g", "b"):
                arrays[name] = rng.uniform(0.5, 1.5, size=shape).astype(stored)
            else:
                arrays[name] = (rng.standard_normal(shape) * 2).astype(stored)
        return arrays, size_parameters(size, axis)

    return make_inputs


# ---------------------------------------------------------------------------------------------
# The pipelines
# ---------------------------------------------------------------------------------------------

def build_rmsnorm(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """RMSNorm (Zhang and Sennrich 2019): ``y = x g / sqrt(mean(x²) + eps)`` per row."""
    p = kf.Pipeline("rmsnorm")
    x = p.input("x", ndim=2, dtype=dtype)
    g = p.input("g", shape=(x.shape[1],), dtype=dtype)
    inv_n = p.param("inv_n", dtype)
    squares = kf.reduce_sum(x * x, axis=1, name="squares")
    scale = kf.rsqrt(squares.at(0, dims=(0,)) * inv_n + EPS)
    y = kf.point(x * scale * g.at(0, dims=(1,)), name="y")
    p.output(y)
    return p


def ref_rmsnorm(arrays, params, boundary=None):
    a = as_float64(arrays)
    return {"y": a["x"] / np.sqrt((a["x"] ** 2).mean(axis=1, keepdims=True) + EPS) * a["g"]}


def build_layernorm(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """LayerNorm (Ba et al. 2016): the mean, the variance of the centred values, then the
    normalised values with a gain and a bias: a chain of two row reductions."""
    p = kf.Pipeline("layernorm")
    x = p.input("x", ndim=2, dtype=dtype)
    g = p.input("g", shape=(x.shape[1],), dtype=dtype)
    b = p.input("b", shape=(x.shape[1],), dtype=dtype)
    inv_n = p.param("inv_n", dtype)
    total = kf.reduce_sum(x, axis=1, name="total")
    centred = x - total.at(0, dims=(0,)) * inv_n
    spread = kf.reduce_sum(centred * centred, axis=1, name="spread")
    scale = kf.rsqrt(spread.at(0, dims=(0,)) * inv_n + EPS)
    y = kf.point(centred * scale * g.at(0, dims=(1,)) + b.at(0, dims=(1,)), name="y")
    p.output(y)
    return p


def ref_layernorm(arrays, params, boundary=None):
    a = as_float64(arrays)
    centred = a["x"] - a["x"].mean(axis=1, keepdims=True)
    var = (centred ** 2).mean(axis=1, keepdims=True)
    return {"y": centred / np.sqrt(var + EPS) * a["g"] + a["b"]}


def build_logsoftmax(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Log-softmax over rows: the maximum, the sum of exponentials past it, the map."""
    p = kf.Pipeline("logsoftmax")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    y = kf.point(x - top.at(0, dims=(0,)) - kf.log(total.at(0, dims=(0,))), name="y")
    p.output(y)
    return p


def ref_logsoftmax(arrays, params, boundary=None):
    x = as_float64(arrays)["x"]
    top = x.max(axis=1, keepdims=True)
    return {"y": x - top - np.log(np.exp(x - top).sum(axis=1, keepdims=True))}


def build_softmax(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Softmax over rows: the maximum and the sum of exponentials past it (one pass over
    rows held in segments, by online rescaling), then the map."""
    p = kf.Pipeline("softmax")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    y = kf.point(kf.exp(x - top.at(0, dims=(0,))) / total.at(0, dims=(0,)), name="y")
    p.output(y)
    return p


def ref_softmax(arrays, params, boundary=None):
    x = as_float64(arrays)["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def build_crossentropy(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Cross-entropy per row of logits ``x`` against target distributions ``t``: the
    log-softmax's two reductions, then a third row reduction of the log-probabilities."""
    p = kf.Pipeline("crossentropy")
    x = p.input("x", ndim=2, dtype=dtype)
    t = p.input("t", shape=x.shape, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    log_p = x - top.at(0, dims=(0,)) - kf.log(total.at(0, dims=(0,)))
    loss = kf.reduce_sum(-t * log_p, axis=1, name="loss")
    p.output(loss)
    return p


def ref_crossentropy(arrays, params, boundary=None):
    a = as_float64(arrays)
    log_p = ref_logsoftmax({"x": a["x"]}, params)["y"]
    return {"loss": -(a["t"] * log_p).sum(axis=1)}


def build_logsumexp(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Log-sum-exp of each row: its maximum, the sum of exponentials past it, then a map of
    the two row results alone (over the rows, not the matrix)."""
    p = kf.Pipeline("logsumexp")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    lse = kf.point(top + kf.log(total), name="lse")
    p.output(lse)
    return p


def ref_logsumexp(arrays, params, boundary=None):
    x = as_float64(arrays)["x"]
    top = x.max(axis=1)
    return {"lse": top + np.log(np.exp(x - top[:, None]).sum(axis=1))}


def build_cross_entropy_of_labels(dtype: str = "float32") -> kf.Pipeline:
    """A cross-entropy as users write it, of integer class labels: the row's log-sum-exp
    less the logit at the row's label (read at a computed column; a held-out pipeline of
    the tests and experiments, not an app)."""
    p = kf.Pipeline("cross_entropy_of_labels")
    x = p.input("x", ndim=2, dtype=dtype)
    labels = p.input("labels", shape=(x.shape[0],), dtype="int32")
    top = kf.reduce_max(x, axis=1, name="top")
    total = kf.reduce_sum(kf.exp(x - top.at(0, dims=(0,))), axis=1, name="total")
    picked = x.at(0, 0, index={1: labels})
    p.output(kf.point(top + kf.log(total) - picked, name="loss"))
    return p


def build_gelu_layernorm(dtype: str = "float32") -> kf.Pipeline:
    """A layer norm of a GELU's values (``0.5 x (1 + erf(x / sqrt 2))``), the error function
    the costly part (a held-out pipeline of the tests and experiments, not an app)."""
    p = kf.Pipeline("gelu_layernorm")
    x = p.input("x", ndim=2, dtype=dtype)
    inv_n = p.param("inv_n")
    h = 0.5 * x * (1.0 + kf.erf(x * 0.7071067811865476))
    mean = kf.reduce_sum(h, axis=1, name="mean")
    centred = h - mean.at(0, dims=(0,)) * inv_n
    var = kf.reduce_sum(centred * centred, axis=1, name="var")
    p.output(kf.point(centred * kf.rsqrt(var.at(0, dims=(0,)) * inv_n + 1e-5), name="y"))
    return p


def build_column_softmax(dtype: str = "float32") -> kf.Pipeline:
    """A softmax down the columns and each column's log-sum-exp (a tail; a held-out pipeline
    of the tests and experiments, not an app)."""
    p = kf.Pipeline("column_softmax")
    x = p.input("x", ndim=2, dtype=dtype)
    top = kf.reduce_max(x, axis=0, name="top")
    e = kf.exp(x - top.at(0, dims=(1,)))
    total = kf.reduce_sum(e, axis=0, name="total")
    p.output(kf.point(e / total.at(0, dims=(1,)), name="y"),
             kf.point(top + kf.log(total), name="lse"))
    return p


def build_colstandardise(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Standardise each column (along axis 0): mean, variance of the centred values, map."""
    p = kf.Pipeline("colstandardise")
    x = p.input("x", ndim=2, dtype=dtype)
    inv_n = p.param("inv_n", dtype)
    total = kf.reduce_sum(x, axis=0, name="total")
    centred = x - total.at(0, dims=(1,)) * inv_n
    spread = kf.reduce_sum(centred * centred, axis=0, name="spread")
    y = kf.point(centred * kf.rsqrt(spread.at(0, dims=(1,)) * inv_n + EPS), name="y")
    p.output(y)
    return p


def ref_colstandardise(arrays, params, boundary=None):
    x = as_float64(arrays)["x"]
    centred = x - x.mean(axis=0, keepdims=True)
    return {"y": centred / np.sqrt((centred ** 2).mean(axis=0, keepdims=True) + EPS)}


def build_standardise(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """Statistics then a map: the sum and the sum of squares of a vector (sibling
    reductions: one pass), then ``y = (x - mean) / sqrt(var + eps)``."""
    p = kf.Pipeline("standardise")
    x = p.input("x", ndim=1, dtype=dtype)
    inv_n = p.param("inv_n", dtype)
    total = kf.reduce_sum(x, name="total")
    squares = kf.reduce_sum(x * x, name="squares")
    mean = total.at() * inv_n
    y = kf.point((x - mean) * kf.rsqrt(squares.at() * inv_n - mean * mean + EPS), name="y")
    p.output(y)
    return p


def ref_standardise(arrays, params, boundary=None):
    x = as_float64(arrays)["x"]
    return {"y": (x - x.mean()) / np.sqrt(x.var() + EPS)}


def _app(name: str, title: str, axis: int | None = 1, bench: tuple[int, ...] = BENCH
         ) -> NormApp:
    module = globals()
    build = module[f"build_{name}"]
    ndim = len(bench)
    return NormApp(name=name, title=title, origin=ORIGIN, build=build,
                   reference=module[f"ref_{name}"],
                   make_inputs=_inputs_maker(build, axis, ndim), bench_size=bench,
                   test_size=TEST if ndim == 2 else VECTOR_TEST, ndim=ndim, tolerance=1e-4,
                   axis=axis)


NORM_APPS: tuple[NormApp, ...] = (
    _app("rmsnorm", "RMSNorm over rows"),
    _app("layernorm", "LayerNorm over rows (mean, variance, map)"),
    _app("logsoftmax", "log-softmax over rows of 32 K", axis=None, bench=LONG_ROWS),
    _app("softmax", "softmax over rows of a 128 K vocabulary", axis=None, bench=VOCABULARY_ROWS),
    _app("crossentropy", "cross-entropy per row against target distributions", axis=None),
    _app("logsumexp", "log-sum-exp of each row (a map of its two row results)", axis=None),
    _app("colstandardise", "standardise each column (along axis 0)", axis=0),
    _app("standardise", "standardise a vector: two sums in one pass, then a map", axis=0,
         bench=(2**28,)),
)

__all__ = ["NORM_APPS", "NormApp"]
