"""Pools scale through the actuator: the placement loop orders, the actuator carries it out.

Real store (PostgreSQL schema and SQLite), the planner's own decisions, simulated member
clusters (the cloud API edge) whose new nodes boot for a while before they join.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from broker.api.views import cluster_detail_view, cluster_view
from broker.clock import ManualClock
from broker.domain import (
    Cluster,
    FederationSnapshot,
    Pool,
    Resources,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.actuator import Actuator
from broker.federation.decision_log import record_decisions
from broker.federation.dispatcher import Dispatcher
from broker.federation.inventory import InventoryPoller
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.federation.scaling import scalable_pools
from broker.federation.snapshot import SnapshotReader
from broker.placement.planner import EpochPlan, PoolScale, PoolScaleIn, SolveStats
from broker.settings import ActuatorSettings, PlacementSettings, SnapshotSettings
from broker.store import ClusterRecord, Store
from providers.base import ClusterDriver
from providers.errors import TransientError
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

BOOT_S = 90.0


def _cluster(name: str, *, nodes: int = 1, max_nodes: int = 4) -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=nodes,
                max_nodes=max_nodes, price_usd_per_hour=0.2)
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,), lat=38.9,
                   lon=-77.4)


def _driver(name: str, clock: ManualClock, nodes: int = 1) -> SimulatedClusterDriver:
    return SimulatedClusterDriver(name, [SimPool(name="cpu", nodes=nodes, cpu_per_node=4,
                                                 memory_gib_per_node=16)],
                                  clock=clock.now, boot_s=BOOT_S)


def _web(name: str, replicas: int, cpu: float = 2) -> WorkloadSpec:
    return WorkloadSpec(name=name, kind=WorkloadKind.SERVICE, image="nginx", replicas=replicas,
                        resources=Resources(cpu, 4, 0))


async def _setup(store: Store, clusters: Sequence[Cluster],  # noqa: F811
                 attrs: Mapping[str, Mapping[str, object]] | None = None) -> None:
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        for c in clusters:
            await uow.clusters.upsert(c, tenant="acme", attrs=(attrs or {}).get(c.name))


async def _submit(store: Store, spec: WorkloadSpec) -> str:  # noqa: F811
    async with store.unit() as uow:
        rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
    return rec.workload.id


def _loop(store: Store, clock: ManualClock,  # noqa: F811
          drivers: Mapping[str, ClusterDriver]) -> PlacementLoop:
    async def scalable(records: Sequence[ClusterRecord]) -> set[tuple[str, str]]:
        return scalable_pools(records, drivers=drivers, accounts={})

    return PlacementLoop(store, clock, PlacementSettings(), catalog=None, scalable=scalable)


async def _events(store: Store, prefix: str) -> list[tuple[str, dict[str, object]]]:  # noqa: F811
    async with store.unit() as uow:
        return [(e.kind, dict(e.data)) for e in await uow.events.list(limit=1000)
                if e.kind.startswith(prefix)]


async def test_the_planner_orders_a_node_the_actuator_adds_it_and_the_work_runs(
        store: Store) -> None:  # noqa: F811
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster("grow")])
    drivers: dict[str, ClusterDriver] = {"grow": _driver("grow", clock)}
    loop = _loop(store, clock, drivers)
    wid = await _submit(store, _web("web", 3))  # 6 cpu: one 4-cpu node is not enough
    plan = await loop.tick()
    assert plan is not None
    assert plan.scale == (PoolScale("grow", "cpu", 1),)
    async with store.unit() as uow:
        [order] = await uow.decisions.list_open(kinds=("scale",))
    assert (order.kind, order.key, order.spec["target_nodes"]) == ("scale", "pool:grow/cpu", 2)
    assert order.tenant == "acme"  # the cluster owner's event, not everyone's

    assert await Dispatcher(store, drivers, clock).dispatch_once() == 1
    act = Actuator(store, drivers, clock)
    await act.act_once()
    sim = drivers["grow"]
    assert isinstance(sim, SimulatedClusterDriver)
    assert sim.nodes_of("cpu") == ["grow-cpu-0", "grow-cpu-1"]  # ordered, booting
    assert [k for k, _ in await _events(store, "scale.")] == ["scale.ordered"]

    # While the node boots the loop counts it: a job that fits there orders nothing more.
    await _submit(store, _web("small", 1, cpu=1))
    snap = await loop.snapshot()
    assert snap is not None
    assert [p.nodes for p in snap.clusters[0].pools] == [2]
    plan = await loop.tick()
    assert plan is not None
    assert plan.scale == ()

    await act.act_once()  # not joined yet: the order stays open
    async with store.unit() as uow:
        opened = await uow.decisions.list_open(kinds=("scale",))
        assert [d.step for d in opened] == ["ordered"]
    clock.advance(BOOT_S)
    await act.act_once()
    async with store.unit() as uow:
        assert await uow.decisions.list_open(kinds=("scale",)) == []
        [rec] = await uow.clusters.list_records()
    assert rec.cluster.pools[0].nodes == 2  # the pool's registered count follows
    done = await _events(store, "scale.")
    assert [k for k, _ in done] == ["scale.ordered", "scale.done"]
    assert done[1][1]["nodes"] == 2

    await Dispatcher(store, drivers, clock).dispatch_once()
    await Reconciler(store, drivers, clock).reconcile_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING


async def test_a_done_order_measures_the_pools_boot_and_the_next_snapshot_charges_it(
        store: Store) -> None:  # noqa: F811
    """The order is done once its node is in the inventory, BOOT_S after it was placed: the
    actuator records that boot, and the loop's next snapshot gives the pool that boot
    (observed.py rule 6) instead of None, the planner's assumed 120 s."""
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster("grow")])
    drivers: dict[str, ClusterDriver] = {"grow": _driver("grow", clock)}
    loop = _loop(store, clock, drivers)
    await _submit(store, _web("web", 3))
    await InventoryPoller(store, drivers, clock).poll_once()
    before = await loop.snapshot()
    assert before is not None
    assert [p.boot_s for p in before.clusters[0].pools] == [None]
    plan = await loop.tick()
    assert plan is not None
    assert plan.scale == (PoolScale("grow", "cpu", 1),)
    await Dispatcher(store, drivers, clock).dispatch_once()
    act = Actuator(store, drivers, clock)
    await act.act_once()  # ordered
    clock.advance(BOOT_S)
    await act.act_once()  # joined: done
    done = await _events(store, "scale.done")
    assert [d["boot_s"] for _, d in done] == [pytest.approx(BOOT_S)]
    await InventoryPoller(store, drivers, clock).poll_once()  # as the running broker does
    after = await loop.snapshot()
    assert after is not None
    assert [p.boot_s for p in after.clusters[0].pools] == [pytest.approx(BOOT_S)]
    # The operator sees it where the planner's values are shown (GET /v1/clusters/{name}).
    merged, readings, record = await SnapshotReader(SnapshotSettings(), PlacementSettings()
                                                    ).cluster(store, "grow", tenant=None)
    assert isinstance(record, ClusterRecord)
    view = cluster_detail_view(cluster_view(record), merged, readings.inventory.get("grow"),
                               None, None, clock.now())
    assert [p["bootS"] for p in view["effective"]["pools"]] == [pytest.approx(BOOT_S)]
    assert [p["bootS"] for p in view["pools"]] == [None]  # the registration
    # A what-if of a stored placement prices with the same boot as the loop.
    async with store.unit() as uow:
        [placed] = await uow.placements.list_active(decisions=False)
    whatif, _ = await SnapshotReader(SnapshotSettings(), PlacementSettings()).whatif_snapshot(
        store, placed.id, tenant=None)
    assert [p.boot_s for p in whatif.clusters[0].pools] == [pytest.approx(BOOT_S)]


