"""Active placements count against their pools before observed usage catches up."""

from __future__ import annotations

from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.placement.commitments import with_commitments


def _gpu_cluster(nodes: int = 1, max_nodes: int = 1, used_gpu: int = 0) -> Cluster:
    pool = Pool(name="a100", instance_type="p4d.24xlarge", node=Resources(96, 1152, 8),
                nodes=nodes, max_nodes=max_nodes, price_usd_per_hour=32.77,
                used=Resources(0, 0, used_gpu), largest_free_gpu_set=8 - used_gpu)
    return Cluster(name="c1", provider="aws", region="us-east-1", pools=(pool,))


def _train(wid: str, gpu: int = 8) -> Workload:
    spec = WorkloadSpec(name=wid, kind=WorkloadKind.TRAIN, image="x", replicas=1,
                        resources=Resources(32, 256, gpu))
    return Workload(id=wid, tenant="t", spec=spec)


def _placed(wid: str, new_nodes: int = 0) -> Placement:
    a = Assignment(cluster="c1", pool="a100", pricing=PricingModel.ON_DEMAND, replicas=1,
                   price_usd_per_hour=32.77, new_nodes=new_nodes)
    return Placement(workload_id=wid, assignments=(a,), cost_usd_per_hour=32.77)


def test_a_placed_but_not_running_job_uses_its_gpus() -> None:
    (c,) = with_commitments([_gpu_cluster()], [_placed("w1")], {"w1": _train("w1")})
    pool = c.pools[0]
    assert pool.used.gpu == 8
    assert pool.free.gpu == 0
    assert pool.largest_free_gpu_set == 0


def test_observed_usage_is_not_counted_twice() -> None:
    # Once the job runs, the observed usage includes it: max, not sum.
    (c,) = with_commitments([_gpu_cluster(used_gpu=8)], [_placed("w1")], {"w1": _train("w1")})
    assert c.pools[0].used.gpu == 8


def test_ordered_nodes_are_provisioned_for_the_planner() -> None:
    (c,) = with_commitments([_gpu_cluster(nodes=0, max_nodes=3)], [_placed("w1", new_nodes=1)],
                            {"w1": _train("w1")})
    pool = c.pools[0]
    assert pool.nodes == 1
    assert pool.can_add_nodes == 2
    assert pool.free.gpu == 0


def test_placements_of_unknown_workloads_and_other_pools_change_nothing() -> None:
    base = _gpu_cluster()
    (c,) = with_commitments([base], [_placed("gone")], {})
    assert c == base
