"""Scale-in timers under a bin-packing scheduler (docs/twin.md, "where new work lands").

Pools are made of nodes: only a node with nothing on it is idle and may go."""

from __future__ import annotations

from broker.domain import Resources
from broker.sim.applying import named_node, node_name
from broker.sim.scenario import ClusterSpec, PoolSpec
from broker.sim.state import Node, SimCluster, SimPool


def _pool(n_nodes: int) -> SimPool:
    spec = PoolSpec(name="p", instance_type="p", node=Resources(4.0, 16.0, 0), nodes=n_nodes,
                    max_nodes=10, spot=False, price_usd_per_hour=1.0)
    return SimPool(spec=spec, cluster="c", node_list=[Node(0.0, 0) for _ in range(n_nodes)])


def test_work_that_fits_busy_nodes_keeps_idle_timers() -> None:
    # Bin-packing: the new replica goes on the busy node with room; empty nodes keep timers.
    p = _pool(3)
    p.occupy(p.node_list[0], 3.0, 3.0, 0)
    p.node_list[1].idle_since = 100.0
    p.node_list[2].idle_since = 200.0
    home = p.best_node(1.0, 1.0, 0, now=300.0)
    assert home is p.node_list[0]
    p.occupy(home, 1.0, 1.0, 0)
    assert [n.idle_since for n in p.node_list] == [None, 100.0, 200.0]
    assert [n.idle_since for n in p.idle_nodes(300.0)] == [100.0, 200.0]


def test_a_node_with_work_is_never_idle_and_its_timer_starts_when_it_empties() -> None:
    p = _pool(2)
    p.occupy(p.node_list[0], 1.0, 1.0, 0)
    p.occupy(p.node_list[1], 1.0, 1.0, 0)
    assert p.idle_nodes(10.0) == []  # 2 vCPU of 8 in use, yet no node may go
    p.vacate(p.node_list[1], 1.0, 1.0, 0, now=50.0)
    assert p.idle_nodes(60.0) == [p.node_list[1]]
    assert p.node_list[1].idle_since == 50.0


def test_baseline_totals_replay_fixed_weight_lp() -> None:
    # The relative reward's baseline is fixed-weight lp itself: same cost, sorted times.
    from typing import cast

    from broker.sim.train import baseline_totals
    from tests.unit.test_twin_engine import doc, run, scenario
    from tests.unit.test_twin_scenario import FakeCatalog

    trace = "".join(f"j{i},{i * 200},batch,2,1,1,0,600,,,0,,0\n" for i in range(8))
    scn = scenario(doc(nodes=1, max_nodes=6, horizon_s=2400.0), trace)
    ts, tot = baseline_totals(scn, FakeCatalog(), 300.0)
    from broker.sim.realize import TwinNoise

    lp, _ = run(scn, "lp", noise=TwinNoise())  # the defaults baseline_totals runs with
    assert list(ts) == sorted(ts)
    assert ts[-1] == 2400.0
    assert all(b >= a - 1e-9 for a, b in zip(tot[:-1, 0], tot[1:, 0], strict=True))
    assert abs(float(tot[-1, 0]) - float(cast(float, lp["cost_usd"]))) < 0.01


def test_a_node_is_found_by_its_snapshot_name_and_nothing_else() -> None:
    p = _pool(12)
    c = SimCluster(spec=ClusterSpec(name="c", provider="aws", region="r", zones=(), lat=0.0,
                                    lon=0.0, pools=(p.spec,)), pools=[p])
    for i, n in enumerate(p.node_list):
        assert named_node(c, p, node_name(c, p, i)) is n
    for name in ("c/p/12", "c/p/01", "c/p/", "c/p/-1", "c/q/1", "d/p/1", "c/p/1 ", "c/p/²",
                 "1", "x/c/p/1"):
        assert named_node(c, p, name) is None, name