async def test_a_pool_that_cannot_scale_is_never_ordered_and_an_order_is_refused(
        store: Store) -> None:  # noqa: F811
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster("fixed")], {"fixed": {"scaling": {"enabled": False}}})
    drivers: dict[str, ClusterDriver] = {"fixed": _driver("fixed", clock)}
    loop = _loop(store, clock, drivers)
    wid = await _submit(store, _web("web", 3))
    snap = await loop.snapshot()
    assert snap is not None
    [pool] = snap.clusters[0].pools
    assert (pool.nodes, pool.max_nodes) == (1, 1)  # the planner sees it cannot grow
    plan = await loop.tick()
    assert plan is not None
    assert plan.scale == ()
    placed = {p.workload_id: p for p in plan.placements}
    assert placed[wid].placed_replicas == 1  # what fits on the one node; the rest waits
    assert all(a.new_nodes == 0 for a in placed[wid].assignments)

    # An order that reaches it anyway (an older plan) is refused, with the reason.
    order = EpochPlan(placements=(), unplaced={}, scale=(PoolScale("fixed", "cpu", 2),),
                      stats=SolveStats("heuristic", 0.0, None, None, 0.0, 0.0))
    async with store.unit() as uow:
        await record_decisions(uow, order, FederationSnapshot(
            now_s=clock.now(), clusters=(_cluster("fixed"),), pending=()),
            owners={"fixed": "acme"}, tenants={})
    await Actuator(store, drivers, clock).act_once()
    [(kind, data)] = await _events(store, "scale.")
    assert kind == "scale.refused"
    assert "attrs.scaling.enabled = false" in str(data["error"])
    assert isinstance(drivers["fixed"], SimulatedClusterDriver)
    assert drivers["fixed"].nodes_of("cpu") == ["fixed-cpu-0"]


