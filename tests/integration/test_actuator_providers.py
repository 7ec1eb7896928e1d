"""The actuator against the most faithful fakes of the outside: moto's EC2 server (libcloud)
for a declared cloud node group, kmock's Kubernetes API for a pre-pull DaemonSet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import kmock
import pytest
from kubernetes import client

from broker.clock import ManualClock
from broker.domain import (
    Cluster,
    DataSource,
    FederationSnapshot,
    Pool,
    PricingModel,
    Resources,
)
from broker.federation.actuator import Actuator
from broker.federation.decision_log import record_decisions
from broker.placement.kinds import PoolScaleIn
from broker.placement.planner import EpochPlan, PoolScale, Prewarm, SolveStats
from broker.settings import ActuatorSettings
from broker.store import Store
from providers.aws import AwsOptions, AwsProvider
from providers.base import ClusterDriver, Quota
from providers.cloud import client_token
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from providers.kubernetes_objects import ID_LABEL, MANAGED_LABEL
from providers.kubernetes_prewarm import copy_name, prepull_name
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

NS = "skyfed"
STATS = SolveStats("heuristic", 0.0, None, None, 0.0, 0.0)


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


def _eks(name: str) -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.large", node=Resources(2, 8, 0), nodes=1,
                max_nodes=5, price_usd_per_hour=0.096)
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,))


async def _record(store: Store, plan: EpochPlan, clusters: tuple[Cluster, ...],  # noqa: F811
                  now: float) -> None:
    async with store.unit() as uow:
        await record_decisions(uow, plan, FederationSnapshot(now_s=now, clusters=clusters,
                                                             pending=()),
                               owners={c.name: "admin" for c in clusters}, tenants={})


async def _events(store: Store, prefix: str) -> list[tuple[str, dict[str, Any]]]:  # noqa: F811
    async with store.unit() as uow:
        return [(e.kind, dict(e.data)) for e in await uow.events.list(limit=1000)
                if e.kind.startswith(prefix)]


async def test_scale_up_through_a_declared_ec2_node_group_on_moto(
        store: Store, moto_port: int) -> None:  # noqa: F811
    base = {"endpoint_host": "127.0.0.1", "endpoint_port": moto_port, "secure": False,
            "timeout_s": 10}
    probe = AwsProvider(AwsOptions("AKIDACT", "secret-act", **base))  # type: ignore[arg-type]
    image = probe._driver("us-east-1").list_images()[0].id
    aws = AwsProvider(AwsOptions("AKIDACT", "secret-act", image_id=image,
                                 **base))  # type: ignore[arg-type]
    clock = ManualClock(1000.0)
    cluster = _eks("eks-use1")
    # A group of its own per store (the moto server is the module's): each run orders it.
    group = f"eks-use1-cpu-{uuid.uuid4().hex[:8]}"
    async with store.unit() as uow:
        await uow.tenants.ensure("admin")
        await uow.clusters.upsert(cluster, tenant="admin", attrs={
            "scaling": {"account": "aws-act", "groups": {"cpu": group}}})
    # The cluster's own driver (its API) cannot add machines; the node group can.
    drivers: dict[str, ClusterDriver] = {"eks-use1": SimulatedClusterDriver(
        "eks-use1", [SimPool(name="cpu", nodes=1, cpu_per_node=2, memory_gib_per_node=8)],
        clock=clock.now)}
    await _record(store, EpochPlan((), {}, (PoolScale("eks-use1", "cpu", 2),), STATS),
                  (cluster,), clock.now())
    act = Actuator(store, drivers, clock, accounts={"aws-act": aws},
                   settings=ActuatorSettings(order_timeout_s=600))
    await act.act_once()
    [(kind, data)] = await _events(store, "scale.")
    assert (kind, data["via"], data["target_nodes"], data["count"]) == \
        ("scale.ordered", "aws-act", 3, 3)
    # EC2 really runs three instances of the node group, tagged with the pool and cluster.
    quotas: list[Quota] = await aws.get_quotas(region="us-east-1")
    assert {q.metric: q.used for q in quotas}["instances"] >= 3
    drv = aws._driver("us-east-1")
    tagged = await asyncio.to_thread(drv.list_nodes, ex_filters={
        "tag:skyfed.io/pool": group, "instance-state-name": ["pending", "running"]})
    assert len(tagged) == 3
    assert all(n.extra["tags"]["skyfed.io/cluster"] == "eks-use1" for n in tagged)
    # Each launch carried the order's idempotency token for its machine (EC2's ClientToken),
    # so a retry of this order after a launch EC2 accepted but whose answer was lost asks
    # for the same machine again instead of a second one.
    async with store.unit() as uow:
        [order] = await uow.decisions.list_open(kinds=("scale",))
    assert len(str(order.spec["order"])) == 32
    ec2 = boto3.client("ec2", region_name="us-east-1",
                       endpoint_url=f"http://127.0.0.1:{moto_port}",
                       aws_access_key_id="AKIDACT", aws_secret_access_key="secret-act")
    tokens = {i["ClientToken"]: i for r in ec2.describe_instances(Filters=[
        {"Name": "tag:skyfed.io/pool", "Values": [group]}])["Reservations"]
        for i in r["Instances"]}
    assert set(tokens) == {client_token(str(order.spec["order"]), n.name) for n in tagged}
    assert len(tokens) == 3
    # The instances never join this (simulated) cluster: the order stays open, then fails.
    await act.act_once()
    async with store.unit() as uow:
        [open_order] = await uow.decisions.list_open(kinds=("scale",))
    assert open_order.step == "ordered"
    clock.advance(601)
    await act.act_once()
    kinds = [k for k, _ in await _events(store, "scale.")]
    assert kinds == ["scale.ordered", "scale.failed"]


async def test_an_order_for_a_spot_pool_buys_spot_machines(
        store: Store, moto_port: int) -> None:  # noqa: F811
    """The planner prices a spot pool at its spot price; the order through the declared node
    group must buy it so. Before, every order launched on-demand machines."""
    base = {"endpoint_host": "127.0.0.1", "endpoint_port": moto_port, "secure": False,
            "timeout_s": 10}
    probe = AwsProvider(AwsOptions("AKIDSPOT", "secret-spot", **base))  # type: ignore[arg-type]
    image = probe._driver("us-east-1").list_images()[0].id
    aws = AwsProvider(AwsOptions("AKIDSPOT", "secret-spot", image_id=image,
                                 **base))  # type: ignore[arg-type]
    pool = Pool(name="cpu-spot", instance_type="m5.large", node=Resources(2, 8, 0), nodes=0,
                max_nodes=5, price_usd_per_hour=0.035, pricing=PricingModel.SPOT)
    cluster = Cluster(name="eks-spot", provider="aws", region="us-east-1", pools=(pool,))
    async with store.unit() as uow:
        await uow.tenants.ensure("admin")
        await uow.clusters.upsert(cluster, tenant="admin", attrs={
            "scaling": {"account": "aws-act", "groups": {"cpu-spot": "eks-spot-cpu"}}})
    clock = ManualClock(1000.0)
    await _record(store, EpochPlan((), {}, (PoolScale("eks-spot", "cpu-spot", 2),), STATS),
                  (cluster,), clock.now())
    await Actuator(store, {}, clock, accounts={"aws-act": aws}).act_once()
    listed = await asyncio.to_thread(aws._driver("us-east-1").list_nodes, ex_filters={
        "tag:skyfed.io/pool": "eks-spot-cpu", "instance-state-name": ["pending", "running"]})
    assert [n.extra.get("instance_lifecycle") for n in listed] == ["spot", "spot"]


@dataclass
class _Eks:
    """An EKS-like cluster: an EC2 node group of three machines on moto, and kmock's
    Kubernetes API listing a node for each (named after its private DNS, its instance in
    spec.providerID), all registered with a declared node-group hook."""

    aws: AwsProvider
    cluster: Cluster
    kube: KubernetesDriver
    k: Any
    node_of: dict[str, str]  # machine (Name tag) -> its Kubernetes node
    group: str

    async def machines(self) -> list[str]:
        ec2 = self.aws._driver("us-east-1")
        listed = await asyncio.to_thread(ec2.list_nodes, ex_filters={
            "tag:skyfed.io/pool": self.group, "instance-state-name": ["pending", "running"]})
        return sorted(n.name for n in listed)

    def run_on(self, node: str, wid: str) -> None:
        self.k.objects[kmock.resource("", "v1", "pods"), NS, f"{wid}-0"] = {
            "metadata": {"name": f"{wid}-0", "namespace": NS,
                         "labels": {MANAGED_LABEL: "skyfed", ID_LABEL: wid}},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}}


@asynccontextmanager
async def _eks_group(store: Store, moto_port: int, name: str) -> AsyncIterator[_Eks]:  # noqa: F811
    base = {"endpoint_host": "127.0.0.1", "endpoint_port": moto_port, "secure": False,
            "timeout_s": 10}
    probe = AwsProvider(AwsOptions("AKIDNAMED", "secret-named", **base))  # type: ignore[arg-type]
    image = probe._driver("us-east-1").list_images()[0].id
    aws = AwsProvider(AwsOptions("AKIDNAMED", "secret-named", image_id=image,
                                 **base))  # type: ignore[arg-type]
    group = f"{name}-cpu"
    assert await aws.scale_pool(region="us-east-1", pool=group, instance_type="m5.large",
                                nodes=3, labels={"skyfed.io/cluster": name}) == 3
    listed = await asyncio.to_thread(aws._driver("us-east-1").list_nodes, ex_filters={
        "tag:skyfed.io/pool": group, "instance-state-name": ["pending", "running"]})
    assert sorted(n.name for n in listed) == [f"skyfed-{group}-{i}" for i in range(3)]
    pool = Pool(name="cpu", instance_type="m5.large", node=Resources(2, 8, 0), nodes=3,
                max_nodes=5, price_usd_per_hour=0.096)
    cluster = Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,))
    async with store.unit() as uow:
        await uow.tenants.ensure("admin")
        await uow.clusters.upsert(cluster, tenant="admin", attrs={
            "scaling": {"account": "aws-act", "groups": {"cpu": group}}})
    nodes_res = kmock.resource("", "v1", "nodes")
    async with Emulator() as k, kmock.Server(k) as srv:
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        node_of = {}
        for i, inst in enumerate(sorted(listed, key=lambda n: n.name)):
            node = f"ip-10-0-0-{10 + i}.ec2.internal"
            node_of[inst.name] = node
            k.objects[nodes_res, None, node] = {
                "metadata": {"name": node, "labels": {"skyfed.io/pool": "cpu"}},
                "spec": {"providerID": f"aws:///us-east-1a/{inst.id}"},
                "status": {"allocatable": {"cpu": "2", "memory": "8Gi"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}
        api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
        try:
            yield _Eks(aws, cluster, KubernetesDriver(name, KubernetesOptions(
                namespace=NS, timeout_s=5), api_client=api), k, node_of, group)
        finally:
            await asyncio.to_thread(api.close)
    assert denied(calls_of(k), namespace=NS) == []  # deploy/member-rbac.yaml grants each call


async def test_a_scale_in_through_an_ec2_node_group_terminates_the_named_node(
        store: Store, moto_port: int) -> None:  # noqa: F811
    """The planner names the idle node to go; before, the adapter only set the group's count
    and terminated the last instance by name: here the one that runs a service's replica."""
    async with _eks_group(store, moto_port, "eks-named") as eks:
        g = eks.group
        idle, busy = eks.node_of[f"skyfed-{g}-0"], eks.node_of[f"skyfed-{g}-2"]
        eks.run_on(busy, "w-shop")
        clock = ManualClock(1000.0)
        await _record(store, EpochPlan((), {}, (), STATS, scale_in=(
            PoolScaleIn("eks-named", "cpu", (idle,)),)), (eks.cluster,), clock.now())
        act = Actuator(store, {"eks-named": eks.kube}, clock, accounts={"aws-act": eks.aws})
        await act.act_once()
        [(kind, data)] = await _events(store, "scale_in.")
        assert (kind, data["removed"], data["nodes"]) == ("scale_in.done", [idle], 2)
        # The idle node's machine went; the one running the service's replica stayed.
        assert await eks.machines() == [f"skyfed-{g}-1", f"skyfed-{g}-2"]
        # A node that took work after the plan named it stays: a cloud would terminate its
        # machine whatever runs there.
        await _record(store, EpochPlan((), {}, (), STATS, scale_in=(
            PoolScaleIn("eks-named", "cpu", (busy,)),)), (eks.cluster,), clock.now())
        await act.act_once()
        kind, data = (await _events(store, "scale_in."))[-1]
        assert kind == "scale_in.refused"
        assert f"{busy} of eks-named/cpu run work the plan did not see" in str(data["error"])
        assert await eks.machines() == [f"skyfed-{g}-1", f"skyfed-{g}-2"]


