"""Placement-side parts of issue 14: a PlacementPolicy's clusterNames, and avoidWorkloads
against running workloads (by name, the tenant's own only)."""

from __future__ import annotations

from broker.domain import PolicyAction
from broker.placement.planner import PlannerConfig, plan_epoch

from .placement_world import snapshot, workload

CONFIG = PlannerConfig(time_limit_s=2.0, site_cost_fraction=1.0)
ACTION = PolicyAction()


def test_cluster_names_restrict_the_clusters() -> None:
    free = plan_epoch(snapshot((workload("w"),)), ACTION, CONFIG)
    cheapest = {a.cluster for a in free.placements[0].assignments}
    other = "aws-use1" if cheapest != {"aws-use1"} else "gcp-euw4"
    pinned = plan_epoch(snapshot((workload("w", cluster_names=(other,)),)), ACTION, CONFIG)
    assert {a.cluster for a in pinned.placements[0].assignments} == {other}
