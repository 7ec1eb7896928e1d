"""The twin's snapshot: simulated state -> the merge's inputs -> placement/snapshot.py. Pure.

A thin adapter, so the twin's planner and policy see a snapshot built by the very merge rules
the live broker uses (broker/placement/snapshot.py): each simulated cluster is a registered
member (its scenario pools at their current, fault-adjusted prices and quota), each simulated
node an observed node (booting until `ready_at`), replica counts and demand come from the
engine's groups and per-pool EWMA, and the twin's user<->cluster RTT table plus the cluster
graph's RTT/throughput (placement/network.py) are the network maps.

Each simulated node reports what runs on it (the engine places every replica on a node).

Per epoch, the cost follows what changed: a pool's nodes are read again (`observe`, the
merge's node rules) only when the pool changed since its last reading (`SimPool.changed`) or
one of its booting nodes came up; otherwise its last `PoolObservation` goes into the merge as
it is, and a pool none of whose inputs changed (its reading, registration, price, replica
counts, reclaim rate) is last epoch's merged `Pool` again (placement/snapshot.py `MergeMemo`;
the demand rates, which decay every epoch, sit beside the pools in `FederationSnapshot.demand`).
A cluster whose registration and every pool reading are unchanged comes as last epoch's
`Member` and observations mapping, the very objects, so the merge keeps its pools whole; and
since the twin's readings are current (`TWIN_MERGE.ages` off: every provenance age is 0), a
member none of whose inputs changed (replica counts and reclaims too) is last epoch's merged
`Cluster` itself.
`SimConfig.reuse_observations = False` reads every pool and merges every pool afresh every
epoch (the reference the tests compare against).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import compress
from typing import TYPE_CHECKING

from broker.domain import (
    Assignment,
    Cluster,
    DataSource,
    FederationSnapshot,
    NodeState,
    Placement,
    Pool,
    PricingModel,
    Resources,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.placement.network import NetworkCatalog, cluster_pairs
from broker.placement.observed import (
    Inventory,
    ObservedNode,
    PoolObservation,
    decay_factor,
    node_state,
    observe,
)
from broker.placement.snapshot import Member, MergeInputs, MergeSettings, merge
from broker.sim.state import Node, NodeReading, SimCluster, SimPool, WorkloadState

if TYPE_CHECKING:
    from broker.sim.engine import Engine
    from broker.sim.scenario import Scenario

Pair = tuple[str, str]
# The twin's readings are exact and current: nothing in it is ever stale (every provenance
# age is 0, `ages=False`: so an unchanged member merges to last epoch's Cluster, `MergeMemo`);
# its numbers were validated when the scenario was parsed (sim/scenario.py), so no screen is
# needed per epoch.
# The taint a node being replaced carries (Karpenter v1's; placement/observed.py counts it as
# a termination taint, so the node is leaving and gives no capacity).
DISRUPTED = ("karpenter.sh/disrupted:NoSchedule",)
TWIN_MERGE = MergeSettings(inventory_max_age_s=float("inf"), sync_max_age_s=float("inf"),
                           telemetry_max_age_s=float("inf"), rtt_max_age_s=float("inf"),
                           hub_max_age_s=float("inf"), screen=False, ages=False)


def pending_workload(ws: WorkloadState, replicas: int | None = None) -> Workload:
    """A workload asking for its still-pending replicas (same id: placements refer to it);
    with `replicas`, that many (a running workload as the migration rules see it).

    Its run time is the predictor's estimate at submission (realize.py), never the trace's.
    The same value as last time while replicas and attempts are unchanged (kept on `ws`).
    """
    want = ws.pending if replicas is None else replicas
    key = (want, ws.tries, ws.tried_s)
    if ws.as_workload is not None and ws.as_workload[0] == key:
        return ws.as_workload[1]
    ev = ws.ev
    data = (DataSource(size_gb=ev.data_gb, location=ev.data_region),) if (
        ev.data_gb > 0 and ev.data_region) else ()
    spec = WorkloadSpec(
        name=ev.id, kind=WorkloadKind(ev.kind), image=f"sim/{ev.id}",
        replicas=want, resources=Resources(ev.cpu, ev.memory_gib, ev.gpu), gpu_model=ev.gpu_model,
        user_region=ev.user_region, latency_slo_ms=ev.latency_slo_ms, data=data,
        image_gb=ev.image_gb, duration_s=ev.predicted_duration_s, priority=ev.priority)
    out = Workload(id=ev.id, tenant=ev.tenant, spec=spec, submitted_s=ev.submit_s,
                   attempts=ws.tries, last_attempt_s=ws.tried_s if ws.tries else None)
    ws.as_workload = (key, out)
    return out


def running_placement(ws: WorkloadState, *, reuse: bool = True) -> Placement:
    """Where a running workload's replicas are, one assignment per pool (the migration
    rules' `source`; prices are the planner's to compute, so 0 here). With `reuse`, the
    same value as last time while its groups' pools and counts are unchanged (kept on `ws`).
    """
    key = tuple((g.cluster, g.pool, g.count) for g in ws.groups)
    if reuse and ws.as_running is not None and ws.as_running[0] == key:
        return ws.as_running[1]
    count: dict[Pair, int] = {}
    for c, p, n in key:
        count[(c, p)] = count.get((c, p), 0) + n
    out = Placement(ws.ev.id, tuple(Assignment(c, p, PricingModel.ON_DEMAND, n, 0.0)
                                    for (c, p), n in count.items()), 0.0)
    ws.as_running = (key, out)
    return out


def movable(ws: WorkloadState) -> bool:
    """A service fully running, not being moved: what the migration rules may look at."""
    return (ws.ev.kind == "service" and not ws.finished and ws.pending == 0
            and ws.moving is None and bool(ws.groups) and all(map(_RUNNING, ws.groups)))


def registered(c: SimCluster, now: float) -> Cluster:
    """A simulated cluster as a registration: its pools at today's price, quota and health."""
    pools = tuple(
        Pool(name=p.name, instance_type=p.spec.instance_type, node=p.node,
             nodes=p.nodes, max_nodes=p.spec.max_nodes,
             price_usd_per_hour=p.price_usd_per_hour,
             pricing=(PricingModel.EDGE if c.spec.fixed else
                      PricingModel.SPOT if p.spec.spot else PricingModel.ON_DEMAND),
             gpu_model=p.spec.gpu_model, interconnect=p.spec.interconnect)
        for p in c.pools)
    return Cluster(name=c.name, provider=c.spec.provider, region=c.spec.region, pools=pools,
                   zones=c.spec.zones, lat=c.spec.lat, lon=c.spec.lon,
                   quota_vcpu=c.quota_vcpu, healthy=c.healthy(now))


