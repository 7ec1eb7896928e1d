"""Placement decides on what the sensors report, through the real loops and fakes at the
cloud API edge: a quota used up in moto (AWS EC2 over HTTP), a price raised by the Azure
Retail Prices API (libcloud's recorded ARM fixtures plus the documented price API shape),
and a pool kmock's Kubernetes API reports full. Each test first shows where the work goes
without the new reading, then that the next epoch goes elsewhere because of it."""

from __future__ import annotations

import asyncio
import secrets
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import kmock
import pytest
from kubernetes import client

from broker.clock import SystemClock
from broker.domain import (
    Cluster,
    Pool,
    PricingModel,
    Resources,
    WorkloadKind,
    WorkloadSpec,
)
from broker.federation.inventory import InventoryPoller
from broker.federation.placement_loop import PlacementLoop, decide_and_plan, fixed_action
from broker.federation.quota_sync import Account, QuotaSync, RetryPolicy
from broker.federation.snapshot import SnapshotReader
from broker.placement.planner import EpochPlan
from broker.settings import PlacementSettings, SnapshotSettings
from broker.store import Store, migrate
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.contract.fixture_server import FixtureState, serve
from tests.contract.rbac import calls_of, denied
from tests.contract.test_providers_contract import (
    AZ_TENANT,
    AZURE_USAGES,
    azure_retail_item,
    azure_retail_prices,
)

pytestmark = pytest.mark.integration
REGION = "us-west-2"
FAST = RetryPolicy(attempts=2, initial_s=0.001, max_s=0.005, jitter_s=0.001)
SETTINGS = PlacementSettings(time_limit_s=2.0)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    url = f"{pg_url}?schema=t_sense_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=SystemClock())
    try:
        yield s
    finally:
        await s.close()
        await migrate.drop_schema(url)


def cluster(name: str, provider: str, region: str, pool: Pool, *, lat: float = 39.0,
            lon: float = -77.0) -> Cluster:
    return Cluster(name=name, provider=provider, region=region, pools=(pool,), lat=lat, lon=lon)


def pool(name: str, itype: str, node: Resources, price: float, *, nodes: int = 0,
         max_nodes: int = 10) -> Pool:
    return Pool(name=name, instance_type=itype, node=node, nodes=nodes, max_nodes=max_nodes,
                price_usd_per_hour=price, pricing=PricingModel.ON_DEMAND)


def batch(name: str, *, replicas: int, cpu: float, mem: float = 1.0) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.BATCH, image="job:1", replicas=replicas,
                        resources=Resources(cpu, mem, 0), duration_s=3600.0)


async def submit(store: Store, spec: WorkloadSpec) -> str:
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


def clusters_of(plan: EpochPlan, wid: str) -> set[str]:
    return {a.cluster for p in plan.placements if p.workload_id == wid for a in p.assignments}


def loop(store: Store) -> PlacementLoop:
    reader = SnapshotReader(SnapshotSettings(), SETTINGS)
    return PlacementLoop(store, SystemClock(), SETTINGS, reader=reader)


async def plan_now(store: Store) -> EpochPlan:
    """What the planner would decide on the store's state now (nothing written)."""
    snap = await SnapshotReader(SnapshotSettings(), SETTINGS).pending_snapshot(
        store, batch_max=100)
    assert snap is not None
    return await asyncio.to_thread(decide_and_plan, snap, fixed_action(SETTINGS),
                                   loop(store)._config)


# ---- moto: a quota used up elsewhere in the account ----------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    try:
        yield port
    finally:
        srv.stop()


