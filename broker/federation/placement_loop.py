"""The placement loop: pending batch -> snapshot -> plan_epoch -> placements, in one transaction.

Every `epoch_s` (or at once when `wake()` is called because a batch filled; the
`PollingLoop` base class does the waiting, on the injected clock),
the loop reads the pending workloads (priority first, oldest first, at most
`batch_max`) and every sensor (registrations, observed inventory, synced
prices and quotas, telemetry, hub health, measured RTTs, the active
placements, the tenants' budgets) and merges them into a `FederationSnapshot`
(federation/snapshot.py reads, placement/snapshot.py merges), then, in one
worker thread (`asyncio.to_thread`, so torch inference and the solve never
block the event loop), asks the policy for its action and solves, and writes
every placement with its decision record in ONE unit of work. Each decision
record gets a `policy_action` entry: which policy steered (fixed weights or a
checkpoint with its sha256), the action values used (the bias of the chosen
clusters, headroom, prewarm lead, latency weight) and, for a learned policy,
the observation it saw (policy_runtime.py) for `explain --policy`. A crash before
that commit loses nothing (the workloads are still pending and the next tick
solves them again); after it, the dispatcher owns them.

Nothing the plan leaves unplaced is given up: a workload no option takes now (capacity,
quota, budget, but also `no options` when no cluster is registered yet and `infeasible`
when its only clusters are unhealthy or too small) stays pending with the planner's reason
and is tried again under the plan's backoff (`Retry`: attempts, `not_before_s` and the
reason are stored on the workload), or sooner once capacity grew (`capacity_changed_s`,
below), as in the twin. A cluster registered later or recovered is exactly that.

A placement that got only some of a workload's replicas is written as it is (the workload
is placed, the dispatcher applies what it holds) and the rest stays pending: every epoch
the snapshot asks for the replicas the active placement lacks (snapshot.py
`with_top_ups`), and when the plan places some of them the active placement grows
(`grown`: the same assignments plus the new replicas, one new placement row that retires
the old one, the workload's status kept). The dispatcher applies the grown placement like
any other: the drivers apply the new replica counts idempotently, so the replicas already
running stay. That is the twin's `pending` replicas of a partly placed workload.

When capacity grew (`capacity_room`/`capacity_grew` of snapshot.py: a cluster or edge site
registered or healthy again, a pool allowed more nodes, work released, a quota raised) is
what the loop saw between two epochs, kept in memory: after a restart the first epoch counts
as a change, so backing-off workloads are retried within `retry_min_s` (60 s) of it.

The same unit of work writes the plan's other decisions (scale, scale-in,
prewarm, migrations, retries: decision_log.py); after the commit the loop calls
its `on_commit` callbacks, which wake the actuator and the dispatcher. The
snapshot counts the nodes on order (the actuator's open scale decisions) and
shows pools that cannot scale (scaling.py) with `max_nodes == nodes`.

Event-driven: `wake()` (the API calls it on every accepted submission) ends
the wait; the loop then waits `batch_window_s` for more submissions to batch
with (one LP for all of them) and solves. Without wakes it still solves every
`epoch_s`, also when nothing is pending but work runs (the planner may move it
or free its nodes). A full batch (`batch_max`) wakes the loop again at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from broker.clock import Clock
from broker.domain import (
    Assignment,
    Cluster,
    FederationSnapshot,
    Placement,
    PolicyAction,
    Workload,
)
from broker.federation.decision_log import count_metrics, record_decisions
from broker.federation.drain import with_drains
from broker.federation.looping import PollingLoop
from broker.federation.metrics import PENDING, PLACEMENT_EPOCH
from broker.federation.policy_runtime import (
    PolicyDecision,
    PolicyRuntime,
    per_placement,
    share_observation,
)
from broker.federation.preempt import preemptions
from broker.federation.preempt import record as record_preemptions
from broker.federation.quarantine import Quarantine
from broker.federation.snapshot import (
    Room,
    RunningCache,
    SnapshotReader,
    capacity_grew,
    capacity_room,
    decision_config,
)
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.preemption import Preemption
from broker.settings import PlacementSettings, SnapshotSettings
from broker.store import ClusterRecord, Store

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from providers.catalog import Catalog

log = logging.getLogger(__name__)

ActionFn = Callable[[FederationSnapshot], PolicyAction]
# The pools of these registrations that can scale (scaling.py), once the cluster drivers have
# caught up with them.
ScalableFn = Callable[[Sequence[ClusterRecord]], Awaitable[set[tuple[str, str]]]]
SOLVED_KEPT = 8  # epochs that solved pending work, kept in memory (`PlacementLoop.solved`)


@dataclass(frozen=True, slots=True)
class LoopView:
    """What the loop read besides the snapshot: who owns each cluster and workload, and the
    active placement (id, value) of each partly placed workload the batch tops up."""

    owners: Mapping[str, str] = field(default_factory=dict)  # cluster -> tenant
    tenants: Mapping[str, str] = field(default_factory=dict)  # workload id -> tenant
    bases: Mapping[str, tuple[str, Placement]] = field(default_factory=dict)


def grown(base: Placement, added: Placement, base_id: str) -> Placement:
    """`base`, the active placement `base_id` of a partly placed workload, with the
    replicas `added` placed now: one assignment per (cluster, pool, pricing) in `base`'s
    order (the new ones last), so each driver gets the new total of its cluster and the
    replicas already running stay. The decision record is `added`'s, saying what it grew."""
    merged: dict[tuple[str, str, str], Assignment] = {}
    for a in (*base.assignments, *added.assignments):
        key = (a.cluster, a.pool, str(a.pricing))
        old = merged.get(key)
        merged[key] = a if old is None else replace(
            old, replicas=old.replicas + a.replicas, new_nodes=old.new_nodes + a.new_nodes,
            price_usd_per_hour=old.price_usd_per_hour + a.price_usd_per_hour)
    rtts = [r for r in (base.rtt_ms, added.rtt_ms) if r is not None]
    return Placement(base.workload_id, tuple(merged.values()),
                     base.cost_usd_per_hour + added.cost_usd_per_hour,
                     max(rtts) if rtts else None,
                     {**added.decision, "grows": {"placement": base_id,
                                                  "replicas_before": base.placed_replicas,
                                                  "replicas_added": added.placed_replicas}})


