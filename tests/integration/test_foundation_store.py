"""The store on both real backends: every repository, tenant scoping, atomicity,
and migrations upgrade -> downgrade -> upgrade. Each test gets its own
PostgreSQL schema or SQLite file (`db_url`, imported by the other foundation tests)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from broker.clock import ManualClock
from broker.domain import (
    Assignment,
    Cluster,
    Offer,
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
from broker.errors import (
    ConflictError,
    IdempotencyError,
    NotFoundError,
    SchemaOutdatedError,
)
from broker.store import Store, migrate
from broker.store.mapping import spec_from_json, spec_sha256, spec_to_json
from providers.base import Quota

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, migrated database: a unique PostgreSQL schema or a SQLite file."""
    if request.param == "postgresql":
        base = request.getfixturevalue("pg_url")
        url = f"{base}?schema=t_found_{secrets.token_hex(5)}"
        await migrate.upgrade(url)
        try:
            yield url
        finally:
            await migrate.drop_schema(url)
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
        await migrate.upgrade(url)
        yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = Store.from_url(db_url, pool_size=2, clock=ManualClock(1000.0))
    try:
        yield s
    finally:
        await s.close()


def spec(name: str = "web", priority: int = 0, replicas: int = 2) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.SERVICE, image="nginx:1.27",
                        replicas=replicas, resources=Resources(1.0, 2.0, 0),
                        user_region="eu-west", latency_slo_ms=40.0, priority=priority,
                        labels={"app": name})


def cluster(name: str = "aws-use1") -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=2,
                max_nodes=10, price_usd_per_hour=0.192)
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,),
                   labels={"tier": "prod"}, taints=("gpu=true:NoSchedule",), quota_vcpu=64)


async def test_spec_roundtrips_through_the_store(store: Store) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        rec, created = await uow.workloads.submit(tenant="acme", spec=spec())
    assert created
    async with store.unit() as uow:
        got = await uow.workloads.get(rec.workload.id, tenant="acme")
    assert got.workload.spec == spec()
    assert got.workload.status is WorkloadStatus.PENDING
    assert got.workload.submitted_s == 1000.0


async def test_idempotency_key_is_per_tenant_and_checks_the_body(store: Store) -> None:
    s = spec()
    h = spec_sha256(spec_to_json(s))
    async with store.unit() as uow:
        await uow.tenants.ensure("a")
        await uow.tenants.ensure("b")
        first, c1 = await uow.workloads.submit(tenant="a", spec=s, idempotency_key="k",
                                               request_sha256=h)
    async with store.unit() as uow:
        again, c2 = await uow.workloads.submit(tenant="a", spec=s, idempotency_key="k",
                                               request_sha256=h)
        other, c3 = await uow.workloads.submit(tenant="b", spec=s, idempotency_key="k",
                                               request_sha256=h)
    assert (c1, c2, c3) == (True, False, True)
    assert again.workload.id == first.workload.id != other.workload.id
    with pytest.raises(IdempotencyError):
        async with store.unit() as uow:
            await uow.workloads.submit(tenant="a", spec=spec(replicas=3), idempotency_key="k",
                                       request_sha256="different")


async def test_tenant_never_sees_another_tenants_rows(store: Store) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("a")
        await uow.tenants.ensure("b")
        rec, _ = await uow.workloads.submit(tenant="a", spec=spec())
        await uow.clusters.upsert(cluster(), tenant="a")
    async with store.unit() as uow:
        with pytest.raises(NotFoundError):
            await uow.workloads.get(rec.workload.id, tenant="b")
        with pytest.raises(NotFoundError):
            await uow.workloads.cancel(rec.workload.id, tenant="b")
        assert (await uow.workloads.list(tenant="b")).items == ()
        assert await uow.clusters.list(tenant="b") == []
        assert len((await uow.workloads.list(tenant=None)).items) == 1
        with pytest.raises(ConflictError):
            await uow.clusters.upsert(cluster(), tenant="b")


async def test_failed_unit_rolls_back_everything(store: Store) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("a")

    async def submit_then_fail() -> None:
        async with store.unit() as uow:
            await uow.workloads.submit(tenant="a", spec=spec())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await submit_then_fail()
    async with store.unit() as uow:
        assert (await uow.workloads.list(tenant="a")).items == ()
        assert await uow.events.list(kind="workload.submitted") == []


