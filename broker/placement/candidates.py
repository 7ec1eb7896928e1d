"""Feasibility and per-replica cost of every (workload, option) pair. Pure.

An *option* is one pool of one cluster; a pool has one pricing model
(on-demand, spot or edge), so option = cluster x pool x pricing. For a batch
of W workloads and O options this module computes, vectorised with numpy:

- `feasible[w, o]`: every hard, per-pair constraint holds (the LP adds the
  coupling ones: capacity, quotas, budgets, spread, anti-affinity between
  workloads). Families, counted per workload for the decision record:
  `health` (cluster unhealthy), `resources` (a replica does not fit one node),
  `gpu_model`, `interconnect` (a multi-GPU replica needs one node with that
  many GPUs joined by the required interconnect), `topology` (the pool can add
  no node and its largest free NVLink-connected set is too small), `latency`
  (RTT(user region, cluster) above the SLO, or unknown), `taints`, `affinity`
  (cluster label selectors), `spot` (spot pool, workload not spot_ok),
  `avoid` (a workload it must avoid already runs in that cluster).
- `cost[w, o]`: objective per replica in USD, the sum of
  `compute` = node price x dominant resource share x expected hours,
  `egress` = data GB x USD/GB to the option's region / replicas,
  `latency` = latency weight (USD/ms) x RTT, and
  `bias` = the policy's cluster bias (USD/h) x expected hours.
- `cand[w]`: the k cheapest feasible options (plus the cheapest per spread
  domain), the LP's columns.
- `visible[w, o]`: the workload's tenant may use the option's cluster
  (`Cluster.allowed_tenants`: federation-wide, or private to the tenant, or lent
  to it). An invisible option is infeasible and is not counted anywhere a
  decision record shows (`infeasible_counts`, the number of options), so a
  tenant's records never reveal another tenant's clusters, not even how many.

Egress prices come from `FederationSnapshot.egress_usd_per_gb`; missing pairs
fall back to constants: same region 0, same provider 0.02 USD/GB (AWS
inter-region list price), across providers or to the internet 0.09 USD/GB
(AWS first-10-TB internet egress list price), from edge/on-prem 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.domain import (
    Cluster,
    FederationSnapshot,
    PolicyAction,
    Pool,
    PricingModel,
    Toleration,
    Workload,
    WorkloadKind,
)
from providers.geo import RTT_FLOOR_MS, estimate_rtt_ms

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

FAMILIES = (
    "health", "resources", "gpu_model", "interconnect", "topology", "latency",
    "taints", "affinity", "spot", "avoid",
)
EGRESS_SAME_PROVIDER_USD_PER_GB = 0.02
EGRESS_INTERNET_USD_PER_GB = 0.09
# Marginal cost of a replica on fixed, already-paid hardware (PricingModel.EDGE: edge and
# on-prem sites at an amortised price, paid whether used or not), as a fraction of its
# apportioned price. Only the running cost (power, cooling) grows with use; it is of the order
# of a tenth of a server's total cost of ownership (Barroso, Hoelzle & Ranganathan, "The
# Datacenter as a Computer", 3rd ed., ch. 6: energy-related costs ~10-20 % of TCO). An
# assumption stated as one; without it the planner bought cloud nodes while paid sites idled.
# The default of PlannerConfig.site_cost_fraction, so the live broker and the twin price fixed
# sites alike; operators set `placement.site_cost_fraction = 1.0` to charge the full amortised
# price instead (e.g. when an idle site could be powered down or resold).
SUNK_SITE_COST_FRACTION = 0.1
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute", "")


@dataclass(frozen=True, slots=True)
class Option:
    """One pool of one cluster, with what the LP needs about it."""

    index: int
    cluster: Cluster
    pool: Pool

    @property
    def key(self) -> str:
        return f"{self.cluster.name}/{self.pool.name}"

    @property
    def pricing(self) -> PricingModel:
        return self.pool.pricing


@dataclass(frozen=True, slots=True)
class CandidateSet:
    """Everything the solvers share about one batch. Arrays are W x O unless noted."""

    workloads: tuple[Workload, ...]
    options: tuple[Option, ...]
    headroom: float
    demand: FloatArray  # W x 3: cpu, memory_gib, gpu per replica
    replicas: IntArray  # W
    feasible: BoolArray
    cost: FloatArray  # per replica objective, inf where infeasible
    compute: FloatArray
    egress: FloatArray
    latency: FloatArray
    bias: FloatArray
    usd_per_hour: FloatArray  # per replica, apportioned
    rtt_ms: FloatArray  # nan where unknown / no user region
    cand: tuple[IntArray, ...]  # per workload: option indices, cheapest first
    infeasible_counts: tuple[Mapping[str, int], ...]  # per workload: family -> options ruled out
    domain: tuple[tuple[str, ...], ...]  # per workload: spread domain key of every option
    visible: BoolArray | None = None  # W x O: the tenant may use the cluster (None: all)

    def options_visible(self, w: int) -> int:
        """How many options workload w's tenant may see (its decision record's count)."""
        return len(self.options) if self.visible is None else int(self.visible[w].sum())

    def headroom_vec(self) -> FloatArray:
        """Headroom per resource: the policy's ratio for cpu and memory, 1 for GPUs.

        GPUs are whole devices that are never overcommitted, and a fractional
        GPU capacity would only let the LP relaxation place part of a GPU.
        """
        return np.array([self.headroom, self.headroom, 1.0])

    def option_node(self) -> FloatArray:
        """O x 3 allocatable per node."""
        return np.array([[o.pool.node.cpu, o.pool.node.memory_gib, o.pool.node.gpu]
                         for o in self.options], dtype=np.float64).reshape(-1, 3)


def expected_hours(workload: Workload, service_horizon_h: float) -> float:
    """Hours the objective counts a replica for: duration for jobs, a horizon for services."""
    spec = workload.spec
    if spec.kind is WorkloadKind.SERVICE or spec.duration_s is None:
        return service_horizon_h
    return max(spec.duration_s, 1.0) / 3600.0


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


class RttResolver:
    """RTT between a user region and a cluster: measured first, else estimated.

    Measured values (`snapshot.rtt_ms`) are looked up under the user region's
    name and the cluster's name or `provider:region` key, in both orders.
    Otherwise the great-circle estimate of providers.geo is used, from the
    user region's coordinates (a `UserRegion` name, or a `provider:region` key
    of a cluster with coordinates). None when neither is known.
    """

    def __init__(self, snapshot: FederationSnapshot) -> None:
        self._measured = snapshot.rtt_ms
        self._coords: dict[str, tuple[float, float]] = {
            u.name: (u.lat, u.lon) for u in snapshot.user_regions}
        for c in snapshot.clusters:
            if c.lat is not None and c.lon is not None:
                self._coords.setdefault(c.region_key, (c.lat, c.lon))
                self._coords.setdefault(c.name, (c.lat, c.lon))
        self._cache: dict[tuple[str, str], float | None] = {}

    def rtt_ms(self, user_region: str, cluster: Cluster) -> float | None:
        key = (user_region, cluster.name)
        if key not in self._cache:
            self._cache[key] = self._resolve(user_region, cluster)
        return self._cache[key]

    def _resolve(self, user_region: str, cluster: Cluster) -> float | None:
        for other in (cluster.name, cluster.region_key):
            for pair in ((user_region, other), (other, user_region)):
                if pair in self._measured:
                    return float(self._measured[pair])
        if user_region in (cluster.region_key, cluster.name):
            return RTT_FLOOR_MS
        src = self._coords.get(user_region)
        if src is None or cluster.lat is None or cluster.lon is None:
            return None
        return estimate_rtt_ms(src[0], src[1], cluster.lat, cluster.lon)


def egress_usd_per_gb(snapshot: FederationSnapshot, clusters: Mapping[str, Cluster],
                      src: str, dst: Cluster) -> float:
    """USD per GB to move data from `src` (cluster name or provider:region) to `dst`."""
    src_cluster = clusters.get(src)
    src_key = src_cluster.region_key if src_cluster is not None else src
    if src_key == dst.region_key or src == dst.name:
        return 0.0
    for pair in ((src, dst.name), (src_key, dst.region_key), (src, dst.region_key)):
        if pair in snapshot.egress_usd_per_gb:
            return float(snapshot.egress_usd_per_gb[pair])
    src_provider = src_key.partition(":")[0]
    if src_provider in ("edge", "onprem"):
        return 0.0
    if src_provider == dst.provider:
        return EGRESS_SAME_PROVIDER_USD_PER_GB
    return EGRESS_INTERNET_USD_PER_GB


def domain_key(cluster: Cluster, topology: str) -> str:
    """Spread domain of a cluster: the cluster itself (cluster/zone) or its region."""
    return cluster.region_key if topology == "region" else cluster.name


def build_options(snapshot: FederationSnapshot) -> tuple[Option, ...]:
    out: list[Option] = []
    for cluster in snapshot.clusters:
        for pool in cluster.pools:
            out.append(Option(index=len(out), cluster=cluster, pool=pool))
    return tuple(out)


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


def build_candidates(snapshot: FederationSnapshot, action: PolicyAction, *,
                     k: int, service_horizon_h: float,
                     workloads: Sequence[Workload] | None = None,
                     site_cost_fraction: float = 1.0) -> CandidateSet:
    """Feasibility, cost and the k best options of every pending workload."""
    wls = tuple(snapshot.pending if workloads is None else workloads)
    options = build_options(snapshot)
    n_w = len(wls)
    clusters = {c.name: c for c in snapshot.clusters}
    demand = np.array([[w.spec.resources.cpu, w.spec.resources.memory_gib,
                        w.spec.resources.gpu] for w in wls], dtype=np.float64).reshape(-1, 3)
    replicas = np.array([max(0, w.spec.replicas) for w in wls], dtype=np.int64)
    node = np.array([[o.pool.node.cpu, o.pool.node.memory_gib, o.pool.node.gpu]
                     for o in options], dtype=np.float64).reshape(-1, 3)
    masks = family_masks(snapshot, wls, options, demand, node)
    visible = tenancy_mask(wls, options)
    feasible = visible.copy()
    for m in masks.values():
        feasible &= m
    ruled_out = np.stack([(visible & ~masks[f]).sum(axis=1) for f in FAMILIES], axis=1) \
        if n_w else np.zeros((0, len(FAMILIES)), dtype=np.int64)
    counts = tuple({FAMILIES[j]: int(row[j]) for j in np.flatnonzero(row)}
                   for row in ruled_out)
    parts = _costs(snapshot, action, wls, options, clusters, demand, node,
                   service_horizon_h, site_cost_fraction)
    compute, egress, latency, bias, usdh, rtt = parts
    cost = np.where(feasible, compute + egress + latency + bias, np.inf)
    domains = tuple(
        tuple(domain_key(o.cluster, w.spec.spread.topology if w.spec.spread else "cluster")
              for o in options) for w in wls) if any(w.spec.spread for w in wls) else \
        tuple(() for _ in wls)
    cand = _prune(wls, cost, k, domains)
    return CandidateSet(
        workloads=wls, options=options, headroom=min(max(action.headroom, 0.0), 1.0),
        demand=demand, replicas=replicas, feasible=feasible, cost=cost, compute=compute,
        egress=egress, latency=latency, bias=bias, usd_per_hour=usdh, rtt_ms=rtt,
        cand=cand, infeasible_counts=counts, domain=domains, visible=visible)


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
                  node: FloatArray) -> dict[str, BoolArray]:
    """One W x O boolean mask per family: True = this family allows the pair."""
    n_w, n_o = len(wls), len(options)
    ones = np.ones((n_w, n_o), dtype=bool)
    healthy = np.array([o.cluster.healthy for o in options], dtype=bool)
    fits = ((demand[:, None, 0] <= node[None, :, 0] + 1e-9)
            & (demand[:, None, 1] <= node[None, :, 1] + 1e-9)
            & (demand[:, None, 2] <= node[None, :, 2]))
    models = {m: i for i, m in enumerate(sorted(
        {(o.pool.gpu_model or "").lower() for o in options}
        | {(w.spec.gpu_model or "").lower() for w in wls}))}
    pool_model = np.array([models[(o.pool.gpu_model or "").lower()] for o in options])
    want_model = np.array([models[(w.spec.gpu_model or "").lower()] if w.spec.gpu_model
                           else -1 for w in wls])
    model_ok = (want_model[:, None] < 0) | (want_model[:, None] == pool_model[None, :])
    pool_ic = np.array([o.pool.interconnect.rank for o in options])
    want_ic = np.array([w.spec.interconnect.rank if w.spec.resources.gpu > 1 else 0
                        for w in wls])
    ic_ok = want_ic[:, None] <= pool_ic[None, :]
    free_set = np.array([o.pool.largest_free_gpu_set if (
        o.pool.can_add_nodes == 0 and o.pool.largest_free_gpu_set > 0) else 1 << 30
        for o in options])
    topo_ok = demand[:, None, 2] <= free_set[None, :]
    spot = np.array([o.pool.pricing is PricingModel.SPOT for o in options], dtype=bool)
    spot_ok_w = np.array([w.spec.spot_ok for w in wls], dtype=bool)
    spot_mask = spot_ok_w[:, None] | ~spot[None, :]
    return {
        "health": ones & healthy[None, :],
        "resources": fits,
        "gpu_model": model_ok,
        "interconnect": ic_ok,
        "topology": topo_ok,
        "latency": _latency_mask(snapshot, wls, options),
        "taints": _per_cluster_mask(
            wls, options, lambda w: tuple(w.spec.tolerations),
            lambda sig, c: tolerates_all(sig, c.taints)),
        "affinity": _per_cluster_mask(
            wls, options,
            lambda w: (tuple(sorted(w.spec.affinity.items())),
                       tuple(sorted(w.spec.anti_affinity.items())), w.spec.cluster_names),
            lambda sig, c: labels_ok(c, dict(sig[0]), dict(sig[1]))
            and (not sig[2] or c.name in sig[2])),
        "spot": spot_mask,
        "avoid": _avoid_mask(snapshot, wls, options),
    }


def _per_cluster_mask(wls: Sequence[Workload], options: Sequence[Option],
                      signature: Callable[[Workload], Any],
                      check: Callable[[Any, Cluster], bool]) -> BoolArray:
    """Evaluate `check(signature(w), cluster)` once per distinct signature and cluster."""
    sigs: dict[Any, int] = {}
    rows = np.empty(len(wls), dtype=np.int64)
    for i, w in enumerate(wls):
        rows[i] = sigs.setdefault(signature(w), len(sigs))
    table = np.ones((max(len(sigs), 1), len(options)), dtype=bool)
    verdict: dict[tuple[int, str], bool] = {}
    for sig, r in sigs.items():
        for j, o in enumerate(options):
            key = (r, o.cluster.name)
            if key not in verdict:
                verdict[key] = bool(check(sig, o.cluster))
            table[r, j] = verdict[key]
    return table[rows] if len(wls) else np.ones((0, len(options)), dtype=bool)


def _latency_mask(snapshot: FederationSnapshot, wls: Sequence[Workload],
                  options: Sequence[Option]) -> BoolArray:
    resolver = RttResolver(snapshot)
    mask = np.ones((len(wls), len(options)), dtype=bool)
    rows: dict[tuple[str, float], BoolArray] = {}
    for i, w in enumerate(wls):
        spec = w.spec
        if spec.latency_slo_ms is None or spec.user_region is None:
            continue
        key = (spec.user_region, spec.latency_slo_ms)
        if key not in rows:
            ok = np.zeros(len(options), dtype=bool)
            for j, o in enumerate(options):
                rtt = resolver.rtt_ms(spec.user_region, o.cluster)
                ok[j] = rtt is not None and rtt <= spec.latency_slo_ms + 1e-9
            rows[key] = ok
        mask[i] = rows[key]
    return mask


def _avoid_mask(snapshot: FederationSnapshot, wls: Sequence[Workload],
                options: Sequence[Option]) -> BoolArray:
    mask = np.ones((len(wls), len(options)), dtype=bool)
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


def _costs(snapshot: FederationSnapshot, action: PolicyAction, wls: Sequence[Workload],
           options: Sequence[Option], clusters: Mapping[str, Cluster], demand: FloatArray,
           node: FloatArray, service_horizon_h: float,
           site_cost_fraction: float = 1.0) -> tuple[FloatArray, ...]:
    """compute, egress, latency, bias, usd_per_hour, rtt_ms: each W x O, per replica."""
    n_w, n_o = len(wls), len(options)
    # Dominant share; a resource the node lacks counts 0 here (the pair is
    # infeasible by the `resources` family anyway, so its cost is never used).
    inv = np.divide(1.0, node, out=np.zeros_like(node), where=node > 0)
    share = np.zeros((n_w, n_o))
    for r in range(3):
        np.maximum(share, np.outer(demand[:, r], inv[:, r]), out=share)
    price = np.array([o.pool.price_usd_per_hour for o in options], dtype=np.float64)
    usdh = share * price[None, :]
    hours = np.array([expected_hours(w, service_horizon_h) for w in wls], dtype=np.float64)
    # With site_cost_fraction < 1 the objective prices the marginal cost of fixed sites (paid
    # anyway, see SUNK_SITE_COST_FRACTION); `usdh` stays the apportioned price for budgets.
    marginal = np.array([site_cost_fraction if o.pool.pricing == PricingModel.EDGE
                         else 1.0 for o in options], dtype=np.float64)
    compute = usdh * marginal[None, :] * hours[:, None]
    bias_c = np.array([action.cluster_bias_usd_per_hour.get(o.cluster.name, 0.0)
                       for o in options], dtype=np.float64)
    bias = hours[:, None] * bias_c[None, :]
    egress = _egress(snapshot, wls, options, clusters)
    rtt = np.full((n_w, n_o), np.nan)
    resolver = RttResolver(snapshot)
    rows: dict[str, FloatArray] = {}
    for i, w in enumerate(wls):
        region = w.spec.user_region
        if region is None:
            continue
        if region not in rows:
            values = [resolver.rtt_ms(region, o.cluster) for o in options]
            rows[region] = np.array([np.nan if v is None else v for v in values],
                                    dtype=np.float64)
        rtt[i] = rows[region]
    latency = np.where(np.isnan(rtt), 0.0, rtt) * action.latency_weight_usd_per_ms
    return compute, egress, latency, bias, usdh, rtt


def _egress(snapshot: FederationSnapshot, wls: Sequence[Workload],
            options: Sequence[Option], clusters: Mapping[str, Cluster]) -> FloatArray:
    """Data GB x USD/GB to each option's cluster, shared evenly by the replicas."""
    out = np.zeros((len(wls), len(options)))
    price_cache: dict[str, FloatArray] = {}
    for i, w in enumerate(wls):
        if not w.spec.data:
            continue
        row = np.zeros(len(options))
        for d in w.spec.data:
            if d.location not in price_cache:
                price_cache[d.location] = np.array(
                    [egress_usd_per_gb(snapshot, clusters, d.location, o.cluster)
                     for o in options])
            row += d.size_gb * price_cache[d.location]
        out[i] = row / max(1, w.spec.replicas)
    return out


