"""Consecutive epochs never hand out the same capacity twice.

Observed pool usage lags what the broker has placed; the loop counts active
placements against their pools (broker/placement/commitments.py). Seen before
the fix: two 8-GPU jobs submitted in consecutive epochs both landed on the one
8-GPU node of a pool that may not grow.
"""

from __future__ import annotations

import pytest

from broker.clock import ManualClock
from broker.domain import (
    Cluster,
    Interconnect,
    Pool,
    Resources,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.placement_loop import PlacementLoop
from broker.settings import PlacementSettings, UserRegionSettings
from broker.store import Store
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _gpu_cluster() -> Cluster:
    pool = Pool(name="a100", instance_type="p4d.24xlarge", node=Resources(96, 1152, 8),
                nodes=1, max_nodes=1, price_usd_per_hour=32.77, gpu_model="A100",
                interconnect=Interconnect.NVLINK_FULL)
    return Cluster(name="gpu", provider="aws", region="us-east-1", pools=(pool,),
                   lat=38.9, lon=-77.4)


def _train(name: str) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.TRAIN, image="pytorch", replicas=1,
                        resources=Resources(32, 256, 8), gpu_model="A100",
                        interconnect=Interconnect.NVLINK_FULL, duration_s=3600)


async def _submit(store: Store, spec: WorkloadSpec) -> str:  # noqa: F811
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


async def _status(store: Store, wid: str) -> WorkloadStatus:  # noqa: F811
    async with store.unit() as uow:
        return (await uow.workloads.get(wid)).workload.status


async def test_second_gpu_job_does_not_take_the_node_the_first_was_given(
        store: Store) -> None:  # noqa: F811
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(_gpu_cluster(), tenant="acme")
    loop = PlacementLoop(store, ManualClock(1000.0), PlacementSettings(time_limit_s=2.0))
    first = await _submit(store, _train("first"))
    plan = await loop.tick()
    assert plan is not None
    assert [p.workload_id for p in plan.placements] == [first]
    # The first job is placed, not yet running: pool usage in the store is still 0.
    second = await _submit(store, _train("second"))
    plan = await loop.tick()
    assert plan is not None
    assert plan.placements == ()
    assert second in plan.unplaced
    assert await _status(store, first) == WorkloadStatus.PLACED
    assert await _status(store, second) in (WorkloadStatus.PENDING, WorkloadStatus.UNPLACEABLE)


async def test_configured_user_regions_give_latency_slos_coordinates(
        store: Store) -> None:  # noqa: F811
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(_gpu_cluster(), tenant="acme")
    settings = PlacementSettings(user_regions=[UserRegionSettings(name="dc-users", lat=38.9,
                                                                  lon=-77.0)])
    loop = PlacementLoop(store, ManualClock(1000.0), settings)
    spec = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx", replicas=1,
                        resources=Resources(1, 2, 0), user_region="dc-users",
                        latency_slo_ms=30)
    wid = await _submit(store, spec)
    snap = await loop.snapshot()
    assert snap is not None
    assert [u.name for u in snap.user_regions] == ["dc-users"]
    plan = await loop.tick()
    assert plan is not None
    assert [p.workload_id for p in plan.placements] == [wid]
