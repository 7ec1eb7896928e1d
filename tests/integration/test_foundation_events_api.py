"""`GET /v1/events` and `GET /v1/providers` (the dashboard's failover log and sync panel)."""

from __future__ import annotations

import pytest

from tests.integration.test_foundation_api import WEB, Api, api  # noqa: F401  (fixtures)
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


async def test_events_are_scoped_to_the_tenant_plus_system_events(api: Api) -> None:  # noqa: F811
    rt = api.client._transport.app.state.runtime  # type: ignore[attr-defined]
    wid = (await api.client.post("/v1/workloads", json=WEB, headers=api.alice)).json()["id"]
    async with rt.store.unit() as uow:
        await uow.events.append(kind="edge.failover", subject="svc-a", tenant=None,
                                data={"serving_ms": 21.0})
    alice = (await api.client.get("/v1/events", headers=api.alice)).json()["items"]
    bob = (await api.client.get("/v1/events", headers=api.bob)).json()["items"]
    admin = (await api.client.get("/v1/events", headers=api.admin)).json()["items"]
    assert any(e["subject"] == wid for e in alice)
    assert not any(e["subject"] == wid for e in bob)
    assert any(e["kind"] == "edge.failover" for e in bob)
    assert {e["id"] for e in alice} <= {e["id"] for e in admin}
    last = alice[-1]["id"]
    after = (await api.client.get(f"/v1/events?after={last}", headers=api.alice)).json()
    assert after["items"] == []
    only = (await api.client.get("/v1/events?kind=edge.failover", headers=api.alice)).json()
    assert [e["kind"] for e in only["items"]] == ["edge.failover"]
    assert (await api.client.get("/v1/events")).status_code == 401


async def test_providers_lists_account_sync_health(api: Api) -> None:  # noqa: F811
    rt = api.client._transport.app.state.runtime  # type: ignore[attr-defined]
    async with rt.store.unit() as uow:
        await uow.quotas.mark_account_stale("aws-main", provider="aws", error="throttled")
    items = (await api.client.get("/v1/providers", headers=api.alice)).json()["items"]
    assert items == [{"name": "aws-main", "provider": "aws", "stale": True,
                      "failures": items[0]["failures"], "lastOkS": None,
                      "lastError": "throttled"}]
