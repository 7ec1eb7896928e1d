"""The live snapshot: read every sensor from the store, hand the values to the pure merge.

`SnapshotReader` is the one place the live broker assembles a `FederationSnapshot` (the
placement loop, what-if and explain, `GET /v1/clusters/{name}`); the rules that combine the
readings are broker/placement/snapshot.py's, shared with the twin. What it reads, each with
the time it was read (the merge turns those into `Provenance` ages):

- registrations: clusters (`uow.clusters`) and edge sites (`uow.sites`); one registered by an
  admin or operator is federation-wide (`shared`), one registered by a tenant is that
  tenant's and the tenants' it lent it to (`lent_to`);
- observed inventory (`uow.inventory`, written by federation/inventory.py every poll);
- synced offers (`uow.offers`, with the time sync wrote them) and each account's newest good
  quota snapshot (`uow.quotas`), with the account's stale flag;
- telemetry (`attrs.telemetry` of each cluster: per-node CPU/memory in use, Metrics Server);
- hub health and agent-measured RTTs (`sites.health`, `attrs.rtt` of each site, written by
  the edge hub); an RTT to a `host:port` probe counts for the user region that lists that
  probe (`[[placement.user_regions]] probes`);
- the pending batch, the active placements with their workloads (commitments, replica
  counts) and each pool's demand EWMA (`uow.demand`, kept as placements are recorded);
- the replicas a partly placed workload still lacks (`with_top_ups`): the workload, placed
  or running, asks the batch for them under its own id, with its retry state (the twin's
  `pending_workload`), while its active placement stays in `running`.

Network maps (catalog RTTs, egress, the cluster graph) come from the offline catalog through
placement/network.py; the cluster graph is cached per set of clusters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Placement,
    Resources,
    Site,
    SiteHealth,
    UserRegion,
    Workload,
    WorkloadStatus,
    replicas_short,
)
from broker.federation.decision_log import measured_boots, ordered_nodes
from broker.federation.quarantine import Quarantine
from broker.placement.commitments import committed_usage
from broker.placement.decisions import DecisionConfig, due
from broker.placement.network import NetworkCatalog, batch_maps, cluster_pairs
from broker.placement.observed import FREED_WINDOW_TAUS, Inventory, decayed, freed_rates, pool_of
from broker.placement.snapshot import (
    HubReading,
    Member,
    MergeInputs,
    MergeSettings,
    PriceReading,
    QuotaReading,
    RttReading,
    SiteMember,
    UsageReading,
    members_of,
    merge,
    merge_cluster,
    merge_screened,
    replica_counts,
)
from broker.settings import PlacementSettings, SnapshotSettings
from broker.store import ClusterRecord, InventoryRecord, SiteRecord, Store, UnitOfWork

log = logging.getLogger(__name__)

Pair = tuple[str, str]
# The newest done node orders read for the pools' measured boots each epoch: enough for the
# last BOOT_SAMPLES of every pool that scales often; a pool ordered from further back keeps
# the planner's assumed boot until it is ordered again.
BOOT_ORDERS_READ = 500
# The newest workloads that ended read for the pools' release rates each epoch (the net
# forecast: observed.freed_rates over the last FREED_WINDOW_TAUS time constants).
ENDED_READ = 5000


def decision_config(placement: PlacementSettings) -> DecisionConfig:
    """The planner's decision rules live: backoff starts at one epoch, as in the twin."""
    return DecisionConfig(retry_base_s=placement.epoch_s)


def merge_settings(s: SnapshotSettings) -> MergeSettings:
    return MergeSettings(inventory_max_age_s=s.inventory_max_age_s,
                         sync_max_age_s=s.sync_max_age_s,
                         telemetry_max_age_s=s.telemetry_max_age_s,
                         rtt_max_age_s=s.rtt_max_age_s, hub_max_age_s=s.hub_max_age_s,
                         stale_quota_margin=s.stale_quota_margin)