def registration(c: SimCluster, now: float) -> Member:
    """`registered(c, now)` as the merge's member, the same object as last time while
    nothing in it changed (so the merge's `MergeMemo` may keep the member's pools)."""
    key = (c.healthy(now), c.quota_vcpu, tuple([(p.nodes, p.price_factor) for p in c.pools]))
    if c.registered is not None and c.registered[0] == key:
        return c.registered[1]
    out = Member(cluster=registered(c, now))
    c.registered = (key, out)
    return out


def observed_nodes(c: SimCluster, p: SimPool, now: float) -> tuple[ObservedNode, ...]:
    """The pool's nodes with what runs on each."""
    return tuple(_observed_node(c, p, i, n, n.ready_at <= now)
                 for i, n in enumerate(p.node_list))


def pool_observation(c: SimCluster, p: SimPool, pool: Pool, now: float, *,
                     reuse: bool = True) -> PoolObservation:
    """The merge's reading of `p`'s nodes (`pool`: its registration): the last one while
    nothing changed (same `version`, no booting node came up since), else a new one."""
    cached = p.observed
    if reuse and cached is not None and cached[0] == p.version and now < cached[1]:
        return cached[2]
    nodes, states, until = _read_nodes(c, p, pool, now, reuse=reuse)
    reading = observe(pool, nodes, states)
    p.observed = (p.version, until, reading)
    return reading


def observations(c: SimCluster, pools: Sequence[Pool], now: float, *,
                 reuse: bool = True) -> dict[str, PoolObservation]:
    """Each pool's `pool_observation` (`pools`: their registrations) by pool name. While no
    pool of `c` changed (the same versions) and none of their booting nodes came up, the
    very mapping of last time, without asking each pool (the merge's `MergeMemo` then keeps
    the member's pools whole). Nobody changes it."""
    versions = tuple([p.version for p in c.pools])
    kept = c.observations
    if reuse and kept is not None and kept[0] == versions and now < kept[1]:
        return kept[2]
    out = {p.name: pool_observation(c, p, pool, now, reuse=reuse)
           for p, pool in zip(c.pools, pools, strict=True)}
    c.observations = (versions, min([p.observed[1] if p.observed is not None else -math.inf
                                     for p in c.pools], default=math.inf), out)
    return out


