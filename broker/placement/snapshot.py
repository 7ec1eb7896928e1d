"""THE snapshot merge: registered + observed + synced + measured -> FederationSnapshot. Pure.

Both shells build their snapshot here: the live broker (broker/federation/snapshot.py reads
the store, the drivers' inventory, sync and the hub into `MergeInputs`) and the twin
(broker/sim/snapshot.py turns simulated state into the same inputs). Values in, one
`FederationSnapshot` out; no I/O, no clock (`now_s` is an input). Every merged value carries
its `Provenance` (source, age, stale) in `Cluster.provenance`.

Precedence, per value (the newest reading wins over the registration; docs/snapshot.md):

- members: registered clusters; registered edge sites become edge clusters (one fixed pool
  of the site's capacity) unless a cluster of the same name is registered (the older
  "site + shadow cluster" form: the cluster's pools, the site's health).
  `allowed_tenants`: None for an admin's or operator's registration (federation-wide), else
  the registering tenant and the tenants it lent the member to.
- tenants: each tenant's `committed_usd_per_hour` is the run rate of its active placements
  (`running`), so its budget caps what runs, not only what one epoch adds.
- capacity (`observed.py`): the driver's inventory replaces nodes, node shape, usage, GPU
  sets and reclaim rate of each registered pool; without one the registration stands.
- usage: the larger of what is requested (inventory, then the broker's own commitments,
  placement/commitments.py) and what telemetry measures in use (Metrics Server), per pool.
- prices: the newest synced offer of (provider, region, instance type) replaces the
  registered price (on-demand or spot, by the pool's pricing model); else the registration's
  own (which the API may have filled from the offline catalog: source `catalog`).
- quotas: the newest synced vCPU/GPU quota of the cluster's (account, region) replaces the
  registered quota. What others use in that account and region is taken off:
  quota = limit - max(0, used - this cluster's provisioned). A quota read longer ago than
  `sync_max_age_s`, or whose account's sync is failing, is stale: only
  `(1 - stale_quota_margin)` of its limit is used (the registered quota too, when its row is
  flagged stale).
- health: the registration's (reconciler, driver registry) AND, for edge sites, the hub's
  (`down` = unhealthy): one decider per failure, the hub for sites.
- RTTs: an agent-measured RTT read within `rtt_max_age_s` replaces the catalog's or the
  coordinate estimate, under the keys the planner looks up: (probe name, site) for user
  regions, (site, peer site) for the cluster graph.

Anything read longer ago than its freshness limit is still used (the last reading is the
best knowledge) but marked `stale` in its provenance, so explain and the API show it; an RTT
measurement is the exception (past `rtt_max_age_s` the estimate is used again). After the
merge, a cluster with an absurd number (placement/sanity.py) is left out (`merge_screened`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Interconnect,
    NodeLeaving,
    NodeState,
    Placement,
    Pool,
    PricingModel,
    Provenance,
    Resources,
    Site,
    SiteHealth,
    Tenant,
    UserRegion,
    Workload,
    WorkloadStatus,
)
from broker.placement.commitments import with_commitments
from broker.placement.observed import (
    Inventory,
    ObservedNode,
    nodes_by_pool,
    observed_fields,
    reclaim_rate_per_hour,
)
from broker.placement.sanity import partition
from providers.base import Offer

Pair = tuple[str, str]
# The snapshot's rtt_ms, egress_usd_per_gb and bandwidth_gbps.
NetworkMaps = tuple[dict[Pair, float], dict[Pair, float], dict[Pair, float]]
SITE_POOL = "site"
EDGE_LABEL = "skyfed.io/edge"
_SOURCE_RANK = {"sync": 3, "catalog": 2, "registration": 1}


@dataclass(frozen=True, slots=True)
class MergeSettings:
    """Freshness limits and the stale-quota margin (from `SnapshotSettings`, settings.py)."""

    inventory_max_age_s: float = 30.0
    sync_max_age_s: float = 900.0
    telemetry_max_age_s: float = 120.0
    rtt_max_age_s: float = 60.0
    hub_max_age_s: float = 60.0
    stale_quota_margin: float = 0.5
    # Leave out clusters with absurd numbers (placement/sanity.py). Off only where every
    # input was validated on the way in (the twin's scenarios, sim/scenario.py).
    screen: bool = True
    # False: every reading is current by construction (the twin's, made by the merge's
    # caller as of `now_s`): each provenance age is 0 and no reading is stale for its age,
    # so no merged value moves with the clock alone but a reclaim rate, and a `MergeMemo`
    # may keep a member none of whose inputs changed as last merge's `Cluster`. (An agent's
    # RTT past `rtt_max_age_s` still gives way to the estimate.) The live broker's are true.
    ages: bool = True


@dataclass(frozen=True, slots=True)
class Member:
    """A registered cluster as stored: the defaults every reading may replace."""

    cluster: Cluster
    tenant: str = "admin"
    operator: bool = True  # registered by an admin/operator: federation-wide
    account: str | None = None
    registered_s: float = 0.0
    price_sources: Mapping[str, str] = field(default_factory=dict)  # pool -> catalog | ...
    lent_to: frozenset[str] = frozenset()  # a private member's other tenants


@dataclass(frozen=True, slots=True)
class SiteMember:
    site: Site
    tenant: str = "admin"
    operator: bool = True
    registered_s: float = 0.0
    lent_to: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PriceReading:
    offer: Offer
    synced_s: float


@dataclass(frozen=True, slots=True)
class QuotaReading:
    """One account's quota in one region, as the newest good sync read it."""

    synced_s: float
    vcpu_limit: float | None = None
    vcpu_used: float = 0.0
    gpu_limit: float | None = None
    gpu_used: float = 0.0
    failing: bool = False  # the account's sync keeps failing (marked stale)