async def test_a_retried_consolidation_keeps_a_node_its_drained_work_came_back_to(
        store: Store, moto_port: int) -> None:  # noqa: F811
    """A consolidation drained w-job off a node, then its removal failed; by the retry the
    next epoch had placed w-job back on that node. The drain is not repeated (c010e66), and
    the machine must not be terminated under the job either."""
    async with _eks_group(store, moto_port, "eks-retry") as eks:
        g = eks.group
        node = eks.node_of[f"skyfed-{g}-0"]
        clock = ManualClock(1000.0)
        await _record(store, EpochPlan((), {}, (), STATS, scale_in=(
            PoolScaleIn("eks-retry", "cpu", (node,), reason="consolidate"),)),
            (eks.cluster,), clock.now())
        async with store.unit() as uow:
            [rec] = await uow.decisions.list_open(kinds=("scale_in",))
            await uow.decisions.set_state(rec.id, "running", step="drained",
                                          spec={"drained": ["w-job"]})
        eks.run_on(node, "w-job")  # placed back by the next epoch
        act = Actuator(store, {"eks-retry": eks.kube}, clock, accounts={"aws-act": eks.aws})
        await act.act_once()
        [(kind, data)] = await _events(store, "scale_in.")
        assert kind == "scale_in.refused"
        assert node in str(data["error"])
        assert await eks.machines() == [f"skyfed-{g}-{i}" for i in range(3)]


