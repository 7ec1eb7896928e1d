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
    await ensure_admin_token(rt)
    await _seed(rt.store, [])
    async with rt.store.unit() as uow:  # the clusters are acme's own: submit as acme
        _, token = await uow.tokens.create(tenant="acme")
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
                h = {"Authorization": f"Bearer {token}"}
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


async def test_a_retry_is_stored_and_a_waiting_workload_comes_after_the_due_ones(
        store: Store) -> None:  # noqa: F811
    waiting, fresh = await _seed(store, ["later", "fresh"])
    assert isinstance(store.clock, ManualClock)
    now = store.clock.now()
    plan = EpochPlan((), {waiting: "capacity"}, (),
                     SolveStats("heuristic", 0.0, None, None, 0, 0),
                     retries=(Retry(waiting, not_before_s=now + 30, attempts=2,
                                    reason="capacity"),))
    async with store.unit() as uow:
        counts = await record_decisions(uow, plan, FederationSnapshot(
            now_s=now, clusters=(), pending=()), owners={}, tenants={})
    assert counts == {"retry": 1}
    async with store.unit() as uow:
        w = (await uow.workloads.get(waiting)).workload
        assert await uow.workloads.count_pending() == 2
        # The planner decides again whether it is due (attempts, last attempt); a full
        # batch is filled with due work first, so waiting work never crowds it out.
        assert [p.id for p in await uow.workloads.list_pending(limit=1)] == [fresh]
        assert [p.id for p in await uow.workloads.list_pending()] == [fresh, waiting]
    assert (w.status, w.attempts, w.last_attempt_s) == (WorkloadStatus.PENDING, 2, now)
    store.clock.advance(30)  # its time came: both due, back in (submitted, id) order
    in_order = sorted([waiting, fresh])  # submitted in one unit: the same submitted_s
    async with store.unit() as uow:
        assert [p.id for p in await uow.workloads.list_pending()] == in_order
        await uow.workloads.set_retry(waiting, attempts=3, last_attempt_s=now + 30,
                                      not_before_s=now + 3600)
        assert [p.id for p in await uow.workloads.list_pending()] == [fresh, waiting]
        await uow.workloads.requeue(waiting, reason="cluster x is unhealthy")
    async with store.unit() as uow:  # a failover requeue is due at once
        assert [p.id for p in await uow.workloads.list_pending()] == in_order
