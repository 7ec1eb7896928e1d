"""Mutable simulated state: pools with nodes, clusters, and the workloads in flight.

Capacity model: a pool is a list of nodes, each with the time it becomes ready (booting nodes
are paid and may be reserved, but replicas on them start only once they are up), its zone,
and what runs on it: CPU, memory and GPUs are tracked per node, because Kubernetes places a
pod on one node and a node can only go when nothing runs on it (no free repacking: a pool is
not a fluid). Pool totals (`used_cpu`, `used_mem`) are kept alongside for the planner, which
sees pools in aggregate plus their nodes. Whatever changes a pool's nodes (what runs on them,
their timers, the list itself) calls `SimPool.changed()`, or `SimPool.node_changed(n)` where
it changed node `n` alone: the snapshot reuses a pool's observed nodes until then, and after
`node_changed` reads only those nodes again (sim/snapshot.py). The engine checks
`used <= allocatable` per node and per pool after every change; `CapacityError` means a bug,
never a normal outcome.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress

from broker.domain import NodeState, Placement, Resources, Workload
from broker.placement.consolidate import CA_UTILIZATION_THRESHOLD
from broker.placement.observed import (
    BOOT_SAMPLES,
    Inventory,
    ObservedNode,
    PoolObservation,
    boot_s,
    decay_factor,
)
from broker.placement.snapshot import Member
from broker.sim.scenario import ClusterSpec, PoolSpec, TraceEvent


class CapacityError(RuntimeError):
    """The simulated state broke a capacity invariant (a bug in the twin or the planner)."""


_EPS = 1e-9
# A node as the snapshot reads it, but for being up: (cpu, memory, free GPUs, idle since,
# prewarmed, underused since, cordoned).
NodeKey = tuple[float, float, int, float | None, bool, float | None, bool]


@dataclass(slots=True, eq=False)
class Node:
    ready_at: float
    gpu_free: int
    prewarmed: bool = False
    idle_since: float | None = None  # scale-in timer (Cluster Autoscaler's "unneeded")
    zone: int = 0  # index into the cluster's zones
    used_cpu: float = 0.0
    used_mem: float = 0.0
    replicas: int = 0  # replicas placed here (GPU-only shares of a spread replica excluded)
    # Below Cluster Autoscaler's utilisation threshold since (None: at or above it).
    underused_since: float | None = None
    # Tainted for a replacement (Karpenter's `karpenter.sh/disrupted:NoSchedule`): nothing new
    # lands here; drained once the replacement is up (sim/applying.py, NodeReplace).
    cordoned: bool = False
    # Workload id -> its replicas with their home or a GPU here (what a kubelet lists: the
    # pods on the node), kept by sim/applying.py reserve and Engine.release.
    pods: dict[str, int] = field(default_factory=dict)
    pods_version: int = 0  # bumped whenever `pods` changes (sim/snapshot.py with_pods)

    def empty(self, gpus: int) -> bool:
        return self.replicas == 0 and self.gpu_free >= gpus

    def fits(self, node: Resources, cpu: float, mem: float, gpus: int) -> bool:
        return (not self.cordoned and self.used_cpu + cpu <= node.cpu + _EPS
                and self.used_mem + mem <= node.memory_gib + _EPS and self.gpu_free >= gpus)


def add_pod(wid: str, home: Node | None, gpus: list[Node]) -> None:
    """One replica of `wid` now has its home and GPUs on these nodes (`Node.pods`)."""
    for n in pod_nodes(home, gpus):
        n.pods[wid] = n.pods.get(wid, 0) + 1
        n.pods_version += 1


def remove_pod(wid: str, home: Node | None, gpus: list[Node]) -> None:
    """One replica of `wid` has left these nodes (`Node.pods`)."""
    for n in pod_nodes(home, gpus):
        k = n.pods.get(wid, 0) - 1
        if k > 0:
            n.pods[wid] = k
        else:
            n.pods.pop(wid, None)
        n.pods_version += 1


def pod_nodes(home: Node | None, gpus: list[Node]) -> list[Node]:
    """The distinct nodes one replica is on: its home, then the nodes of its GPUs."""
    out = [home] if home is not None else []
    for n in gpus:
        if all(m is not n for m in out):
            out.append(n)
    return out


def _ready_at(n: Node) -> float:
    return n.ready_at


_GPU_FREE = operator.attrgetter("gpu_free")
_COUNT = operator.attrgetter("count")  # a Group's
_RUNNING = operator.attrgetter("running")


@dataclass(slots=True, eq=False)
class NodeReading:
    """What the snapshot last read of a pool's nodes and made of them, per node index: the
    values, whether each was up, its `ObservedNode` and `NodeState`; each node's index by
    `id` and the indexes of the nodes not up then (sim/snapshot.py)."""

    keys: list[NodeKey]
    ups: list[bool]
    observed: list[ObservedNode]
    states: list[NodeState]
    index: dict[int, int]
    booting: list[int]


@dataclass(slots=True)
class SimPool:
    spec: PoolSpec
    cluster: str
    node_list: list[Node]  # sorted by ready_at
    used_cpu: float = 0.0
    used_mem: float = 0.0
    price_factor: float = 1.0
    reclaims: int = 0
    images: set[str] = field(default_factory=set)  # workload ids whose image is cached here
    demand_cpu_per_s: float = 0.0  # EWMA of reserved cpu per second (prewarm forecast)
    demand_gpu_per_s: float = 0.0  # the same for GPUs
    # EWMA of cpu / GPUs given back per second by workloads that ended (the net forecast)
    freed_cpu_per_s: float = 0.0
    freed_gpu_per_s: float = 0.0
    demand_at_s: float = 0.0  # when the four rates above were last brought up to date
    zones: int = 1  # the cluster's zone count: new nodes go to the zone with fewest nodes
    version: int = 0  # bumped by `changed()`, whenever a node or the node list changes
    # The nodes changed one by one (`node_changed`: occupy, vacate) since the snapshot last
    # read the pool, so it reads only those again; None: any node or the list may have
    # changed (`changed()`, which every other change calls): it compares every node.
    touched: list[Node] | None = None
    reshaped: int = 0  # `version` at the last `changed()` (the node list may differ since)
    # (`reshaped` then, the listed nodes by id): `holds`'s cache.
    held: tuple[int, dict[int, Node]] | None = None
    # The snapshot's reading of the nodes: (version, valid until (a booting node's ready_at),
    # the reading); sim/snapshot.py owns it.
    observed: tuple[int, float, PoolObservation] | None = None
    # The snapshot's last reading of the nodes, per index (sim/snapshot.py).
    node_memo: NodeReading | None = None
    gpus_used: tuple[int, int] = (-1, 0)  # (version, GPUs in use then): `used_gpu`'s cache
    # (`reshaped`, the time, the next booting node's ready_at) at the last idle-timer pass
    # (sim/applying.py observe_idle).
    idle_seen: tuple[int, float, float] = (-1, -math.inf, -math.inf)
    # Replicas of the engine's groups on this pool, and how many of them are not running yet,
    # kept as groups come, start and go (Engine.release, _group_ready, applying.reserve): the
    # snapshot's replica counts without walking every workload each epoch.
    replicas_placed: int = 0
    replicas_starting: int = 0
    # (ready_at, seconds from the order to it) of the pool's last node orders (`add_nodes`):
    # what the pool's boots measure once they are up (`observed_boot_s`).
    boots: list[tuple[float, float]] = field(default_factory=list)
    # (from, until, value): `observed_boot_s` for any time in [from, until) (until: the next
    # ordered node's ready_at); None after an order. Read per pool and epoch by the snapshot.
    boot_seen: tuple[float, float, float | None] | None = None

    # The spec's name and node shape, as plain attributes (read millions of times a day).
    name: str = field(init=False, repr=False, compare=False)
    node: Resources = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.name = self.spec.name
        self.node = self.spec.node

    def changed(self) -> None:
        """A node or the node list changed: the snapshot must read the nodes again."""
        self.version += 1
        self.touched = None
        self.reshaped = self.version

    def holds(self, n: Node) -> bool:
        """`n in node_list`, by identity, without a scan while the list is as it was at the
        last call (every change to the list calls `changed()` after it)."""
        held = self.held
        if held is None or held[0] != self.reshaped:
            held = self.held = (self.reshaped, {id(x): x for x in self.node_list})
        return held[1].get(id(n)) is n

    def node_changed(self, n: Node) -> None:
        """Node `n`'s values changed, nothing else (not the node list): `changed()`, but the
        snapshot need read only `n` again (`touched`)."""
        self.version += 1
        touched = self.touched
        if touched is not None:
            if len(touched) < len(self.node_list):
                touched.append(n)
            else:  # as many as a full reading: compare every node
                self.touched = None

    @property
    def nodes(self) -> int:
        return len(self.node_list)

    @property
    def price_usd_per_hour(self) -> float:
        return self.spec.price_usd_per_hour * self.price_factor

    def add_demand(self, now: float, cpu: float, gpu: float, tau_s: float) -> None:
        """Count `cpu`/`gpu` reserved at `now` into the demand EWMA (placement/observed.py's
        `demand_rate`, kept incrementally: decay to now, then add amount / tau)."""
        self.decay_demand(now, tau_s)
        self.demand_cpu_per_s += cpu / tau_s
        self.demand_gpu_per_s += gpu / tau_s

    def add_freed(self, now: float, cpu: float, gpu: float, tau_s: float) -> None:
        """Count `cpu`/`gpu` given back at `now` by a workload that ended into the release
        EWMA (the same rule as `add_demand`; FederationSnapshot.freed)."""
        self.decay_demand(now, tau_s)
        self.freed_cpu_per_s += cpu / tau_s
        self.freed_gpu_per_s += gpu / tau_s

    def decay_demand(self, now: float, tau_s: float) -> None:
        f = decay_factor(self.demand_at_s, now, tau_s)
        self.demand_cpu_per_s *= f
        self.demand_gpu_per_s *= f
        self.freed_cpu_per_s *= f
        self.freed_gpu_per_s *= f
        self.demand_at_s = max(self.demand_at_s, now)

    def count_replicas(self, placed: int, starting: int) -> None:
        """Replicas placed here (and not running yet) changed by these counts."""
        self.replicas_placed += placed
        self.replicas_starting += starting

    def ready_nodes(self, now: float) -> int:
        return sum(1 for n in self.node_list if n.ready_at <= now)

    @property
    def used_gpu(self) -> int:
        if not self.node.gpu:
            return 0
        if self.gpus_used[0] != self.version:
            gpus = self.node.gpu
            nodes = self.node_list  # ints: the same as summing gpus - gpu_free node by node
            self.gpus_used = (self.version, gpus * len(nodes) - sum(map(_GPU_FREE, nodes)))
        return self.gpus_used[1]

    def free(self) -> Resources:
        n = self.nodes
        return Resources(n * self.node.cpu - self.used_cpu,
                         n * self.node.memory_gib - self.used_mem,
                         sum(x.gpu_free for x in self.node_list) if self.node.gpu else 0)

    def largest_free_gpu_set(self) -> int:
        return max((n.gpu_free for n in self.node_list), default=0) if self.node.gpu else 0

    def idle_nodes(self, now: float) -> list[Node]:
        """Ready nodes with nothing on them, idle longest first (the only ones that may go)."""
        gpus = self.node.gpu
        ready = [n for n in self.node_list if n.ready_at <= now and n.empty(gpus)]
        # Nodes idle longest first, so a node's timer survives other nodes coming and going.
        ready.sort(key=lambda n: (n.idle_since is None, n.idle_since or 0.0, -n.ready_at))
        return ready

    def best_node(self, cpu: float, mem: float, gpus: int, now: float) -> Node | None:
        """Where one replica goes: kube-scheduler `MostAllocated` bin-packing (best fit).

        Ready nodes before booting ones, then the node with the fewest free GPUs, then the
        least free CPU (so work fills busy nodes and empty ones stay empty and can go).
        """
        node = self.node
        fit = [n for n in self.node_list if n.fits(node, cpu, mem, gpus)]
        if not fit:
            return None
        return min(fit, key=lambda n: (n.ready_at > now, n.gpu_free if gpus else 0,
                                       node.cpu - n.used_cpu, n.ready_at))

    def fit_count(self, n: Node, cpu: float, mem: float, gpus: int) -> int:
        """How many replicas of this shape still fit on node n."""
        node = self.node
        k = 1 << 30
        if cpu > 0:
            k = min(k, int((node.cpu - n.used_cpu) / cpu + _EPS))
        if mem > 0:
            k = min(k, int((node.memory_gib - n.used_mem) / mem + _EPS))
        if gpus > 0:
            k = min(k, n.gpu_free // gpus)
        return max(k, 0)

    def place_many(self, cpu: float, mem: float, gpus: int, want: int,
                   now: float) -> list[Node]:
        """Up to `want` replicas, each on the node `best_node` would pick: one pass.

        Repeated best fit of one shape fills the chosen node until it is full, then the next
        in the same order, so sorting the nodes once by `best_node`'s key is the same rule.
        """
        node = self.node
        room = []
        big, n_cpu, n_mem = 1 << 30, node.cpu, node.memory_gib
        for n in self.node_list:  # fit_count, inlined (and its min()s): this scans the pool
            if n.cordoned:            # per placement
                continue
            k = big
            if cpu > 0 and (f := int((n_cpu - n.used_cpu) / cpu + _EPS)) < k:
                k = f
            if mem > 0 and (f := int((n_mem - n.used_mem) / mem + _EPS)) < k:
                k = f
            if gpus > 0 and (f := n.gpu_free // gpus) < k:
                k = f
            if k > 0:
                room.append((n, k))
        room.sort(key=lambda nk: (nk[0].ready_at > now, nk[0].gpu_free if gpus else 0,
                                  node.cpu - nk[0].used_cpu, nk[0].ready_at))
        out: list[Node] = []
        for n, k in room:
            for _ in range(min(k, want - len(out))):
                self.occupy(n, cpu, mem, gpus)
                out.append(n)
            if len(out) >= want:
                break
        return out

    def utilization(self, n: Node) -> float:
        """placement/consolidate.py's node utilisation (GPUs on GPU nodes, else CPU/memory)."""
        node = self.node
        if node.gpu > 0:
            return (node.gpu - n.gpu_free) / node.gpu
        return max(n.used_cpu / node.cpu if node.cpu > 0 else 0.0,
                   n.used_mem / node.memory_gib if node.memory_gib > 0 else 0.0)

    def occupy(self, n: Node, cpu: float, mem: float, gpus: int) -> None:
        self.node_changed(n)
        n.used_cpu += cpu
        n.used_mem += mem
        n.gpu_free -= gpus
        n.replicas += 1
        n.idle_since = None
        if n.underused_since is not None and self.utilization(n) >= CA_UTILIZATION_THRESHOLD:
            n.underused_since = None
        self.used_cpu += cpu
        self.used_mem += mem

    def vacate(self, n: Node, cpu: float, mem: float, gpus: int, now: float) -> None:
        self.node_changed(n)
        # max(0.0, x) and the like, written out (what max/min return, ties included).
        x = self.used_cpu - cpu
        self.used_cpu = x if x > 0.0 else 0.0
        x = self.used_mem - mem
        self.used_mem = x if x > 0.0 else 0.0
        if not self.holds(n):
            return  # the node is gone (reclaimed): nothing to give back
        x = n.used_cpu - cpu
        n.used_cpu = x if x > 0.0 else 0.0
        x = n.used_mem - mem
        n.used_mem = x if x > 0.0 else 0.0
        per_node = self.node.gpu
        free = n.gpu_free + gpus
        n.gpu_free = free if free < per_node else per_node
        n.replicas = n.replicas - 1 if n.replicas > 1 else 0
        if n.empty(per_node) and n.ready_at <= now:
            n.idle_since = now
        if n.underused_since is None and self.utilization(n) < CA_UTILIZATION_THRESHOLD:
            n.underused_since = n.ready_at if n.ready_at > now else now

    def take_spread(self, gpus: int) -> list[Node] | None:
        """Take `gpus` GPUs across nodes (most free first); None if the pool lacks them."""
        open_nodes = [n for n in self.node_list if not n.cordoned]
        if sum(n.gpu_free for n in open_nodes) < gpus:
            return None
        self.changed()
        taken: list[Node] = []
        for n in sorted(open_nodes, key=lambda n: -n.gpu_free):
            while n.gpu_free > 0 and len(taken) < gpus:
                n.gpu_free -= 1
                n.idle_since = None
                taken.append(n)
        return taken

    def add_nodes(self, count: int, ready_at: float, *, prewarmed: bool = False,
                  ordered_at: float | None = None) -> int:
        """Order nodes; each goes to the zone with the fewest nodes (zone-balanced groups).
        `ordered_at`: when they were ordered, so their boot is measured (`boots`)."""
        count = max(0, min(count, self.spec.max_nodes - self.nodes))
        if count and ordered_at is not None:
            self.boots.append((ready_at, ready_at - ordered_at))
            del self.boots[:-2 * BOOT_SAMPLES]
            self.boot_seen = None
        per_zone = [0] * max(1, self.zones)  # kept as nodes come: one count, not one a node
        for n in self.node_list:
            per_zone[n.zone % len(per_zone)] += 1
        for _ in range(count):
            zone = per_zone.index(min(per_zone))
            per_zone[zone] += 1
            self.node_list.insert(bisect.bisect_right(self.node_list, ready_at, key=_ready_at),
                                  Node(ready_at, self.node.gpu, prewarmed, zone=zone,
                                       underused_since=ready_at))
        self.changed()
        return count

    def observed_boot_s(self, now: float) -> float | None:
        """The pool's measured boot time at `now` (observed.boot_s over the orders whose
        nodes are up by then), None before the first is up: what a broker that timed its
        own orders would know (observed.py rule 6)."""
        seen = self.boot_seen
        if seen is not None and seen[0] <= now < seen[1]:
            return seen[2]
        value = boot_s([d for r, d in self.boots if r <= now])
        until = min([r for r, _ in self.boots if r > now], default=math.inf)
        self.boot_seen = (now, until, value)
        return value

    def check(self) -> None:
        eps = 1e-6
        n = self.nodes
        mem_cap = n * self.node.memory_gib
        if (self.used_cpu > n * self.node.cpu + eps or self.used_mem > mem_cap + eps
                or self.used_cpu < -eps or self.used_mem < -eps):
            raise CapacityError(f"{self.cluster}/{self.name}: used cpu {self.used_cpu:.2f} mem "
                                f"{self.used_mem:.2f} > {n} nodes of {self.node}")
        if any(x.gpu_free < 0 or x.gpu_free > self.node.gpu for x in self.node_list):
            raise CapacityError(f"{self.cluster}/{self.name}: GPU count per node out of range")
        node = self.node
        for x in self.node_list:
            if x.used_cpu > node.cpu + eps or x.used_mem > node.memory_gib + eps:
                raise CapacityError(f"{self.cluster}/{self.name}: a node holds cpu "
                                    f"{x.used_cpu:.2f} mem {x.used_mem:.2f} > {node}")


