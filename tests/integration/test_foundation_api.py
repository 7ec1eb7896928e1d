"""The HTTP API in-process (httpx ASGITransport) on real PostgreSQL and SQLite:
auth, tenant isolation, idempotency, validation that stores nothing, problem+json."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.settings import load_settings
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

WEB: dict[str, Any] = {
    "apiVersion": "skyfed.io/v1", "kind": "Workload",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {"kind": "service", "image": "nginx:1.27", "replicas": 3,
             "resources": {"cpu": "500m", "memory": "1Gi"},
             "userRegion": "eu-west", "latencySloMs": 30},
}


@dataclass
class Api:
    client: httpx.AsyncClient
    admin: dict[str, str]
    alice: dict[str, str]
    bob: dict[str, str]


@pytest.fixture
async def api(db_url: str, tmp_path: Path) -> AsyncIterator[Api]:  # noqa: F811
    settings = load_settings(store={"url": db_url}, data_dir=tmp_path,
                             api={"max_body_bytes": 4096})
    rt = build_runtime(settings)
    admin = await ensure_admin_token(rt)
    assert admin is not None
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    assert await ensure_admin_token(rt) is None  # only on first start
    app = create_app(rt)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        ah = {"Authorization": f"Bearer {admin}"}
        tokens = []
        for tenant in ("alice", "bob"):
            r = await c.post("/v1/tokens", json={"tenant": tenant}, headers=ah)
            assert r.status_code == 201, r.text
            tokens.append({"Authorization": f"Bearer {r.json()['token']}"})
        yield Api(c, ah, tokens[0], tokens[1])
    await rt.store.close()


async def count(api: Api, h: dict[str, str]) -> int:
    r = await api.client.get("/v1/workloads", headers=h)
    return len(r.json()["items"])


async def test_submit_get_list_cancel(api: Api) -> None:
    r = await api.client.post("/v1/workloads", json=WEB, headers=api.alice)
    assert r.status_code == 201, r.text
    w = r.json()
    assert w["status"]["phase"] == "pending"
    assert w["spec"]["resources"]["cpu"] == 0.5
    assert r.headers["location"] == f"/v1/workloads/{w['id']}"
    got = (await api.client.get(f"/v1/workloads/{w['id']}", headers=api.alice)).json()
    assert got["spec"] == w["spec"]
    assert got["metadata"]["name"] == "web"
    r = await api.client.delete(f"/v1/workloads/{w['id']}", headers=api.alice)
    assert r.json()["status"]["phase"] == "cancelled"
    assert (await api.client.delete(f"/v1/workloads/{w['id']}", headers=api.alice)
            ).status_code == 200


async def test_yaml_body_is_accepted(api: Api) -> None:
    r = await api.client.post("/v1/workloads", content=yaml.safe_dump(WEB),
                              headers={**api.alice, "Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["latencySloMs"] == 30


async def test_tenants_are_isolated(api: Api) -> None:
    wid = (await api.client.post("/v1/workloads", json=WEB, headers=api.alice)).json()["id"]
    assert (await api.client.get(f"/v1/workloads/{wid}", headers=api.bob)).status_code == 404
    assert (await api.client.delete(f"/v1/workloads/{wid}", headers=api.bob)).status_code == 404
    assert await count(api, api.bob) == 0
    assert await count(api, api.alice) == 1
    status = (await api.client.get(f"/v1/workloads/{wid}", headers=api.alice)).json()["status"]
    assert status["phase"] == "pending"


async def test_idempotency_key(api: Api) -> None:
    h = {**api.alice, "Idempotency-Key": "abc"}
    r1 = await api.client.post("/v1/workloads", json=WEB, headers=h)
    r2 = await api.client.post("/v1/workloads", json=WEB, headers=h)
    assert (r1.status_code, r2.status_code) == (201, 200)
    assert r1.json()["id"] == r2.json()["id"]
    other = {**WEB, "spec": {**WEB["spec"], "replicas": 4}}
    r3 = await api.client.post("/v1/workloads", json=other, headers=h)
    assert r3.status_code == 409
    assert r3.headers["content-type"] == "application/problem+json"
    assert await count(api, api.alice) == 1
    # the same key from another tenant is another workload
    r4 = await api.client.post("/v1/workloads", json=WEB, headers={**api.bob,
                                                                   "Idempotency-Key": "abc"})
    assert r4.status_code == 201
    assert r4.json()["id"] != r1.json()["id"]


async def test_concurrent_retries_with_one_key_create_one_workload(api: Api) -> None:
    h = {**api.alice, "Idempotency-Key": "race"}
    rs = await asyncio.gather(*(api.client.post("/v1/workloads", json=WEB, headers=h)
                                for _ in range(8)))
    assert sorted(r.status_code for r in rs) == [200] * 7 + [201]
    assert len({r.json()["id"] for r in rs}) == 1
    assert await count(api, api.alice) == 1


@pytest.mark.parametrize(("patch", "loc"), [
    ({"replicas": 0}, ["body", "spec", "replicas"]),
    ({"resources": {"cpu": -1}}, ["body", "spec", "resources", "cpu"]),
    ({"resources": {"memory": "lots"}}, ["body", "spec", "resources", "memory"]),
    ({"kind": "daemon"}, ["body", "spec", "kind"]),
    ({"replica": 2}, ["body", "spec", "replica"]),
    ({"latencySloMs": -5}, ["body", "spec", "latencySloMs"]),
    # `true` is not 1 (pydantic's lax mode took it; schemathesis found it on main)
    ({"durationS": True}, ["body", "spec", "durationS"]),
    ({"replicas": True}, ["body", "spec", "replicas"]),
    ({"resources": {"cpu": True}}, ["body", "spec", "resources", "cpu"]),
])
async def test_bad_input_is_422_naming_the_field_and_stores_nothing(
        api: Api, patch: dict[str, Any], loc: list[str]) -> None:
    body = {**WEB, "spec": {**WEB["spec"], **patch}}
    r = await api.client.post("/v1/workloads", json=body, headers=api.alice)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 422
    assert problem["errors"][0]["loc"] == loc
    assert await count(api, api.alice) == 0


async def test_oversized_and_malformed_bodies(api: Api) -> None:
    big = {**WEB, "spec": {**WEB["spec"], "env": {"X": "y" * 10_000}}}
    r = await api.client.post("/v1/workloads", json=big, headers=api.alice)
    assert r.status_code == 413
    assert r.json()["errors"][0]["loc"] == ["body"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 1000

    r = await api.client.post("/v1/workloads", content=chunks(), headers=api.alice)
    assert r.status_code == 413
    r = await api.client.post("/v1/workloads", content=b"{nope", headers=api.alice)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body"]
    assert await count(api, api.alice) == 0


async def test_auth_errors(api: Api) -> None:
    assert (await api.client.get("/v1/workloads")).status_code == 401
    r = await api.client.get("/v1/workloads", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    r = await api.client.post("/v1/tokens", json={"tenant": "eve"}, headers=api.alice)
    assert r.status_code == 403


async def test_pagination(api: Api) -> None:
    for i in range(5):
        body = {**WEB, "metadata": {"name": f"w{i}"}}
        assert (await api.client.post("/v1/workloads", json=body, headers=api.alice)
                ).status_code == 201
    names, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get("/v1/workloads", params=params, headers=api.alice)).json()
        names += [w["metadata"]["name"] for w in page["items"]]
        cursor = page["nextCursor"]
        if not cursor:
            break
    assert sorted(names) == [f"w{i}" for i in range(5)]
    assert len(names) == 5
    r = await api.client.get("/v1/workloads", params={"limit": 0}, headers=api.alice)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["query", "limit"]


async def test_clusters_sites_placements(api: Api) -> None:
    cluster = {"name": "aws-use1", "provider": "aws", "region": "us-east-1",
               "labels": {"tier": "prod"},
               "pools": [{"name": "cpu", "instanceType": "m5.xlarge",
                          "node": {"cpu": 4, "memory": "16Gi"}, "nodes": 2, "maxNodes": 10,
                          "priceUsdPerHour": 0.192}]}
    r = await api.client.post("/v1/clusters", json=cluster, headers=api.admin)
    assert r.status_code == 201, r.text
    assert (await api.client.post("/v1/clusters", json=cluster, headers=api.admin)
            ).status_code == 200
    items = (await api.client.get("/v1/clusters", headers=api.admin)).json()["items"]
    assert items[0]["pools"][0]["node"]["memory"] == 16.0
    assert (await api.client.get("/v1/clusters", headers=api.bob)).json()["items"] == []
    site = {"name": "edge-muc", "lat": 48.1, "lon": 11.6, "capacity": {"cpu": 16, "memory": 64}}
    assert (await api.client.post("/v1/sites", json=site, headers=api.admin)).status_code == 201
    sites = (await api.client.get("/v1/sites", headers=api.admin)).json()["items"]
    assert sites[0]["health"] == "healthy"
    bad = {**site, "lat": 123}
    r = await api.client.post("/v1/sites", json=bad, headers=api.admin)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "lat"]
    r = await api.client.get("/v1/placements/p-none", headers=api.alice)
    assert r.status_code == 404
    assert r.json()["title"] == "Not found"


async def test_health_ready_metrics_openapi(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200
    await api.client.post("/v1/workloads", json=WEB, headers=api.alice)
    text = (await api.client.get("/metrics")).text
    assert 'skyfed_workloads_submitted_total{kind="service"} 1.0' in text
    assert 'route="/v1/workloads"' in text
    spec = (await api.client.get("/openapi.json")).json()
    assert "/v1/workloads" in spec["paths"]
    assert "WorkloadIn" in spec["components"]["schemas"]


async def test_unmigrated_or_unreachable_database_is_not_ready(tmp_path: Path) -> None:
    from broker.errors import StoreError
    from broker.store import Store

    settings = load_settings(store={"url": f"sqlite:///{tmp_path / 'empty.db'}"},
                             data_dir=tmp_path)
    rt = build_runtime(settings)
    try:
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.get("/readyz")
        assert r.status_code == 503
        assert "skyfed db upgrade" in r.json()["detail"]
    finally:
        await rt.store.close()
    down = Store.from_url("postgresql+asyncpg://postgres@127.0.0.1:1/test")
    try:
        with pytest.raises(StoreError):
            await down.ping()
    finally:
        await down.close()
