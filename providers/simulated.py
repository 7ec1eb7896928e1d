"""An in-memory member cluster: the ClusterDriver the demo, the twin and dispatcher tests use.

Why: placement, dispatch and failover must be exercised without a real cluster, with the same
contract (idempotent apply keyed by workload id, status, delete, inventory) as
providers/kubernetes.py. Behaviour is deterministic for a given seed and clock:

- Pools hold identical nodes (cpu, memory, GPUs, GPU model/interconnect, labels, taints).
- ``apply`` packs replicas first-fit onto the target pool's ready nodes; replicas that do not fit
  stay pending (like unschedulable pods). Applying the same spec again is a no-op; a changed spec
  under the same id releases and re-packs it (a patch).
- A replica is running ``startup_s`` seconds (injected clock) after it was scheduled.
- Batch/train workloads run until ``finish()`` (the twin decides durations); services run forever.
- Faults: ``FailureInjection`` rates raise ThrottledError/TransientError from a seeded RNG
  *before* any state changes (so a failed call never half-applies); ``set_down(True)`` makes every
  call fail like an unreachable API server; ``fail_node()`` evicts a node's replicas to pending.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from providers.base import (
    ApplySpec,
    Capability,
    DriverStatus,
    Interconnect,
    NodeInventory,
    NodeTopology,
    Offer,
    Quota,
    Region,
    WorkloadPhase,
)
from providers.catalog import Catalog
from providers.errors import (
    NotFoundError,
    ProviderError,
    QuotaExceededError,
    ThrottledError,
    TransientError,
)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class SimPool:
    name: str
    nodes: int
    cpu_per_node: float
    memory_gib_per_node: float
    gpu_per_node: int = 0
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    instance_type: str = ""

    @classmethod
    def from_offer(cls, name: str, offer: Offer, *, nodes: int,
                   labels: Mapping[str, str] | None = None,
                   taints: tuple[str, ...] = ()) -> SimPool:
        """A pool of `nodes` nodes shaped like a catalog offer (GPU pools get the usual taint)."""
        if offer.gpu_count and not taints:
            taints = ("nvidia.com/gpu=present:NoSchedule",)
        return cls(name=name, nodes=nodes, cpu_per_node=offer.vcpu,
                   memory_gib_per_node=offer.memory_gib, gpu_per_node=offer.gpu_count,
                   gpu_model=offer.gpu_model, interconnect=offer.interconnect,
                   labels=dict(labels or {}), taints=taints, instance_type=offer.instance_type)


@dataclass(slots=True)
class FailureInjection:
    """Probabilities (0..1) that a call fails before touching state."""

    apply_error_rate: float = 0.0
    delete_error_rate: float = 0.0
    status_error_rate: float = 0.0
    throttle_share: float = 0.5  # of the injected errors, this share are 429s, the rest 5xx


@dataclass(slots=True)
class _Node:
    name: str
    pool: SimPool
    used_cpu: float = 0.0
    used_memory_gib: float = 0.0
    used_gpu: int = 0
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[str, ...] = ()  # on this node only (the pool's apply to all)


@dataclass(slots=True)
class _Replica:
    node: str | None  # None: pending (unschedulable)
    scheduled_at: float | None = None


@dataclass(slots=True)
class _Workload:
    spec: ApplySpec
    replicas: list[_Replica]
    finished: WorkloadPhase | None = None
    message: str = ""


class SimulatedClusterDriver:
    """ClusterDriver over in-memory pools (see module docstring)."""

    capabilities = frozenset({Capability.GPU_TOPOLOGY, Capability.SCALE_POOL})

    def __init__(
        self,
        name: str,
        pools: Sequence[SimPool],
        *,
        seed: int = 0,
        clock: Clock = time.monotonic,
        startup_s: float = 0.0,
        failures: FailureInjection | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._rng = random.Random(seed)
        self.startup_s = startup_s
        self.failures = failures or FailureInjection()
        self._down = False
        self._pools: dict[str, SimPool] = {}
        self._nodes: dict[str, _Node] = {}
        self._workloads: dict[str, _Workload] = {}
        self.calls: dict[str, int] = {"apply": 0, "delete": 0, "status": 0}
        for pool in pools:
            self._pools[pool.name] = pool
            self._add_nodes(pool, pool.nodes)

    # ---- fault control ------------------------------------------------------------------
    def set_down(self, down: bool) -> None:
        """Make the whole cluster unreachable (True) or reachable again (False)."""
        self._down = down

    @property
    def down(self) -> bool:
        return self._down

    def fail_node(self, node: str) -> None:
        """Mark a node not ready and push its replicas back to pending."""
        n = self._node(node)
        n.ready = False
        for w in self._workloads.values():
            for r in w.replicas:
                if r.node == node:
                    self._release(w.spec, r)
        self._reschedule()

    def recover_node(self, node: str) -> None:
        self._node(node).ready = True
        self._reschedule()

    def cordon_node(self, node: str, *, cordoned: bool = True) -> None:
        """`kubectl cordon`: no new replicas land there; running ones stay."""
        self._node(node).unschedulable = cordoned

    def taint_node(self, node: str, taint: str) -> None:
        """Add a `key=value:Effect` taint (e.g. a spot interruption notice) to one node."""
        n = self._node(node)
        n.taints = (*n.taints, taint)

    def nodes_of(self, pool: str) -> list[str]:
        return sorted(n.name for n in self._nodes.values() if n.pool.name == pool)

    def finish(self, workload_id: str, *, failed: bool = False, message: str = "") -> None:
        """End a batch/train workload (the twin decides when); frees its resources."""
        w = self._get(workload_id)
        for r in w.replicas:
            self._release(w.spec, r)
        w.finished = WorkloadPhase.FAILED if failed else WorkloadPhase.SUCCEEDED
        w.message = message
        self._reschedule()

    def scale(self, *, pool: str, nodes: int) -> int:
        """Grow or shrink a pool to `nodes` nodes (shrinking removes empty nodes only)."""
        p = self._pools.get(pool)
        if p is None:
            raise NotFoundError(f"unknown pool {pool!r} in cluster {self.name!r}")
        mine = [n for n in self._nodes.values() if n.pool.name == pool]
        if nodes > len(mine):
            self._add_nodes(p, nodes - len(mine), start=len(mine))
            self._reschedule()
        else:
            for n in reversed(mine):
                if len([m for m in self._nodes.values() if m.pool.name == pool]) <= nodes:
                    break
                if n.used_cpu == 0 and n.used_gpu == 0 and n.used_memory_gib == 0:
                    del self._nodes[n.name]
        return len([n for n in self._nodes.values() if n.pool.name == pool])

    # ---- ClusterDriver ------------------------------------------------------------------
    async def apply(self, *, spec: ApplySpec) -> None:
        self._maybe_fail("apply", self.failures.apply_error_rate)
        self._check_pool(spec)
        old = self._workloads.get(spec.workload_id)
        if old is not None and old.spec == spec and old.finished is None:
            return
        if old is not None:
            for r in old.replicas:
                self._release(old.spec, r)
        w = _Workload(spec=spec, replicas=[_Replica(node=None) for _ in range(spec.replicas)])
        self._workloads[spec.workload_id] = w
        self._reschedule()

    async def delete(self, *, workload_id: str) -> None:
        self._maybe_fail("delete", self.failures.delete_error_rate)
        w = self._workloads.pop(workload_id, None)
        if w is None:
            return  # deleting what is gone is success (like a 404 on delete)
        for r in w.replicas:
            self._release(w.spec, r)
        self._reschedule()

    async def status(self, *, workload_id: str) -> DriverStatus:
        self._maybe_fail("status", self.failures.status_error_rate)
        return self._status(self._get(workload_id))

    async def list_status(self) -> list[DriverStatus]:
        self._maybe_fail("status", self.failures.status_error_rate)
        return [self._status(w) for _, w in sorted(self._workloads.items())]

    async def inventory(self) -> list[NodeInventory]:
        self._maybe_fail("status", 0.0)
        out = []
        on_node: dict[str, int] = {}
        for w in self._workloads.values():
            if w.finished is None:
                for r in w.replicas:
                    if r.node is not None:
                        on_node[r.node] = on_node.get(r.node, 0) + 1
        for n in sorted(self._nodes.values(), key=lambda n: n.name):
            p = n.pool
            out.append(NodeInventory(
                name=n.name, pool=p.name, allocatable_cpu=p.cpu_per_node,
                allocatable_memory_gib=p.memory_gib_per_node, allocatable_gpu=p.gpu_per_node,
                used_cpu=round(n.used_cpu, 6), used_memory_gib=round(n.used_memory_gib, 6),
                used_gpu=n.used_gpu,
                labels={**p.labels, "skyfed.io/pool": p.name,
                        **({"node.kubernetes.io/instance-type": p.instance_type}
                           if p.instance_type else {})},
                taints=(*p.taints, *n.taints),
                topology=NodeTopology(gpu_count=p.gpu_per_node, gpu_model=p.gpu_model,
                                      interconnect=p.interconnect),
                ready=n.ready, unschedulable=n.unschedulable, replicas=on_node.get(n.name, 0),
            ))
        return out

    # ---- internals ----------------------------------------------------------------------
    def _add_nodes(self, pool: SimPool, count: int, start: int = 0) -> None:
        for i in range(start, start + count):
            name = f"{self.name}-{pool.name}-{i}"
            self._nodes[name] = _Node(name=name, pool=pool)

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise NotFoundError(f"unknown node {name!r} in cluster {self.name!r}") from None

    def _get(self, workload_id: str) -> _Workload:
        try:
            return self._workloads[workload_id]
        except KeyError:
            raise NotFoundError(
                f"workload {workload_id!r} not found in cluster {self.name!r}"
            ) from None

    def _maybe_fail(self, op: str, rate: float) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self._down:
            raise TransientError(f"cluster {self.name!r} is unreachable", provider="simulated")
        if rate > 0 and self._rng.random() < rate:
            err: type[ProviderError] = (
                ThrottledError if self._rng.random() < self.failures.throttle_share
                else TransientError
            )
            raise err(f"injected fault on {op} in cluster {self.name!r}", provider="simulated")

    def _check_pool(self, spec: ApplySpec) -> None:
        if spec.pool and spec.pool not in self._pools:
            raise NotFoundError(
                f"pool {spec.pool!r} does not exist in cluster {self.name!r} "
                f"(pools: {', '.join(sorted(self._pools))})"
            )

    def _fits(self, spec: ApplySpec, n: _Node) -> bool:
        p = n.pool
        if not n.ready or n.unschedulable or (spec.pool and p.name != spec.pool):
            return False
        labels = {**p.labels, "skyfed.io/pool": p.name}
        if any(labels.get(k) != v for k, v in spec.node_selector.items()):
            return False
        tolerated = {str(t.get("key", "")) for t in spec.tolerations}
        if any(t.split("=")[0].split(":")[0] not in tolerated for t in (*p.taints, *n.taints)):
            return False
        eps = 1e-9
        return (n.used_cpu + spec.cpu <= p.cpu_per_node + eps
                and n.used_memory_gib + spec.memory_gib <= p.memory_gib_per_node + eps
                and n.used_gpu + spec.gpu <= p.gpu_per_node)

    def _release(self, spec: ApplySpec, r: _Replica) -> None:
        if r.node is not None and r.node in self._nodes:
            n = self._nodes[r.node]
            n.used_cpu -= spec.cpu
            n.used_memory_gib -= spec.memory_gib
            n.used_gpu -= spec.gpu
        r.node, r.scheduled_at = None, None

    def _reschedule(self) -> None:
        """First-fit every pending replica, oldest workload first (deterministic)."""
        now = self._clock()
        for _, w in sorted(self._workloads.items()):
            if w.finished is not None:
                continue
            for r in w.replicas:
                if r.node is not None:
                    continue
                for n in sorted(self._nodes.values(), key=lambda n: n.name):
                    if self._fits(w.spec, n):
                        n.used_cpu += w.spec.cpu
                        n.used_memory_gib += w.spec.memory_gib
                        n.used_gpu += w.spec.gpu
                        r.node, r.scheduled_at = n.name, now
                        break

    def _status(self, w: _Workload) -> DriverStatus:
        desired = w.spec.replicas
        if w.finished is not None:
            return DriverStatus(workload_id=w.spec.workload_id, phase=w.finished,
                                ready_replicas=0, desired_replicas=desired, message=w.message)
        now = self._clock()
        ready = sum(1 for r in w.replicas
                    if r.scheduled_at is not None and now - r.scheduled_at >= self.startup_s)
        pending = sum(1 for r in w.replicas if r.node is None)
        phase = WorkloadPhase.RUNNING if ready == desired else WorkloadPhase.PENDING
        msg = f"{pending} replica(s) unschedulable" if pending else ""
        return DriverStatus(workload_id=w.spec.workload_id, phase=phase, ready_replicas=ready,
                            desired_replicas=desired, message=msg)


@dataclass(slots=True)
class SimulatedCloudOptions:
    """A catalog-priced cloud account without an API: for the demo, the twin and sync tests."""

    provider: str = "aws"  # whose catalog prices and regions to serve
    regions: tuple[str, ...] = ("us-east-1",)
    quota_vcpu: float = 1000.0
    quota_gpu: float = 64.0
    price_factor: float = 1.0  # multiply catalog prices (price_change scenarios)
    error_rate: float = 0.0  # share of calls that fail (throttle / 5xx / timeout, equally)
    timeout_s: float = 0.05  # how long an injected timeout hangs before failing
    seed: int = 0
    instance_types: tuple[str, ...] = ()  # serve only these (empty: the whole catalog)


class SimulatedCloudProvider:
    """CloudProvider over the offline catalog, with quotas and fault injection in memory."""

    capabilities = frozenset({Capability.LIST_REGIONS, Capability.LIST_OFFERS,
                              Capability.QUOTAS, Capability.SCALE_POOL})

    def __init__(self, options: SimulatedCloudOptions | None = None,
                 *, catalog: Catalog | None = None) -> None:
        self.options = options or SimulatedCloudOptions()
        self.name = self.options.provider
        self._catalog = catalog
        self._rng = random.Random(self.options.seed)
        self._pools: dict[tuple[str, str], int] = {}
        self._used_vcpu: dict[str, float] = {}
        self.calls = 0

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.load()
        return self._catalog

    async def _maybe_fail(self, region: str) -> None:
        self.calls += 1
        if self.options.error_rate <= 0 or self._rng.random() >= self.options.error_rate:
            return
        kind = self._rng.randrange(3)
        if kind == 0:
            raise ThrottledError("injected 429", provider=self.name, region=region)
        if kind == 1:
            raise TransientError("injected 503", provider=self.name, region=region)
        await asyncio.sleep(self.options.timeout_s)
        raise TransientError(f"injected timeout after {self.options.timeout_s:g} s",
                             provider=self.name, region=region)

    def _check_region(self, region: str) -> None:
        if region not in self.options.regions:
            raise NotFoundError(f"region {region!r} is not enabled for this account",
                                provider=self.name, region=region)

    async def list_regions(self) -> list[Region]:
        await self._maybe_fail("")
        return [self.catalog.region(self.name, r) for r in self.options.regions]

    async def list_offers(self, *, region: str) -> list[Offer]:
        self._check_region(region)
        await self._maybe_fail(region)
        f = self.options.price_factor
        return [
            dataclasses.replace(
                o,
                price_usd_per_hour=None if o.price_usd_per_hour is None
                else round(o.price_usd_per_hour * f, 6),
                spot_price_usd_per_hour=None if o.spot_price_usd_per_hour is None
                else round(o.spot_price_usd_per_hour * f, 6),
                source="live",
            )
            for o in self.catalog.offers(provider=self.name, region=region)
            if not self.options.instance_types or o.instance_type in self.options.instance_types
        ]

    async def get_quotas(self, *, region: str) -> list[Quota]:
        self._check_region(region)
        await self._maybe_fail(region)
        return [
            Quota(provider=self.name, region=region, metric="vcpu",
                  limit=self.options.quota_vcpu, used=self._used_vcpu.get(region, 0.0)),
            Quota(provider=self.name, region=region, metric="gpu", limit=self.options.quota_gpu),
        ]

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str],
    ) -> int:
        self._check_region(region)
        offer = self.catalog.offer(self.name, region, instance_type)
        await self._maybe_fail(region)
        before = self._pools.get((region, pool), 0)
        used = self._used_vcpu.get(region, 0.0) + (nodes - before) * offer.vcpu
        if used > self.options.quota_vcpu:
            raise QuotaExceededError(
                f"{nodes} x {instance_type} would use {used:g} vCPUs "
                f"> quota {self.options.quota_vcpu:g}", provider=self.name, region=region,
            )
        self._pools[(region, pool)] = nodes
        self._used_vcpu[region] = used
        return nodes
