"""Accuracy of kfuse's float32 division, square root, exp and pow on the GPU, in ulp.

Generated kernels compute float32 ``a / b`` with ``div.full.f32``, ``sqrt`` with
``sqrt.approx.f32``, ``exp`` with CUDA's ``expf`` and ``pow`` as ``exp2(y lg2.approx|x|)``
(see kfuse.codegen.prelude). This script measures the largest error of each against a
float64 NumPy reference over random operands spread across many binades (exp over its
whole normal range), on the backend given (``cuda`` on a GPU), and exits with status 1 when
one exceeds its bound: division 2 ulp and square root 1 ulp of the correctly rounded result
(so 2.5 and 1.5 ulp of the exact value), exp 2 ulp (CUDA's, so 2.5), pow a relative error
of (2 + |y log2 x| + |y|) float32 ulp at 1 (2^-23; the |y| term is lg2.approx's absolute
error, which dominates where log2 x is near 0), and a log that only feeds an exp (a
geometric mean of 9 values, exp(sum log x_i / 9)) the accurate path's error (exp's 2.5 ulp,
the sum's rounding) plus the mean over i of 2^-21.41 + 3 ulp of log x_i.

Usage: PYTHONPATH=. python3 benchmarks/fp32_math_check.py [--backend cuda] [--count N]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import kfuse as kf
from kfuse.runtime.binding import to_numpy


def ulp_error(result: np.ndarray, exact: np.ndarray) -> float:
    """Largest |result - exact| in units of the float32 spacing at the exact value."""
    exact32 = exact.astype(np.float32)
    spacing = np.spacing(np.abs(exact32)).astype(np.float64)
    finite = np.isfinite(exact) & (exact32 != 0)
    return float(np.max(np.abs(result[finite].astype(np.float64) - exact[finite])
                        / spacing[finite]))


def spread(rng: np.random.Generator, count: int, low: float, high: float) -> np.ndarray:
    """Positive float32 values log-uniform over [2**low, 2**high)."""
    return np.exp2(rng.uniform(low, high, count)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--count", type=int, default=1 << 22)
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    a = spread(rng, args.count, -60, 60) * rng.choice([-1, 1], args.count).astype(np.float32)
    b = spread(rng, args.count, -60, 60)
    x = spread(rng, args.count, -15, 15)
    e = rng.uniform(-87.0, 88.0, args.count).astype(np.float32)  # exp(e) normal
    exponents = (0.6, -2.5, 7.3)  # 2^(15 * 7.3) stays finite

    p = kf.Pipeline("fp32_math")
    pa, pb, px, pe = (p.input(n, ndim=1) for n in ("a", "b", "x", "e"))
    ys = [p.param(f"y{k}") for k in range(len(exponents))]
    p.output(kf.point(pa / pb, name="quotient"))
    p.output(kf.point(kf.sqrt(pb), name="root"))
    p.output(kf.point(kf.exp(pe), name="exponential"))
    p.output(kf.local(kf.exp(sum(kf.log(pb.at(k)) for k in range(9)) * (1.0 / 9.0)),
                      boundary="clamp", name="geomean"))
    for k, y in enumerate(ys):
        p.output(kf.point(kf.pow(px, y), name=f"power{k}"))
    out = p.run(backend=args.backend, plan="unfused", a=a, b=b, x=x, e=e,
                **{f"y{k}": value for k, value in enumerate(exponents)})
    out = {name: to_numpy(value) for name, value in out.items()}
    a64, b64, x64, e64 = (v.astype(np.float64) for v in (a, b, x, e))
    logs = np.log(np.stack([np.roll(b64, -k) for k in range(9)]))[:, :-8]
    geomean_bound = 2.0**-23 * (2.5 + 9 + np.abs(logs).sum(axis=0) / 9) + (
        2.0**-21.41 + 3 * 2.0**-23 * np.abs(logs)).mean(axis=0)
    # (name, result, exact, bound in ulp of the exact value, bound on the relative error)
    rows = [("a / b  (div.full.f32)", out["quotient"], a64 / b64, 2.5, None),
            ("sqrt   (sqrt.approx.f32)", out["root"], np.sqrt(b64), 1.5, None),
            ("exp    (expf)", out["exponential"], np.exp(e64), 2.5, None)]
    largest_log2 = float(np.max(np.abs(np.log2(x64))))
    rows += [(f"pow(x, {y}) (exp2(y lg2.approx x))", out[f"power{k}"],
              x64 ** np.float64(np.float32(y)), None,
              2.0**-23 * (2 + abs(y) * largest_log2 + abs(y))) for k, y in enumerate(exponents)]
    rows.append(("geomean (log in exp: lg2.approx)", out["geomean"][:-8],
                 np.exp(logs.mean(axis=0)), None, geomean_bound))
    print(f"{args.count} random operands on {args.backend}; error against float64")
    failed = False
    for name, result, exact, ulp_bound, relative_bound in rows:
        ulp = ulp_error(result, exact)
        relative_errors = np.abs(result - exact) / np.abs(exact)
        relative = float(np.max(relative_errors))
        within = ((ulp_bound is None or ulp <= ulp_bound)
                  and (relative_bound is None or bool(np.all(relative_errors <= relative_bound))))
        failed |= not within
        bound = f"<= {ulp_bound} ulp" if ulp_bound is not None \
            else f"<= {np.max(relative_bound):.1e}"
        print(f"  {name:36s} max {ulp:5.2f} ulp  max relative {relative:.2e}  "
              f"({'within' if within else 'EXCEEDS'} {bound})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
