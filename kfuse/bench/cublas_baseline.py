"""cuBLAS baselines: each BLAS sequence of Filipovič et al. 2015 as the cuBLAS calls one would write.

The calls go through CuPy's thin cuBLAS bindings (``cupy_backends.cuda.libs.cublas``) on
the current stream, in the BLAS style of the paper: in-place ``axpy``/``scal``/``ger`` and
``gemv`` with ``beta`` accumulate into an output that a device-to-device copy first fills
(the *S* tag of Filipovič et al. 2015 Table 1: the copies are the price of the in-place API); ``MADD`` is
one out-of-place ``geam`` (notes §8). Row-major matrices are handed to cuBLAS as their
column-major transposes (``A x`` is ``gemv`` with ``OP_T``, ``lda = N``).

``prepare(name, arrays, params)`` allocates the outputs once and returns a
:class:`CublasSequence` whose ``run()`` enqueues the whole sequence (what the harness times)
and whose ``outputs`` hold the results of the last run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfuse.errors import BackendUnavailable

OP_N, OP_T = 0, 1
POINTER_HOST, POINTER_DEVICE = 0, 1


@dataclass
class CublasSequence:
    """A prepared call sequence: ``run()`` enqueues it; ``outputs`` hold its results."""

    name: str
    run: Callable[[], None]
    outputs: dict[str, Any]
    calls: list[str] = field(default_factory=list)  # the sequence, for reports

    def describe(self) -> str:
        return "; ".join(self.calls)


class _Blas:
    """Row-major BLAS on CuPy arrays through cuBLAS (float32 's' or float64 'd' routines)."""

    def __init__(self, dtype: np.dtype):
        try:
            import cupy
            from cupy_backends.cuda.libs import cublas
        except ImportError as error:  # pragma: no cover - depends on the machine
            raise BackendUnavailable("the cuBLAS baseline needs CuPy") from error
        self.cupy = cupy
        self.lib = cublas
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise BackendUnavailable(f"cuBLAS sequences take float32 or float64, not {dtype}")
        self.prefix = "s" if self.dtype == np.float32 else "d"
        self.handle = cupy.cuda.device.get_cublas_handle()
        self.scalars: list[np.ndarray] = []  # host scalars stay alive while calls run
        self.calls: list[str] = []

    def _fn(self, name: str) -> Callable[..., Any]:
        return getattr(self.lib, self.prefix + name)

    def _scalar(self, value: float) -> int:
        holder = np.array(value, dtype=self.dtype)
        self.scalars.append(holder)
        return holder.ctypes.data

    def _host_mode(self) -> None:
        self.lib.setPointerMode(self.handle, POINTER_HOST)

    # -- the routines (each returns a closure enqueuing one call) ----------------------------
    def copy(self, source: Any, target: Any) -> Callable[[], None]:
        self.calls.append("copy")
        nbytes = int(source.nbytes)
        return lambda: target.data.copy_from_device_async(source.data, nbytes)

    def axpy(self, alpha: float, x: Any, y: Any) -> Callable[[], None]:
        self.calls.append("axpy")
        a, fn = self._scalar(alpha), self._fn("axpy")

        def call() -> None:
            self._host_mode()
            fn(self.handle, x.size, a, x.data.ptr, 1, y.data.ptr, 1)
        return call

    def scal(self, alpha: float, x: Any) -> Callable[[], None]:
        self.calls.append("scal")
        a, fn = self._scalar(alpha), self._fn("scal")

        def call() -> None:
            self._host_mode()
            fn(self.handle, x.size, a, x.data.ptr, 1)
        return call

    def dot(self, x: Any, y: Any, out: Any) -> Callable[[], None]:
        self.calls.append("dot")
        fn = self._fn("dot")

        def call() -> None:
            self.lib.setPointerMode(self.handle, POINTER_DEVICE)  # the result stays on device
            try:
                fn(self.handle, x.size, x.data.ptr, 1, y.data.ptr, 1, out.data.ptr)
            finally:
                self._host_mode()
        return call

    def gemv(self, alpha: float, a: Any, x: Any, beta: float, y: Any, *, trans: bool = False
             ) -> Callable[[], None]:
        """``y = alpha A x + beta y`` (``trans``: ``Aᵀ x``) for row-major ``A`` (M x N)."""
        self.calls.append("gemv_t" if trans else "gemv")
        rows, cols = a.shape
        al, be, fn = self._scalar(alpha), self._scalar(beta), self._fn("gemv")
        op = OP_N if trans else OP_T  # row-major A is the column-major Aᵀ (N x M)

        def call() -> None:
            self._host_mode()
            fn(self.handle, op, cols, rows, al, a.data.ptr, cols, x.data.ptr, 1, be,
               y.data.ptr, 1)
        return call

    def ger(self, alpha: float, u: Any, v: Any, a: Any) -> Callable[[], None]:
        """``A += alpha u vᵀ`` for row-major ``A`` (column-major: ``Aᵀ += alpha v uᵀ``)."""
        self.calls.append("ger")
        rows, cols = a.shape
        al, fn = self._scalar(alpha), self._fn("ger")

        def call() -> None:
            self._host_mode()
            fn(self.handle, cols, rows, al, v.data.ptr, 1, u.data.ptr, 1, a.data.ptr, cols)
        return call

    def geam(self, alpha: float, a: Any, beta: float, b: Any, c: Any) -> Callable[[], None]:
        """``C = alpha A + beta B`` (out of place)."""
        self.calls.append("geam")
        rows, cols = a.shape
        al, be, fn = self._scalar(alpha), self._scalar(beta), self._fn("geam")

        def call() -> None:
            self._host_mode()
            fn(self.handle, OP_N, OP_N, cols, rows, al, a.data.ptr, cols, be, b.data.ptr,
               cols, c.data.ptr, cols)
        return call


def _sequence(name: str, blas: _Blas, steps: list[Callable[[], None]],
              outputs: dict[str, Any]) -> CublasSequence:
    def run() -> None:
        for step in steps:
            step()
    return CublasSequence(name, run, outputs, list(blas.calls))


def _axpydot(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    xp = blas.cupy
    z, r = xp.empty_like(a["w"]), xp.empty((), blas.dtype)
    steps = [blas.copy(a["w"], z), blas.axpy(-p["alpha"], a["v"], z), blas.dot(z, a["u"], r)]
    return _sequence("axpydot", blas, steps, {"z": z, "r": r})


def _atax(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    xp = blas.cupy
    t = xp.empty(a["A"].shape[0], blas.dtype)
    y = xp.empty(a["A"].shape[1], blas.dtype)
    steps = [blas.gemv(1.0, a["A"], a["x"], 0.0, t),
             blas.gemv(1.0, a["A"], t, 0.0, y, trans=True)]
    return _sequence("atax", blas, steps, {"y": y})


def _bicgk(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    xp = blas.cupy
    q = xp.empty(a["A"].shape[0], blas.dtype)
    s = xp.empty(a["A"].shape[1], blas.dtype)
    steps = [blas.gemv(1.0, a["A"], a["p"], 0.0, q),
             blas.gemv(1.0, a["A"], a["r"], 0.0, s, trans=True)]
    return _sequence("bicgk", blas, steps, {"q": q, "s": s})


def _sgemv(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    z = blas.cupy.empty_like(a["y"])
    steps = [blas.copy(a["y"], z), blas.gemv(p["alpha"], a["A"], a["x"], p["beta"], z)]
    return _sequence("sgemv", blas, steps, {"z": z})


def _sgemvt(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    xp = blas.cupy
    x = xp.empty_like(a["z"])
    w = xp.empty(a["A"].shape[0], blas.dtype)
    steps = [blas.copy(a["z"], x), blas.gemv(p["beta"], a["A"], a["y"], 1.0, x, trans=True),
             blas.gemv(p["alpha"], a["A"], x, 0.0, w)]
    return _sequence("sgemvt", blas, steps, {"x": x, "w": w})


def _sscal(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    # In place, as BLAS scal is (Filipovič et al. 2015 tags SSCAL 'B'): a scratch copy made once, outside
    # the timed sequence; after the first run it holds alpha x.
    sx = a["x"].copy()
    steps = [blas.scal(p["alpha"], sx)]
    return _sequence("sscal", blas, steps, {"sx": sx})


def _gemver(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    xp = blas.cupy
    b = xp.empty_like(a["A"])
    x = xp.empty_like(a["z"])
    w = xp.empty(a["A"].shape[0], blas.dtype)
    steps = [blas.copy(a["A"], b), blas.ger(1.0, a["u1"], a["v1"], b),
             blas.ger(1.0, a["u2"], a["v2"], b), blas.copy(a["z"], x),
             blas.gemv(p["beta"], b, a["y"], 1.0, x, trans=True),
             blas.gemv(p["alpha"], b, x, 0.0, w)]
    return _sequence("gemver", blas, steps, {"B": b, "x": x, "w": w})


def _gesummv(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    y = blas.cupy.empty(a["A"].shape[0], blas.dtype)
    steps = [blas.gemv(p["alpha"], a["A"], a["x"], 0.0, y),
             blas.gemv(p["beta"], a["B"], a["x"], 1.0, y)]
    return _sequence("gesummv", blas, steps, {"y": y})


def _madd(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    c = blas.cupy.empty_like(a["A"])
    steps = [blas.geam(1.0, a["A"], 1.0, a["B"], c)]
    return _sequence("madd", blas, steps, {"C": c})


def _vadd(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    x = blas.cupy.empty_like(a["w"])
    steps = [blas.copy(a["w"], x), blas.axpy(1.0, a["y"], x), blas.axpy(1.0, a["z"], x)]
    return _sequence("vadd", blas, steps, {"x": x})


def _waxpby(blas: _Blas, a: Mapping[str, Any], p: Mapping[str, float]) -> CublasSequence:
    w = blas.cupy.empty_like(a["y"])
    steps = [blas.copy(a["y"], w), blas.scal(p["beta"], w), blas.axpy(p["alpha"], a["x"], w)]
    return _sequence("waxpby", blas, steps, {"w": w})


SEQUENCES: dict[str, Callable[[_Blas, Mapping[str, Any], Mapping[str, float]],
                              CublasSequence]] = {
    "axpydot": _axpydot, "atax": _atax, "bicgk": _bicgk, "sgemv": _sgemv, "sgemvt": _sgemvt,
    "sscal": _sscal, "gemver": _gemver, "gesummv": _gesummv, "madd": _madd, "vadd": _vadd,
    "waxpby": _waxpby,
}


def has_sequence(name: str) -> bool:
    """True if the app called ``name`` has a cuBLAS call sequence."""
    return name in SEQUENCES


def prepare(name: str, arrays: Mapping[str, Any], params: Mapping[str, float]
            ) -> CublasSequence:
    """The cuBLAS sequence of app ``name`` on CuPy ``arrays`` (outputs allocated here)."""
    if name not in SEQUENCES:
        raise BackendUnavailable(f"no cuBLAS sequence for '{name}'; there are sequences for "
                                 f"{', '.join(SEQUENCES)}")
    dtype = next(iter(arrays.values())).dtype
    return SEQUENCES[name](_Blas(dtype), arrays, params)


__all__ = ["SEQUENCES", "CublasSequence", "has_sequence", "prepare"]
