"""Each rule of the snapshot merge (broker/placement/snapshot.py, observed.py), on hand-built
readings: fresh vs stale sync, the stale-quota margin, measured vs estimated RTT, observed vs
registered capacity, provenance ages, sites as edge clusters, tenancy scope, demand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from broker.domain import (
    Assignment,
    Cluster,
    Interconnect,
    NodeLeaving,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Site,
    SiteHealth,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.inventory import next_nodes
from broker.placement.network import RttResolver
from broker.placement.observed import Inventory, ObservedNode, decayed, demand_rate, observe
from broker.placement.snapshot import (
    HubReading,
    Member,
    MergeInputs,
    MergeMemo,
    MergeSettings,
    PriceReading,
    QuotaReading,
    RttReading,
    SiteMember,
    UsageReading,
    merge,
    replica_counts,
)
from providers.base import NodeInventory, Offer

NOW = 10_000.0
SETTINGS = MergeSettings(inventory_max_age_s=30.0, sync_max_age_s=900.0,
                         telemetry_max_age_s=120.0, rtt_max_age_s=60.0,
                         stale_quota_margin=0.25)


def pool(name: str = "m5", *, nodes: int = 2, price: float = 0.4, cpu: float = 8.0,
         pricing: PricingModel = PricingModel.ON_DEMAND, gpu: int = 0,
         interconnect: Interconnect = Interconnect.NONE, itype: str = "m5.2xlarge") -> Pool:
    return Pool(name=name, instance_type=itype, node=Resources(cpu, 32.0, gpu), nodes=nodes,
                max_nodes=10, price_usd_per_hour=price, pricing=pricing,
                interconnect=interconnect)


def cluster(name: str = "aws-use1", *pools: Pool, quota: float | None = None,
            stale: bool = False) -> Cluster:
    return Cluster(name=name, provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                   pools=pools or (pool(),), quota_vcpu=quota, quota_stale=stale)


def member(c: Cluster, **kw: object) -> Member:
    kw.setdefault("registered_s", NOW - 500.0)
    return Member(cluster=c, **kw)  # type: ignore[arg-type]


def one(inputs: MergeInputs) -> Cluster:
    (c,) = merge(inputs, SETTINGS).clusters
    return c


def offer(price: float, spot: float | None = None) -> Offer:
    return Offer(provider="aws", region="us-east-1", instance_type="m5.2xlarge", vcpu=8,
                 memory_gib=32, price_usd_per_hour=price, spot_price_usd_per_hour=spot)


# ---- prices ----------------------------------------------------------------------------
def test_fresh_synced_price_replaces_the_registered_one() -> None:
    c = one(MergeInputs(now_s=NOW, members=(member(cluster()),), prices={
        ("aws", "us-east-1", "m5.2xlarge"): PriceReading(offer(0.55), NOW - 100.0)}))
    assert c.pools[0].price_usd_per_hour == 0.55
    assert c.provenance["pricing"].source == "sync"
    assert c.provenance["pricing"].age_s == 100.0
    assert not c.provenance["pricing"].stale


def test_stale_synced_price_is_used_and_marked_stale() -> None:
    c = one(MergeInputs(now_s=NOW, members=(member(cluster()),), prices={
        ("aws", "us-east-1", "m5.2xlarge"): PriceReading(offer(0.55), NOW - 5000.0)}))
    assert c.pools[0].price_usd_per_hour == 0.55
    assert c.provenance["pricing"].stale
    assert c.provenance["pricing"].age_s == 5000.0


def test_spot_pool_takes_the_synced_spot_price_and_no_price_keeps_registration() -> None:
    spot = pool("spot", pricing=PricingModel.SPOT, price=0.2)
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c", spot)),), prices={
        ("aws", "us-east-1", "m5.2xlarge"): PriceReading(offer(0.55, spot=0.12), NOW)}))
    assert c.pools[0].price_usd_per_hour == 0.12
    c2 = one(MergeInputs(now_s=NOW, members=(member(cluster("c", spot)),), prices={
        ("aws", "us-east-1", "m5.2xlarge"): PriceReading(offer(0.55, spot=None), NOW)}))
    assert c2.pools[0].price_usd_per_hour == 0.2
    assert c2.provenance["pricing"].source == "registration"


def test_catalog_filled_price_is_named_as_such_with_its_age() -> None:
    m = member(cluster(), price_sources={"m5": "catalog"})
    c = one(MergeInputs(now_s=NOW, members=(m,)))
    assert c.provenance["pricing"].source == "catalog"
    assert c.provenance["pricing"].age_s == 500.0


# ---- quotas ----------------------------------------------------------------------------
def test_fresh_quota_replaces_registration_minus_what_others_use() -> None:
    m = member(cluster(quota=999.0), account="acct")
    reading = QuotaReading(synced_s=NOW - 60.0, vcpu_limit=64.0, vcpu_used=40.0)
    c = one(MergeInputs(now_s=NOW, members=(m,), quotas={("acct", "us-east-1"): reading}))
    # the cluster's own 2 x 8 vCPUs are part of the 40 used: others use 24
    assert c.quota_vcpu == pytest.approx(64.0 - 24.0)
    assert not c.quota_stale
    assert (c.provenance["quota"].source, c.provenance["quota"].age_s) == ("sync", 60.0)


def test_stale_quota_keeps_only_one_minus_margin_of_its_limit() -> None:
    m = member(cluster(), account="acct")
    old = QuotaReading(synced_s=NOW - 1000.0, vcpu_limit=64.0, vcpu_used=16.0)
    c = one(MergeInputs(now_s=NOW, members=(m,), quotas={("acct", "us-east-1"): old}))
    assert c.quota_stale
    assert c.quota_vcpu == pytest.approx(64.0 * 0.75)
    failing = QuotaReading(synced_s=NOW, vcpu_limit=64.0, vcpu_used=16.0, failing=True)
    c2 = one(MergeInputs(now_s=NOW, members=(m,), quotas={("acct", "us-east-1"): failing}))
    assert c2.quota_stale
    assert c2.quota_vcpu == pytest.approx(48.0)


def test_registered_quota_flagged_stale_gets_the_margin_too() -> None:
    c = one(MergeInputs(now_s=NOW, members=(member(cluster(quota=100.0, stale=True)),)))
    assert c.quota_vcpu == pytest.approx(75.0)
    assert c.provenance["quota"].source == "registration"
    fresh = one(MergeInputs(now_s=NOW, members=(member(cluster(quota=100.0)),)))
    assert fresh.quota_vcpu == 100.0


def test_quota_of_another_account_or_region_does_not_apply() -> None:
    m = member(cluster(quota=100.0), account="acct")
    other = QuotaReading(synced_s=NOW, vcpu_limit=8.0)
    c = one(MergeInputs(now_s=NOW, members=(m,), quotas={("other", "us-east-1"): other,
                                                          ("acct", "eu-west-1"): other}))
    assert c.quota_vcpu == 100.0


# ---- observed capacity -----------------------------------------------------------------
def node(name: str, *, pool_name: str = "m5", cpu_used: float = 0.0, gpu: int = 0,
         gpu_used: int = 0, **kw: object) -> ObservedNode:
    return ObservedNode(name=name, pool=pool_name, allocatable=Resources(7.9, 31.0, gpu),
                        allocated=Resources(cpu_used, 4.0 if cpu_used else 0.0, gpu_used),
                        **kw)  # type: ignore[arg-type]


def test_observed_inventory_replaces_registered_capacity() -> None:
    inv = Inventory(observed_s=NOW - 2.0, nodes=(
        node("a", cpu_used=6.0), node("b"), node("c", cpu_used=1.0),
        node("gone", unschedulable=True, cpu_used=3.0),
        node("new", ready=False, ever_ready=False),
        node("sick", ready=False, ever_ready=True),
        node("spot", taints=("aws-node-termination-handler/spot-itn=x:NoSchedule",)),
        node("stray", pool_name="elsewhere")))
    base = cluster("c", pool(nodes=2), pool("other", itype="c5.large"))
    c = one(MergeInputs(now_s=NOW, members=(member(base),), inventory={"c": inv}))
    p = c.pools[0]
    assert p.nodes == 4  # a, b, c and the booting one; leaving ones give no capacity
    assert p.used.cpu == pytest.approx(7.0)
    assert p.node == Resources(7.9, 31.0, 0)  # the observed allocatable, not the registered
    states = {s.name: s for s in p.node_states}
    assert states["gone"].leaving is NodeLeaving.CORDONED
    assert states["sick"].leaving is NodeLeaving.NOT_READY
    assert states["spot"].leaving is NodeLeaving.TERMINATING
    assert states["new"].booting
    assert states["new"].leaving is NodeLeaving.NO
    assert "stray" not in states
    assert c.pools[1].nodes == 0
    assert c.provenance["observed"].age_s == 2.0
    assert not c.provenance["observed"].stale


def test_a_pool_takes_the_blocking_taints_all_its_counted_nodes_carry() -> None:
    """A GPU node group tainted as EKS and Karpenter advise: the pool carries the taint
    (feasibility.pool_taints then keeps work that asks no GPU off it). PreferNoSchedule does
    not block; a taint one counted node lacks is not the pool's (what the nodes show overrules
    the registration); a leaving node's taints do not count; a pool with no counted node
    keeps its registered taints."""
    gpu = "nvidia.com/gpu=true:NoSchedule"
    inv = Inventory(observed_s=NOW - 2.0, nodes=(
        node("g1", pool_name="g", gpu=4, taints=(gpu, "team=ml:PreferNoSchedule")),
        node("g2", pool_name="g", gpu=4, taints=("zone=a:NoExecute", gpu)),
        node("g3", pool_name="g", gpu=4, unschedulable=True),  # leaving: not counted
        node("m1", taints=(gpu,)), node("m2")))
    base = cluster("c", replace(pool(nodes=2), taints=(gpu,)),
                   pool("g", gpu=4, itype="g4dn.12xlarge"),
                   replace(pool("empty", itype="c5.large"), taints=("team=ml:NoSchedule",)))
    c = one(MergeInputs(now_s=NOW, members=(member(base),), inventory={"c": inv}))
    taints = {p.name: p.taints for p in c.pools}
    assert taints == {"m5": (), "g": (gpu,), "empty": ("team=ml:NoSchedule",)}


def test_no_inventory_keeps_the_registration_and_old_inventory_is_stale() -> None:
    c = one(MergeInputs(now_s=NOW, members=(member(cluster()),)))
    assert c.pools[0].nodes == 2
    assert "observed" not in c.provenance
    old = Inventory(observed_s=NOW - 600.0, nodes=(node("a"),))
    c2 = one(MergeInputs(now_s=NOW, members=(member(cluster("c")),), inventory={"c": old}))
    assert c2.pools[0].nodes == 1
    assert c2.provenance["observed"].stale


def test_largest_free_gpu_set_follows_nvlink_pairs() -> None:
    p3 = pool("p3", gpu=8, cpu=64, interconnect=Interconnect.NVLINK_PAIRS, itype="p3.16xlarge")
    inv = Inventory(observed_s=NOW, nodes=(node("g", pool_name="p3", gpu=8, gpu_used=3),))
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c", p3)),), inventory={"c": inv}))
    # 5 GPUs free, but not all NVLink-connected in the p3.16xlarge cube mesh
    assert c.pools[0].node_states[0].gpu_free == 5
    assert 0 < c.pools[0].largest_free_gpu_set <= 5
    full = pool("p4", gpu=8, cpu=96, interconnect=Interconnect.NVLINK_FULL,
                itype="p4d.24xlarge")
    inv4 = Inventory(observed_s=NOW, nodes=(node("g", pool_name="p4", gpu=8, gpu_used=3),))
    c4 = one(MergeInputs(now_s=NOW, members=(member(cluster("c", full)),),
                         inventory={"c": inv4}))
    assert c4.pools[0].largest_free_gpu_set == 5


def test_telemetry_usage_counts_when_above_what_is_requested() -> None:
    inv = Inventory(observed_s=NOW, nodes=(node("a", cpu_used=2.0), node("b")))
    hot = UsageReading(read_s=NOW - 10.0, pools={"m5": Resources(6.5, 2.0, 0)})
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c")),), inventory={"c": inv},
                        usage={"c": hot}))
    assert c.pools[0].used.cpu == 6.5
    assert c.pools[0].used.memory_gib == 4.0  # requested is more than measured here
    assert c.provenance["telemetry"].age_s == 10.0


def test_reclaim_rate_is_reclaims_over_hours_observed() -> None:
    inv = Inventory(observed_s=NOW, nodes=(node("a"),), reclaims={"m5": 6},
                    since_s=NOW - 3 * 3600.0)
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c")),), inventory={"c": inv}))
    assert c.pools[0].reclaim_rate_per_hour == pytest.approx(2.0)


# ---- health, sites, tenancy ------------------------------------------------------------
def site(name: str = "edge-muc", health: SiteHealth = SiteHealth.HEALTHY) -> Site:
    return Site(name=name, lat=48.1, lon=11.6, capacity=Resources(16, 64, 1),
                price_usd_per_hour=0.3, health=health)


def test_a_site_registered_once_is_an_edge_cluster_the_hub_judges() -> None:
    snap = merge(MergeInputs(now_s=NOW, sites=(SiteMember(site(), tenant="acme",
                                                          operator=False),),
                             hub={"edge-muc": HubReading(SiteHealth.DOWN, NOW - 1.0)}),
                 SETTINGS)
    (c,) = snap.clusters
    assert c.is_edge
    assert c.pools[0].pricing is PricingModel.EDGE
    assert c.pools[0].node == Resources(16, 64, 1)
    assert not c.healthy
    assert c.provenance["health"].source == "hub"
    assert c.allowed_tenants == frozenset({"acme"})


def test_old_site_plus_shadow_cluster_keeps_cluster_pools_and_takes_hub_health() -> None:
    shadow = Cluster(name="edge-muc", provider="edge", region="edge-muc", lat=48.1, lon=11.6,
                     pools=(pool("site", nodes=1, price=0.3, pricing=PricingModel.EDGE),))
    snap = merge(MergeInputs(now_s=NOW, members=(member(shadow),),
                             sites=(SiteMember(site(health=SiteHealth.DOWN)),),
                             hub={"edge-muc": HubReading(SiteHealth.DOWN, NOW)}), SETTINGS)
    (c,) = snap.clusters
    assert c.pools[0].name == "site"
    assert c.pools[0].node.cpu == 8.0
    assert not c.healthy
    assert c.allowed_tenants is None


# ---- RTTs ------------------------------------------------------------------------------
def test_fresh_measured_rtt_replaces_the_estimate_under_the_planners_key() -> None:
    s = site()
    users = (UserRegion("munich-users", 48.14, 11.58),)
    measured = RttReading(site="edge-muc", target="munich-users", ms=42.0,
                          measured_s=NOW - 5.0)
    snap = merge(MergeInputs(now_s=NOW, sites=(SiteMember(s),), user_regions=users,
                             rtts=(measured,)), SETTINGS)
    (c,) = snap.clusters
    assert snap.rtt_ms[("munich-users", "edge-muc")] == 42.0
    assert RttResolver(snap).rtt_ms("munich-users", c) == 42.0
    assert c.provenance["rtt"].source == "agent"
    stale = merge(MergeInputs(now_s=NOW, sites=(SiteMember(s),), user_regions=users,
                              rtts=(RttReading("edge-muc", "munich-users", 42.0, NOW - 600),)),
                  SETTINGS)
    # too old: the estimate from coordinates (a few ms for 3 km) is used again
    assert RttResolver(stale).rtt_ms("munich-users", stale.clusters[0]) < 10.0


def test_measured_rtt_to_a_peer_site_is_a_graph_edge() -> None:
    a, b = site("a"), site("b")
    snap = merge(MergeInputs(now_s=NOW, sites=(SiteMember(a), SiteMember(b)),
                             rtts=(RttReading("a", "b", 7.5, NOW),)), SETTINGS)
    assert snap.rtt_ms[("a", "b")] == snap.rtt_ms[("b", "a")] == 7.5


# ---- replicas and demand ---------------------------------------------------------------
def workload(wid: str, status: WorkloadStatus, cpu: float = 1.0) -> Workload:
    spec = WorkloadSpec(name=wid, kind=WorkloadKind.BATCH, image="x", replicas=3,
                        resources=Resources(cpu, 1.0, 0))
    return Workload(id=wid, tenant="t", spec=spec, status=status)


def test_replica_counts_split_running_and_starting() -> None:
    placed = [Placement(wid, (Assignment("c", "m5", PricingModel.ON_DEMAND, 3, 1.0),), 1.0)
              for wid in ("run", "wait")]
    counts = replica_counts(placed, {"run": workload("run", WorkloadStatus.RUNNING),
                                     "wait": workload("wait", WorkloadStatus.PLACED)})
    assert counts == {("c", "m5"): (6, 3)}
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c")),), replicas=counts))
    assert (c.pools[0].replicas_placed, c.pools[0].replicas_starting) == (6, 3)


def test_demand_from_placement_times_equals_the_incremental_ewma() -> None:
    tau = 900.0
    events = [(100.0, 4.0), (400.0, 2.0), (1300.0, 8.0)]
    rate, at = 0.0, 0.0
    for t, r in events:  # the twin's SimPool.add_demand
        rate = decayed(rate, at, t, tau) + r / tau
        at = t
    assert decayed(rate, at, 2000.0, tau) == pytest.approx(demand_rate(events, 2000.0, tau))
    assert demand_rate(events, 2000.0, tau) == pytest.approx(
        sum(r / tau * math.exp(-(2000.0 - t) / tau) for t, r in events))


# ---- the poller's bookkeeping ----------------------------------------------------------
def inv_node(name: str, *, replicas: int | None = 0, ready: bool = True,
             taints: tuple[str, ...] = ()) -> NodeInventory:
    return NodeInventory(name=name, pool="spot", allocatable_cpu=4, allocatable_memory_gib=16,
                         ready=ready, taints=taints, replicas=replicas,
                         labels={"node.kubernetes.io/instance-type": "m5.xlarge"})


def test_idle_timer_starts_when_first_seen_empty_and_survives_polls() -> None:
    first, _ = next_nodes((), [inv_node("a"), inv_node("b", replicas=2)], 100.0)
    assert [n.idle_since_s for n in first] == [100.0, None]
    assert first[0].instance_type == "m5.xlarge"
    second, _ = next_nodes(first, [inv_node("a"), inv_node("b", replicas=0)], 105.0)
    assert [n.idle_since_s for n in second] == [100.0, 105.0]
    third, _ = next_nodes(second, [inv_node("a", replicas=1), inv_node("b")], 110.0)
    assert [n.idle_since_s for n in third] == [None, 105.0]


def test_booting_until_first_ready_and_reclaims_counted_for_spot_pools() -> None:
    boot, _ = next_nodes((), [inv_node("n", ready=False)], 1.0)
    assert not boot[0].ever_ready
    up, _ = next_nodes(boot, [inv_node("n")], 2.0)
    down, _ = next_nodes(up, [inv_node("n", ready=False)], 3.0)
    assert down[0].ever_ready  # NotReady after Ready: leaving, not booting
    notice = ("aws-node-termination-handler/spot-itn=true:NoSchedule",)
    tainted, _ = next_nodes(up, [inv_node("n", taints=notice)], 4.0)
    _, reclaims = next_nodes(tainted, [], 5.0, frozenset({"spot"}))
    assert reclaims == {"spot": 1}
    _, not_spot = next_nodes(tainted, [], 5.0, frozenset())
    assert not_spot == {}


def test_released_requests_come_off_the_observed_usage() -> None:
    inv = Inventory(observed_s=NOW, nodes=(node("a", cpu_used=6.0), node("b", cpu_used=1.0)))
    c = one(MergeInputs(now_s=NOW, members=(member(cluster("c")),), inventory={"c": inv},
                        released={("c", "m5"): Resources(6.0, 4.0, 0)}))
    assert c.pools[0].used == Resources(1.0, 4.0, 0)


def test_released_gpus_come_back_to_the_nodes_so_a_whatif_sees_its_own_gpu_set() -> None:
    """A what-if re-asks a running 8-GPU job: its own node must count as a free 8-GPU set
    again (the GPU-set rule reads node states), not only the pool's total usage."""
    from broker.placement.feasibility import free_gpu_sets

    p4 = pool("p4", gpu=8, cpu=96, interconnect=Interconnect.NVLINK_FULL, itype="p4d.24xlarge")
    inv = Inventory(observed_s=NOW, nodes=(node("busy", pool_name="p4", gpu=8, gpu_used=8),
                                           node("half", pool_name="p4", gpu=8, gpu_used=4)))
    inputs = MergeInputs(now_s=NOW, members=(member(cluster("c", p4)),), inventory={"c": inv})
    held = one(inputs).pools[0]
    assert free_gpu_sets(held, (8, True)) == 0
    freed = one(replace(inputs, released={("c", "p4"): Resources(96.0, 0.0, 8)})).pools[0]
    assert freed.used.gpu == 4
    assert {n.name: n.gpu_free for n in freed.node_states} == {"busy": 8, "half": 4}
    assert freed.largest_free_gpu_set == 8
    assert free_gpu_sets(freed, (8, True)) == 1


