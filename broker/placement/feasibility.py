"""Which (workload, option) pairs are allowed: one W x O mask per family, and tenancy. Pure.

Split from candidates.py (which combines these masks with costs into a CandidateSet); the
families and what each means are listed in candidates.py's docstring.

GPU sets. A replica of a k-GPU job needs k free GPUs on one node, joined by NVLink when
the job asks for an NVLink interconnect (its *class* (k, nvlink)). `free_gpu_sets` counts
the disjoint sets of a class on a pool's running nodes, each node's carved by
`topology.disjoint_sets` (repeated `topology.allocate`, best ring first) from the node's
reference topology with its used GPUs taken as the lowest ids (observed.py's convention,
the snapshot has no GPU ids), none for an NVLink class where the node's largest free
NVLink set (`NodeState.largest_free_gpu_set`, when known) is below k; `sets_per_new_node`
the same on an empty node. A pool whose
free GPUs form no set of the class and that can add no node (or whose node cannot hold
one) is infeasible for the job (family `topology`); the LP and the Ledger bound the
replicas of each class by these counts (lp_rows.gpu_set_rows).

Reservation (the rule for large jobs): when whole-node jobs (k = the node's GPU count) of a
pool are queued (pending but backing off this epoch, so not in the batch), the pool keeps
R = min(whole free nodes, queued whole-node replicas) whole free nodes out of the sets
smaller jobs may take, so they do not break the nodes the large jobs wait for. The large
jobs' own sets count every whole free node. The policy may keep more
(`PolicyAction.reserve_nodes`: how much to reserve): R = min(whole free nodes, queued
whole-node replicas + extra), extra whole free nodes held for whole-node jobs yet to come.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Interconnect,
    NodeLeaving,
    Pool,
    PricingModel,
    Resources,
    Toleration,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.placement import queueing, topology
from broker.placement.memo import PlanMemo
from broker.placement.network import RttResolver

if TYPE_CHECKING:
    from broker.placement.candidates import BoolArray, FloatArray, IntArray, Option, OptionTable

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute", "")
# The taint GKE puts on the nodes of a GPU node pool added to a cluster that has a non-GPU
# node pool (GKE docs, "Run GPUs in Standard node pools": "GKE automatically taints the GPU
# nodes", key nvidia.com/gpu, effect NoSchedule). The ExtendedResourceToleration admission
# controller, which GKE runs, gives every pod that requests GPUs the matching toleration.
GPU_NODE_TAINT = "nvidia.com/gpu=present:NoSchedule"
_GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
GpuClass = tuple[int, bool]  # GPUs per replica, needs an NVLink ring


def gpu_class(w: Workload) -> GpuClass | None:
    """The job's GPU set class (module docstring); None without GPUs."""
    g = int(w.spec.resources.gpu)
    if g <= 0:
        return None
    return g, g > 1 and w.spec.interconnect.rank >= Interconnect.NVLINK_PAIRS.rank


@functools.lru_cache(maxsize=8192)
def _node_sets(instance_type: str, gpus: int, model: str | None, interconnect: Interconnect,
               free: int, k: int, nvlink: bool) -> int:
    topo = topology.for_instance(instance_type, gpus, model, interconnect)
    return len(topology.disjoint_sets(topo, k, range(gpus - free), nvlink=nvlink))


def sets_per_new_node(pool: Pool, cls: GpuClass) -> int:
    """Sets of class `cls` an empty node of the pool holds."""
    g = int(pool.node.gpu)
    if g <= 0 or cls[0] > g:
        return 0
    return _node_sets(pool.instance_type, g, pool.gpu_model, pool.interconnect, g, *cls)


