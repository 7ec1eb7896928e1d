"""Placement-side parts of issue 14: a PlacementPolicy's clusterNames, and avoidWorkloads
against running workloads (by name, the tenant's own only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    PolicyAction,
    PricingModel,
    Resources,
    Workload,
    WorkloadKind,
)
from broker.placement.planner import PlannerConfig, plan_epoch
from broker.placement.preemption import plan_preemptions

from .placement_world import pool, snapshot, workload

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


def _full_world(victim_kind: WorkloadKind = WorkloadKind.BATCH, victim_priority: int = 0
                ) -> tuple[Workload, Placement]:
    victim = workload("w-00000000000000aa", kind=victim_kind, replicas=2, cpu=4, mem=16,
                      priority=victim_priority, duration_s=3600.0)
    running = Placement(workload_id=victim.id, cost_usd_per_hour=0.4, assignments=(
        Assignment(cluster="solo", pool="m5", pricing=PricingModel.ON_DEMAND, replicas=2,
                   price_usd_per_hour=0.384),))
    return victim, running


def _solo(used: Resources) -> tuple[Cluster, ...]:
    return (Cluster(name="solo", provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                    pools=(pool("m5", price=0.384, nodes=1, max_nodes=1, used=used),)),)


def _replan(s: Any) -> Any:
    return plan_epoch(s, ACTION, CONFIG).placements


@pytest.mark.parametrize(("victim_kind", "victim_priority", "evicted"), [
    (WorkloadKind.BATCH, 0, True),
    (WorkloadKind.TRAIN, 5, True),
    (WorkloadKind.BATCH, 100, False),  # not lower than the waiting workload's
    (WorkloadKind.SERVICE, 0, False),  # services are never preempted
])
def test_higher_priority_workload_evicts_lower_priority_batch_work(
        victim_kind: WorkloadKind, victim_priority: int, evicted: bool) -> None:
    victim, running = _full_world(victim_kind, victim_priority)
    urgent = workload("w-00000000000000bb", replicas=1, cpu=4, mem=8, priority=100)
    snap = snapshot((urgent,), clusters=_solo(Resources(8, 32)), running=(running,),
                    workloads={victim.id: victim})
    plan = plan_epoch(snap, ACTION, CONFIG)
    assert urgent.id in plan.unplaced  # the pool is full
    moves = plan_preemptions(snap, plan.unplaced, _replan)
    if evicted:
        assert [(m.victim, m.by, m.cluster, m.pool) for m in moves] == [
            (victim.id, urgent.id, "solo", "m5")]
    else:
        assert moves == ()


def test_another_tenants_work_is_never_evicted() -> None:
    victim, running = _full_world()
    other = workload("w-00000000000000dd", replicas=1, cpu=4, mem=8, priority=1000,
                     labels={"tenant": "t2"})
    snap = snapshot((other,), clusters=_solo(Resources(8, 32)), running=(running,),
                    workloads={victim.id: victim})
    plan = plan_epoch(snap, ACTION, CONFIG)
    assert other.id in plan.unplaced
    assert plan_preemptions(snap, plan.unplaced, _replan) == ()


def test_nothing_is_evicted_when_it_would_not_make_room() -> None:
    victim, running = _full_world()
    huge = workload("w-00000000000000cc", replicas=1, cpu=16, mem=8, priority=100)
    snap = snapshot((huge,), clusters=_solo(Resources(8, 32)), running=(running,),
                    workloads={victim.id: victim})
    plan = plan_epoch(snap, ACTION, CONFIG)
    assert plan_preemptions(snap, plan.unplaced, _replan) == ()  # 16 cpu fit no 8-cpu node