async def test_an_order_from_a_stale_count_terminates_no_machine(
        store: Store, moto_port: int) -> None:  # noqa: F811
    """The snapshot counted one node of the group (two had not joined yet when it was read),
    so the plan's order asks for two; the group already has three, the last by name running a
    service's replica. An order grows a group; before, it set the count and terminated it."""
    async with _eks_group(store, moto_port, "eks-stale") as eks:
        g = eks.group
        eks.run_on(eks.node_of[f"skyfed-{g}-2"], "w-shop")
        clock = ManualClock(1000.0)
        stale = dataclasses.replace(eks.cluster, pools=(
            dataclasses.replace(eks.cluster.pools[0], nodes=1),))
        await _record(store, EpochPlan((), {}, (PoolScale("eks-stale", "cpu", 1),), STATS),
                      (stale,), clock.now())
        act = Actuator(store, {"eks-stale": eks.kube}, clock, accounts={"aws-act": eks.aws})
        await act.act_once()
        [(kind, data)] = await _events(store, "scale.")
        assert (kind, data["target_nodes"], data["count"]) == ("scale.ordered", 2, 3)
        assert await eks.machines() == [f"skyfed-{g}-{i}" for i in range(3)]
        await act.act_once()  # the inventory shows the three: the order is done
        assert [k for k, _ in await _events(store, "scale.")] == ["scale.ordered", "scale.done"]


