"""Codeless projection (Wahib & Maruyama 2014's use): plan an application from kernel metadata alone.

``load_app`` reads a YAML/JSON description (:mod:`kfuse.project.metadata`, schema in
``schema.json``), :class:`~kfuse.project.problem.AppProblem` derives the problem
(array categories, order DAG, sharing, kinship, constraints 1.1-1.7) and
:func:`project_app` searches it with one of the strategies of :mod:`kfuse.search`,
giving the best plan and its projected speedup without any code. ``synth`` generates the
synthetic suite of Wahib & Maruyama 2014 Table V; ``fidelity`` compares GGA with the exact optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfuse.project.metadata import (
    AccessSpec,
    AppMetadata,
    ArraySpec,
    CopySpec,
    KernelSpec,
    dump_app,
    load_app,
    parse_app,
    schema,
    schema_path,
)
from kfuse.project.problem import CATEGORIES, PROJECT_MODELS, AppProblem
from kfuse.search.problem import SearchResult


@dataclass
class ProjectedPlan(SearchResult):
    """The best plan found for a codeless application, with reasons, in plan form."""

    problem: AppProblem = field(kw_only=True)
    strategy: str = field(kw_only=True)
    model: str = field(kw_only=True)

    @property
    def projected_speedup(self) -> float:
        return self.speedup

    def _edges(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        group_of = {name: i for i, group in enumerate(self.groups) for name in group}
        fused, rejected = [], []
        dag = self.problem.order_dag
        for source, target, data in dag.edges(data=True):
            kinds = ", ".join(sorted(data["why"]))
            buffers = data["buffers"] or sorted({w.split(" ", 1)[1] for w in data["why"]
                                                 if " " in w})
            entry = {"producer": source, "consumer": target, "buffer": ", ".join(buffers)}
            if group_of[source] == group_of[target]:
                entry["reason"] = f"{kinds}: in one kernel ({self.problem.variant(self.groups[group_of[source]])} fusion)"
                fused.append(entry)
            else:
                why = self.reasons.get((source, target), "not chosen by the plan")
                entry["reason"] = f"{kinds}: {why}"
                rejected.append(entry)
        return fused, rejected

    def to_dict(self) -> dict[str, Any]:
        """The keys of ``kfuse plan --json`` (``FusionPlan.to_dict``) plus ``projected_speedup``."""
        fused, rejected = self._edges()
        return {
            "pipeline": self.problem.app.name,
            "groups": [list(g) for g in self.groups],
            "variants": [self.problem.variant(g) for g in self.groups],
            "marching": [False] * len(self.groups),  # codeless: no kernel of kfuse's own
            "last_first": [""] * len(self.groups),  # (nor a block order)
            "side_by_side": [],  # (nor kernels side by side)
            "strategy": self.strategy,
            "model": self.model,
            "predicted_time_s": self.predicted_time_s,
            "unfused_predicted_time_s": self.unfused_predicted_time_s,
            "fused": fused,
            "rejected": rejected,
            "projected_speedup": self.projected_speedup,
        }

    def explain(self) -> str:
        """The plan in words: groups with projected and original times, then every edge."""
        app = self.problem.app
        lines = [f"projection of '{app.name}' ({self.strategy} search, {self.model} model, "
                 f"{app.device.name}): {len(app.kernels)} kernels in {len(self.groups)} "
                 f"kernels",
                 f"  projected {self.predicted_time_s * 1e3:.3f} ms fused vs "
                 f"{self.unfused_predicted_time_s * 1e3:.3f} ms measured unfused: speedup "
                 f"{self.projected_speedup:.3f}x"]
        for group in self.groups:
            time_s = self.problem.group_time(group)
            if len(group) == 1:
                lines.append(f"  kernel [{group[0]}] measured {time_s * 1e6:.1f} us")
                continue
            original = self.problem.original_sum(group)
            proj = self.problem.projection(group)
            lines.append(f"  kernel [{' + '.join(group)}] ({self.problem.variant(group)}): "
                         f"projected {time_s * 1e6:.1f} us vs {original * 1e6:.1f} us apart; "
                         f"{proj.blocks_per_sm} blocks/SM, {proj.registers} registers, "
                         f"staged {list(proj.shared_list)}")
        fused, rejected = self._edges()
        for entry in fused:
            lines.append(f"  fused     {entry['producer']} -> {entry['consumer']} "
                         f"('{entry['buffer']}'): {entry['reason']}")
        for entry in rejected:
            lines.append(f"  not fused {entry['producer']} -> {entry['consumer']} "
                         f"('{entry['buffer']}'): {entry['reason']}")
        return "\n".join(lines)


def project_app(app: AppMetadata, strategy: str = "gga", model: str = "wahib", seed: int = 0,
                progress: bool = False, **options: Any) -> ProjectedPlan:
    """Search the best plan of a codeless application and project its speedup."""
    from kfuse.search.problem import solve

    problem = AppProblem(app, model)
    result = solve(problem.fusion_problem(), strategy, seed=seed, progress=progress, **options)
    return ProjectedPlan([tuple(g) for g in result.groups], result.predicted_time_s,
                         result.unfused_predicted_time_s, dict(result.reasons),
                         dict(result.stats), problem=problem, strategy=strategy, model=model)


__all__ = ["AccessSpec", "AppMetadata", "AppProblem", "ArraySpec", "CATEGORIES", "CopySpec",
           "KernelSpec", "PROJECT_MODELS", "ProjectedPlan", "dump_app", "load_app", "parse_app",
           "project_app", "schema", "schema_path"]