def test_probe_targets_name_their_rtt_and_bad_ones_fail_at_start() -> None:
    from edge_agent.cli import build_parser, config_from_args
    from edge_agent.probe import parse_target

    assert parse_target("munich-users=10.0.0.5:443") == ("munich-users", "10.0.0.5", 443)
    assert parse_target("10.0.0.5:443") == ("10.0.0.5:443", "10.0.0.5", 443)
    ns = build_parser().parse_args(["--site", "s1", "--probe", "users=10.0.0.5:x"])
    with pytest.raises(SystemExit, match="bad port"):
        config_from_args(ns)


# ---- the merge memo (the twin's incremental merge) ---------------------------------------
def test_a_memoised_merge_equals_a_fresh_one_whichever_input_changes() -> None:
    """`MergeMemo` keeps a pool's merged value while its inputs are unchanged: each input the
    pool's merge reads, changed alone, must give what a merge without the memo gives."""
    p, gpu = pool(), pool("p4", gpu=8, itype="p4d.24xlarge")
    reg = member(cluster("aws-use1", p, gpu))
    nodes = [ObservedNode(name=f"n{i}", pool=q.name, allocatable=q.node,
                          allocated=Resources(1.0, 2.0, 3 if q.node.gpu else 0))
             for i, q in enumerate((p, p, gpu))]
    reading = {q.name: observe(q, [n for n in nodes if n.pool == q.name]) for q in (p, gpu)}
    base = MergeInputs(now_s=NOW, members=(reg,), inventory={"aws-use1": Inventory(
        observed_s=NOW, reclaims={"m5": 2}, since_s=0.0, observations=reading)})
    again = {**reading, "m5": observe(p, nodes[:1])}
    variants = [
        replace(base, now_s=NOW + 3600.0),  # the reclaim rate is per hour observed
        replace(base, replicas={("aws-use1", "m5"): (3, 1)}),
        replace(base, replicas={("aws-use1", "m5"): (3, 0)}),
        replace(base, released={("aws-use1", "p4"): Resources(1.0, 2.0, 2)}),
        replace(base, usage={"aws-use1": UsageReading(NOW, {"m5": Resources(7.0, 1.0)})}),
        replace(base, prices={("aws", "us-east-1", "m5.2xlarge"): PriceReading(
            offer(0.5), NOW)}),
        replace(base, members=(member(cluster("aws-use1", replace(p, max_nodes=1), gpu)),)),
        replace(base, inventory={"aws-use1": replace(base.inventory["aws-use1"],
                                                     observations=again)}),
        replace(base, demand={("aws-use1", "m5"): (0.5, 0.0)}),
        # The network maps (kept by the memo while the same objects come again).
        replace(base, user_rtt_ms={("u", "aws-use1"): 5.0}),
        replace(base, cluster_rtt_ms={("aws-use1", "gcp-euw4"): 90.0}),
        replace(base, egress_usd_per_gb={("aws:us-east-1", "gcp:europe-west4"): 0.09}),
        replace(base, bandwidth_gbps={("aws-use1", "gcp-euw4"): 5.0}),
        replace(base, rtts=(RttReading("aws-use1", "u", 4.0, NOW),))]
    steps = [base] + [x for v in variants for x in (v, base)]  # one input changed at a time
    memo = MergeMemo()
    kept = kept_maps = 0
    last: tuple[Pool, ...] = ()
    last_rtt: object = None
    for i, inputs in enumerate(steps):
        got = merge(inputs, SETTINGS, memo=memo)
        assert got == merge(inputs, SETTINGS), f"step {i}"
        pools = got.clusters[0].pools
        kept += sum(a is b for a, b in zip(pools, last, strict=False))
        kept_maps += got.rtt_ms is last_rtt
        last, last_rtt = pools, got.rtt_ms
    assert kept > 0  # the memo was used: unchanged pools are the same object
    assert kept_maps > 0  # ... and unchanged network maps the same copies


