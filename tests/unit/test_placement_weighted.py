"""`replicaSplit: weighted`: Karmada's static-weight division, held by the LP, the Ledger and
every baseline (broker/placement/weighted.py)."""

from __future__ import annotations

import numpy as np
import pytest

from broker.domain import Cluster, ClusterWeight, PolicyAction
from broker.placement import lp
from broker.placement.candidates import build_candidates
from broker.placement.ledger import penalties
from broker.placement.planner import POLICIES, PlannerConfig, plan_epoch
from broker.placement.weighted import _fnv1a32, cluster_weights, webster

from .placement_world import federation, snapshot, workload

CONFIG = PlannerConfig(time_limit_s=2.0, site_cost_fraction=1.0)
ACTION = PolicyAction()


def _split(policy: str, *weights: ClusterWeight, replicas: int = 10, cpu: float = 1.0,
           clusters: tuple[Cluster, ...] | None = None) -> tuple[dict[str, int], str | None]:
    w = workload("w", replicas=replicas, cpu=cpu, mem=2.0, replica_weights=weights)
    plan = plan_epoch(snapshot((w,), clusters), ACTION, CONFIG, policy=policy)
    got: dict[str, int] = {}
    for p in plan.placements:
        for a in p.assignments:
            got[a.cluster] = got.get(a.cluster, 0) + a.replicas
    return got, plan.unplaced.get("w")


def test_webster_gives_karmadas_documented_splits() -> None:
    # assignByStaticWeightStrategy's table (assignment.go): 9 at 1:2 -> 3:6, 9 at 1:3 -> 2:7.
    assert webster(9, {"a": 1, "b": 2}) == {"a": 3, "b": 6}
    assert webster(9, {"a": 1, "b": 3}) == {"a": 2, "b": 7}
    # 7.5 : 2.5 -> the tie goes to the cluster with fewer replicas (webstermethod.go).
    assert webster(10, {"a": 3, "b": 1}) == {"a": 7, "b": 3}
    assert webster(0, {"a": 1}) == {"a": 0}


def test_webster_breaks_name_ties_by_the_parity_of_the_ids_hash() -> None:
    even = next(f"w-{k}" for k in range(100) if _fnv1a32(f"w-{k}") % 2 == 0)
    odd = next(f"w-{k}" for k in range(100) if _fnv1a32(f"w-{k}") % 2 == 1)
    assert _fnv1a32("a") == 0xE40C292C  # FNV-1a 32-bit test vector
    assert webster(1, {"a": 1, "b": 1}, uid=even) == {"a": 1, "b": 0}
    assert webster(1, {"a": 1, "b": 1}, uid=odd) == {"a": 0, "b": 1}
    assert webster(1, {"a": 1, "b": 1}) == {"a": 1, "b": 0}


def test_weight_is_the_largest_matching_entry_and_unlisted_clusters_get_none() -> None:
    clusters = federation()
    weights = (ClusterWeight(weight=2, cluster_names=("aws-use1", "gcp-euw4")),
               ClusterWeight(weight=5, cluster_names=("gcp-euw4",)),
               ClusterWeight(weight=9, match_labels={"tier": "gold"}))
    assert cluster_weights(weights, clusters) == {"aws-use1": 2, "gcp-euw4": 5}
    excluded = (ClusterWeight(weight=1, exclude=("aws-use1",)),)
    assert set(cluster_weights(excluded, clusters)) == {"gcp-euw4", "azure-eus", "edge-nyc"}
    # No candidate matches any entry: Karmada weights every candidate 1 (an even split).
    assert cluster_weights(weights[2:], clusters) == {c.name: 1 for c in clusters}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_splits_10_replicas_3_to_1_as_karmada(policy: str) -> None:
    got, unplaced = _split(policy, ClusterWeight(weight=3, cluster_names=("aws-use1",)),
                           ClusterWeight(weight=1, cluster_names=("gcp-euw4",)))
    assert got == {"aws-use1": 7, "gcp-euw4": 3}
    assert unplaced is None


@pytest.mark.parametrize("policy", POLICIES)
def test_an_infeasible_weighted_cluster_leaves_its_share_to_the_others(policy: str) -> None:
    """azure-eus is tainted (the workload has no toleration): Karmada's filters drop it, so
    the remaining candidates divide every replica by their own weights."""
    got, unplaced = _split(policy, ClusterWeight(weight=3, cluster_names=("azure-eus",)),
                           ClusterWeight(weight=1, cluster_names=("aws-use1",)),
                           ClusterWeight(weight=1, cluster_names=("gcp-euw4",)))
    assert got == {"aws-use1": 5, "gcp-euw4": 5}
    assert unplaced is None


@pytest.mark.parametrize("policy", POLICIES)
def test_a_share_without_room_stays_unplaced_and_says_why(policy: str) -> None:
    """edge-nyc (one 16-vCPU node) gets 7 of 10 4-vCPU replicas at 3:1 but holds at most
    4; the 3 left wait (Karmada binds a static share to its cluster), gcp keeps its 3."""
    got, unplaced = _split(policy, ClusterWeight(weight=3, cluster_names=("edge-nyc",)),
                           ClusterWeight(weight=1, cluster_names=("gcp-euw4",)), cpu=4.0)
    assert got["gcp-euw4"] == 3
    assert got.get("edge-nyc", 0) < 7
    assert set(got) <= {"gcp-euw4", "edge-nyc"}
    assert unplaced is not None
    assert unplaced.startswith("weighted: edge-nyc holds")
    assert "of its 7" in unplaced


def test_the_lp_picks_the_cheapest_pools_inside_each_share() -> None:
    w = workload("w", replicas=10, replica_weights=(
        ClusterWeight(weight=3, cluster_names=("aws-use1",)),
        ClusterWeight(weight=1, cluster_names=("gcp-euw4",))))
    plan = plan_epoch(snapshot((w,)), ACTION, CONFIG, policy="lp")
    pools = {(a.cluster, a.pool): a.replicas for a in plan.placements[0].assignments}
    assert pools == {("aws-use1", "m5-spot"): 7, ("gcp-euw4", "n2"): 3}


def test_the_lp_has_one_bounded_row_per_share() -> None:
    w = workload("w", replicas=10, replica_weights=(
        ClusterWeight(weight=3, cluster_names=("aws-use1",)),
        ClusterWeight(weight=1, cluster_names=("gcp-euw4",))))
    cs = build_candidates(snapshot((w,)), ACTION, k=8, service_horizon_h=1.0)
    model = lp.build(cs, penalties(cs, 1000.0), {})
    rows = {key: r for r, (fam, key) in enumerate(model.row_names) if fam == "weighted"}
    assert set(rows) == {"w|aws-use1", "w|gcp-euw4"}
    assert model.row_hi[rows["w|aws-use1"]] == 7.0
    assert model.row_hi[rows["w|gcp-euw4"]] == 3.0
    aws = [c for c in range(model.n_x) if cs.options[int(model.x_o[c])].cluster.name
           == "aws-use1"]
    assert aws
    assert np.all(model.a[rows["w|aws-use1"], aws].toarray() == 1.0)
    # edge-nyc's pool passes every constraint but gets no share (azure-eus: its taint).
    assert cs.infeasible_counts[0]["weighted"] == 1


def test_a_cost_split_workload_has_no_weighted_rows_or_targets() -> None:
    cs = build_candidates(snapshot((workload("w", replicas=10),)), ACTION, k=8,
                          service_horizon_h=1.0)
    assert cs.target(0) == {}
    model = lp.build(cs, penalties(cs, 1000.0), {})
    assert all(fam != "weighted" for fam, _ in model.row_names)
