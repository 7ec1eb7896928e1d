"""Measured boot times (observed.py rule 6): the packing model charges a new node the boot
its pool was seen to take, not the 120 s it assumes, and the twin measures its own orders."""

from __future__ import annotations

import dataclasses
import math

import pytest

from broker.domain import Cluster, PolicyAction, Resources, WorkloadKind
from broker.federation.decision_log import measured_boots
from broker.placement.candidates import NODE_BOOT_S, boot_estimates, build_candidates
from broker.placement.decisions import DecisionConfig
from broker.placement.observed import BOOT_SAMPLES, Inventory, boot_s, observed_pools
from broker.placement.planner import PlannerConfig, candidates, plan_epoch
from broker.sim.scenario import PoolSpec
from broker.sim.snapshot import build_snapshot
from broker.sim.state import SimPool
from broker.store import DecisionRecord

from .placement_world import pool, snapshot, workload
from .test_twin_engine import doc, run, scenario

ACTION = PolicyAction()


def test_a_pools_boot_is_the_median_of_its_last_measured_boots() -> None:
    assert boot_s([]) is None
    assert boot_s([300.0]) == 300.0
    assert boot_s([100.0, 300.0, 200.0]) == 200.0
    assert boot_s([100.0, 300.0]) == 200.0
    # Only the last BOOT_SAMPLES count: an old slow boot ages out.
    assert boot_s([5000.0] + [90.0] * BOOT_SAMPLES) == 90.0
    # Hostile readings are not boots.
    assert boot_s([math.nan, -5.0, math.inf, 1e12, 120.0]) == 120.0
    assert boot_s([math.nan]) is None


def test_the_merge_writes_the_inventorys_measured_boot_into_its_pool() -> None:
    pools = (pool("a", price=1.0), dataclasses.replace(pool("b", price=1.0), boot_s=90.0))
    out, stray = observed_pools(pools, Inventory(observed_s=10.0, boots={"a": 300.0}), 10.0)
    assert stray == 0
    assert [p.boot_s for p in out] == [300.0, 90.0]  # b: nothing new measured, kept
    out, _ = observed_pools(pools, Inventory(observed_s=10.0), 10.0)
    assert [p.boot_s for p in out] == [None, 90.0]


def _cluster(name: str, provider: str, boot: float | None, price: float = 1.0) -> Cluster:
    return Cluster(name=name, provider=provider, region="r",
                   pools=(dataclasses.replace(pool("p", price=price, nodes=0), boot_s=boot),))


def test_a_pool_not_measured_takes_its_providers_boot_then_any_measured_boot() -> None:
    """A pool nobody opened yet must not look cheaper to open than one that was measured:
    its provider's median, else every measured pool's, and the assumed boot only while
    nothing was measured."""
    clusters = (_cluster("aws-1", "aws", 300.0), _cluster("aws-2", "aws", None),
                _cluster("gcp-1", "gcp", None), _cluster("azure-1", "azure", 60.0),
                _cluster("azure-2", "azure", None))
    est = boot_estimates(clusters, NODE_BOOT_S)
    assert est["aws-1", "p"] == 300.0
    assert est["aws-2", "p"] == 300.0  # its provider's
    assert est["azure-2", "p"] == 60.0
    assert est["gcp-1", "p"] == 180.0  # no gcp boot measured: the median of 300 and 60
    nothing = tuple(_cluster(c.name, c.provider, None) for c in clusters)
    assert set(boot_estimates(nothing, NODE_BOOT_S).values()) == {NODE_BOOT_S}
    assert set(boot_estimates(clusters, NODE_BOOT_S, observed=False).values()) == \
        {NODE_BOOT_S}


def test_the_node_charge_counts_the_measured_boot() -> None:
    """price x (boot + idle timer + span): with the boot measured at 300 s the charge counts
    300 s; with DecisionConfig.observed_boot off, the assumed NODE_BOOT_S."""
    w = workload("j", kind=WorkloadKind.BATCH, duration_s=1800.0)
    snap = snapshot((w,), clusters=(_cluster("slow", "aws", 300.0, price=0.30),
                                    _cluster("unseen", "aws", None, price=0.40)))
    cfg = PlannerConfig(time_limit_s=2.0)
    idle = cfg.decisions.forecast_idle_s
    cs = candidates(snap, ACTION, cfg)
    assert cs.node_usd is not None
    assert cs.node_usd[0] == pytest.approx(0.30 * (300.0 + idle + 1800.0) / 3600.0)
    assert cs.node_usd[1] == pytest.approx(0.40 * (300.0 + idle + 1800.0) / 3600.0)
    off = dataclasses.replace(cfg, decisions=DecisionConfig(observed_boot=False))
    assumed = candidates(snap, ACTION, off)
    assert assumed.node_usd is not None
    assert assumed.node_usd[0] == pytest.approx(0.30 * (NODE_BOOT_S + idle + 1800.0) / 3600.0)
    # build_candidates' own default is the assumed boot (callers opt in).
    plain = build_candidates(snap, ACTION, k=4, service_horizon_h=1.0, packing=True,
                             node_idle_s=idle)
    assert plain.node_usd is not None
    assert plain.node_usd[0] == pytest.approx(assumed.node_usd[0])


