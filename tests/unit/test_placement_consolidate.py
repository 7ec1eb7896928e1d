"""Scale-down of nodes that still run work, per baseline (placement/consolidate.py)."""

from __future__ import annotations

import dataclasses

import pytest

from broker.domain import (
    Assignment,
    Cluster,
    FederationSnapshot,
    Interconnect,
    NodeLeaving,
    NodeState,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Workload,
    WorkloadKind,
)
from broker.placement.consolidate import consolidations, replacements
from broker.placement.kinds import PoolScaleIn

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
    """A job with 2 h left on a 4 USD/h node saves 4 USD for 0.25 h of its 1 USD/h lost.
    A 5-minute-old job with 5 min left saves 0.33 USD and loses only its 5 min: drained at
    a 2 USD/h run rate (0.17 USD), kept at 5 USD/h (0.42). A gang 35 min old (past its
    first checkpoint: 15 min lost on average) running at 12 USD/h over all its nodes would
    lose 3 USD to save this node's 4 USD/h for the 35 min it is expected to go on: kept."""
    long_job = _running([(1.0, _job("long"))])
    assert _names(consolidations(long_job, "lp")) == ["n0"]  # type: ignore[arg-type]
    young = _running([(1.0, _job("young", duration_s=600.0))], now=300.0, rate=2.0)
    assert _names(consolidations(young, "lp")) == ["n0"]  # type: ignore[arg-type]
    dear = _running([(1.0, _job("young", duration_s=600.0))], now=300.0, rate=5.0)
    assert consolidations(dear, "lp") == ()  # type: ignore[arg-type]
    gang = _running([(1.0, _job("gang", duration_s=2400.0))], now=2100.0, rate=12.0)
    assert consolidations(gang, "lp") == ()  # type: ignore[arg-type]
    cheap_gang = _running([(1.0, _job("gang", duration_s=2400.0))], now=2100.0, rate=8.0)
    assert _names(consolidations(cheap_gang, "lp")) == ["n0"]  # type: ignore[arg-type]


def test_lp_moves_a_lone_job_to_another_pools_free_room_that_it_tolerates() -> None:
    """A 1-vCPU job alone on pool "big"'s only node (16 vCPU, 3 USD/h): the rule looked for
    room in the node's own pool only, so a lone job held a big node for hours (gpu-training:
    an 8-GPU node paid for one 1-GPU job). Pool "m" has a node with 3 vCPU free: lp drains
    the big node onto it; a job "m"'s nodes cannot take (8 vCPU) stays, as does a job that
    asks for a GPU model "m" lacks, and one that would need more room than "m" has left."""
    def world(job: Workload, *, receiver_free: float = 3.0) -> FederationSnapshot:
        req = job.spec.resources.cpu
        big = dataclasses.replace(
            pool("big", price=3.0, nodes=1, max_nodes=2, node=Resources(16, 64)),
            node_states=(NodeState(name="b0", cpu_allocated=req, memory_allocated_gib=req,
                                   workloads=(job.id,)),), used=Resources(req, req))
        recv = NodeState(name="m0", cpu_allocated=4.0 - receiver_free,
                         memory_allocated_gib=4.0 - receiver_free)
        m = dataclasses.replace(pool("m", price=1.0, nodes=1, max_nodes=2, node=NODE4),
                                node_states=(recv,), used=Resources(1.0, 1.0))
        c = Cluster(name="c", provider="aws", region="us-east-1", pools=(big, m))
        return dataclasses.replace(snapshot((), clusters=(c,)), workloads={job.id: job})

    assert _names(consolidations(world(_job("lone")), "lp")) == ["b0"]
    wide = workload("wide", kind=WorkloadKind.BATCH, cpu=8.0, mem=8.0, duration_s=7200.0)
    assert consolidations(world(wide), "lp") == ()
    a100 = workload("a100", kind=WorkloadKind.BATCH, duration_s=7200.0, gpu_model="A100")
    assert consolidations(world(a100), "lp") == ()
    # Without room on a running node it stays, unless a new node of a cheaper pool may
    # take it (test_lp_drains_onto_a_new_node_of_a_cheaper_pool_when_no_running_node_can).
    assert consolidations(world(_job("lone"), receiver_free=0.5), "lp", replace=False) == ()