def free_gpu_sets(pool: Pool, cls: GpuClass, reserved: int = 0) -> int:
    """Disjoint sets of class `cls` free on the pool's running nodes, `reserved` whole free
    nodes left out (module docstring). Leaving nodes hold none. Without node states: the
    pool's free GPUs in sets of k, none when its largest free set is known to be smaller."""
    g = int(pool.node.gpu)
    k = cls[0]
    if g <= 0 or k > g:
        return 0
    if pool.node_states:
        total, skipped = 0, 0
        for n in pool.node_states:
            free = min(max(int(n.gpu_free), 0), g)
            if n.leaving is not NodeLeaving.NO or free < k:
                continue
            if free == g and skipped < reserved:
                skipped += 1
                continue
            if cls[1] and 0 < n.largest_free_gpu_set < k:
                continue  # its free GPUs are known to meet across PCIe
            total += _node_sets(pool.instance_type, g, pool.gpu_model, pool.interconnect,
                                free, *cls)
        return total
    free = max(0, int(pool.free.gpu)) - reserved * g
    if free < k or 0 < pool.largest_free_gpu_set < k:
        return 0
    return free // k


def whole_free_nodes(pool: Pool) -> int:
    """Running (not leaving) nodes of a GPU pool with every GPU free."""
    g = int(pool.node.gpu)
    if g <= 0:
        return 0
    if pool.node_states:
        return sum(1 for n in pool.node_states
                   if n.leaving is NodeLeaving.NO and n.gpu_free >= g)
    return max(0, int(pool.free.gpu)) // g if pool.largest_free_gpu_set in (0, g) else 0


def reserved_nodes(pool: Pool, queued: Iterable[Workload], extra: int = 0) -> int:
    """Whole free nodes kept for queued whole-node jobs, plus `extra` for those yet to come
    (module docstring's rule)."""
    g = int(pool.node.gpu)
    if g <= 1:
        return 0
    want = sum(max(0, w.spec.replicas) for w in queued
               if int(w.spec.resources.gpu) == g
               and (not w.spec.gpu_model
                    or (pool.gpu_model or "").lower() == w.spec.gpu_model.lower())
               and pool.interconnect.satisfies(w.spec.interconnect))
    want += max(0, extra)
    return min(want, whole_free_nodes(pool)) if want else 0


def pool_taints(c: Cluster, p: Pool) -> tuple[str, ...]:
    """Taints every node of pool `p` carries on top of its cluster's (`Cluster.taints`):
    those its nodes were seen to carry (`Pool.taints`, observed.py rule 7: a GPU node group
    tainted as EKS, AKS and Karpenter advise), and GKE's GPU taint (`GPU_NODE_TAINT`) on a
    GPU pool of a GCP cluster that also has a pool without GPUs, which holds before the
    pool has a node to observe. AWS and Azure taint nothing by themselves."""
    if c.provider == "gcp" and p.node.gpu > 0 and any(q.node.gpu <= 0 for q in c.pools):
        return p.taints if GPU_NODE_TAINT in p.taints else (*p.taints, GPU_NODE_TAINT)
    return p.taints


def tolerations_of(spec: WorkloadSpec) -> tuple[Toleration, ...]:
    """The workload's tolerations as its pods get them: a pod that requests GPUs also
    tolerates the `nvidia.com/gpu` taint (Kubernetes' ExtendedResourceToleration
    admission controller, which GKE enables)."""
    if spec.resources.gpu > 0:
        return (*spec.tolerations, _GPU_TOLERATION)
    return tuple(spec.tolerations)


def tolerates_all(tolerations: Sequence[Toleration], taints: Sequence[str]) -> bool:
    """True when every blocking taint (NoSchedule/NoExecute) is tolerated."""
    for taint in taints:
        effect = taint.partition(":")[2]
        if effect not in _BLOCKING_EFFECTS:
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


def labels_ok(cluster: Cluster, affinity: Mapping[str, str],
              anti_affinity: Mapping[str, str]) -> bool:
    """Affinity: all selectors match; anti-affinity: none matches."""
    if any(cluster.labels.get(k) != v for k, v in affinity.items()):
        return False
    return not any(cluster.labels.get(k) == v for k, v in anti_affinity.items())


