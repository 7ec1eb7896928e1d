"""`Store` (engine + session factory) and `UnitOfWork` (one AsyncSession).

    async with store.unit() as uow:
        rec, created = await uow.workloads.submit(tenant="t", spec=spec)
        await uow.events.append("x.y", rec.workload.id)
    # committed here; an exception inside rolls everything back

Only the unit of work commits: repositories never call `commit()`. Every
SQLAlchemy/driver error raised inside the block or by the commit leaves as a
`StoreError`/`ConflictError` (see `engine.mapped_errors`). `uow.now` is read
from the injected clock once, when the unit starts, so every row written by
one unit carries the same timestamp.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from broker.clock import Clock, SystemClock
from broker.domain import WorkloadSpec
from broker.store import fastpath
from broker.store.auth import TenantRepo, TokenRepo
from broker.store.decisions import DecisionRepo
from broker.store.engine import create_engine, mapped_errors, parse_store_url
from broker.store.events import EventRepo
from broker.store.inventory import DemandRepo, InventoryRepo
from broker.store.leadership import Fence, check_fence
from broker.store.members import ClusterRepo, OfferRepo, SiteRepo
from broker.store.migrate import check_schema
from broker.store.placements import PlacementRepo
from broker.store.records import WorkloadRecord
from broker.store.sync import QuotaRepo
from broker.store.workloads import WorkloadRepo


class UnitOfWork:
    """The repositories of one transaction. Build it only through `Store.unit()`."""

    def __init__(self, session: AsyncSession, now: float, *,
                 leader_epoch: int | None = None) -> None:
        self.session = session
        self.now = now
        self.leader_epoch = leader_epoch  # stored on placements and decisions written here
        self.events = EventRepo(session, now)
        self.tenants = TenantRepo(session, now)
        self.tokens = TokenRepo(session, now)
        self.workloads = WorkloadRepo(session, now, self.events)
        self.placements = PlacementRepo(session, now, self.events, leader_epoch=leader_epoch)
        self.clusters = ClusterRepo(session, now, self.events)
        self.sites = SiteRepo(session, now, self.events)
        self.offers = OfferRepo(session, now)
        self.quotas = QuotaRepo(session, now, self.events)
        self.inventory = InventoryRepo(session, now)
        self.demand = DemandRepo(session, now)
        self.decisions = DecisionRepo(session, now, leader_epoch=leader_epoch)


class Store:
    """The database: owns the engine; hands out units of work.

    With a `fence` (only through `fenced()`), every unit is a leader's unit: it starts only
    while the fence holds an epoch, stamps that epoch on what it writes, and commits only
    if the database still holds it (store/leadership.py); otherwise `FencedError`.
    """

    def __init__(self, engine: AsyncEngine, *, clock: Clock | None = None,
                 fast_path: fastpath.PgFastPath | None = None,
                 fence: Fence | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        self.fast_path = fast_path
        self.fence = fence
        self._sessions = async_sessionmaker(engine, expire_on_commit=False, autoflush=True)

    def check_leader(self) -> None:
        """Raise `FencedError` if this store is fenced and its replica no longer leads.

        A local check, for side effects outside the database (a driver's apply or delete)
        that a unit of work's commit-time check cannot cover.
        """
        if self.fence is not None:
            self.fence.current()

    def fenced(self, fence: Fence) -> Store:
        """The same database for the singleton loops: units fenced by `fence`.

        Shares this store's engine and pools; only the original store is closed.
        """
        return Store(self.engine, clock=self.clock, fast_path=self.fast_path, fence=fence)

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 10, echo: bool = False,
                 clock: Clock | None = None) -> Store:
        su = parse_store_url(url)
        fast = None if su.is_sqlite else fastpath.PgFastPath(su.url, su.schema, pool_size)
        return cls(create_engine(url, pool_size=pool_size, echo=echo), clock=clock,
                   fast_path=fast)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @asynccontextmanager
    async def unit(self) -> AsyncIterator[UnitOfWork]:
        """One transaction: commits when the block ends, rolls back on any error."""
        with mapped_errors("store"):
            async with self._sessions() as session:
                try:
                    epoch = None if self.fence is None else self.fence.current()
                    yield UnitOfWork(session, self.clock.now(), leader_epoch=epoch)
                    if epoch is not None:
                        await check_fence(session, epoch)
                    await session.commit()
                except BaseException:
                    await session.rollback()
                    raise

    async def submit_workload(self, *, tenant: str, spec: WorkloadSpec,
                              spec_json: Mapping[str, Any], idempotency_key: str | None = None,
                              request_sha256: str = "") -> tuple[WorkloadRecord, bool]:
        """The API's hot path: `WorkloadRepo.submit` as one statement on PostgreSQL."""
        return await fastpath.submit_workload(
            self, tenant=tenant, spec=spec, spec_json=spec_json,
            idempotency_key=idempotency_key, request_sha256=request_sha256)

    async def ping(self) -> None:
        """Raise `StoreError` unless the database answers."""
        with mapped_errors("ping"):
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))

    async def check_schema(self) -> None:
        """Raise `SchemaOutdatedError` unless migrated to head (see `migrate.check_schema`)."""
        await check_schema(self.engine)

    async def close(self) -> None:
        if self.fast_path is not None:
            await self.fast_path.close()
        await self.engine.dispose()
