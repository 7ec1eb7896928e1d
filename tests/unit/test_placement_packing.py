"""The packing model (lp.py, candidates.py): paid nodes are filled before nodes are opened."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from broker.domain import (
    Cluster,
    FederationSnapshot,
    PolicyAction,
    Resources,
    Workload,
    WorkloadKind,
)
from broker.placement import rounding
from broker.placement.candidates import BILLING_MIN_S, NODE_BOOT_S, build_candidates
from broker.placement.feasibility import bought_for_gpus, capacity_shares
from broker.placement.ledger import Ledger, penalties
from broker.placement.planner import PlannerConfig, plan_epoch

from .placement_world import GPU_NODE, pool, snapshot, workload

PACKING = PlannerConfig(time_limit_s=2.0)
PER_REPLICA = dataclasses.replace(PACKING, packing=False)
ACTION = PolicyAction()


def nodes_opened(plan: object) -> int:
    return sum(s.add_nodes for s in plan.scale)  # type: ignore[attr-defined]


def pools_used(plan: object) -> set[tuple[str, str]]:
    return {(a.cluster, a.pool) for p in plan.placements  # type: ignore[attr-defined]
            for a in p.assignments}


def two_clouds(*, dear_nodes: int = 0, dear_used: float = 0.0) -> tuple[Cluster, ...]:
    """A cheap pool with no node running and a dearer one; same node shape, same region."""
    return (
        Cluster(name="cheap", provider="aws", region="us-east-1",
                pools=(pool("c", price=0.30, nodes=0, max_nodes=4),)),
        Cluster(name="dear", provider="aws", region="us-east-1",
                pools=(pool("d", price=0.40, nodes=dear_nodes, max_nodes=4,
                            used=Resources(cpu=dear_used, memory_gib=dear_used)),)),
    )


def test_a_running_node_with_room_is_filled_before_a_cheaper_node_is_opened() -> None:
    """One dear node runs with 6 of 8 vCPUs free (5.7 at the default headroom): the
    per-replica model still opens a node of the cheaper pool (its per-replica share is
    lower), the packing model puts the 5 replicas in the paid room."""
    snap = snapshot((workload("a", replicas=3), workload("b", replicas=2)),
                    clusters=two_clouds(dear_nodes=1, dear_used=2.0))
    per_replica = plan_epoch(snap, ACTION, PER_REPLICA)
    packed = plan_epoch(snap, ACTION, PACKING)
    assert per_replica.unplaced == {}
    assert packed.unplaced == {}
    assert nodes_opened(per_replica) == 1
    assert nodes_opened(packed) == 0
    assert pools_used(packed) == {("dear", "d")}


def test_the_packing_model_opens_fewer_nodes_than_the_per_replica_model() -> None:
    """No node runs anywhere. `b` may only use the dear cluster, so a dear node opens either
    way; `a` is cheaper per replica in the cheap pool, but the room left on b's new node is
    paid once it is opened: packing puts both on one node, per-replica opens two."""
    wls = (workload("a", replicas=2), workload("b", replicas=2, cluster_names=("dear",)))
    snap = snapshot(wls, clusters=two_clouds())
    per_replica = plan_epoch(snap, ACTION, PER_REPLICA)
    packed = plan_epoch(snap, ACTION, PACKING)
    assert per_replica.unplaced == {}
    assert packed.unplaced == {}
    assert nodes_opened(per_replica) == 2
    assert nodes_opened(packed) == 1
    assert nodes_opened(packed) < nodes_opened(per_replica)
    assert packed.stats.lp_bound is not None
    assert packed.stats.objective >= packed.stats.lp_bound - 1e-6


def test_packing_still_opens_the_nodes_the_batch_needs() -> None:
    """Fixed charges never make the planner leave work out: 20 one-vCPU replicas on 8-vCPU
    nodes need three nodes (headroom 1), and all are placed."""
    snap = snapshot((workload("big", replicas=20),), clusters=two_clouds())
    plan = plan_epoch(snap, PolicyAction(headroom=1.0), PACKING)
    assert plan.unplaced == {}
    assert sum(p.placed_replicas for p in plan.placements) == 20
    assert nodes_opened(plan) == 3


@pytest.mark.parametrize(("duration_s", "span_s"), [(10.0, 60.0), (1800.0, 1800.0),
                                                   (36000.0, 3600.0)])
def test_node_charge_is_boot_plus_billing_minimum_or_the_work_up_to_the_horizon(
        duration_s: float, span_s: float) -> None:
    """price x (boot + max(billing minimum, min(horizon, longest job))): a 10 s job pays the
    60 s AWS minimum, a 30 min job its half hour, a 10 h job the 1 h horizon."""
    w = workload("j", kind=WorkloadKind.BATCH, duration_s=duration_s)
    cs = build_candidates(snapshot((w,), clusters=two_clouds()), ACTION, k=4,
                          service_horizon_h=1.0, packing=True)
    assert cs.node_usd is not None
    assert BILLING_MIN_S["aws"] == 60.0
    expected = 0.30 * (NODE_BOOT_S + span_s) / 3600.0
    assert cs.node_usd[0] == pytest.approx(expected)


def test_greedy_keeps_the_seed_price_under_packing() -> None:
    """The greedy baseline copies the seed's per-quote price: the packing model's marginal
    compute must not change its choice (the cheap pool, whole-price cheapest)."""
    snap = snapshot((workload("a", replicas=2),), clusters=two_clouds(dear_nodes=1))
    assert pools_used(plan_epoch(snap, ACTION, PACKING, policy="greedy")) == {("cheap", "c")}
    assert pools_used(plan_epoch(snap, ACTION, PER_REPLICA, policy="greedy")) == \
        {("cheap", "c")}


def test_node_charge_counts_the_idle_timer_the_node_is_paid_for_after_its_work() -> None:
    """A node opened for work stays paid after its last replica leaves, for the policy's
    idle timer (DecisionConfig.forecast_idle_s for lp; PolicyAction.idle_timeout_s per
    cluster): the charge is price x (boot + idle timer + the work's span). Without the idle
    timer a 6-minute 1-GPU job looked cheaper on a new 8-GPU node than in paid room."""
    w = workload("j", kind=WorkloadKind.BATCH, duration_s=1800.0)
    snap = snapshot((w,), clusters=two_clouds())
    plain = build_candidates(snap, ACTION, k=4, service_horizon_h=1.0, packing=True,
                             node_idle_s=120.0)
    longer = build_candidates(snap, PolicyAction(idle_timeout_s={"cheap": 900.0}), k=4,
                              service_horizon_h=1.0, packing=True, node_idle_s=120.0)
    assert plain.node_usd is not None
    assert longer.node_usd is not None
    assert plain.node_usd[0] == pytest.approx(0.30 * (NODE_BOOT_S + 120.0 + 1800.0) / 3600.0)
    assert longer.node_usd[0] == pytest.approx(0.30 * (NODE_BOOT_S + 900.0 + 1800.0) / 3600.0)
    assert longer.node_usd[1] == pytest.approx(plain.node_usd[1])  # other clusters keep 120 s
    # plan_epoch charges lp's own idle timer.
    cfg = PlannerConfig(time_limit_s=2.0)
    from broker.placement.planner import candidates

    cs = candidates(snap, ACTION, cfg)
    assert cs.node_usd is not None
    assert cs.node_usd[0] == pytest.approx(
        0.30 * (NODE_BOOT_S + cfg.decisions.forecast_idle_s + 1800.0) / 3600.0)


def _home_and_away() -> FederationSnapshot:
    """A 4-replica job whose 10 GB input is at home (3.0 USD/h, a free node) and a cheaper
    cluster away (0.6 USD/h) with room for 2 replicas."""
    from broker.domain import DataSource

    clusters = (
        Cluster(name="home", provider="aws", region="us-east-1",
                pools=(pool("h", price=3.0, nodes=1, max_nodes=1),)),
        Cluster(name="away", provider="gcp", region="us-central1",
                pools=(pool("a", price=0.6, nodes=1, max_nodes=1,
                            used=Resources(cpu=5.2, memory_gib=5.2)),)),
    )
    job = workload("j", kind=WorkloadKind.BATCH, replicas=4, duration_s=3600.0,
                   data=(DataSource(size_gb=10.0, location="home"),))
    return snapshot((job,), clusters=clusters)


def test_a_job_is_not_split_where_each_further_cluster_needs_its_own_copy_of_the_data() -> None:
    """Every cluster that runs a replica needs the whole input (the twin moves it to each).
    The LP shares one copy's egress among the replicas, so 2 of 4 replicas in a remote
    cluster with room for 2 looked cheaper (per replica 0.075 compute + 0.225 egress vs
    0.375 at home) although the copy costs 0.90 whatever the replicas: 0.30 USD more than
    keeping all four at home. The integer objective (Ledger.split_egress) counts the copy."""
    plan = plan_epoch(_home_and_away(), ACTION, PACKING, policy="lp")
    [p] = plan.placements
    assert {a.cluster: a.replicas for a in p.assignments} == {"home": 4}
    assert not plan.unplaced


def test_the_pulp_back_end_runs_the_moves_the_highs_path_runs_after_its_plan() -> None:
    """The same split job through PuLP (CBC): its MIP prices the input as one shared copy,
    so its plan splits the job 2 + 2 (1.8 USD against 1.5 at home). On a model above
    mip_max_columns the HiGHS path merges it back (rounding.merge_splits); PuLP's plan got
    no move at all before. No greedy incumbent here: it is whole at home and would hide it."""
    snap = _home_and_away()
    moves = dataclasses.replace(PACKING, greedy_incumbent=False, mip_max_columns=0)
    plans = {solver: plan_epoch(snap, ACTION, dataclasses.replace(moves, solver=solver))
             for solver in ("highs", "pulp-cbc")}
    for solver, plan in plans.items():
        [p] = plan.placements
        assert {a.cluster: a.replicas for a in p.assignments} == {"home": 4}, solver
        assert plan.stats.source.endswith("+merged"), solver
    assert plans["pulp-cbc"].stats.source == "pulp+merged"
    assert plans["pulp-cbc"].stats.objective == pytest.approx(plans["highs"].stats.objective)


def _rounded(pending: tuple[Workload, ...], clusters: tuple[Cluster, ...],
             on: tuple[str, ...]) -> tuple[Ledger, np.ndarray, dict[str, int]]:
    """A ledger with workload i placed whole on cluster on[i], as a rounding might."""
    snap = snapshot(pending, clusters=clusters)
    cs = build_candidates(snap, ACTION, k=8, service_horizon_h=1.0, packing=True)
    pen = penalties(cs, 1000.0)
    ledger = Ledger(cs, snap)
    where = {o.cluster.name: o.index for o in cs.options}
    for i, name in enumerate(on):
        ledger.add(i, where[name], int(cs.replicas[i]))
    return ledger, pen, where


def test_node_closing_moves_refill_paid_room_and_open_fewer_nodes() -> None:
    """Two services on the cheap pool need two new nodes there (6 + 4 CPUs on 8-CPU nodes)
    while the dear pool's running node is empty: one moves into the paid room."""
    ledger, pen, where = _rounded((workload("a", cpu=6, mem=6), workload("b", cpu=4, mem=4)),
                                  two_clouds(dear_nodes=1), ("cheap", "cheap"))
    assert int(ledger.new_nodes[where["cheap"]]) == 2
    before = ledger.objective(pen)
    assert rounding.close_nodes(ledger, pen, budget_s=5.0) >= 1
    assert int(ledger.new_nodes[where["cheap"]]) == 1
    assert int(ledger.new_nodes[where["dear"]]) == 0
    assert sorted(o for xw in ledger.x for o in xw) == sorted(where.values())
    assert ledger.objective(pen) < before


def test_node_closing_moves_stop_on_their_count_and_undo_what_does_not_pay() -> None:
    """PlannerConfig.deterministic caps them by tries; a move that saves nothing (the only
    way to close the cheap node is to open a dearer one) is undone exactly."""
    ledger, pen, where = _rounded((workload("a", cpu=6, mem=6), workload("b", cpu=4, mem=4)),
                                  two_clouds(dear_nodes=1), ("cheap", "cheap"))
    saved = [dict(xw) for xw in ledger.x]
    assert rounding.close_nodes(ledger, pen, budget_s=math.inf, max_tries=0) == 0
    assert [dict(xw) for xw in ledger.x] == saved
    ledger, pen, where = _rounded((workload("a", cpu=6, mem=6),), two_clouds(),
                                  ("cheap",))
    before = ledger.objective(pen)
    assert rounding.close_nodes(ledger, pen, budget_s=math.inf, max_tries=5) == 0
    assert ledger.x[0] == {where["cheap"]: 1}
    assert int(ledger.new_nodes[where["cheap"]]) == 1
    assert int(ledger.new_nodes[where["dear"]]) == 0
    assert ledger.objective(pen) == before


def _placed(pending: tuple[Workload, ...], clusters: tuple[Cluster, ...],
            adds: tuple[tuple[int, str, int], ...]
            ) -> tuple[Ledger, np.ndarray, dict[str, int]]:
    """A ledger with (workload, cluster, replicas) placed, as a rounding or a MIP might."""
    snap = snapshot(pending, clusters=clusters)
    cs = build_candidates(snap, ACTION, k=8, service_horizon_h=1.0, packing=True)
    ledger = Ledger(cs, snap)
    where = {o.cluster.name: o.index for o in cs.options}
    for w, name, m in adds:
        ledger.add(w, where[name], m)
    return ledger, penalties(cs, 1000.0), where


def _site(name: str, region: str, used: float) -> Cluster:
    """One 8-vCPU node at 0.3 USD/h and no more (7.2 vCPUs at the default headroom):
    `used` 3.2 leaves room for 4 one-vCPU replicas, 5.2 for 2."""
    return Cluster(name=name, provider="aws", region=region,
                   pools=(pool(name[0], price=0.3, nodes=1, max_nodes=1,
                               used=Resources(cpu=used, memory_gib=used)),))


def _job(name: str, size_gb: float, location: str) -> Workload:
    from broker.domain import DataSource

    return workload(name, kind=WorkloadKind.BATCH, replicas=4, duration_s=3600.0,
                    data=(DataSource(size_gb=size_gb, location=location),))


def _split_job(home_used: float = 0.0) -> tuple[Ledger, np.ndarray, dict[str, int]]:
    """The job above, rounded as the LP's shared copy suggests: 2 replicas home, 2 away."""
    clusters = (
        Cluster(name="home", provider="aws", region="us-east-1",
                pools=(pool("h", price=3.0, nodes=1, max_nodes=1,
                            used=Resources(cpu=home_used, memory_gib=home_used)),)),
        Cluster(name="away", provider="gcp", region="us-central1",
                pools=(pool("a", price=0.6, nodes=1, max_nodes=1,
                            used=Resources(cpu=5.2, memory_gib=5.2)),)),
    )
    return _placed((_job("j", 10.0, "home"),), clusters, ((0, "home", 2), (0, "away", 2)))


def test_merge_moves_put_a_split_job_in_one_cluster_when_the_copies_cost_more() -> None:
    """A plan from the MIP or the rounding may split a job the LP priced with one shared
    copy; the merge move fills it again in one cluster and keeps that when cheaper."""
    ledger, pen, where = _split_job()
    before = ledger.objective(pen)
    assert ledger.split_egress(0) > 0
    assert rounding.merge_splits(ledger, pen, budget_s=5.0) == 1
    assert ledger.x[0] == {where["home"]: 4}
    assert ledger.split_egress(0) == 0.0
    assert ledger.objective(pen) < before


def test_merge_moves_stop_on_their_count_and_keep_replicas_placed() -> None:
    """No tries allowed: nothing moves. Home full but for 2 replicas: merging there would
    leave 2 unplaced, so the split stays, exactly as it was."""
    ledger, pen, where = _split_job()
    assert rounding.merge_splits(ledger, pen, budget_s=math.inf, max_tries=0) == 0
    assert ledger.x[0] == {where["home"]: 2, where["away"]: 2}
    ledger, pen, where = _split_job(home_used=5.2)
    assert ledger.x[0] == {where["home"]: 2, where["away"]: 2}
    saved = dict(ledger.x[0])
    before = ledger.objective(pen)
    assert rounding.merge_splits(ledger, pen, budget_s=math.inf) == 0
    assert ledger.x[0] == saved
    assert ledger.objective(pen) == pytest.approx(before)


def test_merge_moves_pass_again_when_a_kept_move_frees_room() -> None:
    """`a` (the larger copy, tried first) cannot merge while `b` holds half of home; `b`
    then merges into `other`, where its data is, and the next pass merges `a` at home."""
    clusters = (_site("home", "us-east-1", 3.2), _site("away", "us-west-2", 5.2),
                _site("other", "eu-west-1", 3.2))
    ledger, pen, where = _placed(
        (_job("a", 40.0, "home"), _job("b", 10.0, "other")), clusters,
        ((0, "home", 2), (0, "away", 2), (1, "home", 2), (1, "other", 2)))
    assert ledger.split_egress(0) > ledger.split_egress(1) > 0
    before = ledger.objective(pen)
    assert rounding.merge_splits(ledger, pen, budget_s=math.inf) == 2
    assert ledger.x[0] == {where["home"]: 4}
    assert ledger.x[1] == {where["other"]: 4}
    assert ledger.objective(pen) < before


def test_merge_moves_try_a_cluster_the_workload_does_not_run_in_yet() -> None:
    """Split over two full sites, `a` fits whole only in a third (where its data is)."""
    clusters = (_site("home", "us-east-1", 5.2), _site("away", "us-west-2", 5.2),
                _site("other", "eu-west-1", 3.2))
    ledger, pen, where = _placed((_job("a", 40.0, "other"),), clusters,
                                 ((0, "home", 2), (0, "away", 2)))
    before = ledger.objective(pen)
    assert rounding.merge_splits(ledger, pen, budget_s=math.inf) == 1
    assert ledger.x[0] == {where["other"]: 4}
    assert ledger.objective(pen) < before


def _g5(*, running_8gpu: int = 0) -> tuple[Cluster, ...]:
    """AWS il-central-1's A10G node types at the list prices of the draft that showed the
    problem (seed 9,200,031): g5.16xlarge, 1 GPU at 4.80 USD/h, and g5.12xlarge, 4 GPUs at
    7.31 USD/h, none running; optionally idle running 8-GPU nodes (room elsewhere)."""
    pools = [pool("g5.16xlarge", price=4.80, nodes=0, max_nodes=8,
                  node=Resources(cpu=64, memory_gib=256, gpu=1), gpu_model="A10G"),
             pool("g5.12xlarge", price=7.31, nodes=0, max_nodes=8,
                  node=Resources(cpu=48, memory_gib=192, gpu=4), gpu_model="A10G")]
    if running_8gpu:
        pools.append(pool("g5.48xlarge", price=16.29, nodes=running_8gpu,
                          max_nodes=running_8gpu, node=GPU_NODE, gpu_model="A10G"))
    return (Cluster(name="il", provider="aws", region="il-central-1", pools=tuple(pools)),)


ONE_GPU_JOB = workload("j", kind=WorkloadKind.BATCH, cpu=8.0, mem=30.0, gpu=1,
                       duration_s=600.0)
# Six 1-GPU jobs an hour have been placed in the cluster (the prewarm forecast's EWMA).
SIX_AN_HOUR = {("il", "g5.16xlarge"): (0.0, 6.0 / 3600.0)}


def test_a_forecast_of_more_gpu_jobs_opens_the_node_that_costs_less_per_gpu() -> None:
    """One 1-GPU job, 10 minutes. Alone it pays less on the 1-GPU node (its whole charge,
    4.80 x 14 min, plus its run: 1.92 USD) than on the 4-GPU one (7.31 x 14 min plus a
    quarter of the node for its run: 2.01). With six such jobs an hour forecast, 1.4 GPUs
    arrive over the bigger node's life and pay for part of it (1.71 USD left for this job),
    so lp opens the node that costs 1.83 USD per GPU-hour, not 4.80. The 1-GPU node gets
    no such share: its one job fills it. DecisionConfig.fill_forecast=False restores the
    whole charge."""
    quiet = snapshot((ONE_GPU_JOB,), clusters=_g5())
    busy = snapshot((ONE_GPU_JOB,), clusters=_g5(), demand=SIX_AN_HOUR)
    assert pools_used(plan_epoch(quiet, ACTION, PACKING)) == {("il", "g5.16xlarge")}
    assert pools_used(plan_epoch(busy, ACTION, PACKING)) == {("il", "g5.12xlarge")}
    whole = dataclasses.replace(
        PACKING, decisions=dataclasses.replace(PACKING.decisions, fill_forecast=False))
    assert pools_used(plan_epoch(busy, ACTION, whole)) == {("il", "g5.16xlarge")}


def test_the_share_arrivals_pay_is_half_of_the_room_they_would_fill() -> None:
    """share = 1/2 x min(λL / (F + N), 1 - d/N) of each new node's charge (fill_shares):
    λL the units forecast to arrive over the node's charged life L, F the cluster's free
    room of that kind, N the node's units, d the fewest one replica of the batch takes."""
    def charges(snap: FederationSnapshot, fill: bool) -> np.ndarray:
        cs = build_candidates(snap, ACTION, k=4, service_horizon_h=1.0, packing=True,
                              node_idle_s=120.0, fill_forecast=fill)
        assert cs.node_usd is not None
        return cs.node_usd

    life_s = NODE_BOOT_S + 120.0 + 600.0
    quiet = snapshot((ONE_GPU_JOB,), clusters=_g5())
    assert charges(quiet, True) == pytest.approx(charges(quiet, False))  # nothing arrives
    busy = snapshot((ONE_GPU_JOB,), clusters=_g5(), demand=SIX_AN_HOUR)
    whole, less = charges(busy, False), charges(busy, True)
    arrive = 6.0 / 3600.0 * life_s  # 1.4 GPUs
    assert less[0] == pytest.approx(whole[0])  # its one job fills the 1-GPU node
    assert less[1] == pytest.approx(whole[1] * (1.0 - 0.5 * arrive / 4.0))
    # Free GPUs on running nodes take most arrivals: 16 idle GPUs leave the new node 4/20.
    roomy = snapshot((ONE_GPU_JOB,), clusters=_g5(running_8gpu=2), demand=SIX_AN_HOUR)
    assert charges(roomy, True)[1] == pytest.approx(
        charges(roomy, False)[1] * (1.0 - 0.5 * arrive / (16.0 + 4.0)))
    # A flood fills the room the job leaves, 3 of 4 GPUs, and pays at most half of that.
    flood = snapshot((ONE_GPU_JOB,), clusters=_g5(), demand={("il", "g5.12xlarge"):
                                                             (0.0, 1.0)})
    assert charges(flood, True)[1] == pytest.approx(charges(flood, False)[1] * (1 - 0.375))


def _gpu_cloud(*, nodes: int = 0) -> tuple[Cluster, ...]:
    """One cloud with one pool of 8-GPU, 96-vCPU nodes (GPU_NODE)."""
    return (Cluster(name="gpu", provider="aws", region="us-east-1",
                    pools=(pool("p5", price=98.3, nodes=nodes, max_nodes=4, node=GPU_NODE,
                                gpu_model="H100"),)),)


def test_a_gpu_job_asking_most_of_a_nodes_vcpus_opens_one_node_not_two() -> None:
    """An 8-GPU job asking 88 of a 96-vCPU node's vCPUs fits one node; at the default
    headroom of 0.9 on cpu the plan ordered two (88 / 0.9 > 96) and the second idled to its
    timer (feasibility.capacity_shares: all of a cloud GPU node may be filled)."""
    job = workload("train", kind=WorkloadKind.TRAIN, cpu=88.0, mem=320.0, gpu=8,
                   duration_s=3600.0)
    plan = plan_epoch(snapshot((job,), clusters=_gpu_cloud()), ACTION, PACKING)
    assert plan.unplaced == {}
    assert ACTION.headroom < 88.0 / 96.0
    assert [(s.pool, s.add_nodes) for s in plan.scale] == [("p5", 1)]


def test_eight_one_gpu_jobs_fill_one_eight_gpu_node() -> None:
    """Eight one-GPU jobs asking 11 vCPUs each (88 of 96) go on the one running node's 8
    free GPUs; at 0.9 of its vCPUs (86.4) only 7 fit and a second node was ordered."""
    jobs = tuple(workload(f"j{i}", kind=WorkloadKind.TRAIN, cpu=11.0, mem=64.0, gpu=1,
                          duration_s=3600.0) for i in range(8))
    plan = plan_epoch(snapshot(jobs, clusters=_gpu_cloud(nodes=1)), ACTION, PACKING)
    assert plan.unplaced == {}
    assert sum(p.placed_replicas for p in plan.placements) == 8
    assert plan.scale == ()


def test_cpu_pools_and_fixed_sites_keep_the_headroom() -> None:
    """The full share is for cloud GPU nodes only: a CPU pool and an edge site's GPU server
    keep the policy's ratio on cpu and memory."""
    cs = build_candidates(snapshot((workload("a"),)), ACTION, k=4, service_horizon_h=1.0)
    shares = {(o.cluster.name, o.pool.name): tuple(cs.shares()[o.index]) for o in cs.options}
    h = ACTION.headroom
    assert shares[("aws-use1", "p4d")] == (1.0, 1.0, 1.0)
    assert shares[("aws-use1", "m5")] == (h, h, 1.0)
    assert shares[("edge-nyc", "edge")] == (h, h, 1.0)
    # The vector form and the per-pool rule SLO sizing's room count reads agree everywhere.
    assert all(shares[(o.cluster.name, o.pool.name)]
               == capacity_shares(h, gpu_node=bought_for_gpus(o.cluster, o.pool))
               for o in cs.options)
