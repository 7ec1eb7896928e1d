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
  (RTT(user region, cluster) above the SLO, or unknown), `taints` (the cluster's, and
  GKE's GPU taint on a GPU pool, which pods asking no GPU do not tolerate:
  feasibility.pool_taints), `affinity`
  (cluster label selectors), `spot` (spot pool, workload not spot_ok),
  `avoid` (a workload it must avoid already runs in that cluster); for a workload with
  `replicaSplit: weighted`, `weighted` counts the options of feasible clusters that get no
  share (weighted.py: not on the weight list).
- `cost[w, o]`: objective per replica in USD, the sum of
  `compute` = node price x dominant resource share x expected hours,
  `egress` = data GB x USD/GB to the option's region / replicas,
  `latency` = latency weight (USD/ms) x RTT, and
  `bias` = the policy's cluster bias (USD/h, plus its spot bias on spot options) x expected hours.
- `cand[w]`: the k cheapest feasible options (plus the cheapest per spread
  domain, and the k cheapest of each cluster with a weighted share), the LP's columns;
  "cheapest" counts the replica's share of a new node's charge where the pool has
  no free room for it.
- `targets[w]`: replicas per cluster of a weighted workload (weighted.py), {} otherwise.
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
import operator
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from broker.domain import (
    Cluster,
    FederationSnapshot,
    PolicyAction,
    Pool,
    PricingModel,
    Workload,
    WorkloadKind,
)
from broker.placement.feasibility import (
    GpuClass,
    capacity_shares,
    domain_key,
    family_masks,
    free_gpu_sets,
    gpu_class,
    reserved_nodes,
    rtt_table,
    sets_per_new_node,
    tenancy_mask,
)
from broker.placement.memo import PlanMemo
from broker.placement.weighted import targets as weighted_targets

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
# The packing model's price of a replica on a cloud node as a fraction of its apportioned
# price (PlannerConfig.paid_cost_fraction). 1: a replica pays its share of the node it will
# hold for its whole life wherever it runs, and paid room is cheaper than a new node by the
# node charge alone. Below 1 the share is discounted as "already paid", which is true only
# until the node would have been given back, and it shrinks compute against the latency and
# egress terms the policy's weights were set for; so the default keeps 1.
PAID_NODE_COST_FRACTION = 1.0
# Minimum billed seconds of one node, per provider (module docstring cites each); fixed sites
# (edge, onprem) are not billed per node.
BILLING_MIN_S = {"aws": 60.0, "gcp": 60.0, "azure": 60.0}
DEFAULT_BILLING_MIN_S = 60.0
# Seconds from ordering a node to its being Ready (and paid all along): the twin's default
# `provision_delay_s` (docs/twin.md); PlannerConfig.node_boot_s.
NODE_BOOT_S = 120.0


def boot_estimates(clusters: Sequence[Cluster], default: float, *, observed: bool = True
                   ) -> dict[tuple[str, str], float]:
    """Seconds a new node of each pool ((cluster, pool) -> s) is paid before it can run
    anything (the boot in its node charge, `node_charges`): the pool's measured boot
    (`Pool.boot_s`); for a pool not measured yet, the median of its provider's measured
    pools (one provisioning path: the same API, machine images and node bootstrap), else of
    every measured pool, else `default` (NODE_BOOT_S, the boot assumed; used only while no
    boot at all was measured). Without `observed`, `default` everywhere.

    Why the fallbacks: a pool charged the assumed 120 s beside pools measured at 300 s looks
    cheaper to open for no reason but that nobody opened it yet (gpu-training: lp opened an
    8-GPU node in the one cloud not yet measured and kept it busy with one-GPU jobs for
    hours; docs/placement.md, "Measured boot times")."""
    pairs = [(c, p) for c in clusters for p in c.pools]
    if not observed or all(p.boot_s is None for _, p in pairs):
        return {(c.name, p.name): default for c, p in pairs}
    seen: dict[str, list[float]] = {}
    every: list[float] = []
    for c, p in pairs:
        if p.boot_s is not None:
            seen.setdefault(c.provider, []).append(p.boot_s)
            every.append(p.boot_s)
    fallback = {k: statistics.median(v) for k, v in seen.items()}
    anywhere = statistics.median(every)
    return {(c.name, p.name): p.boot_s if p.boot_s is not None
            else fallback.get(c.provider, anywhere) for c, p in pairs}


