"""Scale-down of nodes that still run work, per baseline (placement/consolidate.py)."""

from __future__ import annotations

import dataclasses

from broker.domain import (
    Assignment,
    Cluster,
    NodeState,
    Placement,
    PricingModel,
    Resources,
    Workload,
    WorkloadKind,
)
from broker.placement.consolidate import consolidations

from .placement_world import pool, snapshot, workload

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


def test_lp_and_greedy_never_drain_nodes_whose_work_they_do_not_know() -> None:
    # _world's nodes do not report their workloads (NodeState.workloads empty).
    for policy in ("lp", "greedy"):
        assert consolidations(_world([1.0, 1.0, 1.0]), policy) == ()  # type: ignore[arg-type]


def _running(nodes: list[tuple[float, Workload | None]], *, now: float = 0.0,
             rate: float = 1.0) -> object:
    """One 4-vCPU pool at 4 USD/h: a node per (vCPU used, workload on it), then two
    receivers with 2 vCPU free each; every workload runs at `rate` USD/h."""
    states = [NodeState(name=f"n{i}", cpu_allocated=cpu, memory_allocated_gib=cpu,
                        workloads=(w.id,) if w is not None else ())
              for i, (cpu, w) in enumerate(nodes)]
    states += [NodeState(name=f"r{i}", cpu_allocated=2.0, memory_allocated_gib=2.0)
               for i in range(2)]
    used = sum(s.cpu_allocated for s in states)
    p = pool("m", price=4.0, nodes=len(states), max_nodes=len(states), node=NODE4)
    p = dataclasses.replace(p, node_states=tuple(states), used=Resources(used, used))
    c = Cluster(name="c", provider="aws", region="us-east-1", pools=(p,))
    wls = {w.id: w for _, w in nodes if w is not None}
    running = tuple(Placement(w, (Assignment("c", "m", PricingModel.ON_DEMAND, 1, rate),),
                              rate) for w in wls)
    return dataclasses.replace(snapshot((), clusters=(c,)), now_s=now, running=running,
                               workloads=wls)


def _job(wid: str, *, duration_s: float = 7200.0, spot_ok: bool = True) -> Workload:
    return workload(wid, kind=WorkloadKind.BATCH, duration_s=duration_s, spot_ok=spot_ok)


def test_lp_drains_only_restartable_work_and_never_a_service() -> None:
    """The service's node and the job that refuses interruption are the least used, so any
    utilisation-only rule would take them first; the lp rule drains the restartable job's
    node and leaves every service replica where it runs."""
    web = workload("web", replicas=1)
    pinned = _job("pinned", spot_ok=False)
    snap = _running([(0.5, web), (0.75, pinned), (1.0, _job("j"))])
    drained = _names(consolidations(snap, "lp"))  # type: ignore[arg-type]
    assert drained == ["n2"]
    without_job = _running([(0.5, web), (0.75, pinned)])
    assert consolidations(without_job, "lp") == ()  # type: ignore[arg-type]
    # Karpenter's rule, for contrast, takes the service's node (it knows no kinds).
    assert _names(consolidations(snap, "karpenter")) == ["n0"]  # type: ignore[arg-type]


def test_lp_drains_only_when_the_saving_pays_the_restart() -> None:
    """A job with 2 h left on a 4 USD/h node saves 4 USD for 0.25 h of its 1 USD/h lost;
    one with 5 min left saves 0.33 USD and would lose 0.5 USD of a 2 USD/h run: kept."""
    long_job = _running([(1.0, _job("long"))])
    assert _names(consolidations(long_job, "lp")) == ["n0"]  # type: ignore[arg-type]
    ending = _running([(1.0, _job("ending", duration_s=600.0))], now=300.0, rate=2.0)
    assert consolidations(ending, "lp") == ()  # type: ignore[arg-type]