def test_lp_drains_no_cpu_job_onto_a_gke_gpu_node() -> None:
    """A lone CPU job on a big CPU node, and a GPU node with 85 vCPUs free that runs a long
    GPU job. Off GCP the rule moves the job into that free room; on GKE the GPU node carries
    the nvidia.com/gpu taint (feasibility.pool_taints), where the planner would not place the
    job again, so the node stays (before, the drained job came back to a CPU node, which lp
    drained again minutes later: held-out draft 9,300,067)."""
    lone = _job("lone")
    train = workload("train", kind=WorkloadKind.TRAIN, cpu=11.0, mem=11.0, gpu=1,
                     duration_s=36000.0)

    def world(provider: str) -> FederationSnapshot:
        big = dataclasses.replace(
            pool("big", price=3.0, nodes=1, max_nodes=2, node=Resources(16, 64)),
            node_states=(NodeState(name="b0", cpu_allocated=1.0, memory_allocated_gib=1.0,
                                   workloads=(lone.id,)),), used=Resources(1.0, 1.0))
        g = dataclasses.replace(
            pool("g", price=8.0, nodes=1, max_nodes=2, node=Resources(96, 384, 8)),
            node_states=(NodeState(name="g0", cpu_allocated=11.0, memory_allocated_gib=11.0,
                                   gpu_free=7, largest_free_gpu_set=7,
                                   workloads=(train.id,)),),
            used=Resources(11.0, 11.0, 1))
        c = Cluster(name="c", provider=provider, region="r", pools=(big, g))
        return dataclasses.replace(snapshot((), clusters=(c,)),
                                   workloads={lone.id: lone, train.id: train})

    assert _names(consolidations(world("aws"), "lp", replace=False)) == ["b0"]
    assert consolidations(world("gcp"), "lp", replace=False) == ()


def test_no_replacement_puts_a_cpu_node_s_work_on_a_gke_gpu_pool() -> None:
    """Karpenter's replace (consolidate._replacement): a dear CPU node's pods fit one node
    of a cheaper GPU pool. Off GCP that pool is the replacement; on GKE its taint rules it
    out and no other pool is cheaper."""
    job = workload("j", kind=WorkloadKind.BATCH, cpu=3.0, mem=3.0, duration_s=7200.0)

    def world(provider: str) -> FederationSnapshot:
        dear = dataclasses.replace(
            pool("dear", price=3.0, nodes=1, max_nodes=2, node=Resources(16, 64)),
            node_states=(NodeState(name="d0", cpu_allocated=3.0, memory_allocated_gib=3.0,
                                   workloads=(job.id,)),), used=Resources(3.0, 3.0))
        g = pool("g", price=1.0, nodes=0, max_nodes=2, node=Resources(8, 32, 1))
        c = Cluster(name="c", provider=provider, region="r", pools=(dear, g))
        return dataclasses.replace(snapshot((), clusters=(c,)), workloads={job.id: job})

    assert _targets(world("aws")) == [("d0", "g")]
    assert _targets(world("gcp")) == []


def test_lp_never_moves_two_nodes_into_the_same_free_room() -> None:
    """Two pools' lone 2-vCPU jobs and one receiver with 3 vCPU free: one node goes (the
    receiver's room is then taken), the other stays; the receiver itself is not drained."""
    def lone(name: str, job: Workload) -> Pool:
        return dataclasses.replace(
            pool(name, price=3.0, nodes=1, max_nodes=2, node=Resources(16, 64)),
            node_states=(NodeState(name=f"{name}0", cpu_allocated=2.0,
                                   memory_allocated_gib=2.0, workloads=(job.id,)),),
            used=Resources(2.0, 2.0))
    j1, j2, j3 = (workload(w, kind=WorkloadKind.BATCH, cpu=2.0, mem=2.0, duration_s=7200.0)
                  for w in ("j1", "j2", "j3"))
    recv = NodeState(name="m0", cpu_allocated=1.0, memory_allocated_gib=1.0,
                     workloads=(j3.id,))
    m = dataclasses.replace(pool("m", price=1.0, nodes=1, max_nodes=2, node=NODE4),
                            node_states=(recv,), used=Resources(1.0, 1.0))
    c = Cluster(name="c", provider="aws", region="us-east-1",
                pools=(lone("a", j1), lone("b", j2), m))
    snap = dataclasses.replace(snapshot((), clusters=(c,)),
                               workloads={w.id: w for w in (j1, j2, j3)})
    assert _names(consolidations(snap, "lp", replace=False)) == ["a0"]
    # With replacements, b0's job may go to the one node pool "m" can still add.
    assert _names(consolidations(snap, "lp")) == ["a0", "b0"]