async def test_scale_in_removes_the_named_empty_nodes(store: Store) -> None:  # noqa: F811
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster("big", nodes=3)])
    sim = _driver("big", clock, nodes=3)
    plan = EpochPlan(placements=(), unplaced={}, scale=(),
                     stats=SolveStats("heuristic", 0.0, None, None, 0.0, 0.0),
                     scale_in=(PoolScaleIn("big", "cpu", ("big-cpu-1", "big-cpu-2")),))
    async with store.unit() as uow:
        await record_decisions(uow, plan, FederationSnapshot(
            now_s=clock.now(), clusters=(_cluster("big", nodes=3),), pending=()),
            owners={}, tenants={})
    await Actuator(store, {"big": sim}, clock).act_once()
    assert sim.nodes_of("cpu") == ["big-cpu-0"]
    async with store.unit() as uow:
        [rec] = await uow.clusters.list_records()
    assert rec.cluster.pools[0].nodes == 1
    [(kind, data)] = await _events(store, "scale_in.")
    assert (kind, data["removed"]) == ("scale_in.done", ["big-cpu-1", "big-cpu-2"])


async def test_a_provider_error_backs_off_then_fails_with_the_error(
        store: Store) -> None:  # noqa: F811
    clock = ManualClock(1000.0)
    await _setup(store, [_cluster("down")])
    sim = _driver("down", clock)
    sim.set_down(True)
    plan = EpochPlan(placements=(), unplaced={}, scale=(PoolScale("down", "cpu", 1),),
                     stats=SolveStats("heuristic", 0.0, None, None, 0.0, 0.0))
    async with store.unit() as uow:
        await record_decisions(uow, plan, FederationSnapshot(
            now_s=clock.now(), clusters=(_cluster("down"),), pending=()),
            owners={}, tenants={})
    act = Actuator(store, {"down": sim}, clock,
                   settings=ActuatorSettings(retries=1, backoff_s=10, max_attempts=2))
    await act.act_once()
    async with store.unit() as uow:
        [d] = await uow.decisions.list_open(kinds=("scale",))
    assert (d.attempts, d.not_before_s) == (1, 1010.0)
    assert "unreachable" in d.last_error
    await act.act_once()  # backing off: nothing happens
    clock.advance(10)
    await act.act_once()
    async with store.unit() as uow:
        [d] = await uow.decisions.list(kind="scale")
    assert (d.state, d.attempts) == ("failed", 2)
    assert [k for k, _ in await _events(store, "scale.")] == ["scale.failed"]


