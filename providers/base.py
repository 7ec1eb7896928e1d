"""What the broker consumes from the outside world: protocols and the values they return.

Everything here is a plain value or a `typing.Protocol`; no SDK is imported. The
adapters (`aws.py`, `gcp.py`, `azure.py`, `kubernetes.py`, `edge.py`,
`simulated.py`) implement these protocols and map their SDK's errors into the
tree in `providers/errors.py` exactly once.

Units are in the names: `_usd_per_hour`, `_gib`, `_ms`, `_gbps`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class Interconnect(enum.StrEnum):
    """How the GPUs inside one node talk to each other, weakest first."""

    NONE = "none"  # no GPUs, or "don't care" when used as a requirement
    PCIE = "pcie"
    NVLINK_PAIRS = "nvlink-pairs"  # NVLink bridges between pairs / hybrid cube-mesh (p3.16xlarge)
    NVLINK_FULL = "nvlink-full"  # NVSwitch full mesh (p4d, p5, DGX A100/H100)

    @property
    def rank(self) -> int:
        return _INTERCONNECT_RANK[self]

    def satisfies(self, required: Interconnect) -> bool:
        """True when this interconnect is at least as good as `required`."""
        return self.rank >= required.rank


_INTERCONNECT_RANK = {
    Interconnect.NONE: 0,
    Interconnect.PCIE: 1,
    Interconnect.NVLINK_PAIRS: 2,
    Interconnect.NVLINK_FULL: 3,
}


class PricingModel(enum.StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    EDGE = "edge"  # fixed hardware at an edge/on-prem site, amortised price


@dataclass(frozen=True, slots=True)
class Region:
    provider: str  # aws | gcp | azure | onprem | edge
    name: str  # provider's region id, e.g. us-east-1, europe-west4, eastus
    lat: float | None = None
    lon: float | None = None
    display_name: str = ""

    @property
    def key(self) -> str:
        """`provider:region`, the id used by the RTT and egress matrices."""
        return f"{self.provider}:{self.name}"


@dataclass(frozen=True, slots=True)
class Offer:
    """One instance type in one region at its current prices."""

    provider: str
    region: str
    instance_type: str
    vcpu: float
    memory_gib: float
    gpu_count: int = 0
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE
    price_usd_per_hour: float | None = None
    spot_price_usd_per_hour: float | None = None
    source: str = "catalog"  # catalog | live | estimated

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.region}:{self.instance_type}"


@dataclass(frozen=True, slots=True)
class Quota:
    """A provider limit for one account and region (e.g. vCPUs, GPUs, instances)."""

    provider: str
    region: str
    metric: str  # vcpu | gpu | instances | <provider metric name>
    limit: float
    used: float = 0.0

    @property
    def available(self) -> float:
        return max(0.0, self.limit - self.used)


@dataclass(frozen=True, slots=True)
class GpuLink:
    a: int
    b: int
    gbps: float  # unidirectional bandwidth of the link
    kind: str = "nvlink"  # nvlink | pcie | smp


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """GPUs, NUMA nodes and NICs inside one node; see broker/placement/topology.py."""

    gpu_count: int = 0
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE
    links: tuple[GpuLink, ...] = ()
    gpu_numa: tuple[int, ...] = ()  # NUMA node of each GPU
    nic_numa: tuple[int, ...] = ()  # NUMA node of each RDMA NIC
    topology_manager_policy: str = "none"  # none | best-effort | restricted | single-numa-node


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """One Kubernetes node as the driver sees it."""

    name: str
    pool: str
    allocatable_cpu: float
    allocatable_memory_gib: float
    allocatable_gpu: int = 0
    used_cpu: float = 0.0
    used_memory_gib: float = 0.0
    used_gpu: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    topology: NodeTopology = field(default_factory=NodeTopology)
    ready: bool = True
    unschedulable: bool = False  # cordoned (spec.unschedulable)
    # Replicas of broker-managed workloads running on the node; None when the driver cannot
    # tell (then "empty" means nothing requested at all). The scale-in idle timer's input.
    replicas: int | None = None
    # Ids of the broker-managed workloads with replicas on the node (empty when the driver
    # cannot tell): what the planner moves off a node that is leaving.
    workloads: tuple[str, ...] = ()
    # The cloud's id of the machine (Kubernetes `spec.providerID`, e.g.
    # `aws:///us-east-1a/i-0abc...`, `gce://project/zone/name`); "" when the node has none.
    provider_id: str = ""

    @property
    def instance(self) -> str:
        """What names the node's machine to its cloud account (`CloudProvider.remove_nodes`):
        the last path segment of `provider_id` (the EC2 instance id, the GCE instance name),
        else the node's name (GCE's and self-managed clusters' node names are the machine's).
        This is how the Cluster Autoscaler maps a node to its instance."""
        tail = self.provider_id.rstrip("/").rsplit("/", 1)[-1]
        return tail or self.name


class WorkloadPhase(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class DriverStatus:
    """What a ClusterDriver reports about one applied workload."""

    workload_id: str
    phase: WorkloadPhase
    ready_replicas: int = 0
    desired_replicas: int = 0
    message: str = ""


class Capability(enum.StrEnum):
    LIST_REGIONS = "list_regions"
    LIST_OFFERS = "list_offers"
    LIVE_PRICES = "live_prices"
    SPOT_PRICES = "spot_prices"
    QUOTAS = "quotas"
    SCALE_POOL = "scale_pool"
    WATCH = "watch"
    METRICS = "metrics"
    GPU_TOPOLOGY = "gpu_topology"
    PREWARM = "prewarm"  # a ClusterDriver that pre-pulls images / copies data (PrewarmingDriver)


@dataclass(frozen=True, slots=True)
class ApplySpec:
    """What a driver needs to run one placed workload on its cluster.

    `workload_id` is the idempotency key: applying the same id twice is the
    same as applying it once; a changed spec under the same id is a patch.
    """

    workload_id: str
    tenant: str
    name: str
    kind: str  # service | batch | train
    image: str
    replicas: int
    cpu: float
    memory_gib: float
    gpu: int = 0
    pool: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, str]] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    command: Sequence[str] = ()
    # Replicas per pool of this cluster when the placement splits the workload over several
    # of them (values sum to `replicas`); empty: all of them in `pool`. One apply per
    # cluster carries them all, so a split within one cluster keeps every replica.
    pool_replicas: Mapping[str, int] = field(default_factory=dict)
    # The workload object the user submitted (a Deployment, StatefulSet or Job as JSON), to
    # apply instead of a rendering of the fields above, and the objects that go with it
    # (Services, ConfigMaps, Secrets, PersistentVolumeClaims). Secret data: never log it.
    manifest: Mapping[str, Any] | None = None
    companions: Sequence[Mapping[str, Any]] = ()

    def pools(self) -> dict[str, int]:
        """Pool -> replicas on this cluster."""
        return dict(self.pool_replicas) if self.pool_replicas else {self.pool: self.replicas}


@dataclass(frozen=True, slots=True)
class PrewarmData:
    """One data set to copy near a pool before a workload reads it."""

    url: str
    sha256: str = ""
    size_gb: float = 0.0
    name: str = ""  # file name in the cache; default: the sha256 (or the url's last part)


@dataclass(frozen=True, slots=True)
class PrewarmSpec:
    """Images to pre-pull and data to copy onto one pool's nodes before they are needed.

    `key` is the idempotency key: prewarming the same key twice is the same as once, and
    `prewarm_done(key=)` reports on it. `labels` go on whatever the driver creates.
    """

    key: str
    pool: str
    images: tuple[str, ...] = ()
    data: tuple[PrewarmData, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class CloudProvider(Protocol):
    """A cloud account: what it offers, at what price, within which quota."""

    name: str
    capabilities: frozenset[Capability]

    async def list_regions(self) -> list[Region]: ...

    async def list_offers(self, *, region: str) -> list[Offer]: ...

    async def get_quotas(self, *, region: str) -> list[Quota]: ...

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str], spot: bool = False, order: str = "",
    ) -> int:
        """Grow node group `pool` to at least `nodes` machines; returns its count. It never
        terminates a machine, which may run work: shrinking is `remove_nodes`, by name. The
        group's machines are those of `pool` that carry every one of `labels` (the cluster's
        `skyfed.io/cluster`), so two clusters' groups of one name stay apart. `spot`: new
        machines are bought at the spot price (the pool is priced so: `Pool.pricing`).
        `order`: the order's idempotency key, the same in every retry of one order and
        never reused by another (the actuator's `order` of the decision); a cloud that takes
        one makes each machine's launch request idempotent with it (EC2's ClientToken,
        `providers.cloud.client_token`), so a retried order whose launch timed out after the
        cloud had accepted it, before the machine showed in the group, buys no second
        machine."""
        ...

    async def remove_nodes(self, *, region: str, pool: str, nodes: Sequence[str],
                           labels: Mapping[str, str] | None = None) -> int:
        """Terminate exactly the machines of node group `pool` (with `labels`, as in
        `scale_pool`) that `nodes` names (each an instance id, instance name or host name:
        `NodeInventory.instance`), never another; a name that matches none (already gone)
        is skipped. Returns the group's count."""
        ...


