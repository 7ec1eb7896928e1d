"""A GPU node group tainted `nvidia.com/gpu:NoSchedule` (as EKS, AKS and Karpenter advise):
the live loop learns the taint from the inventory and keeps work that asks no GPU off it.

Real store (PostgreSQL schema and SQLite), the placement loop and dispatcher, simulated
member clusters (the cloud API edge) whose scheduler refuses a pod the taint does not let in.
"""

from __future__ import annotations

import pytest

from broker.api.views import cluster_detail_view, cluster_view
from broker.clock import ManualClock
from broker.domain import Cluster, Pool, Resources, WorkloadKind, WorkloadSpec, WorkloadStatus
from broker.federation.dispatcher import Dispatcher
from broker.federation.inventory import InventoryPoller
from broker.federation.reconciler import Reconciler
from broker.federation.snapshot import SnapshotReader
from broker.settings import PlacementSettings, SnapshotSettings
from broker.store import ClusterRecord, Store
from providers.base import ClusterDriver
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.integration.test_actuator_scale import _loop, _setup, _submit
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

GPU_TAINT = "nvidia.com/gpu=true:NoSchedule"


def _cluster() -> Cluster:
    # Per vCPU the GPU node's paid room (2 USD/h for 96) is far cheaper than a new CPU node
    # (0.2 USD/h for 4): only the taint keeps a CPU job off it.
    return Cluster(name="eks", provider="aws", region="us-east-1", lat=38.9, lon=-77.4, pools=(
        Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=0,
             max_nodes=4, price_usd_per_hour=0.2),
        Pool(name="gpu", instance_type="g6.48xlarge", node=Resources(96, 384, 8), nodes=1,
             max_nodes=1, price_usd_per_hour=2.0, gpu_model="L4")))


def _driver(clock: ManualClock) -> SimulatedClusterDriver:
    return SimulatedClusterDriver("eks", [
        SimPool(name="cpu", nodes=0, cpu_per_node=4, memory_gib_per_node=16),
        SimPool(name="gpu", nodes=1, cpu_per_node=96, memory_gib_per_node=384, gpu_per_node=8,
                gpu_model="L4", taints=(GPU_TAINT,))], clock=clock.now)


def _job(name: str, *, gpu: int = 0) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.BATCH, image="busybox", replicas=1,
                        resources=Resources(2, 4, gpu), duration_s=3600.0, spot_ok=True)


async def test_a_cpu_job_keeps_off_a_tainted_gpu_node_group_and_a_gpu_job_runs_there(
        store: Store) -> None:  # noqa: F811
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster()])
    drivers: dict[str, ClusterDriver] = {"eks": _driver(clock)}
    loop = _loop(store, clock, drivers)
    cpu_id = await _submit(store, _job("etl"))
    gpu_id = await _submit(store, _job("train", gpu=1))
    await InventoryPoller(store, drivers, clock).poll_once()
    snap = await loop.snapshot()
    assert snap is not None
    assert {p.name: p.taints for p in snap.clusters[0].pools} == {"cpu": (), "gpu": (GPU_TAINT,)}

    plan = await loop.tick()
    assert plan is not None
    pools = {p.workload_id: [(a.pool, a.replicas) for a in p.assignments]
             for p in plan.placements}
    assert pools == {cpu_id: [("cpu", 1)], gpu_id: [("gpu", 1)]}
    assert [(s.pool, s.add_nodes) for s in plan.scale] == [("cpu", 1)]

    # The GPU job runs on the tainted node: its pods tolerate the taint, as the Kubernetes
    # driver's pod template makes them.
    await Dispatcher(store, drivers, clock).dispatch_once()
    await Reconciler(store, drivers, clock).reconcile_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(gpu_id)).workload.status is WorkloadStatus.RUNNING

    # The operator sees the taint where the planner's values are shown.
    merged, readings, record = await SnapshotReader(SnapshotSettings(), PlacementSettings()
                                                    ).cluster(store, "eks", tenant=None)
    assert isinstance(record, ClusterRecord)
    view = cluster_detail_view(cluster_view(record), merged, readings.inventory.get("eks"),
                               None, None, clock.now())
    assert [p["taints"] for p in view["effective"]["pools"]] == [[], [GPU_TAINT]]
    assert [p["taints"] for p in view["pools"]] == [[], []]  # the registration