# What `_read_nodes` compares of a node (`NodeKey`), read in C, node after node.
_NODE_KEY = operator.attrgetter("used_cpu", "used_mem", "gpu_free", "idle_since", "prewarmed",
                                "underused_since", "cordoned")
_READY_AT = operator.attrgetter("ready_at")


def _read_nodes(c: SimCluster, p: SimPool, pool: Pool, now: float, *, reuse: bool
                ) -> tuple[list[ObservedNode], list[NodeState], float]:
    """`observed_nodes`, each one's `node_state`, and when the next booting node comes up
    (inf: none boots). A node whose every observed value (`NodeKey`, being up) is as at the
    pool's last reading, at the same index (its name), reuses what was made of it then
    (`SimPool.node_memo`). Where only single nodes changed since (`SimPool.touched`, the
    node list as it was), only those and the nodes booting then are looked at; else every
    node's values are read and compared in C (attrgetter, map), so a pool where few nodes
    changed costs little Python per node."""
    nodes = p.node_list
    last = p.node_memo if reuse else None
    touched, p.touched = p.touched, []
    if last is not None and touched is not None and len(nodes) == len(last.keys):
        return _read_touched(c, p, pool, now, last, touched)
    keys = list(map(_NODE_KEY, nodes))
    ready_at = list(map(_READY_AT, nodes))
    ups = list(map(now.__ge__, ready_at))
    observed: list[ObservedNode] = []
    states: list[NodeState] = []
    kept = 0
    if last is not None:
        kept = min(len(nodes), len(last.keys))
        observed, states = last.observed[:kept], last.states[:kept]
        changed = compress(range(kept), map(operator.or_, map(operator.ne, keys, last.keys),
                                            map(operator.ne, ups, last.ups)))
        for i in changed:
            observed[i] = on = _observed_node(c, p, i, nodes[i], ups[i])
            states[i] = node_state(pool, on)
    for i in range(kept, len(nodes)):
        on = _observed_node(c, p, i, nodes[i], ups[i])
        observed.append(on)
        states.append(node_state(pool, on))
    booting = list(compress(range(len(nodes)), map(operator.not_, ups)))
    p.node_memo = NodeReading(keys, ups, observed, states,
                              dict(zip(map(id, nodes), range(len(nodes)), strict=True)), booting)
    return observed, states, min(filter(now.__lt__, ready_at), default=math.inf)


def _read_touched(c: SimCluster, p: SimPool, pool: Pool, now: float, last: NodeReading,
                  touched: list[Node]) -> tuple[list[ObservedNode], list[NodeState], float]:
    """`_read_nodes` where the node list is as at the last reading and only the `touched`
    nodes' values may have changed since; a node booting then may have come up."""
    nodes = p.node_list
    keys, ups = last.keys[:], last.ups[:]
    observed, states = last.observed[:], last.states[:]
    booting = [i for i in last.booting if nodes[i].ready_at > now]
    index = last.index
    # A touched node not in the list was vacated after it went: nothing of it to read.
    for i in sorted({index[k] for k in map(id, touched) if k in index}.union(last.booting)):
        n = nodes[i]
        key, up = _NODE_KEY(n), n.ready_at <= now
        if key != keys[i] or up != ups[i]:
            keys[i], ups[i] = key, up
            observed[i] = on = _observed_node(c, p, i, n, up)
            states[i] = node_state(pool, on)
    p.node_memo = NodeReading(keys, ups, observed, states, index, booting)
    return observed, states, min([nodes[i].ready_at for i in booting], default=math.inf)


def _observed_node(c: SimCluster, p: SimPool, i: int, n: Node, up: bool) -> ObservedNode:
    """Node `i` of `p` as `observed_nodes` reports it."""
    return ObservedNode(
        name=f"{c.name}/{p.name}/{i}", pool=p.name, allocatable=p.node,
        allocated=Resources(n.used_cpu, n.used_mem, p.node.gpu - n.gpu_free),
        instance_type=p.spec.instance_type, ready=up, ever_ready=up,
        taints=DISRUPTED if n.cordoned else (), idle_since_s=n.idle_since,
        prewarmed=n.prewarmed, underused_since_s=n.underused_since)


