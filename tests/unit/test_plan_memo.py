"""plan_epoch with a memo kept across epochs plans what it plans without one (memo.py)."""

from __future__ import annotations

import dataclasses

from broker.domain import Cluster, FederationSnapshot, PolicyAction, WorkloadKind
from broker.placement.candidates import options_and_table
from broker.placement.memo import PlanMemo
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from tests.unit.placement_world import federation, snapshot, workload

CONFIG = PlannerConfig(explain=False, deterministic=True)


def _plan(snap: FederationSnapshot, memo: PlanMemo | None) -> EpochPlan:
    plan = plan_epoch(snap, PolicyAction(), CONFIG, memo=memo)
    return dataclasses.replace(plan, stats=dataclasses.replace(plan.stats, build_s=0.0,
                                                               solve_s=0.0))


def _where(plan: EpochPlan) -> dict[str, set[str]]:
    return {p.workload_id: {a.cluster for a in p.assignments} for p in plan.placements}


def test_a_memo_kept_across_epochs_gives_the_plans_a_fresh_one_gives() -> None:
    memo = PlanMemo()
    batches = [
        (workload("a", replicas=3, user_region="nyc", latency_slo_ms=30.0),),
        (workload("b", replicas=2, user_region="amsterdam", latency_slo_ms=25.0),
         workload("c", kind=WorkloadKind.BATCH, replicas=4, duration_s=3600.0)),
        (workload("d", replicas=1, user_region="nyc", latency_slo_ms=12.0),),
    ]
    for batch in batches:
        snap = snapshot(batch)
        assert _plan(snap, memo) == _plan(snap, None)
    assert memo.rtt, "the memo kept nothing: the test would not show reuse"


def test_a_new_rtt_map_is_not_answered_from_the_memo() -> None:
    """The same places, another measured RTT: the memo's RTTs of the old map must go."""
    memo = PlanMemo()
    batch = (workload("s", replicas=1, user_region="nyc", latency_slo_ms=20.0),)
    near = snapshot(batch, rtt_ms={("nyc", "gcp-euw4"): 3.0})
    assert _where(_plan(near, memo)) == _where(_plan(near, None))
    far = snapshot(batch, rtt_ms={("nyc", "gcp-euw4"): 300.0})
    fresh = _plan(far, None)
    assert _plan(far, memo) == fresh
    assert "gcp-euw4" not in _where(fresh)["s"]


def test_moved_clusters_are_not_answered_from_the_memo() -> None:
    """No measurement, but a cluster's coordinates change: its estimated RTT changes."""
    memo = PlanMemo()
    batch = (workload("s", replicas=1, user_region="amsterdam", latency_slo_ms=15.0),)
    clusters = federation()
    before = snapshot(batch, clusters)
    placed_before = _where(_plan(before, memo))
    assert placed_before == _where(_plan(before, None))
    moved = tuple(dataclasses.replace(c, lat=-33.9, lon=151.2) if c.name == "gcp-euw4" else c
                  for c in clusters)
    after = snapshot(batch, moved)
    fresh = _plan(after, None)
    assert _plan(after, memo) == fresh
    assert placed_before != _where(fresh), "moving the cluster changed nothing to guard"


def _clusters_named(clusters: tuple[Cluster, ...], names: set[str]) -> tuple[Cluster, ...]:
    return tuple(c for c in clusters if c.name in names)


def test_fewer_clusters_are_not_answered_from_the_memo() -> None:
    memo = PlanMemo()
    batch = (workload("s", replicas=2, user_region="amsterdam", latency_slo_ms=60.0),)
    all_clusters = federation()
    assert _plan(snapshot(batch, all_clusters), memo) == _plan(snapshot(batch, all_clusters),
                                                               None)
    fewer = _clusters_named(all_clusters, {"aws-use1", "azure-eus"})
    assert _plan(snapshot(batch, fewer), memo) == _plan(snapshot(batch, fewer), None)


def test_a_cluster_that_changed_is_not_answered_from_the_memo() -> None:
    """The memo keeps a cluster's part of the option table while the Cluster is the same
    object: a new value (here: unhealthy) must be read again."""
    memo = PlanMemo()
    batch = (workload("b", kind=WorkloadKind.BATCH, replicas=2, duration_s=3600.0),)
    clusters = federation()
    first = _where(_plan(snapshot(batch, clusters), memo))["b"]
    sick = tuple(dataclasses.replace(c, healthy=False) if c.name in first else c
                 for c in clusters)
    fresh = _plan(snapshot(batch, sick), None)
    assert _plan(snapshot(batch, sick), memo) == fresh
    assert not first & _where(fresh)["b"]


def test_options_are_renumbered_when_an_earlier_cluster_loses_a_pool() -> None:
    memo = PlanMemo()
    clusters = federation()
    options_and_table(snapshot((), clusters), memo)
    fewer = (dataclasses.replace(clusters[0], pools=clusters[0].pools[1:]), *clusters[1:])
    kept, table = options_and_table(snapshot((), fewer), memo)
    fresh, fresh_table = options_and_table(snapshot((), fewer))
    assert kept == fresh
    assert [o.index for o in kept] == list(range(len(kept)))
    assert table.cluster_of == fresh_table.cluster_of
    assert (table.price == fresh_table.price).all()


def test_a_pool_that_changed_is_read_again() -> None:
    """Same cluster names and pools, one pool's price doubled (a price_change): the memo's
    rows of the old Cluster value must not be used."""
    memo = PlanMemo()
    clusters = federation()
    options_and_table(snapshot((), clusters), memo)
    p0 = clusters[1].pools[0]
    dearer = (clusters[0], dataclasses.replace(clusters[1], pools=(
        dataclasses.replace(p0, price_usd_per_hour=2 * p0.price_usd_per_hour),
        *clusters[1].pools[1:])), *clusters[2:])
    _, table = options_and_table(snapshot((), dearer), memo)
    assert (table.price == options_and_table(snapshot((), dearer))[1].price).all()
