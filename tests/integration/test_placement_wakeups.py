"""Event-driven placement, stored retries and the loop's metrics, on the real store.

A submission wakes the placement loop, its commit wakes the dispatcher, the dispatcher wakes
the reconciler: the workload runs long before the (hour-long) epoch would have come round.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.clock import ManualClock
from broker.domain import FederationSnapshot, WorkloadStatus
from broker.federation.decision_log import record_decisions
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.placement.planner import EpochPlan, Retry, SolveStats
from broker.settings import load_settings
from broker.store import Store, migrate
from tests.integration.test_placement_loop import (  # noqa: F401  (fixture)
    _driver,
    _seed,
    _spec,
    store,
)

pytestmark = pytest.mark.integration

BODY = {"apiVersion": "skyfed.io/v1", "kind": "Workload", "metadata": {"name": "web"},
        "spec": {"kind": "service", "image": "nginx:1.27", "replicas": 2,
                 "resources": {"cpu": "1", "memory": "2Gi"}}}


async def test_a_submission_wakes_placement_dispatch_and_status(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'wake.db'}"
    await migrate.upgrade(url)
    settings = load_settings(store={"url": url}, data_dir=tmp_path,
                             placement={"epoch_s": 3600, "batch_window_s": 0.05})
    rt = build_runtime(settings)
    admin = await ensure_admin_token(rt)
    await _seed(rt.store, [])
    clock = ManualClock(1000.0)  # the drivers' clock: replicas are ready at once
    drivers = {"cheap": _driver("cheap", clock), "dear": _driver("dear", clock)}
    loop = PlacementLoop(rt.store, rt.clock, settings.placement, catalog=None)
    disp = Dispatcher(rt.store, drivers, rt.clock, poll_s=3600)
    rec = Reconciler(rt.store, drivers, rt.clock, poll_s=3600)
    loop.on_commit.append(disp.wake)
    disp.on_dispatched.append(rec.wake_for)
    rt.placement_loop = loop
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            for x in (loop, disp, rec):
                tg.create_task(x.run(stop))
            await asyncio.sleep(0.2)  # every loop did its first pass and now waits an hour
            transport = httpx.ASGITransport(app=create_app(rt))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                h = {"Authorization": f"Bearer {admin}"}
                t0 = time.monotonic()
                r = await c.post("/v1/workloads", json=BODY, headers=h)
                assert r.status_code == 201, r.text
                wid = r.json()["id"]
                phase = ""
                while time.monotonic() - t0 < 10 and phase != "running":
                    await asyncio.sleep(0.02)
                    phase = (await c.get(f"/v1/workloads/{wid}", headers=h)
                             ).json()["status"]["phase"]
                assert phase == "running"
                metrics = (await c.get("/metrics")).text
            stop.set()
    finally:
        await rt.store.close()
    assert "skyfed_placement_epoch_seconds_count" in metrics
    assert "skyfed_pending_workloads" in metrics
    assert 'skyfed_decisions_total{kind="placement"}' in metrics
    assert 'skyfed_failovers_total{by="reconciler"}' in metrics


async def test_a_retry_waits_until_not_before_and_is_stored_on_the_workload(
        store: Store) -> None:  # noqa: F811
    [wid] = await _seed(store, ["later"])
    assert isinstance(store.clock, ManualClock)
    now = store.clock.now()
    plan = EpochPlan((), {wid: "capacity"}, (), SolveStats("heuristic", 0.0, None, None, 0, 0),
                     retries=(Retry(wid, not_before_s=now + 30, attempts=2, reason="capacity"),))
    async with store.unit() as uow:
        counts = await record_decisions(uow, plan, FederationSnapshot(
            now_s=now, clusters=(), pending=()), owners={}, tenants={})
    assert counts == {"retry": 1}
    loop = PlacementLoop(store, ManualClock(now), load_settings().placement, catalog=None)
    assert await loop.snapshot() is None  # backing off: not in the batch
    async with store.unit() as uow:
        w = (await uow.workloads.get(wid)).workload
        assert await uow.workloads.count_pending() == 1
    assert (w.status, w.attempts, w.last_attempt_s) == (WorkloadStatus.PENDING, 2, now)
    store.clock.advance(30)
    snap = await loop.snapshot()
    assert snap is not None
    assert [(p.id, p.attempts) for p in snap.pending] == [(wid, 2)]
    async with store.unit() as uow:  # a failover requeue is retried at once
        await uow.workloads.set_retry(wid, attempts=3, last_attempt_s=now,
                                      not_before_s=now + 3600)
        await uow.workloads.requeue(wid, reason="cluster x is unhealthy")
    assert await loop.snapshot() is not None
