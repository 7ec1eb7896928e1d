"""An edge site is one entity (PostgreSQL, own schema per test): registered once, it is an
edge cluster to the planner and the driver registry; the hub's health decides its health;
the hub's failover is recorded as the placement; the reconciler leaves the hub's decisions
alone and re-places only what the hub does not serve."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from broker.clock import ManualClock
from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Site,
    SiteHealth,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.drivers import DriverRegistry
from broker.federation.edge_hub import StoreRecorder
from broker.federation.reconciler import Reconciler
from broker.federation.snapshot import SnapshotReader
from broker.settings import PlacementSettings, SnapshotSettings
from broker.store import Store, migrate
from providers.simulated import SimPool, SimulatedClusterDriver

pytestmark = pytest.mark.integration


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    url = f"{pg_url}?schema=t_edge1_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=ManualClock(1000.0))
    try:
        yield s
    finally:
        await s.close()
        await migrate.drop_schema(url)


def site(name: str, lat: float = 48.1) -> Site:
    return Site(name, lat, 11.6, capacity=Resources(16, 64, 0), price_usd_per_hour=0.3)


def service(name: str, *, slo: float | None = 40.0) -> WorkloadSpec:
    kind = WorkloadKind.SERVICE if slo is not None else WorkloadKind.BATCH
    return WorkloadSpec(name=name, kind=kind, image="x", replicas=1,
                        resources=Resources(1, 1, 0), user_region="munich",
                        latency_slo_ms=slo, duration_s=None if slo else 3600.0)


async def place(store: Store, spec: WorkloadSpec, cluster: str, pool: str = "site") -> str:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
        wid = rec.workload.id
        pid = await uow.placements.record(Placement(wid, (
            Assignment(cluster, pool, PricingModel.EDGE, 1, 0.3),), 0.3))
        assert pid is not None
        await uow.placements.mark_dispatched(pid)
        await uow.workloads.set_status(wid, WorkloadStatus.RUNNING)
    return wid


async def test_a_site_registered_once_is_a_cluster_with_a_driver_and_hub_health(
        store: Store) -> None:
    async with store.unit() as uow:
        await uow.sites.upsert(site("e-muc"), tenant="admin")
    reg = DriverRegistry(clock=ManualClock(1000.0))
    result = await reg.refresh(store)
    assert result.added == ("e-muc",)
    assert reg.kind_of("e-muc") == "edge"
    reader = SnapshotReader(SnapshotSettings(), PlacementSettings())
    merged, _, _ = await reader.cluster(store, "e-muc", tenant=None)
    assert merged.is_edge
    assert merged.healthy
    assert merged.pools[0].node == Resources(16, 64, 0)
    await StoreRecorder(store)("edge_site_health", {"site": "e-muc", "health": "down",
                                                    "cause": "will"})
    merged, _, _ = await reader.cluster(store, "e-muc", tenant=None)
    assert not merged.healthy
    assert merged.provenance["health"].source == "hub"
    async with store.unit() as uow:
        assert await uow.clusters.list() == []  # no shadow cluster row was needed


async def test_hub_failover_is_recorded_as_the_placement(store: Store) -> None:
    async with store.unit() as uow:
        for name in ("e-a", "e-b"):
            await uow.sites.upsert(site(name), tenant="admin")
    wid = await place(store, service("web"), "e-a")
    rec = StoreRecorder(store)
    data = {"service": wid, "from_site": "e-a", "to_site": "e-b", "cause": "heartbeat",
            "detect_ms": 600.0, "serving_ms": 12.0}
    await rec("edge_failover", data)
    await rec("edge_failover", data)  # a replayed record moves nothing twice
    async with store.unit() as uow:
        now = await uow.placements.get_active_for_workload(wid)
        w = await uow.workloads.get(wid)
        moved = await uow.events.list(kind="placement.moved")
    assert now is not None
    assert [a.cluster for a in now.placement.assignments] == ["e-b"]
    assert now.dispatched  # the hub already serves it there: nothing to apply
    assert now.placement.decision["moved_by"] == "edge hub failover"
    assert w.placement_id == now.id
    assert w.workload.status is WorkloadStatus.RUNNING
    assert len(moved) == 1


async def test_reconciler_leaves_edge_failures_to_the_hub(store: Store) -> None:
    shadow = Cluster(name="e-old", provider="edge", region="e-old", lat=48.1, lon=11.6,
                     pools=(Pool(name="site", instance_type="edge", node=Resources(16, 64, 0),
                                 nodes=1, max_nodes=1, price_usd_per_hour=0.3,
                                 pricing=PricingModel.EDGE),))
    async with store.unit() as uow:
        await uow.clusters.upsert(shadow, tenant="admin")  # the older site + cluster form
        await uow.sites.upsert(site("e-old"), tenant="admin")
    served = await place(store, service("web"), "e-old")
    batch = await place(store, service("job", slo=None), "e-old")
    driver = SimulatedClusterDriver("e-old", [SimPool("site", 1, 16, 64)])
    driver.set_down(True)
    rec = Reconciler(store, {"e-old": driver}, ManualClock(1000.0), down_after=1)
    for _ in range(3):
        await rec.reconcile_once()
    async with store.unit() as uow:
        assert (await uow.clusters.get("e-old")).cluster.healthy  # not the reconciler's call
    assert rec.requeued == []
    await StoreRecorder(store)("edge_site_health", {"site": "e-old", "health": "down"})
    await rec.reconcile_once()
    # The hub fails the service over; the batch job it does not serve is re-placed here.
    assert rec.requeued == [batch]
    async with store.unit() as uow:
        assert (await uow.workloads.get(served)).workload.status is WorkloadStatus.RUNNING
        assert (await uow.workloads.get(batch)).workload.status is WorkloadStatus.PENDING
        assert (await uow.sites.get("e-old")).site.health is SiteHealth.DOWN
