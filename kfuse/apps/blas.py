"""The eleven BLAS-1/2 sequences of Filipovič et al. 2015 (Table 1, from BTO BLAS), each with a float64
NumPy reference.

Vectors have ``n`` elements; matrices are row-major ``M x N`` (any sizes, no padding).
Sequence apps take ``size = (n,)`` (vector sequences) or ``(M, N)`` (matrix sequences), as
``App.make_inputs`` and ``kfuse run --size`` do. Inputs are uniform in ``[0.1, 1.1)`` (no
cancellation in the reductions, so a relative error measures the code, not the data).

| app      | operations                                               | Filipovič et al. 2015 tags |
|----------|----------------------------------------------------------|---------------|
| axpydot  | z = w - alpha v; r = zᵀ u                                 | F S           |
| atax     | y = Aᵀ (A x)                                              | -             |
| bicgk    | q = A p; s = Aᵀ r                                         | F             |
| sgemv    | z = alpha A x + beta y                                    | B             |
| sgemvt   | x = beta Aᵀ y + z; w = alpha A x                          | (S)           |
| sscal    | x = alpha x (out of place: ``sx``)                        | B             |
| gemver   | B = A + u1 v1ᵀ + u2 v2ᵀ; x = beta Bᵀ y + z; w = alpha B x | F S           |
| gesummv  | y = alpha A x + beta B x                                  | (F)           |
| madd     | C = A + B                                                 | S             |
| vadd     | x = w + y + z                                             | F S           |
| waxpby   | w = alpha x + beta y                                      | F             |

``BlasApp`` adds what the benchmarks report: the DRAM words and flops of Filipovič et al. 2015's
counting convention (notes §6.3), the tolerance of the checks (reductions 1e-4) and the
planner (the implementation space of :mod:`kfuse.search.variants`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

import kfuse.dsl as kf
from kfuse.apps.base import App, check_size
from kfuse.runtime.numpy_backend import numpy_dtype

ORIGIN = "Filipovič et al. 2015, Table 1; sequences from BTO BLAS"
VECTOR_BENCH = (2**27,)
VECTOR_BENCH_SIZES = ((2**26,), (2**27,), (2**28,))
MATRIX_BENCH = (16384, 16384)
VECTOR_TEST = (4099,)          # odd, not a multiple of 32
MATRIX_TEST = (75, 133)        # non-square, neither a multiple of 32
LOW, HIGH = 0.1, 1.1


@dataclass(frozen=True)
class BlasApp(App):
    """A BLAS sequence: an :class:`App` plus Filipovič et al. 2015's traffic and flop counts."""

    operations: str = ""
    tags: str = ""
    words: Callable[[tuple[int, ...]], int] | None = None   # fused DRAM words (Table 3)
    flops: Callable[[tuple[int, ...]], int] | None = None
    family: str = "blas"

    @property
    def size_form(self) -> str:
        """What a size of this sequence looks like (``n`` or ``M x N``)."""
        return size_form(self.ndim)

    def sizes(self, graph: Any, size: tuple[int, ...]) -> dict[str, int]:
        """Size symbols of the app's graph from its ``size`` (``(n,)`` or ``(M, N)``)."""
        return bind_sizes(graph, self.check_size(size))

    def planner(self, graph: Any, sizes: Mapping[str, int], profile: Any = None) -> Any:
        """The predicted-best combination of fusions and implementations (Filipovič et al. 2015 §4)."""
        from kfuse.search.variants import best_plan
        return best_plan(graph, sizes, profile)


def bind_sizes(graph: Any, size: tuple[int, ...]) -> dict[str, int]:
    """Bind every size symbol from one size tuple: the inputs of ``len(size)`` axes take it."""
    shapes = {}
    symbols: dict[str, int] = {}
    for name in graph.inputs:
        shape = graph.buffers[name].shape
        if len(shape) == len(size):
            for symbol, value in zip(shape, size, strict=True):
                symbols.setdefault(symbol, int(value))
    for name in graph.inputs:
        shapes[name] = graph.shape_of(name, symbols)
    return graph.bind_shapes(shapes)


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.uniform(LOW, HIGH, size=shape).astype(numpy_dtype(dtype))


def _f64(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.asarray(value, dtype=np.float64) for name, value in arrays.items()}


PARAMS = {"alpha": 1.5, "beta": 0.75}  # the sequences' scalars, unless an app says otherwise


def size_form(ndim: int) -> str:
    """What the size of a sequence of ``ndim``-D main operands looks like."""
    return "a matrix sequence takes a size M x N" if ndim == 2 else \
        "a vector sequence takes a size n"


