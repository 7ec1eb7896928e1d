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
from broker.placement.decisions import DecisionConfig, bounded_action
from broker.placement.observe import observe
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.policy import (
    ACTIONS,
    IDLE_TIMEOUT_MAX_S,
    NEUTRAL_LOGIT,
    NODE_ACTIONS,
    POOL_ACTIONS,
    POOL_FEATURES,
    ActorCritic,
    GraphObs,
    to_action,
)
from tests.unit.placement_world import pool, snapshot, workload
from tests.unit.test_placement_consolidate import _job, _running
from tests.unit.test_placement_gpu_sets import whole_pool

CFG = PlannerConfig(explain=False, time_limit_s=2.0)
# Without the least timer a policy may set (DecisionConfig.policy_idle_min_s), for the tests
# of the timers' mechanics below 120 s.
CFG0 = replace(CFG, decisions=DecisionConfig(policy_idle_min_s=0.0))
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
                        CFG0).scale_in
    assert warm.nodes == ("n1",)  # the two newest idle nodes stay warm


def two_pools_idle() -> FederationSnapshot:
    """One cluster, two CPU pools with three idle nodes each (idle 300, 200, 100 s)."""
    def idle_pool(name: str) -> Pool:
        states = tuple(_idle(f"{name}-n{k}", NOW - age) for k, age in
                       enumerate((300, 200, 100), start=1))
        return replace(pool(name, price=0.4, nodes=3, max_nodes=8), node_states=states)

    return FederationSnapshot(now_s=NOW, clusters=(_cluster("a", idle_pool("m5"),
                                                            idle_pool("c5")),), pending=())


def _removed(plan: EpochPlan) -> dict[str, tuple[str, ...]]:
    return {s.pool: s.nodes for s in plan.scale_in}


def test_a_pools_idle_timeout_changes_only_that_pools_scale_in() -> None:
    snap = two_pools_idle()
    both = _removed(plan_epoch(snap, PolicyAction(), CFG))  # lp's 120 s timer on both pools
    assert both == {"m5": ("m5-n1", "m5-n2"), "c5": ("c5-n1", "c5-n2")}
    slow_m5 = PolicyAction(pool_idle_timeout_s={"a": {"m5": 600.0}})
    assert _removed(plan_epoch(snap, slow_m5, CFG)) == {"c5": both["c5"]}
    # The pool's own value wins over its cluster's.
    mixed = PolicyAction(idle_timeout_s={"a": 600.0}, pool_idle_timeout_s={"a": {"c5": 0.0}})
    assert _removed(plan_epoch(snap, mixed, CFG0)) == {"c5": ("c5-n1", "c5-n2", "c5-n3")}


def test_a_policy_timer_below_the_break_even_counts_as_the_break_even() -> None:
    """A learned timer under policy_idle_min_s (the boot time) is raised to it, in scale-in
    and in the node charge alike (both read plan_epoch's bounded action); a timer the
    action does not set (karpenter's own 0 s) is not the policy's and stays."""
    snap = two_pools_idle()
    fast = PolicyAction(pool_idle_timeout_s={"a": {"c5": 0.0}})
    assert _removed(plan_epoch(snap, fast, CFG)) == {"m5": ("m5-n1", "m5-n2"),
                                                     "c5": ("c5-n1", "c5-n2")}  # n3: 100 s
    assert _removed(plan_epoch(snap, fast, CFG0))["c5"] == ("c5-n1", "c5-n2", "c5-n3")
    raised = bounded_action(PolicyAction(idle_timeout_s={"a": 5.0, "b": 900.0},
                                         pool_idle_timeout_s={"a": {"c5": 30.0}}),
                            DecisionConfig())
    assert raised.idle_timeout_s == {"a": 120.0, "b": 900.0}
    assert raised.pool_idle_timeout_s == {"a": {"c5": 120.0}}
    unset = PolicyAction()
    assert bounded_action(unset, DecisionConfig()) is unset
    karpenter = _removed(plan_epoch(snap, PolicyAction(), CFG, policy="karpenter"))
    assert karpenter["c5"] == ("c5-n1", "c5-n2", "c5-n3")