@dataclass(slots=True)
class SimCluster:
    spec: ClusterSpec
    pools: list[SimPool]
    down_until: float = -1.0  # site_down
    partitioned_until: float = -1.0  # partition: unreachable for new placements
    quota_vcpu: float | None = None
    # The snapshot's registration of this cluster and what it was built from (sim/snapshot.py).
    registered: tuple[tuple[object, ...], Member] | None = None
    # The snapshot's pool readings by pool: (the pools' versions then, valid until (a booting
    # node's ready_at), the mapping) (sim/snapshot.py).
    observations: tuple[tuple[int, ...], float, dict[str, PoolObservation]] | None = None
    # The snapshot's member and inventory of this cluster: (what they were made of, valid
    # until (a booting node's ready_at), the member, the inventory) (sim/snapshot.py).
    inputs: tuple[tuple[object, ...], float, Member, Inventory] | None = None

    name: str = field(init=False, repr=False, compare=False)  # the spec's

    def __post_init__(self) -> None:
        self.name = self.spec.name

    def healthy(self, now: float) -> bool:
        return now >= self.down_until and now >= self.partitioned_until

    def pool(self, name: str) -> SimPool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no pool {name!r}")

    def used_vcpu(self) -> float:
        return sum(p.used_cpu for p in self.pools)


