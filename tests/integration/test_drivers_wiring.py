"""The registry wired into the broker as `broker/app.py` wires it: the start-up step fills
`Runtime.drivers`, the dispatcher (which holds that dict) applies a placement on a
registered kubernetes cluster, and the Deployment lands in kmock."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest

from broker.app import build_runtime
from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    Pool,
    PricingModel,
    Resources,
    WorkloadKind,
    WorkloadSpec,
)
from broker.federation.dispatcher import make_dispatcher
from broker.federation.drivers import (
    DriverRegistry,
    install_drivers,
    make_driver_refresh,
    registry_of,
)
from broker.federation.runtime import Runtime
from broker.settings import load_settings
from broker.store import migrate
from providers.kubernetes import KubernetesDriver
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied

pytestmark = pytest.mark.integration

NS = "skyfed"
DEP_RES = kmock.resource("apps", "v1", "deployments")


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(url)
    runtime = build_runtime(load_settings(store={"url": url}, data_dir=tmp_path))
    try:
        yield runtime
    finally:
        if isinstance(runtime.driver_registry, DriverRegistry):
            await runtime.driver_registry.aclose()
        await runtime.store.close()


@pytest.fixture
async def kube_server() -> AsyncIterator[tuple[Any, str]]:
    async with Emulator() as k, kmock.Server(k) as srv:  # with server-side apply
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        yield k, str(srv.url)
    assert denied(calls_of(k), namespace=NS) == []  # deploy/member-rbac.yaml grants each call


def _cluster(name: str) -> Cluster:
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(
        Pool(name="cpu", instance_type="c5.xlarge", node=Resources(4, 8, 0), nodes=1,
             max_nodes=4, price_usd_per_hour=0.17),))


async def test_startup_step_fills_runtime_drivers_and_dispatch_lands_in_kmock(
        rt: Runtime, kube_server: tuple[Any, str], tmp_path: Path) -> None:
    k, server = kube_server
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: km\n  cluster:\n    server: {server}\n"
        "users:\n- name: u\n  user:\n    token: not-a-secret\n"
        "contexts:\n- name: km\n  context:\n    cluster: km\n    user: u\n"
        "current-context: km\n")
    spec = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx:1.27", replicas=3,
                        resources=Resources(0.5, 1.0, 0))
    async with rt.store.unit() as uow:
        await uow.tenants.ensure("admin")
        await uow.clusters.upsert(_cluster("sim-1"), tenant="admin")
        await uow.clusters.upsert(_cluster("k8s-1"), tenant="admin",
                                  attrs={"kubeconfig": str(kubeconfig)})
        rec, _ = await uow.workloads.submit(tenant="admin", spec=spec)
        wid = rec.workload.id
        await uow.placements.record(Placement(workload_id=wid, cost_usd_per_hour=0.1, assignments=(
            Assignment(cluster="k8s-1", pool="cpu", pricing=PricingModel.ON_DEMAND, replicas=3,
                       price_usd_per_hour=0.1),)))
        await uow.clusters.upsert(Cluster(name="edge-1", provider="edge", region="edge-1"),
                                  tenant="admin")
    dispatcher = make_dispatcher(rt)  # built before the start-up step: it holds rt.drivers
    await install_drivers(rt)
    assert sorted(rt.drivers) == ["edge-1", "k8s-1", "sim-1"]
    assert isinstance(rt.drivers["k8s-1"], KubernetesDriver)
    assert registry_of(rt) is rt.driver_registry

    assert await dispatcher.dispatch_once() == 1
    deployments = [key for key in k.objects if key[0] == DEP_RES]
    assert [key[1] for key in deployments] == [NS]
    body = dict(k.objects[deployments[0]].raw)
    assert body["metadata"]["labels"]["skyfed.io/workload-id"] == wid
    assert body["spec"]["replicas"] == 3
    assert body["metadata"]["labels"]["skyfed.io/cluster"] == "k8s-1"

    hub = _Hub()
    rt.edge_hub = hub  # build_loops sets the real hub, later
    await rt.drivers["edge-1"].delete(workload_id="w-9")
    assert hub.sent == [("edge-1", "stop")]

    loop = make_driver_refresh(rt)
    assert loop.registry is registry_of(rt)
    stop = asyncio.Event()
    stop.set()  # an already-stopped loop closes the registry it owns
    await loop.run(stop)
    assert dict(rt.drivers) == {}


class _Hub:
    """Stands in for broker.federation.edge_hub.EdgeHub's EdgeTransport side (no MQTT)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def send_command(self, *, site: str, kind: str, **_: Any) -> dict[str, Any]:
        self.sent.append((site, kind))
        return {"ok": True}

    def site_services(self, *, site: str) -> dict[str, str] | None:
        return {}