# The resources of a node, in the order of every O x 3 array here, as the LP's capacity rows
# name them (lp_rows.py).
RESOURCES = ("cpu", "memory", "gpu")


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
class OptionTable:
    """What the solvers read about every option, read once per snapshot.

    `node`: O x 3 allocatable per node (cpu, memory_gib, gpu); `free`: O x 3 free now
    (`Pool.free`, not clipped: it is negative on an over-committed pool); `can_add`: O,
    nodes the pool may still add; `quota`: cluster name -> the vCPUs and GPUs its new nodes
    may still take under its provider quota (`_cluster_block`), and
    `option_quota` the same per option (O x 2: vCPU, GPU; inf = no quota). Per option too:
    its cluster's name (`cluster_of`) and position in `clusters` (`col`; the snapshot's
    clusters that have pools, in order), the node price (USD/h), whether the pool is spot
    or priced as fixed hardware (`edge_priced`: PricingModel.EDGE; `fixed`: that, or on an
    edge cluster), its cluster's health, the GPU interconnect's rank, the GPU model
    (lower case, "" for none) and the provider's minimum billed hours of a node;
    `cluster_options`: cluster name -> its options. The arrays are read-only, so one table
    is shared by every Ledger and model built on the set.
    """

    node: FloatArray
    free: FloatArray
    can_add: IntArray
    quota: Mapping[str, tuple[float | None, float | None]]
    option_quota: FloatArray
    cluster_of: tuple[str, ...] = ()
    col: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    clusters: tuple[Cluster, ...] = ()
    price: FloatArray = field(default_factory=lambda: np.zeros(0))
    spot: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    edge_priced: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    fixed: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    healthy: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    ic_rank: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpu_model: tuple[str, ...] = ()
    billing_h: FloatArray = field(default_factory=lambda: np.zeros(0))
    cluster_options: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # Per option, for the pool decisions (decisions.py): nodes now and at most, used vCPU
    # and GPUs, and how many nodes scale-in may remove (`Pool.empty_nodes`).
    nodes: FloatArray = field(default_factory=lambda: np.zeros(0))
    max_nodes: FloatArray = field(default_factory=lambda: np.zeros(0))
    used_cpu: FloatArray = field(default_factory=lambda: np.zeros(0))
    used_gpu: FloatArray = field(default_factory=lambda: np.zeros(0))
    empty: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # (cluster, pool) names -> option index.
    option_of: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # `node` and `free` clipped at 0 as lists of [cpu, memory_gib, gpu] rows, what the
    # Ledger's per-replica paths read (ledger.py). Shared by every Ledger: never changed.
    node_rows: Sequence[Sequence[float]] = ()
    free_rows: Sequence[Sequence[float]] = ()
    # Per option, the LP's capacity-row names ("capacity", "cluster/pool:resource") for
    # cpu, memory_gib and gpu (lp_rows.capacity_rows), made once per Cluster value.
    capacity_names: Sequence[tuple[tuple[str, str], ...]] = ()


@dataclass(slots=True, eq=False)
class _ClusterBlock:
    """One cluster's part of the option table (`options_and_table`), made once per Cluster
    value; its Options are made again only where the cluster's first option index moved."""

    cluster: Cluster
    # per pool (rows): Pool.figures, price, spot, edge-priced, IC rank, nodes, max nodes,
    # used vCPU and GPUs, empty nodes
    rows: FloatArray
    models: list[str]
    quota: tuple[float | None, float | None]
    keys: list[tuple[str, str]]  # (cluster, pool) names
    names: list[tuple[tuple[str, str], ...]]  # capacity-row names per pool
    start: int = -1
    options: tuple[Option, ...] = ()


def _cluster_block(c: Cluster) -> _ClusterBlock:
    """The cluster's rows, and the vCPUs and GPUs its new nodes may still take under its
    provider quota. Quotas count provisioned nodes, so what is left is the quota minus what
    the cluster's pools have now. The quota is taken as given: the snapshot merge
    (placement/snapshot.py) already took what others use and, for a stale one, the safety
    margin off. None = no quota known."""
    rows: list[tuple[float, ...]] = []
    have_cpu = have_gpu = 0.0
    for p in c.pools:
        rows.append((*p.figures, p.price_usd_per_hour,
                     1.0 if p.pricing is PricingModel.SPOT else 0.0,
                     1.0 if p.pricing == PricingModel.EDGE else 0.0,
                     float(p.interconnect.rank), float(p.nodes), float(p.max_nodes),
                     p.used.cpu, float(p.used.gpu), float(len(p.empty_nodes))))
        have_cpu += p.node.cpu * p.nodes
        have_gpu += p.node.gpu * p.nodes
    q_cpu, q_gpu = c.quota_vcpu, c.quota_gpu
    quota = (None if q_cpu is None else max(0.0, q_cpu - have_cpu),
             None if q_gpu is None else max(0.0, q_gpu - have_gpu))
    return _ClusterBlock(c, np.array(rows, dtype=np.float64).reshape(-1, 16),
                         [(p.gpu_model or "").lower() for p in c.pools], quota,
                         [(c.name, p.name) for p in c.pools],
                         [tuple(("capacity", f"{c.name}/{p.name}:{r}") for r in RESOURCES)
                          for p in c.pools])