@dataclass(frozen=True)
class Readings:
    """Everything read from the store in one unit of work (before merging)."""

    now_s: float
    clusters: tuple[ClusterRecord, ...]
    sites: tuple[SiteRecord, ...]
    inventory: Mapping[str, InventoryRecord]
    prices: Mapping[tuple[str, str, str], PriceReading]
    quotas: Mapping[tuple[str, str], QuotaReading]
    pending: tuple[Workload, ...] = ()
    running: tuple[Placement, ...] = ()
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    demand: Mapping[Pair, tuple[float, float, float]] = field(default_factory=dict)
    # (when, cluster, pool, vCPUs, GPUs) held by workloads that ended lately (ended_since)
    ended: tuple[tuple[float, str, str, float, float], ...] = ()
    tenants: tuple[Any, ...] = ()
    ordered: Mapping[Pair, int] | None = None  # nodes on order (open scale decisions)
    # cluster -> pool -> measured boot (done node orders: decision_log.measured_boots)
    boots: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    displaced: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # failover homes
    # workload id -> the id of its active placement (of `running`)
    placement_ids: Mapping[str, str] = field(default_factory=dict)


def _member(rec: ClusterRecord) -> Member:
    given = rec.attrs.get("price_sources")
    sources = {str(k): str(v) for k, v in given.items() if v in ("catalog", "registration")} \
        if isinstance(given, Mapping) else {}
    # A draining member (federation/drain.py) takes nothing new: unhealthy to the planner.
    cluster = replace(rec.cluster, healthy=False) if rec.attrs.get("draining") else rec.cluster
    return Member(cluster=cluster, tenant=rec.tenant, operator=rec.shared,
                  account=rec.account, registered_s=rec.updated_s, price_sources=sources,
                  lent_to=frozenset(rec.lent_to))


def _site_member(rec: SiteRecord) -> SiteMember:
    site = replace(rec.site, health=SiteHealth.DOWN) if rec.attrs.get("draining") else rec.site
    return SiteMember(site=site, tenant=rec.tenant, operator=rec.shared,
                      registered_s=rec.updated_s, lent_to=frozenset(rec.lent_to))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def usage_of(rec: ClusterRecord, inventory: InventoryRecord | None) -> UsageReading | None:
    """Metrics Server's per-node usage (attrs.telemetry.nodes) summed per pool."""
    t = rec.attrs.get("telemetry")
    if not isinstance(t, Mapping) or _float(t.get("read_s")) is None:
        return None
    nodes = t.get("nodes")
    if not isinstance(nodes, Mapping) or inventory is None:
        return None
    known = {n.name: n for n in inventory.nodes}
    pools: dict[str, Resources] = {}
    for name, value in nodes.items():
        node = known.get(str(name))
        if node is None or not isinstance(value, Sequence) or len(value) != 2:
            continue
        cpu, mem = _float(value[0]), _float(value[1])
        pool = pool_of(node, rec.cluster.pools)
        if pool is None or cpu is None or mem is None:
            continue
        pools[pool] = pools.get(pool, Resources()) + Resources(cpu, mem, 0)
    return UsageReading(read_s=float(t["read_s"]), pools=pools)


def rtts_of(sites: Sequence[SiteRecord], aliases: Mapping[str, str]) -> tuple[RttReading, ...]:
    """Agent-measured RTTs (attrs.rtt: target -> {ms, at_s}); probe addresses -> region."""
    out = []
    for rec in sites:
        table = rec.attrs.get("rtt")
        if not isinstance(table, Mapping):
            continue
        for target, v in table.items():
            if not isinstance(v, Mapping):
                continue
            ms, at = _float(v.get("ms")), _float(v.get("at_s"))
            if ms is None or at is None:
                continue
            out.append(RttReading(site=rec.site.name, target=aliases.get(str(target),
                                                                         str(target)),
                                  ms=ms, measured_s=at))
    return tuple(out)