def _running_names_by_cluster(snapshot: FederationSnapshot
                              ) -> dict[str, set[tuple[str, str]]]:
    """Cluster -> (tenant, name) of the workloads running there."""
    by_cluster: dict[str, set[tuple[str, str]]] = {}
    for placement in snapshot.running:
        w = snapshot.workloads.get(placement.workload_id)
        if w is None:
            continue
        who = (w.tenant, w.spec.name)
        for a in placement.assignments:
            by_cluster.setdefault(a.cluster, set()).add(who)
    return by_cluster


def may_use(tenant: str, cluster: Cluster) -> bool:
    """A tenant may place onto a federation-wide cluster, or one private to it or lent to it."""
    return cluster.allowed_tenants is None or tenant in cluster.allowed_tenants


def tenancy_mask(wls: Sequence[Workload], options: Sequence[Option]) -> BoolArray:
    """W x O: True where the workload's tenant may use the option's cluster (`may_use`)."""
    private = [j for j, o in enumerate(options) if o.cluster.allowed_tenants is not None]
    if not private or not wls:
        return np.ones((len(wls), len(options)), dtype=bool)
    tenants = {t: i for i, t in enumerate(sorted({w.tenant for w in wls}))}
    table = np.ones((len(tenants), len(options)), dtype=bool)  # one row per tenant
    for t, i in tenants.items():
        for j in private:
            table[i, j] = may_use(t, options[j].cluster)
    return table[np.array([tenants[w.tenant] for w in wls], dtype=np.int64)]


def family_masks(snapshot: FederationSnapshot, wls: Sequence[Workload],
                  options: Sequence[Option], demand: FloatArray,
                  node: FloatArray, rtt: FloatArray | None = None, *,
                  table: OptionTable | None = None) -> dict[str, BoolArray]:
    """One W x O boolean mask per family: True = this family allows the pair.

    `rtt`: the batch's `rtt_table` when the caller has it (computed here otherwise);
    `table`: the options' candidates.OptionTable (made here otherwise)."""
    if table is None:
        from broker.placement.candidates import option_table

        table = option_table(options)
    n_w, n_o = len(wls), len(options)
    ones = np.ones((n_w, n_o), dtype=bool)
    healthy = table.healthy
    fits = ((demand[:, None, 0] <= node[None, :, 0] + 1e-9)
            & (demand[:, None, 1] <= node[None, :, 1] + 1e-9)
            & (demand[:, None, 2] <= node[None, :, 2]))
    wanted = {(w.spec.gpu_model or "").lower() for w in wls if w.spec.gpu_model}
    if wanted:
        models = {m: i for i, m in enumerate(sorted(set(table.gpu_model) | wanted))}
        pool_model = np.array([models[m] for m in table.gpu_model])
        want_model = np.array([models[(w.spec.gpu_model or "").lower()] if w.spec.gpu_model
                               else -1 for w in wls])
        model_ok = (want_model[:, None] < 0) | (want_model[:, None] == pool_model[None, :])
    else:  # no workload names a GPU model: every pool's model will do
        model_ok = np.ones((n_w, n_o), dtype=bool)
    pool_ic = table.ic_rank
    want_ic = np.array([w.spec.interconnect.rank if w.spec.resources.gpu > 1 else 0
                        for w in wls])
    ic_ok = want_ic[:, None] <= pool_ic[None, :]
    topo_ok = _gpu_set_mask(wls, options)
    spot = table.spot
    spot_ok_w = np.array([w.spec.spot_ok for w in wls], dtype=bool)
    spot_mask = spot_ok_w[:, None] | ~spot[None, :]
    return {
        "health": ones & healthy[None, :],
        "resources": fits,
        "gpu_model": model_ok,
        "interconnect": ic_ok,
        "topology": topo_ok,
        "latency": latency_mask(wls, rtt_table(snapshot, wls, options) if rtt is None
                                else rtt),
        "taints": _taint_mask(wls, options),
        "affinity": _per_cluster_mask(wls, options, _selector_signature,
                                      lambda sig, c: labels_ok(c, dict(sig[0]), dict(sig[1]))
                                      and (not sig[2] or c.name in sig[2]), table),
        "spot": spot_mask,
        "avoid": _avoid_mask(snapshot, wls, options),
    }


