"""What the scenario's `[[faults]]` do to the simulated world (physics, not decisions).

A site going down evicts what runs there (replicas go back to pending; a gang job restarts
whole) and remembers the site as the workloads' preferred home (the live reconciler's
`displaced_from`), a partition keeps new work off, quota cuts and price changes take effect,
spot reclaims remove nodes (and the replicas on them) at random. Re-placing the evicted work is
the planner's next epoch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from broker.sim import hazard
from broker.sim.scenario import FaultSpec
from broker.sim.state import Node, SimCluster, SimPool

if TYPE_CHECKING:
    from broker.sim.engine import Engine

FAULT_START = 3  # the engine's event kinds (engine._FAULT_START, engine._FAULT_END)
FAULT_END = 4


def fault(eng: Engine, f: FaultSpec, *, start: bool) -> None:
    c = eng.clusters[f.target]
    end = f.at_s + f.duration_s if f.duration_s is not None else math.inf
    if start and f.duration_s is not None:
        eng.push(end, FAULT_END, f)
    eng.metrics.faults_applied += 1 if start else 0
    eng.capacity_grew()
    if f.kind == "site_down" and start:
        c.down_until = max(c.down_until, end)
        for ws in list(eng.workloads.values()):
            mine = [g for g in ws.groups if g.cluster == c.name]
            if mine:
                if ws.ev.kind == "service" and c.name not in ws.displaced:
                    ws.displaced.append(c.name)
                eng.evict(ws, mine)
    elif f.kind == "partition" and start:
        c.partitioned_until = max(c.partitioned_until, end)
    elif f.kind == "quota_cut":
        c.quota_vcpu = f.quota_vcpu if start else c.spec.quota_vcpu
    elif f.kind == "price_change":
        for p in c.pools:
            p.price_factor = p.price_factor * f.factor if start else p.price_factor / f.factor
        eng.metrics.pools_changed()
    elif f.kind == "spot_reclaim" and start:
        reclaim(eng, c, f)
    eng.bump()


def reclaim(eng: Engine, c: SimCluster, f: FaultSpec) -> None:
    """Spot reclaim: random nodes go, and the replicas on them (a gang job whole)."""
    for p in c.pools:
        if not p.spec.spot or (f.pool is not None and f.pool not in (p.name,
                                                                     p.spec.instance_type)):
            continue
        for _ in range(min(f.nodes, p.nodes)):
            victim = p.node_list[eng.rng.randrange(p.nodes)]
            p.reclaims += 1
            evict_node(eng, c, p, victim)
            p.node_list.remove(victim)
            p.changed()
        eng.metrics.pools_changed()


def evict_node(eng: Engine, c: SimCluster, p: SimPool, node: Node) -> None:
    """The replicas on `node` go back to pending (a gang job restarts whole), as when the
    node is reclaimed or drained (`kubectl drain`: evicted pods are scheduled again)."""
    if not node.replicas and node.gpu_free >= p.node.gpu:
        return
    for ws in list(eng.workloads.values()):
        hit = [g for g in ws.groups if g.cluster == c.name and g.pool == p.name
               and (any(n is node for n in g.nodes)
                    or any(node in grp for grp in g.gpu_nodes))]
        if hit:
            eng.evict(ws, hit, lost=node)


def spot_hazard(eng: Engine, dt: float) -> None:
    """Spot nodes reclaimed by the per-pool hazard over the last `dt` s (sim/hazard.py);
    handled exactly as a scripted `spot_reclaim` fault of that many nodes."""
    for c in eng.clusters.values():
        if c.spec.fixed:
            continue
        for p in c.pools:
            if not p.spec.spot or not p.nodes:
                continue
            k = hazard.draw_reclaims(p.nodes, c.spec.provider, dt, eng.hazard_rng,
                                     eng.config.reclaim_per_hour)
            if k:
                eng.metrics.hazard_reclaims += k
                reclaim(eng, c, FaultSpec(at_s=eng.now, target=c.name, kind="spot_reclaim",
                                          nodes=k, pool=p.name))
                eng.capacity_grew()
                eng.bump()
