"""Search strategies: ``search(graph, ...) -> FusionPlan`` behind one interface.

Every strategy runs on a :class:`~kfuse.search.problem.FusionProblem` (kernels, order DAG,
sharing graph, legality, cost) through :func:`~kfuse.search.problem.solve`:

- ``exhaustive``: every legal partition (small graphs, at most 12 kernels);
- ``exact``: set partitioning solved with HiGHS (ground truth up to ~60 kernels);
- ``greedy``: apply the most profitable legal merge until none helps;
- ``edges``: Qiao 2021's basic search along producer-consumer chains;
- ``mincut``: Qiao 2021's recursive Stoer-Wagner min-cut (Algorithm 2);
- ``gga``: Wahib & Maruyama 2014b's grouped genetic algorithm with oracle penalty and tabu restarts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kfuse.fusion.plan import FusionPlan, make_plan
from kfuse.ir.collapse import check_compiled_axes
from kfuse.ir.graph import Graph
from kfuse.log import LOG
from kfuse.model.device import DeviceProfile
from kfuse.search.problem import (
    GRAPH_MODELS,
    STRATEGY_NAMES,
    FusionProblem,
    SearchResult,
    check_strategy,
    problem_from_graph,
    random_problem,
    solve,
)

# what plan_for (``kfuse plan``, ``Pipeline.plan``) takes: the searches and two more
PLAN_STRATEGIES = ("auto", "variants", *STRATEGY_NAMES)
MODELS = GRAPH_MODELS  # name -> model; other modules register theirs here


def search(graph: Graph, strategy: str = "greedy", model: str = "roofline",
           sizes: Mapping[str, int] | None = None,
           profile: DeviceProfile | None = None, seed: int = 0,
           **options: Any) -> FusionPlan:
    """A fusion plan for ``graph`` found by ``strategy`` under ``model``.

    ``sizes`` binds the size symbols for prediction (nominal sizes when left out);
    ``profile`` is the device (the calibrated one, else nominal H100 figures); ``seed``
    makes the randomised strategies repeatable; ``options`` go to the strategy.
    """
    check_strategy(strategy)  # before the problem is built
    check_compiled_axes(graph)
    started = time.perf_counter()
    problem = problem_from_graph(graph, model, sizes, profile)
    result = solve(problem, strategy, seed=seed, **options)
    plan = make_plan(graph, result.groups, strategy=strategy, model=model,
                     reasons=result.reasons, predicted_time_s=result.predicted_time_s,
                     unfused_predicted_time_s=result.unfused_predicted_time_s,
                     check_resources=False, sizes=sizes)
    LOG.info("planned '%s' (%s search, %s model): %d operators in %d kernels, in %.2f s",
             graph.name, strategy, model, len(graph.kernels), len(plan.groups),
             time.perf_counter() - started)
    return plan


def is_map_reduce_graph(graph: Graph) -> bool:
    """True for pipelines of maps and reductions over vectors and matrices only (BLAS-1/2
    sequences), with at least one reduction: Filipovič et al. 2015's implementation space
    covers them. Maps that read pipeline inputs at computed indices (a cross-entropy's
    ``x[row, label]``) are among them: they read memory where they are, and may be the tail
    of a held group."""
    from kfuse.fusion.legality import gathers_inputs, mapreduce_shape_reason

    return (any(kernel.reduction is not None for kernel in graph.kernels)
            and all(mapreduce_shape_reason(graph, [kernel.name]) is None
                    or gathers_inputs(graph, kernel.name) for kernel in graph.kernels))


def default_plan(graph: Graph, sizes: Mapping[str, int] | None = None,
                 profile: DeviceProfile | None = None, *, fill_device: bool = False
                 ) -> FusionPlan:
    """The plan ``plan="auto"`` runs: for map/reduce pipelines the predicted-best
    combination of fusions and implementations (Filipovič et al. 2015, :mod:`kfuse.search.variants`:
    sibling reductions sharing a matrix pass, stream variants, epilogues); for everything
    else the greedy search under the roofline model; then, at known sizes, independent
    groups side by side where predicted to pay (:mod:`kfuse.search.hfuse`). ``fill_device``
    (plans the GPU runs): 2-D tiled kernels over few points get tiles small enough to fill
    the device (:mod:`kfuse.search.filling`)."""
    from kfuse.search.hfuse import side_by_side_plan

    if is_map_reduce_graph(graph):
        from kfuse.search.variants import best_plan

        return side_by_side_plan(best_plan(graph, sizes, profile), sizes, profile)
    plan = search(graph, sizes=sizes, profile=profile)
    if fill_device and sizes is not None:
        from kfuse.model.device import default_profile
        from kfuse.search.filling import filled_plan
        plan = filled_plan(plan, sizes, profile or default_profile())
    return side_by_side_plan(plan, sizes, profile)


def plan_for(graph: Graph, strategy: str = "auto", model: str = "roofline",
             sizes: Mapping[str, int] | None = None, profile: DeviceProfile | None = None,
             seed: int = 0) -> FusionPlan:
    """A plan by name: ``"auto"`` (:func:`default_plan` under the roofline model, the greedy
    search under another model), ``"variants"`` (Filipovič et al. 2015's implementation space) or any
    search strategy (:data:`PLAN_STRATEGIES`)."""
    check_strategy(strategy, PLAN_STRATEGIES)
    if strategy == "variants":
        from kfuse.search.variants import best_plan

        return best_plan(graph, sizes, profile)
    if strategy == "auto" and model == "roofline":
        return default_plan(graph, sizes, profile)
    return search(graph, "greedy" if strategy == "auto" else strategy, model, sizes=sizes,
                  profile=profile, seed=seed)


__all__ = ["GRAPH_MODELS", "MODELS", "PLAN_STRATEGIES", "STRATEGY_NAMES", "FusionProblem", "SearchResult",
           "default_plan", "is_map_reduce_graph", "plan_for", "problem_from_graph",
           "random_problem", "search", "solve"]