def test_a_member_kept_whole_by_the_memo_equals_a_fresh_merge_whichever_input_changes() -> None:
    """`MergeMemo` keeps a member's pools without looking at each while its `Member` and
    observations are the same objects: every other input of its pools, changed alone (and a
    new `Inventory` with the same readings, or a later clock, which must not stop it), must
    give what a merge without the memo gives, provenance ages included."""
    p, gpu = pool(), pool("p4", gpu=8, itype="p4d.24xlarge")
    reg = member(cluster("aws-use1", p, gpu), price_sources={"p4": "catalog"})
    nodes = [ObservedNode(name=f"n{i}", pool=q.name, allocatable=q.node,
                          allocated=Resources(1.0, 2.0, 3 if q.node.gpu else 0))
             for i, q in enumerate((p, p, gpu))]
    reading = {q.name: observe(q, [n for n in nodes if n.pool == q.name]) for q in (p, gpu)}
    inv = Inventory(observed_s=NOW, reclaims={"m5": 0}, since_s=0.0, observations=reading)
    base = MergeInputs(now_s=NOW, members=(reg,), inventory={"aws-use1": inv})
    reclaimed = replace(base, inventory={"aws-use1": replace(inv, reclaims={"m5": 2})})
    variants = [
        replace(base, now_s=NOW + 60.0),  # kept: no reclaim, only the ages move
        replace(base, inventory={"aws-use1": replace(inv, observed_s=NOW - 5.0)}),  # kept
        replace(base, inventory={"aws-use1": replace(inv, reclaims={"p4": 1})}),
        replace(base, inventory={"aws-use1": replace(inv, since_s=NOW - 7200.0)}),
        reclaimed, replace(reclaimed, now_s=NOW + 3600.0),
        replace(reclaimed, inventory={"aws-use1": replace(inv, reclaims={"p4": 2})}),
        replace(reclaimed, inventory={"aws-use1": replace(inv, reclaims={"m5": 2},
                                                         since_s=NOW - 7200.0)}),
        replace(base, replicas={("aws-use1", "p4"): (2, 1)}),
        replace(base, replicas={("aws-use1", "p4"): (2, 0)}),
        replace(base, released={("aws-use1", "m5"): Resources(1.0, 2.0, 0)}),
        replace(base, usage={"aws-use1": UsageReading(NOW, {"p4": Resources(9.0, 1.0)})}),
        replace(base, prices={("aws", "us-east-1", "p4d.24xlarge"): PriceReading(
            offer(30.0), NOW - 10.0)}),
        replace(base, members=(replace(reg, registered_s=NOW - 9.0),)),
        replace(base, members=(replace(reg, price_sources={"m5": "catalog", "p4": "catalog"}),)),
        replace(base, members=(replace(reg, cluster=cluster(
            "aws-use1", replace(p, price_usd_per_hour=0.5), gpu)),)),
        replace(base, inventory={"aws-use1": replace(inv, observations={
            **reading, "p4": observe(gpu, [replace(nodes[2], allocated=Resources())])})})]
    steps = [base] + [x for v in variants for x in (v, base)]  # one input changed at a time
    steps += [reclaimed] + [x for v in variants[5:8] for x in (v, reclaimed)]  # reclaims kept
    memo = MergeMemo()
    whole = 0
    last: tuple[Pool, ...] = ()
    for i, inputs in enumerate(steps):
        got = merge(inputs, SETTINGS, memo=memo)
        assert got == merge(inputs, SETTINGS), f"step {i}"
        whole += got.clusters[0].pools is last
        last = got.clusters[0].pools
    assert whole > 2  # the member's pools were kept whole (base after base-like steps)