def clamp_unscalable(clusters: Sequence[Cluster],
                     scalable: set[tuple[str, str]]) -> tuple[Cluster, ...]:
    """Pools that cannot scale show `max_nodes == nodes`: the planner orders no nodes there
    (the actuator would only refuse them; scaling.py says which pools can scale)."""
    out = []
    for c in clusters:
        pools = tuple(p if (c.name, p.name) in scalable or p.max_nodes <= p.nodes
                      else replace(p, max_nodes=p.nodes) for p in c.pools)
        out.append(replace(c, pools=pools))
    return tuple(out)


def planner_config(settings: PlacementSettings) -> PlannerConfig:
    return PlannerConfig(solver=settings.solver, k_candidates=settings.k_candidates,
                         mip_gap=settings.mip_gap, time_limit_s=settings.time_limit_s,
                         unplaced_penalty_usd=settings.unplaced_penalty_usd,
                         site_cost_fraction=settings.site_cost_fraction,
                         decisions=decision_config(settings))


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
    return plan_with(decide(action_fn, snapshot, source=source), snapshot, config,
                     policy=policy)


def plan_with(chosen: PolicyDecision, snapshot: FederationSnapshot, config: PlannerConfig,
              *, policy: str = "lp") -> EpochPlan:
    """`plan_epoch` under a decided action, its record added to every decision record."""
    plan = plan_epoch(snapshot, chosen.action, config, policy=policy)
    return replace(plan, placements=tuple(
        _with_policy(p, chosen.record) for p in plan.placements))


