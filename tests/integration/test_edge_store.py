"""The hub's persistence through the store API (PostgreSQL, own schema per test)."""

from __future__ import annotations

import uuid

import pytest

from broker.domain import Resources, Site, SiteHealth
from broker.federation.edge_hub import StoreRecorder
from broker.store import Store
from broker.store.migrate import drop_schema, upgrade

pytestmark = pytest.mark.integration


async def test_store_recorder_persists_health_and_events(pg_url: str) -> None:
    url = f"{pg_url}?schema=edge_{uuid.uuid4().hex[:10]}"
    await upgrade(url)
    store = Store.from_url(url, pool_size=2)
    try:
        async with store.unit() as uow:
            await uow.tenants.ensure("ops")
            await uow.sites.upsert(Site("osaka-1", 34.69, 135.5, capacity=Resources(8, 32)),
                                   tenant="ops")
        rec = StoreRecorder(store)
        await rec("edge_site_health", {"site": "osaka-1", "health": "down", "cause": "will"})
        await rec("edge_site_health", {"site": "unregistered", "health": "down"})  # no row: ok
        await rec("edge_failover", {"service": "web", "from_site": "osaka-1", "to_site": "kobe",
                                    "detect_ms": 2.0, "serving_ms": 5.5})
        async with store.unit() as uow:
            site = await uow.sites.get("osaka-1")
            events = await uow.events.list(kind="edge.failover")
        assert site.site.health is SiteHealth.DOWN
        assert [(e.subject, e.data["serving_ms"]) for e in events] == [("web", 5.5)]
    finally:
        await store.close()
        await drop_schema(url)
