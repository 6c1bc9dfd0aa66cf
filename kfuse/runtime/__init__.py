"""Backends that execute a pipeline: ``cuda`` (GPU), ``cpu`` (host shim), ``numpy`` (truth)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from kfuse.errors import BackendUnavailable, FusionError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
from kfuse.log import LOG
from kfuse.runtime.backend import Backend, CompiledBackend

BACKENDS = ("cuda", "cpu", "numpy")


def _backend_class(name: str) -> type[Backend]:
    if name == "cuda":
        from kfuse.runtime.cuda_backend import CudaBackend
        return CudaBackend
    if name == "cpu":
        from kfuse.runtime.cpu_backend import CpuBackend
        return CpuBackend
    from kfuse.runtime.numpy_backend import NumpyBackend
    return NumpyBackend


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name``; ``auto`` picks cuda if a GPU is usable, else cpu."""
    if name == "auto":
        passed = []
        for candidate in BACKENDS:
            backend_class = _backend_class(candidate)
            reason = backend_class.unavailable_reason()
            if reason is None:
                if passed:
                    LOG.log(logging.WARNING if gpu_present() and "cuda" in dict(passed)
                            else logging.INFO, "backend 'auto' runs on '%s': %s", candidate,
                            "; ".join(f"'{name}' cannot run ({why})" for name, why in passed))
                return backend_class()
            passed.append((candidate, reason))
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    backend_class = _backend_class(name)
    reason = backend_class.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"backend '{name}' cannot run: {reason}")
    return backend_class()


def gpu_present() -> bool:
    """Whether this machine seems to have an NVIDIA GPU (its driver's device files), whether
    or not CuPy can use it."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def compiles_for_sizes(name: str) -> bool:
    """Whether the backend called ``name`` compiles each program for the sizes it runs at
    (:mod:`kfuse.codegen.specialise`)."""
    backend_class = _backend_class(name)
    return issubclass(backend_class, CompiledBackend) and backend_class.compiles_for_sizes()


def check_plan_argument(plan: Any) -> None:
    """Refuse a ``plan=`` that is none of ``"auto"``, ``"unfused"``, None or a FusionPlan."""
    if not (plan is None or isinstance(plan, FusionPlan)
            or isinstance(plan, str) and plan in ("auto", "unfused")):
        raise FusionError(f"plan must be 'auto', 'unfused', None or a FusionPlan (from "
                          f"pipeline.plan() or pipeline.fuse()), got {plan!r}")


def auto_plan(graph: Graph, given: Mapping[str, Any]) -> FusionPlan:
    """The plan ``plan="auto"`` runs for the given arrays (their sizes bound)."""
    from kfuse.runtime.binding import bind

    return planned(graph, bind(graph, given).sizes, "auto", "cuda")


def planned(graph: Graph, sizes: Mapping[str, int], plan: Any, backend: str,
            on_search: Any = None) -> FusionPlan:
    """The plan to generate for ``graph`` at ``sizes``: for ``"auto"``
    :func:`kfuse.search.default_plan` (searched once per graph and sizes; ``on_search()`` is
    called when it is searched); a plan made from an earlier build of the pipeline
    re-checked against this graph."""
    if isinstance(plan, str):
        from kfuse.search import default_plan

        fill_device = backend == "cuda"  # (the GPU's plans fill it; the cpu backend runs
        # the default tiles, which the tests then cover)

        def search() -> FusionPlan:
            if on_search is not None:
                on_search()
            return default_plan(graph, sizes, fill_device=fill_device)
        return graph.remembered(("auto plan", fill_device, tuple(sorted(sizes.items()))),
                                search)
    if plan.graph is graph:
        return plan
    return _rechecked_plan(graph, sizes if compiles_for_sizes(backend) else None, plan)


def _rechecked_plan(graph: Graph, sizes: Mapping[str, int] | None, plan: FusionPlan
                    ) -> FusionPlan:
    """A plan made from an earlier build of the pipeline, re-checked against this graph
    (once per graph, plan and sizes). Variants carry over: a row reduction's epilogue is
    legal only under one; the kernels' resources are checked as the backend compiles them,
    for these sizes or any."""
    from kfuse.fusion.plan import make_plan
    variants = {frozenset(g.members): g.variant for g in plan.groups}

    def recheck() -> tuple[FusionPlan, FusionPlan]:  # (the plan kept: its id stays its own)
        checked = make_plan(
            graph, [list(g.members) for g in plan.groups], strategy=plan.strategy,
            model=plan.model, predicted_time_s=plan.predicted_time_s,
            unfused_predicted_time_s=plan.unfused_predicted_time_s, variants=variants,
            sizes=sizes)
        for fusion in plan.side_by_side:
            checked = checked.run_side_by_side(
                *(plan.groups[i].members[0] for i in fusion.parts), threads=fusion.threads,
                least_blocks=fusion.least_blocks, reason=fusion.reason)
        return plan, checked
    key = ("rechecked plan", id(plan), tuple(sorted((sizes or {}).items())))
    return graph.remembered(key, recheck)[1]


__all__ = ["BACKENDS", "Backend", "auto_plan", "check_plan_argument", "compiles_for_sizes",
           "get_backend", "planned"]
