"""The baselines copy the systems they name (issue 11, item 2): each test fails on the
pre-change baselines (equal weights, top-pool fill, largest-group scale-out, spill greedy)."""

from __future__ import annotations

from broker.domain import Cluster, PolicyAction, PricingModel, Resources
from broker.placement.planner import POLICIES, EpochPlan, PlannerConfig, plan_epoch

from .placement_world import pool, snapshot, workload

CONFIG = PlannerConfig(time_limit_s=2.0, site_cost_fraction=1.0, explain=False)
FULL = PolicyAction(headroom=1.0)
NODE4 = Resources(cpu=4, memory_gib=16)


def _cluster(name: str, *pools: object) -> Cluster:
    return Cluster(name=name, provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                   pools=pools)  # type: ignore[arg-type]


def _replicas(plan: EpochPlan) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for p in plan.placements:
        for a in p.assignments:
            out[(a.cluster, a.pool)] = out.get((a.cluster, a.pool), 0) + a.replicas
    return out


def test_traditional_divides_replicas_by_cluster_capacity() -> None:
    # Karmada static weights proportional to capacity: 12 vs 4 nodes of 4 vCPU -> 3:1.
    from broker.placement.baselines import capacity_weights

    big = _cluster("big", pool("m", price=1.0, nodes=12, max_nodes=12, node=NODE4))
    small = _cluster("small", pool("m", price=1.0, nodes=4, max_nodes=4, node=NODE4))
    assert capacity_weights(snapshot((), clusters=(big, small))) == {"big": 48.0, "small": 16.0}
    plan = plan_epoch(snapshot((workload("web", replicas=8),), clusters=(big, small)),
                      FULL, CONFIG, policy="traditional")
    assert _replicas(plan) == {("big", "m"): 6, ("small", "m"): 2}


def test_traditional_scores_each_pod_so_replicas_spread_over_pools() -> None:
    # kube-scheduler scores pod by pod (least-allocated): two equal empty pools share the
    # replicas instead of the top-scored pool taking them all.
    c = _cluster("c", pool("a", price=1.0, nodes=4, max_nodes=4, node=NODE4),
                 pool("b", price=1.0, nodes=4, max_nodes=4, node=NODE4))
    plan = plan_epoch(snapshot((workload("web", replicas=4),), clusters=(c,)),
                      FULL, CONFIG, policy="traditional")
    assert _replicas(plan) == {("c", "a"): 2, ("c", "b"): 2}


def test_cluster_autoscaler_least_waste_grows_the_group_that_wastes_least() -> None:
    # No room anywhere: a 4-vCPU pod fits a 4-vCPU node exactly; a 32-vCPU node (the group
    # with the largest max_nodes) would leave 7/8 idle.
    c = _cluster("c", pool("small", price=0.2, nodes=0, max_nodes=5, node=NODE4),
                 pool("big", price=1.6, nodes=0, max_nodes=50,
                      node=Resources(cpu=32, memory_gib=128)))
    plan = plan_epoch(snapshot((workload("job", cpu=4, mem=16),), clusters=(c,)),
                      FULL, CONFIG, policy="traditional")
    assert _replicas(plan) == {("c", "small"): 1}


def test_greedy_puts_all_replicas_on_the_cheapest_option_that_holds_them() -> None:
    # The seed's selectCloudProvider: filter quotes with available >= request, cheapest.
    cheap = _cluster("cheap", pool("m", price=0.5, nodes=1, max_nodes=1, node=NODE4))
    dear = _cluster("dear", pool("m", price=1.0, nodes=4, max_nodes=4, node=NODE4))
    plan = plan_epoch(snapshot((workload("job", replicas=3, cpu=2, mem=4),),
                               clusters=(cheap, dear)), FULL, CONFIG, policy="greedy")
    assert _replicas(plan) == {("dear", "m"): 3}


def test_karpenter_launches_the_cheapest_per_pod_over_spot_and_on_demand() -> None:
    assert "karpenter" in POLICIES
    c = _cluster("c", pool("od", price=0.4, nodes=0, max_nodes=10, node=NODE4),
                 pool("spot", price=0.15, nodes=0, max_nodes=10, node=NODE4,
                      pricing=PricingModel.SPOT),
                 pool("big", price=1.6, nodes=0, max_nodes=50,
                      node=Resources(cpu=32, memory_gib=128)))
    plan = plan_epoch(snapshot((workload("web", replicas=3, cpu=2, mem=4),), clusters=(c,)),
                      FULL, CONFIG, policy="karpenter")
    assert _replicas(plan) == {("c", "spot"): 3}


def test_karmada_residuals_are_drawn_not_all_given_to_the_heaviest_cluster() -> None:
    from broker.placement.baselines import karmada_divide

    weights = {"a": 2.0, "b": 1.0, "c": 1.0}
    firsts = {karmada_divide(f"w{i}", 1, weights)[0][0] for i in range(40)}
    assert firsts == {"a", "b", "c"}
    assert karmada_divide("x", 1, weights) == karmada_divide("x", 1, weights)
    assert sum(n for _, n in karmada_divide("y", 7, weights)) == 7


def test_karmada_keeps_a_running_workloads_replicas_in_its_member_clusters() -> None:
    # An evicted (drained) replica is recreated by the member cluster where it ran, not
    # divided across the federation again by weight.
    import dataclasses

    from broker.domain import Assignment, Placement

    big = _cluster("big", pool("m", price=1.0, nodes=12, max_nodes=12, node=NODE4))
    small = _cluster("small", pool("m", price=1.0, nodes=4, max_nodes=4, node=NODE4))
    snap = dataclasses.replace(
        snapshot((workload("web", replicas=1),), clusters=(big, small)),
        running=(Placement("web", (Assignment("small", "m", PricingModel.ON_DEMAND, 3, 3.0),),
                           3.0),))
    for policy in ("traditional", "karpenter"):
        plan = plan_epoch(snap, FULL, CONFIG, policy=policy)
        assert _replicas(plan) == {("small", "m"): 1}


def test_the_kubernetes_baselines_fill_nodes_to_allocatable_whatever_the_headroom() -> None:
    # kube-scheduler fits pods up to a node's allocatable and Cluster Autoscaler / Karpenter
    # size nodes for the pending pods' requests: no headroom. Under the default action
    # (headroom 0.9, skyfed's own allocation ratio) two 4-vCPU pods did not fit one 8-vCPU
    # node (7.2 usable) and were planned onto two new nodes where one does.
    from broker.placement.planner import FULL_NODE_POLICIES

    node8 = Resources(cpu=8, memory_gib=32)
    empty = _cluster("c", pool("m", price=1.0, nodes=0, max_nodes=4, node=node8))
    snap = snapshot((workload("web", replicas=2, cpu=4.0, mem=4.0),), clusters=(empty,))
    assert set(FULL_NODE_POLICIES) == {"traditional", "karpenter"}
    for policy in FULL_NODE_POLICIES:
        plan = plan_epoch(snap, PolicyAction(), CONFIG, policy=policy)
        assert _replicas(plan) == {("c", "m"): 2}
        assert sum(s.add_nodes for s in plan.scale) == 1
    # skyfed's own policies keep the action's headroom: 7.2 of 8 vCPU usable per node.
    for policy in ("lp", "greedy"):
        plan = plan_epoch(snap, PolicyAction(), CONFIG, policy=policy)
        assert sum(s.add_nodes for s in plan.scale) == 2