def options_and_table(snapshot: FederationSnapshot, memo: PlanMemo | None = None
                      ) -> tuple[tuple[Option, ...], OptionTable]:
    """The snapshot's options (each pool of each cluster, in order) and their OptionTable.
    With `memo`: the same objects again while the snapshot's clusters are the same Cluster
    objects as at the last call, and each unchanged cluster's part of the table as it was
    (the twin's merge hands out an unchanged member's Cluster again, placement/snapshot.py).
    """
    clusters = snapshot.clusters
    if memo is not None and memo.option_table is not None:
        last, out = memo.option_table
        if len(last) == len(clusters) and all(map(operator.is_, last, clusters)):
            return out  # type: ignore[return-value]
    blocks = memo.option_blocks if memo is not None else {}
    options: list[Option] = []
    rows: list[FloatArray] = []
    models: list[str] = []
    keys: list[tuple[str, str]] = []
    cap_names: list[tuple[tuple[str, str], ...]] = []
    col: list[int] = []
    names: list[str] = []
    quota: dict[str, tuple[float | None, float | None]] = {}
    with_pools: list[Cluster] = []
    by_cluster: dict[str, tuple[int, ...]] = {}
    for c in clusters:
        blk = blocks.get(c.name)
        if not isinstance(blk, _ClusterBlock) or blk.cluster is not c:
            blk = _cluster_block(c)
            blocks[c.name] = blk
        start = len(options)
        if blk.start != start:
            blk.options = tuple(Option(index=start + i, cluster=c, pool=p)
                                for i, p in enumerate(c.pools))
            blk.start = start
        if not blk.options:
            continue
        ci = len(with_pools)
        with_pools.append(c)
        options.extend(blk.options)
        rows.append(blk.rows)
        models.extend(blk.models)
        keys.extend(blk.keys)
        cap_names.extend(blk.names)
        n = len(blk.options)
        col.extend([ci] * n)
        names.extend([c.name] * n)
        quota[c.name] = blk.quota
        by_cluster[c.name] = tuple(range(start, start + n))
    option_of = dict(zip(keys, range(len(keys)), strict=True))
    table = np.concatenate(rows) if rows else np.zeros((0, 16))
    col_a = np.array(col, dtype=np.int64)
    healthy_c = np.array([c.healthy for c in with_pools], dtype=bool)
    edge_c = np.array([c.is_edge for c in with_pools], dtype=bool)
    billing_c = np.array([BILLING_MIN_S.get(c.provider, DEFAULT_BILLING_MIN_S)
                          for c in with_pools], dtype=np.float64) / 3600.0
    quota_c = np.array([[np.inf if v is None else v for v in quota[c.name]]
                        for c in with_pools], dtype=np.float64).reshape(-1, 2)
    edge_priced = table[:, 9] > 0.5
    arrays = {
        "node": np.ascontiguousarray(table[:, 0:3]),
        "free": np.ascontiguousarray(table[:, 3:6]),
        "can_add": table[:, 6].astype(np.int64), "option_quota": quota_c[col_a],
        "col": col_a, "price": np.ascontiguousarray(table[:, 7]), "spot": table[:, 8] > 0.5,
        "edge_priced": edge_priced, "fixed": edge_priced | edge_c[col_a],
        "healthy": healthy_c[col_a], "ic_rank": table[:, 10].astype(np.int64),
        "billing_h": billing_c[col_a], "nodes": table[:, 11], "max_nodes": table[:, 12],
        "used_cpu": table[:, 13], "used_gpu": table[:, 14],
        "empty": table[:, 15].astype(np.int64)}
    for a in arrays.values():
        a.flags.writeable = False
    out = (tuple(options), OptionTable(
        quota=MappingProxyType(quota), cluster_of=tuple(names), clusters=tuple(with_pools),
        gpu_model=tuple(models), cluster_options=MappingProxyType(by_cluster),
        option_of=MappingProxyType(option_of), capacity_names=cap_names,
        node_rows=arrays["node"].tolist(),
        free_rows=np.maximum(arrays["free"], 0.0).tolist(), **arrays))
    if memo is not None:
        memo.option_table = (clusters, out)
    return out


def option_table(options: Sequence[Option]) -> OptionTable:
    """The OptionTable of `options` (a snapshot's, in `options_and_table` order)."""
    clusters = tuple({o.cluster.name: o.cluster for o in options}.values())
    return options_and_table(FederationSnapshot(now_s=0.0, clusters=clusters, pending=()))[1]