def test_a_cluster_kept_whole_without_ages_equals_a_fresh_merge_whichever_input_changes(
        ) -> None:
    """With `MergeSettings.ages` off (the twin), `MergeMemo` hands a member none of whose
    inputs changed back as last merge's `Cluster`: every input the member's merge reads,
    changed alone (its pools' inputs, its quota reading, the hub's word on an edge member,
    the settings, an agent's RTT), must give what a merge without the memo gives; a later
    clock alone must not stop it (no age moves), but a reclaim rate, which moves with the
    clock, must."""
    ageless = replace(SETTINGS, ages=False)
    p, gpu = pool(), pool("p4", gpu=8, itype="p4d.24xlarge")
    reg = member(cluster("aws-use1", p, gpu, quota=64.0), account="acct")
    edge = member(Cluster(name="edge-muc", provider="edge", region="edge-muc", lat=48.1,
                          lon=11.6, pools=(pool("site", nodes=1, price=0.3,
                                                pricing=PricingModel.EDGE),),
                          quota_vcpu=10.0, quota_stale=True))  # the margin applies
    nodes = [ObservedNode(name=f"n{i}", pool=q.name, allocatable=q.node,
                          allocated=Resources(1.0, 2.0, 3 if q.node.gpu else 0))
             for i, q in enumerate((p, p, gpu))]
    reading = {q.name: observe(q, [n for n in nodes if n.pool == q.name]) for q in (p, gpu)}
    inv = Inventory(observed_s=NOW, reclaims={"m5": 0}, since_s=0.0, observations=reading)
    site_reading = {"site": observe(edge.cluster.pools[0], [])}
    quota = QuotaReading(synced_s=NOW - 60.0, vcpu_limit=64.0, vcpu_used=40.0)
    base = MergeInputs(now_s=NOW, members=(reg, edge), inventory={
        "aws-use1": inv, "edge-muc": Inventory(observed_s=NOW, observations=site_reading)},
        quotas={("acct", "us-east-1"): quota},
        hub={"edge-muc": HubReading(SiteHealth.HEALTHY, NOW - 1.0)})
    reclaimed = replace(base, inventory={**base.inventory,
                                         "aws-use1": replace(inv, reclaims={"m5": 2})})
    other_pool = replace(base, inventory={**base.inventory,  # the rate as high, elsewhere
                                          "aws-use1": replace(inv, reclaims={"p4": 2})})
    variants = [
        replace(base, now_s=NOW + 60.0),  # kept: no age moves
        replace(base, inventory={**base.inventory,
                                 "aws-use1": replace(inv, observed_s=NOW - 5.0)}),  # kept
        replace(base, inventory={**base.inventory, "aws-use1": replace(inv, reclaims={
            "p4": 1})}),
        reclaimed, replace(reclaimed, now_s=NOW + 3600.0), other_pool,
        replace(base, replicas={("aws-use1", "p4"): (2, 1)}),
        replace(base, released={("aws-use1", "m5"): Resources(1.0, 2.0, 0)}),
        replace(base, usage={"aws-use1": UsageReading(NOW, {"p4": Resources(9.0, 1.0)})}),
        replace(base, prices={("aws", "us-east-1", "p4d.24xlarge"): PriceReading(
            offer(30.0), NOW - 10.0)}),
        replace(base, quotas={("acct", "us-east-1"): replace(quota, vcpu_used=48.0)}),
        replace(base, quotas={("acct", "us-east-1"): replace(quota, failing=True)}),
        replace(base, quotas={}),
        replace(base, hub={"edge-muc": HubReading(SiteHealth.DOWN, NOW - 1.0)}),
        replace(base, hub={}),
        replace(base, rtts=(RttReading("edge-muc", "u", 4.0, NOW),)),
        replace(base, members=(replace(reg, operator=False, tenant="acme"), edge)),
        replace(base, members=(replace(reg, cluster=cluster("aws-use1", p, gpu, quota=32.0)),
                               edge)),
        replace(base, inventory={**base.inventory, "aws-use1": replace(inv, observations={
            **reading, "p4": observe(gpu, [replace(nodes[2], allocated=Resources())])})})]
    steps = [base] + [x for v in variants for x in (v, base)]  # one input changed at a time
    steps += [reclaimed, other_pool, reclaimed]
    # A pool given as raw nodes, not a reading: the same mapping of readings, other nodes.
    partial = replace(inv, observations={"m5": reading["m5"]}, nodes=(nodes[2],))
    emptied = replace(partial, nodes=(replace(nodes[2], allocated=Resources()),))
    steps += [replace(base, inventory={**base.inventory, "aws-use1": x})
              for x in (partial, emptied, partial)]
    memo = MergeMemo()
    whole = 0
    last: tuple[Cluster, ...] = ()
    for settings in (ageless, replace(ageless, stale_quota_margin=0.5)):
        for i, inputs in enumerate(steps):
            got = merge(inputs, settings, memo=memo)
            assert got == merge(inputs, settings), f"step {i}"
            whole += sum(a is b for a, b in zip(got.clusters, last, strict=False))
            last = got.clusters
    assert whole > 4  # members were kept whole (base after base-like steps)
    first = merge(base, ageless, memo=memo).clusters[0]
    assert first is merge(replace(base, now_s=NOW + 60.0), ageless, memo=memo).clusters[0]
    assert all(p.age_s == 0.0 for p in first.provenance.values())


def test_data_named_by_its_cluster_gets_the_catalogs_egress_price() -> None:
    # The live snapshot's egress table (network.batch_maps) priced only data written as
    # `provider:region`; data named by a member cluster fell to the planner's fallback
    # constants (0.09 USD/GB across providers) whatever the catalog said.
    from broker.domain import DataSource
    from broker.placement.candidates import egress_usd_per_gb
    from broker.placement.network import batch_maps
    from providers.catalog import Catalog
    from tests.unit.placement_world import federation, snapshot, workload

    cat = Catalog.load()
    clusters = federation()
    by_name = {c.name: c for c in clusters}
    job = workload("j", data=(DataSource(size_gb=10.0, location="gcp-euw4"),))
    _, egress = batch_maps(cat, clusters, (job,))
    src = by_name["gcp-euw4"]
    for dst in clusters:
        if dst.provider == "aws":
            priced = egress_usd_per_gb(snapshot((job,), egress_usd_per_gb=egress), by_name,
                                       "gcp-euw4", dst)
            assert priced == cat.egress_usd_per_gb(src.region_key, dst.region_key)
            assert priced != 0.09  # the catalog's GCP price, not the fallback constant