async def test_pagination_and_pending_order(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, ManualClock)
    async with store.unit() as uow:
        await uow.tenants.ensure("a")
    ids = []
    for i in range(5):
        clock.advance(1)
        async with store.unit() as uow:
            rec, _ = await uow.workloads.submit(tenant="a", spec=spec(f"w{i}", priority=i % 2))
            ids.append(rec.workload.id)
    seen: list[str] = []
    cursor = None
    while True:
        async with store.unit() as uow:
            page = await uow.workloads.list(tenant="a", limit=2, cursor=cursor)
        seen += [r.workload.id for r in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids
    async with store.unit() as uow:
        pending = await uow.workloads.list_pending(limit=10)
    assert [w.id for w in pending] == [ids[1], ids[3], ids[0], ids[2], ids[4]]


async def test_placement_lifecycle(store: Store) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("a")
        await uow.clusters.upsert(cluster("c1"), tenant="a")
        rec, _ = await uow.workloads.submit(tenant="a", spec=spec())
    wid = rec.workload.id
    pl = Placement(workload_id=wid, cost_usd_per_hour=0.4, rtt_ms=12.0,
                   assignments=(Assignment("c1", "cpu", PricingModel.ON_DEMAND, 2, 0.4),),
                   decision={"why": "cheapest"})
    async with store.unit() as uow:
        pid = await uow.placements.record(pl)
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.PLACED
        assert [p.id for p in await uow.placements.list_undispatched()] == [pid]
        await uow.placements.mark_dispatched(pid)
        await uow.placements.mark_dispatched(pid)
    async with store.unit() as uow:
        assert await uow.placements.list_undispatched() == []
        got = await uow.placements.get(pid)
        assert got.placement == pl
        assert got.dispatched
        assert got.dispatch_attempts == 1
        assert [p.id for p in await uow.placements.list_active_on_cluster("c1")] == [pid]
        assert await uow.placements.list_active_on_cluster("c") == []
        await uow.placements.put_decision(pid, {"why": "explained"})
        await uow.workloads.requeue(wid, reason="cluster c1 failed")
    async with store.unit() as uow:
        assert (await uow.placements.get_decision(pid)) == {"why": "explained"}
        w = await uow.workloads.get(wid)
        assert w.workload.status is WorkloadStatus.PENDING
        assert w.placement_id is None
        assert await uow.placements.list_active_on_cluster("c1") == []
        kinds = [e.kind for e in await uow.events.list(subject=wid)]
    assert kinds == ["workload.submitted", "workload.placed", "placement.dispatched",
                     "workload.requeued"]


async def test_members_offers_quotas(store: Store) -> None:
    site = Site(name="edge-1", lat=48.1, lon=11.6, capacity=Resources(16, 64, 1))
    async with store.unit() as uow:
        await uow.tenants.ensure("ops")
        await uow.clusters.upsert(cluster("c1"), tenant="ops", account="aws-main")
        assert await uow.sites.upsert(site, tenant="ops")
        await uow.offers.upsert_many([Offer("aws", "us-east-1", "m5.xlarge", 4, 16,
                                            price_usd_per_hour=0.192)])
        await uow.quotas.insert_snapshot(account="aws-main", provider="aws",
                                         quotas=[Quota("aws", "us-east-1", "vcpu", 64, 8)])
    store.clock.advance(10)  # type: ignore[attr-defined]
    async with store.unit() as uow:
        await uow.offers.upsert_many([Offer("aws", "us-east-1", "m5.xlarge", 4, 16,
                                            price_usd_per_hour=0.2)])
        await uow.quotas.insert_snapshot(account="aws-main", provider="aws", quotas=[],
                                         ok=False, error="throttled")
        assert await uow.quotas.mark_account_stale("aws-main", provider="aws",
                                                   error="throttled") == 1
        await uow.sites.set_health("edge-1", SiteHealth.DOWN, last_seen_s=1005.0)
        await uow.clusters.set_pool_usage("c1", "cpu", used_cpu=3.0)
    async with store.unit() as uow:
        (c,) = await uow.clusters.list()
        assert c.quota_stale
        assert c.pools[0].used.cpu == 3.0
        assert c.taints == cluster().taints
        (s,) = await uow.sites.list()
        assert s.health is SiteHealth.DOWN
        assert s.capacity == site.capacity
        (o,) = await uow.offers.list(provider="aws")
        assert o.price_usd_per_hour == 0.2
        lkg = await uow.quotas.last_known_good("aws-main")
        assert lkg is not None
        assert lkg.taken_s == 1000.0
        assert lkg.quotas[0].limit == 64
        await uow.quotas.mark_account_fresh("aws-main", provider="aws")
    async with store.unit() as uow:
        (c,) = await uow.clusters.list()
        acct = await uow.quotas.get_account("aws-main")
    assert not c.quota_stale
    assert acct is not None
    assert not acct.stale


async def test_tokens_are_hashed_and_revocable(store: Store) -> None:
    async with store.unit() as uow:
        tid, token = await uow.tokens.create(tenant="acme")
        assert not await uow.tokens.has_admin()
    async with store.unit() as uow:
        p = await uow.tokens.resolve(token)
        assert p is not None
        assert p.tenant == "acme"
        assert not p.is_admin
        raw = await uow.session.execute(text("SELECT token_sha256 FROM api_tokens"))
        assert token not in str(raw.all())
        await uow.tokens.revoke(tid)
    async with store.unit() as uow:
        assert await uow.tokens.resolve(token) is None


async def test_migrations_down_and_up_and_schema_check(db_url: str) -> None:
    s = Store.from_url(db_url, pool_size=1)
    try:
        await s.check_schema()
        await migrate.downgrade(db_url)
        assert await migrate.current(db_url) is None
        with pytest.raises(SchemaOutdatedError, match="skyfed db upgrade"):
            await s.check_schema()
        await migrate.upgrade(db_url)
        assert await migrate.current(db_url) == migrate.head_revision()
        await s.check_schema()
    finally:
        await s.close()


def test_spec_json_roundtrip() -> None:
    assert spec_from_json(spec_to_json(spec())) == spec()


async def test_placement_of_a_cancelled_workload_is_not_written(store: Store) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("a")
        rec, _ = await uow.workloads.submit(tenant="a", spec=spec())
    wid = rec.workload.id
    async with store.unit() as uow:
        await uow.workloads.cancel(wid, tenant="a")
    pl = Placement(workload_id=wid, cost_usd_per_hour=0.1, assignments=(
        Assignment("c1", "cpu", PricingModel.SPOT, 2, 0.1),))
    async with store.unit() as uow:
        assert await uow.placements.record(pl) is None
    async with store.unit() as uow:
        w = await uow.workloads.get(wid)
        assert w.workload.status is WorkloadStatus.CANCELLED
        assert w.placement_id is None
        assert await uow.placements.get_active_for_workload(wid) is None