async def read(uow: UnitOfWork, *, pending: Sequence[Workload] = (),
               running: bool = True, cache: RunningCache | None = None,
               orders: bool = False, boots: bool = False,
               demand_tau_s: float) -> Readings:
    """One consistent read of every sensor (see the module docstring).

    `cache` (the placement loop's) reads each active placement and running spec once;
    `orders` adds the nodes on order (the actuator's open scale decisions); `boots` each
    pool's measured boot (from the newest BOOT_ORDERS_READ done ones). With `running`, the
    demand EWMA and what the newest ENDED_READ workloads that ended over the last
    FREED_WINDOW_TAUS x `demand_tau_s` held (the net forecast's release rates)."""
    now = uow.now
    clusters = tuple(await uow.clusters.list_records())
    sites = tuple(await uow.sites.list_records())
    inventory = await uow.inventory.list()
    prices = await _prices(uow, clusters)
    quotas = await _quotas(uow, clusters)
    placed: list[Placement] = []
    workloads: dict[str, Workload] = {}
    pids: dict[str, str] = {}
    if running and cache is not None:
        placed, workloads = await cache.read(uow)
        pids = dict(cache.placement_ids)
    elif running:
        records = await uow.placements.list_active(decisions=False)
        placed = [r.placement for r in records]
        pids = {r.placement.workload_id: r.id for r in records}
        workloads = await uow.workloads.get_many(sorted(pids)) if pids else {}
    ordered = ordered_nodes(await uow.decisions.list_open(kinds=("scale", "prewarm"))) \
        if orders else None
    measured = measured_boots(await uow.decisions.list(
        kind="scale", states=("done",), limit=BOOT_ORDERS_READ)) if boots else {}
    displaced = await uow.workloads.displaced(sorted(workloads)) if workloads else {}
    return Readings(now_s=now, clusters=clusters, sites=sites, inventory=inventory,
                    prices=prices, quotas=quotas, pending=tuple(pending),
                    running=tuple(placed), workloads=workloads,
                    demand=await uow.demand.list() if running else {},
                    ended=tuple(await uow.workloads.ended_since(
                        now - FREED_WINDOW_TAUS * demand_tau_s, limit=ENDED_READ))
                    if running else (),
                    tenants=tuple(await uow.tenants.list()), ordered=ordered,
                    displaced=displaced, placement_ids=pids, boots=measured)


async def with_top_ups(uow: UnitOfWork, r: Readings, *, batch_max: int,
                       cfg: DecisionConfig) -> Readings:
    """`r` with the replicas partly placed workloads lack added to the batch.

    Each such workload (placed or running, its active placement holding fewer replicas than
    it asks: `replicas_short`) is re-read for its current retry state and asks for the
    missing replicas under its own id, as the twin's `pending_workload` does. The batch is
    ordered as `list_pending` orders it (due first, by `decisions.due` without the capacity
    signal, which is `not_before_s` passed; then priority, then oldest) and cut to
    `batch_max`. The planner decides again whether each is due.
    """
    short = {p.workload_id: n for p in r.running
             if (w := r.workloads.get(p.workload_id)) is not None
             and w.status in (WorkloadStatus.PLACED, WorkloadStatus.RUNNING)
             and (n := replicas_short(w, p)) > 0}
    if not short:
        return r
    fresh = await uow.workloads.get_many(sorted(short))
    asks = [replace(w, spec=replace(w.spec, replicas=short[wid]))
            for wid, w in fresh.items()
            if w.status in (WorkloadStatus.PLACED, WorkloadStatus.RUNNING)]
    batch = sorted((*r.pending, *asks), key=lambda w: (
        not due(w, r.now_s, cfg), -w.spec.priority, w.submitted_s, w.id))[:batch_max]
    return replace(r, pending=tuple(batch))


# (cluster, pool) -> what it could still take: vCPU, GiB, GPUs; (cluster, "") -> its quota
Room = dict[Pair, tuple[float, float, float]]
_NO_QUOTA = float("inf")


