"""The twin's per-epoch shortcuts give the very snapshots and decisions of the plain path.

`SimConfig.reuse_observations` (sim/snapshot.py) keeps each pool's observed nodes until the
pool changes, and the merge's pool until one of its inputs changes; off, every node is read
and every pool merged every epoch. Both runs of a shipped scenario's first
hours must see equal snapshots and make equal plans at every epoch, and end with equal
metrics; and the shortcut must actually have been taken (else the test proves nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.domain import FederationSnapshot, Interconnect, PolicyAction, Resources
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.sim import snapshot as sim_snapshot
from broker.sim.engine import Engine, SimConfig
from broker.sim.metrics import Metrics
from broker.sim.scenario import ClusterSpec, PoolSpec, Scenario, load_scenario
from broker.sim.state import Node, SimCluster, SimPool, make_cluster
from providers.catalog import Catalog

SCENARIOS = Path(__file__).resolve().parents[2] / "config" / "scenarios"


def cut(name: str, hours: float) -> tuple[Scenario, Catalog]:
    """The first `hours` of a shipped scenario (also used by test_twin_determinism)."""
    catalog = Catalog.load()
    scn = load_scenario(SCENARIOS / name / "scenario.toml", catalog)
    end = hours * 3600.0
    return dataclasses.replace(scn, horizon_s=end, events=tuple(
        e for e in scn.events if e.submit_s < end)), catalog


def _record(scn: Scenario, catalog: Catalog, policy: str, *, reuse: bool
            ) -> tuple[list[tuple[FederationSnapshot, EpochPlan]], dict[str, object]]:
    seen: list[tuple[FederationSnapshot, EpochPlan]] = []

    def planner(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                name: str) -> EpochPlan:
        plan = plan_epoch(snap, action, cfg, policy=name)
        # Wall-clock timings aside, the plan is its decisions.
        seen.append((snap, dataclasses.replace(plan, stats=dataclasses.replace(
            plan.stats, build_s=0.0, solve_s=0.0))))
        return plan

    # The twin's planner stops on counted work, not the clock (PlannerConfig.deterministic),
    # so both runs decide alike however loaded the machine is.
    eng = Engine(scn, catalog, SimConfig(policy=policy, check_invariants=True,
                                         reuse_observations=reuse), planner=planner)
    return seen, eng.run()


@pytest.mark.parametrize(("name", "hours", "policy"), [
    ("edge-heavy", 1.1, "lp"),  # a site fails at 1 h: evictions, migrations; prewarm
    ("retail-peak", 0.6, "karpenter"),  # consolidation drains, spot hazard, scale-in
])
def test_reused_observations_give_the_same_snapshots_and_plans(
        name: str, hours: float, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scn, catalog = cut(name, hours)
    reads = 0
    observe = sim_snapshot.observe

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return observe(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sim_snapshot, "observe", counting)
    plain, plain_metrics = _record(scn, catalog, policy, reuse=False)
    plain_reads, reads = reads, 0
    fast, fast_metrics = _record(scn, catalog, policy, reuse=True)
    assert len(fast) == len(plain) > 20
    for i, ((snap_a, plan_a), (snap_b, plan_b)) in enumerate(zip(plain, fast, strict=True)):
        assert snap_b.clusters == snap_a.clusters, f"epoch {i} at {snap_a.now_s} s"
        assert snap_b == snap_a, f"epoch {i} at {snap_a.now_s} s"
        assert plan_b == plan_a, f"epoch {i} at {snap_a.now_s} s"
    assert fast_metrics.pop("decision_ms_p99") is not None
    plain_metrics.pop("decision_ms_p99")
    assert fast_metrics == plain_metrics
    assert reads < plain_reads / 2  # most pools were not read again
    # ... nor merged again: an unchanged pool is last epoch's Pool (placement MergeMemo).
    assert _kept_pools(fast) > _pool_count(fast) / 4
    assert _kept_pools(plain) == 0


def _kept_pools(run: list[tuple[FederationSnapshot, EpochPlan]]) -> int:
    """Pools that are the very object they were in the epoch before."""
    return sum(a is b for (prev, _), (snap, _) in itertools.pairwise(run)
               for c_prev, c in zip(prev.clusters, snap.clusters, strict=True)
               for a, b in zip(c_prev.pools, c.pools, strict=True))


def _pool_count(run: list[tuple[FederationSnapshot, EpochPlan]]) -> int:
    return sum(len(c.pools) for snap, _ in run[1:] for c in snap.clusters)


def _p4_cluster(*, nodes: int, max_nodes: int) -> SimCluster:
    """One cluster with one pool of 8-GPU NVLink nodes."""
    spec = PoolSpec(name="p4", instance_type="p4d.24xlarge", node=Resources(96.0, 1152.0, 8),
                    nodes=nodes, max_nodes=max_nodes, spot=False, price_usd_per_hour=32.0,
                    interconnect=Interconnect.NVLINK_PAIRS)
    return make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1",
                                    zones=("a",), lat=0.0, lon=0.0, pools=(spec,)))


def test_a_pool_read_again_equals_a_fresh_reading_whichever_node_value_changes() -> None:
    """`_read_nodes` keeps what it made of each node whose values and being up are as at
    the last reading: each value a reading looks at, changed alone on one node (and nodes
    coming up, added and removed), must give what a reading without the memo gives."""
    c = _p4_cluster(nodes=4, max_nodes=10)
    p = c.pools[0]
    pool = sim_snapshot.registration(c, 0.0).cluster.pools[0]
    n = p.node_list[1]

    def set_(attr: str, value: object) -> None:
        setattr(n, attr, value)

    changes = [
        lambda: set_("used_cpu", 12.0), lambda: set_("used_mem", 64.0),
        lambda: set_("gpu_free", 3), lambda: set_("idle_since", 50.0),
        lambda: set_("prewarmed", True), lambda: set_("underused_since", 70.0),
        lambda: set_("cordoned", True), lambda: set_("ready_at", 5000.0),  # booting again
        lambda: p.add_nodes(2, 4000.0), lambda: p.node_list.remove(p.node_list[0]),
        lambda: None]  # the booting nodes come up (the clock, below)
    now = 100.0
    sim_snapshot.pool_observation(c, p, pool, now)
    for i, change in enumerate(changes):
        change()
        p.changed()
        now = now + 100.0 if i < len(changes) - 1 else 6000.0
        got = sim_snapshot.pool_observation(c, p, pool, now)
        assert got == sim_snapshot.pool_observation(c, p, pool, now, reuse=False), f"change {i}"


def test_a_pool_read_again_after_single_node_changes_equals_a_fresh_reading() -> None:
    """Where only single nodes changed since the last reading (`SimPool.node_changed`:
    occupy, vacate, the idle timers), `_read_nodes` looks at those and the nodes booting then
    only: each such change, alone or several between readings, a booting node coming up, a
    node vacated after it went, and a change of the list or of many nodes (`changed()`), must
    give what a reading without the memo gives; and the short path must have been taken."""
    c = _p4_cluster(nodes=5, max_nodes=20)
    p = c.pools[0]
    pool = sim_snapshot.registration(c, 0.0).cluster.pools[0]
    p.add_nodes(2, 250.0)  # booting until 250 s
    nodes = list(p.node_list)
    gone = nodes[0]

    def idle(n: Node) -> None:
        n.idle_since = 42.0  # as applying.observe_idle does
        p.node_changed(n)

    def remove() -> None:
        p.node_list.remove(gone)
        p.changed()

    changes = [
        lambda: p.occupy(nodes[1], 12.0, 64.0, 3),
        lambda: p.occupy(nodes[3], 1.0, 1.0, 0),
        lambda: (p.occupy(nodes[2], 1.0, 2.0, 1), p.occupy(nodes[4], 2.0, 2.0, 2)),
        lambda: p.vacate(nodes[1], 12.0, 64.0, 3, 100.0),
        lambda: (p.occupy(nodes[0], 1.0, 1.0, 0), p.vacate(nodes[0], 1.0, 1.0, 0, 110.0)),
        lambda: idle(nodes[2]),
        lambda: p.occupy(nodes[5], 4.0, 4.0, 4),  # a booting node
        lambda: None,  # the booting nodes come up (the clock, below)
        lambda: p.vacate(nodes[5], 4.0, 4.0, 4, 300.0),
        remove,
        lambda: p.vacate(gone, 1.0, 1.0, 0, 400.0),  # a node vacated after it went
        lambda: [p.occupy(n, 0.5, 0.5, 0) for n in p.node_list * 2],  # many: compare all
        lambda: p.occupy(nodes[3], 1.0, 1.0, 1)]
    now = 100.0
    sim_snapshot.pool_observation(c, p, pool, now)
    short = 0
    for i, change in enumerate(changes):
        memo = p.node_memo
        change()
        now = 300.0 if i == 7 else now + 10.0
        got = sim_snapshot.pool_observation(c, p, pool, now)
        assert memo is not None
        assert p.node_memo is not None
        short += p.node_memo.index is memo.index  # the short path keeps the index
        assert got == sim_snapshot.pool_observation(c, p, pool, now, reuse=False), f"change {i}"
        assert p.touched == []
    assert short >= 8


def test_a_clusters_readings_are_kept_only_while_no_pool_changed_and_none_came_up() -> None:
    """`observations` hands the last mapping again while every pool's version is the same
    and no booting node came up: a change to either pool, or the clock passing a booting
    node's ready time, must give what a fresh reading gives."""
    shape = Resources(8.0, 32.0, 0)
    specs = tuple(PoolSpec(name=name, instance_type="m5.2xlarge", node=shape, nodes=2,
                           max_nodes=10, spot=False, price_usd_per_hour=0.4)
                  for name in ("a", "b"))
    c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1", zones=("z",),
                                 lat=0.0, lon=0.0, pools=specs))
    pools = sim_snapshot.registration(c, 0.0).cluster.pools
    a, b = c.pools
    b.add_nodes(1, 500.0)  # booting until 500 s
    now = 100.0

    def same() -> dict[str, object]:
        got = sim_snapshot.observations(c, pools, now)
        assert got == sim_snapshot.observations(c, pools, now, reuse=False)
        return dict(got)

    first = same()
    assert sim_snapshot.observations(c, pools, now) is sim_snapshot.observations(c, pools, now)
    a.occupy(a.node_list[0], 2.0, 4.0, 0)
    assert same() != first
    b.occupy(b.node_list[1], 1.0, 1.0, 0)
    same()
    now = 600.0  # the booting node is up
    assert same()["b"] != first["b"]