async def test_the_planner_scales_in_nodes_idle_past_the_timer_and_the_actuator_removes_them(
        store: Store) -> None:  # noqa: F811
    """Issue 10 item 2: scale-in is the planner's decision (per-node idle timers from the
    polled inventory), recorded and carried out; not before the timer runs out."""
    clock = store.clock  # the store's clock: what the snapshot's `now` is
    assert isinstance(clock, ManualClock)
    await _setup(store, [_cluster("big", nodes=3)])
    sim = _driver("big", clock, nodes=3)
    drivers = {"big": sim}
    wid = await _submit(store, _web("web", 1))
    loop = _loop(store, clock, drivers)
    await loop.tick()
    await Dispatcher(store, drivers, clock).dispatch_once()
    await Reconciler(store, drivers, clock).reconcile_once()
    poller = InventoryPoller(store, drivers, clock)
    await poller.poll_once()  # two empty nodes: their timers start now
    clock.advance(100)
    await poller.poll_once()
    plan = await loop.tick()
    assert plan is not None
    # 100 s idle: not yet (lp's timer: DecisionConfig.forecast_idle_s, 120 s).
    assert plan.scale_in == ()
    clock.advance(301)
    await poller.poll_once()
    plan = await loop.tick()
    assert plan is not None
    [si] = plan.scale_in
    busy = [n for n in sim.nodes_of("cpu") if sim.replicas_on(n)]
    assert (si.cluster, si.pool, si.reason) == ("big", "cpu", "idle")
    assert sorted(si.nodes) == sorted(set(sim.nodes_of("cpu")) - set(busy))
    await Actuator(store, drivers, clock).act_once()
    assert sim.nodes_of("cpu") == busy
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING


async def test_idle_nodes_of_an_idle_federation_still_get_scaled_in(
        store: Store) -> None:  # noqa: F811
    clock = store.clock
    assert isinstance(clock, ManualClock)
    await _setup(store, [_cluster("big", nodes=2)])
    sim = _driver("big", clock, nodes=2)
    poller = InventoryPoller(store, {"big": sim}, clock)
    await poller.poll_once()  # nothing pending, nothing runs: the nodes' timers start
    clock.advance(601)
    await poller.poll_once()
    plan = await _loop(store, clock, {"big": sim}).tick()
    assert plan is not None  # idle nodes wake the planner, though nothing is pending or runs
    assert [sorted(si.nodes) for si in plan.scale_in] == [["big-cpu-0", "big-cpu-1"]]


async def _running_on_a_node(store: Store, clock: ManualClock, spec: WorkloadSpec,  # noqa: F811
                             ) -> tuple[str, SimulatedClusterDriver, str]:
    """`spec` placed, dispatched and running on one node of a 3-node cluster "big": (its
    id, the cluster's driver, the node it runs on)."""
    await _setup(store, [_cluster("big", nodes=3)])
    sim = _driver("big", clock, nodes=3)
    wid = await _submit(store, spec)
    await _loop(store, clock, {"big": sim}).tick()
    await Dispatcher(store, {"big": sim}, clock).dispatch_once()
    await Reconciler(store, {"big": sim}, clock).reconcile_once()
    [node] = [n for n in sim.nodes_of("cpu") if sim.replicas_on(n)]
    return wid, sim, node