def capacity_room(snapshot: FederationSnapshot) -> Room:
    """What each pool of a healthy member could still take at its largest (`max_nodes` of
    its node minus what is used), and each member's vCPU/GPU quota: the live loop's reading
    of "capacity grew" (`capacity_grew`), the twin's being its own events (node joins,
    releases, faults ending)."""
    out: Room = {}
    for c in snapshot.clusters:
        if not c.healthy:
            continue
        for p in c.pools:
            n = max(p.max_nodes, p.nodes)
            out[(c.name, p.name)] = (p.node.cpu * n - p.used.cpu,
                                     p.node.memory_gib * n - p.used.memory_gib,
                                     float(p.node.gpu * n - p.used.gpu))
        if c.quota_vcpu is not None or c.quota_gpu is not None:
            out[(c.name, "")] = (_NO_QUOTA if c.quota_vcpu is None else c.quota_vcpu, 0.0,
                                 _NO_QUOTA if c.quota_gpu is None else c.quota_gpu)
    return out


def capacity_grew(before: Room | None, after: Room) -> bool:
    """Whether `after` offers anything `before` did not: a member (or pool) that is new or
    healthy again, or more room or quota in any unit. `before` None (the loop's first
    epoch, after a start or restart): any capacity counts as new."""
    if before is None:
        return bool(after)
    for key, room in after.items():
        old = before.get(key)
        if old is None or any(a > b + 1e-6 * max(1.0, abs(b))
                              for a, b in zip(room, old, strict=True)):
            return True
    return False


def _idle_nodes(inventory: Mapping[str, InventoryRecord]) -> bool:
    """Whether any observed node has a scale-in timer running."""
    return any(n.idle_since_s is not None for rec in inventory.values() for n in rec.nodes)


class RunningCache:
    """The active placements and their workloads, each read from the store once.

    A placement row's assignments never change once written, and a live workload's spec only
    changes together with a new placement (api/lifecycle.py), so an
    epoch reads only the ids (with each workload's current status) and fetches what it has
    not seen; what stopped running is forgotten. Saves re-reading thousands of rows (and
    their JSON) every epoch.
    """

    def __init__(self) -> None:
        self._placements: dict[str, Placement] = {}
        self._workloads: dict[str, Workload] = {}
        self.placement_ids: dict[str, str] = {}  # workload id -> active placement id

    async def read(self, uow: UnitOfWork) -> tuple[list[Placement], dict[str, Workload]]:
        ids = await uow.placements.active_ids()
        new_p = [pid for pid, _, _ in ids if pid not in self._placements]
        if new_p:
            self._placements.update({r.id: r.placement
                                     for r in await uow.placements.get_plain_many(new_p)})
        # A spec changes only with a new placement (api/lifecycle.py): re-read those.
        fresh = set(new_p)
        new_w = [wid for pid, wid, _ in ids if wid not in self._workloads or pid in fresh]
        if new_w:
            self._workloads.update(await uow.workloads.get_many(new_w))
        self._placements = {pid: self._placements[pid] for pid, _, _ in ids
                            if pid in self._placements}
        self.placement_ids = {wid: pid for pid, wid, _ in ids if pid in self._placements}
        workloads: dict[str, Workload] = {}
        for _, wid, status in ids:
            w = self._workloads.get(wid)
            if w is not None:
                workloads[wid] = w if w.status is status else replace(w, status=status)
        self._workloads = workloads
        return list(self._placements.values()), dict(workloads)


async def _prices(uow: UnitOfWork, clusters: Sequence[ClusterRecord]
                  ) -> dict[tuple[str, str, str], PriceReading]:
    """The synced offer of every registered pool's (provider, region, instance type)."""
    keys = [(r.cluster.provider, r.cluster.region, p.instance_type)
            for r in clusters for p in r.cluster.pools]
    return {k: PriceReading(o, at) for k, (o, at) in (await uow.offers.with_times(keys)).items()}


async def _quotas(uow: UnitOfWork, clusters: Sequence[ClusterRecord]
                  ) -> dict[tuple[str, str], QuotaReading]:
    out: dict[tuple[str, str], QuotaReading] = {}
    for account in sorted({r.account for r in clusters if r.account}):
        snap = await uow.quotas.last_known_good(account)
        if snap is None:
            continue
        state = await uow.quotas.get_account(account)
        failing = state is not None and state.stale
        regions: dict[str, dict[str, list[float]]] = {}
        for q in snap.quotas:
            metric = "gpu" if q.metric == "gpu" or q.metric.startswith("gpu:") else q.metric
            acc = regions.setdefault(q.region, {}).setdefault(metric, [0.0, 0.0])
            acc[0] += q.limit
            acc[1] += q.used
        for region, m in regions.items():
            vcpu, gpu = m.get("vcpu"), m.get("gpu")
            out[(account, region)] = QuotaReading(
                synced_s=snap.taken_s, vcpu_limit=vcpu[0] if vcpu else None,
                vcpu_used=vcpu[1] if vcpu else 0.0, gpu_limit=gpu[0] if gpu else None,
                gpu_used=gpu[1] if gpu else 0.0, failing=failing)
    return out


