"""The reconciler: driver status -> workload status, and failover of what a failed cluster ran.

Each pass asks every driver for `list_status()` (with a timeout):

- a driver that fails `down_after` passes in a row marks its cluster
  unhealthy (`clusters.set_health`); one that answers again marks it healthy;
- every active placement on an unhealthy cluster is requeued (back to
  pending, its placement retired), so the next placement epoch re-places it
  under the same LP, which no longer offers that cluster;
- a workload whose replicas stay not-ready for `stuck_after_s` (e.g. its
  spot nodes were reclaimed and nothing fits) is requeued the same way;
- RUNNING / SUCCEEDED / FAILED reported by the driver are written to the
  workload (placed -> running, running -> succeeded/failed);
- a cluster that comes back still running a workload that was re-placed
  elsewhere meanwhile gets that workload deleted (no replica runs twice),
  unless it is the target of an open migration (migration.py: the actuator
  started it there and switches the placement once it is ready); a workload
  moved off a failed cluster remembers it (`displaced_from`), so the planner
  may move it back once the cluster recovers.

Event-driven: `wake_for(clusters)` (the dispatcher calls it after applying) makes
the next pass come at once and look at those clusters only; the full pass over
every driver still runs every `poll_s`. A pass asks the drivers concurrently and
writes what they report in one unit of work.

One decider per failure: edge sites are the edge hub's (federation/edge_hub.py detects a
silent or crashed agent within a second and fails its services over to the warm standby,
recording the move as a placement). So for an edge member the reconciler only writes driver
phases to workloads: it never marks it unhealthy and never deletes what a recovered site runs
(there it is the hub's warm standby). Work the hub does not keep served (anything but a
service with a latency SLO, see edge_services.py) is requeued when the hub has declared its
site down: each workload has exactly one decider.

Time comes from the injected clock, so the twin and tests drive it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker.clock import Clock
from broker.domain import SiteHealth, WorkloadStatus
from broker.errors import BrokerError
from broker.federation.edge_services import hub_serves
from broker.federation.looping import PollingLoop
from broker.federation.metrics import FAILOVERS
from broker.federation.migration import migration_targets
from broker.store import Store, UnitOfWork
from providers.base import ClusterDriver, DriverStatus, WorkloadPhase
from providers.errors import ProviderError

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime

log = logging.getLogger(__name__)

_PHASE_TO_STATUS = {
    WorkloadPhase.RUNNING: WorkloadStatus.RUNNING,
    WorkloadPhase.SUCCEEDED: WorkloadStatus.SUCCEEDED,
    WorkloadPhase.FAILED: WorkloadStatus.FAILED,
}
_ALLOWED_FROM = {
    WorkloadStatus.RUNNING: frozenset({WorkloadStatus.PLACED}),
    WorkloadStatus.SUCCEEDED: frozenset({WorkloadStatus.PLACED, WorkloadStatus.RUNNING}),
    WorkloadStatus.FAILED: frozenset({WorkloadStatus.PLACED, WorkloadStatus.RUNNING}),
}


class Reconciler(PollingLoop):
    """See the module docstring. Each step is one `reconcile_once`, every `poll_s`."""

    name = "reconciler"

    def __init__(self, store: Store, drivers: Mapping[str, ClusterDriver], clock: Clock, *,
                 poll_s: float = 2.0, down_after: int = 3, stuck_after_s: float = 300.0,
                 timeout_s: float = 10.0) -> None:
        super().__init__(clock, interval_s=poll_s)
        self._store = store
        self._drivers = drivers
        self._down_after = down_after
        self._stuck_after_s = stuck_after_s
        self._timeout_s = timeout_s
        self._failures: dict[str, int] = {}
        self._marked_down: set[str] = set()
        self._not_ready_since: dict[tuple[str, str], float] = {}
        self.requeued: list[str] = []
        self.orphans_deleted: list[tuple[str, str]] = []
        self._migrating: set[tuple[str, str]] = set()
        self._dirty: set[str] = set()
        self._next_full_s = float("-inf")

    def wake_for(self, clusters: set[str]) -> None:
        """Look at `clusters` now (e.g. right after the dispatcher applied there)."""
        self._dirty |= clusters
        self.wake()

    async def step(self) -> None:
        if self.clock.now() >= self._next_full_s or not self._dirty:
            self._dirty.clear()
            await self.reconcile_once()
            self._next_full_s = self.clock.now() + self.interval_s
        else:
            dirty, self._dirty = self._dirty, set()
            await self.reconcile_once(only=dirty)

    async def reconcile_once(self, *, only: set[str] | None = None) -> None:
        """One pass over every driver (or those in `only`), then failover."""
        edge = await self._edge_members()
        names = [n for n in sorted(self._drivers) if only is None or n in only]
        results = await asyncio.gather(*(self._poll(n) for n in names))
        polled: dict[str, list[DriverStatus]] = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, str):
                if name not in edge:
                    await self._unreachable(name, result)
                continue
            if name not in edge:
                await self._reachable(name)
            polled[name] = result
        for cluster, wid in await self._apply(polled, edge):
            await self._delete_orphan(cluster, wid)
        await self._failover(edge)

    async def _poll(self, name: str) -> list[DriverStatus] | str:
        """The driver's statuses, or why it could not be asked."""
        try:
            return await asyncio.wait_for(self._drivers[name].list_status(), self._timeout_s)
        except (ProviderError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__

    async def _edge_members(self) -> set[str]:
        """Edge sites (registered as sites or as `provider: edge` clusters): the hub's."""
        try:
            async with self._store.unit() as uow:
                return set(await uow.clusters.edge_names()) | {
                    s.name for s in await uow.sites.list()}
        except BrokerError as exc:
            log.warning("cannot read edge sites: %s", exc)
            return set()

    async def _unreachable(self, cluster: str, error: str) -> None:
        self._failures[cluster] = self._failures.get(cluster, 0) + 1
        if self._failures[cluster] >= self._down_after and cluster not in self._marked_down:
            await self._set_health(cluster, healthy=False,
                                   reason=f"driver unreachable {self._failures[cluster]}x: "
                                          f"{error}")
            self._marked_down.add(cluster)

    async def _reachable(self, cluster: str) -> None:
        self._failures[cluster] = 0
        if cluster in self._marked_down:
            await self._set_health(cluster, healthy=True, reason="driver reachable again")
            self._marked_down.discard(cluster)

    async def _set_health(self, cluster: str, *, healthy: bool, reason: str) -> None:
        try:
            async with self._store.unit() as uow:
                await uow.clusters.set_health(cluster, healthy=healthy, reason=reason)
        except BrokerError as exc:
            log.warning("cannot set health of %s: %s", cluster, exc)
        log.warning("cluster %s healthy=%s: %s", cluster, healthy, reason)

    async def _apply(self, polled: Mapping[str, list[DriverStatus]],
                     edge: set[str]) -> list[tuple[str, str]]:
        """Write driver phases to workloads; return (cluster, workload) run there by mistake
        (never on an edge site: what a recovered site runs is the hub's warm standby)."""
        now = self.clock.now()
        orphans: list[tuple[str, str]] = []
        changes: list[tuple[str, WorkloadStatus, str]] = []
        seen: dict[str, dict[str, Any]] = {}  # placement id -> cluster -> readiness
        async with self._store.unit() as uow:
            self._migrating = migration_targets(await uow.decisions.list_open(
                kinds=("migration",)))
            reported = [st.workload_id for sts in polled.values() for st in sts]
            active = {r.placement.workload_id: r for r in
                      await uow.placements.list_active_for(reported)}
            for cluster, statuses in polled.items():
                for st in statuses:
                    rec = active.get(st.workload_id)
                    there = rec is not None and cluster in {
                        a.cluster for a in rec.placement.assignments}
                    if not there:
                        if (rec is not None and cluster not in edge
                                and st.phase in (WorkloadPhase.PENDING, WorkloadPhase.RUNNING)
                                and (st.workload_id, cluster) not in self._migrating):
                            orphans.append((cluster, st.workload_id))  # re-placed elsewhere
                        continue
                    if rec is None or not rec.dispatched:
                        continue
                    seen.setdefault(rec.id, dict(rec.cluster_status))[cluster] = {
                        "ready": st.ready_replicas, "desired": st.desired_replicas,
                        "phase": str(st.phase), "message": st.message}
                    change = await self._judge(uow, cluster, st, now)
                    if change is not None:
                        changes.append(change)
            await uow.workloads.transition_many(changes, _ALLOWED_FROM)
            records = {r.id: r for r in active.values()}
            await uow.placements.set_cluster_status_many(
                {pid: value for pid, value in seen.items()
                 if value != dict(records[pid].cluster_status)})  # only what changed
        return orphans

    async def _judge(self, uow: UnitOfWork, cluster: str, st: DriverStatus,
                     now: float) -> tuple[str, WorkloadStatus, str] | None:
        """The status change one report asks for (None: none); requeues the stuck."""
        key = (cluster, st.workload_id)
        if st.phase is WorkloadPhase.PENDING and st.ready_replicas < st.desired_replicas:
            since = self._not_ready_since.setdefault(key, now)
            if now - since >= self._stuck_after_s:
                await uow.workloads.requeue(
                    st.workload_id, reason=f"replicas not ready on {cluster} for "
                                           f"{now - since:.0f}s: {st.message}")
                self.requeued.append(st.workload_id)
                self._not_ready_since.pop(key, None)
            return None
        self._not_ready_since.pop(key, None)
        target = _PHASE_TO_STATUS.get(st.phase)
        return None if target is None else (st.workload_id, target, st.message)

    async def _delete_orphan(self, cluster: str, wid: str) -> None:
        """Remove replicas a recovered cluster still runs for a workload now placed elsewhere."""
        driver = self._drivers.get(cluster)
        if driver is None:
            return
        try:
            await asyncio.wait_for(driver.delete(workload_id=wid), self._timeout_s)
        except (ProviderError, TimeoutError) as exc:
            log.warning("cannot delete orphan %s on %s: %s", wid, cluster, exc)
            return
        self.orphans_deleted.append((cluster, wid))

    async def _failover(self, edge: set[str]) -> None:
        """Requeue everything active on an unhealthy cluster (the LP re-places it), and what
        the hub does not serve on a site the hub declared down."""
        async with self._store.unit() as uow:
            sick = [c for c in await uow.clusters.unhealthy() if c not in edge]
            down = {s.name for s in await uow.sites.list() if s.health is SiteHealth.DOWN}
            for cluster in [*sick, *sorted(down)]:
                recs = await uow.placements.list_active_on_cluster(cluster)
                if cluster in down:
                    ws = await uow.workloads.get_many([r.placement.workload_id for r in recs])
                    recs = [r for r in recs if (w := ws.get(r.placement.workload_id))
                            is not None and not hub_serves(w)]
                for rec in recs:
                    await uow.workloads.requeue(rec.placement.workload_id,
                                                reason=f"cluster {cluster} is unhealthy",
                                                displaced_from=cluster)
                    self.requeued.append(rec.placement.workload_id)
                    FAILOVERS.labels("reconciler").inc()


def make_reconciler(rt: Runtime) -> Reconciler:
    """The reconciler on `[reconciler]` settings; the dispatcher wakes it (`wake_for`)."""
    s = rt.settings.reconciler
    return Reconciler(rt.loop_store(), rt.drivers, rt.clock, poll_s=s.poll_s,
                      down_after=s.down_after, stuck_after_s=s.stuck_after_s)