_NO_SELECTORS: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], tuple[str, ...]] \
    = ((), (), ())


def _selector_signature(w: Workload) -> tuple[tuple[tuple[str, str], ...],
                                              tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The workload's cluster selectors as one hashable value (most workloads have none)."""
    spec = w.spec
    if not spec.affinity and not spec.anti_affinity and not spec.cluster_names:
        return _NO_SELECTORS
    return (tuple(sorted(spec.affinity.items())), tuple(sorted(spec.anti_affinity.items())),
            spec.cluster_names)


def _gpu_set_mask(wls: Sequence[Workload], options: Sequence[Option]) -> BoolArray:
    """`topology` family: the pool can take one replica's GPU set (module docstring)."""
    mask = np.ones((len(wls), len(options)), dtype=bool)
    by_class: dict[GpuClass, list[int]] = {}
    for i, w in enumerate(wls):
        cls = gpu_class(w)
        if cls is not None:
            by_class.setdefault(cls, []).append(i)
    for cls, rows in by_class.items():
        # A pool whose node is too small is the `resources` family's, not this one's.
        ok = np.array([o.pool.node.gpu < cls[0] or free_gpu_sets(o.pool, cls) > 0
                       or (o.pool.can_add_nodes > 0 and sets_per_new_node(o.pool, cls) > 0)
                       for o in options], dtype=bool)
        mask[np.array(rows, dtype=np.int64)] = ok[None, :]
    return mask


def _per_cluster_mask(wls: Sequence[Workload], options: Sequence[Option],
                      signature: Callable[[Workload], Any],
                      check: Callable[[Any, Cluster], bool],
                      table: OptionTable | None = None) -> BoolArray:
    """Evaluate `check(signature(w), cluster)` once per distinct signature and cluster."""
    col, clusters = _option_clusters(options, table)
    return _grouped_mask(wls, len(options), signature, check, col, clusters)


def _taint_mask(wls: Sequence[Workload], options: Sequence[Option]) -> BoolArray:
    """The `taints` family: the workload tolerates its cluster's taints and its pool's
    (`pool_taints`), once per distinct (tolerations, taints) pair."""
    kinds: dict[tuple[str, ...], int] = {}
    col = np.array([kinds.setdefault((*o.cluster.taints, *pool_taints(o.cluster, o.pool)),
                                     len(kinds)) for o in options], dtype=np.int64)
    return _grouped_mask(wls, len(options), lambda w: tolerations_of(w.spec), tolerates_all,
                         col, list(kinds))


def _grouped_mask(wls: Sequence[Workload], n_options: int,
                  signature: Callable[[Workload], Any], check: Callable[[Any, Any], bool],
                  col: IntArray, groups: Sequence[Any]) -> BoolArray:
    """W x O: `check(signature(w), groups[col[o]])`, evaluated once per distinct signature
    and group (options that share a cluster, or a cluster's and pool's taints)."""
    sigs: dict[Any, int] = {}
    rows = np.empty(len(wls), dtype=np.int64)
    for i, w in enumerate(wls):
        rows[i] = sigs.setdefault(signature(w), len(sigs))
    out = np.ones((max(len(sigs), 1), n_options), dtype=bool)
    for sig, r in sigs.items():
        out[r] = np.array([bool(check(sig, g)) for g in groups], dtype=bool)[col]
    return out[rows] if len(wls) else np.ones((0, n_options), dtype=bool)


def _option_clusters(options: Sequence[Option], table: OptionTable | None = None
                     ) -> tuple[IntArray, Sequence[Cluster]]:
    """The options' clusters, each once (first seen by name), and each option's index there:
    a per-cluster check is evaluated per cluster and spread to the options by `col`
    (`table`: the options' OptionTable, which holds both)."""
    if table is not None:
        return table.col, table.clusters
    index: dict[str, int] = {}
    clusters: list[Cluster] = []
    for o in options:
        if o.cluster.name not in index:
            index[o.cluster.name] = len(clusters)
            clusters.append(o.cluster)
    col = np.array([index[o.cluster.name] for o in options], dtype=np.int64)
    return col, clusters


def rtt_table(snapshot: FederationSnapshot, wls: Sequence[Workload],
              options: Sequence[Option], memo: PlanMemo | None = None, *,
              table: OptionTable | None = None) -> FloatArray:
    """W x O RTT in ms from each workload's user region to each option's cluster
    (network.RttResolver); nan where unknown or the workload names no user region.
    One lookup per (region, cluster), not per option; with `memo`, each region's row over
    the clusters is last epoch's while the network maps and places are unchanged."""
    col, clusters = _option_clusters(options, table)
    cache = memo.rtts(snapshot) if memo is not None else None
    resolver = RttResolver(snapshot, cache)
    names = tuple([c.name for c in clusters])
    regions: dict[str | None, int] = {None: 0}  # row 0: no user region, all nan
    row = np.array([regions.setdefault(w.spec.user_region, len(regions)) for w in wls],
                   dtype=np.int64)
    grid = np.full((len(regions), len(options)), np.nan)
    for region, r in regions.items():
        if region is None:
            continue
        per_cluster = memo.rtt_rows.get((region, names)) if memo is not None else None
        if per_cluster is None:
            per_cluster = np.array([np.nan if v is None else v for v in (
                resolver.rtt_ms(region, c) for c in clusters)], dtype=np.float64)
            if memo is not None:
                per_cluster.flags.writeable = False
                memo.rtt_rows[(region, names)] = per_cluster
        grid[r] = per_cluster[col]
    out: FloatArray = grid[row]
    return out


def latency_mask(wls: Sequence[Workload], rtt: FloatArray,
                 utilization: Sequence[float | None] | None = None) -> BoolArray:
    """`latency` family: RTT(user region, cluster) + the planned wait <= SLO.

    The planned wait is what size_for_slo planned at the spec's `slo_utilization`: that of a
    cluster holding `queueing.sizing_pool` of the replicas it asked for
    (`queueing.planned_wait_ms`), none when the spec has no `slo_utilization` (the SLO
    bounds RTT alone: workloads the planner did not size, and the baselines, whose systems
    have no such rule). `utilization`: per workload, the load to judge it at where its spec
    carries none (a running service's, `running_slo_utilization`; None entries: the spec's
    own), at the wait of one replica alone (a move may leave one so).
    """
    # -> row of `table` (0: no SLO); key: region, SLO, utilisation, replicas it is judged in
    keys: dict[tuple[str, float, float | None, int], int] = {}
    first: list[int] = [-1]  # per row, a workload with its key (its rtt row: the region's)
    row = np.zeros(len(wls), dtype=np.int64)
    for i, w in enumerate(wls):
        spec = w.spec
        if spec.latency_slo_ms is None or spec.user_region is None:
            continue
        util = spec.slo_utilization
        pool = 1
        if util is not None:
            pool = queueing.sizing_pool(
                queueing.asked_replicas(spec.replicas, util),
                spec.spread.min_domains if spec.spread is not None else 1)
        elif utilization is not None:
            util = utilization[i]
        key = (spec.user_region, spec.latency_slo_ms, util, pool)
        r = keys.get(key)
        if r is None:
            r = keys[key] = len(first)
            first.append(i)
        row[i] = r
    table = np.ones((len(first), rtt.shape[1]), dtype=bool)
    for (_, slo, load, pool), r in keys.items():
        wait = 0.0 if load is None else queueing.planned_wait_ms(pool, load)
        table[r] = rtt[first[r]] + wait <= slo + 1e-9  # nan (unknown): False
    out: BoolArray = table[row]
    return out


def running_slo_utilization(spec: WorkloadSpec, running: int) -> float | None:
    """The `slo_utilization` the SLO-aware latency mask judges a move of a running
    latency-SLO service at: its spec's replicas' load (queueing.offered_load) spread over
    the `running` ones; None when the spec is not such a service or already carries one."""
    if (spec.kind is not WorkloadKind.SERVICE or spec.latency_slo_ms is None
            or spec.slo_utilization is not None or running <= 0):
        return None
    return queueing.offered_load(spec.replicas) / running


def size_for_slo(snapshot: FederationSnapshot, wls: Sequence[Workload],
                 memo: PlanMemo | None = None, *, headroom: float = 1.0
                 ) -> tuple[tuple[Workload, ...], dict[str, int]]:
    """The workloads as the SLO-aware planner places them, and the replicas it adds to each.

    A service with a latency SLO serves inside it only when RTT + its queueing wait fits
    (placement/queueing.py, the twin's model). The broker knows a service's replica count,
    not its request rate, so the load is what the asked replicas were sized for (the
    target-utilisation assumption of queueing.py). Against the best RTT among the healthy
    clusters the tenant may use (with a spread over k domains, the RTT of the k-th closest
    domain: sized for the best only, the farther domains the spread needs could fall out
    although RTT alone admitted them, and the service stay unplaced; and, where the
    clusters that close have no room for the replicas sizing asks, the RTT of the next
    cluster out until they do, `_sizing_for_room`),
    `queueing.replicas_for_slack` gives the fewest replicas n >= asked at which a cluster
    holding `queueing.sizing_pool` of them (two, or one when it asked for one or its
    spread's domains could each get one) waits within the slack; the service is planned
    with n replicas and `slo_utilization` = TARGET x asked / n, and `latency_mask` admits
    only clusters where RTT + that wait fits, so every cluster that holds at least that
    many serves inside the SLO (a lone replica of a larger service may not). No such n
    within the factor cap (or no cluster under
    the SLO): unchanged, and the SLO bounds RTT alone as before. Weighted splits (Karmada's
    static weights divide the asked count) and non-services are left as they are.
    """
    resolver = RttResolver(snapshot, memo.rtts(snapshot) if memo is not None else None)
    out: list[Workload] = []
    extra: dict[str, int] = {}
    public = all(c.allowed_tenants is None for c in snapshot.clusters)
    healthy = np.array([c.healthy for c in snapshot.clusters], dtype=bool)
    rows: dict[str, FloatArray] = {}
    room: dict[tuple[str, Resources, tuple[Toleration, ...]], float] = {}
    for w in wls:
        spec = w.spec
        if (spec.kind is not WorkloadKind.SERVICE or spec.latency_slo_ms is None
                or spec.user_region is None or spec.replica_weights or spec.replicas <= 0):
            out.append(w)
            continue
        if spec.spread is None and not spec.cluster_names and public:
            # The closest healthy cluster's RTT (what the walk below returns for one domain),
            # from the region's row over the clusters.
            row = rows.get(spec.user_region)
            if row is None:
                row = rows[spec.user_region] = np.array(
                    [np.nan if (r := resolver.rtt_ms(spec.user_region, c)) is None else r
                     for c in snapshot.clusters], dtype=np.float64)
            known = np.flatnonzero(healthy & ~np.isnan(row))
            near = [(float(row[j]), snapshot.clusters[j])
                    for j in known[np.argsort(row[known], kind="stable")]]
            sizing_rtt: float | None = near[0][0] if near else None
        else:
            near = sorted(((r, c) for c in snapshot.clusters
                           if c.healthy and may_use(w.tenant, c)
                           and (not spec.cluster_names or c.name in spec.cluster_names)
                           and (r := resolver.rtt_ms(spec.user_region, c)) is not None),
                          key=_RTT_KEY)
            topo = spec.spread.topology if spec.spread else "cluster"
            sizing_rtt = _nth_domain_rtt(sorted((r, domain_key(c, topo)) for r, c in near),
                                         spec.spread.min_domains if spec.spread else 1)
        domains = spec.spread.min_domains if spec.spread is not None else 1
        n: int | None = None
        if sizing_rtt is not None:
            sizing_rtt, n = _sizing_for_room(near, sizing_rtt, spec.replicas,
                                             spec.latency_slo_ms, spec, domains,
                                             headroom, room)
        if n is None:
            out.append(w)
            continue
        util = queueing.TARGET_UTILIZATION * spec.replicas / n
        out.append(dataclasses.replace(
            w, spec=dataclasses.replace(spec, replicas=n, slo_utilization=util)))
        if n > spec.replicas:
            extra[w.id] = n - spec.replicas
    return tuple(out), extra


def scaled_down_replicas(asked_before: int, asked_now: int, placed: int) -> int:
    """Replicas a workload keeps when scaled down in place from `asked_before` to
    `asked_now` asked replicas while `placed` are placed: the asked difference goes, the
    replicas SLO sizing added (`placed - asked_before`, size_for_slo) stay.

    Why keep them rather than drop them with the asked ones: the load is what the asked
    replicas were sized for (queueing.offered_load), so it falls with the asked count, and
    with the same added replicas each replica carries less than when size_for_slo admitted
    its clusters (TARGET x a / (a + e) grows with a): the service still serves inside its
    SLO wherever it runs, with no snapshot needed to check it again. The twin's `scale`
    event does the same (sim/engine.py `_scale` removes the asked difference). A partly
    placed workload (placed < asked_before) keeps at most what is placed.
    """
    return max(0, min(placed, asked_now + max(0, placed - asked_before)))


def domain_key(cluster: Cluster, topology: str) -> str:
    """Spread domain of a cluster: the cluster itself (cluster/zone) or its region."""
    return cluster.region_key if topology == "region" else cluster.name


_RTT_KEY = operator.itemgetter(0)


_ROOM_RESOURCES = ("cpu", "memory_gib", "gpu")


def capacity_shares(headroom: float, *, gpu_node: bool = False) -> tuple[float, float, float]:
    """(cpu, memory, gpu): the share of a pool's capacity the program may fill, the policy's
    headroom (the allocation ratio, clipped to [0, 1]) for cpu and memory and all of the
    GPUs, which are whole devices that are never overcommitted (a fractional GPU capacity
    would only let the LP relaxation place part of a GPU).

    On a cloud pool whose nodes have GPUs (`gpu_node`, `bought_for_gpus`) all of the cpu and
    memory as well: such a node is bought for its GPUs, and a GPU job asks the vCPUs and
    memory that come with its GPUs (cloud GPU shapes give each GPU a fixed share of the
    node's: Azure's ND96 8 GPUs and 96 vCPUs). At 0.9 an 8-GPU job asking 88 of a 96-vCPU
    node's vCPUs was planned onto two new nodes (the twin packed it on one; the other idled
    to its timer: held-out draft 9,300,046), and 8 one-GPU jobs asking 11 vCPUs each did not
    fit one 8-GPU node, so the program could fill 7 of its GPUs. The burst room the ratio
    keeps is for services sharing CPU nodes and fixed sites."""
    h = min(max(headroom, 0.0), 1.0)
    return (1.0, 1.0, 1.0) if gpu_node else (h, h, 1.0)


def bought_for_gpus(c: Cluster, p: Pool) -> bool:
    """A cloud pool of GPU nodes (not priced as fixed hardware, not on an edge cluster): the
    program may fill all of its nodes (`capacity_shares`)."""
    return p.node.gpu > 0 and p.pricing is not PricingModel.EDGE and not c.is_edge


def room_replicas(c: Cluster, res: Resources, headroom: float = 1.0,
                  tolerations: tuple[Toleration, ...] = ()) -> float:
    """Replicas of shape `res` the cluster has room for: per pool whose taints
    (`pool_taints`) the pods' `tolerations` (`tolerations_of`) tolerate, its free room plus
    the nodes it may still add, at the share the capacity rows let the program fill
    (`capacity_shares`), in the resource that runs out first; summed over its pools. What
    other work of the batch takes of it is not subtracted (docs/twin.md, "Claims on the
    room counted": tried, and federation-day cost ~1 % more)."""
    need = [(k, r, d) for k, r in enumerate(_ROOM_RESOURCES) if (d := getattr(res, r)) > 0]
    if not need:
        return math.inf
    out = []
    for p in c.pools:
        if not tolerates_all(tolerations, pool_taints(c, p)):
            continue
        h = capacity_shares(headroom, gpu_node=bought_for_gpus(c, p))
        out.append(max(0.0, min(h[k] * (getattr(p.free, r) + p.can_add_nodes * getattr(p.node, r))
                                / d for k, r, d in need)))
    return math.fsum(out)


def _sizing_for_room(near: Sequence[tuple[float, Cluster]], first_rtt: float, asked: int,
                     slo_ms: float, spec: WorkloadSpec, domains: int, headroom: float,
                     memo: dict[tuple[str, Resources, tuple[Toleration, ...]], float]
                     ) -> tuple[float, int | None]:
    """(RTT sized against, replicas) for size_for_slo: sized against `first_rtt` (the
    closest cluster's RTT, or the spread's k-th domain's), unless the clusters that close
    have no room for the replicas that sizing asks; then against the RTT of the next
    cluster out (`near`: (RTT, cluster) pairs, closest first), and so on until the clusters
    within it have room (`room_replicas` at `headroom`; `memo` keeps each cluster's count
    for the batch) or the SLO leaves no slack for a farther one; the last RTT that could be
    sized.

    Why: sized for the closest cluster alone, the wait allowed there is all of the slack it
    leaves, so every cluster a few hundredths of a ms farther is out. A 52-replica service
    with a 10 ms SLO (held-out draft 9,300,005) could use one edge site at 8.555 ms, with
    room for 19 of them, though six more sites within 8.62 ms had room for the rest: it ran
    19 for 6 h, all violating, where spreading over the sites serves (karpenter's plan).
    """
    n = queueing.replicas_for_slack(asked, slo_ms - first_rtt, domains=domains)
    if n is None:
        return first_rtt, None
    best, have = (first_rtt, n), 0.0
    tols = tolerations_of(spec)
    for rtt, c in near:
        if rtt > first_rtt:
            m = queueing.replicas_for_slack(asked, slo_ms - rtt, domains=domains)
            if m is None:
                break
            best = (rtt, m)
        key = (c.name, spec.resources, tols)
        if key not in memo:
            memo[key] = room_replicas(c, spec.resources, headroom, tols)
        have += memo[key]
        if have >= best[1]:
            break
    return best


def _nth_domain_rtt(rtts: Sequence[tuple[float, str]], need: int) -> float | None:
    """The RTT at which `need` spread domains are reached, walking `rtts` (sorted (RTT,
    domain) pairs) from the closest; with fewer domains than `need`, the closest RTT (the
    spread cannot be met anyway); None when there is no cluster at all."""
    seen: set[str] = set()
    for r, d in rtts:
        seen.add(d)
        if len(seen) >= need:
            return r
    return rtts[0][0] if rtts else None


def _avoid_mask(snapshot: FederationSnapshot, wls: Sequence[Workload],
                options: Sequence[Option]) -> BoolArray:
    mask = np.ones((len(wls), len(options)), dtype=bool)
    if not any(w.spec.avoid_workloads for w in wls):
        return mask  # nothing to avoid: no need to walk what runs where
    running = _running_names_by_cluster(snapshot)
    if not running:
        return mask
    for i, w in enumerate(wls):
        # Names of the tenant's own workloads: another tenant's never match (nor show).
        avoid = {(w.tenant, name) for name in w.spec.avoid_workloads}
        if not avoid:
            continue
        for j, o in enumerate(options):
            if avoid & running.get(o.cluster.name, set()):
                mask[i, j] = False
    return mask