_NO_SETS: Mapping[tuple[int, GpuClass], tuple[int, int]] = MappingProxyType({})


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
    # Per option, read once from its pool (`options_and_table`): what every solver and Ledger
    # reads many times per epoch. Read-only arrays.
    table: OptionTable
    visible: BoolArray | None = None  # W x O: the tenant may use the cluster (None: all)
    # The packing model (module docstring): USD per new node of each option (O), and the
    # apportioned compute the marginal `compute` was scaled from. None: per-replica model.
    node_usd: FloatArray | None = None
    list_compute: FloatArray | None = None
    # Per workload: fixed replicas per cluster of `replicaSplit: weighted` ({}: cost split).
    targets: tuple[Mapping[str, int], ...] = ()
    # GPU sets (feasibility.py): (option, class) -> (sets free now after the reservation for
    # queued whole-node jobs, sets per new node), where the LP needs a row for the class.
    gpu_sets: Mapping[tuple[int, GpuClass], tuple[int, int]] = field(
        default_factory=lambda: _NO_SETS)

    def target(self, w: int) -> Mapping[str, int]:
        """Workload w's weighted shares by cluster; {} when the LP divides by cost."""
        return self.targets[w] if self.targets else {}

    def options_visible(self, w: int) -> int:
        """How many options workload w's tenant may see (its decision record's count)."""
        return len(self.options) if self.visible is None else int(self.visible[w].sum())

    def shares(self) -> FloatArray:
        """O x 3: the share of each option's capacity (cpu, memory, GPUs) the program may fill
        (feasibility.capacity_shares): all of it on cloud pools of GPU nodes
        (feasibility.bought_for_gpus), else the policy's headroom for cpu and memory."""
        gpu_node = (self.table.node[:, 2] > 0) & ~self.table.fixed
        out: FloatArray = np.where(gpu_node[:, None],
                                   np.array(capacity_shares(self.headroom, gpu_node=True)),
                                   np.array(capacity_shares(self.headroom)))
        return out.reshape(len(self.options), 3)

    def option_node(self) -> FloatArray:
        """O x 3 allocatable per node (read-only)."""
        return self.table.node

    def quota_left(self, cluster: str) -> tuple[float | None, float | None]:
        """The cluster's vCPU and GPU quota headroom for new nodes (`OptionTable.quota`)."""
        return self.table.quota[cluster]


def expected_hours(workload: Workload, service_horizon_h: float) -> float:
    """Hours the objective counts a replica for: duration for jobs, a horizon for services."""
    spec = workload.spec
    if spec.kind is WorkloadKind.SERVICE or spec.duration_s is None:
        return service_horizon_h
    return max(spec.duration_s, 1.0) / 3600.0


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