def test_a_members_inputs_are_kept_only_while_nothing_in_them_changed() -> None:
    """`member_inputs` hands last time's `Member` and `Inventory` again while health, quota,
    each pool's version, price and reclaims are the same and no booting node came up: each
    of them, changed alone, must give what fresh inputs give (and the same merged cluster),
    and the very objects must come back while nothing changed."""
    from broker.placement.snapshot import MergeInputs, merge

    shape = Resources(8.0, 32.0, 0)
    specs = tuple(PoolSpec(name=name, instance_type="m5.2xlarge", node=shape, nodes=2,
                           max_nodes=10, spot=True, price_usd_per_hour=0.4)
                  for name in ("a", "b"))
    c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1", zones=("z",),
                                 lat=0.0, lon=0.0, pools=specs, quota_vcpu=64.0))
    a, b = c.pools
    b.add_nodes(1, 500.0)  # booting until 500 s
    now = 100.0

    def price() -> None:
        a.price_factor = 1.5

    def reclaim() -> None:
        b.reclaims += 1

    def down() -> None:
        c.down_until = 150.0

    def quota() -> None:
        c.quota_vcpu = 32.0

    changes = [lambda: a.occupy(a.node_list[0], 2.0, 4.0, 0), price, reclaim, down,
               lambda: None, quota, lambda: None]  # the clock: back up at 150, booted at 500

    def same() -> tuple[object, ...]:
        member, inv = sim_snapshot.member_inputs(c, now)
        fresh, fresh_inv = sim_snapshot.member_inputs(c, now, reuse=False)
        assert member == fresh
        assert (inv.reclaims, inv.since_s, inv.observations) == (
            fresh_inv.reclaims, fresh_inv.since_s, fresh_inv.observations)
        merged = merge(MergeInputs(now_s=now, members=(member,), inventory={"c": inv}),
                       sim_snapshot.TWIN_MERGE)
        assert merged == merge(MergeInputs(now_s=now, members=(fresh,),
                                           inventory={"c": fresh_inv}),
                               sim_snapshot.TWIN_MERGE)
        return member, inv

    last = same()
    kept = sim_snapshot.member_inputs(c, now)
    assert all(x is y for x, y in zip(sim_snapshot.member_inputs(c, now), kept, strict=True))
    for i, change in enumerate(changes):
        change()
        now = {4: 200.0, 6: 600.0}.get(i, now + 1.0)
        got = same()
        assert got != last, f"change {i}"
        last = got


