"""Fusion plans and the legality rules that decide which groups may be fused."""

from kfuse.fusion.legality import Violation, group_violations, plan_violations
from kfuse.fusion.plan import EdgeDecision, FusionPlan, Group, make_plan, unfused_plan

__all__ = ["EdgeDecision", "FusionPlan", "Group", "Violation", "group_violations", "make_plan",
           "plan_violations", "unfused_plan"]