def user_regions(placement: PlacementSettings, catalog: NetworkCatalog | None,
                 pending: Sequence[Workload], sites: Sequence[Site]) -> tuple[UserRegion, ...]:
    """Configured user regions, then edge sites by name, then the batch's catalog regions
    (so the planner can estimate RTTs the catalog does not measure)."""
    out = {u.name: UserRegion(u.name, u.lat, u.lon) for u in placement.user_regions}
    for s in sites:
        out.setdefault(s.name, UserRegion(s.name, s.lat, s.lon))
    if catalog is not None:
        for w in pending:
            key = w.spec.user_region
            if not key or ":" not in key or key in out:
                continue
            provider, _, name = key.partition(":")
            try:
                region = catalog.region(provider, name)
            except Exception:  # noqa: BLE001 - unknown region: no coordinates, no estimate
                continue
            if region.lat is not None and region.lon is not None:
                out[key] = UserRegion(key, region.lat, region.lon)
    return tuple(out.values())


class SnapshotReader:
    """Reads the store and merges (see the module docstring). One per broker process."""

    def __init__(self, settings: SnapshotSettings, placement: PlacementSettings, *,
                 catalog: NetworkCatalog | None = None) -> None:
        self.settings = settings
        self.placement = placement
        self.catalog = catalog
        self.merge_settings = merge_settings(settings)
        self._pairs: tuple[tuple[Any, ...], tuple[dict[Pair, float], dict[Pair, float]]] | None
        self._pairs = None
        self._aliases = {probe: u.name for u in placement.user_regions for probe in u.probes}

    def inputs(self, r: Readings, *, network: bool = True) -> MergeInputs:
        tau = self.settings.demand_tau_s
        members = tuple(_member(c) for c in r.clusters)
        sites = tuple(_site_member(s) for s in r.sites)
        inputs = MergeInputs(
            now_s=r.now_s, members=members, sites=sites,
            inventory={k: Inventory(v.observed_s, v.nodes, v.reclaims, v.since_s,
                                    boots=r.boots.get(k, {}))
                       for k, v in r.inventory.items()},
            prices=r.prices, quotas=r.quotas,
            usage={c.cluster.name: u for c in r.clusters
                   if (u := usage_of(c, r.inventory.get(c.cluster.name))) is not None},
            hub={s.site.name: HubReading(s.site.health, s.last_seen_s) for s in r.sites},
            rtts=rtts_of(r.sites, self._aliases), pending=r.pending, running=r.running,
            workloads=r.workloads, replicas=replica_counts(r.running, r.workloads),
            demand={k: (decayed(c, at, r.now_s, tau), decayed(g, at, r.now_s, tau))
                    for k, (c, g, at) in r.demand.items()},
            freed=freed_rates(r.ended, r.now_s, tau),
            tenants=r.tenants, ordered=r.ordered, displaced=r.displaced)
        if not network:
            return inputs
        clusters = [m.cluster for m in members_of(inputs)]
        pair_rtt, gbps = self._cluster_pairs(clusters)
        # The running workloads too: the migration rules price and check their moves.
        asked = (*r.pending, *r.workloads.values())
        user_rtt, egress = batch_maps(self.catalog, clusters, asked)
        return replace(inputs, user_regions=user_regions(
                           self.placement, self.catalog, asked, [s.site for s in r.sites]),
                       user_rtt_ms=user_rtt, egress_usd_per_gb=egress,
                       cluster_rtt_ms=pair_rtt, bandwidth_gbps=gbps)

    def _cluster_pairs(self, clusters: Sequence[Cluster]
                       ) -> tuple[dict[Pair, float], dict[Pair, float]]:
        key = tuple(sorted((c.name, c.provider, c.region, c.lat, c.lon) for c in clusters))
        if self._pairs is None or self._pairs[0] != key:
            self._pairs = (key, cluster_pairs(list(clusters), self.catalog))
        return self._pairs[1]

    def snapshot(self, r: Readings) -> FederationSnapshot:
        return merge(self.inputs(r), self.merge_settings)

    async def pending_snapshot(self, store: Store, *, batch_max: int,
                               quarantine: Quarantine | None = None
                               ) -> FederationSnapshot | None:
        """The pending batch's snapshot: None when nothing is pending. Clusters the merge
        leaves out as absurd are reported through `quarantine` (events, once each)."""
        got = await self.epoch(store, batch_max=batch_max, quarantine=quarantine,
                               idle=False)
        return None if got is None else got[0]

    async def epoch(self, store: Store, *, batch_max: int,
                    quarantine: Quarantine | None = None, idle: bool = True,
                    cache: RunningCache | None = None
                    ) -> tuple[FederationSnapshot, Readings] | None:
        """The placement loop's epoch: the snapshot (with the nodes on order) and what it
        was merged from. None when nothing is pending and (`idle`) nothing runs and no
        observed node is idle: running work alone still gets epochs (the planner may move it
        or free its nodes), and so do idle nodes (the planner scales them in)."""
        async with store.unit() as uow:
            pending = await uow.workloads.list_pending(limit=batch_max)
            if not pending and (not idle or not (await uow.placements.active_ids()
                                                 or _idle_nodes(await uow.inventory.list()))):
                return None
            r = await read(uow, pending=pending, cache=cache, orders=True, boots=True,
                           demand_tau_s=self.settings.demand_tau_s)
            r = await with_top_ups(uow, r, batch_max=batch_max,
                                   cfg=decision_config(self.placement))
        snap, bad = merge_screened(self.inputs(r), self.merge_settings)
        if quarantine is not None and quarantine.changed(bad):
            async with store.unit() as uow:
                await quarantine.record(uow, bad)
        return snap, r

    async def whatif_snapshot(self, store: Store, placement_id: str, *, tenant: str | None
                              ) -> tuple[FederationSnapshot, Any]:
        """A stored placement's workload re-asked alone, against today's state without it."""
        async with store.unit() as uow:
            rec = await uow.placements.get(placement_id, tenant=tenant)
            wrec = await uow.workloads.get(rec.placement.workload_id, tenant=tenant)
            workload = replace(wrec.workload, status=WorkloadStatus.PENDING)
            r = await read(uow, pending=[workload], boots=True,
                           demand_tau_s=self.settings.demand_tau_s)
        others = tuple(p for p in r.running if p.workload_id != workload.id)
        released, _ = committed_usage([rec.placement], {workload.id: workload})
        inputs = replace(self.inputs(replace(r, running=others)), released=released)
        return merge(inputs, self.merge_settings), rec

    async def cluster(self, store: Store, name: str, *, tenant: str | None
                      ) -> tuple[Cluster, Readings, ClusterRecord | SiteRecord]:
        """One member merged (API `GET /v1/clusters/{name}`): the cluster, the readings and
        its registration record. NotFoundError when neither a cluster nor a site has it."""
        from broker.errors import NotFoundError

        async with store.unit() as uow:
            r = await read(uow, running=False, boots=True,
                           demand_tau_s=self.settings.demand_tau_s)
        inputs = self.inputs(r, network=False)
        members = {m.cluster.name: m for m in members_of(inputs)}
        record: ClusterRecord | SiteRecord | None = next(
            (c for c in r.clusters if c.cluster.name == name), None) or next(
            (s for s in r.sites if s.site.name == name), None)
        if name not in members or record is None or (
                tenant is not None and record.tenant != tenant):
            raise NotFoundError(kind="cluster", key=name)
        merged = merge_cluster(members[name], inputs, self.merge_settings)
        return merged, r, record
