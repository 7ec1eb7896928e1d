"""Leader election, fencing and cross-replica wakes on the real PostgreSQL (issue 13 item 3).

Each test gets its own schema (so its own advisory-lock key and wake channel). A "replica"
here is a `PgLease` / `LeaderElector` in this process; tests/e2e/test_ha_replicas.py runs
whole `skyfed serve` processes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, text

from broker.clock import SystemClock
from broker.domain import (
    Assignment,
    Placement,
    PricingModel,
    Resources,
    WorkloadKind,
    WorkloadSpec,
)
from broker.errors import ConfigError, FencedError
from broker.federation.dispatcher import Dispatcher
from broker.federation.leader import LeaderElector, WakeNotifier
from broker.store import Store, migrate
from broker.store.leadership import Fence, PgLease, SqliteLock
from broker.store.models import DecisionRow, PlacementRow
from providers.base import ApplySpec
from providers.simulated import SimPool, SimulatedClusterDriver

pytestmark = pytest.mark.integration


@pytest.fixture
async def url(pg_url: str) -> AsyncIterator[str]:
    u = f"{pg_url}?schema=t_ha_{secrets.token_hex(5)}"
    await migrate.upgrade(u)
    try:
        yield u
    finally:
        await migrate.drop_schema(u)


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    s = Store.from_url(url, pool_size=2)
    try:
        yield s
    finally:
        await s.close()


def _spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.BATCH, image="busybox:1",
                        replicas=1, resources=Resources(1.0, 1.0, 0))


def _placement(wid: str) -> Placement:
    return Placement(workload_id=wid, cost_usd_per_hour=0.1, rtt_ms=None,
                     assignments=(Assignment(cluster="c", pool="p", pricing=PricingModel.ON_DEMAND,
                                                replicas=1, price_usd_per_hour=0.1),))


async def _submit(store: Store, n: int) -> list[str]:
    ids = []
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        for i in range(n):
            rec, _ = await uow.workloads.submit(tenant="acme", spec=_spec(f"w{i}"))
            ids.append(rec.workload.id)
    return ids


async def _count(store: Store, model: type[PlacementRow] | type[DecisionRow]) -> int:
    async with store.unit() as uow:
        return int((await uow.session.execute(select(func.count()).select_from(model)))
                   .scalar_one())


async def _terminate(store: Store, pid: int | None) -> bool:
    """pg_terminate_backend(pid), as an operator (or a network failure) would."""
    assert pid is not None
    async with store.unit() as uow:
        return bool((await uow.session.execute(text("SELECT pg_terminate_backend(:p)"),
                                               {"p": pid})).scalar_one())


async def test_only_one_lease_holds_and_each_election_raises_the_epoch(url: str) -> None:
    a, b = PgLease(url, holder="a"), PgLease(url, holder="b")
    try:
        await a.connect()
        await b.connect()
        assert await a.try_acquire(1.0) == 1
        assert await b.try_acquire(2.0) is None  # held by a
        await a.close()  # a's session ends: the lock is released with it
        assert await b.try_acquire(3.0) == 2
        assert await a.alive() is False
        # a partitioned leader's session must die on the server in seconds, not hours
        conn = b._conn  # the dedicated session itself
        assert await conn.fetchval("SHOW tcp_keepalives_idle") == "5"
        assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"
    finally:
        await a.close()
        await b.close()


async def test_a_deposed_leaders_late_write_is_refused(url: str, store: Store) -> None:
    """Finding 4's fence: leader A (epoch 1) is deposed by B (epoch 2) before A noticed;
    A's next placement write is refused and nothing of it is stored, B's carries epoch 2."""
    wids = await _submit(store, 2)
    a, b = PgLease(url, holder="a"), PgLease(url, holder="b")
    fence_a, fence_b = Fence(), Fence()
    try:
        await a.connect()
        await b.connect()
        fence_a.epoch = await a.try_acquire(1.0)
        async with store.fenced(fence_a).unit() as uow:
            assert await uow.placements.record(_placement(wids[0])) is not None
        await a.close()  # A's session is gone; A's process has not noticed yet
        fence_b.epoch = await b.try_acquire(2.0)
        assert fence_b.epoch == 2

        async def late_write() -> None:
            async with store.fenced(fence_a).unit() as uow:
                await uow.placements.record(_placement(wids[1]))
                await uow.decisions.add(kind="scale", key="pool:c/p", spec={"nodes": 1})

        with pytest.raises(FencedError, match="superseded by 2"):
            await late_write()
        assert await _count(store, PlacementRow) == 1
        assert await _count(store, DecisionRow) == 0
        async with store.fenced(fence_b).unit() as uow:
            pid = await uow.placements.record(_placement(wids[1]))
            await uow.decisions.add(kind="scale", key="pool:c/p", spec={"nodes": 1})
            await uow.decisions.add_many([{"kind": "prewarm", "key": "pool:c/q",
                                           "spec": {}}])
        async with store.unit() as uow:
            epochs = dict((await uow.session.execute(
                select(PlacementRow.id, PlacementRow.leader_epoch))).all())
            decision_epochs = (await uow.session.execute(
                select(DecisionRow.leader_epoch))).scalars().all()
        assert epochs[pid] == 2
        assert sorted(epochs.values()) == [1, 2]
        assert decision_epochs == [2, 2]
    finally:
        await a.close()
        await b.close()


async def test_a_replica_that_does_not_lead_cannot_start_a_unit(store: Store) -> None:
    with pytest.raises(FencedError, match="not the leader"):
        async with store.fenced(Fence()).unit():
            pass


class _Beat:
    """A loop that counts its steps while it runs."""

    name = "beat"

    def __init__(self) -> None:
        self.running = False
        self.steps = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.running = True
        try:
            while not stop.is_set():
                self.steps += 1
                await asyncio.sleep(0.02)
        finally:
            self.running = False


async def _until(cond: object, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"condition not met in {timeout_s} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_loops_run_in_one_replica_and_move_when_the_leader_goes(
        url: str, store: Store) -> None:
    beats = [_Beat(), _Beat()]
    electors = [LeaderElector(PgLease(url, holder=f"r{i}", timeout_s=1.0), [beats[i]], Fence(),
                              SystemClock(), retry_s=0.1, check_s=0.1, grace_s=0.5)
                for i in range(2)]
    stops = [asyncio.Event(), asyncio.Event()]

    def leaders() -> list[int]:
        return [i for i, e in enumerate(electors) if e.leading]

    async with asyncio.TaskGroup() as tg:
        for e, stop in zip(electors, stops, strict=True):
            tg.create_task(e.run(stop))
        await _until(lambda: any(b.running for b in beats), 10)
        await asyncio.sleep(0.3)  # the other keeps trying meanwhile, and must keep losing
        assert len(leaders()) == 1
        assert leaders() == [i for i, b in enumerate(beats) if b.running]
        first = leaders()[0]
        # 1. its session killed (pg_terminate_backend): it steps down, and a new term starts
        assert await _terminate(store, electors[first].lease.backend_pid)
        await _until(lambda: sum(e.terms for e in electors) >= 2 and len(leaders()) == 1
                     and [i for i, b in enumerate(beats) if b.running] == leaders(), 5)
        # 2. the leader goes away: the other one takes over within 5 s
        now = leaders()[0]
        stops[now].set()
        took_s = await _until(lambda: leaders() == [1 - now] and beats[1 - now].running, 5)
        await _until(lambda: not beats[now].running, 2)
        stops[1 - now].set()
    assert took_s < 5
    async with store.unit() as uow:
        elected = await uow.events.list(kind="leader.elected", include_system=True)
    epochs = [e.data["epoch"] for e in elected]
    assert epochs == list(range(1, len(epochs) + 1))  # one term each, never two at once
    assert len(epochs) >= 3


async def test_a_submission_on_any_replica_wakes_the_leader(url: str, store: Store) -> None:
    woke = asyncio.Event()
    elector = LeaderElector(PgLease(url, holder="leader"), [], Fence(), SystemClock(),
                            retry_s=0.1, check_s=0.1, on_wake=woke.set)
    notifier = WakeNotifier(store, elector.lease.channel)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(elector.run(stop))
        tg.create_task(notifier.run(stop))
        await _until(lambda: elector.leading, 10)
        assert REGISTRY.get_sample_value("skyfed_leader_epoch") == elector.fence.epoch
        await asyncio.sleep(0.1)
        woke.clear()  # the wake it gives itself on election
        notifier.poke()
        await asyncio.wait_for(woke.wait(), 5)
        stop.set()
    assert notifier.sent >= 1
    assert REGISTRY.get_sample_value("skyfed_leader_epoch") == 0  # stepped down at stop


def test_a_second_broker_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    first, second = SqliteLock.for_url(url), SqliteLock.for_url(url)
    assert first is not None
    assert second is not None
    first.acquire()
    try:
        with pytest.raises(ConfigError, match="SQLite supports one broker"):
            second.acquire()
    finally:
        first.release()
    second.acquire()  # free again once the first let go
    second.release()


async def test_replicas_migrating_at_once_take_turns(pg_url: str) -> None:
    """Every pod's init container runs `skyfed db upgrade`; at once they must not collide."""
    u = f"{pg_url}?schema=t_ha_mig_{secrets.token_hex(5)}"
    try:
        await asyncio.gather(*(migrate.upgrade(u) for _ in range(3)))
        assert await migrate.current(u) == migrate.head_revision()
    finally:
        await migrate.drop_schema(u)


