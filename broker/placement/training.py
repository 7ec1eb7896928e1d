"""How fast a data-parallel training job runs where it was placed. Pure.

One model for both shells: the twin's run times (sim/engine.py) come from it, and it lives
here, below the planner, which may not import broker.sim, so the planner can price what the
twin bills (as placement/queueing.py does for service latency). The planner does not yet:
its costs take every GPU pool to run a job in the job's predicted time (docs/twin.md).

Why: a job's run time must depend on its placement, or the twin cannot tell a policy that
packs an 8-GPU job onto one NVSwitch node from one that splits it over two PCIe nodes over
TCP. The model is one ring all-reduce per step (Patarasuk & Yuan 2009; NCCL's ring):

    T_ar = 2 (k-1)/k x S / B + 2 (k-1) x a          (bandwidth term + per-step latency term)
    T_k  = T_c + max(0, T_ar - phi x T_c)            (phi of compute hides communication)
    speedup = k x T_c / T_k                          (data parallel, fixed per-GPU batch)

with S = `GRADIENT_GB`, T_c = `STEP_COMPUTE_S`, phi = `OVERLAP`, and the
ring's bottleneck B (GB/s per direction) and hop latency a taken from where the GPUs are:

- all GPUs on one node: the best ring through the node's GPUs in its reference topology
  (`placement/topology.py`: NVSwitch, NVLink pairs / cube-mesh, PCIe and the socket link);
- GPUs on several nodes: B = min over nodes of (the ring inside the node's share, the node's
  network path). The path is GPUDirect RDMA when the instance has it (`RDMA_GBPS`, at
  `RDMA_EFFICIENCY` of line rate) and every node of the job is in one zone of one cluster
  (EFA/InfiniBand fabrics do not cross zones); a GPU whose NUMA node has no NIC
  (`topology.Allocation.nic_local` < 1) crosses the socket link first, so B is capped by
  `topology.CROSS_SOCKET_GBYTES`. Otherwise NCCL's socket transport over TCP at
  `TCP_EFFICIENCY` of the node's NIC (`NIC_GBPS`, else the scenario's `network_gbps`), and
  across clusters also at most the clusters' measured throughput;
- hop latency a: `HOP_LATENCY_S` by path (RDMA, same-zone TCP, cross-zone) or half the
  clusters' RTT.

A job's actual run time is the trace's run time x s_ref / s / g, where s_ref =
`reference_speedup(k)` is the speedup on the reference hardware (NVSwitch nodes of 8 A100
joined by 400 Gbps RDMA) and g = `gpu_throughput` of the slowest GPU model the job runs on
(synchronous data parallelism waits for the slowest worker), relative to the A100: the
trace's run time is taken to be the job's run time on that reference hardware (an
assumption: no public trace records the hardware and placement its run times came from). A
1-GPU job has s = s_ref = 1 and pays g alone.

g is the ratio of peak dense FP16/BF16 tensor throughput in the vendors' datasheets
(`GPU_TFLOPS`; no tensor cores: the FP16, else FP32, peak). Peak ratios overstate the gap
for memory-bound models, and the step's compute time is not shortened on a faster GPU (so
its all-reduce is not exposed more): stated in docs/twin.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from broker.domain import Interconnect
from broker.placement import topology

# Data-parallel training step (module docstring): GRADIENT_GB, fp16 gradients of a
# ~1.3B-parameter model (2.6 GB); STEP_COMPUTE_S, per-GPU compute time of one step (0.5 s);
# OVERLAP, the fraction of the step's compute that hides communication (PyTorch DDP
# bucketing typically hides roughly half). Assumptions, stated in docs/twin.md.
GRADIENT_GB = 2.6
STEP_COMPUTE_S = 0.5
OVERLAP = 0.5
# GPUDirect RDMA line rate per node, Gbit/s (vendors' instance pages): p4d.24xlarge 4 x 100
# Gbps EFA; p5.48xlarge 32 x 100 Gbps EFA; Azure ND A100 v4 8 x 200 Gbps HDR InfiniBand.
RDMA_GBPS = {"p4d.": 400.0, "p4de.": 400.0, "p5.": 3200.0, "standard_nd96asr_v4": 1600.0,
             "standard_nd96amsr_a100_v4": 1600.0}
# Node NIC, Gbit/s, for NCCL over TCP (vendors' instance pages); others use network_gbps.
NIC_GBPS = {"a2-highgpu-8g": 100.0, "g5.48xlarge": 100.0, "g4dn.12xlarge": 50.0,
            "g2-standard-96": 100.0, "g2-standard-48": 50.0, "p3.16xlarge": 25.0,
            "standard_nc64as_t4_v3": 32.0}
# nccl-tests all-reduce bus bandwidth reaches ~85-90 % of the line rate over InfiniBand/EFA;
# NCCL's socket transport over TCP typically half (assumptions stated in docs/twin.md).
RDMA_EFFICIENCY = 0.85
TCP_EFFICIENCY = 0.5
# Per-step hop latency of the ring, seconds: RDMA ~5 us, TCP in one zone ~50 us,
# across zones of one region ~1 ms (providers quote single-digit ms between AZs).
HOP_LATENCY_S = {"rdma": 5e-6, "tcp": 5e-5, "zone": 1e-3}
REFERENCE_NODE_GPUS = 8
# Peak dense FP16/BF16 tensor TFLOPS per GPU (NVIDIA and AMD datasheets; without tensor
# cores the FP16 peak, else FP32): B200 2,250; MI300X 1,307; H100 SXM / H200 989; L40S 362;
# A100 312; A10 125 (A10G: NVIDIA publishes none, AWS's G5 uses the A10's GA102, taken
# equal); V100 SXM2 125; L4 121; T4 65; MI25 24.6; P100 PCIe 18.7; V520 14.7; P4 5.5 (FP32);
# M60 4.8, K80 4.4, K520 2.4 (FP32, per GPU of the two-GPU boards).
GPU_TFLOPS = {"B200": 2250.0, "MI300X": 1307.0, "H200": 989.0, "H100": 989.0,
              "H100-MEGA": 989.0, "L40S": 362.0, "A100": 312.0, "A100-80GB": 312.0,
              "A10": 125.0, "A10G": 125.0, "V100": 125.0, "V100-32GB": 125.0, "L4": 121.0,
              "T4": 65.0, "T4G": 65.0, "MI25": 24.6, "P100": 18.7, "V520": 14.7, "P4": 5.5,
              "M60": 4.8, "K80": 4.4, "K520": 2.4}
REFERENCE_GPU = "A100"


def gpu_throughput(gpu_model: str | None) -> float:
    """Training throughput of one GPU of `gpu_model` relative to the reference A100
    (`GPU_TFLOPS`); 1.0 for a model the table does not know (or none named)."""
    if not gpu_model:
        return 1.0
    tflops = GPU_TFLOPS.get(gpu_model) or GPU_TFLOPS.get(gpu_model.upper())
    return tflops / GPU_TFLOPS[REFERENCE_GPU] if tflops else 1.0


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The GPUs a job holds on one node, and where that node is."""

    gpus: int
    instance_type: str
    gpu_model: str | None
    interconnect: Interconnect
    cluster: str
    zone: int
    node_gpus: int


