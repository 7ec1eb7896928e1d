"""Each of the policy's actions changes a decision of plan_epoch on a constructed state
(issue 12: "the policy's actions change a placement"); its default changes nothing."""

from __future__ import annotations

from dataclasses import replace

from broker.domain import (
    Cluster,
    FederationSnapshot,
    NodeState,
    PolicyAction,
    Pool,
    PricingModel,
    Resources,
)
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.policy import ActorCritic
from tests.unit.placement_world import pool, workload

CFG = PlannerConfig(explain=False, time_limit_s=2.0)
NOW = 10_000.0


def _cluster(name: str, *pools: Pool) -> Cluster:
    return Cluster(name=name, provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                   pools=pools)


def _idle(name: str, since: float) -> NodeState:
    return NodeState(name=name, idle_since_s=since, gpu_free=0)


def _where(plan: EpochPlan) -> list[tuple[str, str]]:
    return sorted((a.cluster, a.pool) for p in plan.placements for a in p.assignments)


def two_clouds() -> FederationSnapshot:
    """Two clusters a few cents apart per vCPU-hour, each with an on-demand and a spot pool."""
    a = _cluster("a", pool("a-od", price=0.40), pool("a-spot", price=0.16,
                                                     pricing=PricingModel.SPOT))
    b = _cluster("b", pool("b-od", price=0.38), pool("b-spot", price=0.15,
                                                     pricing=PricingModel.SPOT))
    return FederationSnapshot(now_s=NOW, clusters=(a, b),
                              pending=(workload("w", cpu=2.0, replicas=2),))


def test_affinity_bias_moves_the_placement() -> None:
    snap = two_clouds()
    assert _where(plan_epoch(snap, PolicyAction(), CFG)) == [("b", "b-spot")]
    moved = plan_epoch(snap, PolicyAction(cluster_bias_usd_per_hour={"b": 0.1}), CFG)
    assert _where(moved) == [("a", "a-spot")]


def test_spot_bias_moves_the_placement_off_spot() -> None:
    snap = two_clouds()
    off = plan_epoch(snap, PolicyAction(spot_bias_usd_per_hour={"a": 0.1, "b": 0.1}), CFG)
    assert _where(off) == [("b", "b-od")]


def test_headroom_changes_whether_a_node_is_bought() -> None:
    full = _cluster("a", replace(pool("m5", price=0.4, nodes=1, max_nodes=4),
                                 used=Resources(4.0, 8.0)))
    snap = FederationSnapshot(now_s=NOW, clusters=(full,), pending=(workload("w", cpu=3.0),))
    assert plan_epoch(snap, PolicyAction(headroom=1.0), CFG).scale == ()
    [scale] = plan_epoch(snap, PolicyAction(headroom=0.6), CFG).scale
    assert scale.add_nodes == 1


def test_idle_timeout_and_warm_pool_change_scale_in() -> None:
    states = (_idle("n1", NOW - 300), _idle("n2", NOW - 200), _idle("n3", NOW - 100))
    p = replace(pool("m5", price=0.4, nodes=3, max_nodes=8), node_states=states)
    snap = FederationSnapshot(now_s=NOW, clusters=(_cluster("a", p),), pending=())
    assert plan_epoch(snap, PolicyAction(), CFG).scale_in == ()  # 600 s timer
    [fast] = plan_epoch(snap, PolicyAction(idle_timeout_s={"a": 150.0}), CFG).scale_in
    assert fast.nodes == ("n1", "n2")
    [warm] = plan_epoch(snap, PolicyAction(idle_timeout_s={"a": 0.0}, warm_nodes={"a": 2}),
                        CFG).scale_in
    assert warm.nodes == ("n1",)  # the two newest idle nodes stay warm


def test_prewarm_lead_changes_how_many_nodes_are_ordered() -> None:
    p = replace(pool("m5", price=0.4, nodes=1, max_nodes=40), used=Resources(6.0, 8.0),
                demand_cpu_per_s=0.05)
    snap = FederationSnapshot(now_s=NOW, clusters=(_cluster("a", p),), pending=())
    short = plan_epoch(snap, PolicyAction(prewarm_lead_s=60.0), CFG).prewarm
    long = plan_epoch(snap, PolicyAction(prewarm_lead_s=1800.0), CFG).prewarm
    assert short == ()
    assert [x.nodes for x in long] == [4]


def test_the_untrained_policy_changes_nothing() -> None:
    """A fresh ActorCritic's mean action is the fixed weights, decision for decision."""
    snap = two_clouds()
    from broker.placement.observe import observe

    action = ActorCritic().act(observe(snap)).action
    assert _where(plan_epoch(snap, action, CFG)) == _where(plan_epoch(snap, PolicyAction(),
                                                                     CFG))