async def _consolidate(store: Store, clock: ManualClock, node: str) -> None:  # noqa: F811
    plan = EpochPlan(placements=(), unplaced={}, scale=(),
                     stats=SolveStats("heuristic", 0.0, None, None, 0.0, 0.0),
                     scale_in=(PoolScaleIn("big", "cpu", (node,), reason="consolidate"),))
    async with store.unit() as uow:
        await record_decisions(uow, plan, FederationSnapshot(
            now_s=clock.now(), clusters=(_cluster("big", nodes=3),), pending=()),
            owners={}, tenants={})


async def test_a_consolidation_drains_the_restartable_job_on_its_node_then_removes_it(
        store: Store) -> None:  # noqa: F811
    """The `lp` rule's drains (placement/consolidate.py) were carried out live as idle
    scale-ins: the driver removes empty nodes only, so a busy node stayed and the decision
    said done. Now the job is stopped and requeued (it resumes from its checkpoint when the
    next epoch places it), and the emptied node goes."""
    clock = ManualClock(1000.0)
    job = WorkloadSpec(name="etl", kind=WorkloadKind.BATCH, image="etl", replicas=1,
                       resources=Resources(2, 4, 0), spot_ok=True, duration_s=3600.0)
    wid, sim, node = await _running_on_a_node(store, clock, job)
    await _consolidate(store, clock, node)
    await Actuator(store, {"big": sim}, clock).act_once()
    assert node not in sim.nodes_of("cpu")
    assert len(sim.nodes_of("cpu")) == 2
    async with store.unit() as uow:
        got = await uow.workloads.get(wid)
        [d] = await uow.decisions.list(kind="scale_in")
    assert got.workload.status is WorkloadStatus.PENDING
    assert got.message.startswith("consolidated: node big-cpu-")
    assert d.state == "done"
    [(_, done)] = await _events(store, "scale_in.")
    assert (done["removed"], done["drained"]) == ([node], [wid])
    assert [k for k, _ in await _events(store, "workload.consolidated")] == \
        ["workload.consolidated"]


async def test_a_consolidation_never_drains_a_service(store: Store) -> None:  # noqa: F811
    """A node that runs a service is refused whole: nothing is stopped or removed."""
    clock = ManualClock(1000.0)
    wid, sim, node = await _running_on_a_node(store, clock, _web("web", 1))
    await _consolidate(store, clock, node)
    await Actuator(store, {"big": sim}, clock).act_once()
    assert node in sim.nodes_of("cpu")
    assert sim.replicas_on(node)
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING
        [d] = await uow.decisions.list(kind="scale_in")
    assert d.state == "refused"
    assert "drains only restartable work" in d.last_error


async def test_a_consolidation_retried_after_a_failed_removal_does_not_drain_again(
        store: Store) -> None:  # noqa: F811
    """The drain is recorded before the removal: when the removal fails and the decision is
    tried again, the work the next epoch placed back on the emptied node is left running."""
    clock = ManualClock(1000.0)
    job = WorkloadSpec(name="etl", kind=WorkloadKind.BATCH, image="etl", replicas=1,
                       resources=Resources(2, 4, 0), spot_ok=True, duration_s=3600.0)
    wid, sim, node = await _running_on_a_node(store, clock, job)
    await _consolidate(store, clock, node)
    remove = sim.remove_nodes
    calls: list[Sequence[str]] = []

    async def fail_once(*, pool: str, nodes: Sequence[str]) -> int:
        calls.append(nodes)
        if len(calls) == 1:
            raise TransientError("throttled", provider="simulated")
        return await remove(pool=pool, nodes=nodes)

    sim.remove_nodes = fail_once  # type: ignore[method-assign]
    act = Actuator(store, {"big": sim}, clock,
                   settings=ActuatorSettings(retries=1, backoff_s=10, max_attempts=3))
    await act.act_once()
    async with store.unit() as uow:
        [d] = await uow.decisions.list_open(kinds=("scale_in",))
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.PENDING
    assert (d.step, d.spec["drained"], d.attempts) == ("drained", [wid], 1)
    # The next epoch places the job again, on the emptied node (the first with room).
    await _loop(store, clock, {"big": sim}).tick()
    await Dispatcher(store, {"big": sim}, clock).dispatch_once()
    await Reconciler(store, {"big": sim}, clock).reconcile_once()
    assert sim.replicas_on(node)
    clock.advance(10)
    await act.act_once()
    async with store.unit() as uow:
        assert (await uow.workloads.get(wid)).workload.status is WorkloadStatus.RUNNING
        [d] = await uow.decisions.list(kind="scale_in")
    assert d.state == "done"
    assert node in sim.nodes_of("cpu")  # not empty: the driver keeps it
    assert len(calls) == 2


