"""Backends that execute a pipeline: ``cuda`` (GPU), ``cpu`` (host shim), ``numpy`` (truth)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kfuse.errors import BackendUnavailable, FusionError
from kfuse.fusion.plan import FusionPlan
from kfuse.ir.graph import Graph
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
        for candidate in BACKENDS:
            if _backend_class(candidate).available():
                return _backend_class(candidate)()
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    backend_class = _backend_class(name)
    if not backend_class.available():
        reason = {"cuda": "no GPU with CuPy is usable here",
                  "cpu": "no host C++ compiler (g++ or $CXX) was found"}[name]
        raise BackendUnavailable(f"backend '{name}' cannot run: {reason}")
    return backend_class()


def compiles_for_sizes(name: str) -> bool:
    """Whether the backend called ``name`` compiles each program for the sizes it runs at
    (:mod:`kfuse.codegen.specialise`)."""
    backend_class = _backend_class(name)
    return issubclass(backend_class, CompiledBackend) and backend_class.compiles_for_sizes()


def run_graph(graph: Graph, given: Mapping[str, Any], *, backend: str = "auto",
              plan: Any = None) -> dict[str, Any]:
    """Run ``graph`` on the given arrays and parameters; return its outputs by name.

    ``plan`` is a FusionPlan, ``"auto"`` (:func:`kfuse.search.default_plan` at the given
    sizes) or ``None``/``"unfused"``.
    """
    if not (plan is None or isinstance(plan, FusionPlan)
            or isinstance(plan, str) and plan in ("auto", "unfused")):
        raise FusionError(f"plan must be 'auto', 'unfused', None or a FusionPlan (from "
                          f"pipeline.plan() or pipeline.fuse()), got {plan!r}")
    chosen = get_backend(backend)
    if isinstance(plan, str):
        if plan == "auto" and chosen.name == "numpy":
            plan = None  # the reference interprets the IR; a plan would change nothing
        elif plan == "auto":
            plan = _auto_plan(graph, given)
        else:
            plan = None
    elif plan is not None and plan.graph is not graph:
        plan = _rechecked_plan(graph, given, plan, chosen.name)
    return chosen.run(graph, given, plan=plan)


def _auto_plan(graph: Graph, given: Mapping[str, Any]) -> Any:
    """:func:`kfuse.search.default_plan` at the given arrays' sizes, planned once per graph
    and sizes."""
    from kfuse.runtime.binding import bind
    from kfuse.search import default_plan
    sizes = bind(graph, given).sizes
    return graph.remembered(("auto plan", tuple(sorted(sizes.items()))),
                            lambda: default_plan(graph, sizes))


def _rechecked_plan(graph: Graph, given: Mapping[str, Any], plan: FusionPlan,
                    backend: str) -> FusionPlan:
    """A plan made from an earlier build of the pipeline, re-checked against this graph
    (once per graph, plan and sizes). Variants carry over: a row reduction's epilogue is
    legal only under one; the kernels' resources are checked as the backend compiles them,
    for these sizes or any."""
    from kfuse.fusion.plan import make_plan
    from kfuse.runtime.binding import bind
    sizes = bind(graph, given).sizes if compiles_for_sizes(backend) else None
    variants = {frozenset(g.members): g.variant for g in plan.groups}

    def recheck() -> tuple[FusionPlan, FusionPlan]:  # (the plan kept: its id stays its own)
        return plan, make_plan(
            graph, [list(g.members) for g in plan.groups], strategy=plan.strategy,
            model=plan.model, predicted_time_s=plan.predicted_time_s,
            unfused_predicted_time_s=plan.unfused_predicted_time_s, variants=variants,
            sizes=sizes)
    key = ("rechecked plan", id(plan), tuple(sorted((sizes or {}).items())))
    return graph.remembered(key, recheck)[1]


__all__ = ["BACKENDS", "Backend", "compiles_for_sizes", "get_backend", "run_graph"]
