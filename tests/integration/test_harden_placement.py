"""One tenant's absurd cluster must not stop placement for everyone (issue 13, finding 1).

On main, a cluster priced at `Infinity` (the JSON parser accepted the literal) made
the placement loop raise OverflowError in `lp._node_bounds` on every epoch. Here the
row is written straight into the store, as an older version (or a hand-edited
database) would have left it: the loop must leave that cluster out, say so once with
a `cluster.quarantined` event for its owner, and place everyone's work elsewhere.
"""

from __future__ import annotations

import math

import pytest

from broker.clock import ManualClock
from broker.domain import Cluster, Pool, Resources, WorkloadKind, WorkloadSpec, WorkloadStatus
from broker.federation.placement_loop import PlacementLoop, whatif_for_placement
from broker.settings import PlacementSettings
from broker.store import Store
from tests.integration.test_placement_loop import _cluster, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _poisoned(name: str, *, price: float = math.inf, quota: float | None = None) -> Cluster:
    pool = Pool(name="cpu", instance_type="x", node=Resources(8, 32, 0), nodes=2, max_nodes=4,
                price_usd_per_hour=price)
    return Cluster(name=name, provider="onprem", region="lab", pools=(pool,), lat=40.0,
                   lon=-75.0, quota_vcpu=quota)


def _spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.BATCH, image="busybox", replicas=2,
                        resources=Resources(1.0, 2.0, 0))


async def test_finding1_an_infinite_cluster_is_quarantined_and_everyone_else_is_placed(
        store: Store) -> None:  # noqa: F811
    async with store.unit() as uow:
        for tenant in ("mallory", "alice", "bob"):
            await uow.tenants.ensure(tenant)
        await uow.clusters.upsert(_poisoned("free-inf"), tenant="mallory")
        await uow.clusters.upsert(_poisoned("quota-inf", price=0.001, quota=math.inf),
                                  tenant="mallory")
        await uow.clusters.upsert(_cluster("honest", "us-east-1", 38.9, -77.4, 0.3),
                                  tenant="alice", shared=True)  # as an operator registers
        ids = [(await uow.workloads.submit(tenant=t, spec=_spec(f"job-{t}")))[0].workload.id
               for t in ("alice", "bob", "mallory")]
    loop = PlacementLoop(store, ManualClock(1000.0), PlacementSettings(), catalog=None)
    plan = await loop.tick()
    assert plan is not None
    assert {p.workload_id for p in plan.placements} == set(ids)
    assert {a.cluster for p in plan.placements for a in p.assignments} == {"honest"}
    assert set(loop.quarantine.reasons) == {"free-inf", "quota-inf"}
    assert "priceUsdPerHour=inf" in loop.quarantine.reasons["free-inf"]
    async with store.unit() as uow:
        events = await uow.events.list(kind="cluster.quarantined")
        statuses = {(await uow.workloads.get(w)).workload.status for w in ids}
        pid = (await uow.workloads.get(ids[0])).placement_id
    assert sorted((e.subject, e.tenant) for e in events) == [("free-inf", "mallory"),
                                                             ("quota-inf", "mallory")]
    assert statuses == {WorkloadStatus.PLACED}
    # once per cluster, not once per epoch
    async with store.unit() as uow:
        await uow.workloads.submit(tenant="bob", spec=_spec("later"))
    assert await loop.tick() is not None
    async with store.unit() as uow:
        assert len(await uow.events.list(kind="cluster.quarantined")) == 2
    # what-if reads the same clusters: the poisoned ones are left out there too
    assert pid is not None
    out = await whatif_for_placement(store, PlacementSettings(), pid, "honest", tenant=None)
    assert out["stored"]["clusters"] == ["honest"]
    # the owner fixes its cluster: it is released, with an event
    async with store.unit() as uow:
        await uow.clusters.upsert(_poisoned("free-inf", price=0.2), tenant="mallory")
        await uow.workloads.submit(tenant="bob", spec=_spec("after-fix"))
    await loop.tick()
    assert set(loop.quarantine.reasons) == {"quota-inf"}
    async with store.unit() as uow:
        released = await uow.events.list(kind="cluster.released")
    assert [(e.subject, e.tenant) for e in released] == [("free-inf", "mallory")]