def make_cluster(spec: ClusterSpec) -> SimCluster:
    zones = max(1, len(spec.zones))
    pools = [SimPool(spec=p, cluster=spec.name, zones=zones,
                     node_list=[Node(0.0, p.node.gpu, zone=i % zones, underused_since=0.0)
                                for i in range(p.nodes)])
             for p in spec.pools]
    return SimCluster(spec=spec, pools=pools, quota_vcpu=spec.quota_vcpu)


@dataclass(slots=True, eq=False)
class Group:
    """Replicas of one workload on one pool, placed in one decision."""

    cluster: str
    pool: str
    count: int
    gpu_nodes: list[list[Node]]  # per replica: the node of each of its GPUs
    placed_s: float
    nodes: list[Node] = field(default_factory=list)  # per replica: the node it runs on
    ready_s: float = math.inf
    running: bool = False
    token: int = 0  # identifies this group in scheduled events
    # Its replicas per zone as metrics.py last counted them, with len(nodes) then: `nodes`
    # only ever loses entries (a replica released), so an equal length means an equal count.
    zones: tuple[int, Counter[int]] | None = None


@dataclass(slots=True)
class WorkloadState:
    ev: TraceEvent
    desired: int
    pending: int
    groups: list[Group] = field(default_factory=list)
    pending_since: float = 0.0
    # The count of finished planning epochs from which one has seen it pending since it last
    # joined the queue (Engine.queued): `unplaced` counts only work an epoch left pending, not
    # what the horizon's own epoch drained or what arrived after the last epoch (metrics.py).
    queued_for_epoch: int = 1
    max_running: int = 0
    started_s: float | None = None
    finished: bool = False
    run_token: int = 0  # bumped when a gang job restarts: stale FINISH events are ignored
    ever_started: bool = False
    # A restartable job's checkpointed work (engine.evict): the fraction of its run done, and
    # the current run's start and whole run time where it runs now (None: not running).
    done_frac: float = 0.0
    run_from_s: float | None = None
    run_full_s: float = 0.0
    tried_s: float = -1e18  # the planner's last attempt (planner.Retry)
    tries: int = 0  # planner attempts that left it (partly) unplaced (planner.Retry)
    # A migration in flight: its target group and the source groups drained once it is ready.
    moving: tuple[Group, list[Group]] | None = None
    # Sites it was evicted from by a failure (its preferred home: Migration "recovered").
    displaced: list[str] = field(default_factory=list)
    # Outstanding scale-out requests: (requested at, replicas that must run).
    scale_requests: list[tuple[float, int]] = field(default_factory=list)
    xz_rate: float = 0.0  # bytes/s this service contributes (cross-zone part)
    traffic_rate: float = 0.0
    slo_target: float = 0.0
    slo_violation: float = 0.0
    # Running replicas x RTT(user region, their cluster) in ms, and those replicas (a service
    # with a user region; metrics.user_rtt_ms_mean).
    rtt_rate: float = 0.0
    rtt_replicas: float = 0.0
    # The workload the snapshot last showed and its (replicas, tries, tried_s) (sim/snapshot.py).
    as_workload: tuple[tuple[int, int, float], Workload] | None = None
    # Where it runs as the snapshot last showed it: its groups' (cluster, pool, count) and
    # the placement made of them (sim/snapshot.py running_placement).
    as_running: tuple[tuple[tuple[str, str, int], ...], Placement] | None = None

    @property
    def running(self) -> int:
        groups = self.groups
        return sum(compress(map(_COUNT, groups), map(_RUNNING, groups)))

    @property
    def placed(self) -> int:
        return sum(map(_COUNT, self.groups))
