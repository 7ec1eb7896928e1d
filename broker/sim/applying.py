"""What the simulated world does with each decision of an EpochPlan. No decision is made here.

The engine calls `apply_plan` with the plan `plan_epoch` returned; every decision is carried
out as the live actuator and dispatcher would, and the simulated physics says when it takes
effect:

- scale-in (`PoolScaleIn`): the named nodes go at once, if they are still empty; with
  reason "consolidate" (the baselines' autoscalers, placement/consolidate.py) a ready node's
  replicas are drained first (evicted back to pending, a gang job restarting whole) and the
  next epoch places them again;
- replacements (`NodeReplace`, Karpenter's replace consolidation): the node is tainted
  (`Node.cordoned`: nothing new lands on it, the snapshot shows it leaving) and one node of
  the target pool is ordered; when that node is up (`replacement_up`) the old node is drained
  and removed. A replacement that is not up (lost, refused by quota) leaves the old node
  untainted, as Karpenter untaints a candidate whose replacement fails;
- scale and node prewarm (`PoolScale`, `Prewarm.nodes`): nodes join after `provision_delay_s`
  (plus Cluster Autoscaler's scan interval for `traditional`, Karpenter's batch window for
  `karpenter`), within the cluster's vCPU quota (the cloud refuses more); prewarmed nodes have
  images pulled while idle;
- placements: each replica goes on one node (bin-packing; a node is added if the plan and
  the twin's per-node packing disagree), then starts once nodes, images and data are there;
  replicas the plan added for a service's SLO (`slo_extra_replicas`) run with the others
  (they lower each replica's share of the load the service asked for);
- image/data prewarm for a workload: its image is cached on that pool from now on;
- migrations (`Migration`): the target's replicas are started; when they are ready the source
  replicas are drained (never below the workload's replicas while it runs); a move whose
  target or source is lost meanwhile ends, and the survivors keep serving;
- retries (`Retry`): the workload's attempts and last attempt are stored; `plan_epoch` decides
  from them whether it is due again.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING

from broker.domain import Placement
from broker.placement.planner import EpochPlan, Migration, NodeReplace, PoolScaleIn, Prewarm
from broker.sim import faults, physics
from broker.sim.network import data_move
from broker.sim.state import Group, Node, SimCluster, SimPool, WorkloadState, add_pod

if TYPE_CHECKING:
    from broker.sim.engine import Engine

READY = 1  # the engine's event kind for "a group of replicas is ready" (engine._READY)
REPLACED = 6  # ... for "a replacement node is up" (engine._REPLACED)


def apply_plan(eng: Engine, plan: EpochPlan) -> None:
    """Carry out every decision of `plan` (see the module docstring)."""
    for si in plan.scale_in:
        scale_in(eng, si)
    for rep in plan.replacements:
        replace_node(eng, rep)
    for s in plan.scale:
        c, p = _pool(eng, s.cluster, s.pool)
        if c is not None and p is not None and s.add_nodes > 0:
            add_nodes(eng, c, p, s.add_nodes)
    for placement in plan.placements:
        apply_placement(eng, placement,
                        extra=plan.slo_extra_replicas.get(placement.workload_id, 0))
    for pw in plan.prewarm:
        prewarm(eng, pw)
    for m in plan.migrations:
        start_move(eng, m)
    for r in plan.retries:
        ws = eng.workloads.get(r.workload_id)
        if ws is not None and ws.pending > 0:
            ws.tries, ws.tried_s = r.attempts, eng.now
            eng.wake_at(r.not_before_s)


def _pool(eng: Engine, cluster: str, pool: str) -> tuple[SimCluster | None, SimPool | None]:
    c = eng.clusters.get(cluster)
    if c is None:
        return None, None
    try:
        return c, c.pool(pool)
    except KeyError:
        return c, None


_READY_AT = operator.attrgetter("ready_at")


def node_name(c: SimCluster, p: SimPool, i: int) -> str:
    """The name a node has in the snapshot (sim/snapshot.py's observed nodes)."""
    return f"{c.name}/{p.name}/{i}"


def named_node(c: SimCluster, p: SimPool, name: str) -> Node | None:
    """The node of `p` whose `node_name` is `name`, if any: the index read off the name's
    end (each index has one name), not every node's name made and compared."""
    index = name.rpartition("/")[2]
    if not (index.isascii() and index.isdigit()):
        return None
    i = int(index)
    return p.node_list[i] if i < len(p.node_list) and node_name(c, p, i) == name else None


def scale_in(eng: Engine, si: PoolScaleIn) -> None:
    c, p = _pool(eng, si.cluster, si.pool)
    if c is None or p is None or c.spec.fixed:
        return
    gone = [n for n in (named_node(c, p, name) for name in si.nodes) if n is not None]
    removed = 0
    drain = si.reason == "consolidate"
    for n in gone:
        if n.ready_at <= eng.now and drain and not n.empty(p.node.gpu):
            faults.evict_node(eng, c, p, n)
            eng.metrics.consolidated_nodes += 1
        if n.ready_at <= eng.now and n.empty(p.node.gpu):
            p.node_list.remove(n)
            p.changed()
            removed += 1
    if removed:
        eng.metrics.pools_changed()
        eng.bump()


def replace_node(eng: Engine, r: NodeReplace) -> None:
    """Taint the node and order its replacement; the drain waits for it (`replacement_up`)."""
    c, p = _pool(eng, r.cluster, r.pool)
    _, q = _pool(eng, r.cluster, r.target_pool)
    if c is None or p is None or q is None or c.spec.fixed:
        return
    old = named_node(c, p, r.node)
    if old is None or old.cordoned or old.ready_at > eng.now or old.empty(p.node.gpu):
        return
    before = {id(n) for n in q.node_list}
    if not add_nodes(eng, c, q, 1):
        return  # the launch failed (max_nodes, quota, health): nothing is disrupted
    new = next(n for n in q.node_list if id(n) not in before)
    old.cordoned = True
    p.changed()
    eng.metrics.pools_changed()
    # The drain puts replicas back to pending then, which wakes the loop (Engine.queued).
    eng.push(new.ready_at, REPLACED, Replacing(c.name, p.name, old, q.name, new))
    eng.bump()


@dataclass(frozen=True, slots=True, eq=False)
class Replacing:
    """A replacement in flight: `old` (tainted) of pool `pool` goes once `new` is up."""

    cluster: str
    pool: str
    old: Node
    target_pool: str
    new: Node


def replacement_up(eng: Engine, r: Replacing) -> None:
    """A replacement node's time to be up: drain and remove the node it replaces; if the
    replacement is gone (reclaimed meanwhile), untaint the old node instead."""
    c = eng.clusters[r.cluster]
    p, q, old = c.pool(r.pool), c.pool(r.target_pool), r.old
    if old not in p.node_list:
        return  # lost meanwhile (a reclaim): nothing to drain
    old.cordoned = False
    if r.new in q.node_list:
        faults.evict_node(eng, c, p, old)
        p.node_list.remove(old)
        eng.metrics.replaced_nodes += 1
    p.changed()
    eng.metrics.pools_changed()
    eng.capacity_grew()
    eng.bump()


def prewarm(eng: Engine, pw: Prewarm) -> None:
    c, p = _pool(eng, pw.cluster, pw.pool)
    if c is None or p is None:
        return
    if pw.nodes > 0:
        added = add_nodes(eng, c, p, pw.nodes, prewarmed=True)
        if added:
            eng.metrics.prewarmed_nodes += added
            eng.bump()
    if pw.workload_id and pw.images:
        p.images.add(pw.workload_id)


def add_nodes(eng: Engine, c: SimCluster, p: SimPool, count: int, *,
              prewarmed: bool = False) -> int:
    if count <= 0 or c.spec.fixed or not c.healthy(eng.now):
        return 0
    if c.quota_vcpu is not None:
        used = sum(q.nodes * q.node.cpu for q in c.pools)
        count = min(count, int((c.quota_vcpu - used + 1e-9) // p.node.cpu))
    delay = eng.scenario.defaults.provision_delay_s
    if eng.config.policy == "traditional":
        delay += physics.CA_SCAN_INTERVAL_S
    elif eng.config.policy == "karpenter":
        delay += physics.KARPENTER_BATCH_IDLE_S
    added = p.add_nodes(count, eng.now + delay, prewarmed=prewarmed, ordered_at=eng.now)
    if added:
        eng.metrics.pools_changed()
        eng.capacity_grew()
    return added


def apply_placement(eng: Engine, placement: Placement, *, extra: int = 0) -> None:
    """Place the plan's replicas; `extra` (EpochPlan.slo_extra_replicas) more than pending
    run as part of the service, and those of them not placed now are dropped, not retried."""
    ws = eng.workloads.get(placement.workload_id)
    if ws is None or ws.finished or ws.pending <= 0:
        return
    ws.pending += max(0, extra)
    for a in placement.assignments:
        c, p = _pool(eng, a.cluster, a.pool)
        if c is None or p is None or not c.healthy(eng.now):
            continue
        placed = reserve(eng, ws, c, p, min(a.replicas, ws.pending))
        ws.pending -= placed
        if placed and c.name in ws.displaced:
            ws.displaced.clear()  # placed home again
        if ws.pending <= 0:
            break
    ws.pending = max(0, ws.pending - max(0, extra))
    if ws.pending <= 0:
        eng.pending.pop(ws.ev.id, None)
        ws.tries = 0
    eng.bump()


# ---------------------------------------------------------------- migrations

def start_move(eng: Engine, m: Migration) -> None:
    """Start the target of `m`; the source is drained when it is ready (`move_ready`)."""
    ws = eng.workloads.get(m.workload_id)
    if ws is None or ws.finished or ws.pending > 0 or ws.moving is not None \
            or len(m.target.assignments) != 1:
        return
    a = m.target.assignments[0]
    c, p = _pool(eng, a.cluster, a.pool)
    if c is None or p is None or not c.healthy(eng.now):
        return
    source = list(ws.groups)
    placed = reserve(eng, ws, c, p, a.replicas)
    if placed == 0:
        return
    new = ws.groups[-1]
    if placed < a.replicas:  # no room after all: undo, the source keeps serving
        eng.release(ws, new, new.count)
        return
    ws.moving = (new, source)
    eng.metrics.migrations[m.reason] = eng.metrics.migrations.get(m.reason, 0) + 1
    eng.bump()


def move_ready(eng: Engine, ws: WorkloadState, g: Group) -> None:
    """The target `g` of a move is ready: drain the source."""
    if ws.moving is None or ws.moving[0] is not g:
        return
    _, source = ws.moving
    ws.moving = None
    if g.cluster in ws.displaced:
        ws.displaced.clear()  # home again
    for old in source:
        if old in ws.groups:
            eng.release(ws, old, old.count)
    eng.bump()


def end_move(eng: Engine, ws: WorkloadState, lost: list[Group]) -> list[Group]:
    """A move whose groups are being lost ends; returns the lost groups whose replicas must
    be placed again (a lost target only costs the move; a lost source is replaced by the
    target, which already holds every replica)."""
    if ws.moving is None:
        return lost
    new, source = ws.moving
    ws.moving = None
    if new in lost:
        eng.release(ws, new, new.count)
        return [g for g in lost if g is not new]
    if any(g in source for g in lost):
        for old in source:
            if old in ws.groups:
                eng.release(ws, old, old.count)
        return [g for g in lost if g not in source]
    return lost


def cancel_move(eng: Engine, ws: WorkloadState) -> None:
    """Stop a move before a scale change: its target's replicas go, the source stays."""
    if ws.moving is not None:
        new, _ = ws.moving
        ws.moving = None
        if new in ws.groups:
            eng.release(ws, new, new.count)


# ---------------------------------------------------------------- reserving replicas

def reserve(eng: Engine, ws: WorkloadState, c: SimCluster, p: SimPool, want: int) -> int:
    """Reserve up to `want` replicas on pool `p`, node by node; returns placed.

    Each replica goes on one node (`SimPool.place_many`: best-fit bin-packing); nodes are
    ordered when none has room. Replicas start when their own nodes are up.
    """
    ev = ws.ev
    homes: list[tuple[Node, list[Node]]] = []
    if ev.gpu > p.node.gpu:
        for _ in range(want):
            home = node_for(eng, c, p, ev.cpu, ev.memory_gib, ev.gpu)
            if home is None:
                break
            homes.append(home)
    else:
        homes = [(n, [n] * ev.gpu) for n in nodes_for(eng, c, p, ws, want)]
    gpu_nodes = [h[1] for h in homes] if ev.gpu else []
    if not homes:
        return 0
    placed = len(homes)
    p.add_demand(eng.now, ev.cpu * placed, ev.gpu * placed, eng.config.demand_tau_s)
    eng.metrics.pools_changed()
    nodes = [h[0] for h in homes]
    nodes_ready = max([eng.now] + [n.ready_at for n in nodes]
                      + [n.ready_at for grp in gpu_nodes for n in grp])
    waits_on_new = nodes_ready > eng.now
    pull_needed = ev.id not in p.images or (waits_on_new and not all(
        n.prewarmed for n in nodes if n.ready_at > eng.now))
    pull_s = physics.transfer_s(ev.image_gb, eng.scenario.defaults.image_pull_gbps) \
        if pull_needed else 0.0
    move = data_move(ev, c.spec, eng.specs, eng.catalog, eng.scenario.defaults.network_gbps)
    if move.gb > 0:
        eng.metrics.data_moved(move.gb, cross=move.cross_region, egress_usd=move.egress_usd)
    g = Group(cluster=c.name, pool=p.name, count=placed, gpu_nodes=gpu_nodes,
              placed_s=eng.now, nodes=nodes,
              ready_s=nodes_ready + pull_s + move.seconds + physics.POD_START_S)
    g.token = eng.next_token()
    for i, on in enumerate(nodes):
        add_pod(ev.id, on, gpu_nodes[i] if gpu_nodes else [])
    ws.groups.append(g)
    p.count_replicas(placed, placed)
    eng.push(g.ready_s, READY, (ev.id, g.token))
    return placed


def nodes_for(eng: Engine, c: SimCluster, p: SimPool, ws: WorkloadState,
              want: int) -> list[Node]:
    """Nodes for up to `want` replicas (best fit, `SimPool.place_many`), ordering the
    nodes that are missing when nothing has room (as many as the rest needs)."""
    ev = ws.ev
    node = p.node
    if ev.cpu > node.cpu + 1e-9 or ev.memory_gib > node.memory_gib + 1e-9:
        return []
    out = p.place_many(ev.cpu, ev.memory_gib, ev.gpu, want, eng.now)
    left = want - len(out)
    if left > 0:
        per_node = p.fit_count(Node(0.0, node.gpu), ev.cpu, ev.memory_gib, ev.gpu)
        if per_node > 0 and add_nodes(eng, c, p, math.ceil(left / per_node)):
            out += p.place_many(ev.cpu, ev.memory_gib, ev.gpu, left, eng.now)
    return out


def node_for(eng: Engine, c: SimCluster, p: SimPool, cpu: float, mem: float,
             gpus: int) -> tuple[Node, list[Node]] | None:
    """A replica asking for more GPUs than a node has (a shape the candidates filter
    refuses live): its GPUs spread over nodes, its CPU on the first with room."""
    node = p.node
    if cpu > node.cpu + 1e-9 or mem > node.memory_gib + 1e-9:
        return None
    short = gpus - sum(n.gpu_free for n in p.node_list)
    if short > 0:
        add_nodes(eng, c, p, math.ceil(short / max(node.gpu, 1)))
    spread = p.take_spread(gpus)
    if spread is None:
        return None
    home = next((n for n in spread if n.fits(node, cpu, mem, 0)), None)
    if home is None:
        for n in spread:
            n.gpu_free += 1
        p.changed()
        return None
    p.occupy(home, cpu, mem, 0)
    return home, spread


def observe_idle(eng: Engine) -> None:
    """The scale-in timers as a node poller keeps them: started when a ready node is first
    seen empty (`SimPool.vacate` starts it when its last replica goes), cleared when it is
    not. An observation, not a decision: plan_epoch decides from the timers.

    After a pass over a pool every node has its timer iff it is ready and empty, and
    `occupy` and `vacate` keep that for the node they change (they clear and start its
    timer); so until the pool's next `changed()` (its list, or GPUs freed or taken
    otherwise) only the nodes that came up since the last pass need a look, and none while
    no node came up. Without `SimConfig.reuse_observations` every node of every pool is
    looked at every epoch (the reference the tests compare against)."""
    now = eng.now
    reuse = eng.config.reuse_observations
    for c in eng.clusters.values():
        if c.spec.fixed:
            continue
        for p in c.pools:
            nodes = p.node_list
            seen = p.idle_seen  # (`reshaped`, time, the next ready_at then) at the last pass
            if reuse and seen[0] == p.reshaped:
                if now < seen[2]:
                    continue  # no change but by occupy and vacate, and no node came up
                ready = list(map(_READY_AT, nodes))
                nodes = list(compress(nodes, map(operator.and_, map(seen[1].__lt__, ready),
                                                 map(now.__ge__, ready))))
            gpus = p.node.gpu
            for n in nodes:
                # Idle: ready with nothing on it (`SimPool.idle_nodes`; only idle_since moves
                # here, which that rule does not read).
                if n.ready_at <= now and n.empty(gpus):
                    if n.idle_since is None:
                        n.idle_since = now
                        p.node_changed(n)
                elif n.idle_since is not None:
                    n.idle_since = None
                    p.node_changed(n)
            p.idle_seen = (p.reshaped, now, min(filter(now.__lt__, map(_READY_AT, p.node_list)),
                                                default=math.inf))