def test_a_measured_slow_boot_moves_a_short_job_to_the_pool_that_boots_fast() -> None:
    """Two clouds, no node running: the cheaper one boots in 15 minutes, the dearer in one.
    For a 10 s job the boot is most of what a new node costs: charged the assumed 120 s
    everywhere, lp opens the cheaper cloud's node; charged what was measured, the other."""
    w = workload("j", kind=WorkloadKind.BATCH, duration_s=10.0)
    clusters = (_cluster("slow", "aws", 900.0, price=0.30),
                _cluster("fast", "gcp", 60.0, price=0.32))
    snap = snapshot((w,), clusters=clusters)
    cfg = PlannerConfig(time_limit_s=2.0)
    off = dataclasses.replace(cfg, decisions=DecisionConfig(observed_boot=False))

    def where(config: PlannerConfig) -> set[str]:
        plan = plan_epoch(snap, ACTION, config)
        assert plan.unplaced == {}
        return {a.cluster for p in plan.placements for a in p.assignments}

    assert where(off) == {"slow"}
    assert where(cfg) == {"fast"}


def test_the_twin_measures_the_boot_of_the_nodes_it_orders() -> None:
    """An empty pool (provision_delay_s 100 s) scales out for a service at t=0: its boot is
    unknown until the node is up, then 100 s, and the snapshot the planner reads says so."""
    scn = scenario(doc(nodes=0, max_nodes=2), "s,0,service,1,1,1,0,,,,0,,1\n")
    _, eng = run(scn, "lp")
    p = eng.clusters["c1"].pools[0]
    assert p.boots, "the scale-out was not recorded"
    ready_at, took = p.boots[0]
    assert took == pytest.approx(100.0)
    assert p.observed_boot_s(ready_at - 1.0) is None
    assert p.observed_boot_s(ready_at) == pytest.approx(100.0)
    snap = build_snapshot(eng, [])
    assert [q.boot_s for c in snap.clusters for q in c.pools] == [pytest.approx(100.0)]


def _order(cluster: str, pool: str, boot: object, *, state: str = "done",
           kind: str = "scale") -> DecisionRecord:
    return DecisionRecord(id=0, kind=kind, key=f"pool:{cluster}/{pool}", tenant=None,
                          cluster=cluster, pool=pool, workload_id="",
                          spec={"target_nodes": 2, "boot_s": boot}, state=state)


def test_the_live_boot_is_the_median_of_a_pools_last_done_orders() -> None:
    """Newest first, as the store lists them: only done orders with a numeric boot count,
    and only the newest BOOT_SAMPLES of a pool."""
    newest_first = ([_order("a", "p", 60.0)] * BOOT_SAMPLES + [_order("a", "p", 900.0)]
                    + [_order("b", "q", 200.0), _order("b", "q", 100.0, state="failed"),
                       _order("b", "q", "300"), _order("b", "q", True),
                       _order("c", "r", 50.0, kind="scale_in")])
    assert measured_boots(newest_first) == {"a": {"p": 60.0}, "b": {"q": 200.0}}
    assert measured_boots([]) == {}


def test_a_sim_pools_boot_follows_its_orders_as_they_come_up() -> None:
    """What the snapshot reads each epoch (cached between a pool's orders coming up): the
    median of the orders up by then, a new order counted once its nodes are up."""
    p = SimPool(spec=PoolSpec("p", "cpu4", Resources(4, 16, 0), nodes=0, max_nodes=8,
                              spot=False, price_usd_per_hour=1.0),
                cluster="c", node_list=[])
    assert p.observed_boot_s(0.0) is None
    assert p.add_nodes(1, ready_at=100.0, ordered_at=0.0) == 1
    assert p.observed_boot_s(50.0) is None
    assert p.observed_boot_s(100.0) == 100.0
    assert p.add_nodes(1, ready_at=500.0, ordered_at=200.0) == 1  # a slower boot, 300 s
    assert p.observed_boot_s(400.0) == 100.0  # not up yet
    assert p.observed_boot_s(500.0) == 200.0  # the median of 100 and 300
    assert p.observed_boot_s(450.0) == 100.0  # an earlier time is read again, not cached
    assert p.add_nodes(1, ready_at=560.0, ordered_at=500.0) == 1  # 60 s
    assert p.observed_boot_s(600.0) == 100.0  # the median of 60, 100 and 300
    assert p.add_nodes(0, ready_at=700.0, ordered_at=600.0) == 0  # no node: no boot
    assert len(p.boots) == 3