async def test_replicas_starting_together_share_the_configured_admin_token(
        url: str, tmp_path: Path) -> None:
    """The Helm chart gives every replica the same admin token: the second must not crash."""
    from broker.app import build_runtime, ensure_admin_token
    from broker.settings import Settings

    runtimes = [build_runtime(Settings(data_dir=tmp_path / f"r{i}",
                                       store={"url": url},
                                       api={"admin_token": "k" * 40}))
                for i in range(2)]
    try:
        made = await asyncio.gather(*(ensure_admin_token(rt) for rt in runtimes))
    finally:
        for rt in runtimes:
            await rt.store.close()
    assert sorted(made, key=lambda t: t is None) == ["k" * 40, None]


async def test_an_api_only_replica_never_campaigns(url: str, tmp_path: Path) -> None:
    """`skyfed serve --api-only` builds no loops: winning the lock would stop placement."""
    from broker.app import build_runtime, replica_loops
    from broker.federation.leader import LeaderElector
    from broker.settings import Settings

    rt = build_runtime(Settings(data_dir=tmp_path, store={"url": url}))
    try:
        rt.fenced_store = rt.store.fenced(rt.fence)
        api_only = replica_loops(rt, [])
        full = replica_loops(rt, [_Beat()])
    finally:
        await rt.store.close()
    assert [type(lp) for lp in api_only] == [WakeNotifier]
    assert [type(lp) for lp in full] == [LeaderElector, WakeNotifier]