def build_candidates(snapshot: FederationSnapshot, action: PolicyAction, *,
                     k: int, service_horizon_h: float,
                     workloads: Sequence[Workload] | None = None,
                     site_cost_fraction: float = 1.0, packing: bool = False,
                     paid_cost_fraction: float = PAID_NODE_COST_FRACTION,
                     node_boot_s: float = NODE_BOOT_S, node_idle_s: float = 0.0,
                     observed_boot: bool = False, fill_forecast: bool = False,
                     queued: Sequence[Workload] = (), columns: bool = True,
                     memo: PlanMemo | None = None) -> CandidateSet:
    """Feasibility, cost and the k best options of every pending workload.

    `packing` selects the fixed-charge model (module docstring): marginal per-replica
    compute on paid nodes plus `node_usd` per new node; otherwise the per-replica model.
    `node_idle_s`: how long a node that has emptied stays paid before scale-in takes it (the
    policy's idle timer; the action's per-pool or per-cluster `idle_timeout_s` overrides it,
    `PolicyAction.for_pool`), part of the packing model's node charge. `observed_boot`:
    once some pool's boot was measured (`Pool.boot_s`), each pool's node charge counts its
    `boot_estimates` instead of `node_boot_s` (decisions.DecisionConfig.observed_boot).
    `fill_forecast`: each new node's charge less the share the forecast arrivals would pay
    (`fill_shares`; decisions.DecisionConfig.fill_forecast).
    `queued`: pending workloads not in this batch, for feasibility.py's reservation rule.
    `columns=False`: feasibility and cost only, for a caller that reads no LP columns
    (migrate.py): `cand` and `infeasible_counts` are empty per workload and `gpu_sets` has
    no rows. `memo`: what earlier plans resolved (memo.py; speed only).
    """
    wls = tuple(snapshot.pending if workloads is None else workloads)
    options, table = options_and_table(snapshot, memo)
    clusters = {c.name: c for c in snapshot.clusters}
    demand = np.array([(r.cpu, r.memory_gib, r.gpu) for r in
                       [w.spec.resources for w in wls]], dtype=np.float64).reshape(-1, 3)
    replicas = np.array([max(0, w.spec.replicas) for w in wls], dtype=np.int64)
    node = table.node
    rtt = rtt_table(snapshot, wls, options, memo, table=table)
    masks = family_masks(snapshot, wls, options, demand, node, rtt, table=table)
    visible = tenancy_mask(wls, options)
    feasible = visible.copy()
    for m in masks.values():
        feasible &= m
    weighted = any(w.spec.replica_weights for w in wls)
    targets, in_share = weighted_targets(wls, [o.cluster for o in options], feasible) \
        if weighted else (tuple({} for _ in wls), np.ones(feasible.shape, dtype=np.bool_))
    counts = _infeasible_counts(visible, masks, feasible, in_share) if columns else \
        tuple({} for _ in wls)
    if weighted:
        feasible &= in_share
    shapes = replica_shapes(demand)
    parts = _costs(snapshot, action, wls, options, clusters, shapes, node, rtt,
                   service_horizon_h, site_cost_fraction, table=table)
    compute, egress, latency, bias, usdh = parts
    node_usd: FloatArray | None = None
    list_compute: FloatArray | None = None
    if packing:
        list_compute = compute
        paid = np.where(table.edge_priced, 1.0, paid_cost_fraction)
        compute = compute * paid[None, :]
        idle_s = np.array([action.for_pool("idle_timeout_s", o.cluster.name, o.pool.name,
                                           node_idle_s) for o in options], dtype=np.float64) \
            if action.idle_timeout_s or action.pool_idle_timeout_s \
            else np.full(len(options), float(node_idle_s))
        boot: float | FloatArray = node_boot_s
        if observed_boot and any(o.pool.boot_s is not None for o in options):
            est = boot_estimates(snapshot.clusters, node_boot_s)
            boot = np.array([est[o.cluster.name, o.pool.name] for o in options],
                            dtype=np.float64)
        node_usd = node_charges(options, feasible, wls, service_horizon_h, boot + idle_s,
                                table=table)
        if fill_forecast:
            node_usd *= 1.0 - fill_shares(snapshot, options, table, node_usd, demand,
                                          feasible)
    cost = compute + egress  # then in place, left to right as `compute + egress + ...` adds
    cost += latency
    if _biased(action):  # else `bias` is all zeros (_costs)
        cost += bias
    np.copyto(cost, np.inf, where=~feasible)
    domains = tuple(
        tuple(domain_key(o.cluster, w.spec.spread.topology if w.spec.spread else "cluster")
              for o in options) for w in wls) if any(w.spec.spread for w in wls) else \
        tuple(() for _ in wls)
    cand = _prune(wls, _prune_key(cost, shapes, table.price, table.free, usdh, node_usd), k,
                  domains, targets, options) if columns else \
        tuple(np.zeros(0, dtype=np.int64) for _ in wls)
    return CandidateSet(
        workloads=wls, options=options, headroom=capacity_shares(action.headroom)[0],
        demand=demand, replicas=replicas, feasible=feasible, cost=cost, compute=compute,
        egress=egress, latency=latency, bias=bias, usd_per_hour=usdh, rtt_ms=rtt,
        cand=cand, infeasible_counts=counts, domain=domains, table=table, visible=visible,
        targets=targets, node_usd=node_usd, list_compute=list_compute,
        gpu_sets=gpu_set_table(wls, options, feasible, queued, action.reserve_nodes)
        if columns else _NO_SETS)


def _infeasible_counts(visible: BoolArray, masks: Mapping[str, BoolArray],
                       feasible: BoolArray, in_share: BoolArray
                       ) -> tuple[dict[str, int], ...]:
    """Per workload, how many of the options its tenant sees each family rules out, and
    `weighted` for feasible options of clusters its weighted split gives no share."""
    n_w = visible.shape[0]
    ruled_out = np.stack([np.count_nonzero(visible & ~masks[f], axis=1) for f in FAMILIES],
                         axis=1) if n_w else np.zeros((0, len(FAMILIES)), dtype=np.int64)
    no_share = np.count_nonzero(feasible & ~in_share, axis=1)
    per_w: list[dict[str, int]] = [{} for _ in range(n_w)]
    for i, j in zip(*np.nonzero(ruled_out), strict=True):  # row by row, families in order
        per_w[i][FAMILIES[j]] = int(ruled_out[i, j])
    for i in np.flatnonzero(no_share):
        per_w[i]["weighted"] = int(no_share[i])
    return tuple(per_w)


