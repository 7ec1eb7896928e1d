"""Complete object sets on member clusters (issue 14 part 2): placement loop -> dispatcher ->
KubernetesDriver against kmock's emulator, one per member cluster, on a real store."""

from __future__ import annotations

import asyncio
import secrets
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes import client

from broker.api import manifests
from broker.clock import ManualClock
from broker.domain import Cluster, Pool, Resources, WorkloadKind, WorkloadSpec
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.settings import PlacementSettings
from broker.store import Store, migrate
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied
from tests.unit.test_k8s_manifests import NGINX, POLICY, SECRET, SERVICE

pytestmark = pytest.mark.integration
NS = "skyfed"
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
SECRETS = kmock.resource("", "v1", "secrets")


@pytest.fixture(params=["postgresql", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "postgresql":
        url = f"{request.getfixturevalue('pg_url')}?schema=t_k8s_{secrets.token_hex(5)}"
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=ManualClock(1000.0))
    try:
        yield s
    finally:
        await s.close()
        if request.param == "postgresql":
            await migrate.drop_schema(url)


Members = dict[str, tuple[Any, KubernetesDriver]]


@pytest.fixture
async def members() -> AsyncIterator[Callable[[str], Any]]:
    """`start(name)` -> (emulator, driver) of a fresh emulated member cluster."""
    async with AsyncExitStack() as stack:
        apis: list[Any] = []
        emulators: list[Any] = []

        async def start(name: str) -> tuple[Any, KubernetesDriver]:
            k = await stack.enter_async_context(Emulator())
            emulators.append(k)
            srv = await stack.enter_async_context(kmock.Server(k))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                k.resources.load_bundled()
            api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
            apis.append(api)
            return k, KubernetesDriver(name, KubernetesOptions(namespace=NS, timeout_s=5),
                                       api_client=api)

        yield start
        for api in apis:
            await asyncio.to_thread(api.close)
        for k in emulators:  # a real API server would allow every call (deploy/member-rbac.yaml)
            assert denied(calls_of(k), namespace=NS) == []


def _cluster(name: str, pools: tuple[str, ...], *, price: float, cpu: float = 8) -> Cluster:
    return Cluster(name=name, provider="onprem", region="dc1", lat=50.1, lon=8.7, pools=tuple(
        Pool(name=p, instance_type="x", node=Resources(cpu, 16, 0), nodes=1, max_nodes=1,
             price_usd_per_hour=price) for p in pools))


async def _place_and_dispatch(store: Store, clusters: list[Cluster], spec: WorkloadSpec,
                              drivers: dict[str, Any]) -> str:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        for c in clusters:
            await uow.clusters.upsert(c, tenant="acme")
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    clock = ManualClock(1000.0)
    plan = await PlacementLoop(store, clock, PlacementSettings(), catalog=None).tick()
    assert plan is not None
    assert [p.workload_id for p in plan.placements] == [rec.workload.id], plan.unplaced
    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    return rec.workload.id


def _convert(*docs: Any) -> WorkloadSpec:
    return manifests.convert(list(docs), duration_of=lambda r, n: 60.0)


async def test_deployment_service_secret_and_policy_land_on_the_chosen_clusters(
        store: Store, members: Callable[[str], Any]) -> None:
    policy = {**POLICY, "spec": {"resourceSelectors": POLICY["spec"]["resourceSelectors"],
                                 "placement": {
        "clusterAffinity": {"clusterNames": ["a", "b"]},
        "spreadConstraints": [{"spreadByField": "cluster", "minGroups": 2}]}}}
    ka, da = await members("a")
    kb, db = await members("b")
    kc, dc = await members("c")  # cheapest, but not in the policy's clusterNames
    wid = await _place_and_dispatch(
        store, [_cluster("a", ("p",), price=0.3), _cluster("b", ("p",), price=0.4),
                _cluster("c", ("p",), price=0.1)],
        _convert(NGINX, SERVICE, SECRET, policy), {"a": da, "b": db, "c": dc})
    desired = 0
    for k in (ka, kb):
        dep = dict(k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].raw)
        pod = dep["spec"]["template"]["spec"]
        assert pod["containers"][0]["ports"] == [{"containerPort": 80}]  # the user's object
        assert pod["nodeSelector"] == {"skyfed.io/pool": "p"}
        assert dep["spec"]["selector"]["matchLabels"]["app"] == "nginx"
        desired += dep["spec"]["replicas"]
        svc = dict(k.objects[SERVICES, NS, "nginx"].raw)
        assert svc["metadata"]["labels"]["skyfed.io/workload-id"] == wid
        assert dict(k.objects[SECRETS, NS, "creds"].raw)["stringData"] == {
            "password": "hunter2"}
    assert desired == 3
    assert not list(kc.objects)  # nothing on the cluster the policy left out
    await da.delete(workload_id=wid)
    assert (DEPLOYMENTS, NS, f"skyfed-{wid}") not in [
        key for key, obj in ka.objects.items() if not obj.deleted]
    assert all(obj.deleted for key, obj in ka.objects.items() if key[0] == SERVICES)