async def test_the_live_loop_drains_a_lone_job_off_a_dear_node_and_places_it_again(
        store: Store) -> None:  # noqa: F811
    """The whole loop, live: lp's consolidation rule sees (from the polled inventory) a
    restartable job alone on a 3 USD/h node while a 0.2 USD/h node has room; the epoch's plan
    drains the dear node, the actuator stops and requeues the job and removes the node, and
    the next epoch places the job on the cheap node."""
    clock = store.clock
    assert isinstance(clock, ManualClock)
    small = Pool(name="small", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=1,
                 max_nodes=1, price_usd_per_hour=0.2)
    big = Pool(name="big", instance_type="m5.4xlarge", node=Resources(16, 64, 0), nodes=1,
               max_nodes=1, price_usd_per_hour=3.0)
    cluster = Cluster(name="mix", provider="aws", region="us-east-1", pools=(small, big),
                      lat=38.9, lon=-77.4)
    await _setup(store, [cluster])
    sim = SimulatedClusterDriver("mix", [SimPool(name="small", nodes=1, cpu_per_node=4,
                                                 memory_gib_per_node=16),
                                         SimPool(name="big", nodes=1, cpu_per_node=16,
                                                 memory_gib_per_node=64)],
                                 clock=clock.now, boot_s=BOOT_S)
    drivers: dict[str, ClusterDriver] = {"mix": sim}
    loop = _loop(store, clock, drivers)
    dispatch = Dispatcher(store, drivers, clock)
    reconcile = Reconciler(store, drivers, clock)
    poller = InventoryPoller(store, drivers, clock)

    async def epoch() -> EpochPlan:
        await poller.poll_once()
        plan = await loop.tick()
        assert plan is not None
        await dispatch.dispatch_once()
        await reconcile.reconcile_once()
        return plan

    web = await _submit(store, _web("web", 1, cpu=3.5))  # fills the cheap node
    await epoch()
    job = await _submit(store, WorkloadSpec(
        name="etl", kind=WorkloadKind.BATCH, image="etl", replicas=1,
        resources=Resources(2, 4, 0), spot_ok=True, duration_s=7200.0))
    await epoch()
    assert sim.replicas_on("mix-big-0")
    assert sim.replicas_on("mix-small-0")
    async with store.unit() as uow:
        await uow.workloads.cancel(web, tenant=None)
    await dispatch.withdraw_once()  # deletes what was cancelled
    assert not sim.replicas_on("mix-small-0")
    clock.advance(60)
    plan = await epoch()
    assert [(s.pool, s.nodes, s.reason) for s in plan.scale_in] == \
        [("big", ("mix-big-0",), "consolidate")]
    await Actuator(store, drivers, clock).act_once()
    assert sim.nodes_of("big") == []
    async with store.unit() as uow:
        assert (await uow.workloads.get(job)).workload.status is WorkloadStatus.PENDING
    await epoch()
    assert sim.replicas_on("mix-small-0")
    async with store.unit() as uow:
        assert (await uow.workloads.get(job)).workload.status is WorkloadStatus.RUNNING
