"""Migrations: start at the new place, wait until ready, switch, drain; never below replicas.

The actuator "crashes" (is thrown away, a new one built on the same store) between every
step, and once between a side effect and its record; a node tainted for termination gets its
replicas moved before it disappears. Real store, simulated member clusters whose replicas
take `STARTUP_S` to become ready.
"""

from __future__ import annotations

import pytest

from broker.clock import ManualClock
from broker.domain import (
    Assignment,
    Cluster,
    FederationSnapshot,
    Placement,
    Pool,
    PricingModel,
    Resources,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.federation.actuator import Actuator
from broker.federation.decision_log import record_decisions
from broker.federation.dispatcher import Dispatcher
from broker.federation.inventory import InventoryPoller
from broker.federation.migration import Migrator
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.placement.planner import EpochPlan, Migration, SolveStats
from broker.settings import PlacementSettings
from broker.store import Store
from providers.errors import NotFoundError
from providers.simulated import SimPool, SimulatedClusterDriver
from tests.integration.test_placement_loop import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

STARTUP_S = 30.0
REPLICAS = 3
TERMINATION_TAINT = "aws-node-termination-handler/spot-itn=true:NoSchedule"


def _cluster(name: str, price: float) -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=2,
                max_nodes=2, price_usd_per_hour=price)
    return Cluster(name=name, provider="aws", region="us-east-1", pools=(pool,), lat=38.9,
                   lon=-77.4)


class World:
    """Two clusters, one workload running on the cheaper one ("old")."""

    def __init__(self, store: Store, new_price: float = 0.3) -> None:  # noqa: F811
        self.store = store
        self.new_price = new_price
        self.clock = ManualClock(1000.0)
        self.drivers = {n: SimulatedClusterDriver(
            n, [SimPool(name="cpu", nodes=2, cpu_per_node=4, memory_gib_per_node=16)],
            clock=self.clock.now, startup_s=STARTUP_S) for n in ("old", "new")}
        self.wid = ""

    async def start(self) -> None:
        async with self.store.unit() as uow:
            await uow.tenants.ensure("acme")
            await uow.clusters.upsert(_cluster("old", 0.1), tenant="acme")
            await uow.clusters.upsert(_cluster("new", self.new_price), tenant="acme")
            spec = WorkloadSpec(name="web", kind=WorkloadKind.SERVICE, image="nginx",
                                replicas=REPLICAS, resources=Resources(1, 2, 0))
            rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
        self.wid = rec.workload.id
        await PlacementLoop(self.store, self.clock, PlacementSettings(), catalog=None).tick()
        await Dispatcher(self.store, self.drivers, self.clock).dispatch_once()
        self.clock.advance(STARTUP_S)
        await self.reconcile()
        assert await self.status() is WorkloadStatus.RUNNING
        assert await self.ready("old") == REPLICAS

    async def plan(self) -> EpochPlan:
        """What the planner decides now, from the polled inventory (recorded as live)."""
        await InventoryPoller(self.store, self.drivers, self.clock).poll_once()
        plan = await PlacementLoop(self.store, self.clock, PlacementSettings(),
                                   catalog=None).tick()
        assert plan is not None
        return plan

    async def set_price(self, cluster: str, price: float) -> None:
        async with self.store.unit() as uow:
            await uow.clusters.upsert(_cluster(cluster, price), tenant="acme")

    async def reconcile(self) -> None:
        await Reconciler(self.store, self.drivers, self.clock).reconcile_once()

    async def status(self) -> WorkloadStatus:
        async with self.store.unit() as uow:
            return (await uow.workloads.get(self.wid)).workload.status

    async def ready(self, cluster: str) -> int:
        try:
            return (await self.drivers[cluster].status(workload_id=self.wid)).ready_replicas
        except NotFoundError:
            return 0

    async def serving(self) -> int:
        return await self.ready("old") + await self.ready("new")

    async def active_clusters(self) -> set[str]:
        async with self.store.unit() as uow:
            rec = await uow.placements.get_active_for_workload(self.wid)
        assert rec is not None
        return {a.cluster for a in rec.placement.assignments}

    async def decide_move(self, reason: str) -> None:
        """What the planner decides (hand-built here): move every replica to `new`."""
        source = (Assignment("old", "cpu", PricingModel.ON_DEMAND, REPLICAS, 0.3),)
        target = Placement(self.wid, (Assignment("new", "cpu", PricingModel.ON_DEMAND,
                                                 REPLICAS, 0.9),), 0.9)
        plan = EpochPlan(placements=(), unplaced={}, scale=(),
                         stats=SolveStats("heuristic", 0.0, None, None, 0.0, 0.0),
                         migrations=(Migration(self.wid, source, target, reason),))
        async with self.store.unit() as uow:
            await record_decisions(uow, plan, FederationSnapshot(
                now_s=self.clock.now(), clusters=(), pending=()), owners={},
                tenants={self.wid: "acme"})

    def actuator(self) -> Actuator:
        """A fresh actuator: whatever the last one knew in memory is gone (a crash)."""
        return Actuator(self.store, self.drivers, self.clock)

    async def events(self) -> list[str]:
        async with self.store.unit() as uow:
            return [e.kind for e in await uow.events.list(subject=self.wid, limit=100)
                    if e.kind.startswith("migration.")]