def replica_counts(states: Iterable[WorkloadState]) -> dict[Pair, tuple[int, int]]:
    """(placed, not running yet) replicas per (cluster, pool) of the workloads' groups."""
    out: dict[Pair, tuple[int, int]] = {}
    for ws in states:
        for g in ws.groups:
            placed, starting = out.get((g.cluster, g.pool), (0, 0))
            out[(g.cluster, g.pool)] = (placed + g.count,
                                        starting + (0 if g.running else g.count))
    return out


def pool_replica_counts(clusters: Iterable[SimCluster]) -> dict[Pair, tuple[int, int]]:
    """`replica_counts` as the pools keep them (`SimPool.count_replicas`), without walking
    the workloads: the same mapping (pools holding replicas only)."""
    return {(c.name, p.name): (p.replicas_placed, p.replicas_starting)
            for c in clusters for p in c.pools if p.replicas_placed}


def _demand(engine: Engine) -> tuple[dict[Pair, tuple[float, float]],
                                     dict[Pair, tuple[float, float]]]:
    """Each pool's demand rates and release rates (cpu, gpu per s; FederationSnapshot.demand
    and .freed) decayed to now, by (cluster, pool): one factor for a pool's four rates,
    `decayed`'s very numbers (a rate of 0.0 stays 0.0: the factor is in (0, 1], tau > 0),
    computed once per distinct time the rates were brought up to date and multiplied in C.
    Pools with nothing freed are left out of the release rates."""
    now, tau = engine.now, engine.config.demand_tau_s
    pools = engine.pools
    at = list(map(_DEMAND_AT, pools))
    factor = {t: decay_factor(t, now, tau) for t in set(at)}
    f = list(map(factor.__getitem__, at))
    cpu = map(operator.mul, map(_DEMAND_CPU, pools), f)
    gpu = map(operator.mul, map(_DEMAND_GPU, pools), f)
    freed = {key: (p.freed_cpu_per_s * k, p.freed_gpu_per_s * k)
             for key, p, k in zip(engine.pool_keys, pools, f, strict=True)
             if p.freed_cpu_per_s or p.freed_gpu_per_s}
    return dict(zip(engine.pool_keys, zip(cpu, gpu, strict=True), strict=True)), freed


_RUNNING = operator.attrgetter("running")  # a Group's
_DEMAND_AT = operator.attrgetter("demand_at_s")
_DEMAND_CPU = operator.attrgetter("demand_cpu_per_s")
_DEMAND_GPU = operator.attrgetter("demand_gpu_per_s")


def network_of(scenario: Scenario, catalog: NetworkCatalog | None
               ) -> tuple[dict[Pair, float], dict[Pair, float]]:
    """Cluster graph RTTs and throughput (placement/network.py's rule), once per run."""
    from broker.sim.state import make_cluster

    return cluster_pairs([registered(make_cluster(c), 0.0) for c in scenario.clusters],
                         catalog)


_VERSION = operator.attrgetter("version")
_PRICE_FACTOR = operator.attrgetter("price_factor")
_RECLAIMS = operator.attrgetter("reclaims")


def member_inputs(c: SimCluster, now: float, *, reuse: bool = True
                  ) -> tuple[Member, Inventory]:
    """`c` as the merge's member (`registration`) and its inventory (`observations`, the
    reclaims), the very objects of last time while nothing in them changed: health, quota,
    and each pool's version (its nodes), price, reclaims and measured boot the same, no
    booting node up since. The inventory is then the reading made at its `observed_s`,
    still current (the twin's merge ages nothing, `TWIN_MERGE`), and the merge keeps the
    whole member (`MergeMemo`) after one look at it."""
    boots = tuple([p.observed_boot_s(now) for p in c.pools])
    key = (c.healthy(now), c.quota_vcpu, tuple(map(_VERSION, c.pools)),
           tuple(map(_PRICE_FACTOR, c.pools)), tuple(map(_RECLAIMS, c.pools)), boots)
    kept = c.inputs
    if reuse and kept is not None and kept[0] == key and now < kept[1]:
        return kept[2], kept[3]
    member = registration(c, now)
    inv = Inventory(observed_s=now, reclaims={p.name: p.reclaims for p in c.pools},
                    since_s=0.0,
                    observations=observations(c, member.cluster.pools, now, reuse=reuse),
                    boots={p.name: b for p, b in zip(c.pools, boots, strict=True)
                           if b is not None})
    until = c.observations[1] if c.observations is not None else -math.inf
    c.inputs = (key, until, member, inv)
    return member, inv