def _prune(wls: Sequence[Workload], cost: FloatArray, k: int,
           domains: Sequence[Sequence[str]]) -> tuple[IntArray, ...]:
    """Keep each workload's k cheapest feasible options (+ best per spread domain)."""
    n_w, n_o = cost.shape
    if n_o == 0:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(n_w))
    kk = max(1, min(k, n_o))
    if kk < n_o:
        part = np.argpartition(cost, kk - 1, axis=1)[:, :kk]
    else:
        part = np.tile(np.arange(n_o), (n_w, 1))
    out: list[IntArray] = []
    for i, w in enumerate(wls):
        idx = part[i][np.isfinite(cost[i, part[i]])]
        spread = w.spec.spread
        if spread is not None and spread.min_domains > 1:
            idx = np.union1d(idx, _best_per_domain(cost[i], domains[i],
                                                   2 * spread.min_domains + 2))
        idx = idx[np.argsort(cost[i, idx], kind="stable")]
        out.append(idx.astype(np.int64))
    return tuple(out)


def _best_per_domain(cost_row: FloatArray, domains: Sequence[str], n: int) -> IntArray:
    best: dict[str, int] = {}
    for j in np.argsort(cost_row, kind="stable"):
        if not math.isfinite(cost_row[j]):
            break
        best.setdefault(domains[j], int(j))
        if len(best) >= n:
            break
    return np.array(sorted(best.values()), dtype=np.int64)


def quota_headroom(cluster: Cluster, options: Sequence[Option]) -> tuple[float | None,
                                                                          float | None]:
    """vCPUs and GPUs the cluster's new nodes may still take under its provider quota.

    Quotas count provisioned nodes, so what is left is the quota minus what
    the cluster's pools have now. The quota is taken as given: the snapshot merge
    (placement/snapshot.py) already took what others use and, for a stale one, the
    safety margin off. None = no quota known.
    """
    pools = [o.pool for o in options if o.cluster.name == cluster.name]
    out: list[float | None] = []
    for quota, dim in ((cluster.quota_vcpu, 0), (cluster.quota_gpu, 2)):
        if quota is None:
            out.append(None)
            continue
        have = sum((p.node.cpu if dim == 0 else p.node.gpu) * p.nodes for p in pools)
        out.append(max(0.0, quota - have))
    return out[0], out[1]
