"""Tenancy in the pure core: the candidate filter, decision records, what-if, budgets across
epochs (the snapshot merge's committed spend) and edge standbys (issue 13 findings 2, 6)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    PolicyAction,
    PricingModel,
    Resources,
    Site,
    Tenant,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.placement.candidates import build_candidates
from broker.placement.explain import whatif
from broker.placement.planner import POLICIES, PlannerConfig, PlannerError, plan_epoch
from broker.placement.snapshot import Member, MergeInputs, merge
from broker.placement.standby import EdgeServiceNeed, rank_sites
from tests.unit.placement_world import pool, snapshot

ACTION = PolicyAction()
CONFIG = PlannerConfig()


def job(wid: str, tenant: str, cpu: float = 1.0) -> Workload:
    spec = WorkloadSpec(name=wid, kind=WorkloadKind.BATCH, image="img", replicas=1,
                        resources=Resources(cpu=cpu, memory_gib=1.0), duration_s=3600.0)
    return Workload(id=wid, tenant=tenant, spec=spec)


def world() -> tuple[Cluster, ...]:
    """alice's $0.001/h cluster (private), and a federation-wide one at 0.4 USD/h."""
    return (
        Cluster(name="alice-cheap", provider="aws", region="us-east-1",
                pools=(pool("m5", price=0.001),), allowed_tenants=frozenset({"alice"})),
        Cluster(name="fed", provider="aws", region="us-east-1", pools=(pool("m5", price=0.4),)),
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_finding2_every_policy_keeps_tenants_off_others_private_clusters(policy: str) -> None:
    bobs = tuple(job(f"w-bob{i}", "bob") for i in range(4))
    snap = snapshot((*bobs, job("w-alice", "alice")), clusters=world())
    plan = plan_epoch(snap, ACTION, CONFIG, policy=policy)
    where = {p.workload_id: {a.cluster for a in p.assignments} for p in plan.placements}
    assert {w: where[w] for w in where if w != "w-alice"} == {w.id: {"fed"} for w in bobs}
    assert where["w-alice"] <= {"alice-cheap", "fed"}  # (baselines spread by capacity)


def test_finding2_decision_records_never_name_or_count_a_foreign_cluster() -> None:
    snap = snapshot((job("w-bob", "bob"),), clusters=world())
    plan = plan_epoch(snap, ACTION, CONFIG)
    record = plan.placements[0].decision
    assert "alice-cheap" not in json.dumps(record)
    assert record["options"] == 1
    assert sum(record["infeasible"].values()) == 0  # not "tenancy ruled out 1"
    cs = build_candidates(snap, ACTION, k=8, service_horizon_h=CONFIG.service_horizon_h)
    assert cs.visible is not None
    assert cs.visible.tolist() == [[False, True]]


def test_finding2_whatif_onto_a_foreign_cluster_is_the_unknown_cluster_error() -> None:
    snap = snapshot((job("w-bob", "bob"),), clusters=world())
    errors = []
    for name in ("alice-cheap", "nowhere"):
        with pytest.raises(PlannerError) as exc:
            whatif(snap, ACTION, CONFIG, "w-bob", name)
        errors.append(str(exc.value).replace(name, "X"))
    assert errors[0] == errors[1]
    assert whatif(snap, ACTION, CONFIG, "w-bob", "fed")["forced_infeasible"] is False


def test_whatif_never_lists_another_tenants_workloads_as_moved() -> None:
    small = (Cluster(name="fed", provider="aws", region="us-east-1",
                     pools=(pool("m5", price=0.1, nodes=1, max_nodes=1),)),
             Cluster(name="fed2", provider="aws", region="us-east-1",
                     pools=(pool("m5", price=0.2, nodes=1, max_nodes=1),)))
    snap = snapshot((job("w-bob", "bob", cpu=3.0), job("w-eve", "eve", cpu=3.0)),
                    clusters=small)
    base = {p.workload_id: p.assignments[0].cluster
            for p in plan_epoch(snap, ACTION, CONFIG).placements}
    other = "fed2" if base["w-bob"] == "fed" else "fed"
    out = whatif(snap, ACTION, CONFIG, "w-bob", other)
    assert out["others_moved"] == []  # eve moved, but that is eve's business


def test_a_lent_cluster_takes_the_named_tenant_only() -> None:
    clusters = (replace(world()[0], allowed_tenants=frozenset({"alice", "carol"})), world()[1])
    snap = snapshot((job("w-carol", "carol"), job("w-bob", "bob")), clusters=clusters)
    plan = plan_epoch(snap, ACTION, CONFIG)
    where = {p.workload_id: {a.cluster for a in p.assignments} for p in plan.placements}
    assert where == {"w-carol": {"alice-cheap"}, "w-bob": {"fed"}}


def test_merge_scopes_members_and_sums_committed_spend() -> None:
    running = (Placement("w-old", (Assignment("fed", "m5", PricingModel.ON_DEMAND, 1, 0.031),),
                         0.031),)
    inputs = MergeInputs(
        now_s=0.0,
        members=(Member(cluster=world()[1], tenant="ops", operator=True),
                 Member(cluster=replace(world()[0], allowed_tenants=None), tenant="alice",
                        operator=False, lent_to=frozenset({"carol"}))),
        running=running, workloads={"w-old": job("w-old", "bob")},
        tenants=(Tenant("bob", 0.05), Tenant("alice")))
    snap = merge(inputs)
    allowed = {c.name: c.allowed_tenants for c in snap.clusters}
    assert allowed == {"fed": None, "alice-cheap": frozenset({"alice", "carol"})}
    bob = next(t for t in snap.tenants if t.name == "bob")
    assert bob.committed_usd_per_hour == pytest.approx(0.031)
    assert bob.budget_left_usd_per_hour == pytest.approx(0.019)


@pytest.mark.parametrize("policy", POLICIES)
def test_finding6_the_budget_counts_what_already_runs(policy: str) -> None:
    """Five 0.031 USD/h workloads, one per epoch, under a 0.05 USD/h cap: one is placed."""
    cheap = (Cluster(name="fed", provider="aws", region="us-east-1",
                     pools=(pool("m5", price=0.031, node=Resources(1, 4), nodes=8,
                                 max_nodes=8),)),)
    running: list[Placement] = []
    workloads: dict[str, Workload] = {}
    for i in range(5):
        w = job(f"w{i}", "bob")
        workloads[w.id] = w
        inputs = MergeInputs(now_s=float(i), members=(Member(cluster=cheap[0]),),
                             pending=(w,), running=tuple(running), workloads=workloads,
                             tenants=(Tenant("bob", 0.05),))
        plan = plan_epoch(merge(inputs), ACTION, CONFIG, policy=policy)
        running += [p for p in plan.placements if p.placed_replicas]
    assert len(running) == 1
    assert running[0].cost_usd_per_hour == pytest.approx(0.031)


def test_a_failover_never_lands_on_another_tenants_private_site() -> None:
    sites = [Site("mine", 0.0, 0.0, capacity=Resources(8, 32)),
             Site("theirs", 0.0, 0.0, capacity=Resources(8, 32))]
    rtt = {("mine", "u"): 9.0, ("theirs", "u"): 1.0}
    need = EdgeServiceNeed("svc", 0.0, 0.0, rtt_target_ms=10.0, resources=Resources(1, 1),
                           user_key="u")
    assert [c.site for c in rank_sites(need, sites, measured_rtt_ms=rtt)] == ["theirs", "mine"]
    scoped = replace(need, allowed_sites=frozenset({"mine"}))
    assert [c.site for c in rank_sites(scoped, sites, measured_rtt_ms=rtt)] == ["mine"]


def test_edge_services_carry_the_sites_their_tenant_may_use() -> None:
    from broker.domain import UserRegion
    from broker.federation.edge_services import edge_services

    spec = WorkloadSpec(name="svc", kind=WorkloadKind.SERVICE, image="img", replicas=1,
                        resources=Resources(1, 2), user_region="osaka", latency_slo_ms=10.0)
    w = Workload(id="w-bob", tenant="bob", spec=spec)
    placed = Placement("w-bob", (Assignment("kobe", "site", PricingModel.EDGE, 1, 0.1),), 0.1)
    clusters = {"kobe": Cluster(name="kobe", provider="edge", region="kobe", lat=34.7,
                                lon=135.2)}
    scopes = {"kobe": None, "alice-site": frozenset({"alice"}),
              "lent": frozenset({"alice", "bob"})}
    (svc,) = edge_services([placed], clusters, {w.id: w},
                           {"osaka": UserRegion("osaka", 34.7, 135.5)}, rtt_target_ms=50.0,
                           site_tenants=scopes)
    assert svc.need.allowed_sites == frozenset({"kobe", "lent"})