def test_lp_never_moves_work_onto_a_node_that_would_then_outlive_its_own_work() -> None:
    """A 2 h job alone on a 1 USD/h node; the only receiver (3 USD/h) runs a job that ends in
    10 min. The move would keep that node up for the moved job's 2 h instead (3 USD for the
    first hour) to save 1 USD: kept. When the receiver's own job runs 3 h more it costs
    nothing extra: drained. A pool kept at its forecast floor drains nothing."""
    def world(receiver_job_s: float) -> FederationSnapshot:
        job = _job("j", duration_s=7200.0)
        own = _job("own", duration_s=receiver_job_s)
        cheap = dataclasses.replace(
            pool("cheap", price=1.0, nodes=1, max_nodes=2, node=NODE4),
            node_states=(NodeState(name="c0", cpu_allocated=1.0, memory_allocated_gib=1.0,
                                   workloads=("j",)),), used=Resources(1.0, 1.0))
        big = dataclasses.replace(
            pool("big", price=3.0, nodes=1, max_nodes=2, node=Resources(16, 64)),
            node_states=(NodeState(name="b0", cpu_allocated=9.0, memory_allocated_gib=9.0,
                                   workloads=("own",)),), used=Resources(9.0, 9.0))
        c = Cluster(name="c", provider="aws", region="us-east-1", pools=(cheap, big))
        return dataclasses.replace(snapshot((), clusters=(c,)), workloads={"j": job, "own": own})

    assert consolidations(world(600.0), "lp") == ()
    assert _names(consolidations(world(3 * 3600.0), "lp")) == ["c0"]
    assert consolidations(world(3 * 3600.0), "lp", floor=lambda c, p: p.nodes) == ()
    assert _names(consolidations(world(3 * 3600.0), "lp", floor=lambda c, p: 0)) == ["c0"]


# ---- Karpenter's replace path (consolidate.replacements) --------------------------------

SMALL = Resources(cpu=2, memory_gib=8)


def _replace_world(loads: list[tuple[float, Workload | None]], *,
                   source: PricingModel = PricingModel.ON_DEMAND,
                   others: tuple[Pool, ...] | None = None, leaving: int = 0,
                   quota_vcpu: float | None = None) -> FederationSnapshot:
    """Cluster c: pool "src" (4 vCPU, 1 USD/h, `source` pricing) with a node per (vCPU used,
    workload on it); none of them has room for another's work, so nothing can be deleted.
    Other pools: "src-spot" (same shape, spot, 0.35 USD/h), "small" (2 vCPU on-demand,
    0.5 USD/h), "small-spot" (0.15 USD/h), "big" (16 vCPU, 3 USD/h)."""
    states = [NodeState(name=f"n{i}", cpu_allocated=cpu, memory_allocated_gib=cpu,
                        workloads=(w.id,) if w is not None else ())
              for i, (cpu, w) in enumerate(loads)]
    states += [NodeState(name=f"x{i}", cpu_allocated=4.0, memory_allocated_gib=4.0,
                         leaving=NodeLeaving.TERMINATING) for i in range(leaving)]
    used = sum(s.cpu_allocated for s in states)
    src = dataclasses.replace(
        pool("src", price=1.0, nodes=len(states), max_nodes=len(states), node=NODE4,
             pricing=source), node_states=tuple(states), used=Resources(used, used))
    if others is None:
        others = (pool("src-spot", price=0.35, nodes=0, max_nodes=40, node=NODE4,
                       pricing=PricingModel.SPOT),
                  pool("small", price=0.5, nodes=0, max_nodes=40, node=SMALL),
                  pool("small-spot", price=0.15, nodes=0, max_nodes=40, node=SMALL,
                       pricing=PricingModel.SPOT),
                  pool("big", price=3.0, nodes=0, max_nodes=40, node=Resources(16, 64)))
    c = Cluster(name="c", provider="aws", region="us-east-1", pools=(src, *others),
                quota_vcpu=quota_vcpu)
    wls = {w.id: w for _, w in loads if w is not None}
    return dataclasses.replace(snapshot((), clusters=(c,)), workloads=wls)


