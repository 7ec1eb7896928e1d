"""Placement-side parts of issue 14: a PlacementPolicy's clusterNames, and avoidWorkloads
against running workloads (by name, the tenant's own only)."""

from __future__ import annotations

import dataclasses

from broker.domain import Assignment, Placement, PolicyAction, PricingModel
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


def test_avoid_workloads_holds_against_running_workloads_of_the_same_tenant_only() -> None:
    """Regression: `_avoid_mask` compared names with `w-...` ids, so it never held."""
    free = plan_epoch(snapshot((workload("w-new"),)), ACTION, CONFIG)
    [cheapest] = {a.cluster for a in free.placements[0].assignments}
    running = Placement(workload_id="w-0123456789abcdef", cost_usd_per_hour=0.1, assignments=(
        Assignment(cluster=cheapest, pool="x", pricing=PricingModel.ON_DEMAND, replicas=1,
                   price_usd_per_hour=0.1),))
    mine = workload("w-new", avoid_workloads=("db",))
    theirs = workload("w-other", avoid_workloads=("db",), labels={"tenant": "t2"})
    db = workload("w-0123456789abcdef")
    db = dataclasses.replace(db, spec=dataclasses.replace(db.spec, name="db"))
    snap = snapshot((mine, theirs), running=(running,), workloads={db.id: db})
    plan = plan_epoch(snap, ACTION, CONFIG)
    where = {p.workload_id: {a.cluster for a in p.assignments} for p in plan.placements}
    assert cheapest not in where["w-new"]
    assert where["w-other"] == {cheapest}  # t2 has no workload named db