@dataclass(frozen=True, slots=True)
class UsageReading:
    """Resources measured in use per pool (Metrics Server), not requested."""

    read_s: float
    pools: Mapping[str, Resources] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HubReading:
    health: SiteHealth
    heard_s: float | None = None


@dataclass(frozen=True, slots=True)
class RttReading:
    """An agent at `site` measured `ms` to `target` (a user region, a site, a region key)."""

    site: str
    target: str
    ms: float
    measured_s: float


@dataclass(frozen=True)
class MergeInputs:
    now_s: float
    members: tuple[Member, ...] = ()
    sites: tuple[SiteMember, ...] = ()
    inventory: Mapping[str, Inventory] = field(default_factory=dict)
    prices: Mapping[tuple[str, str, str], PriceReading] = field(default_factory=dict)
    quotas: Mapping[tuple[str, str], QuotaReading] = field(default_factory=dict)
    usage: Mapping[str, UsageReading] = field(default_factory=dict)
    hub: Mapping[str, HubReading] = field(default_factory=dict)
    rtts: tuple[RttReading, ...] = ()
    pending: tuple[Workload, ...] = ()
    running: tuple[Placement, ...] = ()
    workloads: Mapping[str, Workload] = field(default_factory=dict)  # of `running`
    # Clusters each running workload was failed over from (the reconciler's displaced_from).
    displaced: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # (placed, not running yet) replicas per (cluster, pool): `replica_counts` live.
    replicas: Mapping[Pair, tuple[int, int]] = field(default_factory=dict)
    demand: Mapping[Pair, tuple[float, float]] = field(default_factory=dict)  # cpu, gpu / s
    # Capacity given back by workloads that ended, cpu, gpu / s (FederationSnapshot.freed).
    freed: Mapping[Pair, tuple[float, float]] = field(default_factory=dict)
    # Requests to take off the observed usage per (cluster, pool): a what-if asks about a
    # running workload as if it were not there yet (its own replicas are in the inventory).
    released: Mapping[Pair, Resources] = field(default_factory=dict)
    # Nodes on order per (cluster, pool), not yet joined (the live actuator's open scale
    # decisions): they count instead of the placements' `new_nodes` (commitments.py).
    # None: the placements' `new_nodes` stand in for them (the twin).
    ordered: Mapping[Pair, int] | None = None
    tenants: tuple[Tenant, ...] = ()
    user_regions: tuple[UserRegion, ...] = ()
    user_rtt_ms: Mapping[Pair, float] = field(default_factory=dict)  # catalog: user -> region
    egress_usd_per_gb: Mapping[Pair, float] = field(default_factory=dict)
    cluster_rtt_ms: Mapping[Pair, float] = field(default_factory=dict)  # cluster names
    bandwidth_gbps: Mapping[Pair, float] = field(default_factory=dict)


