"""The placement loop: pending batch -> snapshot -> plan_epoch -> placements, in one transaction.

Every `epoch_s` (or at once when `wake()` is called because a batch filled; the
`PollingLoop` base class does the waiting, on the injected clock),
the loop reads the pending workloads (priority first, oldest first, at most
`batch_max`), the clusters with their pools and usage, the active placements
and the tenants' budgets, builds a `FederationSnapshot` (RTTs and egress
prices for the batch from the catalog when it is available), then, in one
worker thread (`asyncio.to_thread`, so torch inference and the solve never
block the event loop), asks the policy for its action and solves, and writes
every placement with its decision record in ONE unit of work. Each decision
record gets a `policy_action` entry: which policy steered (fixed weights or a
checkpoint with its sha256), the action values used (the bias of the chosen
clusters, headroom, prewarm lead, latency weight) and, for a learned policy,
the observation it saw (policy_runtime.py) for `explain --policy`. A crash before
that commit loses nothing (the workloads are still pending and the next tick
solves them again); after it, the dispatcher owns them.

Workloads no option can ever take (`infeasible`/`no options`) become
`unplaceable` with the reason; workloads left out for capacity, quota or
budget stay pending and are retried next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from broker.clock import Clock
from broker.domain import (
    Cluster,
    FederationSnapshot,
    Placement,
    PolicyAction,
    Site,
    UserRegion,
    Workload,
    WorkloadStatus,
)
from broker.federation.looping import PollingLoop
from broker.federation.policy_runtime import (
    PolicyDecision,
    PolicyRuntime,
    per_placement,
    share_observation,
)
from broker.federation.quarantine import Quarantine
from broker.placement.commitments import with_commitments
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.sanity import partition
from broker.settings import PlacementSettings
from broker.store import Store

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from providers.catalog import Catalog

log = logging.getLogger(__name__)

ActionFn = Callable[[FederationSnapshot], PolicyAction]
_FOREVER_REASONS = ("infeasible", "no options")


def planner_config(settings: PlacementSettings) -> PlannerConfig:
    return PlannerConfig(solver=settings.solver, k_candidates=settings.k_candidates,
                         mip_gap=settings.mip_gap, time_limit_s=settings.time_limit_s,
                         unplaced_penalty_usd=settings.unplaced_penalty_usd,
                         site_cost_fraction=settings.site_cost_fraction)


def fixed_action(settings: PlacementSettings) -> ActionFn:
    """The action without a trained policy: fixed weights from settings."""
    action = PolicyAction(headroom=settings.headroom,
                          latency_weight_usd_per_ms=settings.latency_weight_usd_per_ms)
    return lambda _snapshot: action


def decide(action_fn: ActionFn, snapshot: FederationSnapshot, *, source: str = "custom",
           remember: bool = True) -> PolicyDecision:
    """Action and policy record from a `PolicyRuntime`, or from a plain action function.

    Blocking (a runtime runs torch): call it where the planner runs, off the event loop.
    """
    if isinstance(action_fn, PolicyRuntime):
        return action_fn.decide(snapshot, remember=remember)
    action = action_fn(snapshot)
    return PolicyDecision(action, {
        "source": source, "bias_usd_per_hour": dict(action.cluster_bias_usd_per_hour),
        "headroom": action.headroom, "prewarm_lead_s": action.prewarm_lead_s,
        "latency_weight_usd_per_ms": action.latency_weight_usd_per_ms})


def decide_and_plan(snapshot: FederationSnapshot, action_fn: ActionFn, config: PlannerConfig,
                    *, policy: str = "lp", source: str = "custom") -> EpochPlan:
    """Policy action + `plan_epoch`, with `policy_action` added to every decision record."""
    chosen = decide(action_fn, snapshot, source=source)
    plan = plan_epoch(snapshot, chosen.action, config, policy=policy)
    return replace(plan, placements=tuple(
        _with_policy(p, chosen.record) for p in plan.placements))


def _with_policy(placement: Placement, record: Mapping[str, object]) -> Placement:
    return replace(placement, decision={**placement.decision,
                                        "policy_action": per_placement(record, placement)})


def network_maps(catalog: Catalog | None, clusters: Sequence[Cluster],
                 pending: Sequence[Workload]
                 ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Catalog RTTs (user region -> cluster) and egress prices (data -> cluster) for a batch."""
    rtt: dict[tuple[str, str], float] = {}
    egress: dict[tuple[str, str], float] = {}
    if catalog is None:
        return rtt, egress
    keys = {c.region_key for c in clusters if c.provider in ("aws", "gcp", "azure")}
    users = {w.spec.user_region for w in pending if w.spec.user_region and
             ":" in w.spec.user_region}
    sources = {d.location for w in pending for d in w.spec.data if ":" in d.location}
    for a in users:
        for b in keys:
            try:
                rtt[(a, b)] = catalog.rtt_ms(a, b)[0]
            except Exception:  # noqa: BLE001 - unknown region: the planner estimates instead
                continue
    for a in sources:
        for b in keys:
            try:
                egress[(a, b)] = catalog.egress_usd_per_gb(a, b)
            except Exception:  # noqa: BLE001 - unknown region: documented fallback applies
                continue
    return rtt, egress


