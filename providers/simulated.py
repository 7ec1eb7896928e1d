"""An in-memory member cluster: the ClusterDriver the demo, the twin and dispatcher tests use.

Why: placement, dispatch and failover must be exercised without a real cluster, with the same
contract (idempotent apply keyed by workload id, status, delete, inventory) as
providers/kubernetes.py. Behaviour is deterministic for a given seed and clock:

- Pools hold identical nodes (cpu, memory, GPUs, GPU model/interconnect, labels, taints).
- ``apply`` packs replicas first-fit onto their pool's ready nodes (``ApplySpec.pools``: a
  split over pools keeps each pool's count); what does not fit stays pending (unschedulable).
  Applying the same spec again is a no-op. A replica runs ``startup_s`` (injected clock) after
  it was scheduled. A changed replica count scales in place; any other change (e.g. another
  pool) rolls out like a Deployment with ``maxUnavailable: 0``: the old spec's running
  replicas keep running, and count as ready, until every replica of the new spec is ready.
- Batch/train workloads run until ``finish()`` (the twin decides durations); services run forever.
- Faults: ``FailureInjection`` rates raise ThrottledError/TransientError from a seeded RNG
  *before* any state changes (so a failed call never half-applies); ``set_down(True)`` makes every
  call fail like an unreachable API server; ``fail_node()`` evicts a node's replicas to pending.
- Pools scale (``scale_pool``, ``Capability.SCALE_POOL``): ordered nodes boot for ``boot_s``
  seconds (injected clock) before they join the inventory and take replicas, as cloud nodes
  join a cluster minutes after they are ordered; only empty nodes are removed.
- Node loss ahead of time: ``taint_node()`` (e.g. a spot interruption notice's
  ``aws-node-termination-handler/spot-itn``) and ``cordon_node()`` keep new replicas off a node
  and show in its inventory, while what runs there keeps running.
- Prewarm (``Capability.PREWARM``): images and data recorded per pool; done after ``prewarm_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from providers.base import (
    ApplySpec,
    Capability,
    DriverStatus,
    NodeInventory,
    NodeTopology,
    PrewarmSpec,
    WorkloadPhase,
)
from providers.errors import (
    NotFoundError,
    ProviderError,
    ThrottledError,
    TransientError,
)
from providers.kubernetes_objects import GPU_RESOURCE
from providers.simulated_pools import FailureInjection, SimPool

__all__ = ["FailureInjection", "SimPool", "SimulatedClusterDriver"]

Clock = Callable[[], float]


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
    booted_at: float = 0.0  # joins the cluster (inventory, scheduling) at this clock time


@dataclass(slots=True)
class _Replica:
    node: str | None  # None: pending (unschedulable)
    scheduled_at: float | None = None
    pool: str = ""  # the pool it must run in ("": any)


@dataclass(slots=True)
class _Workload:
    spec: ApplySpec
    replicas: list[_Replica]
    finished: WorkloadPhase | None = None
    message: str = ""
    # The previous spec's replicas while a patch rolls out (released once the new are ready).
    old: list[tuple[ApplySpec, _Replica]] = field(default_factory=list)


class SimulatedClusterDriver:
    """ClusterDriver over in-memory pools (see module docstring)."""

    capabilities = frozenset({Capability.GPU_TOPOLOGY, Capability.SCALE_POOL,
                              Capability.PREWARM})

    def __init__(
        self,
        name: str,
        pools: Sequence[SimPool],
        *,
        seed: int = 0,
        clock: Clock = time.monotonic,
        startup_s: float = 0.0,
        boot_s: float = 0.0,
        prewarm_s: float = 0.0,
        failures: FailureInjection | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._rng = random.Random(seed)
        self.startup_s = startup_s
        self.boot_s = boot_s
        self.prewarm_s = prewarm_s
        self.failures = failures or FailureInjection()
        self._down = False
        self._pools: dict[str, SimPool] = {}
        self._nodes: dict[str, _Node] = {}
        self._workloads: dict[str, _Workload] = {}
        self._booting = False
        self.prewarms: dict[str, tuple[PrewarmSpec, float]] = {}  # key -> (spec, started at)
        self.calls: dict[str, int] = {"apply": 0, "delete": 0, "status": 0}
        for pool in pools:
            self._pools[pool.name] = pool
            self._add_nodes(pool, pool.nodes, booted_at=float("-inf"))

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
        self._evict(node)

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
        """Names of a pool's nodes, ordered ones still booting included."""
        return sorted(n.name for n in self._nodes.values() if n.pool.name == pool)

    def finish(self, workload_id: str, *, failed: bool = False, message: str = "") -> None:
        """End a batch/train workload (the twin decides when); frees its resources."""
        w = self._get(workload_id)
        for r in w.replicas:
            self._release(w.spec, r)
        self._drop_old(w)
        w.finished = WorkloadPhase.FAILED if failed else WorkloadPhase.SUCCEEDED
        w.message = message
        self._reschedule()

    def scale(self, *, pool: str, nodes: int) -> int:
        """Grow or shrink a pool to `nodes` nodes (new ones boot for `boot_s`; shrinking
        removes empty nodes only, newest first); returns the pool's count, booting included."""
        p = self._pools.get(pool)
        if p is None:
            raise NotFoundError(f"unknown pool {pool!r} in cluster {self.name!r}")
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        mine = self._pool_nodes(pool)
        if nodes > len(mine):
            taken = {n.name for n in mine}
            self._add_nodes(p, nodes - len(mine), start=0, taken=taken,
                            booted_at=self._clock() + self.boot_s)
            self._reschedule()
        else:
            for n in reversed(mine):
                if len(self._pool_nodes(pool)) <= nodes:
                    break
                if self._empty(n):
                    del self._nodes[n.name]
        return len(self._pool_nodes(pool))

    def remove_node(self, node: str) -> None:
        """The node disappears (the cloud reclaimed it): its replicas go back to pending."""
        n = self._node(node)
        self._evict(node)
        del self._nodes[n.name]
        self._reschedule()

    def replicas_on(self, node: str) -> int:
        """How many replicas run (are scheduled) on `node`, a rollout's old ones included."""
        return sum(1 for w in self._workloads.values()
                   for r in (*w.replicas, *(r for _, r in w.old)) if r.node == node)

    # ---- PoolScalingDriver / PrewarmingDriver ---------------------------------------------
    async def scale_pool(self, *, pool: str, nodes: int) -> int:
        self._maybe_fail("scale", 0.0)
        return self.scale(pool=pool, nodes=nodes)

    async def remove_nodes(self, *, pool: str, nodes: Sequence[str]) -> int:
        """Remove the named nodes of `pool` that are empty (others stay); returns the count."""
        self._maybe_fail("scale", 0.0)
        if pool not in self._pools:
            raise NotFoundError(f"unknown pool {pool!r} in cluster {self.name!r}")
        for name in nodes:
            n = self._nodes.get(name)
            if n is not None and n.pool.name == pool and self._empty(n):
                del self._nodes[name]
        return len(self._pool_nodes(pool))

    async def prewarm(self, *, spec: PrewarmSpec) -> None:
        self._maybe_fail("prewarm", 0.0)
        if spec.pool and spec.pool not in self._pools:
            raise NotFoundError(f"unknown pool {spec.pool!r} in cluster {self.name!r}")
        if spec.key not in self.prewarms:
            self.prewarms[spec.key] = (spec, self._clock())

    async def prewarm_done(self, *, key: str) -> bool:
        self._maybe_fail("status", 0.0)
        started = self.prewarms.get(key)
        if started is None:
            raise NotFoundError(f"no prewarm {key!r} in cluster {self.name!r}")
        return self._clock() - started[1] >= self.prewarm_s

    # ---- ClusterDriver ------------------------------------------------------------------
    async def apply(self, *, spec: ApplySpec) -> None:
        await self._fail_point("apply", self.failures.apply_error_rate)
        self._check_pool(spec)
        old = self._workloads.get(spec.workload_id)
        if old is not None and old.spec == spec and old.finished is None:
            return
        if old is not None and old.finished is None and \
                dataclasses.replace(old.spec, replicas=spec.replicas) == spec:
            self._rescale(old, spec)  # only the count changed: a scale, not a rollout
            return
        surge: list[tuple[ApplySpec, _Replica]] = []
        if old is not None:
            for r in old.replicas:
                if old.finished is None and r.node is not None:
                    surge.append((old.spec, r))  # keeps running until the new are ready
                else:
                    self._release(old.spec, r)
            surge.extend(old.old)
        w = _Workload(spec=spec, replicas=_replicas(spec), old=surge)
        self._workloads[spec.workload_id] = w
        self._reschedule()

    async def delete(self, *, workload_id: str) -> None:
        await self._fail_point("delete", self.failures.delete_error_rate)
        w = self._workloads.pop(workload_id, None)
        if w is None:
            return  # deleting what is gone is success (like a 404 on delete)
        for r in w.replicas:
            self._release(w.spec, r)
        self._drop_old(w)
        self._reschedule()

    async def status(self, *, workload_id: str) -> DriverStatus:
        await self._fail_point("status", self.failures.status_error_rate)
        return self._status(self._get(workload_id))

    async def list_status(self) -> list[DriverStatus]:
        await self._fail_point("status", self.failures.status_error_rate)
        return [self._status(w) for _, w in sorted(self._workloads.items())]

    async def inventory(self) -> list[NodeInventory]:
        """Nodes that joined the cluster (ordered ones still booting are not listed)."""
        self._maybe_fail("status", 0.0)
        out = []
        now = self._clock()
        on_node: dict[str, int] = {}
        ids: dict[str, dict[str, None]] = {}
        for wid, w in self._workloads.items():
            if w.finished is None:
                for r in (*w.replicas, *(r for _, r in w.old)):
                    if r.node is not None:
                        on_node[r.node] = on_node.get(r.node, 0) + 1
                        ids.setdefault(r.node, {})[wid] = None
        for n in sorted(self._nodes.values(), key=lambda n: n.name):
            if n.booted_at > now:
                continue
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
                workloads=tuple(ids.get(n.name, ())),
            ))
        return out

    # ---- internals ----------------------------------------------------------------------
    def _add_nodes(self, pool: SimPool, count: int, start: int = 0, *,
                   taken: set[str] | None = None, booted_at: float = float("-inf")) -> None:
        i = start
        while count > 0:
            name = f"{self.name}-{pool.name}-{i}"
            i += 1
            if name in self._nodes or (taken is not None and name in taken):
                continue
            self._nodes[name] = _Node(name=name, pool=pool, booted_at=booted_at)
            if booted_at > self._clock():
                self._booting = True
            count -= 1

    def _pool_nodes(self, pool: str) -> list[_Node]:
        return sorted((n for n in self._nodes.values() if n.pool.name == pool),
                      key=lambda n: (len(n.name), n.name))

    @staticmethod
    def _empty(n: _Node) -> bool:
        return n.used_cpu <= 1e-9 and n.used_gpu == 0 and n.used_memory_gib <= 1e-9

    def _boot(self) -> None:
        """Nodes whose boot finished take the replicas that were waiting for room."""
        if not self._booting:
            return
        now = self._clock()
        self._booting = any(n.booted_at > now for n in self._nodes.values())
        self._reschedule()

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
        self._boot()
        if self._down:
            raise TransientError(f"cluster {self.name!r} is unreachable", provider="simulated")
        if rate > 0 and self._rng.random() < rate:
            if self.failures.timeout_share > 0 and self._rng.random() < self.failures.timeout_share:
                raise _InjectedTimeout(op)
            err: type[ProviderError] = (
                ThrottledError if self._rng.random() < self.failures.throttle_share
                else TransientError
            )
            raise err(f"injected fault on {op} in cluster {self.name!r}", provider="simulated")

    async def _fail_point(self, op: str, rate: float) -> None:
        """`_maybe_fail` for the calls that can time out (apply, delete, status)."""
        try:
            self._maybe_fail(op, rate)
        except _InjectedTimeout:
            await asyncio.sleep(self.failures.timeout_s)
            raise TransientError(f"injected timeout on {op} in cluster {self.name!r} after "
                                 f"{self.failures.timeout_s} s", provider="simulated") from None

    def _check_pool(self, spec: ApplySpec) -> None:
        for pool in spec.pools():
            if pool and pool not in self._pools:
                raise NotFoundError(
                    f"pool {pool!r} does not exist in cluster {self.name!r} "
                    f"(pools: {', '.join(sorted(self._pools))})"
                )

    def _fits(self, spec: ApplySpec, n: _Node, now: float,
              placeable: dict[tuple[str, str], bool], pool: str) -> bool:
        p = n.pool
        if not n.ready or n.unschedulable or n.booted_at > now or (pool and p.name != pool):
            return False
        key = (spec.workload_id, p.name)  # selector and pool taints: once per pass
        if key not in placeable:
            labels = {**p.labels, "skyfed.io/pool": p.name}
            placeable[key] = all(labels.get(k) == v for k, v in spec.node_selector.items()) \
                and self._tolerates(spec, p.taints)
        if not placeable[key] or (n.taints and not self._tolerates(spec, n.taints)):
            return False
        eps = 1e-9
        return (n.used_cpu + spec.cpu <= p.cpu_per_node + eps
                and n.used_memory_gib + spec.memory_gib <= p.memory_gib_per_node + eps
                and n.used_gpu + spec.gpu <= p.gpu_per_node)

    @staticmethod
    def _tolerates(spec: ApplySpec, taints: Sequence[str]) -> bool:
        tolerated = {str(t.get("key", "")) for t in spec.tolerations}
        if spec.gpu:  # the pod template tolerates the GPU taint (kubernetes_objects.py)
            tolerated.add(GPU_RESOURCE)
        return all(t.split("=")[0].split(":")[0] in tolerated for t in taints
                   if not t.endswith(":PreferNoSchedule"))

    def _rescale(self, w: _Workload, spec: ApplySpec) -> None:
        keep = sorted(w.replicas, key=lambda r: r.node is None)  # scheduled ones first
        for r in keep[spec.replicas:]:
            self._release(w.spec, r)
        w.replicas = keep[:spec.replicas] + [
            _Replica(node=None, pool=spec.pool) for _ in range(spec.replicas - len(keep))]
        w.spec = spec
        self._reschedule()

    def _evict(self, node: str) -> None:
        """Replicas on `node` back to pending (old-spec ones of a rollout just end)."""
        for w in self._workloads.values():
            for r in w.replicas:
                if r.node == node:
                    self._release(w.spec, r)
            for spec, r in [x for x in w.old if x[1].node == node]:
                self._release(spec, r)
                w.old.remove((spec, r))
        self._reschedule()

    def _drop_old(self, w: _Workload) -> None:
        for spec, r in w.old:
            self._release(spec, r)
        w.old.clear()

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
        nodes: list[_Node] | None = None  # sorted once, and only when something waits
        placeable: dict[tuple[str, str], bool] = {}
        for _, w in sorted(self._workloads.items()):
            if w.finished is not None:
                continue
            for r in w.replicas:
                if r.node is not None:
                    continue
                if nodes is None:
                    nodes = sorted(self._nodes.values(), key=lambda n: n.name)
                for n in nodes:
                    if self._fits(w.spec, n, now, placeable, r.pool):
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
        if w.old and ready >= desired:
            self._drop_old(w)  # the rollout is complete: the old spec's replicas end
            self._reschedule()
        ready = min(desired, ready + sum(
            1 for _, r in w.old if r.scheduled_at is not None
            and now - r.scheduled_at >= self.startup_s))
        pending = sum(1 for r in w.replicas if r.node is None)
        phase = WorkloadPhase.RUNNING if ready == desired else WorkloadPhase.PENDING
        msg = f"{pending} replica(s) unschedulable" if pending else ""
        return DriverStatus(workload_id=w.spec.workload_id, phase=phase, ready_replicas=ready,
                            desired_replicas=desired, message=msg)


def _replicas(spec: ApplySpec) -> list[_Replica]:
    """One pending replica per replica of each pool (`ApplySpec.pools`)."""
    return [_Replica(node=None, pool=pool) for pool, n in sorted(spec.pools().items())
            for _ in range(n)]


class _InjectedTimeout(Exception):  # an internal signal: it never leaves the driver
    """An injected fault that is a timeout (`FailureInjection.timeout_share`)."""