def gpu_set_table(wls: Sequence[Workload], options: Sequence[Option], feasible: BoolArray,
                  queued: Sequence[Workload], extra: Mapping[str, int] | None = None,
                  ) -> Mapping[tuple[int, GpuClass], tuple[int, int]]:
    """CandidateSet.gpu_sets: a row for every multi-GPU class on every pool it is feasible
    on, and for single GPUs too where whole nodes are reserved (feasibility.py; `extra`:
    PolicyAction.reserve_nodes, whole nodes per cluster kept beyond the queued jobs')."""
    classes: dict[GpuClass, list[int]] = {}
    for i, w in enumerate(wls):
        cls = gpu_class(w)
        if cls is not None:
            classes.setdefault(cls, []).append(i)
    out: dict[tuple[int, GpuClass], tuple[int, int]] = {}
    if not classes:
        return out
    for j, o in enumerate(options):
        g = int(o.pool.node.gpu)
        if g <= 0:
            continue
        more = (extra or {}).get(o.cluster.name, 0)
        reserve = reserved_nodes(o.pool, queued, more) if queued or more > 0 else 0
        for cls, idx in classes.items():
            if cls[0] > g or (cls[0] < 2 and reserve == 0) or not feasible[idx, j].any():
                continue
            out[(j, cls)] = (free_gpu_sets(o.pool, cls, reserve if cls[0] < g else 0),
                             sets_per_new_node(o.pool, cls))
    return out


def node_charges(options: Sequence[Option], feasible: BoolArray, wls: Sequence[Workload],
                 service_horizon_h: float, node_boot_s: float | FloatArray, *,
                 table: OptionTable | None = None) -> FloatArray:
    """USD charged in the objective for opening one node of each option (module docstring):
    its price over the paid seconds no work uses (`node_boot_s`: boot, plus the idle timer
    after its last replica, per option or one number) and the work it is opened for."""
    hours = np.array([expected_hours(w, service_horizon_h) for w in wls], dtype=np.float64)
    # longest = max over w of (hours[w] where feasible[w, o], else 0), without a W x O float
    # array: the first feasible workload in order of falling hours (hours are >= 0).
    longest = np.zeros(len(options))
    if len(wls):
        order = np.argsort(-hours, kind="stable")
        ranked = feasible[order]
        first = ranked.argmax(axis=0)
        any_ok = ranked[first, np.arange(len(options))]
        longest[any_ok] = hours[order][first[any_ok]]
    table = table if table is not None else option_table(options)
    fixed, billing_h, price = table.fixed, table.billing_h, table.price
    span_h = np.maximum(billing_h, np.minimum(service_horizon_h, longest))
    idle_h = np.maximum(0.0, np.asarray(node_boot_s, dtype=np.float64)) / 3600.0
    out: FloatArray = np.where(fixed, 0.0, price * (idle_h + span_h))
    return out


def _least_units(demand: FloatArray, feasible: BoolArray, table: OptionTable,
                 among: IntArray) -> FloatArray:
    """For the options `among`, the fewest units (GPUs on a GPU pool, else vCPU) one replica
    of the batch that may run there takes: what a node opened for the batch holds at least
    (0 where no workload may run; on a GPU pool only workloads that ask GPUs count, as only
    they open one for its GPUs). The first feasible workload in order of rising units, as
    node_charges finds the longest. Per option (0 outside `among`)."""
    n_o = feasible.shape[1] if feasible.ndim == 2 else 0
    out: FloatArray = np.zeros(n_o)
    if not n_o or not len(demand) or not len(among):
        return out
    is_gpu = table.node[:, 2] > 0
    for gpu_side, col in ((True, 2), (False, 0)):
        cols = among[is_gpu[among] == gpu_side]
        rows = np.flatnonzero(demand[:, 2] > 0) if gpu_side else np.arange(len(demand))
        if not len(cols) or not len(rows):
            continue
        order = rows[np.argsort(demand[rows, col], kind="stable")]
        ranked = feasible[np.ix_(order, cols)]
        first = ranked.argmax(axis=0)
        any_ok = ranked[first, np.arange(len(cols))]
        out[cols[any_ok]] = demand[order[first[any_ok]], col]
    return out


