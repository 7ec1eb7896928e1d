"""DriverRegistry over a real store (SQLite file and a PostgreSQL schema of its own) and a
Kubernetes API emulator (kmock) reached through a real kubeconfig file.

kmock gaps (FACTS.md) that matter here: none for create/read of Deployments; its bundled
resources must be loaded or listing an empty kind answers 404.
"""

from __future__ import annotations

import asyncio
import secrets
import warnings
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kmock
import pytest

from broker.clock import ManualClock, SystemClock
from broker.domain import Cluster, Pool, Resources
from broker.federation.driver_targets import DriverTarget
from broker.federation.drivers import DriverRefreshLoop, DriverRegistry
from broker.store import ClusterRecord, Store, migrate
from providers.base import ApplySpec, ClusterDriver, WorkloadPhase
from providers.kubernetes import KubernetesDriver
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied

pytestmark = pytest.mark.integration

NS = "team-a"
DEP_RES = kmock.resource("apps", "v1", "deployments")


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated store: a SQLite file, or a PostgreSQL schema only this test uses."""
    if request.param == "postgresql":
        url = f"{request.getfixturevalue('pg_url')}?schema=t_drivers_{secrets.token_hex(5)}"
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


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[Any, Path]]:
    """kmock on a free loopback port and a kubeconfig file (context 'km') pointing at it."""
    async with Emulator() as k, kmock.Server(k) as srv:  # with server-side apply
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        path = tmp_path / "kubeconfig.yaml"
        path.write_text(kubeconfig(str(srv.url)))
        yield k, path
    assert denied(calls_of(k), namespace=NS) == []  # deploy/member-rbac.yaml grants each call


def kubeconfig(server: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: km\n  cluster:\n    server: {server}\n"
        "users:\n- name: u\n  user:\n    token: not-a-secret\n"
        "contexts:\n- name: km\n  context:\n    cluster: km\n    user: u\n"
        "current-context: km\n"
    )


def cluster(name: str, *, max_nodes: int = 3, provider: str = "aws", nodes: int = 1,
            cpu: float = 4) -> Cluster:
    pool = Pool(name="cpu", instance_type="c5.xlarge", node=Resources(cpu, 8, 0), nodes=nodes,
                max_nodes=max_nodes, price_usd_per_hour=0.17)
    return Cluster(name=name, provider=provider, region="us-east-1", pools=(pool,))


async def register(store: Store, c: Cluster, attrs: Mapping[str, Any] | None = None,
                   *, tenant: str = "admin") -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure(tenant)
        await uow.clusters.upsert(c, tenant=tenant, attrs=attrs)


async def records(store: Store) -> list[ClusterRecord]:
    async with store.unit() as uow:
        return await uow.clusters.list_records()


def spec(wid: str, *, pool: str = "cpu") -> ApplySpec:
    return ApplySpec(workload_id=wid, tenant="admin", name="web", kind="service",
                     image="nginx:1.27", replicas=2, cpu=1.0, memory_gib=2.0, pool=pool)


async def test_sim_and_kubernetes_clusters_get_drivers_and_apply_lands_in_kmock(
        store: Store, kube: tuple[Any, Path]) -> None:
    k, path = kube
    await register(store, cluster("sim-1"))
    await register(store, cluster("k8s-1"), {"kubeconfig": str(path), "context": "km",
                                             "namespace": NS, "kubernetes": {"timeout_s": 5}})
    mirror: dict[str, ClusterDriver] = {}
    reg = DriverRegistry(clock=SystemClock(), mirror=mirror)
    try:
        result = await reg.refresh(store)
        assert sorted(result.added) == ["k8s-1", "sim-1"]
        assert not result.failed
        assert isinstance(reg, Mapping)
        assert list(reg) == ["k8s-1", "sim-1"]
        assert dict(mirror) == dict(reg.items())
        assert isinstance(reg["k8s-1"], KubernetesDriver)
        assert isinstance(reg["sim-1"], SimulatedClusterDriver)
        assert (reg.kind_of("k8s-1"), reg.kind_of("sim-1")) == ("kubernetes", "simulated")

        await reg["k8s-1"].apply(spec=spec("w-1"))
        body = dict(k.objects[DEP_RES, NS, "skyfed-w-1"].raw)
        assert body["spec"]["replicas"] == 2
        assert body["spec"]["template"]["spec"]["nodeSelector"] == {"skyfed.io/pool": "cpu"}

        await reg["sim-1"].apply(spec=spec("w-2"))
        st = await reg["sim-1"].status(workload_id="w-2")
        assert (st.phase, st.ready_replicas) == (WorkloadPhase.RUNNING, 2)

        again = await reg.refresh(store)  # unchanged registrations: the same driver objects
        assert (again.added, again.replaced, again.removed) == ((), (), ())
        assert (await reg["sim-1"].status(workload_id="w-2")).phase is WorkloadPhase.RUNNING
    finally:
        await reg.aclose()
    assert len(reg) == 0
    assert mirror == {}


async def test_malformed_kubeconfig_is_named_marked_unhealthy_and_others_keep_working(
        store: Store, kube: tuple[Any, Path], tmp_path: Path) -> None:
    _, good = kube
    bad = tmp_path / "broken-kubeconfig.yaml"
    bad.write_text("apiVersion: v1\nclusters: [this is: not valid\n")
    await register(store, cluster("sim-1"))
    await register(store, cluster("k8s-bad"), {"kubeconfig": str(bad)})
    await register(store, cluster("odd"), {"driver": "nomad"})
    reg = DriverRegistry(clock=SystemClock())
    try:
        assert reg.behind(await records(store))
        result = await reg.refresh(store)
        # Failed builds are recorded: the placement loop does not rebuild them every epoch.
        assert not reg.behind(await records(store))
        assert list(reg) == ["sim-1"]
        assert set(result.failed) == {"k8s-bad", "odd"}
        assert "broken-kubeconfig.yaml" in result.failed["k8s-bad"]
        assert "k8s-bad" in result.failed["k8s-bad"]
        assert "unknown driver 'nomad'" in reg.errors["odd"]
        async with store.unit() as uow:
            rec = await uow.clusters.get("k8s-bad")
            sim = await uow.clusters.get("sim-1")
        assert rec.cluster.healthy is False
        assert "broken-kubeconfig.yaml" in rec.attrs["driver_error"]
        assert sim.cluster.healthy is True
        await reg["sim-1"].apply(spec=spec("w-1"))  # the good cluster still takes work

        await register(store, cluster("k8s-bad"))  # re-registered (attrs kept): healthy again
        async with store.unit() as uow:
            assert (await uow.clusters.get("k8s-bad")).cluster.healthy is True
        await reg.refresh(store)  # ... until the refresh marks it once more
        async with store.unit() as uow:
            assert (await uow.clusters.get("k8s-bad")).cluster.healthy is False

        bad.write_text(good.read_text())  # fixing the file on disk is enough
        fixed = await reg.refresh(store)
        assert fixed.added == ("k8s-bad",)
        assert "k8s-bad" not in reg.errors
        async with store.unit() as uow:
            rec = await uow.clusters.get("k8s-bad")
        assert rec.cluster.healthy is True
        assert rec.attrs["driver_error"] is None
    finally:
        await reg.aclose()


async def test_later_registration_change_and_delete_follow_the_store(store: Store) -> None:
    mirror: dict[str, ClusterDriver] = {}
    reg = DriverRegistry(clock=SystemClock(), mirror=mirror)
    try:
        assert (await reg.refresh(store)).added == ()
        await register(store, cluster("late"))
        assert reg.behind(await records(store))  # registered since the last refresh
        assert (await reg.refresh(store)).added == ("late",)
        assert not reg.behind(await records(store))
        first = reg["late"]
        async with store.unit() as uow:  # usage updates and telemetry do not rebuild it
            await uow.clusters.set_pool_usage("late", "cpu", nodes=2, used_cpu=1.0)
            await uow.clusters.set_attrs("late", {"telemetry": {"cpu": 1.0}})
            await uow.clusters.set_health("late", healthy=False)
        assert not reg.behind(await records(store))
        await reg.refresh(store)
        assert reg["late"] is first
        # A pool the actuator grew keeps its driver (and what runs there) ...
        await register(store, cluster("late", max_nodes=8, nodes=3))
        assert not reg.behind(await records(store))
        assert (await reg.refresh(store)).replaced == ()
        assert reg["late"] is first
        # ... a pool of another node shape is a new driver, at the registered node count.
        await register(store, cluster("late", max_nodes=8, nodes=3, cpu=8))
        assert reg.behind(await records(store))
        assert (await reg.refresh(store)).replaced == ("late",)
        assert reg["late"] is not first
        assert len(await reg["late"].inventory()) == 3
        async with store.unit() as uow:
            await uow.clusters.delete("late")
        assert (await reg.refresh(store)).removed == ("late",)
        assert "late" not in reg
        assert mirror == {}
        await register(store, cluster("after"))
    finally:
        await reg.aclose()
    assert not reg.behind(await records(store))  # closed: it builds no more drivers


async def test_a_driver_installed_by_someone_else_wins(store: Store) -> None:
    await register(store, cluster("demo-1"))
    theirs = SimulatedClusterDriver("demo-1", [SimPool("x", 1, 2, 4)])
    mirror: dict[str, ClusterDriver] = {"demo-1": theirs}
    reg = DriverRegistry(clock=SystemClock(), mirror=mirror)
    try:
        result = await reg.refresh(store)
        assert result.foreign == ("demo-1",)
        assert "demo-1" not in reg
        assert mirror["demo-1"] is theirs
    finally:
        await reg.aclose()
    assert mirror["demo-1"] is theirs  # closing the registry leaves it alone


async def test_edge_clusters_use_the_edge_factory(store: Store) -> None:
    await register(store, cluster("site-1", provider="edge"), {"edge": {"site": "muc-1"}})
    seen: list[tuple[str, dict[str, Any]]] = []

    def factory(target: DriverTarget) -> ClusterDriver:
        seen.append((target.name, dict(target.options)))
        return SimulatedClusterDriver(target.name, target.pools)

    reg = DriverRegistry(clock=SystemClock(), edge_factory=factory)
    try:
        await reg.refresh(store)
        assert seen == [("site-1", {"site": "muc-1", "command_timeout_s": 5.0})]
        assert reg.kind_of("site-1") == "edge"
    finally:
        await reg.aclose()


async def test_refresh_loop_picks_up_clusters_registered_after_start(store: Store) -> None:
    mirror: dict[str, ClusterDriver] = {}
    reg = DriverRegistry(clock=SystemClock(), mirror=mirror)
    loop = DriverRefreshLoop(reg, store, SystemClock(), interval_s=0.05, close_on_stop=True)
    assert loop.name == "drivers"
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(loop.run(stop), name="drivers-loop")
        await register(store, cluster("after-start"))
        for _ in range(500):  # up to 10 s on a loaded machine
            if "after-start" in reg:
                break
            await asyncio.sleep(0.02)
        assert "after-start" in mirror
        stop.set()
    assert reg.refreshes >= 1
    assert len(reg) == 0  # closed on stop
    assert mirror == {}