def site_cluster(site: Site) -> Cluster:
    """An edge site as the planner sees it: one fixed pool of the site's capacity."""
    gpu = site.capacity.gpu
    return Cluster(
        name=site.name, provider="edge", region=site.name, lat=site.lat, lon=site.lon,
        labels={EDGE_LABEL: "true", **site.labels},
        pools=(Pool(name=SITE_POOL, instance_type="edge", node=site.capacity, nodes=1,
                    max_nodes=1, price_usd_per_hour=site.price_usd_per_hour,
                    pricing=PricingModel.EDGE, gpu_model=site.gpu_model,
                    interconnect=site.interconnect if gpu else Interconnect.NONE,
                    largest_free_gpu_set=gpu),),
        healthy=site.health is not SiteHealth.DOWN)


def members_of(inputs: MergeInputs) -> list[Member]:
    """Registered clusters, then edge sites not registered as clusters (see module doc)."""
    names = {m.cluster.name for m in inputs.members}
    out = list(inputs.members)
    for s in inputs.sites:
        if s.site.name not in names:
            out.append(Member(cluster=site_cluster(s.site), tenant=s.tenant,
                              operator=s.operator, registered_s=s.registered_s,
                              lent_to=s.lent_to))
    return out


def _age(now_s: float, at_s: float | None, settings: MergeSettings) -> float:
    if not settings.ages:
        return 0.0
    return round(max(0.0, now_s - at_s), 3) if at_s is not None else 0.0


def _prov(source: str, now_s: float, at_s: float | None, limit_s: float,
          settings: MergeSettings) -> Provenance:
    age = _age(now_s, at_s, settings)
    return Provenance(source, age, stale=at_s is not None and age > limit_s)


def price_of(pool: Pool, member: Member, inputs: MergeInputs, settings: MergeSettings,
             registered: dict[str, Provenance] | None = None) -> tuple[float, Provenance]:
    """The pool's newest price per node and hour, and where it came from (`registered`: the
    provenance of the member's own prices per source, made once for all its pools)."""
    c = member.cluster
    reading = None if pool.pricing is PricingModel.EDGE else inputs.prices.get(
        (c.provider, c.region, pool.instance_type))
    if reading is not None:
        o = reading.offer
        price = o.spot_price_usd_per_hour if pool.pricing is PricingModel.SPOT \
            else o.price_usd_per_hour
        if price is not None:
            return price, _prov("sync", inputs.now_s, reading.synced_s, settings.sync_max_age_s,
                                        settings)
    source = member.price_sources.get(pool.name, "registration")
    prov = registered.get(source) if registered is not None else None
    if prov is None:
        prov = Provenance(source, _age(inputs.now_s, member.registered_s, settings))
        if registered is not None:
            registered[source] = prov
    return pool.price_usd_per_hour, prov


def _worst(provs: Sequence[Provenance]) -> Provenance:
    """The least trustworthy of several (at least one): lowest-ranked source, then the
    oldest."""
    return min(provs, key=lambda p: (_SOURCE_RANK.get(p.source, 0), -p.age_s))


def _quota_reading(member: Member, region: str, inputs: MergeInputs) -> QuotaReading | None:
    """The synced quota of the member's account in `region`, if any (`quota_of`'s)."""
    return inputs.quotas.get((member.account or "", region)) if member.account else None


def quota_of(cluster: Cluster, pools: Sequence[Pool], member: Member, inputs: MergeInputs,
             settings: MergeSettings) -> tuple[float | None, float | None, bool, Provenance]:
    """(vCPU quota, GPU quota, stale, provenance) for the planner; see the module docstring.
    `pools`: the cluster's pools as observed (their nodes are this cluster's own use)."""
    keep = 1.0 - settings.stale_quota_margin
    reading = _quota_reading(member, cluster.region, inputs)
    if reading is None or (reading.vcpu_limit is None and reading.gpu_limit is None):
        stale = cluster.quota_stale
        frac = keep if stale else 1.0
        vcpu = None if cluster.quota_vcpu is None else cluster.quota_vcpu * frac
        gpu = None if cluster.quota_gpu is None else cluster.quota_gpu * frac
        source = "registration" if (vcpu, gpu) != (None, None) else "none"
        return vcpu, gpu, stale, Provenance(
            source, _age(inputs.now_s, member.registered_s, settings), stale=stale)
    prov = _prov("sync", inputs.now_s, reading.synced_s, settings.sync_max_age_s, settings)
    stale = prov.stale or reading.failing
    frac = keep if stale else 1.0
    own_cpu = sum(p.node.cpu * p.nodes for p in pools)
    own_gpu = sum(p.node.gpu * p.nodes for p in pools)

    def effective(limit: float | None, used: float, own: float,
                  registered: float | None) -> float | None:
        if limit is None:
            return None if registered is None else registered * frac
        return max(0.0, limit * frac - max(0.0, used - own))

    return (effective(reading.vcpu_limit, reading.vcpu_used, own_cpu, cluster.quota_vcpu),
            effective(reading.gpu_limit, reading.gpu_used, own_gpu, cluster.quota_gpu),
            stale, replace(prov, stale=stale))