class _DeposingDriver:
    """A cluster whose first apply learns that its broker was deposed (the fence clears)."""

    def __init__(self, inner: SimulatedClusterDriver, fence: Fence) -> None:
        self.inner, self.fence, self.applied = inner, fence, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def apply(self, *, spec: ApplySpec) -> None:
        self.applied += 1
        await self.inner.apply(spec=spec)
        self.fence.epoch = None  # deposed in the middle of the batch


async def test_a_deposed_leader_stops_applying_to_clusters_mid_batch(
        url: str, store: Store) -> None:
    wids = await _submit(store, 3)
    lease, fence = PgLease(url, holder="a"), Fence()
    try:
        await lease.connect()
        fence.epoch = await lease.try_acquire(1.0)
        fenced = store.fenced(fence)
        async with fenced.unit() as uow:
            for wid in wids:
                await uow.placements.record(_placement(wid))
        driver = _DeposingDriver(SimulatedClusterDriver(
            "c", [SimPool(name="p", nodes=2, cpu_per_node=8, memory_gib_per_node=32)]), fence)
        disp = Dispatcher(fenced, {"c": driver}, SystemClock(), concurrency=1)  # type: ignore[dict-item]
        with pytest.raises(FencedError):
            await disp.dispatch_once()
    finally:
        await lease.close()
    assert driver.applied == 1  # the other two placements were never applied
