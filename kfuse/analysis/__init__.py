"""Facts derived from a pipeline's structure that every later stage uses: which kernels lie
on paths between others (convexity)."""

from kfuse.analysis.order import Reachability, iter_bits

__all__ = ["Reachability", "iter_bits"]