@pytest.fixture
async def k8s() -> AsyncIterator[tuple[Any, KubernetesDriver]]:
    async with Emulator() as k, kmock.Server(k) as srv:
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
        try:
            yield k, KubernetesDriver("gke-euw4", KubernetesOptions(namespace=NS, timeout_s=5),
                                      api_client=api)
        finally:
            await asyncio.to_thread(api.close)
    assert denied(calls_of(k), namespace=NS) == []  # deploy/member-rbac.yaml grants each call


async def test_prewarm_on_kubernetes_applies_a_prepull_daemonset_and_a_copy_job(
        store: Store, k8s: tuple[Any, KubernetesDriver]) -> None:  # noqa: F811
    k, drv = k8s
    clock = ManualClock(1000.0)
    gpu = Pool(name="a100", instance_type="a2-highgpu-8g", node=Resources(96, 680, 8),
               nodes=1, max_nodes=2, price_usd_per_hour=29.4, gpu_model="A100")
    cluster = Cluster(name="gke-euw4", provider="gcp", region="europe-west4", pools=(gpu,))
    async with store.unit() as uow:
        await uow.tenants.ensure("admin")
        await uow.clusters.upsert(cluster, tenant="admin")
    data = DataSource(size_gb=500, location="gcp:europe-west4",
                      url="https://storage.example/llm/shard-00.tar", sha256="cd" * 32)
    pw = Prewarm("gke-euw4", "a100", images=("nvcr.io/nvidia/pytorch:24.05-py3",),
                 data=(data,), workload_id="w-llm", reason="placement")
    plan = EpochPlan((), {}, (), STATS, prewarm=(pw,))
    await _record(store, plan, (cluster,), clock.now())
    await _record(store, plan, (cluster,), clock.now())  # the planner repeats it: one row
    act = Actuator(store, {"gke-euw4": drv}, clock)
    await act.act_once()
    ds_res = kmock.resource("apps", "v1", "daemonsets")
    job_res = kmock.resource("batch", "v1", "jobs")
    async with store.unit() as uow:
        [rec] = await uow.decisions.list(kind="prewarm")
    ds = dict(k.objects[ds_res, NS, prepull_name(rec.key)].raw)
    pod = ds["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["initContainers"]] == ["nvcr.io/nvidia/pytorch:24.05-py3"]
    assert pod["nodeSelector"] == {"skyfed.io/pool": "a100"}
    assert ds["metadata"]["labels"]["skyfed.io/workload"] == "w-llm"
    job = dict(k.objects[job_res, NS, copy_name(rec.key, 0)].raw)
    assert job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == data.url
    await act.act_once()  # the pods have not pulled yet
    assert [kind for kind, _ in await _events(store, "prewarm.")] == ["prewarm.started"]
    k.objects[ds_res, NS, prepull_name(rec.key)].patch({"status": {
        "currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
        "numberReady": 1}})
    k.objects[job_res, NS, copy_name(rec.key, 0)].patch({"status": {"succeeded": 1}})
    clock.advance(1)
    await act.act_once()
    assert [kind for kind, _ in await _events(store, "prewarm.")] == \
        ["prewarm.started", "prewarm.done"]
