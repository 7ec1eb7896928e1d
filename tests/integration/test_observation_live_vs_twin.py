"""The live broker and the twin observe the same federation state identically, feature by
feature (placement/observe.py on each shell's own snapshot).

The twin runs a small federation (two clouds, a spot pool, a GPU pool, an edge site) until
work runs, waits on booting nodes and queues; a cluster goes down and spot nodes have been
reclaimed. That state is then reproduced in the live broker through its real paths: the
clusters and the site are registered, each simulated node is reported by a driver's
`inventory()` and stored by the inventory poller, placements are recorded at the times the
twin made them (with running / not yet running status), pending work is submitted. The
live observation is built from the store by the SnapshotReader; every node, edge and batch
feature must equal the twin's.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import numpy as np
import pytest

from broker.clock import ManualClock
from broker.domain import (
    Assignment,
    Placement,
    PricingModel,
    Resources,
    Site,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.inventory import InventoryPoller
from broker.federation.snapshot import SnapshotReader
from broker.placement.observe import observe
from broker.placement.policy import BATCH_FEATURES, NODE_FEATURES, POOL_FEATURES
from broker.settings import PlacementSettings, SnapshotSettings
from broker.sim.engine import Engine, SimConfig
from broker.sim.realize import TwinNoise
from broker.sim.scenario import parse_scenario, parse_trace
from broker.sim.snapshot import observed_nodes, registered
from broker.sim.state import SimCluster
from broker.store import Store, migrate
from providers.base import Capability, NodeInventory
from providers.catalog import Catalog

pytestmark = pytest.mark.integration

HEADER = ("id,submit_s,kind,replicas,cpu,memory_gib,gpu,duration_s,user_region,"
          "latency_slo_ms,data_gb,data_region,image_gb\n")
HORIZON_S = 1000.0  # not a multiple of epoch_s: the last arrivals stay pending
DOC = {
    "name": "obs", "seed": 5, "horizon_s": HORIZON_S, "epoch_s": 30.0,
    "defaults": {"provision_delay_s": 900.0, "image_pull_gbps": 1.0, "network_gbps": 10.0},
    "clusters": [
        {"name": "aws-use1", "provider": "aws", "region": "us-east-1",
         "pools": [{"instance_type": "m5.2xlarge", "nodes": 2, "max_nodes": 6},
                   {"instance_type": "g4dn.xlarge", "nodes": 1, "max_nodes": 3},
                   {"instance_type": "m5.2xlarge", "nodes": 1, "max_nodes": 4,
                    "spot": True}]},
        {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
         "pools": [{"instance_type": "n2-standard-8", "nodes": 1, "max_nodes": 3}]},
        {"name": "edge-nyc", "provider": "edge", "lat": 40.71, "lon": -74.0,
         "capacity": {"cpu": 16.0, "memory_gib": 64.0, "gpu": 0, "price_per_hour": 0.9}},
    ],
    "user_regions": [{"name": "nyc", "lat": 40.7, "lon": -74.0}],
}
TRACE = "".join([
    "a,0,batch,1,6,8,0,100000,,,0,,0.5\n",
    "b,0,batch,1,4,8,0,100000,,,0,,0.5\n",
    "g,0,train,1,2,8,1,100000,,,0,,0.5\n",
    "s,30,service,1,2,4,0,,nyc,20,0,,0.5\n",
    "c,200,batch,1,7,8,0,100000,,,0,,0.5\n",  # a new node: still booting at the horizon
    "d,200,batch,1,7,8,0,100000,,,0,,0.5\n",
    "p1,1000,batch,1,2,4,0,600,,,0,,0.5\n",  # pending at the horizon
    "p2,1000,train,1,4,16,1,3600,,,0,,0.5\n",
    "p3,1000,service,1,1,2,0,,nyc,30,0,,0.5\n",
])


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    url = f"{pg_url}?schema=t_obs_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    s = Store.from_url(url, pool_size=2, clock=ManualClock(0.0))
    try:
        yield s
    finally:
        await s.close()
        await migrate.drop_schema(url)


def twin(catalog: Catalog) -> Engine:
    probe = parse_scenario(DOC, catalog, events=())
    events = parse_trace(HEADER + TRACE, user_regions={u.name for u in probe.user_regions},
                         clusters=probe.clusters)
    # No arrival jitter: the last rows must arrive exactly at the horizon, after the last epoch.
    eng = Engine(parse_scenario(DOC, catalog, events=events), catalog,
                 SimConfig(policy="lp", check_invariants=True,
                           noise=TwinNoise.off()))
    eng.run()
    # Faults the run did not happen to contain: spot reclaims seen, a cluster down now.
    eng.clusters["aws-use1"].pools[2].reclaims = 3
    eng.clusters["gcp-usc1"].down_until = eng.now + 100.0
    return eng


class EngineNodesDriver:
    """A member's nodes as its driver reports them (the cloud API edge of this test)."""

    capabilities: frozenset[Capability] = frozenset()

    def __init__(self, c: SimCluster, now: float) -> None:
        self.name = c.name
        self._nodes = [n for p in c.pools for n in observed_nodes(c, p, now)]

    async def inventory(self) -> list[NodeInventory]:
        return [NodeInventory(
            name=n.name, pool=n.pool, allocatable_cpu=n.allocatable.cpu,
            allocatable_memory_gib=n.allocatable.memory_gib,
            allocatable_gpu=n.allocatable.gpu, used_cpu=n.allocated.cpu,
            used_memory_gib=n.allocated.memory_gib, used_gpu=n.allocated.gpu,
            ready=n.ready, replicas=0) for n in self._nodes]