def _health(member: Member, inputs: MergeInputs, settings: MergeSettings
            ) -> tuple[bool, Provenance]:
    c = member.cluster
    hub = inputs.hub.get(c.name) if c.is_edge else None
    if hub is None:
        return c.healthy, Provenance("registration",
                                     _age(inputs.now_s, member.registered_s, settings))
    return (c.healthy and hub.health is not SiteHealth.DOWN,
            _prov("hub", inputs.now_s, hub.heard_s, settings.hub_max_age_s, settings))


def _release_gpus(states: tuple[NodeState, ...], gpus: int, per_node: int
                  ) -> tuple[tuple[NodeState, ...], int]:
    """Hand `gpus` released GPUs (a what-if's own workload) back to the pool's nodes, the most
    used running nodes first (a whole-node job fills one node). A node left with every GPU free
    is one free set again; a partly freed node keeps its last known largest set (conservative).
    Returns the states and the pool's largest free set over running nodes."""
    left = gpus
    out = list(states)
    order = sorted((k for k, n in enumerate(out) if n.leaving is NodeLeaving.NO),
                   key=lambda k: out[k].gpu_free)
    for k in order:
        if left <= 0:
            break
        n = out[k]
        give = min(left, max(0, per_node - n.gpu_free))
        if give <= 0:
            continue
        free = n.gpu_free + give
        out[k] = replace(n, gpu_free=free, largest_free_gpu_set=per_node if free >= per_node
                         else n.largest_free_gpu_set)
        left -= give
    largest = max((n.largest_free_gpu_set for n in out if n.leaving is NodeLeaving.NO),
                  default=0)
    return tuple(out), largest


@dataclass(slots=True, eq=False)
class MergeMemo:
    """What the last merge made of each pool and cluster, and from what. Only speed, never a
    value: a shell that merges every epoch (the twin) may pass the same memo to each `merge`,
    and a pool whose every input is the same object, or an equal value, as at the last merge
    is that merge's `Pool` again, an equal value (so the planner's per-pool caches,
    `Pool.free`, carry over too); a member whose every pool input is unchanged (`Member` and
    its inventory's `observations` mapping the same objects, reclaims, reclaim rate, replica
    counts and released requests equal; no synced price or telemetry about it) keeps last
    merge's pools without looking at each (its provenance, quota and health are merged
    afresh: their ages move with `now_s`); with `MergeSettings.ages` off (no age moves with
    the clock), such a member whose quota reading, hub reading and settings are also
    unchanged, with no agent RTT in the inputs, is last merge's `Cluster` itself; the network
    maps (RTT, egress, bandwidth) given as the same mapping objects as last time, with no
    agent measurement, are last merge's copies again. So the caller must not change a
    mapping it passed. The result is the merge without a memo."""

    pools: dict[Pair, tuple[tuple[object, ...], Pool]] = field(default_factory=dict)
    maps: tuple[tuple[object, ...], NetworkMaps] | None = None
    # Per member name: its inputs, its merged pools and the source of its pricing provenance.
    clusters: dict[str, tuple[tuple[object, ...], tuple[Pool, ...], str]] = field(
        default_factory=dict)
    # Per member name, with `MergeSettings.ages` off: its inputs and its merged Cluster.
    members: dict[str, tuple[tuple[object, ...], Cluster]] = field(default_factory=dict)