def _targets(snap: FederationSnapshot, policy: str = "karpenter") -> list[tuple[str, str]]:
    return [(r.node, r.target_pool) for r in replacements(snap, policy)]


def test_karpenter_replaces_a_node_by_the_cheapest_fitting_pool_it_tolerates() -> None:
    # n0's 3 vCPU fit neither on n1 (full) nor on a 2-vCPU node: the same type on spot,
    # 0.35 < 1 USD/h, is the one cheaper node that holds them.
    snap = _replace_world([(3.0, workload("a", cpu=3.0)), (4.0, workload("b", cpu=4.0))])
    assert consolidations(snap, "karpenter") == ()  # nothing to delete ...
    plan = replacements(snap, "karpenter")  # ... but n0 can go to a cheaper node
    assert [(r.cluster, r.pool, r.node, r.target_pool) for r in plan] == [
        ("c", "src", "n0", "src-spot")]
    assert plan[0].saving_usd_per_hour == pytest.approx(0.65)
    assert plan[0].reason == "consolidate"
    # 1.5 vCPU of work fits the 2-vCPU type: its spot node is cheapest of all.
    small = _replace_world([(1.5, workload("a", cpu=1.5)), (4.0, workload("b", cpu=4.0))])
    assert _targets(small) == [("n0", "small-spot")]


def test_karpenter_never_replaces_onto_a_pool_the_pods_do_not_tolerate() -> None:
    # A workload that refuses spot keeps to on-demand: the cheaper 2-vCPU on-demand type
    # when its work fits it, nothing when it does not.
    pinned = workload("p", cpu=1.5, spot_ok=False)
    fits_small = _replace_world([(1.5, pinned), (4.0, workload("b", cpu=4.0))])
    assert _targets(fits_small) == [("n0", "small")]
    too_big = _replace_world([(3.0, workload("p", cpu=3.0, spot_ok=False)),
                              (4.0, workload("b", cpu=4.0, spot_ok=False))])
    assert _targets(too_big) == []
    # A GPU job asking for A100s does not go to a cheaper V100 node.
    a100 = pool("a100", price=10.0, nodes=1, max_nodes=1, node=Resources(32, 256, 8),
                gpu_model="A100", interconnect=Interconnect.NVLINK_FULL)
    v100 = pool("v100", price=4.0, nodes=0, max_nodes=4, node=Resources(32, 256, 8),
                gpu_model="V100", interconnect=Interconnect.NVLINK_FULL)
    job = workload("t", kind=WorkloadKind.TRAIN, cpu=4.0, gpu=1, gpu_model="A100")
    node = NodeState(name="g0", cpu_allocated=4.0, memory_allocated_gib=4.0, gpu_free=7,
                     workloads=("t",))
    a100 = dataclasses.replace(a100, node_states=(node,))
    c = Cluster(name="c", provider="aws", region="us-east-1", pools=(a100, v100))
    gpu = dataclasses.replace(snapshot((), clusters=(c,)), workloads={"t": job})
    assert replacements(gpu, "karpenter") == ()
    anymodel = dataclasses.replace(gpu, workloads={"t": dataclasses.replace(
        job, spec=dataclasses.replace(job.spec, gpu_model=None))})
    assert _targets(anymodel) == [("g0", "v100")]
    # A node that does not say what runs on it, or runs something without a known spec, is
    # left alone: its pods' tolerations cannot be checked (n0 is the least used, so it
    # would be first; the full n1, whose workload is known, goes instead).
    unknown = _replace_world([(3.0, None), (4.0, workload("b", cpu=4.0))])
    assert _targets(unknown) == [("n1", "src-spot")]
    no_spec = dataclasses.replace(_replace_world([(3.0, workload("a", cpu=3.0))]),
                                  workloads={})
    assert _targets(no_spec) == []