def test_a_pools_warm_pool_keeps_nodes_in_that_pool_only() -> None:
    snap = two_pools_idle()
    warm = PolicyAction(pool_idle_timeout_s={"a": {"m5": 0.0, "c5": 0.0}},
                        pool_warm_nodes={"a": {"m5": 2}})
    assert _removed(plan_epoch(snap, warm, CFG0)) == {"m5": ("m5-n1",),
                                                     "c5": ("c5-n1", "c5-n2", "c5-n3")}


def test_a_pools_spot_bias_moves_work_between_the_spot_pools_of_one_cluster() -> None:
    """Per cluster, a spot bias moves both spot pools alike, so it cannot choose between
    them; per pool it can."""
    a = _cluster("a", pool("od", price=0.40), pool("spot1", price=0.15,
                                                   pricing=PricingModel.SPOT),
                 pool("spot2", price=0.16, pricing=PricingModel.SPOT))
    snap = FederationSnapshot(now_s=NOW, clusters=(a,),
                              pending=(workload("w", cpu=2.0, replicas=2),))
    assert _where(plan_epoch(snap, PolicyAction(), CFG)) == [("a", "spot1")]
    cluster_wide = PolicyAction(spot_bias_usd_per_hour={"a": 0.05})
    assert _where(plan_epoch(snap, cluster_wide, CFG)) == [("a", "spot1")]
    one_pool = PolicyAction(pool_spot_bias_usd_per_hour={"a": {"spot1": 0.05}})
    assert _where(plan_epoch(snap, one_pool, CFG)) == [("a", "spot2")]


def test_the_networks_per_pool_output_reaches_the_plan() -> None:
    """A raw output for one pool (observe's pool names, to_action) changes plan_epoch's
    placement: the names the policy sees are the names the planner acts on."""
    snap = two_clouds()
    obs = observe(snap)
    assert obs.pools == (("a", "a-od"), ("a", "a-spot"), ("b", "b-od"), ("b", "b-spot"))
    layout = obs.layout
    raw = np.zeros(layout.width)
    for a in ACTIONS:
        raw[layout.block(a)] = a.start_logit()
    spot = next(a for a in ACTIONS if a.name == "spot_bias_usd_per_hour")
    raw[layout.block(spot).start + obs.pools.index(("b", "b-spot"))] = spot.raw_for(0.08)
    action = to_action(obs.names, raw, obs.pools)
    assert action.pool_spot_bias_usd_per_hour["b"] == {"b-od": 0.0, "b-spot": 0.08}
    assert _where(plan_epoch(snap, PolicyAction(), CFG)) == [("b", "b-spot")]
    assert _where(plan_epoch(snap, action, CFG)) == [("a", "a-spot")]


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
                spec = next((a for a in ACTIONS if a.field == f.name), None)
                values = [y for x in got.values()
                          for y in (x.values() if isinstance(x, dict) else (x,))]
                if spec is None:  # the cluster map of a per-pool action: left to the pools
                    assert values == [], f.name
                else:
                    assert values, f.name
                    assert set(values) <= {spec.default}, f.name
            else:
                assert got == want, f.name
        assert {c: set(v) for c, v in action.pool_idle_timeout_s.items()} == {
            "a": {"a-od", "a-spot"}, "b": {"b-od", "b-spot"}}
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


def _format_3_state(model: ActorCritic) -> dict[str, torch.Tensor]:
    """`model`'s state dict as format 3 wrote it: no pool readout."""
    return {k: v for k, v in model.state_dict().items()
            if not k.startswith(("pool_encode.", "pool_head."))}


def _node_head_outputs(model: ActorCritic, obs: GraphObs) -> np.ndarray:
    """The node head's raw outputs [N, len(NODE_ACTIONS)]: format 3's per-cluster actions."""
    seen: list[torch.Tensor] = []
    hook = model.node_head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    model.act(obs)
    hook.remove()
    return seen[0][0].detach().numpy()


