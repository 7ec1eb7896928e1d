"""Cluster registration fills pool shapes and prices from the catalog; bad types are 422."""

from __future__ import annotations

import pytest

from tests.integration.test_foundation_api import Api, api  # noqa: F401  (fixtures)
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


async def test_pool_shape_and_price_come_from_the_catalog(api: Api) -> None:  # noqa: F811
    body = {"name": "gcp-euw4", "provider": "gcp", "region": "europe-west4",
            "pools": [{"name": "a100", "instanceType": "a2-highgpu-8g", "maxNodes": 1},
                      {"name": "spot", "instanceType": "n2-standard-8", "pricing": "spot"},
                      {"name": "own", "instanceType": "n2-standard-8",
                       "node": {"cpu": 4, "memory": 8}, "priceUsdPerHour": 0.1}]}
    r = await api.client.post("/v1/clusters", json=body, headers=api.admin)
    assert r.status_code == 201, r.text
    rt = api.client._transport.app.state.runtime  # type: ignore[attr-defined]
    async with rt.store.unit() as uow:
        pools = {p.name: p for p in (await uow.clusters.get("gcp-euw4")).cluster.pools}
    a100 = pools["a100"]
    assert (a100.node.cpu, a100.node.gpu, a100.gpu_model) == (96, 8, "A100")
    assert a100.interconnect == "nvlink-full"
    assert a100.price_usd_per_hour == pytest.approx(19.4217, rel=1e-3)
    assert pools["spot"].price_usd_per_hour < pools["own"].price_usd_per_hour * 5
    assert pools["spot"].price_usd_per_hour == pytest.approx(0.15622, rel=1e-3)
    assert (pools["own"].node.cpu, pools["own"].price_usd_per_hour) == (4, 0.1)


async def test_unknown_instance_type_is_refused_naming_the_pool(api: Api) -> None:  # noqa: F811
    body = {"name": "aws-x", "provider": "aws", "region": "us-east-1",
            "pools": [{"name": "bad", "instanceType": "m99.huge"}]}
    r = await api.client.post("/v1/clusters", json=body, headers=api.admin)
    assert r.status_code == 422
    problem = r.json()
    assert "m99.huge" in problem["detail"]
    assert problem["errors"][0]["loc"][-1] == "instanceType"
    assert (await api.client.get("/v1/clusters", headers=api.admin)).json()["items"] == []