async def test_quota_synced_from_moto_changes_the_next_epoch(store: Store,
                                                              moto_port: int) -> None:
    from providers.aws import AwsOptions, AwsProvider

    opts = AwsOptions("AKIDSENSE", "sense-secret", endpoint_host="127.0.0.1",
                      endpoint_port=moto_port, secure=False, timeout_s=10, vcpu_limit=64)
    # moto's state is per process and region: another suite's instances live in us-east-1
    image = (await asyncio.to_thread(AwsProvider(opts)._driver(REGION).list_images))[0].id
    aws = AwsProvider(AwsOptions(**{**{f: getattr(opts, f) for f in opts.__slots__},
                                    "image_id": image}))
    sync = QuotaSync(store, [Account("aws-main", aws, (REGION,))], SystemClock(), retry=FAST)
    m5 = Resources(8, 32, 0)
    async with store.unit() as uow:
        await uow.clusters.upsert(cluster("aws-usw2", "aws", REGION,
                                          pool("m5", "m5.2xlarge", m5, 0.384)),
                                  tenant="admin", account="aws-main")
        await uow.clusters.upsert(cluster("gcp-usc1", "gcp", "us-central1",
                                          pool("n2", "n2-standard-8", m5, 0.5)),
                                  tenant="admin")
        await uow.tenants.ensure("acme")
    assert all(r.ok for r in await sync.sync_once())
    first = await submit(store, batch("first", replicas=4, cpu=4))  # 16 vCPU: 2 new nodes
    plan = await loop(store).tick()
    assert plan is not None
    assert clusters_of(plan, first) == {"aws-usw2"}

    second = await submit(store, batch("second", replicas=4, cpu=4))
    before = await plan_now(store)
    assert clusters_of(before, second) == {"aws-usw2"}  # 64 vCPU leave room for new nodes
    assert [s.cluster for s in before.scale] == ["aws-usw2"]
    # Someone else starts 6 x m5.2xlarge (48 vCPU) in the account: the quota left shrinks.
    assert await aws.scale_pool(region=REGION, pool="other-team",
                                instance_type="m5.2xlarge", nodes=6, labels={}) == 6
    assert all(r.ok for r in await sync.sync_once())
    reader = SnapshotReader(SnapshotSettings(), SETTINGS)
    snap = await reader.pending_snapshot(store, batch_max=100)
    assert snap is not None
    aws_c = next(c for c in snap.clusters if c.name == "aws-usw2")
    assert aws_c.quota_vcpu == pytest.approx(64 - 48)
    assert aws_c.provenance["quota"].source == "sync"
    plan = await loop(store).tick()
    assert plan is not None
    # No new aws node fits the quota left: what the nodes already ordered cannot hold moves on.
    assert not [s for s in plan.scale if s.cluster == "aws-usw2"]
    assert "gcp-usc1" in clusters_of(plan, second)


# ---- Azure Retail Prices API: a price rise flips the placement -----------------------------
@pytest.fixture
def azure() -> Iterator[tuple[FixtureState, Any]]:
    from providers.azure import AzureOptions, AzureProvider

    state = FixtureState("azure_arm")
    with serve(state) as port:
        state.extra[f"/{AZ_TENANT}/oauth2/token"] = {
            "access_token": "t", "token_type": "Bearer", "expires_on": "4102444800"}
        state.extra["/subscriptions/99999999/providers/Microsoft.Compute/locations/"
                    "eastus/usages"] = AZURE_USAGES
        url = f"http://127.0.0.1:{port}/"
        yield state, AzureProvider(AzureOptions(
            tenant_id=AZ_TENANT, subscription_id="99999999", client_id="cid",
            client_secret="sense-secret",
            cloud_environment={"resourceManagerEndpointUrl": url,
                               "activeDirectoryEndpointUrl": url,
                               "activeDirectoryResourceId": url,
                               "storageEndpointSuffix": "local"},
            endpoint_port=port, secure=False, login_port=port, timeout_s=10,
            retail_prices_url=f"{url}api/retail/prices"))


async def test_price_change_from_sync_flips_the_next_placement(
        store: Store, azure: tuple[FixtureState, Any]) -> None:
    state, provider = azure
    prices = "/api/retail/prices"
    state.extra[prices] = azure_retail_prices([azure_retail_item("Standard_A2", 0.06)])
    sync = QuotaSync(store, [Account("az-main", provider, ("eastus",))], SystemClock(),
                     retry=FAST)
    async with store.unit() as uow:
        await uow.clusters.upsert(cluster("az-eastus", "azure", "eastus", pool(
            "a2", "Standard_A2", Resources(2, 3.5, 0), 0.30)), tenant="admin",
            account="az-main")
        await uow.clusters.upsert(cluster("aws-use1", "aws", "us-east-1", pool(
            "m5", "m5.large", Resources(2, 8, 0), 0.096)), tenant="admin")
        await uow.tenants.ensure("acme")
    first = await submit(store, batch("first", replicas=1, cpu=1))
    assert clusters_of(await plan_now(store), first) == {"aws-use1"}  # registered 0.30/h
    assert all(r.ok for r in await sync.sync_once())
    plan = await loop(store).tick()
    assert plan is not None
    assert clusters_of(plan, first) == {"az-eastus"}  # synced 0.06/h

    state.extra[prices] = azure_retail_prices([azure_retail_item("Standard_A2", 0.20)])
    (res,) = await sync.sync_once()
    assert res.price_changes == 1
    second = await submit(store, batch("second", replicas=1, cpu=1))
    plan = await loop(store).tick()
    assert plan is not None
    assert clusters_of(plan, second) == {"aws-use1"}
    async with store.unit() as uow:
        changed = await uow.events.list(kind="price.changed")
    assert changed[-1].data["changes"][0]["new"] == 0.20


# ---- kmock: the observed inventory shows the pool full ------------------------------------
class _Emulator(kmock.KubernetesEmulator):
    async def __call__(self, raw_request: Any) -> Any:
        if raw_request.query.get("watch") == "True":
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.update_query(watch="true"))
        return await super().__call__(raw_request)