async def reproduce(eng: Engine, store: Store, clock: ManualClock) -> None:
    """The engine's state, entered into the live broker the way the live broker learns it."""
    now = eng.now
    ids: dict[str, str] = {}
    async with store.unit() as uow:
        await uow.tenants.ensure("t")
        for c in eng.clusters.values():
            reg = registered(c, now)
            if c.spec.fixed:
                p = c.spec.pools[0]
                await uow.sites.upsert(Site(name=c.name, lat=c.spec.lat, lon=c.spec.lon,
                                            capacity=p.node,
                                            price_usd_per_hour=p.price_usd_per_hour),
                                       tenant="admin")
                continue
            await uow.clusters.upsert(reg, tenant="admin")
            if not reg.healthy:
                await uow.clusters.set_health(c.name, healthy=False, reason="down")
        for wid, ws in eng.workloads.items():
            ev = ws.ev
            spec = WorkloadSpec(
                name=wid, kind=WorkloadKind(ev.kind), image="img",
                replicas=ws.pending if not ws.groups else ws.desired,
                resources=Resources(ev.cpu, ev.memory_gib, ev.gpu),
                user_region=ev.user_region, latency_slo_ms=ev.latency_slo_ms,
                duration_s=ev.duration_s)
            rec, _ = await uow.workloads.submit(tenant="t", spec=spec)
            ids[wid] = rec.workload.id
    # Placements in the order and at the times the twin made them.
    groups = sorted(((g.placed_s, wid, g) for wid, ws in eng.workloads.items()
                     for g in ws.groups), key=lambda x: (x[0], x[1]))
    for placed_s, wid, g in groups:
        clock.advance(placed_s - clock.now())
        pool = eng.clusters[g.cluster].pool(g.pool)
        pricing = PricingModel.SPOT if pool.spec.spot else PricingModel.ON_DEMAND
        async with store.unit() as uow:
            await uow.placements.record(Placement(ids[wid], (
                Assignment(g.cluster, g.pool, pricing, g.count, pool.price_usd_per_hour),), 1.0),
                demand_tau_s=eng.config.demand_tau_s)  # as the placement loop records
            if g.running:
                await uow.workloads.set_status(ids[wid], WorkloadStatus.RUNNING)
    clock.advance(now - clock.now())
    drivers = {c.name: EngineNodesDriver(c, now) for c in eng.clusters.values()}
    await InventoryPoller(store, drivers, clock).poll_once()  # type: ignore[arg-type]
    async with store.unit() as uow:  # the reclaims the poller would have counted
        for c in eng.clusters.values():
            rec = await uow.inventory.get(c.name)
            assert rec is not None
            await uow.inventory.put(c.name, rec.nodes,
                                    reclaims={p.name: p.reclaims for p in c.pools if p.reclaims})