@dataclass(frozen=True, slots=True)
class SolvedEpoch:
    """An epoch that solved pending work, exactly as the loop solved it: the merged
    snapshot, the policy's action (and its source: `fixed` or `checkpoint`) and the plan
    `plan_epoch` returned, whose placements the loop wrote. The loop keeps the last few in
    memory (`PlacementLoop.solved`) so that other policies can be compared on this very
    snapshot rather than on a re-read of the store (broker/demo/compare.py)."""

    tick: int  # the loop's epoch count (1: its first)
    snapshot: FederationSnapshot
    action: PolicyAction
    source: str
    plan: EpochPlan


def _with_policy(placement: Placement, record: Mapping[str, object]) -> Placement:
    return replace(placement, decision={**placement.decision,
                                        "policy_action": per_placement(record, placement)})


class PlacementLoop(PollingLoop):
    """See the module docstring. Each step is one `tick()`; `wake()` (from PollingLoop)
    starts the next tick now instead of after `settings.epoch_s`."""

    name = "placement"

    def __init__(self, store: Store, clock: Clock, settings: PlacementSettings, *,
                 action_fn: ActionFn | None = None, catalog: Catalog | None = None,
                 policy: str = "lp", reader: SnapshotReader | None = None,
                 scalable: ScalableFn | None = None) -> None:
        super().__init__(clock, interval_s=settings.epoch_s,
                         batch_window_s=settings.batch_window_s)
        self._store = store
        self.reader = reader or SnapshotReader(SnapshotSettings(), settings, catalog=catalog)
        self._settings = settings
        self._config = planner_config(settings)
        self._action_fn = action_fn or fixed_action(settings)
        self._source = "custom" if action_fn is not None else "fixed"
        self._evictions: tuple[Preemption, ...] = ()  # this epoch's (federation/preempt.py)
        self._catalog = catalog
        self._policy = policy
        self.quarantine = Quarantine()  # clusters with absurd numbers stay out (sanity.py)
        self._scalable = scalable
        self._view = LoopView()
        self._cache = RunningCache()
        self._room: Room | None = None  # capacity as the last epoch saw it
        self._capacity_changed_s: float | None = None
        # Called after every commit of an epoch (wakes the actuator and the dispatcher).
        self.on_commit: list[Callable[[], None]] = []
        self.last_plan: EpochPlan | None = None
        self.solved: deque[SolvedEpoch] = deque(maxlen=SOLVED_KEPT)
        self.ticks = 0

    @property
    def config(self) -> PlannerConfig:
        """The planner configuration every epoch solves under."""
        return self._config

    @property
    def policy(self) -> str:
        """The planner policy every epoch solves with (`lp` unless told otherwise)."""
        return self._policy

    async def step(self) -> EpochPlan | None:
        plan = await self.tick()
        if plan is not None and len(plan.placements) + len(plan.unplaced) >= \
                self._settings.batch_max:
            self.wake()  # a full batch: more are waiting
        return plan

    async def snapshot(self) -> FederationSnapshot | None:
        """Every sensor, merged (federation/snapshot.py), with the nodes on order, the
        pools that cannot scale clamped and when capacity last grew; None when nothing is
        pending and nothing runs."""
        async with self._store.unit() as uow:
            PENDING.set(await uow.workloads.count_pending())
        got = await self.reader.epoch(self._store, batch_max=self._settings.batch_max,
                                      quarantine=self.quarantine, cache=self._cache)
        if got is None:
            return None
        snap, r = got
        running = {p.workload_id: p for p in r.running}
        self._view = LoopView(owners={c.cluster.name: c.tenant for c in r.clusters},
                              tenants={w.id: w.tenant for w in (*r.pending,
                                                                *r.workloads.values())},
                              bases={w.id: (r.placement_ids[w.id], running[w.id])
                                     for w in r.pending
                                     if w.id in running and w.id in r.placement_ids})
        if self._scalable is not None:
            scalable = await self._scalable(r.clusters)
            snap = replace(snap, clusters=clamp_unscalable(snap.clusters, scalable))
        room = capacity_room(snap)
        if capacity_grew(self._room, room):
            self._capacity_changed_s = snap.now_s
        self._room = room
        return replace(snap, capacity_changed_s=self._capacity_changed_s)

    async def tick(self) -> EpochPlan | None:
        """One epoch: snapshot, solve off the loop, write everything in one transaction."""
        t0 = time.perf_counter()
        snap = await self.snapshot()
        if snap is None:
            return None
        t1 = time.perf_counter()

        def solve() -> tuple[PolicyDecision, EpochPlan]:
            chosen = decide(self._action_fn, snap, source=self._source)
            return chosen, plan_with(chosen, snap, self._config, policy=self._policy)

        chosen, plan = await asyncio.to_thread(solve)
        if plan.placements or plan.unplaced:
            self.solved.append(SolvedEpoch(self.ticks + 1, snap, chosen.action,
                                           str(chosen.record.get("source", self._source)),
                                           plan))

        def replan(s: FederationSnapshot) -> EpochPlan:
            return decide_and_plan(s, self._action_fn, self._config, policy=self._policy,
                                   source=self._source)

        plan = await with_drains(self._store, snap, plan, replan)
        self._evictions = await preemptions(snap, plan, replan)
        t2 = time.perf_counter()
        counts = await self._write(plan, snap)
        for callback in self.on_commit:
            callback()
        count_metrics(counts, len(plan.placements))
        self.last_plan = plan
        self.ticks += 1
        t3 = time.perf_counter()
        PLACEMENT_EPOCH.observe(t3 - t0)
        log.log(logging.INFO if snap.pending or counts else logging.DEBUG,
                "placement epoch: %d pending, %d placed, %d unplaced, %s gap=%.2g in %.3fs "
                "(snapshot %.3f, plan %.3f, write %.3f)%s",
                len(snap.pending), len(plan.placements), len(plan.unplaced),
                plan.stats.status, plan.stats.gap or 0.0, t3 - t0, t1 - t0, t2 - t1, t3 - t2,
                "".join(f", {n} {k}" for k, n in sorted(counts.items())))
        return plan

    async def _write(self, plan: EpochPlan, snap: FederationSnapshot) -> dict[str, int]:
        """Placements (new, or grown for a partly placed workload), every other decision
        and the retry state of what stayed unplaced: one unit of work.

        The first placement that carries the policy's observation stores it; the others
        point at that placement (`share_observation`), so it is stored once per epoch.
        A workload placed in full forgets its backoff (as the twin's `tries = 0`).
        """
        asked = {w.id: w for w in snap.pending}
        bases = self._view.bases
        holder: str | None = None  # the placement storing this epoch's policy observation
        tau = self.reader.settings.demand_tau_s
        done: list[str] = []  # placed in full after attempts that were not
        async with self._store.unit() as uow:
            rest: list[tuple[Placement, str]] = []
            extends: dict[str, tuple[str, Placement]] = {}
            for p in plan.placements:
                wid = p.workload_id
                base = bases.get(wid)
                if base is not None and not p.assignments:
                    continue  # nothing added: the active placement stays as it is
                message = _partial_message(p, base[1] if base else None, asked.get(wid),
                                           plan.unplaced.get(wid, ""))
                if wid in asked and asked[wid].attempts > 0 and wid not in plan.unplaced:
                    done.append(wid)
                if base is not None:
                    extends[wid] = (base[0], p)
                    p = grown(base[1], p, base[0])
                pa = p.decision.get("policy_action")
                if isinstance(pa, Mapping) and "observation" in pa:
                    if holder is None:
                        ids = await uow.placements.record_many(
                            [(p, message)], demand_tau_s=tau,
                            extends={wid: extends[wid]} if wid in extends else None)
                        holder = ids.get(wid)
                        continue
                    p = replace(p, decision={**p.decision,
                                             "policy_action": share_observation(pa, holder)})
                rest.append((p, message))
            await uow.placements.record_many(rest, demand_tau_s=tau, extends=extends)
            counts = await record_decisions(uow, plan, snap, owners=self._view.owners,
                                            tenants=self._view.tenants)
            await uow.workloads.set_retries([(wid, 0, None, None, None) for wid in done])
            counts["preemption"] = await record_preemptions(
                uow, self._evictions, {wid: w.tenant for wid, w in snap.workloads.items()})
            return counts