def _inputs_maker(build: Callable[..., kf.Pipeline], ndim: int,
                  params: Mapping[str, float]) -> Callable[..., tuple[dict, dict]]:
    """``make_inputs`` of a sequence: every input uniform in [LOW, HIGH), its shape bound
    from ``size`` (``(n,)`` or ``(M, N)``), and the pipeline's scalars from ``params``."""

    def make_inputs(size: tuple[int, ...], rng: np.random.Generator, dtype: str = "float32"
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        graph = build(dtype).graph()
        sizes = bind_sizes(graph, check_size(size, ndim, size_form(ndim)))
        arrays = {name: _uniform(rng, graph.shape_of(name, sizes), dtype)
                  for name in graph.inputs}
        return arrays, {name: params[name] for name in graph.params}

    return make_inputs


# ---------------------------------------------------------------------------------------------
# The sequences
# ---------------------------------------------------------------------------------------------

def build_axpydot(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """z = w - alpha v; r = zᵀ u."""
    p = kf.Pipeline("axpydot")
    w = p.input("w", ndim=1, dtype=dtype)
    v = p.input("v", shape=w.shape, dtype=dtype)
    u = p.input("u", shape=w.shape, dtype=dtype)
    alpha = p.param("alpha", dtype)
    z = kf.axpy(-alpha, v, w, name="z")
    r = kf.dot(z, u, name="r")
    p.output(z, r)
    return p


def ref_axpydot(arrays, params, boundary=None):
    a = _f64(arrays)
    z = a["w"] - params["alpha"] * a["v"]
    return {"z": z, "r": np.asarray(z @ a["u"])}



def build_atax(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """y = Aᵀ (A x): ``Aᵀ`` needs each row's completed ``A x`` (rule F2 keeps them apart);
    a block holding each whole row (held rows) has it, and reads A once."""
    p = kf.Pipeline("atax")
    a = p.input("A", ndim=2, dtype=dtype)
    x = p.input("x", shape=(a.shape[1],), dtype=dtype)
    t = kf.matvec(a, x, name="t")
    y = kf.matvec_t(a, t, name="y")
    p.output(y)
    return p


def ref_atax(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"y": a["A"].T @ (a["A"] @ a["x"])}



def build_bicgk(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """q = A p; s = Aᵀ r: two reductions sharing A, fused they read A once."""
    p = kf.Pipeline("bicgk")
    a = p.input("A", ndim=2, dtype=dtype)
    pv = p.input("p", shape=(a.shape[1],), dtype=dtype)
    r = p.input("r", shape=(a.shape[0],), dtype=dtype)
    q = kf.matvec(a, pv, name="q")
    s = kf.matvec_t(a, r, name="s")
    p.output(q, s)
    return p


def ref_bicgk(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"q": a["A"] @ a["p"], "s": a["A"].T @ a["r"]}



def build_sgemv(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """z = alpha A x + beta y."""
    p = kf.Pipeline("sgemv")
    a = p.input("A", ndim=2, dtype=dtype)
    x = p.input("x", shape=(a.shape[1],), dtype=dtype)
    y = p.input("y", shape=(a.shape[0],), dtype=dtype)
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    z = kf.gemv(a, x, alpha, beta, y, name="z")
    p.output(z)
    return p


def ref_sgemv(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"z": params["alpha"] * (a["A"] @ a["x"]) + params["beta"] * a["y"]}



def build_sgemvt(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """x = beta Aᵀ y + z; w = alpha A x (needs the completed x: two passes over A)."""
    p = kf.Pipeline("sgemvt")
    a = p.input("A", ndim=2, dtype=dtype)
    y = p.input("y", shape=(a.shape[0],), dtype=dtype)
    z = p.input("z", shape=(a.shape[1],), dtype=dtype)
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    x = kf.gemv(a, y, beta, None, z, trans=True, name="x")
    w = kf.gemv(a, x, alpha, name="w")
    p.output(x, w)
    return p


def ref_sgemvt(arrays, params, boundary=None):
    a = _f64(arrays)
    x = params["beta"] * (a["A"].T @ a["y"]) + a["z"]
    return {"x": x, "w": params["alpha"] * (a["A"] @ x)}



def build_sscal(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """sx = alpha x."""
    p = kf.Pipeline("sscal")
    x = p.input("x", ndim=1, dtype=dtype)
    alpha = p.param("alpha", dtype)
    p.output(kf.scal(alpha, x, name="sx"))
    return p


def ref_sscal(arrays, params, boundary=None):
    return {"sx": params["alpha"] * _f64(arrays)["x"]}



def build_gemver(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """B = A + u1 v1ᵀ + u2 v2ᵀ; x = beta Bᵀ y + z; w = alpha B x."""
    p = kf.Pipeline("gemver")
    a = p.input("A", ndim=2, dtype=dtype)
    rows, cols = (a.shape[0],), (a.shape[1],)
    u1, u2 = p.input("u1", shape=rows, dtype=dtype), p.input("u2", shape=rows, dtype=dtype)
    v1, v2 = p.input("v1", shape=cols, dtype=dtype), p.input("v2", shape=cols, dtype=dtype)
    y = p.input("y", shape=rows, dtype=dtype)
    z = p.input("z", shape=cols, dtype=dtype)
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    b = kf.point(a + kf.outer(u1, v1) + kf.outer(u2, v2), name="B")
    x = kf.gemv(b, y, beta, None, z, trans=True, name="x")
    w = kf.gemv(b, x, alpha, name="w")
    p.output(b, x, w)
    return p


def ref_gemver(arrays, params, boundary=None):
    a = _f64(arrays)
    b = a["A"] + np.outer(a["u1"], a["v1"]) + np.outer(a["u2"], a["v2"])
    x = params["beta"] * (b.T @ a["y"]) + a["z"]
    return {"B": b, "x": x, "w": params["alpha"] * (b @ x)}



def build_gesummv(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """y = alpha A x + beta B x: two reductions sharing x, then their sum."""
    p = kf.Pipeline("gesummv")
    a = p.input("A", ndim=2, dtype=dtype)
    b = p.input("B", shape=a.shape, dtype=dtype)
    x = p.input("x", shape=(a.shape[1],), dtype=dtype)
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    ax = kf.gemv(a, x, alpha, name="Ax")
    bx = kf.gemv(b, x, beta, name="Bx")
    y = kf.point(ax + bx, name="y")
    p.output(y)
    return p


def ref_gesummv(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"y": params["alpha"] * (a["A"] @ a["x"]) + params["beta"] * (a["B"] @ a["x"])}



def build_madd(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """C = A + B."""
    p = kf.Pipeline("madd")
    a = p.input("A", ndim=2, dtype=dtype)
    b = p.input("B", shape=a.shape, dtype=dtype)
    p.output(kf.geam(1.0, a, 1.0, b, name="C"))
    return p


def ref_madd(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"C": a["A"] + a["B"]}



def build_vadd(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """x = w + y + z (BLAS: a copy and two axpys)."""
    p = kf.Pipeline("vadd")
    w = p.input("w", ndim=1, dtype=dtype)
    y = p.input("y", shape=w.shape, dtype=dtype)
    z = p.input("z", shape=w.shape, dtype=dtype)
    wy = kf.axpy(1.0, y, w, name="wy")
    x = kf.axpy(1.0, z, wy, name="x")
    p.output(x)
    return p


def ref_vadd(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"x": a["w"] + a["y"] + a["z"]}



def build_waxpby(dtype: str = "float32", boundary: object = None) -> kf.Pipeline:
    """w = alpha x + beta y (BLAS: a copy, a scal and an axpy)."""
    p = kf.Pipeline("waxpby")
    x = p.input("x", ndim=1, dtype=dtype)
    y = p.input("y", shape=x.shape, dtype=dtype)
    alpha, beta = p.param("alpha", dtype), p.param("beta", dtype)
    by = kf.scal(beta, y, name="by")
    w = kf.axpy(alpha, x, by, name="w")
    p.output(w)
    return p


def ref_waxpby(arrays, params, boundary=None):
    a = _f64(arrays)
    return {"w": params["alpha"] * a["x"] + params["beta"] * a["y"]}



# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

def _mn(size: tuple[int, ...]) -> int:
    return prod(size)


def _app(name: str, operations: str, tags: str, words: int, flops: int, *,
         matrix: bool, reduces: bool, params: Mapping[str, float] = PARAMS) -> BlasApp:
    module = globals()
    return BlasApp(
        name=name,
        title=f"{name.upper()}: {operations}",
        origin=ORIGIN,
        build=module[f"build_{name}"],
        reference=module[f"ref_{name}"],
        make_inputs=_inputs_maker(module[f"build_{name}"], 2 if matrix else 1, params),
        bench_size=MATRIX_BENCH if matrix else VECTOR_BENCH,
        test_size=MATRIX_TEST if matrix else VECTOR_TEST,
        ndim=2 if matrix else 1,
        operations=operations,
        tags=tags,
        words=lambda size, k=words: k * _mn(size),
        flops=lambda size, k=flops: k * _mn(size),
        tolerance=1e-4 if reduces else 1e-5,
    )


BLAS_APPS: tuple[BlasApp, ...] = (
    _app("axpydot", "z = w - alpha v; r = z^T u", "FS", 4, 4, matrix=False, reduces=True,
         params={"alpha": 0.5}),  # w - alpha v stays away from cancellation
    _app("atax", "y = A^T (A x)", "", 2, 4, matrix=True, reduces=True),
    _app("bicgk", "q = A p; s = A^T r", "F", 1, 4, matrix=True, reduces=True),
    _app("sgemv", "z = alpha A x + beta y", "B", 1, 2, matrix=True, reduces=True),
    _app("sgemvt", "x = beta A^T y + z; w = alpha A x", "(S)", 2, 4, matrix=True,
         reduces=True),
    _app("sscal", "x = alpha x", "B", 2, 1, matrix=False, reduces=False),
    _app("gemver", "B = A + u1 v1^T + u2 v2^T; x = beta B^T y + z; w = alpha B x", "FS", 3, 7,
         matrix=True, reduces=True),
    _app("gesummv", "y = alpha A x + beta B x", "(F)", 2, 4, matrix=True, reduces=True),
    _app("madd", "C = A + B", "S", 3, 1, matrix=True, reduces=False),
    _app("vadd", "x = w + y + z", "FS", 4, 2, matrix=False, reduces=False),
    _app("waxpby", "w = alpha x + beta y", "F", 3, 3, matrix=False, reduces=False),
)

__all__ = ["BLAS_APPS", "BlasApp", "VECTOR_BENCH_SIZES", "bind_sizes"]
