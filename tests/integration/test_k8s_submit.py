"""`POST /v1/workloads` with Kubernetes manifests (issue 14 part 1), on real PostgreSQL and
SQLite: the documentation's nginx Deployment and `pi` Job unchanged are placed cheapest
feasible; bad manifests are a problem+json naming the field and store nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.clock import ManualClock
from broker.federation.placement_loop import PlacementLoop
from broker.federation.runtime import Runtime
from broker.settings import PlacementSettings, load_settings
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)
from tests.unit.test_k8s_manifests import NGINX, PI, POLICY, SECRET, SERVICE

pytestmark = pytest.mark.integration
YAML = {"Content-Type": "application/yaml"}


def _cluster(name: str, price: float, gpu: int = 0) -> dict[str, Any]:
    return {"name": name, "provider": "onprem", "region": "dc1", "lat": 50.1, "lon": 8.7,
            "pools": [{"name": "p", "instanceType": "x", "node": {"cpu": 8, "memory": 32,
                                                                  "gpu": gpu},
                       "nodes": 2, "maxNodes": 2, "priceUsdPerHour": price}]}


@pytest.fixture
async def api(db_url: str, tmp_path: Path  # noqa: F811
              ) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], Runtime]]:
    rt = build_runtime(load_settings(store={"url": db_url}, data_dir=tmp_path))
    admin = await ensure_admin_token(rt)
    transport = httpx.ASGITransport(app=create_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/v1/tokens", json={"tenant": "alice"},
                         headers={"Authorization": f"Bearer {admin}"})
        auth = {"Authorization": f"Bearer {r.json()['token']}"}
        for name, price in (("cheap", 0.2), ("dear", 0.9)):
            r = await c.post("/v1/clusters", json=_cluster(name, price), headers=auth)
            assert r.status_code == 201, r.text
        yield c, auth, rt
    await rt.store.close()


def _yaml(*docs: Any) -> str:
    return yaml.safe_dump_all(list(docs))


async def test_docs_examples_unchanged_are_placed_cheapest_feasible(
        api: tuple[httpx.AsyncClient, dict[str, str], Runtime]) -> None:
    c, auth, rt = api
    ids = {}
    for doc in (NGINX, PI):
        r = await c.post("/v1/workloads", content=_yaml(doc), headers={**auth, **YAML})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["status"]["defaulted"][0] == "containers[0].resources.requests.cpu=100m"
        assert body["spec"]["latencySloMs"] is None
        ids[doc["kind"]] = body["id"]
    plan = await PlacementLoop(rt.store, ManualClock(1000.0), PlacementSettings(),
                               catalog=None).tick()
    assert plan is not None
    placed = {p.workload_id: p for p in plan.placements}
    assert set(placed) == set(ids.values())
    assert {a.cluster for p in plan.placements for a in p.assignments} == {"cheap"}
    assert sum(a.replicas for a in placed[ids["Deployment"]].assignments) == 3


async def test_workload_with_companions_and_policy_never_echoes_secret_data(
        api: tuple[httpx.AsyncClient, dict[str, str], Runtime]) -> None:
    c, auth, _ = api
    r = await c.post("/v1/workloads", content=_yaml(NGINX, SERVICE, SECRET, POLICY),
                     headers={**auth, **YAML})
    assert r.status_code == 201, r.text
    assert "hunter2" not in r.text
    assert r.json()["spec"]["objects"] == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nginx-deployment"},
        {"apiVersion": "v1", "kind": "Service", "name": "nginx"},
        {"apiVersion": "v1", "kind": "Secret", "name": "creds"}]
    assert r.json()["spec"]["clusterNames"] == ["a", "b"]
    listed = await c.get("/v1/workloads", headers=auth)
    assert "hunter2" not in listed.text


GPU_NGINX = {**NGINX, "spec": {**NGINX["spec"], "template": {
    "metadata": {"labels": {"app": "nginx"}}, "spec": {"containers": [
        {"name": "nginx", "image": "nginx:1.14.2",
         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}


@pytest.mark.parametrize(("docs", "loc"), [
    ([NGINX, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}],
     ["body", 1, "kind"]),
    ([{**PI, "spec": {"template": {"spec": {"containers": [{"name": "pi"}]}}}}],
     ["body", 0, "spec", "template", "spec", "containers", 0, "image"]),
    ([GPU_NGINX], ["body", 0, "spec", "template", "spec", "containers", 0, "resources",
                   "limits", "nvidia.com/gpu"]),
])
async def test_bad_manifests_name_the_field_and_store_nothing(
        api: tuple[httpx.AsyncClient, dict[str, str], Runtime], docs: list[Any],
        loc: list[Any]) -> None:
    c, auth, _ = api
    r = await c.post("/v1/workloads", content=_yaml(*docs), headers={**auth, **YAML})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == loc
    listed = await c.get("/v1/workloads", headers=auth)
    assert listed.json()["items"] == []


async def test_gpu_request_is_accepted_once_a_gpu_pool_exists(
        api: tuple[httpx.AsyncClient, dict[str, str], Runtime]) -> None:
    c, auth, _ = api
    r = await c.post("/v1/clusters", json=_cluster("gpus", 3.0, gpu=4), headers=auth)
    assert r.status_code == 201, r.text
    r = await c.post("/v1/workloads", content=_yaml(GPU_NGINX), headers={**auth, **YAML})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["resources"]["gpu"] == 1
