"""Comparing a pipeline's results with a reference (used by the tests and the CLI)."""

from __future__ import annotations

import math

import numpy as np

from kfuse.runtime.binding import to_numpy


def relative_error(out: object, ref: object) -> float:
    """Norm-wise relative error ``||out - ref|| / ||ref||`` in float64.

    Returns ``inf`` when either side holds a NaN or infinity (so a ``<= tol`` check fails)
    and the absolute error ``||out - ref||`` when ``ref`` is all zeros. Shapes must agree.
    """
    out64 = to_numpy(out).astype(np.float64)
    ref64 = to_numpy(ref).astype(np.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"shapes differ: result {out64.shape}, reference {ref64.shape}")
    if not (np.isfinite(out64).all() and np.isfinite(ref64).all()):
        return math.inf
    scale = float(np.linalg.norm(ref64.ravel()))
    error = float(np.linalg.norm((out64 - ref64).ravel()))
    return error / scale if scale > 0.0 else error