def twin_inputs(engine: Engine, batch: Sequence[WorkloadState]) -> MergeInputs:
    now = engine.now
    reuse = engine.config.reuse_observations
    clusters = list(engine.clusters.values())
    read = [member_inputs(c, now, reuse=reuse) for c in clusters]
    members = tuple(m for m, _ in read)
    inventory = {c.name: inv for c, (_, inv) in zip(clusters, read, strict=True)}
    demand, freed = _demand(engine)
    pair_rtt, gbps = engine.network
    return MergeInputs(
        now_s=now, members=members,
        inventory=inventory, pending=tuple(pending_workload(ws) for ws in batch),
        replicas=pool_replica_counts(clusters) if reuse
        else replica_counts(engine.unfinished.values()), demand=demand, freed=freed,
        user_regions=tuple(UserRegion(u.name, u.lat, u.lon)
                           for u in engine.scenario.user_regions),
        user_rtt_ms=engine.rtt, cluster_rtt_ms=pair_rtt, bandwidth_gbps=gbps,
        egress_usd_per_gb=engine.egress)


def build_snapshot(engine: Engine, batch: Sequence[WorkloadState], *,
                   running: bool = False, pods: bool = False) -> FederationSnapshot:
    """The FederationSnapshot of the engine's state now, asking for `batch`; with `running`,
    the running services (`movable`) with their specs and the sites they were evicted from;
    with `pods`, what runs on each node (`with_pods`).
    When capacity last grew is the engine's (backoff's "cluster event")."""
    reuse = engine.config.reuse_observations
    snap = merge(twin_inputs(engine, batch), TWIN_MERGE,
                 memo=engine.merge_memo if reuse else None)
    if pods:
        snap = with_pods(snap, engine)
    # Where the batch's partly placed workloads already run (no spec: never moved), so a
    # policy can keep a replica's member cluster (baselines.py's Karmada layer).
    partial = tuple(running_placement(ws, reuse=reuse) for ws in batch if ws.groups)
    if not running:
        return replace(snap, capacity_changed_s=engine.capacity_changed_s, running=partial)
    states = [ws for ws in engine.unfinished.values() if movable(ws)]  # arrival order
    specs = {ws.ev.id: pending_workload(ws, replicas=ws.placed) for ws in states}
    return replace(snap, capacity_changed_s=engine.capacity_changed_s,
                   running=tuple(running_placement(ws, reuse=reuse) for ws in states)
                   + tuple(p for p in partial if p.workload_id not in specs),
                   workloads={**snap.workloads, **specs},
                   displaced={ws.ev.id: tuple(ws.displaced) for ws in states if ws.displaced})


def with_pods(snap: FederationSnapshot, engine: Engine) -> FederationSnapshot:
    """`snap` with the ids of the workloads on each node (`NodeState.workloads`, as live
    drivers report them: `Node.pods`, kept as replicas come and go) and their specs in
    `workloads`: what Karpenter's replace rule and lp's drain rule read
    (placement/consolidate.py). Built on demand (the engine asks for it at those policies'
    housekeeping epochs only).

    A pool unchanged since the last call (`SimPool.version`, bumped whenever a node or the
    node list changes) that the merge gave as the same Pool is the same object as last
    time, and so is a cluster given as the same Cluster all of whose pools are; in a pool
    that changed, a node that is the same `Node` with the same pods (`Node.pods_version`)
    and the same NodeState given keeps the NodeState returned last time (`Engine.pods_memo`),
    found in C (map) without Python per node: walking every replica and rebuilding every
    node's state each tick was most of a day-long lp run's extra time. Without
    `SimConfig.reuse_observations`, nothing is kept.
    """
    memo = engine.pods_memo if engine.config.reuse_observations else PodsMemo()
    specs = dict(snap.workloads)
    for ws in engine.unfinished.values():
        if ws.groups and ws.ev.id not in specs:
            specs[ws.ev.id] = pending_workload(ws, replicas=ws.placed)
    clusters = []
    for c in snap.clusters:
        sim = engine.clusters[c.name]
        pools = tuple([_pool_with_pods(memo, c.name, pool, sim.pool(pool.name))
                       for pool in c.pools])
        kept = memo.clusters.get(c.name)
        if kept is not None and kept[0] is c and all(map(operator.is_, kept[1], pools)):
            clusters.append(kept[2])
            continue
        out = replace(c, pools=pools)
        memo.clusters[c.name] = (c, pools, out)
        clusters.append(out)
    return replace(snap, clusters=tuple(clusters), workloads=specs)


