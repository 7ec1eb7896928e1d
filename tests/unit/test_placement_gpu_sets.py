"""GPU sets (feasibility.py, lp_rows.gpu_set_rows): NVLink placement and whole-node reservation."""

from __future__ import annotations

import dataclasses

from broker.domain import (
    Cluster,
    Interconnect,
    NodeState,
    PolicyAction,
    Resources,
    WorkloadKind,
)
from broker.placement import topology
from broker.placement.candidates import build_candidates
from broker.placement.planner import PlannerConfig, plan_epoch

from .placement_world import pool, snapshot, workload

CONFIG = PlannerConfig(time_limit_s=2.0)
ACTION = PolicyAction()
PAIRS_NODE = Resources(cpu=32, memory_gib=244, gpu=4)
WHOLE_NODE = Resources(cpu=96, memory_gib=1152, gpu=8)


def test_allocate_takes_an_nvlink_pair_not_two_gpus_across_pcie() -> None:
    """On a 4-GPU pairs node (0-1 and 2-3 bridged) with GPU 0 taken, the 2-GPU set is 2-3 over
    NVLink; with 0 and 3 taken the two free GPUs meet across PCIe and form no NVLink set."""
    node = topology.nvlink_pairs(4)
    alloc = topology.allocate(node, 2, used=[0])
    assert alloc is not None
    assert alloc.gpus == (2, 3)
    assert alloc.ring_gbytes >= topology.nvlink_floor_gbytes(node)
    assert [a.gpus for a in topology.disjoint_sets(node, 2, nvlink=True)] == [(0, 1), (2, 3)]
    assert topology.disjoint_sets(node, 2, used=[0, 3], nvlink=True) == ()
    assert len(topology.disjoint_sets(node, 2, used=[0, 3])) == 1  # any two GPUs will do


def pairs_pool(name: str, *, price: float, free: int, largest: int, max_nodes: int) -> object:
    p = pool(name, price=price, nodes=1, max_nodes=max_nodes, node=PAIRS_NODE, gpu_model="V100",
             interconnect=Interconnect.NVLINK_PAIRS,
             used=Resources(cpu=4, memory_gib=8, gpu=4 - free))
    state = NodeState(name=f"{name}-0", cpu_allocated=4, memory_allocated_gib=8, gpu_free=free,
                      largest_free_gpu_set=largest)
    return dataclasses.replace(p, node_states=(state,), largest_free_gpu_set=largest)


def test_a_two_gpu_nvlink_job_goes_to_a_free_pair_not_two_gpus_across_pcie() -> None:
    """Pool `split` has two GPUs free that meet across PCIe (largest free NVLink set 1) and
    could add a node; pool `pair` is dearer and has a free NVLink pair. Before GPU sets the
    aggregate capacity row let the job take split's two GPUs; now it gets the pair, and
    no policy puts it on split's running node."""
    clusters = (
        Cluster(name="c1", provider="aws", region="us-east-1",
                pools=(pairs_pool("split", price=12.0, free=2, largest=1, max_nodes=2),)),
        Cluster(name="c2", provider="aws", region="us-east-1",
                pools=(pairs_pool("pair", price=14.0, free=2, largest=2, max_nodes=1),)),
    )
    job = workload("train", kind=WorkloadKind.TRAIN, cpu=4, mem=16, gpu=2,
                   interconnect=Interconnect.NVLINK_PAIRS, duration_s=3600)
    snap = snapshot((job,), clusters=clusters)
    cs = build_candidates(snap, ACTION, k=4, service_horizon_h=1.0)
    assert dict(cs.gpu_sets) == {(0, (2, True)): (0, 2), (1, (2, True)): (1, 2)}
    for policy in ("lp", "greedy"):
        plan = plan_epoch(snap, ACTION, CONFIG, policy=policy)
        assert plan.unplaced == {}, policy
        used = {(a.pool, a.new_nodes) for p in plan.placements for a in p.assignments}
        assert ("split", 0) not in used, policy
    lp_plan = plan_epoch(snap, ACTION, CONFIG)
    assert {a.pool for p in lp_plan.placements for a in p.assignments} == {"pair"}


def whole_pool(free_per_node: tuple[int, ...], max_nodes: int) -> object:
    states = tuple(NodeState(name=f"n{i}", gpu_free=f, largest_free_gpu_set=f,
                             cpu_allocated=(8 - f) * 12, memory_allocated_gib=(8 - f) * 100)
                   for i, f in enumerate(free_per_node))
    used_gpu = sum(8 - f for f in free_per_node)
    p = pool("p4d", price=32.77, nodes=len(free_per_node), max_nodes=max_nodes,
             node=WHOLE_NODE, gpu_model="A100", interconnect=Interconnect.NVLINK_FULL,
             used=Resources(cpu=used_gpu * 12, memory_gib=used_gpu * 100, gpu=used_gpu))
    return dataclasses.replace(p, node_states=states,
                               largest_free_gpu_set=max(free_per_node))


def test_whole_nodes_are_kept_for_queued_eight_gpu_jobs() -> None:
    """One node has 4 GPUs free, one is whole. Two 4-GPU replicas fit the running nodes only
    by breaking the whole one; while an 8-GPU job is queued (backing off, not in the batch)
    the whole node is kept and a node is added for the second replica instead."""
    clusters = (Cluster(name="aws", provider="aws", region="us-east-1",
                        pools=(whole_pool((4, 8), max_nodes=4),)),)
    small = workload("small", kind=WorkloadKind.TRAIN, cpu=12, mem=100, gpu=4, replicas=2,
                     interconnect=Interconnect.NVLINK_FULL, duration_s=3600)
    big = dataclasses.replace(
        workload("big", kind=WorkloadKind.TRAIN, cpu=90, mem=1000, gpu=8,
                 interconnect=Interconnect.NVLINK_FULL, duration_s=3600),
        attempts=3, last_attempt_s=-1.0)
    free_run = plan_epoch(snapshot((small,), clusters=clusters), ACTION, CONFIG)
    assert free_run.unplaced == {}
    assert sum(s.add_nodes for s in free_run.scale) == 0
    kept = plan_epoch(snapshot((small, big), clusters=clusters), ACTION, CONFIG)
    assert "big" not in {p.workload_id for p in kept.placements}  # still backing off
    assert kept.unplaced == {}
    assert sum(s.add_nodes for s in kept.scale) == 1
