"""Search strategies: ``search(graph, ...) -> FusionPlan`` behind one interface."""

from __future__ import annotations

from collections.abc import Mapping

from kfuse.errors import KfuseError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
from kfuse.model.device import DeviceProfile, current_profile
from kfuse.model.roofline import nominal_sizes
from kfuse.search.greedy import greedy

STRATEGIES = {"greedy": greedy}
MODELS = ("roofline",)


def search(graph: Graph, strategy: str = "greedy", model: str = "roofline",
           sizes: Mapping[str, int] | None = None,
           profile: DeviceProfile | None = None) -> FusionPlan:
    """A fusion plan for ``graph`` found by ``strategy`` under ``model``.

    ``sizes`` binds the size symbols for prediction (nominal sizes when left out);
    ``profile`` is the device (the calibrated one, else nominal H100 figures).
    """
    if strategy not in STRATEGIES:
        raise KfuseError(f"unknown search strategy {strategy!r}; available: "
                         f"{', '.join(STRATEGIES)}")
    if model not in MODELS:
        raise KfuseError(f"unknown model {model!r}; available: {', '.join(MODELS)}")
    return STRATEGIES[strategy](graph, sizes or nominal_sizes(graph),
                                profile or current_profile())


__all__ = ["MODELS", "STRATEGIES", "search"]