def user_regions(catalog: Catalog | None, pending: Sequence[Workload],
                 sites: Sequence[Site]) -> tuple[UserRegion, ...]:
    """Coordinates for the batch's user regions: edge sites by name, catalog regions by key.

    With them the planner can estimate RTTs the catalog does not measure
    (e.g. from `aws:us-east-1` users to an edge site).
    """
    out = {s.name: UserRegion(s.name, s.lat, s.lon) for s in sites}
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


class PlacementLoop(PollingLoop):
    """See the module docstring. Each step is one `tick()`; `wake()` (from PollingLoop)
    starts the next tick now instead of after `settings.epoch_s`."""

    name = "placement"

    def __init__(self, store: Store, clock: Clock, settings: PlacementSettings, *,
                 action_fn: ActionFn | None = None, catalog: Catalog | None = None,
                 policy: str = "lp") -> None:
        super().__init__(clock, interval_s=settings.epoch_s)
        self._store = store
        self._settings = settings
        self._config = planner_config(settings)
        self._action_fn = action_fn or fixed_action(settings)
        self._source = "custom" if action_fn is not None else "fixed"
        self._catalog = catalog
        self._policy = policy
        self.quarantine = Quarantine()  # clusters with absurd numbers stay out (sanity.py)
        self.last_plan: EpochPlan | None = None
        self.ticks = 0

    async def step(self) -> EpochPlan | None:
        return await self.tick()

    async def snapshot(self) -> FederationSnapshot | None:
        """Read one consistent view of what the planner needs; None if nothing is pending."""
        async with self._store.unit() as uow:
            pending = await uow.workloads.list_pending(limit=self._settings.batch_max)
            if not pending:
                return None
            clusters = await self.quarantine.screen(uow, await uow.clusters.list())
            running = await uow.placements.list_active()
            committed = await uow.workloads.get_many([r.placement.workload_id for r in running])
            tenants = await uow.tenants.list()
            sites = await uow.sites.list()
            now = uow.now
        rtt, egress = network_maps(self._catalog, clusters, pending)
        placed = [r.placement for r in running]
        configured = tuple(UserRegion(u.name, u.lat, u.lon) for u in self._settings.user_regions)
        return FederationSnapshot(
            now_s=now, clusters=with_commitments(clusters, placed, committed),
            pending=tuple(pending), running=tuple(placed),
            user_regions=configured + tuple(
                u for u in user_regions(self._catalog, pending, sites)
                if u.name not in {c.name for c in configured}),
            tenants=tuple(tenants),
            rtt_ms=rtt, egress_usd_per_gb=egress)

    async def tick(self) -> EpochPlan | None:
        """One epoch: snapshot, solve off the loop, write everything in one transaction."""
        snap = await self.snapshot()
        if snap is None:
            return None
        t0 = time.perf_counter()
        plan = await asyncio.to_thread(decide_and_plan, snap, self._action_fn, self._config,
                                       policy=self._policy, source=self._source)
        await self._write(plan)
        self.last_plan = plan
        self.ticks += 1
        log.info("placement epoch: %d pending, %d placed, %d unplaced, %s gap=%s in %.3fs",
                 len(snap.pending), len(plan.placements), len(plan.unplaced),
                 plan.stats.status, plan.stats.gap, time.perf_counter() - t0)
        return plan

    async def _write(self, plan: EpochPlan) -> None:
        placed = {p.workload_id for p in plan.placements}
        holder: str | None = None  # the placement storing this epoch's policy observation
        async with self._store.unit() as uow:
            for p in plan.placements:
                reason = plan.unplaced.get(p.workload_id, "")
                message = f"{p.placed_replicas} replicas placed; rest: {reason}" if reason else ""
                pa = p.decision.get("policy_action")
                observed = isinstance(pa, Mapping) and "observation" in pa
                stored = p
                if observed and holder is not None and isinstance(pa, Mapping):
                    stored = replace(p, decision={
                        **p.decision, "policy_action": share_observation(pa, holder)})
                pid = await uow.placements.record(stored, message=message)
                if observed and holder is None and pid is not None:
                    holder = pid
            for wid, reason in plan.unplaced.items():
                if wid not in placed and reason.startswith(_FOREVER_REASONS):
                    await uow.workloads.set_status(wid, WorkloadStatus.UNPLACEABLE,
                                                   message=reason)


