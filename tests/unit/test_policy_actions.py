"""Each of the policy's actions changes a decision of plan_epoch on a constructed state
(issue 12: "the policy's actions change a placement"); its default changes nothing."""

from __future__ import annotations

import io
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Interconnect,
    NodeState,
    PolicyAction,
    Pool,
    PricingModel,
    Resources,
    WorkloadKind,
)
from broker.placement.observe import observe
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.policy import (
    ACTIONS,
    NEUTRAL_LOGIT,
    NODE_ACTIONS,
    ActorCritic,
    to_action,
)
from tests.unit.placement_world import pool, snapshot, workload
from tests.unit.test_placement_consolidate import _job, _running
from tests.unit.test_placement_gpu_sets import whole_pool

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
    # lp's own timer: DecisionConfig.forecast_idle_s (120 s; no demand forecast here).
    [dflt] = plan_epoch(snap, PolicyAction(), CFG).scale_in
    assert dflt.nodes == ("n1", "n2")
    assert plan_epoch(snap, PolicyAction(idle_timeout_s={"a": 600.0}), CFG).scale_in == ()
    [slow] = plan_epoch(snap, PolicyAction(idle_timeout_s={"a": 250.0}), CFG).scale_in
    assert slow.nodes == ("n1",)
    [warm] = plan_epoch(snap, PolicyAction(idle_timeout_s={"a": 0.0}, warm_nodes={"a": 2}),
                        CFG).scale_in
    assert warm.nodes == ("n1",)  # the two newest idle nodes stay warm


def test_prewarm_lead_changes_how_many_nodes_are_ordered() -> None:
    p = replace(pool("m5", price=0.4, nodes=1, max_nodes=40), used=Resources(6.0, 8.0))
    snap = FederationSnapshot(now_s=NOW, clusters=(_cluster("a", p),), pending=(),
                              demand={("a", "m5"): (0.05, 0.0)})
    short = plan_epoch(snap, PolicyAction(prewarm_lead_s=60.0), CFG).prewarm
    long = plan_epoch(snap, PolicyAction(prewarm_lead_s=1800.0), CFG).prewarm
    assert short == ()
    assert [x.nodes for x in long] == [4]


def test_consolidation_threshold_decides_whether_a_node_is_drained() -> None:
    """A node at 1/4 use running a restartable 2-h job: lp's rule (0.5) drains it; a
    threshold under its use keeps it; 0 never drains."""
    snap = replace(_running([(1.0, _job("long"))]), pending=())  # type: ignore[type-var]
    [drain] = plan_epoch(snap, PolicyAction(), CFG).scale_in
    assert drain.reason == "consolidate"
    assert drain.nodes == ("n0",)
    for below in (0.2, 0.0):
        kept = plan_epoch(snap, PolicyAction(consolidate_below={"c": below}), CFG)
        assert [s for s in kept.scale_in if s.reason == "consolidate"] == []


def test_reserve_nodes_keeps_a_whole_gpu_node_for_jobs_yet_to_come() -> None:
    """Two 4-GPU replicas fit the running nodes only by breaking the whole free node; with
    one node reserved (no 8-GPU job queued) a node is bought for the second one instead."""
    clusters = (Cluster(name="aws", provider="aws", region="us-east-1",
                        pools=(whole_pool((4, 8), max_nodes=4),)),)  # type: ignore[arg-type]
    small = workload("small", kind=WorkloadKind.TRAIN, cpu=12, mem=100, gpu=4, replicas=2,
                     interconnect=Interconnect.NVLINK_FULL, duration_s=3600)
    snap = snapshot((small,), clusters=clusters)
    assert sum(s.add_nodes for s in plan_epoch(snap, PolicyAction(), CFG).scale) == 0
    kept = plan_epoch(snap, PolicyAction(reserve_nodes={"aws": 1}), CFG)
    assert kept.unplaced == {}
    assert sum(s.add_nodes for s in kept.scale) == 1


def test_the_untrained_policy_is_exactly_the_fixed_weights() -> None:
    """A fresh ActorCritic's mean action equals the fixed weights field by field (the
    neutral zone), so it changes no decision; before the zone, the 0.1-scaled random head
    weights gave values a hair off (e.g. an idle timer of 599.9 s)."""
    snap = two_clouds()
    for seed in range(3):
        torch.manual_seed(seed)
        action = ActorCritic().act(observe(snap)).action
        fixed = PolicyAction()
        for f in fields(PolicyAction):
            got, want = getattr(action, f.name), getattr(fixed, f.name)
            if isinstance(got, dict):
                spec = next(a for a in ACTIONS if a.name == f.name)
                assert set(got.values()) <= {spec.default}, f.name
            else:
                assert got == want, f.name
        assert _where(plan_epoch(snap, action, CFG)) == _where(plan_epoch(snap, fixed, CFG))


@pytest.mark.parametrize("spec", ACTIONS, ids=lambda a: a.name)
def test_neutral_zone_is_the_default_and_the_map_stays_monotone(spec: object) -> None:
    """Raw outputs within NEUTRAL_LOGIT of the start logit give the default; beyond it the
    value moves away from it continuously (no jump at the zone's edge) and monotonically."""
    a = ACTIONS[ACTIONS.index(spec)]  # type: ignore[arg-type]
    start = a.start_logit()
    inside = a.squash(start + np.linspace(-NEUTRAL_LOGIT, NEUTRAL_LOGIT, 21))
    assert (inside == a.default).all()
    grid = a.squash(start + np.linspace(-8.0, 8.0, 4001))
    assert (np.diff(grid) >= 0).all()
    assert grid[0] < a.default < grid[-1] or a.default in (a.low, grid[0])
    if not a.integer:
        edge = a.squash(np.array([start + NEUTRAL_LOGIT + 1e-6]))[0]
        assert abs(edge - a.default) < 1e-4 * (a.high - a.low)


def test_a_format_2_checkpoint_loads_with_the_new_actions_at_the_fixed_weights() -> None:
    """Checkpoints trained before consolidate_below / reserve_nodes keep their other
    outputs and give the fixed weights for the new per-cluster actions in every state."""
    torch.manual_seed(7)
    model = ActorCritic()
    with torch.no_grad():
        model.node_head[-1].bias.add_(2.0)  # type: ignore[operator]
    state = dict(model.state_dict())
    state["node_head.2.weight"] = state["node_head.2.weight"][:4].clone()
    state["node_head.2.bias"] = state["node_head.2.bias"][:4].clone()
    k = len(NODE_ACTIONS)
    state["log_std"] = torch.cat([state["log_std"][:4], state["log_std"][k:]])
    buf = io.BytesIO()
    torch.save({"version": 2, "state": state, "hidden": 32, "rounds": 2, "meta": {}}, buf)
    loaded = ActorCritic.load(buf.getvalue())
    obs = observe(two_clouds())
    old, new = model.act(obs), loaded.act(obs)
    assert new.action.cluster_bias_usd_per_hour == old.action.cluster_bias_usd_per_hour
    assert new.action.idle_timeout_s == old.action.idle_timeout_s
    assert set(new.action.consolidate_below.values()) == {0.5}
    assert set(new.action.reserve_nodes.values()) == {0}
    raw = np.array(new.raw)
    assert to_action(obs.names, raw) == new.action