def merge_cluster(member: Member, inputs: MergeInputs, settings: MergeSettings,
                  memo: MergeMemo | None = None) -> Cluster:
    """One member with every reading about it applied (commitments come after, for all)."""
    c = member.cluster
    now = inputs.now_s
    inv = inputs.inventory.get(c.name)
    usage = inputs.usage.get(c.name)
    key = _cluster_inputs(member, inv, usage, inputs) if memo is not None else None
    whole = None  # everything the Cluster is made of, where no age moves it (`MergeMemo`)
    if memo is not None and key is not None and not settings.ages and not inputs.rtts:
        whole = (*key, settings, _quota_reading(member, c.region, inputs),
                 inputs.hub.get(c.name) if c.is_edge else None)
        hit = memo.members.get(c.name)
        if hit is not None and _same_inputs(hit[0], whole):
            return hit[1]
    prov: dict[str, Provenance] = {}
    if inv is not None:
        prov["observed"] = _prov("inventory", now, inv.observed_s, settings.inventory_max_age_s,
                                 settings)
    if usage is not None:
        prov["telemetry"] = _prov("telemetry", now, usage.read_s, settings.telemetry_max_age_s,
                                  settings)
    kept = memo.clusters.get(c.name) if memo is not None and key is not None else None
    memoised = inv is None or all(p.name in inv.observations for p in c.pools)
    if kept is not None and key is not None and _same_inputs(kept[0], key):
        # Every price is the registration's (no synced one): one source, one age.
        pools = kept[1]
        prov["pricing"] = Provenance(kept[2], _age(now, member.registered_s, settings))
    else:
        pools, priced = _merged_pools(member, inv, usage, inputs, settings, memo)
        prov["pricing"] = _worst(priced) if priced else \
            Provenance("registration", _age(now, member.registered_s, settings))
        if memo is not None and key is not None and memoised:
            memo.clusters[c.name] = (key, pools, prov["pricing"].source)
    vcpu, gpu, stale, prov["quota"] = quota_of(c, pools, member, inputs, settings)
    healthy, prov["health"] = _health(member, inputs, settings)
    rtt_ages = [_age(now, r.measured_s, settings) for r in inputs.rtts if r.site == c.name]
    if rtt_ages:
        prov["rtt"] = Provenance("agent", min(rtt_ages),
                                 stale=min(rtt_ages) > settings.rtt_max_age_s)
    out = replace(c, pools=pools, quota_vcpu=vcpu, quota_gpu=gpu, quota_stale=stale,
                  healthy=healthy, provenance=prov,
                  allowed_tenants=None if member.operator
                  else frozenset({member.tenant}) | member.lent_to)
    if memo is not None and whole is not None and memoised:
        memo.members[c.name] = (whole, out)
    return out


def _merged_pools(member: Member, inv: Inventory | None, usage: UsageReading | None,
                  inputs: MergeInputs, settings: MergeSettings, memo: MergeMemo | None
                  ) -> tuple[tuple[Pool, ...], list[Provenance]]:
    """The member's pools with every reading applied, and the provenance of each price."""
    c = member.cluster
    by_pool: dict[str, list[ObservedNode]] = {}
    if inv is not None:
        by_pool, _stray = nodes_by_pool(c.pools, inv)
    out: list[Pool] = []
    priced: list[Provenance] = []
    registered: dict[str, Provenance] = {}
    for p in c.pools:  # every reading about the pool, then one copy of it at most
        price, pp = price_of(p, member, inputs, settings, registered)
        if p.pricing is not PricingModel.EDGE:
            priced.append(pp)
        pair = (c.name, p.name)
        key = _pool_inputs(p, pair, inv, usage, inputs, price) if memo is not None else None
        if key is not None and memo is not None:
            kept = memo.pools.get(pair)
            if kept is not None and _same_inputs(kept[0], key):
                out.append(kept[1])
                continue
        merged = _merge_pool(p, c.name, inv, by_pool, usage, inputs, price)
        if key is not None and memo is not None:
            memo.pools[pair] = (key, merged)
        out.append(merged)
    return tuple(out), priced


