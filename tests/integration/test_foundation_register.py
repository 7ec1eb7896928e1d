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


async def test_a_pools_registered_taints_are_kept_and_keep_cpu_work_off_it(
        api: Api) -> None:  # noqa: F811
    """An EKS GPU node group tainted as its docs advise, registered at zero nodes: the
    taint is stored, shown, and keeps a CPU job off the pool before a node exists."""
    from broker.domain import PolicyAction, Resources, Workload, WorkloadKind, WorkloadSpec
    from broker.placement.candidates import build_candidates
    from broker.placement.snapshot import FederationSnapshot

    taint = "nvidia.com/gpu=true:NoSchedule"
    body = {"name": "eks-1", "provider": "aws", "region": "us-east-1",
            "pools": [{"name": "cpu", "instanceType": "m5.xlarge", "maxNodes": 4,
                       "node": {"cpu": 4, "memory": 16}, "priceUsdPerHour": 0.192},
                      {"name": "gpu", "instanceType": "g6.48xlarge", "maxNodes": 2,
                       "node": {"cpu": 192, "memory": 768, "gpu": 8},
                       "priceUsdPerHour": 13.35, "gpuModel": "L4", "taints": [taint]}]}
    r = await api.client.post("/v1/clusters", json=body, headers=api.admin)
    assert r.status_code == 201, r.text
    shown = (await api.client.get("/v1/clusters/eks-1", headers=api.admin)).json()
    assert [p["taints"] for p in shown["pools"]] == [[], [taint]]
    rt = api.client._transport.app.state.runtime  # type: ignore[attr-defined]
    async with rt.store.unit() as uow:
        cluster = (await uow.clusters.get("eks-1")).cluster
    assert [p.taints for p in cluster.pools] == [(), (taint,)]
    job = Workload(id="etl", tenant="t1", spec=WorkloadSpec(
        name="etl", kind=WorkloadKind.BATCH, image="busybox", replicas=1,
        resources=Resources(2, 4, 0), duration_s=3600.0))
    cs = build_candidates(FederationSnapshot(now_s=0.0, clusters=(cluster,), pending=(job,)),
                          PolicyAction(), k=8, service_horizon_h=1.0)
    assert {o.pool.name for j, o in enumerate(cs.options) if cs.feasible[0, j]} == {"cpu"}


async def test_a_pool_taint_with_a_control_character_is_refused_naming_it(
        api: Api) -> None:  # noqa: F811
    body = {"name": "eks-2", "provider": "aws", "region": "us-east-1",
            "pools": [{"name": "gpu", "instanceType": "g6.48xlarge",
                       "node": {"cpu": 192, "memory": 768, "gpu": 8}, "priceUsdPerHour": 13.35,
                       "taints": ["nvidia.com/gpu=true:NoSchedule\n"]}]}
    r = await api.client.post("/v1/clusters", json=body, headers=api.admin)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"][-2:] == ["taints", 0]
    assert (await api.client.get("/v1/clusters", headers=api.admin)).json()["items"] == []