async def test_split_within_one_cluster_keeps_every_replica(
        store: Store, members: Callable[[str], Any]) -> None:
    """Regression: two pools of one cluster got two applies of one object; the second
    overwrote the first (2 ready of 2 desired for a placement of 2 + 2)."""
    spec = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx",
                        replicas=4, resources=Resources(1.0, 1.0, 0))
    k, drv = await members("split-c")
    wid = await _place_and_dispatch(store, [_cluster("split-c", ("pa", "pb"), price=0.2,
                                                     cpu=4)], spec, {"split-c": drv})
    async with store.unit() as uow:
        placed = await uow.placements.get_active_for_workload(wid)
    assert placed is not None
    assert {a.pool for a in placed.placement.assignments} == {"pa", "pb"}  # the LP split it
    dep = dict(k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].raw)
    assert dep["spec"]["replicas"] == 4
    term = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "skyfed.io/pool", "operator": "In",
                                           "values": ["pa", "pb"]}]}]


async def test_split_within_one_simulated_cluster_runs_every_replica(store: Store) -> None:
    clock = ManualClock(1000.0)
    drv = SimulatedClusterDriver("split-c", [SimPool("pa", 1, 4, 16), SimPool("pb", 1, 4, 16)],
                                 clock=clock.now)
    spec = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx",
                        replicas=4, resources=Resources(1.0, 1.0, 0))
    wid = await _place_and_dispatch(store, [_cluster("split-c", ("pa", "pb"), price=0.2,
                                                     cpu=4)], spec, {"split-c": drv})
    st = await drv.status(workload_id=wid)
    assert (st.ready_replicas, st.desired_replicas) == (4, 4)


async def test_priority_preemption_is_a_decision_carried_out_by_the_actuator(
        store: Store) -> None:
    """A higher-priority workload that cannot be placed evicts lower-priority batch work:
    the epoch records a `preemption` decision, the actuator evicts, events name both."""
    from broker.federation.actuator import Actuator

    clock = ManualClock(1000.0)
    drv = SimulatedClusterDriver("solo", [SimPool("p", 1, 8, 32)], clock=clock.now)
    batch = WorkloadSpec(name="etl", kind=WorkloadKind.BATCH, image="etl", replicas=2,
                         resources=Resources(4.0, 8.0, 0), duration_s=3600.0)
    victim = await _place_and_dispatch(
        store, [_cluster("solo", ("p",), price=0.2, cpu=8)], batch, {"solo": drv})
    urgent = WorkloadSpec(name="checkout", kind=WorkloadKind.SERVICE, image="web",
                          replicas=1, resources=Resources(4.0, 4.0, 0), priority=100)
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=urgent)
    loop = PlacementLoop(store, clock, PlacementSettings(), catalog=None)
    plan = await loop.tick()
    assert plan is not None
    assert rec.workload.id in plan.unplaced  # the only node is full
    await Actuator(store, {"solo": drv}, clock).act_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(victim)).workload.status.value == "pending"
        events = await uow.events.list(tenant="acme", limit=1000)
    assert await drv.list_status() == []  # its replicas are gone from the cluster
    named = {(e.kind, e.subject): e.data for e in events}
    assert named[("workload.preempted", victim)]["by"] == rec.workload.id
    assert named[("workload.preempting", rec.workload.id)]["victim"] == victim
    plan = await loop.tick()
    assert plan is not None
    assert rec.workload.id in {p.workload_id for p in plan.placements}
