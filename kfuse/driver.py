"""The stages after the DSL, as a :class:`~kfuse.dsl.pipeline.Pipeline` calls them: fuse its
operators by hand, search a plan, compile it for a backend (and so run it).

The DSL only builds graphs and imports none of the later stages; this module, above them
all, is installed as its driver when kfuse is imported. It also loads :mod:`kfuse.tune`,
so that planning reads the visible GPU's profile and the ``measured`` model is plannable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kfuse.tune  # noqa: F401 - the visible GPU's profile for planning; the measured model
from kfuse.dsl.pipeline import install_driver
from kfuse.fusion.plan import FusionPlan, make_plan
from kfuse.ir.graph import Graph
from kfuse.runtime.compiled import CompiledPipeline
from kfuse.search import plan_for


def fuse(graph: Graph, groups: Sequence[Sequence[str]], forms: Sequence[Any] | None = None
         ) -> FusionPlan:
    """A plan with the given groups of operator names (the others alone), checked; ``forms``
    (one per group, None for the default) say how each is written."""
    chosen = {frozenset(group): form for group, form in zip(groups, forms or (), strict=False)
              if form is not None}
    return make_plan(graph, [list(group) for group in groups], variants=chosen or None)


def plan(graph: Graph, strategy: str, model: str, sizes: Mapping[str, int] | None
         ) -> FusionPlan:
    """The plan the search ``strategy`` finds under ``model`` (:func:`kfuse.search.plan_for`)."""
    return plan_for(graph, strategy, model, sizes)


def compile(graph: Graph | Callable[[], Graph], backend: str, plan: Any,
            **options: Any) -> CompiledPipeline:
    """The pipeline compiled for ``backend`` and ``plan``
    (:class:`~kfuse.runtime.compiled.CompiledPipeline`)."""
    return CompiledPipeline(graph, backend, plan, **options)


def run_on_dask_arrays(pipeline: Any, backend: str, plan: Any,
                       arrays_and_params: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline's outputs over Dask arrays, lazily, chunk by chunk
    (:func:`kfuse.scaleout.dask_arrays.run_on_dask_arrays`)."""
    from kfuse.scaleout.dask_arrays import run_on_dask_arrays as run_chunked
    return run_chunked(pipeline, backend, plan, arrays_and_params)


def slab_reason(graph: Graph, backend: str, arrays_and_params: Mapping[str, Any]
                ) -> str | None:
    """Why a call's host arrays go through the GPU in slabs, or None
    (:func:`kfuse.scaleout.host_slabs.slab_reason`)."""
    from kfuse.scaleout.host_slabs import slab_reason as reason
    return reason(graph, backend, arrays_and_params)


def run_in_slabs(pipeline: Any, backend: str, plan: Any, out: Any,
                 arrays_and_params: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline's outputs for host arrays streamed through the device in slabs
    (:func:`kfuse.scaleout.host_slabs.run_in_slabs`)."""
    from kfuse.scaleout.host_slabs import run_in_slabs as run_slabbed
    return run_slabbed(pipeline, backend=backend, plan=plan, out=out, **arrays_and_params)


install_driver(sys.modules[__name__])
