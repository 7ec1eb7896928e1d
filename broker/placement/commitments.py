"""Fold the broker's own commitments into the cluster state the planner sees. Pure.

The live placement loop decides epoch after epoch, and the clusters' observed
usage (driver inventory, telemetry) lags behind what the broker has already
placed: a placement written in epoch t is not yet running in epoch t+1. If the
planner saw only observed usage it would hand the same free capacity out twice
(two 8-GPU jobs onto one 8-GPU node in consecutive epochs). So, like the
kube-scheduler's "assumed pods" cache, every active placement counts against
its pool from the moment it is written:

    used'[pool]  = max(observed used[pool], sum of requests of active placements on pool)
    nodes'[pool] = min(max_nodes, max(observed nodes, nodes + sum(new_nodes ordered)))

`max` (not `+`) because once a placement runs, the observed figure includes it.
For the same reason the nodes a placement ordered count only while its workload is not
running yet: by then the observed node count (driver inventory) includes them.
Only the resources a placement requested are counted (replicas x per-replica
request), never limits.

Nodes on order: the live loop passes `ordered` (cluster, pool) -> node count the
actuator has ordered and not yet seen join (its open scale decisions), and then

    nodes'[pool] = min(max_nodes, max(observed nodes, ordered[pool]))

instead of adding every active placement's `new_nodes`: once the nodes joined, the
pool's own count includes them, so adding the placements' orders again would
count them twice. Without `ordered` the placements' `new_nodes` stand in for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from broker.domain import Cluster, Placement, Pool, Resources, Workload, WorkloadStatus


def committed_usage(
    placements: Iterable[Placement], workloads: Mapping[str, Workload],
) -> tuple[dict[tuple[str, str], Resources], dict[tuple[str, str], int]]:
    """Requested resources and ordered new nodes per (cluster, pool)."""
    used: dict[tuple[str, str], Resources] = {}
    ordered: dict[tuple[str, str], int] = {}
    for p in placements:
        w = workloads.get(p.workload_id)
        if w is None:
            continue
        for a in p.assignments:
            key = (a.cluster, a.pool)
            used[key] = used.get(key, Resources()) + w.spec.resources.scale(a.replicas)
            if w.status is not WorkloadStatus.RUNNING:
                ordered[key] = ordered.get(key, 0) + a.new_nodes
    return used, ordered


def with_commitments(
    clusters: Iterable[Cluster], placements: Iterable[Placement],
    workloads: Mapping[str, Workload], *,
    ordered: Mapping[tuple[str, str], int] | None = None,
) -> tuple[Cluster, ...]:
    """Clusters whose pools count every active placement (see module docstring)."""
    used, new_nodes = committed_usage(placements, workloads)
    orders = new_nodes if ordered is None else ordered
    out: list[Cluster] = []
    for c in clusters:
        if not any((c.name, p.name) in used or (c.name, p.name) in orders for p in c.pools):
            out.append(c)  # nothing committed here: the same value
            continue
        pools: list[Pool] = []
        for pool in c.pools:
            key = (c.name, pool.name)
            if key not in used and key not in orders:
                pools.append(pool)
                continue
            mine = used.get(key, Resources())
            new_used = Resources(max(pool.used.cpu, mine.cpu),
                                 max(pool.used.memory_gib, mine.memory_gib),
                                 max(pool.used.gpu, mine.gpu))
            if ordered is not None:
                nodes = min(pool.max_nodes, max(pool.nodes, ordered.get(key, 0)))
            else:
                nodes = min(pool.max_nodes, max(pool.nodes, pool.nodes + new_nodes.get(key, 0)))
            # Enough nodes to hold what is committed, even if no order was recorded.
            nodes = max(nodes, _nodes_needed(new_used, pool.node))
            free_gpu = max(0, pool.node.gpu * nodes - new_used.gpu)
            pools.append(replace(
                pool, used=new_used, nodes=min(nodes, max(pool.max_nodes, pool.nodes)),
                largest_free_gpu_set=min(pool.largest_free_gpu_set, free_gpu)
                if pool.largest_free_gpu_set else 0))
        out.append(replace(c, pools=tuple(pools)))
    return tuple(out)


def _nodes_needed(used: Resources, node: Resources) -> int:
    need = 0.0
    if node.cpu > 0:
        need = max(need, used.cpu / node.cpu)
    if node.memory_gib > 0:
        need = max(need, used.memory_gib / node.memory_gib)
    if node.gpu > 0:
        need = max(need, used.gpu / node.gpu)
    return int(-(-need // 1))
