"""Scale-down of nodes that still run work, per baseline (placement/consolidate.py)."""

from __future__ import annotations

import dataclasses

from broker.domain import Cluster, NodeState, Resources
from broker.placement.consolidate import consolidations

from .placement_world import pool, snapshot

NODE4 = Resources(cpu=4, memory_gib=16)


def _world(loads: list[float], *, since: float | None = 0.0, now: float = 0.0) -> object:
    nodes = tuple(NodeState(name=f"n{i}", cpu_allocated=cpu, memory_allocated_gib=cpu,
                            idle_since_s=None if cpu else 0.0, underused_since_s=since)
                  for i, cpu in enumerate(loads))
    p = pool("m", price=1.0, nodes=len(loads), max_nodes=len(loads) + 4, node=NODE4)
    p = dataclasses.replace(p, node_states=nodes, used=Resources(sum(loads), sum(loads)))
    c = Cluster(name="c", provider="aws", region="us-east-1", lat=38.9, lon=-77.4, pools=(p,))
    return dataclasses.replace(snapshot((), clusters=(c,)), now_s=now)


def _names(plan: tuple[object, ...]) -> list[str]:
    return [n for s in plan for n in s.nodes]  # type: ignore[attr-defined]


def test_karpenter_deletes_the_least_used_node_whose_pods_fit_elsewhere_within_budget() -> None:
    # 3 nodes: 1, 3 and 2 vCPU used of 4. n0's 1 vCPU fits the others' 3 free; the 10 %
    # budget of 3 nodes rounds up to one node per epoch.
    plan = consolidations(_world([1.0, 3.0, 2.0]), "karpenter")  # type: ignore[arg-type]
    assert _names(plan) == ["n0"]
    assert plan[0].reason == "consolidate"


def test_karpenter_budget_is_ten_percent_of_the_pool_and_receivers_stay() -> None:
    plan = consolidations(_world([0.5] * 20), "karpenter")  # type: ignore[arg-type]
    assert len(_names(plan)) == 2
    full = consolidations(_world([4.0, 4.0, 3.5]), "karpenter")  # type: ignore[arg-type]
    assert full == ()  # nothing fits elsewhere


def test_cluster_autoscaler_waits_ten_minutes_below_half_use() -> None:
    assert _names(consolidations(_world([1.0, 1.0], since=0.0, now=600.0),  # type: ignore[arg-type]
                                 "traditional")) == ["n0"]
    assert consolidations(_world([1.0, 1.0], since=0.0, now=300.0),  # type: ignore[arg-type]
                          "traditional") == ()
    assert consolidations(_world([2.5, 1.0], since=None, now=900.0),  # type: ignore[arg-type]
                          "traditional") == ()


def test_lp_and_greedy_never_drain_busy_nodes() -> None:
    for policy in ("lp", "greedy"):
        assert consolidations(_world([1.0, 1.0, 1.0]), policy) == ()  # type: ignore[arg-type]