@dataclass(slots=True, eq=False)
class PodsReading:
    """What `with_pods` last made of one pool: at which `SimPool.version`, the merged Pool
    it was given and the Pool it returned, and per node index the `Node`, its
    `pods_version`, the state given and the state returned (so an unchanged node keeps its
    NodeState)."""

    version: int
    pool_in: Pool | None = None
    pool_out: Pool | None = None
    nodes: list[Node] = field(default_factory=list)
    pods: list[int] = field(default_factory=list)
    states_in: list[NodeState] = field(default_factory=list)
    states_out: list[NodeState] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class PodsMemo:
    """`with_pods`' memo: per (cluster, pool) its `PodsReading`; per cluster the Cluster it
    was given, the pools it was given back with and the Cluster returned."""

    pools: dict[Pair, PodsReading] = field(default_factory=dict)
    clusters: dict[str, tuple[Cluster, tuple[Pool, ...], Cluster]] = field(
        default_factory=dict)


_PODS = operator.attrgetter("pods")
_PODS_VERSION = operator.attrgetter("pods_version")


def _pool_with_pods(memo: PodsMemo, cluster: str, pool: Pool, sp: SimPool) -> Pool:
    """`pool` (merged from `sp`) with what runs on each node (`with_pods`)."""
    last = memo.pools.get((cluster, pool.name))
    if last is not None and last.version == sp.version and last.pool_in is pool \
            and last.pool_out is not None:
        return last.pool_out
    if last is None:
        last = memo.pools[(cluster, pool.name)] = PodsReading(sp.version)
    nodes = sp.node_list
    states = pool.node_states
    out = pool
    if len(nodes) == len(states) and any(map(_PODS, nodes)):
        out = replace(pool, node_states=tuple(_pods_states(last, nodes, states)))
    last.version, last.pool_in, last.pool_out = sp.version, pool, out
    return out


def _pods_states(last: PodsReading, nodes: list[Node], states: tuple[NodeState, ...]
                 ) -> list[NodeState]:
    """Each node's state with its workloads: last call's where the node, its pods and the
    state given are the same (compared in C), else `_reported`'s."""
    pods = list(map(_PODS_VERSION, nodes))
    kept = min(len(last.nodes), len(nodes))
    out = last.states_out[:kept]
    given = last.states_in
    changed = compress(range(kept), map(operator.or_, map(
        operator.or_, map(operator.is_not, nodes, last.nodes), map(operator.ne, pods, last.pods)),
        map(operator.is_not, states, given)))
    for i in changed:
        out[i] = _reported(states[i], nodes[i], given[i], out[i])
    out.extend(_reported(states[i], nodes[i], None, None) for i in range(kept, len(nodes)))
    last.nodes, last.pods, last.states_in, last.states_out = list(nodes), pods, list(states), out
    return out


def _reported(st: NodeState, n: Node, given: NodeState | None, returned: NodeState | None
              ) -> NodeState:
    """`st` with the node's workloads (`st` itself where none runs there): `returned`, the
    state returned last time for the same index, where it was made of the same `st`
    (`given`) with the same workloads."""
    wids = tuple(n.pods)
    if not wids:
        return st
    if given is st and returned is not None and returned.workloads == wids:
        return returned
    values = list(_STATE_VALUES(st))  # `replace(st, workloads=wids)`, in half the time
    values[_WORKLOADS_AT] = wids
    return NodeState(*values)


# NodeState's fields in `__init__` order (`_reported` builds one positionally).
_STATE_FIELDS = tuple(f.name for f in fields(NodeState) if f.init)
_STATE_VALUES = operator.attrgetter(*_STATE_FIELDS)
_WORKLOADS_AT = _STATE_FIELDS.index("workloads")
