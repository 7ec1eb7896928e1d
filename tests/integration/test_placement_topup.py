"""What the placement loop could not place stays pending, live as in the twin.

Seen before the fix: a placement that got 3 of a workload's 5 replicas marked it placed, and
the other 2 were never planned again (the twin kept them pending); a workload submitted
before any cluster existed, or whose only cluster was unhealthy, became `unplaceable` for
good. Now the missing replicas are re-offered to later epochs under the planner's backoff
(placement/decisions.py) and placed when room appears: the placement grows and the
dispatcher applies the new count, the replicas already running stay. Each test runs on the
real PostgreSQL and on SQLite; the member clusters are SimulatedClusterDrivers.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from broker.clock import ManualClock
from broker.domain import Cluster, Pool, Resources, WorkloadKind, WorkloadSpec, WorkloadStatus
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.settings import PlacementSettings
from broker.store import Store, migrate
from providers.simulated import SimPool, SimulatedClusterDriver

pytestmark = pytest.mark.integration

T0 = 1_000_000.0
STARTUP_S = 10.0  # a new replica of the simulated cluster is ready this long after it starts


@pytest.fixture(params=["postgresql", "sqlite"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "postgresql":
        url = f"{request.getfixturevalue('pg_url')}?schema=t_topup_{secrets.token_hex(5)}"
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(url)
    try:
        yield url
    finally:
        if request.param == "postgresql":
            await migrate.drop_schema(url)


def _cluster(nodes: int, name: str = "solo") -> Cluster:
    """One pool of 8-vCPU nodes that may not grow past `nodes` (max_nodes == nodes)."""
    pool = Pool(name="cpu", instance_type="m5.2xlarge", node=Resources(8, 32, 0),
                nodes=nodes, max_nodes=nodes, price_usd_per_hour=0.384)
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,),
                   lat=38.9, lon=-77.4)


def _web(replicas: int = 5) -> WorkloadSpec:
    # 2 vCPU a replica: a node holds 3 under the default headroom 0.9 (7.2 of 8 vCPU).
    return WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx:1.27",
                        replicas=replicas, resources=Resources(2.0, 4.0, 0))


def _driver(clock: ManualClock) -> SimulatedClusterDriver:
    return SimulatedClusterDriver("solo", [SimPool(name="cpu", nodes=2, cpu_per_node=8,
                                                   memory_gib_per_node=32)],
                                  clock=clock.now, startup_s=STARTUP_S)


async def _register(store: Store, cluster: Cluster) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(cluster, tenant="acme")


async def _submit(store: Store, spec: WorkloadSpec) -> str:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


async def _view(store: Store, wid: str) -> dict[str, object]:
    """What `GET /v1/workloads/{id}` shows of the workload's status."""
    from broker.api.conditions import status_extra
    from broker.api.views import workload_view

    async with store.unit() as uow:
        rec = await uow.workloads.get(wid)
        placement = await uow.placements.get_active_for_workload(wid)
    status = workload_view(rec)["status"]
    assert isinstance(status, dict)
    return status | status_extra(rec, placement)


def _condition(status: dict[str, object], kind: str) -> dict[str, str]:
    conditions = status["conditions"]
    assert isinstance(conditions, list)
    [found] = [c for c in conditions if c["type"] == kind]
    return dict(found)


async def _placed_3_of_5(store: Store, clock: ManualClock,
                         driver: SimulatedClusterDriver) -> str:
    """One node registered: the first epoch places 3 of web's 5 replicas, the dispatcher
    applies them and the reconciler sees them run."""
    await _register(store, _cluster(nodes=1))
    wid = await _submit(store, _web())
    plan = await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
    assert plan is not None
    [placement] = plan.placements
    assert placement.placed_replicas == 3
    assert plan.unplaced[wid].startswith("capacity")
    assert await Dispatcher(store, {"solo": driver}, clock).dispatch_once() == 1
    clock.advance(STARTUP_S)
    await Reconciler(store, {"solo": driver}, clock).reconcile_once()
    return wid


async def test_a_workload_placed_3_of_5_gets_its_last_2_once_capacity_grows(
        db_url: str) -> None:
    clock = ManualClock(T0)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    driver = _driver(clock)
    try:
        wid = await _placed_3_of_5(store, clock, driver)
        status = await _view(store, wid)
        assert status["phase"] == "running"
        assert status["pendingReplicas"] == 2
        scheduled = _condition(status, "Scheduled")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "PartiallyPlaced")
        assert scheduled["message"].startswith("3 of 5 replicas placed on solo; 2 pending")
        assert "capacity" in scheduled["message"]
        assert _condition(status, "Ready")["status"] == "False"

        loop = PlacementLoop(store, clock, PlacementSettings(), catalog=None)
        clock.advance(PlacementSettings().epoch_s * 4)
        plan = await loop.tick()  # still no room: the 2 stay pending, nothing moves
        assert plan is not None
        assert plan.placements == ()
        assert plan.unplaced[wid].startswith("capacity")
        async with store.unit() as uow:
            assert (await uow.workloads.get(wid)).workload.attempts == 2

        await _register(store, _cluster(nodes=2))  # the pool may have a second node now
        clock.advance(PlacementSettings().epoch_s * 8)
        plan = await loop.tick()
        assert plan is not None
        [grown] = plan.placements
        assert (grown.workload_id, grown.placed_replicas) == (wid, 2)
        assert wid not in plan.unplaced
        async with store.unit() as uow:
            active = await uow.placements.get_active_for_workload(wid)
            assert active is not None
            assert active.placement.placed_replicas == 5
            assert active.placement.decision["grows"]["replicas_before"] == 3
        assert await Dispatcher(store, {"solo": driver}, clock).dispatch_once() == 1
        [st] = await driver.list_status()
        # The 3 that ran keep running while the 2 new ones start.
        assert (st.desired_replicas, st.ready_replicas) == (5, 3)
        clock.advance(STARTUP_S)
        await Reconciler(store, {"solo": driver}, clock).reconcile_once()
        status = await _view(store, wid)
        assert (status["phase"], status["readyReplicas"]) == ("running", 5)
        assert status["pendingReplicas"] == 0
        assert _condition(status, "Scheduled")["reason"] == "Placed"
        assert _condition(status, "Ready")["status"] == "True"
        plan = await loop.tick()  # nothing is left to place
        assert plan is not None
        assert plan.placements == ()
        assert wid not in plan.unplaced
    finally:
        await store.close()