async def test_kmock_inventory_of_a_full_pool_keeps_work_off_it(store: Store) -> None:
    nodes, pods = kmock.resource("", "v1", "nodes"), kmock.resource("", "v1", "pods")
    async with _Emulator() as k, kmock.Server(k) as srv:
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        for i in (1, 2):
            k.objects[nodes, None, f"k-{i}"] = {
                "metadata": {"name": f"k-{i}", "labels": {"skyfed.io/pool": "cpu"}},
                "status": {"allocatable": {"cpu": "8", "memory": "32Gi"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}
            k.objects[pods, "other", f"busy-{i}"] = {
                "metadata": {"name": f"busy-{i}", "namespace": "other"},
                "spec": {"nodeName": f"k-{i}", "containers": [{
                    "name": "c", "image": "x",
                    "resources": {"requests": {"cpu": "7500m", "memory": "8Gi"}}}]},
                "status": {"phase": "Running"}}
        api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
        try:
            kube = KubernetesDriver("k8s-a", KubernetesOptions(namespace="skyfed",
                                                               timeout_s=5), api_client=api)
            sim = SimulatedClusterDriver("sim-b", [SimPool("cpu", 2, 8, 32)])
            async with store.unit() as uow:
                await uow.clusters.upsert(cluster("k8s-a", "onprem", "dc1", pool(
                    "cpu", "m5.2xlarge", Resources(8, 32, 0), 0.10, nodes=2, max_nodes=2)),
                    tenant="admin")
                await uow.clusters.upsert(cluster("sim-b", "aws", "us-east-1", pool(
                    "cpu", "m5.2xlarge", Resources(8, 32, 0), 0.40, nodes=2, max_nodes=2)),
                    tenant="admin")
                await uow.tenants.ensure("acme")
            wid = await submit(store, batch("job", replicas=1, cpu=2))
            assert clusters_of(await plan_now(store), wid) == {"k8s-a"}  # as registered
            poller = InventoryPoller(store, {"k8s-a": kube, "sim-b": sim}, SystemClock())
            results = await poller.poll_once()
            assert not any(r.error for r in results.values())
            plan = await loop(store).tick()
            assert plan is not None
            assert clusters_of(plan, wid) == {"sim-b"}
            async with store.unit() as uow:
                rec = await uow.inventory.get("k8s-a")
                (kpool,) = (await uow.clusters.get("k8s-a")).cluster.pools
            assert rec is not None
            assert sum(n.allocated.cpu for n in rec.nodes) == pytest.approx(15.0)
            assert kpool.used.cpu == pytest.approx(15.0)  # set_pool_usage from the poll
        finally:
            await asyncio.to_thread(api.close)
    assert denied(calls_of(k)) == []  # deploy/member-rbac.yaml grants each call


# ---- what-if on the observed state -------------------------------------------------------
async def test_whatif_asks_about_the_workload_as_if_it_were_not_there(store: Store) -> None:
    """Its own replicas are in the observed inventory; the free re-solve must not be kept
    off its own nodes by them (or 'now' would name another cluster than where it runs)."""
    from broker.federation.dispatcher import Dispatcher
    from broker.federation.placement_loop import whatif_for_placement

    clock = SystemClock()
    cheap = SimulatedClusterDriver("cheap", [SimPool("cpu", 1, 8, 32)], clock=clock.now)
    dear = SimulatedClusterDriver("dear", [SimPool("cpu", 1, 8, 32)], clock=clock.now)
    async with store.unit() as uow:
        for name, price in (("cheap", 0.2), ("dear", 0.6)):
            await uow.clusters.upsert(cluster(name, "aws", "us-east-1", pool(
                "cpu", "m5.2xlarge", Resources(8, 32, 0), price, nodes=1, max_nodes=1)),
                tenant="admin")
        await uow.tenants.ensure("acme")
    wid = await submit(store, batch("job", replicas=1, cpu=7))
    plan = await loop(store).tick()
    assert plan is not None
    assert clusters_of(plan, wid) == {"cheap"}
    await Dispatcher(store, {"cheap": cheap, "dear": dear}, clock).dispatch_once()
    await InventoryPoller(store, {"cheap": cheap, "dear": dear}, clock).poll_once()
    async with store.unit() as uow:
        rec = await uow.inventory.get("cheap")
        pid = (await uow.workloads.get(wid)).placement_id
    assert rec is not None
    assert sum(n.allocated.cpu for n in rec.nodes) == 7.0  # it runs there, observed
    assert pid is not None
    out = await whatif_for_placement(store, SETTINGS, pid, "dear", tenant=None,
                                     reader=SnapshotReader(SnapshotSettings(), SETTINGS))
    assert out["before"]["clusters"] == ["cheap"]  # type: ignore[index]
    assert out["after"]["clusters"] == ["dear"]  # type: ignore[index]
