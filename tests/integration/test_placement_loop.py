"""The live shell on the real store: placement loop -> dispatcher -> reconciler -> failover.

Each test gets its own PostgreSQL schema or SQLite file; the member clusters are
SimulatedClusterDrivers (the cloud API edge).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.clock import ManualClock
from broker.domain import (
    Cluster,
    Pool,
    Resources,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.settings import PlacementSettings
from broker.store import Store, migrate
from providers.base import WorkloadPhase
from providers.simulated import SimPool, SimulatedClusterDriver

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgresql":
        url = f"{request.getfixturevalue('pg_url')}?schema=t_place_{secrets.token_hex(5)}"
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=ManualClock(1000.0))
    try:
        yield s
    finally:
        await s.close()
        if request.param == "postgresql":
            await migrate.drop_schema(url)


def _cluster(name: str, region: str, lat: float, lon: float, price: float) -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.2xlarge", node=Resources(8, 32, 0), nodes=2,
                max_nodes=4, price_usd_per_hour=price)
    return Cluster(name=name, provider="aws", region=region, pools=(pool,), lat=lat, lon=lon)


def _driver(name: str, clock: ManualClock) -> SimulatedClusterDriver:
    return SimulatedClusterDriver(name, [SimPool(name="cpu", nodes=4, cpu_per_node=8,
                                                 memory_gib_per_node=32)], clock=clock.now)


def _spec(name: str, replicas: int = 2) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.SERVICE, image="nginx:1.27",
                        replicas=replicas, resources=Resources(1.0, 2.0, 0))


async def _seed(store: Store, names: list[str]) -> list[str]:
    ids = []
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(_cluster("cheap", "us-east-1", 38.9, -77.4, 0.3),
                                  tenant="acme")
        await uow.clusters.upsert(_cluster("dear", "us-west-2", 45.6, -121.2, 0.5),
                                  tenant="acme")
        for n in names:
            rec, _ = await uow.workloads.submit(tenant="acme", spec=_spec(n))
            ids.append(rec.workload.id)
    return ids


async def test_submit_place_dispatch_run_and_explain(store: Store) -> None:
    clock = ManualClock(1000.0)
    ids = await _seed(store, ["a", "b"])
    loop = PlacementLoop(store, clock, PlacementSettings(), catalog=None)
    plan = await loop.tick()
    assert plan is not None
    assert {p.workload_id for p in plan.placements} == set(ids)
    again = await loop.tick()  # nothing pending: an epoch over what runs, placing nothing
    assert again is not None
    assert again.placements == ()
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    disp = Dispatcher(store, drivers, clock, poll_s=0.01)
    assert await disp.dispatch_once() == 2
    assert await disp.dispatch_once() == 0
    async with store.unit() as uow:
        for wid in ids:
            rec = (await uow.workloads.get(wid))
            assert rec.workload.status is WorkloadStatus.PLACED
            assert rec.placement_id is not None
            decision = await uow.placements.get_decision(rec.placement_id)
            assert decision["workload"] == wid
            assert decision["chosen"][0]["cluster"] == "cheap"
    statuses = await drivers["cheap"].list_status()
    assert {s.workload_id for s in statuses} == set(ids)
    assert all(s.phase is WorkloadPhase.RUNNING for s in statuses)
    await Reconciler(store, drivers, clock).reconcile_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(ids[0])).workload.status is WorkloadStatus.RUNNING


async def test_crash_between_apply_and_mark_dispatches_nothing_twice(store: Store) -> None:
    clock = ManualClock(1000.0)
    [wid] = await _seed(store, ["solo"])
    await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    async with store.unit() as uow:
        [rec] = await uow.placements.list_undispatched()
        workload = (await uow.workloads.get(wid)).workload
    # The "crashed" dispatcher applied but never marked the placement dispatched.
    await Dispatcher(store, drivers, clock).apply_placement(rec, workload)
    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    [status] = await drivers["cheap"].list_status()
    assert status.desired_replicas == 2
    assert status.ready_replicas == 2


async def test_failed_cluster_is_failed_over_to_the_other(store: Store) -> None:
    clock = ManualClock(1000.0)
    [wid] = await _seed(store, ["web"])
    loop = PlacementLoop(store, clock, PlacementSettings(), catalog=None)
    await loop.tick()
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    await Dispatcher(store, drivers, clock).dispatch_once()
    drivers["cheap"].set_down(True)
    rec = Reconciler(store, drivers, clock, down_after=2)
    await rec.reconcile_once()
    await rec.reconcile_once()
    assert rec.requeued == [wid]
    plan = await loop.tick()
    assert plan is not None
    assert {a.cluster for a in plan.placements[0].assignments} == {"dear"}
    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    assert [s.workload_id for s in await drivers["dear"].list_status()] == [wid]
    drivers["cheap"].set_down(False)  # it comes back, still running the old replicas
    await rec.reconcile_once()
    assert rec.orphans_deleted == [("cheap", wid)]
    assert await drivers["cheap"].list_status() == []
    assert [s.workload_id for s in await drivers["dear"].list_status()] == [wid]


async def test_missing_driver_is_counted_then_requeued(store: Store) -> None:
    clock = ManualClock(1000.0)
    [wid] = await _seed(store, ["orphan"])
    await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
    disp = Dispatcher(store, {}, clock, max_attempts=2)
    assert await disp.dispatch_once() == 0
    assert await disp.dispatch_once() == 0
    async with store.unit() as uow:
        rec = await uow.workloads.get(wid)
    assert rec.workload.status is WorkloadStatus.PENDING
    assert "no driver for cluster 'cheap'" in rec.message


async def test_explain_and_whatif_over_http(tmp_path: Path) -> None:
    import httpx

    from broker.app import build_runtime, create_app, ensure_admin_token
    from broker.settings import load_settings

    url = f"sqlite+aiosqlite:///{tmp_path / 'api.db'}"
    await migrate.upgrade(url)
    rt = build_runtime(load_settings(store={"url": url}, data_dir=tmp_path))
    admin = await ensure_admin_token(rt)
    try:
        [wid] = await _seed(rt.store, ["web"])
        await PlacementLoop(rt.store, rt.clock, PlacementSettings(),
                            catalog=None).tick()
        async with rt.store.unit() as uow:
            pid = (await uow.workloads.get(wid)).placement_id
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            h = {"Authorization": f"Bearer {admin}"}
            r = await c.get(f"/v1/placements/{pid}/explain", headers=h)
            assert r.status_code == 200, r.text
            assert r.json()["decision"]["chosen"][0]["cluster"] == "cheap"
            r = await c.post(f"/v1/placements/{pid}/whatif", json={"cluster": "dear"},
                             headers=h)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["after"]["clusters"] == ["dear"]
            assert out["delta_cost_usd_per_hour"] > 0
            r = await c.post(f"/v1/placements/{pid}/whatif", json={"cluster": "nope"},
                             headers=h)
            assert r.status_code == 422
            assert "nope" in r.text
            assert (await c.get(f"/v1/placements/{pid}/explain")).status_code == 401
    finally:
        await rt.store.close()


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait (real time: the store does I/O) until `cond()` holds."""
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_loops_poll_the_injected_clock_and_placement_wakes_at_once(store: Store) -> None:
    clock = ManualClock(1000.0)
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    # No batch window: it would wait on this clock, which only the test moves.
    placement = PlacementLoop(store, clock, PlacementSettings(epoch_s=600.0, batch_window_s=0),
                              catalog=None)
    dispatcher = Dispatcher(store, drivers, clock, poll_s=60.0)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        for lp in (placement, dispatcher):
            tg.create_task(lp.run(stop), name=f"test:{lp.name}")
        await _until(lambda: clock.sleepers == 2, "both loops to sleep on the clock")
        [wid] = await _seed(store, ["web"])
        placement.wake()  # what a submission does: no waiting out the 600 s epoch
        await _until(lambda: placement.ticks == 1 and clock.sleepers == 2, "the placement")
        assert dispatcher.applied == 0  # the dispatcher sleeps until its interval passes
        clock.advance(60.0)
        await _until(lambda: dispatcher.applied == 1, "the dispatch")
        stop.set()
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.PLACED


async def test_a_running_workload_scaled_down_in_place_is_applied(store: Store) -> None:
    """The dispatcher applied undispatched placements of `placed` workloads only, so a
    scale-down in place (api/lifecycle.py) of a running workload was recorded and never
    applied: the cluster kept every replica."""
    from broker.api import lifecycle

    clock = ManualClock(1000.0)
    [wid] = await _seed(store, ["web"])
    await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    await Reconciler(store, drivers, clock).reconcile_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING
        _, _, change = await lifecycle.upsert(uow, tenant="acme", ref=wid,
                                              spec=_spec("web", replicas=1))
    assert change == "scale-down"
    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    [status] = await drivers["cheap"].list_status()
    assert status.desired_replicas == 1
