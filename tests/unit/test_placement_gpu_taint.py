"""GKE's GPU taint (feasibility.pool_taints): work that asks no GPU stays off GPU node pools of
a GCP cluster that has a CPU pool, as GKE's scheduler would keep it."""

from __future__ import annotations

import dataclasses

from broker.domain import Cluster, PolicyAction, Resources, Toleration, Workload, WorkloadKind
from broker.placement.candidates import build_candidates
from broker.placement.feasibility import GPU_NODE_TAINT, pool_taints, room_replicas
from broker.placement.planner import PlannerConfig, plan_epoch

from .placement_world import GPU_NODE, pool, snapshot, workload

# A GPU node running one 1-GPU job: 85 of its 96 vCPUs free and paid for.
BUSY_GPU = Resources(cpu=11, memory_gib=100, gpu=1)


def cluster(provider: str, *, cpu_pool: bool = True) -> Cluster:
    gpu = pool("g2", price=8.0, nodes=1, max_nodes=2, node=GPU_NODE, gpu_model="L4",
               used=BUSY_GPU)
    cpu = pool("c2d", price=0.80, nodes=0, max_nodes=4)
    return Cluster(name=f"{provider}-1", provider=provider, region="r1",
                   pools=(cpu, gpu) if cpu_pool else (gpu,))


def allowed(provider: str, wl: Workload, *, cpu_pool: bool = True) -> set[str]:
    """The pools the workload may use (every feasibility family)."""
    snap = snapshot((wl,), clusters=(cluster(provider, cpu_pool=cpu_pool),))
    cs = build_candidates(snap, PolicyAction(), k=8, service_horizon_h=1.0)
    return {o.pool.name for j, o in enumerate(cs.options) if cs.feasible[0, j]}


def test_gke_taints_a_gpu_pool_only_beside_a_cpu_pool() -> None:
    assert pool_taints(cluster("gcp"), cluster("gcp").pools[1]) == (GPU_NODE_TAINT,)
    assert pool_taints(cluster("gcp"), cluster("gcp").pools[0]) == ()
    assert pool_taints(cluster("gcp", cpu_pool=False), cluster("gcp", cpu_pool=False).pools[0]) \
        == ()
    assert pool_taints(cluster("aws"), cluster("aws").pools[1]) == ()


def test_a_cpu_job_is_kept_off_a_gke_gpu_pool_and_a_gpu_job_is_not() -> None:
    cpu_job = workload("cpu", kind=WorkloadKind.BATCH, cpu=4, mem=8, duration_s=3600)
    gpu_job = workload("gpu", kind=WorkloadKind.TRAIN, cpu=11, mem=100, gpu=1,
                       duration_s=3600)
    assert allowed("gcp", cpu_job) == {"c2d"}
    assert allowed("gcp", gpu_job) == {"g2"}  # c2d has no GPU
    # No automatic taint on AWS, nor on a GCP cluster of GPU pools only.
    assert allowed("aws", cpu_job) == {"c2d", "g2"}
    assert allowed("gcp", cpu_job, cpu_pool=False) == {"g2"}
    # A pod that tolerates the taint itself may go there.
    tolerant = workload("tol", kind=WorkloadKind.BATCH, cpu=4, mem=8, duration_s=3600,
                        tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),))
    assert allowed("gcp", tolerant) == {"c2d", "g2"}


def test_lp_opens_a_cpu_node_rather_than_fill_a_gke_gpu_nodes_free_vcpus() -> None:
    """The GPU node's 85 free vCPUs are paid for, so on AWS lp puts the CPU job there;
    on GKE the taint keeps it off, and lp opens a CPU node."""
    job = workload("cpu", kind=WorkloadKind.BATCH, cpu=4, mem=8, duration_s=3600)
    config = PlannerConfig(time_limit_s=2.0)
    on_aws = plan_epoch(snapshot((job,), clusters=(cluster("aws"),)), PolicyAction(), config)
    on_gke = plan_epoch(snapshot((job,), clusters=(cluster("gcp"),)), PolicyAction(), config)
    assert [(a.pool, a.replicas) for a in on_aws.placements[0].assignments] == [("g2", 1)]
    assert [(a.pool, a.replicas) for a in on_gke.placements[0].assignments] == [("c2d", 1)]
    assert sum(s.add_nodes for s in on_gke.scale) == 1


def test_slo_sizing_counts_no_room_on_a_gke_gpu_pool_for_cpu_replicas() -> None:
    res = Resources(cpu=1, memory_gib=2)
    gke, aws = cluster("gcp"), cluster("aws")
    # The CPU pool's 4 nodes of 8 vCPUs either way; on AWS the GPU pool's room too.
    assert room_replicas(gke, res) == 32.0
    assert room_replicas(aws, res) > 32.0 + 85.0
    tol = (Toleration(key="nvidia.com/gpu", operator="Exists"),)
    assert room_replicas(gke, res, tolerations=tol) == room_replicas(aws, res)


def test_a_gpu_pool_seen_tainted_on_aws_keeps_cpu_work_off_too() -> None:
    """EKS taints nothing itself, but a GPU node group tainted as its docs advise reports the
    taint on its nodes (Pool.taints, observed.py rule 7): the CPU job keeps off it."""
    aws = cluster("aws")
    tainted = dataclasses.replace(aws.pools[1], taints=("nvidia.com/gpu=true:NoSchedule",))
    snap = snapshot((workload("cpu", kind=WorkloadKind.BATCH, cpu=4, mem=8, duration_s=3600),),
                    clusters=(Cluster(name=aws.name, provider="aws", region="r1",
                                      pools=(aws.pools[0], tainted)),))
    cs = build_candidates(snap, PolicyAction(), k=8, service_horizon_h=1.0)
    assert {o.pool.name for j, o in enumerate(cs.options) if cs.feasible[0, j]} == {"c2d"}
