"""Observed inventory -> pools the planner sees: the node rules of the snapshot merge. Pure.

Input: what a driver's `inventory()` reported (live, polled by broker/federation/inventory.py)
or the twin's simulated nodes, as `ObservedNode`s. Output: the registered `Pool` with its
observed fields replaced. The rules, in order (docs/snapshot.md has the table):

1. A node belongs to the pool its `pool` label names; an unlabelled node to the only pool
   of its instance type, else to the cluster's only pool; otherwise it is not counted.
2. A node is *leaving* (`NodeLeaving`) when it carries a termination taint (spot interruption
   notice, scale-down: `TERMINATION_TAINTS`), when it is NotReady after having been Ready, or
   when it is cordoned; in that order of precedence. A NotReady node never seen Ready is
   *booting* (kubelet registered, not Ready yet), not leaving.
3. Leaving nodes give no capacity: `nodes` counts the others (booting included: they are paid
   for and will be up soon), `used` sums what is requested on them, `node` is the smallest
   allocatable shape among them (a replica that fits it fits every node), `max_nodes` is
   at least the observed count. Every node, leaving ones too, is kept in `node_states` so
   the planner can move work off leaving nodes before they go.
4. `largest_free_gpu_set` is, over the counted nodes, the largest set of free GPUs one node
   offers connected by the pool's interconnect: all free GPUs for NVSwitch and PCIe nodes,
   the largest NVLink-connected free set (topology.py) for NVLink-pair nodes, whose used
   GPUs are taken to be the lowest ids (what topology.allocate prefers).
5. Spot reclaims: `reclaims / max(1, hours observed)`, the twin's formula.
6. Boot time (`Pool.boot_s`): the inventory's `boots` for the pool, seconds from ordering a
   node to its being Ready, the median of the pool's last `BOOT_SAMPLES` boots (`boot_s`);
   a pool none of whose boots was measured keeps its value (None: the planner's default).
   The twin measures each node it orders (sim/state.py); live, the actuator measures each
   node order it carries out and the snapshot reads the done ones
   (federation/decision_log.py `measured_boots`).
7. Taints (`Pool.taints`): the NoSchedule and NoExecute taints every counted node of the
   pool carries (the node pool's own, e.g. `nvidia.com/gpu:NoSchedule` on a Karpenter GPU
   NodePool or an EKS/AKS GPU node group set up as their docs advise); a pool with no
   counted node keeps the registered pool's (`PoolIn.taints`, docs/api.md).
   The placement masks read them (feasibility.pool_taints).

Demand (`demand_rate`): the EWMA of requested resources per second with time constant tau,
sum_i r_i / tau * exp(-(now - t_i) / tau) over placements i of r_i at t_i. The twin keeps the
same quantity incrementally (`decayed`); both give identical numbers for identical events.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from broker.domain import Interconnect, NodeLeaving, NodeState, Pool, Resources
from broker.placement.topology import for_instance, largest_nvlink_set

# Taint keys that announce a node's removal. Sources: aws-node-termination-handler README
# (spot-itn, scheduled-maintenance, asg-lifecycle-termination, rebalance-recommendation),
# Karpenter v1 (`karpenter.sh/disrupted`; v0.3x `karpenter.sh/disruption`), Cluster
# Autoscaler (`ToBeDeletedByClusterAutoscaler`), GKE (`cloud.google.com/impending-node-
# termination`), Kubernetes (`node.cloudprovider.kubernetes.io/shutdown`,
# `node.kubernetes.io/out-of-service`).
TERMINATION_TAINTS = frozenset({
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/rebalance-recommendation",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "ToBeDeletedByClusterAutoscaler",
    "cloud.google.com/impending-node-termination",
    "node.cloudprovider.kubernetes.io/shutdown",
    "node.kubernetes.io/out-of-service",
})


@dataclass(frozen=True, slots=True)
class ObservedNode:
    """One node as a driver last reported it (or the twin simulates it)."""

    name: str
    pool: str
    allocatable: Resources
    allocated: Resources = field(default_factory=Resources)  # requested by what runs there
    instance_type: str = ""
    ready: bool = True
    ever_ready: bool = True  # seen Ready before (False: still booting)
    unschedulable: bool = False  # cordoned
    taints: tuple[str, ...] = ()  # `key=value:Effect`
    idle_since_s: float | None = None  # first seen without replicas (the poller keeps it)
    prewarmed: bool = False
    workloads: tuple[str, ...] = ()  # ids of the workloads with replicas here
    underused_since_s: float | None = None  # below CA's 0.5 utilisation since (twin only)


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """Rules 2-4 applied to one pool's nodes (`observe`): what the merge writes into the
    registered `Pool`, but for what depends on the registration or the clock (`max_nodes`,
    the node shape when no node counts, the reclaim rate). A value, so a shell whose pool did
    not change since its last reading may hand the same one in again (the twin does)."""

    node: Resources | None  # the smallest counted node; None: no node counts
    nodes: int
    used: Resources
    node_states: tuple[NodeState, ...]
    largest_free_gpu_set: int
    # Rule 7: the blocking taints every counted node carries; None: no node counts.
    taints: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """One cluster's observed nodes at `observed_s`, and its spot reclaims since `since_s`.

    `observations`: pools whose nodes were already reduced to a `PoolObservation` by `observe`
    (their nodes are then not in `nodes`); the merge uses them as they are."""

    observed_s: float
    nodes: tuple[ObservedNode, ...] = ()
    reclaims: Mapping[str, int] = field(default_factory=dict)  # pool -> nodes reclaimed
    since_s: float = 0.0
    observations: Mapping[str, PoolObservation] = field(default_factory=dict)
    # pool -> seconds from ordering a node to its Ready, as measured (rule 6); pools with no
    # boot measured yet are absent.
    boots: Mapping[str, float] = field(default_factory=dict)


def leaving(node: ObservedNode) -> NodeLeaving:
    """Rule 2 of the module docstring."""
    for taint in node.taints:
        if taint.partition(":")[0].partition("=")[0] in TERMINATION_TAINTS:
            return NodeLeaving.TERMINATING
    if not node.ready and node.ever_ready:
        return NodeLeaving.NOT_READY
    if node.unschedulable:
        return NodeLeaving.CORDONED
    return NodeLeaving.NO


def pool_of(node: ObservedNode, pools: Sequence[Pool],
            names: frozenset[str] | None = None) -> str | None:
    """Rule 1 of the module docstring (`names`: the pools' names, when already at hand)."""
    if node.pool in (names if names is not None else {p.name for p in pools}):
        return node.pool
    by_type = [p.name for p in pools if node.instance_type and p.instance_type
               == node.instance_type]
    if len(by_type) == 1:
        return by_type[0]
    return pools[0].name if len(pools) == 1 else None


@functools.lru_cache(maxsize=4096)
def _nvlink_set(instance_type: str, gpus: int, model: str | None, used: int) -> int:
    topo = for_instance(instance_type, gpus, model, Interconnect.NVLINK_PAIRS)
    return largest_nvlink_set(topo, range(used))


def largest_free_set(pool: Pool, node: ObservedNode) -> int:
    """Rule 4 of the module docstring, for one node."""
    gpus, used = node.allocatable.gpu, node.allocated.gpu
    free = gpus - used if gpus > used else 0
    if free == 0 or pool.interconnect is not Interconnect.NVLINK_PAIRS:
        return free
    return _nvlink_set(pool.instance_type, gpus, pool.gpu_model, used)


def node_state(pool: Pool, node: ObservedNode) -> NodeState:
    gpus, used = node.allocatable.gpu, node.allocated.gpu
    return NodeState(
        name=node.name, cpu_allocated=node.allocated.cpu,
        memory_allocated_gib=node.allocated.memory_gib,
        gpu_free=gpus - used if gpus > used else 0,
        largest_free_gpu_set=largest_free_set(pool, node),
        booting=not node.ready and not node.ever_ready,
        leaving=leaving(node) if node.taints or node.unschedulable or not node.ready
        else NodeLeaving.NO,
        idle_since_s=node.idle_since_s, prewarmed=node.prewarmed, workloads=node.workloads,
        underused_since_s=node.underused_since_s)


def reclaim_rate_per_hour(reclaims: int, since_s: float, now_s: float) -> float:
    return reclaims / max((now_s - since_s) / 3600.0, 1.0)


def observed_pool(pool: Pool, nodes: Sequence[ObservedNode], *, reclaims: int = 0,
                  since_s: float = 0.0, now_s: float = 0.0, boot_s: float | None = None) -> Pool:
    """`pool` with rules 3-7 of the module docstring applied to its observed `nodes`."""
    return replace(pool, **observed_fields(pool, nodes, reclaims=reclaims, since_s=since_s,
                                           now_s=now_s, boot_s=boot_s))  # type: ignore[arg-type]


def observed_fields(pool: Pool, nodes: Sequence[ObservedNode], *, reclaims: int = 0,
                    since_s: float = 0.0, now_s: float = 0.0,
                    observation: PoolObservation | None = None,
                    boot_s: float | None = None) -> dict[str, object]:
    """The `Pool` fields rules 3-7 replace (so a caller can make one copy of the pool);
    `observation`: `observe(pool, nodes)` already computed (then `nodes` is not read);
    `boot_s`: the inventory's measured boot for the pool (rule 6), None where none was."""
    obs = observation if observation is not None else observe(pool, nodes)
    return {"node": pool.node if obs.node is None else obs.node,
            "nodes": obs.nodes, "max_nodes": max(pool.max_nodes, obs.nodes),
            "used": obs.used, "node_states": obs.node_states,
            "largest_free_gpu_set": obs.largest_free_gpu_set,
            "taints": pool.taints if obs.taints is None else obs.taints,
            "reclaim_rate_per_hour": reclaim_rate_per_hour(reclaims, since_s, now_s),
            "boot_s": pool.boot_s if boot_s is None else boot_s}


def observe(pool: Pool, nodes: Sequence[ObservedNode],
            states: Sequence[NodeState] | None = None) -> PoolObservation:
    """Rules 2-4 and 7 of the module docstring over one pool's `nodes`; `states`: each node's
    `node_state(pool, node)`, when the caller kept them from an earlier reading."""
    out = []
    count = 0
    cpu = mem = 0.0
    gpu = largest = 0
    min_cpu = min_mem = math.inf
    min_gpu = 1 << 30
    last: Resources | None = None
    keep = NodeLeaving.NO
    common: tuple[str, ...] | None = None  # the taints every counted node carries so far
    # One pass, no calls per node: a changed pool is read again every epoch (the twin's
    # busiest pools hold hundreds of nodes). `a < b` tests are min()/max()'s own.
    for k, n in enumerate(nodes):
        st = node_state(pool, n) if states is None else states[k]
        out.append(st)
        if st.leaving is not keep:
            continue
        count += 1
        if common is None:
            common = n.taints
        elif common and n.taints != common:
            common = tuple(t for t in common if t in n.taints)
        u = n.allocated
        cpu += u.cpu
        mem += u.memory_gib
        gpu += u.gpu
        a = n.allocatable
        if a is not last:  # nodes of one shape usually share one value
            last = a
            if a.cpu < min_cpu:
                min_cpu = a.cpu
            if a.memory_gib < min_mem:
                min_mem = a.memory_gib
            if a.gpu < min_gpu:
                min_gpu = a.gpu
        if st.largest_free_gpu_set > largest:
            largest = st.largest_free_gpu_set
    return PoolObservation(node=Resources(min_cpu, min_mem, min_gpu) if count else None,
                           nodes=count, used=Resources(cpu, mem, gpu),
                           node_states=tuple(out), largest_free_gpu_set=largest,
                           taints=None if common is None else _blocking(common))


def _blocking(taints: tuple[str, ...]) -> tuple[str, ...]:
    """The NoSchedule and NoExecute taints of `taints` (kubectl's `key=value:Effect`)."""
    if not taints:
        return taints
    return tuple(t for t in taints if t.rpartition(":")[2] in ("NoSchedule", "NoExecute"))


def nodes_by_pool(pools: Sequence[Pool], inventory: Inventory
                  ) -> tuple[dict[str, list[ObservedNode]], int]:
    """Rule 1 over an inventory: each pool's nodes, and how many nodes matched no pool."""
    by_pool: dict[str, list[ObservedNode]] = {p.name: [] for p in pools}
    names = frozenset(by_pool)
    stray = 0
    for n in inventory.nodes:
        name = n.pool if n.pool in names else pool_of(n, pools, names)
        if name is None:
            stray += 1
        else:
            by_pool[name].append(n)
    return by_pool, stray


def observed_pools(pools: Sequence[Pool], inventory: Inventory, now_s: float
                   ) -> tuple[tuple[Pool, ...], int]:
    """Every registered pool with its observed nodes; and how many nodes matched no pool."""
    by_pool, stray = nodes_by_pool(pools, inventory)
    out = tuple(observed_pool(p, by_pool[p.name], reclaims=inventory.reclaims.get(p.name, 0),
                              since_s=inventory.since_s, now_s=now_s,
                              boot_s=inventory.boots.get(p.name)) for p in pools)
    return out, stray


# Boots a pool's measured boot time is the median of (rule 6): recent enough to follow a
# provider that got slower, enough that one slow boot does not move it.
BOOT_SAMPLES = 8
# A reading above this is not a boot (a clock jump, a hand-edited record): dropped.
BOOT_MAX_S = 86_400.0


def boot_s(samples: Sequence[float]) -> float | None:
    """Rule 6: the median of the last BOOT_SAMPLES measured boots (seconds in
    [0, BOOT_MAX_S] kept), None without one."""
    kept = sorted(x for x in samples[-BOOT_SAMPLES:] if 0.0 <= x <= BOOT_MAX_S)
    if not kept:
        return None
    mid = len(kept) // 2
    return kept[mid] if len(kept) % 2 else (kept[mid - 1] + kept[mid]) / 2.0


# ---- demand ----------------------------------------------------------------------------
def decayed(rate: float, at_s: float, now_s: float, tau_s: float) -> float:
    """An EWMA rate last updated at `at_s`, as of `now_s` (no new events in between)."""
    return rate * decay_factor(at_s, now_s, tau_s)


def decay_factor(at_s: float, now_s: float, tau_s: float) -> float:
    """What `decayed` multiplies a rate by (one factor for several rates of one time)."""
    return math.exp(-max(0.0, now_s - at_s) / tau_s)


def demand_rate(events: Iterable[tuple[float, float]], now_s: float, tau_s: float) -> float:
    """EWMA rate (per s) of amounts `r` requested at times `t`: sum r/tau exp(-(now-t)/tau)."""
    return sum(r / tau_s * math.exp(-max(0.0, now_s - t) / tau_s) for t, r in events)


# Capacity freed by ended workloads (FederationSnapshot.freed): read back this many demand
# time constants (exp(-5): what older ends would add is under 0.7 % of their amount / tau).
FREED_WINDOW_TAUS = 5.0


def freed_rates(ended: Iterable[tuple[float, str, str, float, float]], now_s: float,
                tau_s: float) -> dict[tuple[str, str], tuple[float, float]]:
    """Each pool's release rates, (cluster, pool) -> (vCPU/s, GPU/s): `demand_rate`'s EWMA
    over (when it ended, cluster, pool, vCPUs, GPUs) of the workloads that ended, the rule
    the twin keeps incrementally (`SimPool.add_freed`). Amounts that are not finite and
    non-negative are left out (a stored spec is not trusted to be sane)."""
    by_pool: dict[tuple[str, str], tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {}
    for t, cluster, pool, cpu, gpu in ended:
        if not (math.isfinite(t) and math.isfinite(cpu) and math.isfinite(gpu)
                and cpu >= 0.0 and gpu >= 0.0):
            continue
        cpus, gpus = by_pool.setdefault((cluster, pool), ([], []))
        cpus.append((t, cpu))
        gpus.append((t, gpu))
    return {key: (demand_rate(cpus, now_s, tau_s), demand_rate(gpus, now_s, tau_s))
            for key, (cpus, gpus) in by_pool.items()}