def make_placement_loop(rt: Runtime) -> PlacementLoop:
    """The loop on `rt.policy` (fixed weights when None) and the offline catalog, if any."""
    return PlacementLoop(rt.store, rt.clock, rt.settings.placement, action_fn=rt.policy,
                         catalog=_load_catalog(rt))


def _load_catalog(rt: Runtime) -> Catalog | None:
    try:
        return rt.offline_catalog()
    except Exception:  # noqa: BLE001 - the catalog is optional: RTTs fall back to estimates
        log.warning("catalog not available; placement uses estimated RTTs and egress prices")
        return None


async def whatif_for_placement(store: Store, settings: PlacementSettings, placement_id: str,
                               force_cluster: str, *, tenant: str | None,
                               catalog: Catalog | None = None,
                               action_fn: ActionFn | None = None) -> dict[str, object]:
    """Counterfactual for a stored placement: re-solve its workload with `force_cluster`.

    The workload is re-planned alone against the current cluster state (the
    other active placements are the `running` set), once freely and once
    forced; the answer is explain.whatif's difference plus the stored
    placement's own cost. Its current usage stays in the pools' usage, so
    both sides see the same (slightly conservative) capacity.
    """
    from dataclasses import replace

    from broker.placement.explain import whatif

    async with store.unit() as uow:
        rec = await uow.placements.get(placement_id, tenant=tenant)
        wrec = await uow.workloads.get(rec.placement.workload_id, tenant=tenant)
        clusters = partition(await uow.clusters.list())[0]
        running = [r.placement for r in await uow.placements.list_active()
                   if r.id != placement_id]
        tenants = await uow.tenants.list()
        sites = await uow.sites.list()
        now = uow.now
    workload = replace(wrec.workload, status=WorkloadStatus.PENDING)
    rtt, egress = network_maps(catalog, clusters, [workload])
    snap = FederationSnapshot(now_s=now, clusters=tuple(clusters), pending=(workload,),
                              running=tuple(running), tenants=tuple(tenants), rtt_ms=rtt,
                              user_regions=user_regions(catalog, [workload], sites),
                              egress_usd_per_gb=egress)
    def solve() -> dict[str, object]:
        action = decide(action_fn or fixed_action(settings), snap, remember=False).action
        return whatif(snap, action, planner_config(settings), workload.id, force_cluster)

    out = await asyncio.to_thread(solve)
    out["placement_id"] = placement_id
    out["stored"] = {"cost_usd_per_hour": rec.placement.cost_usd_per_hour,
                     "rtt_ms": rec.placement.rtt_ms,
                     "clusters": sorted({a.cluster for a in rec.placement.assignments})}
    return out
