"""The inventory poller: every driver's `inventory()`, on an interval, into the store.

Why: placement must decide on what runs, not on what was registered. Every
`snapshot.inventory_interval_s` (default 2 s, at most 5 s) the poller asks each member's
driver (clusters and edge sites alike) for its nodes, concurrently and each with
`inventory_timeout_s`, then writes them in one unit of work (`uow.inventory.put`), so every
broker replica (the API's `GET /v1/clusters/{name}`, the placement loop) reads the same
observation and `observedAt` advances with each poll. A driver that fails or times out keeps
its last observation (its age grows, the merge marks it stale) and the error is recorded;
one failing member never holds up the others.

Kept across polls, per node (`next_nodes`, pure): `ever_ready` (a node never seen Ready is
booting, not leaving), `idle_since_s` (the scale-in timer: when it was first seen without
broker-managed replicas, Cluster Autoscaler's "unneeded since"). Per spot pool: `reclaims`,
nodes that disappeared after a termination notice (the reclaim rate's numerator).
Registered pools also get their observed usage aggregates (`set_pool_usage`), so the plain
cluster listing shows what is requested there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.clock import Clock
from broker.domain import Cluster, NodeLeaving, PricingModel, Resources
from broker.errors import BrokerError, NotFoundError
from broker.federation.looping import PollingLoop
from broker.placement.observed import Inventory, ObservedNode, leaving, observed_pools
from broker.store import InventoryRecord, Store, UnitOfWork
from providers.base import ClusterDriver, NodeInventory
from providers.errors import ProviderError

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime

log = logging.getLogger(__name__)

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


@dataclass(frozen=True, slots=True)
class PollResult:
    member: str
    nodes: tuple[NodeInventory, ...] = ()
    error: str = ""


def empty_node(n: NodeInventory) -> bool:
    """No broker replica runs on the node (where the driver cannot tell: nothing requested)."""
    if n.replicas is not None:
        return n.replicas == 0
    return n.used_cpu <= 0 and n.used_gpu <= 0


def next_nodes(prev: Sequence[ObservedNode], reported: Sequence[NodeInventory], now_s: float,
               spot_pools: frozenset[str] = frozenset()
               ) -> tuple[tuple[ObservedNode, ...], dict[str, int]]:
    """This poll's observed nodes (timers carried over from `prev`) and new spot reclaims."""
    before = {n.name: n for n in prev}
    out = []
    for n in reported:
        old = before.get(n.name)
        empty = empty_node(n)
        idle = (old.idle_since_s if old is not None and old.idle_since_s is not None else now_s) \
            if empty else None
        itype = next((n.labels[k] for k in INSTANCE_TYPE_LABELS if k in n.labels), "")
        out.append(ObservedNode(
            name=n.name, pool=n.pool, instance_type=itype,
            allocatable=Resources(n.allocatable_cpu, n.allocatable_memory_gib,
                                  n.allocatable_gpu),
            allocated=Resources(n.used_cpu, n.used_memory_gib, n.used_gpu),
            ready=n.ready, ever_ready=n.ready or (old is not None and old.ever_ready),
            unschedulable=n.unschedulable, taints=tuple(n.taints), idle_since_s=idle,
            workloads=tuple(n.workloads)))
    seen = {n.name for n in reported}
    reclaims: dict[str, int] = {}
    for old in prev:
        if (old.name not in seen and old.pool in spot_pools
                and leaving(old) is NodeLeaving.TERMINATING):
            reclaims[old.pool] = reclaims.get(old.pool, 0) + 1
    return tuple(out), reclaims


class InventoryPoller(PollingLoop):
    """See the module docstring. Each step is one `poll_once()`, every `interval_s`."""

    name = "inventory"

    def __init__(self, store: Store, drivers: Mapping[str, ClusterDriver], clock: Clock, *,
                 interval_s: float = 2.0, timeout_s: float = 5.0) -> None:
        super().__init__(clock, interval_s=interval_s)
        self._store = store
        self._drivers = drivers
        self._timeout_s = timeout_s
        self.polls = 0

    async def step(self) -> None:
        try:
            await self.poll_once()
        except BrokerError as exc:  # the store is down: poll again next time
            log.warning("storing inventory failed: %s", exc.message)

    async def _read(self, name: str, driver: ClusterDriver) -> PollResult:
        try:
            nodes = await asyncio.wait_for(driver.inventory(), self._timeout_s)
        except (ProviderError, TimeoutError) as exc:
            return PollResult(name, error=f"{type(exc).__name__}: {exc}")
        return PollResult(name, tuple(nodes))

    async def poll_once(self) -> dict[str, PollResult]:
        """Ask every driver, then store every answer in one unit of work."""
        drivers = dict(self._drivers)
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._read(n, d), name=f"inventory-{n}")
                     for n, d in sorted(drivers.items())]
        results = {t.result().member: t.result() for t in tasks}
        async with self._store.unit() as uow:
            now = uow.now
            previous = await uow.inventory.list()
            clusters = {c.name: c for c in await uow.clusters.list()}
            for name, res in results.items():
                if res.error:
                    log.debug("inventory of %s failed: %s", name, res.error)
                    await uow.inventory.record_error(name, res.error)
                    continue
                await self._store_one(uow, name, res, previous.get(name), clusters.get(name),
                                      now)
        self.polls += 1
        return results

    @staticmethod
    async def _store_one(uow: UnitOfWork, name: str, res: PollResult,
                         prev: InventoryRecord | None, cluster: Cluster | None,
                         now: float) -> None:
        spot = frozenset(p.name for p in cluster.pools if p.pricing is PricingModel.SPOT) \
            if cluster is not None else frozenset()
        nodes, new = next_nodes(prev.nodes if prev else (), res.nodes, now, spot)
        reclaims = dict(prev.reclaims) if prev else {}
        for pool, k in new.items():
            reclaims[pool] = reclaims.get(pool, 0) + k
        await uow.inventory.put(name, nodes, reclaims=reclaims)
        if cluster is None:
            return
        pools, _ = observed_pools(cluster.pools, Inventory(now, nodes), now)
        for p in pools:
            try:
                await uow.clusters.set_pool_usage(
                    name, p.name, used_cpu=round(p.used.cpu, 6),
                    used_memory_gib=round(p.used.memory_gib, 6), used_gpu=p.used.gpu,
                    largest_free_gpu_set=p.largest_free_gpu_set)
            except NotFoundError:  # re-registered meanwhile with other pools
                continue


def make_inventory_poller(rt: Runtime) -> InventoryPoller:
    """Polls every driver the broker holds (clusters and sites), `rt.drivers` itself."""
    s = rt.settings.snapshot
    return InventoryPoller(rt.loop_store(), rt.drivers, rt.clock,
                           interval_s=s.inventory_interval_s, timeout_s=s.inventory_timeout_s)