def fill_shares(snapshot: FederationSnapshot, options: Sequence[Option], table: OptionTable,
                node_usd: FloatArray, demand: FloatArray, feasible: BoolArray) -> FloatArray:
    """Per option, the share of a new node's charge (`node_charges`) that work arriving after
    this epoch would pay: the look-ahead of the packing model's fixed charge.

    Why: the charge is the node's price over its charged life L (boot, idle timer, the work
    it is opened for), all billed to the batch that opens it. An epoch's batch is small, so
    that charge favoured the node with the lowest price, not the lowest price per unit of
    work: a draft (seed 9,200,031, lp) opened six 1-GPU g5.16xlarge nodes one job at a time
    at 4.80 USD per GPU-hour beside the 4-GPU g5.12xlarge at 1.83, because each job alone
    paid less on the small node. Later jobs fill the room a bigger node leaves.

    Model, per option o of capacity N units (GPUs on a GPU pool, else vCPU): the cluster's
    forecast arrival rate of that unit over its pools of that kind, λ (the EWMA of placed
    demand, `FederationSnapshot.demand_of`, the prewarm forecast's input); the free room of
    those pools now, F; d, the fewest units one replica of the batch that may run on o takes
    (`_least_units` of the batch's per-replica `demand` and `feasible`, for the options with
    arrivals only; the node holds at least that much of the batch). Of the λL units that
    arrive over L, spread over the room there is, o receives N / (F + N), at most the N - d
    the batch leaves. Arriving uniformly over L and staying to its end, they occupy on
    average half the node-time they arrive into, so they pay

        share_o = 1/2 x min(λ L / (F + N), 1 - d / N)

    of o's charge. No arrivals, room enough elsewhere, or a node one replica fills gives 0
    (the charge as before); the share is below 1/2, so a node is never free. Fixed-priced
    options have no charge.
    """
    n_o = len(options)
    out: FloatArray = np.zeros(n_o)
    if not n_o:
        return out
    is_gpu = table.node[:, 2] > 0
    unit = np.where(is_gpu, table.node[:, 2], table.node[:, 0])
    free = np.where(is_gpu, table.free[:, 2], table.free[:, 0]).clip(min=0.0)
    rates = np.array([snapshot.demand_of(o.cluster.name, o.pool.name) for o in options],
                     dtype=np.float64).reshape(-1, 2)
    rate = np.where(is_gpu, rates[:, 1], rates[:, 0]).clip(min=0.0)
    rate[~np.isfinite(rate)] = 0.0
    # One group per (cluster, kind): the arrivals and the room that compete for them.
    group = table.col.astype(np.int64) * 2 + is_gpu
    size = int(group.max()) + 1
    lam = np.bincount(group, weights=rate, minlength=size)[group]
    room = np.bincount(group, weights=free, minlength=size)[group]
    life_s = np.divide(node_usd * 3600.0, table.price, out=np.zeros(n_o),
                       where=table.price > 0)
    ok = (unit > 0) & (node_usd > 0) & (lam > 0)
    if not ok.any():
        return out
    np.divide(lam * life_s, room + unit, out=out, where=ok)
    held = _least_units(demand, feasible, table, np.flatnonzero(ok))
    out = np.minimum(out, 1.0 - np.divide(held, unit, out=np.ones(n_o), where=unit > 0))
    return 0.5 * np.clip(out, 0.0, 1.0)


def replica_shapes(demand: FloatArray) -> tuple[FloatArray, IntArray]:
    """The batch's distinct replica shapes (cpu, memory, GPUs) and each workload's row there.

    What depends on the shape alone is computed once per shape and gathered: at 20000 x 2000
    a W x O pass costs ~0.1 s, and a batch has a few dozen shapes."""
    shapes, shape_of = np.unique(demand, axis=0, return_inverse=True)
    return shapes, shape_of.reshape(-1).astype(np.int64)


def _prune_key(cost: FloatArray, shapes: tuple[FloatArray, IntArray], price: FloatArray,
               free: FloatArray, usdh: FloatArray, node_usd: FloatArray | None) -> FloatArray:
    """Cost to rank candidates by: with packing, plus the replica's share of a new node's
    charge where the pool's free room cannot take one replica (it would open a node).

    The share of the charge is usd_per_hour x the node's charged hours (node_usd / price),
    computed in place: at 20000 x 2000 every W x O temporary is 320 MB.
    """
    if node_usd is None or not len(price):
        return cost
    hours = np.divide(node_usd, price, out=np.zeros_like(node_usd), where=price > 0)
    rows, shape_of = shapes
    fits_free = np.ones((len(rows), len(price)), dtype=bool)
    for r in range(3):
        fits_free &= rows[:, r, None] <= free[None, :, r] + 1e-9
    out: FloatArray = usdh * hours[None, :]
    np.copyto(out, 0.0, where=fits_free[shape_of])
    out += cost
    return out


