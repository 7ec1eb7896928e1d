"""Two concurrent `PUT /v1/workloads/{name}` of one new name make one workload, on real
PostgreSQL (the unique index on live workloads created by name, lifecycle.upsert)."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select

from broker.api import lifecycle
from broker.clock import ManualClock
from broker.domain import Resources, WorkloadKind, WorkloadSpec
from broker.store import Store, WorkloadRecord, migrate
from broker.store.models import WorkloadRow

pytestmark = pytest.mark.integration
WEB = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx", replicas=3,
                   resources=Resources(0.5, 1.0))


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    url = f"{pg_url}?schema=t_byname_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=ManualClock(1000.0))
    try:
        async with s.unit() as uow:
            await uow.tenants.ensure("acme")
        yield s
    finally:
        await s.close()
        await migrate.drop_schema(url)


async def _put(store: Store, spec: WorkloadSpec) -> tuple[WorkloadRecord, bool, str]:
    async with store.unit() as uow:
        return await lifecycle.upsert(uow, tenant="acme", ref=spec.name, spec=spec)


async def _count(store: Store, name: str) -> int:
    async with store.unit() as uow:
        q = select(func.count()).select_from(WorkloadRow).where(WorkloadRow.name == name)
        return int((await uow.session.execute(q)).scalar_one())


async def test_two_concurrent_puts_of_a_new_name_make_one_workload(store: Store) -> None:
    """Regression: neither PUT found a live `web` (the other had not committed), so both
    inserted one. Now the second insert waits on the index for the first transaction, is
    refused when it commits, and the second PUT changes the first's workload."""
    five = dataclasses.replace(WEB, replicas=5)
    async with store.unit() as first:
        rec1, created1, _ = await lifecycle.upsert(first, tenant="acme", ref="web", spec=WEB)
        second = asyncio.create_task(_put(store, five))
        await asyncio.sleep(0.5)
        assert not second.done()  # waiting for the first transaction, not inserting
    rec2, created2, change = await second
    assert (created1, created2, change) == (True, False, "updated")
    assert rec2.workload.id == rec1.workload.id
    assert rec2.workload.spec.replicas == 5
    assert await _count(store, "web") == 1


async def test_a_finished_workload_frees_its_name_and_post_still_repeats_names(
        store: Store) -> None:
    rec, created, _ = await _put(store, WEB)
    assert created
    async with store.unit() as uow:
        await uow.workloads.cancel(rec.workload.id, tenant="acme")
    again, created, _ = await _put(store, WEB)
    assert created
    assert again.workload.id != rec.workload.id
    async with store.unit() as uow:  # POST (submit) is not by name: no index entry
        await uow.workloads.submit(tenant="acme", spec=WEB)
    assert await _count(store, "web") == 3
