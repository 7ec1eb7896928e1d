"""Agent-measured RTTs reach the placement snapshot under the key the LP looks up.

Real Mosquitto, the real edge hub persisting through the real store (PostgreSQL):
- a real `skyfed-edge` agent process probes a named user probe point (`--probe
  users=host:port`, here on this host); its measurement replaces the coordinate estimate
  (the site's coordinates are 1,160 km from the users), so a service whose SLO the estimate
  rules out at the site is placed there;
- a heartbeat (the agent protocol over MQTT) reporting an RTT above a service's SLO for an
  unnamed `host:port` probe, which the user region lists as its probe point, keeps the next
  placement off that site, and moves a service already running there (planner.Migration,
  reason slo, carried out by the actuator).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from broker.clock import SystemClock
from broker.domain import (
    Cluster,
    Pool,
    PricingModel,
    Resources,
    Site,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.actuator import Actuator
from broker.federation.dispatcher import Dispatcher
from broker.federation.edge_hub import EdgeHub, StoreRecorder
from broker.federation.placement_loop import PlacementLoop, decide_and_plan, fixed_action
from broker.federation.reconciler import Reconciler
from broker.federation.snapshot import SnapshotReader
from broker.placement.snapshot import SITE_POOL
from broker.settings import EdgeSettings, MqttSettings, PlacementSettings, SnapshotSettings
from broker.store import Store, migrate
from edge_agent.protocol import Heartbeat, Status, Topics, encode
from providers.simulated import SimPool, SimulatedClusterDriver

pytestmark = pytest.mark.integration
TOKYO = (35.68, 139.69)
SEOUL = (37.57, 126.98)  # ~1,160 km from Tokyo: estimated ~30 ms (providers/geo.py)
PROBE = "192.0.2.7:7000"  # TEST-NET-1: an address only named, never dialled
SETTINGS = PlacementSettings(time_limit_s=2.0, user_regions=[
    {"name": "users", "lat": TOKYO[0], "lon": TOKYO[1], "probes": [PROBE]}])


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    url = f"{pg_url}?schema=t_rtt_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=SystemClock())
    try:
        yield s
    finally:
        await s.close()
        await migrate.drop_schema(url)


@pytest.fixture
def prefix() -> str:
    return f"test-rtt-{uuid.uuid4().hex[:10]}/v1"


@pytest.fixture
async def hub(store: Store, prefix: str, mqtt_addr: tuple[str, int]) -> AsyncIterator[EdgeHub]:
    async def sites() -> list[Site]:
        async with store.unit() as uow:
            return list(await uow.sites.list())

    h = EdgeHub(settings=EdgeSettings(), prefix=prefix,
                mqtt=MqttSettings(url=f"mqtt://{mqtt_addr[0]}:{mqtt_addr[1]}"),
                recorder=StoreRecorder(store), site_loader=sites, site_refresh_s=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(h.run(stop))
    await asyncio.wait_for(h.connected.wait(), 10)
    yield h
    stop.set()
    await asyncio.wait_for(task, 10)
    async with aiomqtt.Client(*mqtt_addr, identifier=f"clean-{uuid.uuid4().hex[:8]}") as c:
        for s in ("e-a", "e-b"):
            await c.publish(Topics(prefix).status(s), b"", qos=1, retain=True)


async def seed(store: Store, *, site: str, site_at: tuple[float, float]) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.sites.upsert(Site(site, *site_at, capacity=Resources(8, 32),
                                    price_usd_per_hour=0.05), tenant="admin")
        await uow.clusters.upsert(Cluster(
            name="cloud", provider="aws", region="ap-northeast-1", lat=TOKYO[0], lon=TOKYO[1],
            pools=(Pool(name="m5", instance_type="m5.large", node=Resources(2, 8, 0), nodes=4,
                        max_nodes=4, price_usd_per_hour=0.5,
                        pricing=PricingModel.ON_DEMAND),)), tenant="admin")


async def submit(store: Store, slo_ms: float) -> str:
    spec = WorkloadSpec(name="api", kind=WorkloadKind.SERVICE, image="api:1", replicas=1,
                        resources=Resources(1, 1, 0), user_region="users",
                        latency_slo_ms=slo_ms)
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


async def measured(store: Store, site: str, key: str, timeout_s: float = 15.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with store.unit() as uow:
            rtt = (await uow.sites.get(site)).attrs.get("rtt") or {}
        if key in rtt:
            return float(rtt[key]["ms"])
        await asyncio.sleep(0.1)
    raise AssertionError(f"no RTT to {key!r} from {site} reached the store")


def placed_on(plan: object, wid: str) -> set[str]:
    return {a.cluster for p in plan.placements  # type: ignore[attr-defined]
            if p.workload_id == wid for a in p.assignments}


async def plan_now(store: Store) -> object:
    snap = await SnapshotReader(SnapshotSettings(), SETTINGS).pending_snapshot(
        store, batch_max=10)
    return await asyncio.to_thread(decide_and_plan, snap, fixed_action(SETTINGS),
                                   PlacementLoop(store, SystemClock(), SETTINGS)._config)


async def tick(store: Store) -> object:
    reader = SnapshotReader(SnapshotSettings(), SETTINGS)
    return await PlacementLoop(store, SystemClock(), SETTINGS, reader=reader).tick()


async def test_a_real_agents_measurement_replaces_the_estimate(
        store: Store, hub: EdgeHub, prefix: str, mqtt_addr: tuple[str, int],
        tmp_path: Path) -> None:
    await seed(store, site="e-a", site_at=SEOUL)
    wid = await submit(store, slo_ms=25.0)
    # The estimate puts the cheap site out of the SLO: the pricier cloud gets it.
    assert placed_on(await plan_now(store), wid) == {"cloud"}
    probe_point = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    port = probe_point.sockets[0].getsockname()[1]
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edge_agent.cli", "run", "--site", "e-a", "--broker",
        f"mqtt://{mqtt_addr[0]}:{mqtt_addr[1]}", "--prefix", prefix, "--data-dir",
        str(tmp_path / "e-a"), "--probe", f"users=127.0.0.1:{port}", "--probe-every-s", "0.2",
        "--log-level", "WARNING")
    try:
        ms = await measured(store, "e-a", "users")
        assert ms < 25.0  # the agent's probe point is on this host: a loopback connect
        plan = await tick(store)
        assert placed_on(plan, wid) == {"e-a"}
        async with store.unit() as uow:
            rec = await uow.placements.get_active_for_workload(wid)
        assert rec is not None
        assert rec.placement.rtt_ms == pytest.approx(ms)
    finally:
        agent.kill()
        await asyncio.wait_for(agent.wait(), 5)
        probe_point.close()
        with contextlib.suppress(Exception):
            await probe_point.wait_closed()


async def test_a_measured_rtt_over_the_slo_keeps_work_off_the_site(
        store: Store, hub: EdgeHub, prefix: str, mqtt_addr: tuple[str, int]) -> None:
    await seed(store, site="e-b", site_at=(35.69, 139.70))
    first = await submit(store, slo_ms=50.0)
    assert placed_on(await plan_now(store), first) == {"e-b"}  # estimated ~9 ms, cheapest
    topics = Topics(prefix)
    async with aiomqtt.Client(*mqtt_addr, identifier=f"agent-e-b-{uuid.uuid4().hex[:6]}") as c:
        await c.publish(topics.status("e-b"), encode(Status(site="e-b", state="online")),
                        qos=1, retain=True)

        async def beat() -> None:  # as an agent does, until the hub (which hears only
            for seq in range(300):  # sites it loaded from the store) has stored one
                await c.publish(topics.heartbeat("e-b"), encode(Heartbeat(
                    site="e-b", seq=seq, peer_rtt_ms={PROBE: 80.0})), qos=0)
                await asyncio.sleep(0.05)

        beats = asyncio.create_task(beat())
        try:
            assert await measured(store, "e-b", PROBE) == 80.0
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
    snap = await SnapshotReader(SnapshotSettings(), SETTINGS).pending_snapshot(
        store, batch_max=10)
    assert snap is not None
    assert snap.rtt_ms[("users", "e-b")] == 80.0
    plan = await tick(store)
    assert placed_on(plan, first) == {"cloud"}


async def test_a_running_service_whose_measured_rtt_breaks_its_slo_is_moved(
        store: Store, hub: EdgeHub, prefix: str, mqtt_addr: tuple[str, int]) -> None:
    """Issue 10, done-means: an agent-measured RTT over the SLO (real MQTT) moves a RUNNING
    service at the next epoch: the planner decides a Migration (reason slo) and the actuator
    carries it out (simulated member clusters; the store is PostgreSQL)."""
    await seed(store, site="e-b", site_at=(35.69, 139.70))
    wid = await submit(store, slo_ms=50.0)
    assert placed_on(await tick(store), wid) == {"e-b"}  # estimated ~9 ms, cheapest
    clock = SystemClock()
    drivers = {
        "e-b": SimulatedClusterDriver("e-b", [SimPool(name=SITE_POOL, nodes=1, cpu_per_node=8,
                                                      memory_gib_per_node=32)],
                                      clock=clock.now, startup_s=0.0),
        "cloud": SimulatedClusterDriver("cloud", [SimPool(name="m5", nodes=4, cpu_per_node=2,
                                                          memory_gib_per_node=8)],
                                        clock=clock.now, startup_s=0.0)}
    await Dispatcher(store, drivers, clock).dispatch_once()
    await Reconciler(store, drivers, clock).reconcile_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING
    assert (await tick(store)).migrations == ()  # within its SLO: it stays
    topics = Topics(prefix)
    async with aiomqtt.Client(*mqtt_addr, identifier=f"agent-e-b-{uuid.uuid4().hex[:6]}") as c:
        await c.publish(topics.status("e-b"), encode(Status(site="e-b", state="online")),
                        qos=1, retain=True)

        async def beat() -> None:
            for seq in range(300):
                await c.publish(topics.heartbeat("e-b"), encode(Heartbeat(
                    site="e-b", seq=seq, peer_rtt_ms={PROBE: 80.0})), qos=0)
                await asyncio.sleep(0.05)

        beats = asyncio.create_task(beat())
        try:
            assert await measured(store, "e-b", PROBE) == 80.0
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
    plan = await tick(store)
    [m] = plan.migrations
    assert (m.workload_id, m.reason) == (wid, "slo")
    assert {a.cluster for a in m.target.assignments} == {"cloud"}
    act = Actuator(store, drivers, clock)
    for _ in range(3):  # start, switch (replicas ready at once), drain
        await act.act_once()
    async with store.unit() as uow:
        rec = await uow.placements.get_active_for_workload(wid)
    assert rec is not None
    assert {a.cluster for a in rec.placement.assignments} == {"cloud"}
    assert (await drivers["cloud"].status(workload_id=wid)).ready_replicas == 1
    assert await drivers["e-b"].list_status() == []  # drained from the site