def _costs(snapshot: FederationSnapshot, action: PolicyAction, wls: Sequence[Workload],
           options: Sequence[Option], clusters: Mapping[str, Cluster],
           shapes: tuple[FloatArray, IntArray], node: FloatArray, rtt: FloatArray,
           service_horizon_h: float,
           site_cost_fraction: float = 1.0, *,
           table: OptionTable | None = None) -> tuple[FloatArray, ...]:
    """compute, egress, latency, bias, usd_per_hour: each W x O, per replica (`rtt`: the
    batch's feasibility.rtt_table; `shapes`: replica_shapes of the batch's demand).

    At 20000 x 2000 every W x O array is 320 MB and each pass over one costs ~0.1 s, so what
    depends only on the replica's shape is computed per shape and gathered, and what is zero
    is not computed: the same numbers, operation for operation, as the plain W x O formulas
    in the comments.
    """
    n_w, n_o = len(wls), len(options)
    table = table if table is not None else option_table(options)
    price = table.price
    # Dominant share; a resource the node lacks counts 0 here (the pair is
    # infeasible by the `resources` family anyway, so its cost is never used).
    # share = max over r of demand[:, r] / node[:, r];  usdh = share x price
    inv = np.divide(1.0, node, out=np.zeros_like(node), where=node > 0)
    rows, shape_of = shapes
    share = np.zeros((len(rows), n_o))
    for r in range(3):
        np.maximum(share, np.multiply.outer(rows[:, r], inv[:, r]), out=share)
    usdh_shape = share * price[None, :]
    usdh: FloatArray = usdh_shape[shape_of] if n_w else np.zeros((0, n_o))
    hours = np.array([expected_hours(w, service_horizon_h) for w in wls], dtype=np.float64)
    # With site_cost_fraction < 1 the objective prices the marginal cost of fixed sites (paid
    # anyway, see SUNK_SITE_COST_FRACTION); `usdh` stays the apportioned price for budgets.
    # compute = usdh x marginal x hours
    marginal = np.where(table.edge_priced, site_cost_fraction, 1.0)
    compute: FloatArray = (usdh_shape * marginal[None, :])[shape_of] if n_w else \
        np.zeros((0, n_o))
    compute *= hours[:, None]
    bias_c = np.array([action.cluster_bias_usd_per_hour.get(o.cluster.name, 0.0)
                       + (action.for_pool("spot_bias_usd_per_hour", o.cluster.name,
                                          o.pool.name, 0.0)
                          if o.pool.pricing is PricingModel.SPOT else 0.0)
                       for o in options], dtype=np.float64) \
        if _biased(action) else np.zeros(n_o)
    # bias = hours x bias_c; np.zeros maps its pages lazily, so no bias costs no pass
    bias = hours[:, None] * bias_c[None, :] if _biased(action) else np.zeros((n_w, n_o))
    egress = _egress(snapshot, wls, options, clusters)
    # latency = weight x RTT, 0 where the RTT is unknown
    latency = np.where(np.isnan(rtt), 0.0, rtt)
    latency *= action.latency_weight_usd_per_ms
    return compute, egress, latency, bias, usdh


def _biased(action: PolicyAction) -> bool:
    """Whether the action sets any cluster or spot bias (else the objective has no bias term)."""
    return bool(action.cluster_bias_usd_per_hour or action.spot_bias_usd_per_hour
                or action.pool_spot_bias_usd_per_hour)


def _egress(snapshot: FederationSnapshot, wls: Sequence[Workload],
            options: Sequence[Option], clusters: Mapping[str, Cluster]) -> FloatArray:
    """Data GB x USD/GB to each option's cluster, shared evenly by the replicas.

    Per workload: the sum over its data sources, in their order, of size x the source's
    USD/GB row, divided by its replicas; computed for every workload's j-th source at once.
    """
    out = np.zeros((len(wls), len(options)))
    with_data = [i for i, w in enumerate(wls) if w.spec.data]
    if not with_data:
        return out
    locations: dict[str, int] = {}
    n_src = max(len(wls[i].spec.data) for i in with_data)
    loc = np.full((len(with_data), n_src), -1, dtype=np.int64)
    size = np.zeros((len(with_data), n_src))
    for a, i in enumerate(with_data):
        for j, d in enumerate(wls[i].spec.data):
            loc[a, j] = locations.setdefault(d.location, len(locations))
            size[a, j] = d.size_gb
    per_gb = np.array([[egress_usd_per_gb(snapshot, clusters, name, o.cluster)
                        for o in options] for name in locations], dtype=np.float64)
    rows = np.array(with_data, dtype=np.int64)
    acc = np.zeros((len(with_data), len(options)))
    for j in range(n_src):
        has = np.flatnonzero(loc[:, j] >= 0)
        acc[has] += size[has, j, None] * per_gb[loc[has, j]]
    acc /= np.array([max(1, wls[i].spec.replicas) for i in with_data],
                    dtype=np.float64)[:, None]
    out[rows] = acc
    return out


def _prune(wls: Sequence[Workload], cost: FloatArray, k: int,
           domains: Sequence[Sequence[str]], targets: Sequence[Mapping[str, int]] = (),
           options: Sequence[Option] = ()) -> tuple[IntArray, ...]:
    """Keep each workload's k cheapest feasible options (+ best per spread domain, + the k
    cheapest of every cluster with a weighted share: each share needs its columns)."""
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
        if targets and targets[i]:
            names = np.array([o.cluster.name for o in options], dtype=object)
            for cname in targets[i]:
                in_c = np.flatnonzero((names == cname) & np.isfinite(cost[i]))
                best = in_c[np.argsort(cost[i, in_c], kind="stable")[:kk]]
                idx = np.union1d(idx, best)
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