def _cluster_inputs(member: Member, inv: Inventory | None, usage: UsageReading | None,
                    inputs: MergeInputs) -> tuple[object, ...] | None:
    """Everything `_merged_pools` reads about `member` but the clock, for `MergeMemo`
    (None: not memoised: a synced price or telemetry may be about it). The reclaim rate
    moves with `now_s` only where a pool was reclaimed: its divisor is then part of it."""
    if inputs.prices or usage is not None:
        return None
    c = member.cluster
    name = c.name
    obs = reclaims = boots = None
    hours = 0.0  # the reclaim rates' divisor (`reclaim_rate_per_hour`), where one counts
    if inv is not None:
        obs, reclaims, boots = inv.observations, inv.reclaims, inv.boots
        if any(reclaims.values()):
            hours = max((inputs.now_s - inv.since_s) / 3600.0, 1.0)
    released = inputs.released
    return (member, obs, reclaims, boots, hours,
            tuple([inputs.replicas.get((name, p.name)) for p in c.pools]),
            tuple([released.get((name, p.name)) for p in c.pools]) if released else None)


def _pool_inputs(p: Pool, pair: Pair, inv: Inventory | None, usage: UsageReading | None,
                 inputs: MergeInputs, price: float) -> tuple[object, ...] | None:
    """Everything `_merge_pool` reads about `p`, for `MergeMemo` (None: not memoised, as
    when the pool's nodes come raw rather than as a `PoolObservation`)."""
    obs = None
    rate = 0.0
    boot: float | None = None
    if inv is not None:
        obs = inv.observations.get(p.name)
        if obs is None:
            return None
        rate = reclaim_rate_per_hour(inv.reclaims.get(p.name, 0), inv.since_s, inputs.now_s)
        boot = inv.boots.get(p.name)
    return (p, obs, inv is None, rate, boot, price,
            None if usage is None else usage.pools.get(p.name),
            inputs.released.get(pair), inputs.replicas.get(pair))