def _tour_documents() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The README tour's clusters (as `skyfed submit` posts them) and its three workloads."""
    import yaml

    root = Path(__file__).resolve().parents[2] / "examples"
    clusters = [{"name": d["metadata"]["name"], **d["spec"]}
                for d in yaml.safe_load_all((root / "federation.yaml").read_text())]
    workloads = [yaml.safe_load((root / f).read_text())
                 for f in ("web-service.yaml", "batch-job.yaml", "train-8gpu.yaml")]
    return clusters, workloads


@pytest.mark.parametrize("refreshed_after", [0, 1])
async def test_clusters_registered_while_the_broker_runs_are_planned_with_their_drivers(
        tmp_path: Path, refreshed_after: int) -> None:
    """The README tour's race: clusters registered, then workloads submitted, and the
    placement epoch comes before the driver refresh loop's next pass. The loop must plan on
    drivers built from those registrations: without them every pool looked unable to scale
    (no driver, scaling.py), so the 8-GPU job was marked unplaceable for good (`no a100
    node could be added`) and the batch job got 7-9 of its 20 replicas; with only some
    drivers built, the job went to the dearer cluster whose driver happened to exist.
    `refreshed_after`: how many clusters were registered when the refresh loop last ran."""
    from broker.app import create_app, ensure_admin_token, start_up
    from broker.federation.placement_loop import make_placement_loop

    url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(url)
    rt = build_runtime(load_settings(store={"url": url}, data_dir=tmp_path,
                                     policy={"checkpoint": "none"}))
    try:
        token = await ensure_admin_token(rt)
        await start_up(rt)  # nothing registered yet: no drivers
        loop = make_placement_loop(rt)  # the refresh loop is not run: its pass is later
        clusters, workloads = _tour_documents()
        h = {"Authorization": f"Bearer {token}"}
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for i, body in enumerate(clusters):
                if i == refreshed_after > 0:
                    await registry_of(rt).refresh(rt.store)  # the refresh loop's pass
                r = await c.post("/v1/clusters", json=body, headers=h)
                assert r.status_code == 201, r.text
            ids = {}
            for doc in workloads:
                r = await c.post("/v1/workloads", json=doc, headers=h)
                assert r.status_code == 201, r.text
                ids[doc["metadata"]["name"]] = r.json()["id"]
            plan = await loop.tick()
            assert plan is not None
            assert plan.unplaced == {}
            got = {p.workload_id: p for p in plan.placements}
            train = got[ids["llm-finetune"]]
            assert [(a.cluster, a.pool) for a in train.assignments] == [("gcp-euw4", "a100")]
            assert got[ids["nightly-etl"]].placed_replicas == 20
            for wid in ids.values():
                r = await c.get(f"/v1/workloads/{wid}", headers=h)
                assert r.json()["status"]["phase"] == "placed", r.text
        assert sorted(rt.drivers) == ["aws-use1", "azure-weu", "gcp-euw4"]
    finally:
        if isinstance(rt.driver_registry, DriverRegistry):
            await rt.driver_registry.aclose()
        await rt.store.close()
