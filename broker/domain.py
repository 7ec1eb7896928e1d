"""The broker's value types. Plain frozen dataclasses: no I/O, no SQL, no clock.

These are what `broker/placement` computes on, what `broker/store` persists and
what `broker/sim` simulates. The API's pydantic schemas convert to and from
them at the edge (`broker/api/schemas.py`). Add fields only with defaults so
every producer keeps working.

Units are in the names. `cpu` is in vCPUs (cores), memory in GiB.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.base import Interconnect, Offer, PricingModel

__all__ = [
    "Assignment",
    "Cluster",
    "DataSource",
    "FederationSnapshot",
    "Interconnect",
    "NativeObjects",
    "NodeLeaving",
    "NodeState",
    "Offer",
    "Placement",
    "PolicyAction",
    "Pool",
    "PricingModel",
    "Provenance",
    "Resources",
    "Site",
    "SiteHealth",
    "Spread",
    "Tenant",
    "Toleration",
    "UserRegion",
    "Workload",
    "WorkloadKind",
    "WorkloadSpec",
    "WorkloadStatus",
]


@dataclass(frozen=True, slots=True)
class Resources:
    cpu: float = 0.0
    memory_gib: float = 0.0
    gpu: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory_gib + other.memory_gib,
                         self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory_gib - other.memory_gib,
                         self.gpu - other.gpu)

    def scale(self, k: float) -> Resources:
        return Resources(self.cpu * k, self.memory_gib * k, round(self.gpu * k))

    def fits_in(self, other: Resources) -> bool:
        return (self.cpu <= other.cpu + 1e-9 and self.memory_gib <= other.memory_gib + 1e-9
                and self.gpu <= other.gpu)

    def is_valid(self) -> bool:
        return self.cpu >= 0 and self.memory_gib >= 0 and self.gpu >= 0


class WorkloadKind(enum.StrEnum):
    SERVICE = "service"  # long-running, latency-sensitive
    BATCH = "batch"  # runs to completion
    TRAIN = "train"  # GPU training, runs to completion


class WorkloadStatus(enum.StrEnum):
    PENDING = "pending"  # accepted, durable, waiting for the placement loop
    PLACED = "placed"  # a placement is written, not yet applied
    RUNNING = "running"  # applied and reported running by the driver
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNPLACEABLE = "unplaceable"  # no feasible option; the decision record says why


@dataclass(frozen=True, slots=True)
class DataSource:
    size_gb: float
    location: str  # a cluster name, or `provider:region`
    url: str = ""
    sha256: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # NoSchedule | PreferNoSchedule | NoExecute | "" (all)

    def tolerates(self, taint: str) -> bool:
        """`taint` is `key=value:Effect` or `key:Effect` (kubectl's notation)."""
        kv, _, effect = taint.partition(":")
        key, _, value = kv.partition("=")
        if self.key and self.key != key:
            return False
        if self.effect and effect and self.effect != effect:
            return False
        return self.operator == "Exists" or self.value == value


@dataclass(frozen=True, slots=True)
class Spread:
    """Spread replicas over at least `min_domains` and at most `max_domains`."""

    topology: str = "cluster"  # cluster | zone | region
    min_domains: int = 1
    max_domains: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterWeight:
    """One entry of a Karmada static weight list (`weightPreference.staticWeightList`): the
    member clusters its `targetCluster` selects and their weight (a positive integer).

    A cluster matches as in Karmada's `util.ClusterMatches` (pkg/util/selector.go): not in
    `exclude`, carrying every `match_labels` label, and named in `cluster_names` when that
    is not empty (an entry with none of the three matches every cluster).
    """

    weight: int
    cluster_names: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    match_labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self, cluster: Cluster) -> bool:
        if cluster.name in self.exclude:
            return False
        if any(cluster.labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return not self.cluster_names or cluster.name in self.cluster_names


@dataclass(frozen=True, slots=True)
class NativeObjects:
    """A workload submitted as Kubernetes manifests (broker/api/manifests.py), kept so the
    Kubernetes driver applies what the user wrote, not a bare rendering of the spec.

    `workload` is the Deployment, StatefulSet or Job as submitted (JSON); `companions` are
    the Services, ConfigMaps, Secrets and PersistentVolumeClaims that came with it. Secret
    data lives here and is never shown by the API (views list companions by kind and name).
    `defaulted` names the manifest fields the broker filled in (requests of containers
    without any, as a LimitRange would; a Job's run time) so the status can say so.
    """

    kind: str  # Deployment | StatefulSet | Job
    workload: Mapping[str, Any]
    companions: tuple[Mapping[str, Any], ...] = ()
    defaulted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    kind: WorkloadKind
    image: str
    replicas: int
    resources: Resources  # per replica
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE  # required between a replica's GPUs
    user_region: str | None = None  # a user-region name or `provider:region`
    latency_slo_ms: float | None = None  # RTT bound user_region <-> serving cluster
    data: tuple[DataSource, ...] = ()
    image_gb: float = 0.5
    duration_s: float | None = None  # expected run time; None for services
    # Cluster label selectors that must (affinity) / must not (anti_affinity) match.
    affinity: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: Mapping[str, str] = field(default_factory=dict)
    # Workload names this one must not share a cluster with.
    avoid_workloads: tuple[str, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    spread: Spread | None = None
    priority: int = 0
    budget_usd_per_hour: float | None = None
    spot_ok: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    # Only these member clusters (a PlacementPolicy's clusterAffinity.clusterNames); empty: any.
    cluster_names: tuple[str, ...] = ()
    native: NativeObjects | None = None  # the Kubernetes manifests it came from, if any
    # A PlacementPolicy's `replicaSplit: weighted`: replicas divided over the feasible member
    # clusters by these static weights (placement/weighted.py), not by cost; empty: cost.
    replica_weights: tuple[ClusterWeight, ...] = ()
    # Per-replica utilisation the planner plans this service's latency SLO at (RTT + the
    # M/M/c wait of placement/queueing.py); None: the SLO bounds RTT alone. Set by the planner
    # when it sizes a service for its SLO (feasibility.size_for_slo), not by users.
    slo_utilization: float | None = None

    @property
    def total(self) -> Resources:
        return self.resources.scale(self.replicas)


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    tenant: str
    spec: WorkloadSpec
    status: WorkloadStatus = WorkloadStatus.PENDING
    submitted_s: float = 0.0  # seconds on the caller's clock (epoch s live, sim s in the twin)
    # Planner attempts that left it (partly) unplaced, and when the last one was: the input
    # of the planner's retry/backoff decision (planner.Retry).
    attempts: int = 0
    last_attempt_s: float | None = None


class NodeLeaving(enum.StrEnum):
    """Why a node is about to go: its replicas must be re-placed before it disappears."""

    NO = ""
    CORDONED = "cordoned"  # spec.unschedulable (kubectl cordon / drain)
    NOT_READY = "not-ready"  # Ready condition False or Unknown
    TERMINATING = "terminating"  # a termination taint (spot interruption notice, scale-down)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node of a pool as last observed: driver inventory live, a simulated node in the twin.

    Only what a decision needs. `idle_since_s` is the scale-in timer (Cluster Autoscaler's
    "unneeded since"): when the node was first seen without workload replicas, on the caller's
    clock; None while something runs there. `booting`: ordered/provisioning, not Ready yet.
    """

    name: str
    cpu_allocated: float = 0.0
    memory_allocated_gib: float = 0.0
    gpu_free: int = 0
    # Largest set of free GPUs on this node connected by the pool's interconnect (topology.py).
    largest_free_gpu_set: int = 0
    booting: bool = False
    leaving: NodeLeaving = NodeLeaving.NO
    idle_since_s: float | None = None
    prewarmed: bool = False  # images pulled while the node was idle (prewarm)
    # Ids of the workloads with replicas on this node (empty when the driver does not say):
    # the planner moves them off a leaving node (placement/migrate.py, reason node-loss).
    workloads: tuple[str, ...] = ()
    # Since when the node's utilisation (GPUs on GPU nodes, else max of CPU and memory
    # requested / allocatable) is below Cluster Autoscaler's 0.5 scale-down threshold; None
    # above it or unknown (placement/consolidate.py's `traditional` rule; the twin keeps it).
    underused_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a merged value came from and how old it is (placement/snapshot.py's merge).

    `source` names the sensor: registration | inventory | sync | catalog | telemetry | hub |
    agent | estimate | twin. `age_s` is now minus when it was read; `stale` marks data used
    past its freshness limit (with the configured safety margin applied).
    """

    source: str
    age_s: float = 0.0
    stale: bool = False


@dataclass(frozen=True, slots=True)
class Pool:
    """A node pool of one instance type in one cluster."""

    name: str
    instance_type: str
    node: Resources  # allocatable per node
    nodes: int  # provisioned now
    max_nodes: int
    price_usd_per_hour: float  # per node, at this pool's pricing model
    pricing: PricingModel = PricingModel.ON_DEMAND
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE
    used: Resources = field(default_factory=Resources)  # requested by what runs now
    # Largest set of GPUs free on one node with the pool's interconnect (topology.py).
    largest_free_gpu_set: int = 0
    reclaim_rate_per_hour: float = 0.0  # spot reclaim hazard
    # Seconds from ordering a node to its being Ready, as observed (the median of the pool's
    # recent boots; placement/observed.py); None: not observed yet (the planner then assumes
    # PlannerConfig.node_boot_s). The boot in its node charge (candidates.boot_estimates).
    boot_s: float | None = None
    # Per-node observed state; empty when only aggregates are known (then `nodes`/`used` rule).
    node_states: tuple[NodeState, ...] = ()
    # NoSchedule/NoExecute taints every node of the pool carries, as observed (observed.py
    # rule 7; feasibility.pool_taints adds GKE's GPU taint, which holds before a node exists).
    taints: tuple[str, ...] = ()
    # Replicas the broker placed on this pool (active placements) and how many of them are not
    # running yet (placed, starting or waiting for a node): the policy's queue feature.
    replicas_placed: int = 0
    replicas_starting: int = 0
    # `provisioned` and `free`, computed on first use (a pool is a value, and the planner asks
    # for them per option and per row: ~400 k times an hour of federation-day). Not data.
    _provisioned: Resources | None = field(default=None, init=False, repr=False, compare=False)
    _free: Resources | None = field(default=None, init=False, repr=False, compare=False)
    _figures: tuple[float, ...] | None = field(default=None, init=False, repr=False,
                                               compare=False)
    _empty: tuple[NodeState, ...] | None = field(default=None, init=False, repr=False,
                                                 compare=False)
    _reports_workloads: bool | None = field(default=None, init=False, repr=False,
                                            compare=False)

    @property
    def provisioned(self) -> Resources:
        prov = self._provisioned
        if prov is None:
            prov = self.node.scale(self.nodes)
            object.__setattr__(self, "_provisioned", prov)
        return prov

    @property
    def free(self) -> Resources:
        free = self._free
        if free is None:
            free = self.provisioned - self.used
            object.__setattr__(self, "_free", free)
        return free

    @property
    def can_add_nodes(self) -> int:
        return max(0, self.max_nodes - self.nodes)

    @property
    def figures(self) -> tuple[float, ...]:
        """(node cpu, memory_gib, gpu; free cpu, memory_gib, gpu; can_add_nodes): the row the
        planner reads of every option once per candidate build (candidates.option_table),
        computed once per pool value, as `free` is."""
        out = self._figures
        if out is None:
            n, f = self.node, self.free
            out = (n.cpu, n.memory_gib, float(n.gpu), f.cpu, f.memory_gib, float(f.gpu),
                   float(self.can_add_nodes))
            object.__setattr__(self, "_figures", out)
        return out

    @property
    def empty_nodes(self) -> tuple[NodeState, ...]:
        """The nodes scale-in may remove: ready, not leaving, on their idle timer, with
        nothing requested and every GPU free (placement/decisions.py `scale_in`); computed
        once per pool value, as `free` is (the planner asks every pool every epoch)."""
        out = self._empty
        if out is None:
            gpus = self.node.gpu
            out = tuple(n for n in self.node_states
                        if n.idle_since_s is not None and not n.booting
                        and n.leaving is NodeLeaving.NO and n.cpu_allocated <= 1e-9
                        and n.gpu_free >= gpus)
            object.__setattr__(self, "_empty", out)
        return out

    @property
    def reports_workloads(self) -> bool:
        """Whether any node says which workloads run on it (`NodeState.workloads`): the
        consolidation rules that read them skip a pool without (computed once per value)."""
        out = self._reports_workloads
        if out is None:
            out = any(n.workloads for n in self.node_states)
            object.__setattr__(self, "_reports_workloads", out)
        return out


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    provider: str  # aws | gcp | azure | onprem | edge
    region: str
    pools: tuple[Pool, ...] = ()
    zones: tuple[str, ...] = ()
    lat: float | None = None
    lon: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    quota_vcpu: float | None = None
    quota_gpu: float | None = None
    healthy: bool = True
    quota_stale: bool = False  # quota sync failed repeatedly: treat quota conservatively
    # None: federation-wide (registered by an admin/operator); else only these tenants'
    # workloads may be placed here (a tenant-private cluster, or one lent to named tenants).
    allowed_tenants: frozenset[str] | None = None
    # Source and age of each merged value: keys "pricing", "quota", "observed", "telemetry",
    # "health" (placement/snapshot.py). Empty for hand-built clusters.
    provenance: Mapping[str, Provenance] = field(default_factory=dict)

    @property
    def region_key(self) -> str:
        return f"{self.provider}:{self.region}"

    @property
    def is_edge(self) -> bool:
        return self.provider == "edge"


class SiteHealth(enum.StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class Site:
    """An edge site: a small cluster near users, run by a `skyfed-edge` agent."""

    name: str
    lat: float
    lon: float
    capacity: Resources
    price_usd_per_hour: float = 0.0
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.PCIE
    uplink_gbps: float = 1.0
    health: SiteHealth = SiteHealth.HEALTHY
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UserRegion:
    name: str
    lat: float
    lon: float


class Role(enum.StrEnum):
    """What a bearer token may do. `admin`: everything (tokens, budgets, every tenant's
    rows). `operator`: registers federation-wide clusters and sites. `tenant`: its own
    workloads, and clusters and sites private to it (lent to named tenants at most)."""

    ADMIN = "admin"
    OPERATOR = "operator"
    TENANT = "tenant"


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant and its budget cap. `committed_usd_per_hour` is the run rate of its active
    placements (the snapshot merge sums it), so the cap holds across epochs: an epoch may
    add at most `budget_left_usd_per_hour`."""

    name: str
    budget_usd_per_hour: float | None = None
    committed_usd_per_hour: float = 0.0

    @property
    def budget_left_usd_per_hour(self) -> float | None:
        if self.budget_usd_per_hour is None:
            return None
        return max(0.0, self.budget_usd_per_hour - self.committed_usd_per_hour)


@dataclass(frozen=True, slots=True)
class Assignment:
    cluster: str
    pool: str
    pricing: PricingModel
    replicas: int
    price_usd_per_hour: float  # for these replicas together
    new_nodes: int = 0  # nodes the pool must add for them


@dataclass(frozen=True, slots=True)
class Placement:
    workload_id: str
    assignments: tuple[Assignment, ...]
    cost_usd_per_hour: float
    rtt_ms: float | None = None
    decision: Mapping[str, object] = field(default_factory=dict)  # explain.py's record

    @property
    def placed_replicas(self) -> int:
        return sum(a.replicas for a in self.assignments)


def replicas_short(workload: Workload, placement: Placement | None) -> int:
    """Replicas `workload` asks for that `placement` does not hold: what of a partly placed
    workload stays pending (the twin's `WorkloadState.pending`). 0 when it holds them all,
    or more (replicas the planner added for a latency SLO count as placed)."""
    held = placement.placed_replicas if placement is not None else 0
    return max(0, workload.spec.replicas - held)


# The objective's price of a user's millisecond, USD per ms of RTT per replica over the
# service horizon (an hour): the operator's (`placement.latency_weight_usd_per_ms`), not a
# policy action. 1e-4: 100 ms of RTT cost 0.01 USD, a quarter to a half of a 1-vCPU
# replica-hour (0.02-0.04 USD), so among the options a latency SLO admits (the SLO bounds
# latency, feasibility.py) the nearer wins unless it is clearly dearer. 1e-3, the default
# until 2026-12-07, made it 2-5x the replica's price: lp placed by RTT first and paid 4-5 %
# more than greedy on held-out services drafts, with more SLO violations than at 1e-4
# (docs/twin.md, "The latency weight").
LATENCY_WEIGHT_USD_PER_MS = 1e-4


@dataclass(frozen=True, slots=True)
class PolicyAction:
    """What the RL policy may steer; the LP keeps every hard constraint.

    `cluster_bias_usd_per_hour` is added to the per-replica objective of every
    option in that cluster (negative = preferred; the affinity weight). `headroom`
    scales usable pool capacity (0 < headroom <= 1; the allocation ratio).
    `prewarm_lead_s` is how far ahead of forecast demand nodes are ordered.
    Per cluster, applied to each of its pools (missing cluster: the fixed rule):
    `idle_timeout_s` replaces the default timer (DecisionConfig: forecast_idle_s for the
    policies with a forecast, else scale_in_idle_s; how long a node stays
    empty before it is removed); `warm_nodes` is how many empty ready nodes a pool
    keeps instead of scaling them in (its warm pool); `spot_bias_usd_per_hour` is
    added to the per-replica objective of the cluster's spot options only (positive =
    less spot: it steers the spot share). When to consolidate: `consolidate_below` is
    the utilisation under which `lp`'s consolidation rule may drain a node with restartable
    work (missing: consolidate.CA_UTILIZATION_THRESHOLD, 0.5; 0 = never). How much to
    reserve: `reserve_nodes` is how many whole free nodes each multi-GPU pool keeps for
    whole-node jobs beyond those queued (missing: 0, only the queued ones). The defaults
    are the fixed weights (`lp`).
    Per pool (cluster -> pool name -> value), each overriding the cluster's value for that
    pool: `pool_idle_timeout_s`, `pool_warm_nodes` and `pool_spot_bias_usd_per_hour` (its
    options, if it is a spot pool); `for_pool` reads the one that applies.
    """

    cluster_bias_usd_per_hour: Mapping[str, float] = field(default_factory=dict)
    headroom: float = 0.9
    prewarm_lead_s: float = 120.0
    latency_weight_usd_per_ms: float = LATENCY_WEIGHT_USD_PER_MS
    idle_timeout_s: Mapping[str, float] = field(default_factory=dict)
    warm_nodes: Mapping[str, int] = field(default_factory=dict)
    spot_bias_usd_per_hour: Mapping[str, float] = field(default_factory=dict)
    consolidate_below: Mapping[str, float] = field(default_factory=dict)
    reserve_nodes: Mapping[str, int] = field(default_factory=dict)
    pool_idle_timeout_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    pool_warm_nodes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    pool_spot_bias_usd_per_hour: Mapping[str, Mapping[str, float]] = field(
        default_factory=dict)

    def for_pool(self, name: str, cluster: str, pool: str, default: float) -> float:
        """Field `name`'s value for one pool: `pool_<name>[cluster][pool]`, else
        `<name>[cluster]`, else `default` (name: idle_timeout_s, warm_nodes or
        spot_bias_usd_per_hour)."""
        per_pool: Mapping[str, Mapping[str, float]] = getattr(self, f"pool_{name}")
        got = per_pool.get(cluster, {}).get(pool)
        if got is not None:
            return float(got)
        per_cluster: Mapping[str, float] = getattr(self, name)
        return float(per_cluster.get(cluster, default))


_NO_DEMAND = (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class FederationSnapshot:
    """Everything the planner may look at in one epoch, read at one instant."""

    now_s: float
    clusters: tuple[Cluster, ...]
    pending: tuple[Workload, ...]
    running: tuple[Placement, ...] = ()
    user_regions: tuple[UserRegion, ...] = ()
    # Measured RTTs that override the catalog's: (a, b) -> ms, keys are cluster
    # names, `provider:region` keys or user-region names.
    rtt_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    tenants: tuple[Tenant, ...] = ()
    # Egress price of moving data from `a` to `b`, USD per GB: (a, b) -> price,
    # keys are `provider:region` (or cluster names). Missing pairs fall back to
    # the documented constants in broker/placement/candidates.py.
    egress_usd_per_gb: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # Throughput between two clusters (cluster names, both orders), Gbit/s: the policy
    # observation's edge feature (placement/observe.py). Missing pairs use its fallback.
    bandwidth_gbps: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # The specs of the `running` workloads (by id): what a migration rule needs to re-place
    # them (placement/migrate.py). Running workloads without one are never moved.
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    # Clusters each running workload was failed over from (its preferred home): a healthy
    # one is where the planner moves it back (Migration reason "recovered").
    displaced: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # When capacity last grew (work released, nodes joined, a fault ended), on the caller's
    # clock; None: unknown. A backing-off workload is due early after it (decisions.due).
    capacity_changed_s: float | None = None
    # Recent demand placed on each pool, (cluster, pool) -> (vCPU/s, GPU/s) EWMA rates as of
    # `now_s`: the prewarm forecast's and the policy's input; a pool not named has none.
    # Kept beside the pools, not in them: the rates decay every epoch, so a pool that holds
    # them would be a new value every epoch (the twin reuses unchanged pools, snapshot.py).
    demand: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # Recent capacity given back on each pool by workloads that ended (finished, failed or
    # cancelled), (cluster, pool) -> (vCPU/s, GPU/s) EWMA rates as of `now_s`, with the
    # demand's time constant: what the prewarm forecast subtracts from `demand`
    # (placement/decisions.py, "net forecast"). The policy's features read `demand` alone.
    freed: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def demand_of(self, cluster: str, pool: str) -> tuple[float, float]:
        """(vCPU/s, GPU/s) demand rate of one pool (0, 0 when none was recorded)."""
        return self.demand.get((cluster, pool), _NO_DEMAND)

    def freed_of(self, cluster: str, pool: str) -> tuple[float, float]:
        """(vCPU/s, GPU/s) release rate of one pool (0, 0 when none was recorded)."""
        return self.freed.get((cluster, pool), _NO_DEMAND)
