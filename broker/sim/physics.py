"""The twin's physical models: transfer times, multi-GPU speedup, service traffic. Pure.

Queueing (`queue_wait_ms`) and the placement-dependent training speedup (`job_speedup`) live
in `broker/placement/queueing.py` and `broker/placement/training.py` (below both shells: the
planner prices with them too); this module keeps the constants the engine uses directly.

Every constant has its source here and in docs/twin.md. Why one module: these are the
assumptions a reader must be able to check (and change) in one place; the engine only
calls them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from broker.domain import Interconnect
from broker.placement.training import GRADIENT_GB, OVERLAP, STEP_COMPUTE_S

# Cluster Autoscaler's default scan interval (--scan-interval=10s, kubernetes/autoscaler FAQ):
# the reactive `traditional` autoscaler notices unschedulable pods this late.
CA_SCAN_INTERVAL_S = 10.0
# Karpenter v1 batches pending pods before it launches: BATCH_IDLE_DURATION defaults to 1 s
# (BATCH_MAX_DURATION 10 s caps a busy batch); Karpenter watches pods, it does not scan.
KARPENTER_BATCH_IDLE_S = 1.0
# Pod start once the node is up and the image is present (sandbox + container create):
# Kubernetes' scalability SLO bounds it at p99 <= 5 s for pre-pulled images; 2 s is typical.
POD_START_S = 2.0
# Cluster Autoscaler's default --scale-down-unneeded-time=10m: an idle node is removed after it.
SCALE_IN_IDLE_S = 600.0
# When the catalog cannot say (unknown pair): Skyplane's measured single-VM inter-region
# throughput has a median of a few Gbps; providers/catalog.py already falls back to that
# median, so this is only used when no catalog is present at all.
THROUGHPUT_FALLBACK_GBPS = 2.0
# Replica-to-replica traffic of a multi-replica service (east-west RPC, cache sync):
# an assumption (no public per-service trace gives it); 0.5 GB per replica-hour.
SERVICE_PEER_GB_PER_REPLICA_HOUR = 0.5
# User request/response traffic of a service, per replica-hour of the load it asked for
# (desired replicas): an assumption of the same kind, 1 GB per replica-hour.
SERVICE_USER_GB_PER_REPLICA_HOUR = 1.0

# The class-level speedup below (`speedup`: ring all-reduce at a bus bandwidth per
# interconnect class) uses placement/training.py's step constants (GRADIENT_GB,
# STEP_COMPUTE_S, OVERLAP); the twin's run times use training.job_speedup.
# Effective all-reduce bus bandwidth per GPU (GB/s): NVSwitch A100 (NVIDIA: 600 GB/s
# bidirectional per GPU; nccl-tests busbw ~230 GB/s), hybrid cube-mesh V100 NVLink pairs
# (nccl-tests ~130 GB/s on DGX-1), PCIe Gen3/4 x16 through the host (~10 GB/s busbw), and
# across nodes over the data-centre network (25-100 Gbps ENA/EFA: ~5 GB/s).
BUS_GBPS_BY_INTERCONNECT = {
    Interconnect.NVLINK_FULL: 230.0,
    Interconnect.NVLINK_PAIRS: 130.0,
    Interconnect.PCIE: 10.0,
    Interconnect.NONE: 5.0,  # GPUs on different nodes: the network
}


@functools.lru_cache(maxsize=256)
def _topology_speedup(k: int, interconnect: Interconnect) -> float:
    """topology.py's model (one model for the live planner and the twin), cached: it is pure."""
    from broker.placement import topology

    return float(topology.speedup(k, interconnect))


def speedup(k: int, interconnect: Interconnect, *, cross_node: bool = False) -> float:
    """Effective data-parallel speedup of a k-GPU job over one GPU.

    Inside one node: broker/placement/topology.py's `speedup` (ring all-reduce over the node's
    links). Across nodes: the same ring formula at the network's bus bandwidth (constants above).
    """
    if k <= 1:
        return float(max(k, 0))
    if not cross_node:
        return _topology_speedup(k, interconnect)
    bus = BUS_GBPS_BY_INTERCONNECT[Interconnect.NONE]
    t_comm = 2.0 * (k - 1) / k * GRADIENT_GB / bus
    return k * STEP_COMPUTE_S / (STEP_COMPUTE_S + max(0.0, t_comm - OVERLAP * STEP_COMPUTE_S))


def transfer_s(size_gb: float, gbps: float) -> float:
    """Seconds to move `size_gb` gigabytes at `gbps` gigabits per second."""
    if size_gb <= 0:
        return 0.0
    return size_gb * 8.0 / max(gbps, 1e-6)


def cross_pair_fraction(counts: Iterable[float]) -> float:
    """Fraction of ordered replica pairs in different domains: 1 - sum c(c-1) / n(n-1)."""
    cs = [c for c in counts if c > 0]
    n = sum(cs)
    if n <= 1:
        return 0.0
    return 1.0 - sum(c * (c - 1) for c in cs) / (n * (n - 1))


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(s)))
    return s[min(rank, len(s)) - 1]
