"""Mutable simulated state: pools with nodes, clusters, and the workloads in flight.

Capacity model: a pool is a list of nodes, each with the time it becomes ready (booting nodes
are paid and may be reserved, but replicas on them start only once they are up). CPU and
memory are tracked per pool in aggregate (the planner sees pools in aggregate too); GPUs are
tracked per node because multi-GPU jobs need GPUs on one node and the speedup depends on it.
The engine checks the invariant `used <= provisioned` (per pool, and GPUs per node) after
every change; `CapacityError` means a bug, never a normal outcome.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from broker.domain import Resources
from broker.placement.observed import decayed
from broker.sim.scenario import ClusterSpec, PoolSpec, TraceEvent


class CapacityError(RuntimeError):
    """The simulated state broke a capacity invariant (a bug in the twin or the planner)."""


@dataclass(slots=True, eq=False)
class Node:
    ready_at: float
    gpu_free: int
    prewarmed: bool = False
    idle_since: float | None = None  # scale-in timer (Cluster Autoscaler's "unneeded")


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
    demand_at_s: float = 0.0  # when the two rates above were last brought up to date

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def node(self) -> Resources:
        return self.spec.node

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

    def decay_demand(self, now: float, tau_s: float) -> None:
        self.demand_cpu_per_s = decayed(self.demand_cpu_per_s, self.demand_at_s, now, tau_s)
        self.demand_gpu_per_s = decayed(self.demand_gpu_per_s, self.demand_at_s, now, tau_s)
        self.demand_at_s = max(self.demand_at_s, now)

    def ready_nodes(self, now: float) -> int:
        return sum(1 for n in self.node_list if n.ready_at <= now)

    @property
    def used_gpu(self) -> int:
        return sum(self.node.gpu - n.gpu_free for n in self.node_list) if self.node.gpu else 0

    def free(self) -> Resources:
        n = self.nodes
        return Resources(n * self.node.cpu - self.used_cpu,
                         n * self.node.memory_gib - self.used_mem,
                         sum(x.gpu_free for x in self.node_list) if self.node.gpu else 0)

    def largest_free_gpu_set(self) -> int:
        return max((n.gpu_free for n in self.node_list), default=0) if self.node.gpu else 0

    def idle_nodes(self, now: float) -> list[Node]:
        """Ready nodes that could go without evicting anything (aggregate CPU/memory model)."""
        free = self.free()
        k = int(min(free.cpu // max(self.node.cpu, 1e-9),
                    free.memory_gib // max(self.node.memory_gib, 1e-9)))
        if k <= 0:
            return []
        ready = [n for n in self.node_list if n.ready_at <= now and n.gpu_free == self.node.gpu]
        # Nodes idle longest first, so a node's timer survives other nodes coming and going.
        ready.sort(key=lambda n: (n.idle_since is None, n.idle_since or 0.0, -n.ready_at))
        return ready[:k]

    def best_gpu_node(self, gpus: int, now: float) -> Node | None:
        """Best fit for `gpus` GPUs on one node: ready nodes first, then fewest free GPUs."""
        fit = [n for n in self.node_list if n.gpu_free >= gpus]
        if not fit:
            return None
        return min(fit, key=lambda n: (n.ready_at > now, n.gpu_free, n.ready_at))

    def take_spread(self, gpus: int) -> list[Node] | None:
        """Take `gpus` GPUs across nodes (most free first); None if the pool lacks them."""
        if sum(n.gpu_free for n in self.node_list) < gpus:
            return None
        taken: list[Node] = []
        for n in sorted(self.node_list, key=lambda n: -n.gpu_free):
            while n.gpu_free > 0 and len(taken) < gpus:
                n.gpu_free -= 1
                taken.append(n)
        return taken

    def ready_for(self, now: float, gpu_nodes: list[list[Node]]) -> float:
        """When enough nodes are up to hold everything reserved here (and these GPUs' nodes)."""
        t = now
        for grp in gpu_nodes:
            for n in grp:
                t = max(t, n.ready_at)
        need = max(math.ceil(self.used_cpu / self.node.cpu - 1e-9) if self.node.cpu else 0,
                   math.ceil(self.used_mem / self.node.memory_gib - 1e-9)
                   if self.node.memory_gib else 0)
        if 0 < need <= self.nodes:
            t = max(t, self.node_list[need - 1].ready_at)
        return t

    def add_nodes(self, count: int, ready_at: float, *, prewarmed: bool = False) -> int:
        count = max(0, min(count, self.spec.max_nodes - self.nodes))
        for _ in range(count):
            keys = [n.ready_at for n in self.node_list]
            self.node_list.insert(bisect.bisect_right(keys, ready_at),
                                  Node(ready_at, self.node.gpu, prewarmed))
        return count

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


@dataclass(slots=True)
class SimCluster:
    spec: ClusterSpec
    pools: list[SimPool]
    down_until: float = -1.0  # site_down
    partitioned_until: float = -1.0  # partition: unreachable for new placements
    quota_vcpu: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

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
    pools = [SimPool(spec=p, cluster=spec.name,
                     node_list=[Node(0.0, p.node.gpu) for _ in range(p.nodes)])
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
    ready_s: float = math.inf
    running: bool = False
    token: int = 0  # identifies this group in scheduled events


@dataclass(slots=True)
class WorkloadState:
    ev: TraceEvent
    desired: int
    pending: int
    groups: list[Group] = field(default_factory=list)
    pending_since: float = 0.0
    max_running: int = 0
    started_s: float | None = None
    finished: bool = False
    run_token: int = 0  # bumped when a gang job restarts: stale FINISH events are ignored
    ever_started: bool = False
    tried_version: int = -1  # capacity version at the last planner attempt
    tried_s: float = -1e18
    tries: int = 0  # planner attempts while pending (backoff)
    # Outstanding scale-out requests: (requested at, replicas that must run).
    scale_requests: list[tuple[float, int]] = field(default_factory=list)
    xz_rate: float = 0.0  # bytes/s this service contributes (cross-zone part)
    traffic_rate: float = 0.0
    slo_target: float = 0.0
    slo_violation: float = 0.0

    @property
    def running(self) -> int:
        return sum(g.count for g in self.groups if g.running)

    @property
    def placed(self) -> int:
        return sum(g.count for g in self.groups)