def test_karpenter_never_replaces_a_spot_node_at_the_default_feature_gates() -> None:
    # SpotToSpotConsolidation is off by default: a spot candidate is not replaced, neither
    # by a cheaper spot node nor by a cheaper on-demand one (Karpenter sends every spot
    # candidate whose replacement may be spot to the gated path).
    others = (pool("small-spot", price=0.1, nodes=0, max_nodes=40, node=SMALL,
                   pricing=PricingModel.SPOT),
              pool("small", price=0.2, nodes=0, max_nodes=40, node=SMALL))
    snap = _replace_world([(1.0, workload("a")), (4.0, workload("b", cpu=4.0))],
                          source=PricingModel.SPOT, others=others)
    assert _targets(snap) == []
    on_demand = _replace_world([(1.0, workload("a")), (4.0, workload("b", cpu=4.0))],
                               others=others)
    assert _targets(on_demand) == [("n0", "small-spot")]  # the same node on demand: replaced


def test_karpenter_replaces_within_the_ten_percent_budget_less_those_in_flight() -> None:
    full = [(4.0, workload(f"w{i}", cpu=4.0)) for i in range(20)]
    assert len(_targets(_replace_world(full))) == 2  # ceil(10 % of 20)
    # Nodes already being replaced (leaving) use the budget up: ceil(10 % of 21) - 1 = 2,
    # ceil(10 % of 22) - 2 = 1.
    assert len(_targets(_replace_world(full, leaving=1))) == 2
    assert len(_targets(_replace_world(full, leaving=2))) == 1
    assert len(_targets(_replace_world(full[:9], leaving=1))) == 0
    # The target must be able to add the node: max_nodes, and the cluster's vCPU quota
    # (20 nodes x 4 vCPU provisioned; 84 leaves room for one 4-vCPU replacement).
    capped = (pool("src-spot", price=0.35, nodes=0, max_nodes=1, node=NODE4,
                   pricing=PricingModel.SPOT),)
    assert len(_targets(_replace_world(full, others=capped))) == 1
    assert len(_targets(_replace_world(full, quota_vcpu=84.0))) == 1
    # A pool something is deleted from this epoch gets no replacement (one command at a
    # time); neither does a growing pool, nor any policy but karpenter.
    snap = _replace_world(full)
    drain = (PoolScaleIn("c", "src", ("n5",), reason="consolidate"),)
    assert replacements(snap, "karpenter", drains=drain) == ()
    assert replacements(snap, "karpenter", skip={("c", "src")}) == ()
    for policy in ("lp", "greedy", "traditional"):
        assert _targets(snap, policy) == []


def test_plan_epoch_carries_karpenters_replacements() -> None:
    from broker.domain import PolicyAction
    from broker.placement.planner import PlannerConfig, plan_epoch

    snap = _replace_world([(3.0, workload("a", cpu=3.0)), (4.0, workload("b", cpu=4.0))])
    plan = plan_epoch(snap, PolicyAction(), PlannerConfig(), policy="karpenter")
    assert [(r.node, r.target_pool) for r in plan.replacements] == [("n0", "src-spot")]
    assert plan_epoch(snap, PolicyAction(), PlannerConfig(), policy="lp").replacements == ()