def _partial_message(p: Placement, base: Placement | None, asked: Workload | None,
                     reason: str) -> str:
    """A partly placed workload's message: `3 of 5 replicas placed; 2 pending: <reason>`
    ("" when the plan placed every replica it asks for, or nothing is known of the ask)."""
    if not reason or asked is None:
        return ""
    before = base.placed_replicas if base is not None else 0
    want = before + asked.spec.replicas
    have = before + p.placed_replicas
    if have >= want:
        return ""
    return f"{have} of {want} replicas placed; {want - have} pending: {reason}"


def make_placement_loop(rt: Runtime) -> PlacementLoop:
    """The loop on `rt.policy` (fixed weights when None) and the offline catalog, if any.

    It sees which pools can scale (scaling.py, over `rt.drivers` and `rt.accounts`) and,
    after each commit, wakes the actuator and the dispatcher (looked up when called: they
    are built after it). A cluster registered since the driver registry's last refresh gets
    its driver first (the registry refreshes now, not at the refresh loop's next pass): a
    pool with no driver looks unable to scale, so an epoch between the registration and
    that pass would plan the new clusters without their node pools (the README tour's
    8-GPU job went unplaceable, or to the one cluster whose driver was built)."""
    from broker.federation.scaling import scalable_pools

    catalog = _load_catalog(rt)
    s = rt.settings

    async def scalable(records: Sequence[ClusterRecord]) -> set[tuple[str, str]]:
        registry = rt.driver_registry
        if registry is not None and registry.behind(records):
            await registry.refresh(rt.loop_store())
        return scalable_pools(records, drivers=rt.drivers, accounts=rt.accounts)

    loop = PlacementLoop(rt.loop_store(), rt.clock, s.placement, action_fn=rt.policy,
                         catalog=catalog,
                         reader=SnapshotReader(s.snapshot, s.placement, catalog=catalog),
                         scalable=scalable)

    def wake_after_commit() -> None:
        if rt.actuator is not None:
            rt.actuator.wake()
        if rt.dispatcher is not None:
            rt.dispatcher.wake()

    loop.on_commit.append(wake_after_commit)
    return loop