async def test_a_broker_restart_between_the_partial_placement_and_the_growth_loses_nothing(
        db_url: str) -> None:
    clock = ManualClock(T0)
    driver = _driver(clock)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    try:
        wid = await _placed_3_of_5(store, clock, driver)
    finally:
        await store.close()
    # A new process: a new store, loop and dispatcher, nothing kept in memory.
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    try:
        await _register(store, _cluster(nodes=2))
        clock.advance(PlacementSettings().epoch_s * 2)
        plan = await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
        assert plan is not None
        assert [(p.workload_id, p.placed_replicas) for p in plan.placements] == [(wid, 2)]
        assert await Dispatcher(store, {"solo": driver}, clock).dispatch_once() == 1
        [st] = await driver.list_status()
        assert st.desired_replicas == 5
        status = await _view(store, wid)
        assert status["pendingReplicas"] == 0
    finally:
        await store.close()


async def test_a_workload_submitted_before_any_cluster_waits_and_is_placed_once_one_registers(
        db_url: str) -> None:
    """Backoff of one 100 s epoch; a cluster registered in between makes the workload due
    60 s after its last attempt (decisions.py's `retry_min_s`), not after 100 s."""
    clock = ManualClock(T0)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    settings = PlacementSettings(epoch_s=100.0)
    try:
        wid = await _submit(store, _web(replicas=2))
        loop = PlacementLoop(store, clock, settings, catalog=None)
        plan = await loop.tick()
        assert plan is not None
        assert plan.unplaced[wid].startswith("no options")
        status = await _view(store, wid)
        assert status["phase"] == "pending"
        scheduled = _condition(status, "Scheduled")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        assert "no options" in scheduled["message"]
        assert "next try in 100 s" in scheduled["message"]

        clock.advance(10.0)
        await _register(store, _cluster(nodes=1))
        clock.advance(20.0)
        plan = await loop.tick()  # 30 s after the attempt: still backing off
        assert plan is not None
        assert plan.placements == ()
        assert wid not in plan.unplaced
        clock.advance(31.0)
        plan = await loop.tick()  # 61 s: due early, the federation grew since
        assert plan is not None
        assert [p.workload_id for p in plan.placements] == [wid]
        async with store.unit() as uow:
            assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.PLACED
    finally:
        await store.close()


async def test_a_workload_whose_only_cluster_is_unhealthy_waits_until_it_recovers(
        db_url: str) -> None:
    clock = ManualClock(T0)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    try:
        await _register(store, _cluster(nodes=1))
        async with store.unit() as uow:
            await uow.clusters.set_health("solo", healthy=False, reason="test")
        wid = await _submit(store, _web(replicas=2))
        loop = PlacementLoop(store, clock, PlacementSettings(), catalog=None)
        for _ in range(3):
            plan = await loop.tick()
            assert plan is not None
            assert plan.unplaced[wid].startswith("infeasible")
            async with store.unit() as uow:
                rec = await uow.workloads.get(wid)
            assert rec.workload.status is WorkloadStatus.PENDING
            assert "health" in rec.message
            clock.advance(3600.0)  # past any backoff
        async with store.unit() as uow:
            await uow.clusters.set_health("solo", healthy=True, reason="test")
        plan = await loop.tick()
        assert plan is not None
        assert [p.workload_id for p in plan.placements] == [wid]
    finally:
        await store.close()


async def test_the_migration_puts_workloads_an_older_broker_gave_up_on_back_to_pending(
        db_url: str) -> None:
    """Brokers before `workloads_retry_reason` marked such workloads `unplaceable` for good;
    after the upgrade they are pending again, due at once, with their reason kept."""
    await migrate.downgrade(db_url, "workloads_applied_name")
    clock = ManualClock(T0)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    try:
        wid = await _submit(store, _web(replicas=2))  # no ORM read: the old schema
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE workloads SET status = 'unplaceable', message = "
                                    "'no options: the federation has no pools', attempts = 1,"
                                    " not_before_s = 1e12 WHERE id = :wid"), {"wid": wid})
    finally:
        await store.close()
    await migrate.upgrade(db_url)
    store = Store.from_url(db_url, pool_size=2, clock=clock)
    try:
        async with store.unit() as uow:
            rec = await uow.workloads.get(wid)
        assert rec.workload.status is WorkloadStatus.PENDING
        assert rec.retry_reason == "no options: the federation has no pools"
        await _register(store, _cluster(nodes=1))
        plan = await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
        assert plan is not None
        assert [p.workload_id for p in plan.placements] == [wid]
    finally:
        await store.close()
