"""The dispatcher: applies written placements through each cluster's ClusterDriver.

Idempotency is what makes crashes harmless. A placement is marked dispatched
only AFTER every assignment was applied; a crash in between leaves it
undispatched, so the next pass applies it again, and `ClusterDriver.apply`
is keyed by workload id (applying the same spec twice is the same as once).
Nothing is lost (the placement row was committed by the placement loop
before any apply) and nothing runs twice.

Retries: a retryable ProviderError (throttling, transient) is retried with
exponential backoff (tenacity) inside one pass; what still fails is counted
on the placement (`record_dispatch_failure`); after `max_attempts` passes the
workload goes back to pending (requeue) so the planner picks another option.
A cluster without a driver counts as a failure that names the cluster.

Cancelled workloads whose placement was applied are deleted from their
clusters and the placement retired (`list_to_withdraw`).

Event-driven: the placement loop calls `wake()` after each commit, so a placement
is applied at once rather than at the next poll; one pass applies its batch
concurrently (`concurrency` calls in flight; each driver caps its own) and marks
what succeeded dispatched in one unit of work. Then `on_dispatched` callbacks get
the clusters applied to (the reconciler's wake-up, so "running" follows promptly).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from broker.clock import Clock
from broker.domain import Assignment, Workload
from broker.federation.looping import PollingLoop
from broker.store import PlacementRecord, Store
from providers.base import ApplySpec, ClusterDriver
from providers.errors import ProviderError

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime

log = logging.getLogger(__name__)


class DispatchError(Exception):
    """One assignment could not be applied; names the cluster."""


def pools_by_cluster(assignments: Iterable[Assignment]) -> dict[str, dict[str, int]]:
    """Cluster -> pool -> replicas: one apply per cluster, so that a split over two pools
    of one cluster is one object with every replica (not two applies, the second
    overwriting the first)."""
    out: dict[str, dict[str, int]] = {}
    for a in assignments:
        pools = out.setdefault(a.cluster, {})
        pools[a.pool] = pools.get(a.pool, 0) + a.replicas
    return out


def apply_spec(workload: Workload, cluster: str, pools: Mapping[str, int]) -> ApplySpec:
    """The driver's view of a placed workload's replicas on one cluster."""
    spec = workload.spec
    first = sorted(pools)[0] if pools else ""
    native = spec.native
    return ApplySpec(
        workload_id=workload.id, tenant=workload.tenant, name=spec.name, kind=str(spec.kind),
        image=spec.image, replicas=sum(pools.values()), cpu=spec.resources.cpu,
        memory_gib=spec.resources.memory_gib, gpu=spec.resources.gpu, pool=first,
        node_selector={"skyfed.io/pool": first} if len(pools) == 1 else {},
        tolerations=tuple({"key": t.key, "operator": t.operator, "value": t.value,
                           "effect": t.effect} for t in spec.tolerations),
        labels={**spec.labels, "skyfed.io/workload": workload.id,
                "skyfed.io/tenant": workload.tenant, "skyfed.io/cluster": cluster},
        env=dict(spec.env), command=tuple(spec.command),
        pool_replicas=dict(pools) if len(pools) > 1 else {},
        manifest=None if native is None else native.workload,
        companions=() if native is None else tuple(native.companions))


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


class Dispatcher(PollingLoop):
    """See the module docstring. Each step dispatches, then withdraws, every `poll_s`."""

    name = "dispatcher"

    def __init__(self, store: Store, drivers: Mapping[str, ClusterDriver], clock: Clock, *,
                 poll_s: float = 1.0, max_attempts: int = 5, retries: int = 3,
                 backoff_s: float = 0.2, batch: int = 500, concurrency: int = 32) -> None:
        super().__init__(clock, interval_s=poll_s)
        self._store = store
        self._drivers = drivers
        self._max_attempts = max_attempts
        self._retries = retries
        self._backoff_s = backoff_s
        self._batch = batch
        self._sem = asyncio.Semaphore(concurrency)
        # Called with the clusters each pass applied to (wakes the reconciler).
        self.on_dispatched: list[Callable[[set[str]], None]] = []
        self._next_withdraw_s = float("-inf")
        self.applied = 0

    async def step(self) -> None:
        while await self.dispatch_once() >= self._batch:
            pass  # a full batch: more are waiting
        if self.clock.now() >= self._next_withdraw_s:  # every poll, not on every wake
            await self.withdraw_once()
            self._next_withdraw_s = self.clock.now() + self.interval_s

    async def dispatch_once(self) -> int:
        """Apply every undispatched placement once; returns how many were dispatched."""
        async with self._store.unit() as uow:
            todo = await uow.placements.list_undispatched(limit=self._batch)
            workloads = await uow.workloads.get_many([r.placement.workload_id for r in todo])
        if not todo:
            return 0

        async def one(rec: PlacementRecord) -> str | None:
            async with self._sem:
                try:
                    await self.apply_placement(rec, workloads[rec.placement.workload_id])
                except (DispatchError, ProviderError) as exc:
                    return str(exc)
            return None

        errors = await asyncio.gather(*(one(rec) for rec in todo))
        done = [rec for rec, err in zip(todo, errors, strict=True) if err is None]
        async with self._store.unit() as uow:
            await uow.placements.mark_dispatched_many([rec.id for rec in done])
        for rec, err in zip(todo, errors, strict=True):
            if err is not None:
                await self._failed(rec, err)
        clusters = {a.cluster for rec in done for a in rec.placement.assignments}
        if clusters:
            for callback in self.on_dispatched:
                callback(clusters)
        return len(done)

    async def apply_placement(self, rec: PlacementRecord, workload: Workload) -> None:
        """Apply every assignment of one placement (without marking it dispatched)."""
        for cluster, pools in pools_by_cluster(rec.placement.assignments).items():
            driver = self._drivers.get(cluster)
            if driver is None:
                raise DispatchError(f"no driver for cluster {cluster!r}")
            spec = apply_spec(workload, cluster, pools)
            async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self._retries),
                    wait=wait_exponential(multiplier=self._backoff_s, max=5.0),
                    retry=retry_if_exception(_retryable), reraise=True):
                with attempt:
                    self._store.check_leader()  # a deposed leader stops applying at once
                    await driver.apply(spec=spec)
            self.applied += 1

    async def _failed(self, rec: PlacementRecord, error: str) -> None:
        async with self._store.unit() as uow:
            attempts = await uow.placements.record_dispatch_failure(rec.id, error)
            if attempts >= self._max_attempts:
                await uow.workloads.requeue(
                    rec.placement.workload_id,
                    reason=f"dispatch failed {attempts} times: {error}")
        log.warning("dispatch of %s failed (%d): %s", rec.id, attempts, error)

    async def withdraw_once(self) -> int:
        """Delete cancelled workloads from their clusters and retire their placements."""
        async with self._store.unit() as uow:
            todo = await uow.placements.list_to_withdraw(limit=self._batch)
        done = 0
        for rec in todo:
            try:
                for cluster in sorted({a.cluster for a in rec.placement.assignments}):
                    driver = self._drivers.get(cluster)
                    if driver is not None:
                        self._store.check_leader()
                        await driver.delete(workload_id=rec.placement.workload_id)
            except ProviderError as exc:
                log.warning("withdraw of %s failed: %s", rec.id, exc)
                continue
            async with self._store.unit() as uow:
                await uow.placements.retire(rec.id)
            done += 1
        return done


def make_dispatcher(rt: Runtime) -> Dispatcher:
    """The dispatcher, woken by the placement loop; it wakes the reconciler (looked up when
    called: it is built after this)."""
    disp = Dispatcher(rt.loop_store(), rt.drivers, rt.clock)

    def wake_reconciler(clusters: set[str]) -> None:
        if rt.reconciler is not None:
            rt.reconciler.wake_for(clusters)

    disp.on_dispatched.append(wake_reconciler)
    return disp