def _lookup(table: dict[str, float], instance_type: str) -> float | None:
    it = instance_type.lower()
    for prefix, value in table.items():
        if it.startswith(prefix):
            return value
    return None


@functools.lru_cache(maxsize=1024)
def _inside(gpus: int, instance_type: str, gpu_model: str | None, interconnect: Interconnect,
            node_gpus: int) -> tuple[float, float]:
    """(ring GB/s inside the node for `gpus` GPUs, NIC-local fraction): topology.allocate."""
    topo = topology.for_instance(instance_type, max(node_gpus, gpus), gpu_model, interconnect)
    alloc = topology.allocate(topo, gpus)
    if alloc is None:
        return topology.CROSS_SOCKET_GBYTES, 0.0
    return alloc.ring_gbytes, alloc.nic_local


def _step_speedup(k: int, ring_gbytes: float, hop_s: float) -> float:
    t_ar = topology.allreduce_s(k, GRADIENT_GB, ring_gbytes) + 2.0 * (k - 1) * hop_s
    t_c = STEP_COMPUTE_S
    return k * t_c / (t_c + max(0.0, t_ar - OVERLAP * t_c))


def job_speedup(shares: Sequence[GpuShare], *, tcp_gbps: float,
                cluster_gbps: dict[tuple[str, str], float] | None = None,
                cluster_rtt_ms: dict[tuple[str, str], float] | None = None) -> float:
    """Effective speedup over one GPU of a job holding `shares` (module docstring)."""
    k = sum(s.gpus for s in shares)
    if k <= 1:
        return float(max(k, 0))
    if len(shares) == 1:
        s = shares[0]
        ring, _ = _inside(s.gpus, s.instance_type, s.gpu_model, s.interconnect, s.node_gpus)
        return _step_speedup(k, ring, 0.0)
    clusters = {s.cluster for s in shares}
    zones = {(s.cluster, s.zone) for s in shares}
    rdma = len(zones) == 1 and all(_lookup(RDMA_GBPS, s.instance_type) for s in shares)
    hop = HOP_LATENCY_S["rdma" if rdma else "tcp" if len(zones) == 1 else "zone"]
    bottleneck = math.inf
    for s in shares:
        ring, nic_local = _inside(s.gpus, s.instance_type, s.gpu_model, s.interconnect,
                                  s.node_gpus)
        if rdma:
            net = (_lookup(RDMA_GBPS, s.instance_type) or 0.0) / 8.0 * RDMA_EFFICIENCY
            if nic_local < 1.0:
                net = min(net, topology.CROSS_SOCKET_GBYTES)
        else:
            net = (_lookup(NIC_GBPS, s.instance_type) or tcp_gbps) / 8.0 * TCP_EFFICIENCY
        bottleneck = min(bottleneck, ring, net)
    if len(clusters) > 1:
        names = sorted(clusters)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                gbps = (cluster_gbps or {}).get((a, b)) or (cluster_gbps or {}).get((b, a))
                if gbps:
                    bottleneck = min(bottleneck, gbps / 8.0 * TCP_EFFICIENCY)
                rtt = (cluster_rtt_ms or {}).get((a, b)) or (cluster_rtt_ms or {}).get((b, a))
                if rtt:
                    hop = max(hop, rtt / 2000.0)
    return _step_speedup(k, bottleneck, hop)


@functools.lru_cache(maxsize=64)
def reference_speedup(k: int) -> float:
    """Speedup of k GPUs on the reference hardware: NVSwitch A100 nodes of 8, 400 Gbps RDMA."""
    if k <= 1:
        return float(max(k, 0))
    shares = []
    left = k
    while left > 0:
        take = min(left, REFERENCE_NODE_GPUS)
        shares.append(GpuShare(take, "p4d.24xlarge", "A100", Interconnect.NVLINK_FULL, "ref",
                               0, REFERENCE_NODE_GPUS))
        left -= take
    return job_speedup(shares, tcp_gbps=100.0)
