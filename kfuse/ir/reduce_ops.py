"""What a reduction starts from and how generated code names its operation."""

from __future__ import annotations

from kfuse.ir.expr import INT_RANGES, format_value

# The operation codes of the prelude's reduction templates (kf_block_reduce<OP, T>, ...)
REDUCE_OP_CODE = {"sum": 0, "min": 1, "max": 2}


def identity_value(op: str, dtype: str) -> float:
    """The value a reduction output starts from."""
    if op == "sum":
        return 0
    if dtype in INT_RANGES:
        low, high = INT_RANGES[dtype]
        return high if op == "min" else low
    return float("inf") if op == "min" else float("-inf")


def identity_text(op: str, dtype: str) -> str:
    if dtype in ("int32", "int64") and op != "sum":
        prefix = "KF_INT" if dtype == "int32" else "KF_LONG"
        return f"{prefix}_MAX" if op == "min" else f"{prefix}_MIN"
    return format_value(identity_value(op, dtype), dtype)