def test_a_pool_with_pods_kept_by_the_memo_equals_a_fresh_one_whichever_input_changes(
        ) -> None:
    """`with_pods` keeps a node's state with its workloads while the node, its pods and the
    state it is given are the same, and a cluster while it and its pools are: a replica
    coming or going, a node gone (the next one takes its index), a node read again, or one
    replica more of a workload already there, each alone, must give what a call without the
    memo gives."""
    from broker.sim.state import add_pod, remove_pod

    spec = PoolSpec(name="m5", instance_type="m5.2xlarge", node=Resources(8.0, 32.0, 0),
                    nodes=4, max_nodes=10, spot=False, price_usd_per_hour=0.4)
    c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1", zones=("z",),
                                 lat=0.0, lon=0.0, pools=(spec,)))
    p = c.pools[0]
    n0, n1, n2, _ = p.node_list
    now = 100.0
    memo = sim_snapshot.PodsMemo()

    def same() -> object:
        pool = sim_snapshot.registration(c, now).cluster.pools[0]
        pool = dataclasses.replace(pool, node_states=sim_snapshot.pool_observation(
            c, p, pool, now).node_states)
        got = sim_snapshot._pool_with_pods(memo, "c", pool, p)
        assert got == sim_snapshot._pool_with_pods(sim_snapshot.PodsMemo(), "c", pool, p)
        if any(n.pods for n in p.node_list):
            assert got.node_states == tuple(
                dataclasses.replace(st, workloads=tuple(n.pods))
                for st, n in zip(pool.node_states, p.node_list, strict=True))
        return got

    def place(n: Node, wid: str) -> None:
        p.occupy(n, 1.0, 1.0, 0)
        add_pod(wid, n, [])

    def leave(n: Node, wid: str) -> None:
        p.vacate(n, 1.0, 1.0, 0, now)
        remove_pod(wid, n, [])

    def swap() -> None:  # n1's replica leaves and another of the same shape comes
        remove_pod("w1", n1, [])
        add_pod("w3", n1, [])
        p.changed()

    def drop() -> None:
        p.node_list.remove(n0)
        p.changed()

    def timer() -> None:  # the state changes, not the pods
        p.node_list[0].underused_since = now
        p.node_changed(p.node_list[0])

    def twins() -> None:  # two nodes alike, with as many pod changes, different pods
        for n in p.node_list:
            while n.pods:
                leave(n, next(iter(n.pods)))
        p.add_nodes(2, 0.0)
        a, b = p.node_list[-2:]
        a.pods_version = b.pods_version = 0
        place(a, "w5")
        place(b, "w6")

    def drop_twin() -> None:
        p.node_list.remove(p.node_list[-2])
        p.changed()

    changes = [lambda: place(n0, "w1"), lambda: place(n1, "w1"), lambda: place(n1, "w2"),
               swap, lambda: add_pod("w2", n1, []) or p.changed(),
               lambda: leave(n1, "w2"), lambda: place(n2, "w4"), drop,
               lambda: leave(n2, "w4"), timer, twins, drop_twin]
    same()
    for i, change in enumerate(changes):
        change()
        now += 10.0
        assert same() is not None, f"change {i}"