def _same_inputs(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """The registered pool and its observation by identity (values: an identical one is an
    equal one), the rest by value."""
    return a[0] is b[0] and a[1] is b[1] and a[2:] == b[2:]


def _merge_pool(p: Pool, cluster: str, inv: Inventory | None,
                by_pool: Mapping[str, list[ObservedNode]], usage: UsageReading | None,
                inputs: MergeInputs, price: float) -> Pool:
    """The registered pool `p` with every reading about it applied: one copy at most."""
    changes: dict[str, object] = {}
    if inv is not None:
        changes = observed_fields(p, by_pool[p.name], reclaims=inv.reclaims.get(p.name, 0),
                                  since_s=inv.since_s, now_s=inputs.now_s,
                                  observation=inv.observations.get(p.name),
                                  boot_s=inv.boots.get(p.name))
    if usage is not None and (m := usage.pools.get(p.name)) is not None:
        used = changes.get("used", p.used)
        assert isinstance(used, Resources)
        changes["used"] = Resources(max(used.cpu, m.cpu),
                                    max(used.memory_gib, m.memory_gib), used.gpu)
    if (off := inputs.released.get((cluster, p.name))) is not None:
        seen = changes.get("used")
        used = seen if isinstance(seen, Resources) else p.used
        changes["used"] = Resources(max(0.0, used.cpu - off.cpu),
                                    max(0.0, used.memory_gib - off.memory_gib),
                                    max(0, used.gpu - off.gpu))
        seen_states = changes.get("node_states", p.node_states)
        if off.gpu > 0 and isinstance(seen_states, tuple) and seen_states:
            states, largest = _release_gpus(seen_states, off.gpu, int(p.node.gpu))
            changes["node_states"], changes["largest_free_gpu_set"] = states, largest
    if price != p.price_usd_per_hour:
        changes["price_usd_per_hour"] = price
    if n := inputs.replicas.get((cluster, p.name)):
        changes["replicas_placed"], changes["replicas_starting"] = n
    return replace(p, **changes) if changes else p  # type: ignore[arg-type]


def committed_spend(tenants: Sequence[Tenant], running: Sequence[Placement],
                    workloads: Mapping[str, Workload]) -> tuple[Tenant, ...]:
    """Each tenant with the run rate (USD/h) of its active placements: what its budget
    already carries before this epoch adds anything."""
    rate: dict[str, float] = {}
    for p in running:
        w = workloads.get(p.workload_id)
        if w is not None:
            rate[w.tenant] = rate.get(w.tenant, 0.0) + p.cost_usd_per_hour
    return tuple(replace(t, committed_usd_per_hour=rate.get(t.name, 0.0)) for t in tenants)


def replica_counts(running: Sequence[Placement], workloads: Mapping[str, Workload]
                   ) -> dict[Pair, tuple[int, int]]:
    """(placed, not yet running) replicas per (cluster, pool) of the active placements."""
    out: dict[Pair, tuple[int, int]] = {}
    for p in running:
        w = workloads.get(p.workload_id)
        waiting = w is not None and w.status in (WorkloadStatus.PLACED, WorkloadStatus.PENDING)
        for a in p.assignments:
            placed, starting = out.get((a.cluster, a.pool), (0, 0))
            out[(a.cluster, a.pool)] = (placed + a.replicas,
                                        starting + (a.replicas if waiting else 0))
    return out


def measured_rtts(inputs: MergeInputs, settings: MergeSettings,
                  sites: set[str]) -> tuple[dict[Pair, float], dict[Pair, float]]:
    """Fresh agent measurements: (user-side key, site) pairs and (site, peer site) pairs."""
    users: dict[Pair, float] = {}
    peers: dict[Pair, float] = {}
    newest: dict[Pair, RttReading] = {}
    for r in inputs.rtts:
        key = (r.site, r.target)
        if inputs.now_s - r.measured_s > settings.rtt_max_age_s:
            continue
        if key not in newest or r.measured_s > newest[key].measured_s:
            newest[key] = r
    for (site, target), r in newest.items():
        if target in sites:
            peers[(site, target)] = peers[(target, site)] = r.ms
        else:
            users[(target, site)] = r.ms
    return users, peers


def merge(inputs: MergeInputs, settings: MergeSettings | None = None, *,
          memo: MergeMemo | None = None) -> FederationSnapshot:
    """The snapshot the planner and the policy see (see the module docstring)."""
    return merge_screened(inputs, settings, memo=memo)[0]


def merge_screened(inputs: MergeInputs, settings: MergeSettings | None = None, *,
                   memo: MergeMemo | None = None
                   ) -> tuple[FederationSnapshot, dict[str, str]]:
    """The snapshot, and the clusters left out of it because a merged number is absurd
    (placement/sanity.py: not finite, or out of the API's ranges), with why.

    Whatever sensor brought the number (a stored row, a driver's inventory, sync), that
    cluster is its own problem: it is left out and every other one is planned.
    """
    settings = settings or MergeSettings()
    members = members_of(inputs)
    clusters = [merge_cluster(m, inputs, settings, memo) for m in members]
    merged, bad = partition(clusters, inputs.demand, inputs.freed) if settings.screen \
        else (clusters, {})
    committed = with_commitments(merged, inputs.running, inputs.workloads,
                                 ordered=inputs.ordered)
    sites = {c.name for c in committed if c.is_edge}
    rtt, egress, bandwidth = network_maps(inputs, settings, sites, memo)
    return FederationSnapshot(
        now_s=inputs.now_s, clusters=committed, pending=inputs.pending,
        running=inputs.running, user_regions=inputs.user_regions, rtt_ms=rtt,
        tenants=committed_spend(inputs.tenants, inputs.running, inputs.workloads),
        egress_usd_per_gb=egress, bandwidth_gbps=bandwidth, workloads=dict(inputs.workloads),
        displaced=dict(inputs.displaced), demand=dict(inputs.demand),
        freed=dict(inputs.freed)), bad


def network_maps(inputs: MergeInputs, settings: MergeSettings, sites: set[str],
                 memo: MergeMemo | None = None) -> NetworkMaps:
    """The snapshot's RTT map (the catalog's user and cluster RTTs, fresh agent measurements
    over them), and copies of the egress and bandwidth maps (`MergeMemo`: last merge's)."""
    users, peers = measured_rtts(inputs, settings, sites)
    given = (inputs.user_rtt_ms, inputs.cluster_rtt_ms, inputs.egress_usd_per_gb,
             inputs.bandwidth_gbps)
    reuse = memo is not None and not users and not peers
    if reuse and memo is not None and memo.maps is not None \
            and all(a is b for a, b in zip(memo.maps[0], given, strict=True)):
        return memo.maps[1]
    out = ({**inputs.user_rtt_ms, **inputs.cluster_rtt_ms, **users, **peers},
           dict(inputs.egress_usd_per_gb), dict(inputs.bandwidth_gbps))
    if reuse and memo is not None:
        memo.maps = (given, out)
    return out