@runtime_checkable
class ClusterDriver(Protocol):
    """A member cluster or edge site that runs workloads."""

    name: str
    capabilities: frozenset[Capability]

    async def apply(self, *, spec: ApplySpec) -> None: ...

    async def delete(self, *, workload_id: str) -> None: ...

    async def status(self, *, workload_id: str) -> DriverStatus: ...

    async def list_status(self) -> list[DriverStatus]: ...

    async def inventory(self) -> list[NodeInventory]: ...


@runtime_checkable
class PoolScalingDriver(Protocol):
    """A ClusterDriver that grows and shrinks its own pools (`Capability.SCALE_POOL`).

    `scale_pool` sets a pool's node count (ordered nodes included: they join the inventory
    once booted) and returns that count; shrinking removes empty nodes only.
    `remove_nodes` removes these nodes (empty ones only) and returns the pool's count.
    """

    async def scale_pool(self, *, pool: str, nodes: int) -> int: ...

    async def remove_nodes(self, *, pool: str, nodes: Sequence[str]) -> int: ...


@runtime_checkable
class PrewarmingDriver(Protocol):
    """A ClusterDriver that pre-pulls images and copies data (`Capability.PREWARM`)."""

    async def prewarm(self, *, spec: PrewarmSpec) -> None: ...

    async def prewarm_done(self, *, key: str) -> bool: ...