def test_a_pool_holds_exactly_the_nodes_of_its_list_through_every_change() -> None:
    """`SimPool.holds` (`n in node_list` without a scan, kept until `changed()`): a node
    removed (scale-in, reclaim), a node added, a node of another pool; and `vacate` of a
    node gone gives nothing back to it."""
    spec = PoolSpec(name="m5", instance_type="m5.2xlarge", node=Resources(8.0, 32.0, 0),
                    nodes=3, max_nodes=10, spot=False, price_usd_per_hour=0.4)
    c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1", zones=("z",),
                                 lat=0.0, lon=0.0, pools=(spec, dataclasses.replace(
                                     spec, name="other"))))
    p, other = c.pools
    a, b, _ = p.node_list
    p.occupy(b, 2.0, 2.0, 0)
    assert all(map(p.holds, p.node_list))
    assert not any(map(p.holds, other.node_list))
    p.node_list.remove(b)
    p.changed()
    assert not p.holds(b)
    assert p.holds(a)
    p.vacate(b, 2.0, 2.0, 0, 10.0)
    assert b.used_cpu == 2.0  # gone: nothing given back to it
    p.add_nodes(2, 50.0)
    assert all(map(p.holds, p.node_list))
    assert len(p.node_list) == 4
    p.occupy(a, 1.0, 1.0, 0)  # not a change of the list: the cache stays
    p.node_list.remove(a)
    p.changed()
    assert not p.holds(a)