async def test_every_feature_of_the_live_observation_equals_the_twins(store: Store) -> None:
    catalog = Catalog.load()
    eng = twin(catalog)
    # The state is rich enough for the comparison to mean something.
    states = list(eng.workloads.values())
    assert any(g.running for ws in states for g in ws.groups)
    assert any(not g.running for ws in states for g in ws.groups)
    assert len(eng.pending) == 3
    assert any(n.ready_at > eng.now for c in eng.clusters.values() for p in c.pools
               for n in p.node_list)

    clock = store.clock
    assert isinstance(clock, ManualClock)
    await reproduce(eng, store, clock)
    settings = PlacementSettings(user_regions=[{"name": "nyc", "lat": 40.7, "lon": -74.0}])
    reader = SnapshotReader(SnapshotSettings(), settings, catalog=catalog)
    live_snap = await reader.pending_snapshot(store, batch_max=500)
    assert live_snap is not None
    twin_obs = observe(eng.snapshot())
    live_order = {n: i for i, n in enumerate(observe(live_snap).names)}
    live = observe(live_snap)
    assert sorted(live.names) == sorted(twin_obs.names)

    rows = [live_order[n] for n in twin_obs.names]
    for i, name in enumerate(twin_obs.names):
        for j, feature in enumerate(NODE_FEATURES):
            assert live.node_x[rows[i], j] == pytest.approx(twin_obs.node_x[i, j], abs=1e-5), \
                f"{name}.{feature}: live {live.node_x[rows[i], j]} twin {twin_obs.node_x[i, j]}"
    for j, feature in enumerate(BATCH_FEATURES):
        assert live.batch_x[j] == pytest.approx(twin_obs.batch_x[j], abs=1e-5), feature
    assert sorted(live.pools) == sorted(twin_obs.pools)
    live_pool = {p: live.pool_x[k] for k, p in enumerate(live.pools)}
    for k, (cname, pname) in enumerate(twin_obs.pools):
        assert live.names[live.pool_cluster[live.pools.index((cname, pname))]] == cname
        assert twin_obs.names[twin_obs.pool_cluster[k]] == cname
        for j, feature in enumerate(POOL_FEATURES):
            got, want = live_pool[(cname, pname)][j], twin_obs.pool_x[k, j]
            assert got == pytest.approx(want, abs=1e-5), \
                f"{cname}/{pname}.{feature}: live {got} twin {want}"

    def edge_set(obs: object, names: tuple[str, ...]) -> set[tuple[str, str, float, float]]:
        ei, ex = obs.edge_index, obs.edge_x  # type: ignore[attr-defined]
        return {(names[ei[0, k]], names[ei[1, k]], round(float(ex[k, 0]), 4),
                 round(float(ex[k, 1]), 4)) for k in range(ei.shape[1])}

    assert edge_set(live, live.names) == edge_set(twin_obs, twin_obs.names)
    # Every feature is exercised by something, so equality is not equality of zeros.
    by = {n: twin_obs.node_x[i] for i, n in enumerate(twin_obs.names)}
    f = {name: k for k, name in enumerate(NODE_FEATURES)}
    assert by["aws-use1"][f["free_cpu_frac"]] < 1.0
    assert by["aws-use1"][f["free_gpu_frac"]] < 1.0
    assert by["aws-use1"][f["spot_discount"]] > 0.0
    assert by["aws-use1"][f["reclaim_rate_per_hour"]] > 0.0
    assert max(v[f["queue_frac"]] for v in by.values()) > 0.0
    assert max(v[f["recent_demand"]] for v in by.values()) > 0.0
    assert by["gcp-usc1"][f["healthy"]] == 0.0
    assert by["edge-nyc"][f["is_edge"]] == 1.0
    assert max(v[f["booting_frac"]] for v in by.values()) > 0.0
    assert np.all(twin_obs.batch_x[:3] > 0)
    # Pool rows too (idle nodes, and so idle_age_frac, are not part of this state: the live
    # poller learns when a node emptied by polling then, which this reproduction does once).
    pf = {name: k for k, name in enumerate(POOL_FEATURES)}
    for feature in ("is_spot", "is_gpu", "reclaim_rate_per_hour", "booting_frac",
                    "forecast_frac", "nodes_of_max"):
        assert twin_obs.pool_x[:, pf[feature]].max() > 0.0, feature
    assert twin_obs.pool_x[:, pf["free_cpu_frac"]].min() < 1.0
