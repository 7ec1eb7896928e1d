"""The live snapshot's release rates: what workloads that ended held, as the twin counts it.

Real store (PostgreSQL schema and SQLite). Work is placed through the store's real path
(`record` with the demand EWMA, as the placement loop records), ends through the status
paths the reconciler and the API use, and the SnapshotReader's next snapshot must carry
each pool's release rate (FederationSnapshot.freed) equal to the twin's rule for the same
events (`SimPool.add_freed`), which the prewarm rule then nets out of the demand rate.
"""

from __future__ import annotations

import math

import pytest

from broker.clock import ManualClock
from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    PolicyAction,
    Pool,
    PricingModel,
    Resources,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.snapshot import SnapshotReader
from broker.placement import decisions
from broker.placement.decisions import DecisionConfig
from broker.settings import PlacementSettings, SnapshotSettings
from broker.sim.scenario import PoolSpec
from broker.sim.state import SimPool
from broker.store import Store
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

TAU_S = 900.0


def _cluster() -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=2,
                max_nodes=10, price_usd_per_hour=0.2)
    return Cluster(name="aws-use1", provider="aws", region="us-east-1", pools=(pool,),
                   lat=38.9, lon=-77.4)


def _job(name: str, replicas: int, cpu: float) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.BATCH, image="busybox", replicas=replicas,
                        resources=Resources(cpu, 2, 0), duration_s=600.0)


async def _submit(store: Store, spec: WorkloadSpec) -> str:  # noqa: F811
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


async def _setup(store: Store) -> ManualClock:  # noqa: F811
    """The tenant and the cluster registered; the store's manual clock."""
    clock = store.clock
    assert isinstance(clock, ManualClock)
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(_cluster(), tenant="acme")
    return clock


async def _place(store: Store, wid: str, replicas: int) -> None:  # noqa: F811
    async with store.unit() as uow:
        await uow.placements.record(Placement(wid, (
            Assignment("aws-use1", "cpu", PricingModel.ON_DEMAND, replicas, 0.2),), 0.2),
            demand_tau_s=TAU_S)
        await uow.workloads.set_status(wid, WorkloadStatus.RUNNING)


async def test_workloads_that_ended_give_each_pool_the_twins_release_rate(
        store: Store) -> None:  # noqa: F811
    clock = await _setup(store)
    twin = SimPool(spec=PoolSpec(name="cpu", instance_type="m5.xlarge",
                                 node=Resources(4, 16, 0), nodes=2, max_nodes=10, spot=False,
                                 price_usd_per_hour=0.2), cluster="aws-use1", node_list=[])
    t0 = clock.now()

    done = await _submit(store, _job("done", 3, 2.0))  # 6 vCPUs, succeeds
    gone = await _submit(store, _job("gone", 2, 1.0))  # 2 vCPUs, cancelled while running
    never = await _submit(store, _job("never", 4, 1.0))  # cancelled before it was placed
    await _place(store, done, 3)
    await _place(store, gone, 2)
    twin.add_demand(t0, 6.0, 0.0, TAU_S)
    twin.add_demand(t0, 2.0, 0.0, TAU_S)

    clock.advance(120.0)
    async with store.unit() as uow:  # as the reconciler reports a finished job
        changed = await uow.workloads.transition_many(
            [(done, WorkloadStatus.SUCCEEDED, "finished")],
            {WorkloadStatus.SUCCEEDED: frozenset({WorkloadStatus.RUNNING})})
        assert changed == [done]
    twin.add_freed(clock.now(), 6.0, 0.0, TAU_S)
    clock.advance(60.0)
    async with store.unit() as uow:  # as the API cancels
        await uow.workloads.cancel(gone, tenant="acme")
        await uow.workloads.cancel(never, tenant="acme")
    twin.add_freed(clock.now(), 2.0, 0.0, TAU_S)
    clock.advance(30.0)
    await _submit(store, _job("next", 1, 1.0))  # something to plan, so the epoch runs

    reader = SnapshotReader(SnapshotSettings(demand_tau_s=TAU_S), PlacementSettings())
    snap = await reader.pending_snapshot(store, batch_max=500)
    assert snap is not None
    twin.decay_demand(clock.now(), TAU_S)
    key = ("aws-use1", "cpu")
    assert snap.freed[key][0] == pytest.approx(twin.freed_cpu_per_s, rel=1e-9)
    assert snap.freed[key][1] == 0.0
    assert snap.demand[key][0] == pytest.approx(twin.demand_cpu_per_s, rel=1e-9)
    # Only what was placed counts: 8 vCPUs freed, not the 4 of the job that never ran.
    assert snap.freed[key][0] == pytest.approx(
        6.0 / TAU_S * math.exp(-90.0 / TAU_S) + 2.0 / TAU_S * math.exp(-30.0 / TAU_S))

    # The net forecast sees the demand the ended work gave back: with a lead long enough,
    # arrivals alone order nodes for capacity that the ended work already returned.
    action = PolicyAction(prewarm_lead_s=3000.0)
    net = decisions.prewarm_nodes(snap, action, DecisionConfig(), {}, ())
    gross = decisions.prewarm_nodes(snap, action, DecisionConfig(net_forecast=False), {}, ())
    assert sum(p.nodes for p in gross) > sum(p.nodes for p in net)


async def test_ended_work_older_than_the_window_is_not_read(
        store: Store) -> None:  # noqa: F811
    """Read back FREED_WINDOW_TAUS time constants only: older ends weigh under 0.7 %."""
    clock = await _setup(store)
    old = await _submit(store, _job("old", 1, 2.0))
    await _place(store, old, 1)
    async with store.unit() as uow:
        await uow.workloads.set_status(old, WorkloadStatus.SUCCEEDED)
    clock.advance(6 * TAU_S)
    async with store.unit() as uow:
        assert await uow.workloads.ended_since(clock.now() - 5 * TAU_S, limit=10) == []
        assert len(await uow.workloads.ended_since(clock.now() - 7 * TAU_S, limit=10)) == 1