def _load_catalog(rt: Runtime) -> Catalog | None:
    try:
        return rt.offline_catalog()
    except Exception:  # noqa: BLE001 - the catalog is optional: RTTs fall back to estimates
        log.warning("catalog not available; placement uses estimated RTTs and egress prices")
        return None


async def whatif_for_placement(store: Store, settings: PlacementSettings, placement_id: str,
                               force_cluster: str, *, tenant: str | None,
                               catalog: Catalog | None = None,
                               action_fn: ActionFn | None = None,
                               reader: SnapshotReader | None = None) -> dict[str, object]:
    """Counterfactual for a stored placement: re-solve its workload with `force_cluster`.

    The workload is re-planned alone against the current state, read and merged exactly as
    the placement loop does (the other active placements are the `running` set), once
    freely and once forced; the answer is explain.whatif's difference plus the stored
    placement's own cost. Its current usage stays in the pools' observed usage, so both
    sides see the same (slightly conservative) capacity.
    """
    from broker.placement.explain import whatif

    reader = reader or SnapshotReader(SnapshotSettings(), settings, catalog=catalog)
    snap, rec = await reader.whatif_snapshot(store, placement_id, tenant=tenant)
    workload_id = snap.pending[0].id

    def solve() -> dict[str, object]:
        action = decide(action_fn or fixed_action(settings), snap, remember=False).action
        return whatif(snap, action, planner_config(settings), workload_id, force_cluster)

    out = await asyncio.to_thread(solve)
    out["placement_id"] = placement_id
    out["stored"] = {"cost_usd_per_hour": rec.placement.cost_usd_per_hour,
                     "rtt_ms": rec.placement.rtt_ms,
                     "clusters": sorted({a.cluster for a in rec.placement.assignments})}
    return out
