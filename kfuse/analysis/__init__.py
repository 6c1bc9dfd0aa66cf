"""Facts derived from a pipeline's structure that every later stage uses: which kernels lie
on paths between others (convexity), which may run at once (levels), and how much
arithmetic an operator does (:mod:`kfuse.analysis.operations`)."""

from kfuse.analysis.order import Reachability, independent_sets, iter_bits

__all__ = ["Reachability", "independent_sets", "iter_bits"]
