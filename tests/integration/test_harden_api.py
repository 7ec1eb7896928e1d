"""Hostile input over the HTTP API on real PostgreSQL and SQLite (issue 13, findings 1, 3, 5).

Each refused request must be a 422 naming the field and store nothing; what older
versions stored with absurd numbers must still list (200, repaired, and said so).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from tests.integration.test_foundation_api import WEB, Api, api  # noqa: F401  (fixtures)
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

CLUSTER = ('{"name": "cheap", "provider": "onprem", "region": "lab", "quotaVcpu": %s, '
           '"pools": [{"name": "p", "instanceType": "x", "node": {"cpu": 8, "memory": 32}, '
           '"nodes": 1, "maxNodes": 2, "priceUsdPerHour": %s}]}')


def _store(client: Api) -> Any:
    return client.client._transport.app.state.runtime.store  # type: ignore[attr-defined]


def _locs(r: Any) -> list[list[Any]]:
    return [e["loc"] for e in r.json().get("errors", [])]


async def _count(client: Api, path: str) -> int:
    r = await client.client.get(path, headers=client.admin)
    assert r.status_code == 200, r.text
    return len(r.json()["items"])


@pytest.mark.parametrize(("quota", "price", "field"), [
    ("1000", "Infinity", "priceUsdPerHour"), ("Infinity", "0.001", "quotaVcpu"),
    ("1000", "NaN", "priceUsdPerHour"), ("1e400", "0.001", "quotaVcpu"),
    ("1000", "1e300", "priceUsdPerHour")])
async def test_finding1_infinite_or_huge_cluster_numbers_are_422_and_nothing_is_stored(
        api: Api, quota: str, price: str, field: str) -> None:  # noqa: F811
    r = await api.client.post("/v1/clusters", content=CLUSTER % (quota, price),
                              headers={**api.alice, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert any(loc[-1] == field for loc in _locs(r)), r.json()
    assert await _count(api, "/v1/clusters") == 0


@pytest.mark.parametrize(("patch", "field"), [
    ({"durationS": 1e300}, "durationS"), ({"budgetUsdPerHour": 1e300}, "budgetUsdPerHour"),
    ({"replicas": 10**30}, "replicas"), ({"imageGb": 1e308}, "imageGb")])
async def test_finding3_huge_workload_numbers_are_422_and_nothing_is_stored(
        api: Api, patch: dict[str, Any], field: str) -> None:  # noqa: F811
    body = {**WEB, "spec": {**WEB["spec"], "kind": "batch", **patch}}
    r = await api.client.post("/v1/workloads", json=body, headers=api.alice)
    assert r.status_code == 422, r.text
    assert ["body", "spec", field] in _locs(r), r.json()
    assert await _count(api, "/v1/workloads") == 0


async def test_finding3_an_infinite_budget_is_422_never_no_cap(api: Api) -> None:  # noqa: F811
    for inf in (".inf", "-.inf", ".nan"):
        doc = ("apiVersion: skyfed.io/v1\nkind: Workload\nmetadata: {name: capped}\n"
               f"spec: {{kind: batch, image: busybox, budgetUsdPerHour: {inf}}}\n")
        r = await api.client.post("/v1/workloads", content=doc,
                                  headers={**api.alice, "Content-Type": "application/yaml"})
        assert r.status_code == 422, r.text
        assert ["body", "spec", "budgetUsdPerHour"] in _locs(r)
    assert await _count(api, "/v1/workloads") == 0


@pytest.mark.parametrize("where", ["name-label", "env", "image", "idempotency", "events-kind",
                                   "cluster-region"])
async def test_finding5_nul_and_control_characters_are_422_never_503(
        api: Api, where: str) -> None:  # noqa: F811
    bad = "a\u0000b"
    spec = {**WEB["spec"]}
    body: dict[str, Any] = {**WEB, "spec": spec}
    headers = dict(api.alice)
    if where == "name-label":
        body["metadata"] = {"name": "web", "labels": {"app": bad}}
    elif where == "env":
        spec["env"] = {"K": bad}
    elif where == "image":
        spec["image"] = "nginx\u001b[31m"
    elif where == "idempotency":
        headers["Idempotency-Key"] = "key\tone"
    if where == "events-kind":
        r = await api.client.get("/v1/events", params={"kind": bad}, headers=api.alice)
    elif where == "cluster-region":
        r = await api.client.post("/v1/clusters", json={
            "name": "c1", "provider": "onprem", "region": bad}, headers=api.alice)
    else:
        r = await api.client.post("/v1/workloads", json=body, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"][0] in ("body", "query", "header")
    assert await _count(api, "/v1/workloads") == 0


async def test_finding3_rows_an_older_version_stored_still_list(api: Api) -> None:  # noqa: F811
    """A 301-digit jsonb integer (what `durationS: 1e300` became on main) and an event with
    `ts_ms: 1e308`: every list answers 200, clipped, and says which fields it repaired."""
    r = await api.client.post("/v1/workloads", json={**WEB, "spec": {**WEB["spec"],
                                                                    "kind": "batch"}},
                              headers=api.alice)
    wid = r.json()["id"]
    store = _store(api)
    huge = "1" + "0" * 300
    async with store.unit() as uow:
        s = uow.session
        if store.dialect == "postgresql":
            await s.execute(text(f"UPDATE workloads SET spec = jsonb_set(spec, '{{duration_s}}',"
                                 f" '{huge}'::jsonb) WHERE id = :id"), {"id": wid})
            await s.execute(text("INSERT INTO events (ts, tenant, kind, subject, data) VALUES "
                                 "(1, NULL, 'edge.event', 'x', "
                                 f"'{{\"ts_ms\": 1{'0' * 308}}}'::jsonb)"))
        else:
            await s.execute(text("UPDATE workloads SET spec = json_set(spec, '$.duration_s', "
                                 f"json('{huge}')) WHERE id = :id"), {"id": wid})
            await s.execute(text("INSERT INTO events (ts, tenant, kind, subject, data) VALUES "
                                 f"(1, NULL, 'edge.event', 'x', '{{\"ts_ms\": 1{'0' * 308}}}')"))
    for who in (api.alice, api.admin):
        page = await api.client.get("/v1/workloads", headers=who)
        assert page.status_code == 200, page.text
        (item,) = [w for w in page.json()["items"] if w["id"] == wid]
        assert item["spec"]["durationS"] == 10 * 365 * 86_400  # broker.limits.DURATION_S_MAX
        assert "durationS" in item["sanitized"]
        one = await api.client.get(f"/v1/workloads/{wid}", headers=who)
        assert one.status_code == 200
        assert one.json()["sanitized"] == item["sanitized"]
    for who in (api.alice, api.bob, api.admin):
        events = await api.client.get("/v1/events", headers=who)
        assert events.status_code == 200, events.text
        (edge,) = [e for e in events.json()["items"] if e["kind"] == "edge.event"]
        assert edge["data"]["ts_ms"] == 1e308
        assert edge["sanitized"] == ["ts_ms"]
