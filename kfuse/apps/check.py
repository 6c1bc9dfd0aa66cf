"""Comparing a pipeline's results with a reference (used by the tests and the CLI)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

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


def reference_errors(app: Any, arrays: Mapping[str, Any], params: Mapping[str, Any],
                     outputs: Mapping[str, Any], boundary: object = "clamp"
                     ) -> dict[str, float]:
    """Each output of ``app`` (a :class:`kfuse.apps.App`) by name: its norm-wise relative
    error against the app's float64 reference on ``arrays`` and ``params``. ``boundary`` is
    the stencil apps' border mode (the BLAS apps have none); compare with ``app.tolerance``."""
    reference = app.reference({k: to_numpy(v).astype(np.float64) for k, v in arrays.items()},
                              params, boundary)
    return {name: relative_error(outputs[name], expected)
            for name, expected in reference.items()}