def test_a_format_2_checkpoint_loads_with_the_new_actions_at_the_fixed_weights() -> None:
    """Checkpoints trained before consolidate_below / reserve_nodes keep their other
    outputs and give the fixed weights for the new per-cluster actions in every state."""
    torch.manual_seed(7)
    model = ActorCritic()
    with torch.no_grad():
        model.node_head[-1].bias.add_(2.0)  # type: ignore[operator]
    state = _format_3_state(model)
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
    assert new.action.pool_idle_timeout_s == old.action.pool_idle_timeout_s
    assert set(new.action.consolidate_below.values()) == {0.5}
    assert set(new.action.reserve_nodes.values()) == {0}
    raw = np.array(new.raw)
    assert to_action(obs.names, raw, obs.pools) == new.action


def test_a_format_3_checkpoint_gives_each_pool_its_clusters_value() -> None:
    """Format 3 applied its per-cluster idle timer, warm pool and spot bias to every pool of
    the cluster; loaded into the pool readout, each pool gets exactly that value."""
    torch.manual_seed(8)
    model = ActorCritic()
    with torch.no_grad():  # per-cluster outputs far from the fixed weights
        model.node_head[-1].weight.normal_(0.0, 1.0)  # type: ignore[operator]
        model.node_head[-1].bias.add_(1.5)  # type: ignore[operator]
    buf = io.BytesIO()
    torch.save({"version": 3, "state": _format_3_state(model), "hidden": 32, "rounds": 2,
                "meta": {}}, buf)
    loaded = ActorCritic.load(buf.getvalue())
    obs = observe(two_clouds())
    heads = _node_head_outputs(loaded, obs)
    action = loaded.act(obs).action
    for spec in POOL_ACTIONS:
        per_pool = getattr(action, spec.field)
        for i, cluster in enumerate(obs.names):
            want = spec.squash(np.array([heads[i, NODE_ACTIONS.index(spec)]]))[0]
            assert set(per_pool[cluster].values()) == {
                int(want) if spec.integer else round(float(want), 5)}, spec.name
    assert len({v for pools in action.pool_idle_timeout_s.values()
                for v in pools.values()}) == 2  # the clusters differ; their pools do not


def test_pool_rows_read_idle_nodes_and_leave_fixed_sites_out() -> None:
    """A pool's idle nodes and how long they have been idle are its own features (what its
    timer and warm pool act on); an edge site's fixed pool has no row."""
    snap = two_pools_idle()
    edge = Cluster(name="e", provider="edge", region="e", lat=40.7, lon=-74.0,
                   pools=(pool("site", price=0.9, nodes=1, max_nodes=1,
                               pricing=PricingModel.EDGE),))
    busy = replace(snap.clusters[0].pools[1], node_states=(NodeState("x", cpu_allocated=2.0),),
                   nodes=1)
    snap = replace(snap, clusters=(_cluster("a", snap.clusters[0].pools[0], busy), edge))
    obs = observe(snap)
    assert obs.pools == (("a", "m5"), ("a", "c5"))
    assert list(obs.pool_cluster) == [0, 0]
    col = {f: k for k, f in enumerate(POOL_FEATURES)}
    m5, c5 = obs.pool_x
    assert m5[col["idle_node_frac"]] == 1.0
    assert m5[col["idle_age_frac"]] == pytest.approx(200.0 / IDLE_TIMEOUT_MAX_S)  # mean age
    assert c5[col["idle_node_frac"]] == 0.0
    assert c5[col["idle_age_frac"]] == 0.0


def test_a_changed_pool_is_read_afresh_by_scale_in() -> None:
    """Pool.empty_nodes is computed once per pool value: a copy with a node busy again (as
    the merge makes when a replica lands) is read anew, never the first value's answer."""
    states = (_idle("n1", NOW - 300), _idle("n2", NOW - 200), _idle("n3", NOW - 100))
    p = replace(pool("m5", price=0.4, nodes=3, max_nodes=8), node_states=states)
    snap = FederationSnapshot(now_s=NOW, clusters=(_cluster("a", p),), pending=())
    [first] = plan_epoch(snap, PolicyAction(), CFG).scale_in
    assert first.nodes == ("n1", "n2")
    assert len(p.empty_nodes) == 3
    busy = replace(p, node_states=(NodeState("n1", cpu_allocated=1.0), *states[1:]))
    [then] = plan_epoch(replace(snap, clusters=(_cluster("a", busy),)), PolicyAction(),
                        CFG).scale_in
    assert then.nodes == ("n2",)
    assert [n.name for n in busy.empty_nodes] == ["n2", "n3"]