def test_a_drain_never_counts_on_a_node_removed_the_same_epoch() -> None:
    # Regression: n1 is empty, so karpenter removes it at once (consolidateAfter 0 s); the
    # delete rule used it as the receiver of n0's pods in the same plan, so n0 was drained
    # too and its pods found no room (retail-peak: 470 drains a run, services' replicas
    # evicted every few minutes). Karpenter's simulation excludes nodes it removes.
    idle = NodeState(name="n1", idle_since_s=0.0)
    busy = NodeState(name="n0", cpu_allocated=2.0, memory_allocated_gib=2.0)
    p = dataclasses.replace(pool("m", price=1.0, nodes=2, max_nodes=4, node=NODE4),
                            node_states=(busy, idle), used=Resources(2.0, 2.0))
    c = Cluster(name="c", provider="aws", region="us-east-1", pools=(p,))
    snap = snapshot((), clusters=(c,))
    assert _names(consolidations(snap, "karpenter")) == ["n0"]  # n1 as the receiver
    gone = (PoolScaleIn("c", "m", ("n1",)),)
    assert consolidations(snap, "karpenter", removing=gone) == ()
    from broker.domain import PolicyAction
    from broker.placement.planner import PlannerConfig, plan_epoch

    plan = plan_epoch(snap, PolicyAction(), PlannerConfig(), policy="karpenter")
    assert [(s.nodes, s.reason) for s in plan.scale_in] == [(("n1",), "idle")]


def test_nodes_drained_in_one_epoch_do_not_share_the_same_free_room() -> None:
    # Regression: n0's 1 vCPU fits n1's and n2's free room; n1's 1 vCPU then fits only
    # n2's one free vCPU, which n0's pods already take: only n0 may go (11 nodes: the
    # budget would allow two).
    plan = consolidations(_world([1.0, 1.0, 3.0] + [4.0] * 8), "karpenter")  # type: ignore[arg-type]
    assert _names(plan) == ["n0"]


def test_lp_drains_onto_a_new_node_of_a_cheaper_pool_when_no_running_node_can() -> None:
    """An 8-GPU node (24 USD/h) runs one 2-GPU job with 2 h left, and no running node has 2
    GPUs free: the rule kept the node up for the job's 2 h (before 2026-12-07). A 4-GPU pool
    at 8 USD/h may add a node: the drain saves 24 USD over the hour counted against 8 USD
    for that node and the job's lost work and wait, so the node is drained (the next epoch
    places the job again). Not when the cheaper pool can add no node, nor when the job
    needs what that pool lacks, nor when the rule is off, nor when its boot (as the node
    charge counts it) makes the wait cost more than the saving."""
    def world(*, can_add: bool = True, model: str | None = None,
              boot_s: float | None = None) -> FederationSnapshot:
        job = workload("train", kind=WorkloadKind.TRAIN, cpu=20.0, mem=150.0, gpu=2,
                       duration_s=7200.0, spot_ok=True, gpu_model=model)
        big = dataclasses.replace(
            pool("p8", price=24.0, nodes=1, max_nodes=2, node=Resources(96, 1152, 8),
                 gpu_model="A100"),
            node_states=(NodeState(name="b0", cpu_allocated=20.0, memory_allocated_gib=150.0,
                                   gpu_free=6, largest_free_gpu_set=6,
                                   workloads=(job.id,)),),
            used=Resources(20.0, 150.0, 2), boot_s=boot_s)
        small = pool("p4", price=8.0, nodes=0, max_nodes=2 if can_add else 0,
                     node=Resources(48, 384, 4), gpu_model="T4")
        c = Cluster(name="c", provider="aws", region="us-east-1", pools=(big, small))
        return dataclasses.replace(snapshot((), clusters=(c,)), workloads={job.id: job})

    assert _names(consolidations(world(), "lp")) == ["b0"]
    assert consolidations(world(), "lp", replace=False) == ()
    assert consolidations(world(can_add=False), "lp") == ()
    assert consolidations(world(model="A100"), "lp") == ()
    # The new node's boot is the node charge's (candidates.boot_estimates): "p4" has none
    # measured, so its provider's median, here p8's 3 h: 8 USD for the hour counted and 18
    # USD of the job's wait (6 USD/h, its share of p8) are more than the 24 USD saved.
    assert consolidations(world(boot_s=10800.0), "lp") == ()
    assert _names(consolidations(world(boot_s=10800.0), "lp", observed_boot=False)) == ["b0"]