async def test_migration_survives_a_crash_at_every_step_and_never_drops_a_replica(
        store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    await w.decide_move("recovered")
    async with store.unit() as uow:
        [rec] = await uow.decisions.list_open(kinds=("migration",))
    # Crash after the first side effect, before its record: the target was applied ...
    await Migrator(store, w.drivers).advance(rec, w.clock.now())
    assert await w.drivers["new"].list_status() != []
    # ... and the next actuator applies it again (a no-op) and records the step.
    await w.actuator().act_once()
    assert await w.events() == ["migration.started"]
    assert [s.desired_replicas for s in await w.drivers["new"].list_status()] == [REPLICAS]
    assert await w.serving() >= REPLICAS
    # The reconciler sees the target's replicas, placed nowhere yet: it leaves them alone.
    await w.reconcile()
    assert await w.drivers["new"].list_status() != []
    await w.actuator().act_once()  # not ready yet: the source keeps serving
    assert await w.active_clusters() == {"old"}
    assert await w.serving() >= REPLICAS

    w.clock.advance(STARTUP_S)
    await w.actuator().act_once()  # ready: switch (the placement moves) ...
    assert await w.events() == ["migration.started", "migration.switched"]
    assert await w.active_clusters() == {"new"}
    assert await w.status() is WorkloadStatus.RUNNING
    assert await w.ready("new") == REPLICAS
    assert await w.ready("old") == REPLICAS
    await w.actuator().act_once()  # ... then drain, by an actuator that crashed in between
    assert await w.events() == ["migration.started", "migration.switched", "migration.done"]
    assert await w.ready("old") == 0
    assert await w.drivers["old"].list_status() == []
    assert await w.ready("new") == REPLICAS
    async with store.unit() as uow:
        [done] = await uow.decisions.list(kind="migration")
        assert (await uow.placements.get_active_for_workload(w.wid)) is not None
    assert done.state == "done"
    await w.reconcile()
    assert await w.ready("new") == REPLICAS  # no orphan clean-up touches the new home


async def test_node_tainted_for_termination_has_its_replicas_moved_before_it_goes(
        store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    spot = w.drivers["old"]
    [node] = [n for n in spot.nodes_of("cpu") if spot.replicas_on(n)]
    spot.taint_node(node, TERMINATION_TAINT)  # the interruption notice: ~2 minutes left
    inv = {n.name: n for n in await spot.inventory()}
    assert TERMINATION_TAINT in inv[node].taints
    assert w.wid in inv[node].workloads
    # The planner sees the leaving node in the polled inventory and moves what runs there.
    [m] = (await w.plan()).migrations
    assert (m.workload_id, m.reason) == (w.wid, "node-loss")
    assert {a.cluster for a in m.target.assignments} == {"new"}
    async with store.unit() as uow:
        [rec] = await uow.decisions.list_open(kinds=("migration",))
    assert rec.spec["reason"] == "node-loss"
    act = w.actuator()
    await act.act_once()
    w.clock.advance(STARTUP_S)
    await act.act_once()
    await act.act_once()
    assert await w.ready("new") == REPLICAS
    assert spot.replicas_on(node) == 0  # drained before the node disappears
    spot.remove_node(node)
    assert await w.serving() == REPLICAS
    assert await w.active_clusters() == {"new"}


async def test_a_migration_whose_workload_was_requeued_meanwhile_is_superseded(
        store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    await w.decide_move("better")
    await w.actuator().act_once()  # target started
    async with store.unit() as uow:  # the source cluster failed: the reconciler requeued it
        await uow.workloads.requeue(w.wid, reason="cluster old is unhealthy")
    await w.actuator().act_once()
    assert await w.events() == ["migration.started", "migration.superseded"]
    assert await w.drivers["new"].list_status() == []  # the half-started target is gone


async def test_failover_remembers_the_cluster_and_moving_back_forgets_it(
        store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    w.drivers["old"].set_down(True)
    rec = Reconciler(store, w.drivers, w.clock, down_after=1)
    await rec.reconcile_once()
    assert rec.requeued == [w.wid]
    async with store.unit() as uow:
        assert await uow.workloads.displaced([w.wid]) == {w.wid: ("old",)}
    w.drivers["old"].set_down(False)
    # Re-placed on "new" (what the planner does once "old" is out) and running there ...
    target = Placement(w.wid, (Assignment("new", "cpu", PricingModel.ON_DEMAND, REPLICAS,
                                          0.9),), 0.9)
    async with store.unit() as uow:
        pid = await uow.placements.record(target)
        assert pid is not None
    await Dispatcher(store, w.drivers, w.clock).dispatch_once()
    w.clock.advance(STARTUP_S)
    await w.reconcile()
    # ... "old" is back: the planner moves it home ("recovered"), the actuator carries it out.
    await rec.reconcile_once()  # the reconciler that marked it down sees it answer again
    [m] = (await w.plan()).migrations
    assert (m.reason, {a.cluster for a in m.target.assignments}) == ("recovered", {"old"})
    act = w.actuator()
    await act.act_once()
    w.clock.advance(STARTUP_S)
    await act.act_once()
    await act.act_once()
    assert await w.active_clusters() == {"old"}
    assert await w.ready("new") == 0
    async with store.unit() as uow:
        assert await uow.workloads.displaced([w.wid]) == {}


async def test_the_planner_moves_home_once_and_does_not_flap(store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    w.drivers["old"].set_down(True)
    rec = Reconciler(store, w.drivers, w.clock, down_after=1)
    await rec.reconcile_once()
    plan = await w.plan()  # re-placed on "new" while "old" is down
    assert {a.cluster for p in plan.placements for a in p.assignments} == {"new"}
    await Dispatcher(store, w.drivers, w.clock).dispatch_once()
    w.clock.advance(STARTUP_S)
    w.drivers["old"].set_down(False)
    await rec.reconcile_once()  # "old" answers again: healthy
    [home] = (await w.plan()).migrations
    assert home.reason == "recovered"
    act = w.actuator()
    await act.act_once()
    w.clock.advance(STARTUP_S)
    await act.act_once()
    await act.act_once()
    assert await w.active_clusters() == {"old"}
    # Home again: "new" is dearer, nothing moves back, epoch after epoch.
    for _ in range(3):
        w.clock.advance(10)
        assert (await w.plan()).migrations == ()
    assert await w.events() == ["migration.started", "migration.switched", "migration.done"]


async def test_a_marginally_better_option_does_not_migrate_a_clearly_better_one_does(
        store: Store) -> None:  # noqa: F811
    w = World(store)
    await w.start()
    await w.set_price("new", 0.095)  # 5 % cheaper than "old": under the hysteresis
    assert (await w.plan()).migrations == ()
    await w.set_price("new", 0.01)  # a tenth of the price: worth a move
    [m] = (await w.plan()).migrations
    assert (m.reason, {a.cluster for a in m.target.assignments}) == ("better", {"new"})
    assert m.saving_usd_per_hour > 0
    async with store.unit() as uow:
        [rec] = await uow.decisions.list_open(kinds=("migration",))
    assert rec.spec["reason"] == "better"