def test_the_demand_rates_are_each_pools_own_decayed_rates() -> None:
    """`_demand` computes one decay factor per distinct update time and multiplies in C:
    each pool's pair must be `decayed`'s numbers for its own rates and time, zeros zero."""
    from broker.placement.observed import decayed

    shape = Resources(8.0, 32.0, 0)
    specs = tuple(PoolSpec(name=name, instance_type="m5.2xlarge", node=shape, nodes=1,
                           max_nodes=10, spot=False, price_usd_per_hour=0.4)
                  for name in ("a", "b", "c", "d"))
    c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1", zones=("z",),
                                 lat=0.0, lon=0.0, pools=specs))
    pa, pb, pc, _ = c.pools  # d: no demand at all
    pa.add_demand(100.0, 3.7, 0.0, 900.0)
    pb.add_demand(100.0, 1.3, 2.0, 900.0)
    pc.add_demand(250.0, 0.1, 1.0, 900.0)  # another update time
    pc.add_freed(400.0, 0.05, 1.0, 900.0)  # a job that ended there
    pools = list(c.pools)
    engine = SimpleNamespace(now=1000.0, config=SimpleNamespace(demand_tau_s=900.0),
                             pools=pools, pool_keys=[("c", p.name) for p in pools])
    got, freed = sim_snapshot._demand(engine)  # type: ignore[arg-type]
    assert freed == {("c", "c"): (decayed(pc.freed_cpu_per_s, pc.demand_at_s, 1000.0, 900.0),
                                  decayed(pc.freed_gpu_per_s, pc.demand_at_s, 1000.0, 900.0))}
    assert got == {("c", p.name): (decayed(p.demand_cpu_per_s, p.demand_at_s, 1000.0, 900.0),
                                   decayed(p.demand_gpu_per_s, p.demand_at_s, 1000.0, 900.0))
                   for p in pools}
    assert got[("c", "d")] == (0.0, 0.0)
    assert got[("c", "b")] != (1.3 / 900.0, 2.0 / 900.0)  # decayed since


def test_idle_timers_looked_at_only_where_needed_equal_a_pass_over_every_node() -> None:
    """`observe_idle` looks only at nodes that came up since its last pass, until the pool's
    next `changed()`: each kind of change (a replica placed or gone, a node booting and up,
    GPUs taken and freed across nodes, a node added or removed) must leave the very timers
    a pass over every node leaves."""
    from broker.sim.applying import observe_idle

    spec = PoolSpec(name="p4", instance_type="p4d.24xlarge", node=Resources(96.0, 1152.0, 8),
                    nodes=3, max_nodes=10, spot=False, price_usd_per_hour=32.0)

    def engine(reuse: bool) -> SimpleNamespace:
        c = make_cluster(ClusterSpec(name="c", provider="aws", region="us-east-1",
                                     zones=("z",), lat=0.0, lon=0.0, pools=(spec,)))
        return SimpleNamespace(now=0.0, clusters={"c": c},
                               config=SimpleNamespace(reuse_observations=reuse))

    def spread_and_free(p: SimPool) -> None:  # a replica's GPUs over nodes, then freed
        taken = p.take_spread(10)
        assert taken is not None
        for n in taken:
            n.gpu_free += 1
        p.changed()

    def drop(p: SimPool) -> None:
        p.node_list.remove(p.node_list[0])
        p.changed()

    changes: list[Callable[[SimPool, float], object]] = [
        lambda p, t: p.occupy(p.node_list[0], 4.0, 4.0, 1),
        lambda p, t: p.vacate(p.node_list[0], 4.0, 4.0, 1, t),
        lambda p, t: p.add_nodes(2, t + 25.0),  # up before the next pass
        lambda p, t: p.occupy(p.node_list[-1], 1.0, 1.0, 0),  # a booting node
        lambda p, t: None,
        lambda p, t: spread_and_free(p),
        lambda p, t: p.occupy(p.node_list[1], 1.0, 1.0, 8),
        lambda p, t: drop(p),
        lambda p, t: p.vacate(p.node_list[0], 1.0, 1.0, 8, t),
        lambda p, t: p.add_nodes(1, t + 100.0),  # up three passes later
        lambda p, t: None, lambda p, t: None, lambda p, t: None]
    fast, full = engine(True), engine(False)
    for i, change in enumerate(changes):
        for eng in (fast, full):
            eng.now = 30.0 * (i + 1)
            change(eng.clusters["c"].pools[0], eng.now - 10.0)
            observe_idle(eng)  # type: ignore[arg-type]
        timers = [[n.idle_since for n in eng.clusters["c"].pools[0].node_list]
                  for eng in (fast, full)]
        assert timers[0] == timers[1], f"change {i}"


def test_the_rates_from_kept_terms_equal_a_fresh_sum() -> None:
    """`Metrics._rates` computes a pool's terms again only where its version or price factor
    moved, and sums them in C: a change to any pool (first, middle, last; nodes, usage,
    price) must give the very floats a sum from scratch gives, and a Python loop's."""
    def spec(name: str, gpu: int) -> PoolSpec:
        return PoolSpec(name=name, instance_type="x", node=Resources(8.0, 32.0, gpu), nodes=3,
                        max_nodes=10, spot=False, price_usd_per_hour=0.37 + gpu)

    clusters = {name: make_cluster(ClusterSpec(
        name=name, provider="aws", region="r", zones=("z",), lat=0.0, lon=0.0,
        pools=(spec("a", 0), spec("b", 4), spec("c", 0)))) for name in ("c1", "c2")}
    for k in range(40):  # many pools of awkward usage: any other order of sums rounds apart
        name = f"u{k}"
        clusters[name] = make_cluster(ClusterSpec(
            name=name, provider="aws", region="r", zones=("z",), lat=0.0, lon=0.0,
            pools=(spec("a", 0),)))
        clusters[name].pools[0].occupy(clusters[name].pools[0].node_list[0],
                                        0.1 * (k % 7) + 1e-3 * k, 0.3, 0)
    engine = SimpleNamespace(clusters=clusters)
    kept = Metrics(engine)  # type: ignore[arg-type]
    pools = [p for c in clusters.values() for p in c.pools]

    def rates(m: Metrics) -> tuple[float, ...]:
        m._rates()
        return (m.cost_rate, m.cpu_used, m.cpu_prov, m.gpu_used, m.gpu_prov)

    def loop() -> tuple[float, ...]:  # the sums, pool after pool, from 0.0
        cost = cpu_p = cpu_u = gpu_p = gpu_u = 0.0
        for p in pools:
            n, gpus = p.nodes, p.node.gpu
            cost += n * p.price_usd_per_hour
            cpu_p += n * p.node.cpu
            cpu_u += p.used_cpu
            gpu_p += n * gpus
            gpu_u += p.used_gpu
        return (cost / 3600.0, cpu_u, cpu_p, gpu_u, gpu_p)

    rates(kept)
    changes = [
        lambda: pools[0].occupy(pools[0].node_list[0], 0.1, 0.3, 0),
        lambda: pools[3].occupy(pools[3].node_list[1], 1.7, 2.0, 3),
        lambda: pools[-1].add_nodes(2, 10.0),
        lambda: setattr(pools[2], "price_factor", 1.3),
        lambda: pools[4].vacate(pools[4].node_list[0], 0.0, 0.0, 0, 5.0),
        lambda: None]
    for i, change in enumerate(changes):
        change()
        assert rates(kept) == rates(Metrics(engine)), f"change {i}"  # type: ignore[arg-type]
        assert rates(kept) == loop(), f"change {i}"
