"""GPUs inside one node: topologies, NVLink-aware allocation, predicted scaling. Pure.

Bandwidths are per direction, in GB/s (`GpuLink.gbps` holds Gbit/s = GB/s x 8):

- NVLink 3 (A100): 12 links x 25 GB/s = 300 GB/s per direction (600 GB/s
  bidirectional, NVIDIA A100 datasheet); behind NVSwitch every pair gets it
  (p4d.24xlarge, DGX A100).
- NVLink 4 (H100 SXM): 18 links, 450 GB/s per direction (900 GB/s
  bidirectional, NVIDIA H100 datasheet); NVSwitch (p5.48xlarge, DGX H100).
- NVLink 2 (V100 SXM2): 6 links x 25 GB/s per direction (300 GB/s
  bidirectional total, NVIDIA V100 datasheet). In the hybrid cube-mesh of
  DGX-1 / p3.16xlarge a pair has 0, 1 ("NV1", 25 GB/s) or 2 links ("NV2",
  50 GB/s); the matrix below is `nvidia-smi topo -m` of a p3.16xlarge.
- PCIe gen3 x16: 15.75 GB/s per direction (~16); gen4 x16 ~32 GB/s (PCI-SIG).
- Across CPU sockets (UPI/QPI, "SYS" in nvidia-smi) peer traffic is slower
  than one PCIe link; we assume 10 GB/s (an assumption, not a datasheet value).

A ring all-reduce of S bytes over k GPUs moves 2(k-1)/k x S bytes through
each GPU's slowest ring link B (Patarasuk & Yuan 2009; NCCL's ring):
T_ar = 2(k-1)/k x S / B. With per-step compute time T_c of which a fraction
phi can overlap communication (backward pass), the step time is
T_k = T_c + max(0, T_ar - phi x T_c) and the speedup over one GPU is
k x T_c / T_k (data parallel, fixed per-GPU batch). docs/placement.md has the
worked numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from providers.base import GpuLink, Interconnect, NodeTopology

GBIT_PER_GBYTE = 8.0
NVLINK3_GBYTES = 300.0
NVLINK4_GBYTES = 450.0
NVLINK2_LINK_GBYTES = 25.0
PCIE3_GBYTES = 15.75
PCIE4_GBYTES = 32.0
CROSS_SOCKET_GBYTES = 10.0  # assumption, see module docstring
_MAX_SUBSETS = 5000

# p3.16xlarge / DGX-1V `nvidia-smi topo -m`: NVLink count per pair (0 = via PCIe/SYS).
CUBE_MESH_V100 = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


def _link(a: int, b: int, gbytes: float, kind: str) -> GpuLink:
    return GpuLink(a=a, b=b, gbps=gbytes * GBIT_PER_GBYTE, kind=kind)


def _numa(n: int, sockets: int = 2) -> tuple[int, ...]:
    per = max(1, math.ceil(n / sockets))
    return tuple(i // per for i in range(n))


def nvswitch(n: int = 8, *, gpu_model: str = "A100") -> NodeTopology:
    """Full mesh through NVSwitch: every pair at the GPU's full NVLink bandwidth."""
    bw = NVLINK4_GBYTES if gpu_model.upper().startswith(("H100", "H200", "B200")) \
        else NVLINK3_GBYTES
    links = tuple(_link(a, b, bw, "nvlink") for a, b in itertools.combinations(range(n), 2))
    return NodeTopology(gpu_count=n, gpu_model=gpu_model, interconnect=Interconnect.NVLINK_FULL,
                        links=links, gpu_numa=_numa(n), nic_numa=(0, 0, 1, 1))


def cube_mesh_v100() -> NodeTopology:
    """Hybrid cube-mesh of DGX-1V / p3.16xlarge (8 x V100 SXM2)."""
    numa = _numa(8)
    links = []
    for a, b in itertools.combinations(range(8), 2):
        n = CUBE_MESH_V100[a][b]
        if n:
            links.append(_link(a, b, n * NVLINK2_LINK_GBYTES, "nvlink"))
        else:
            bw = PCIE3_GBYTES if numa[a] == numa[b] else CROSS_SOCKET_GBYTES
            links.append(_link(a, b, bw, "pcie" if numa[a] == numa[b] else "smp"))
    return NodeTopology(gpu_count=8, gpu_model="V100", interconnect=Interconnect.NVLINK_PAIRS,
                        links=tuple(links), gpu_numa=numa, nic_numa=(0, 1))


def nvlink_pairs(n: int, *, gpu_model: str | None = None, pcie_gbytes: float = PCIE3_GBYTES,
                 bridge_gbytes: float = 2 * NVLINK2_LINK_GBYTES) -> NodeTopology:
    """NVLink bridges between GPU pairs (0-1, 2-3, ...), PCIe between pairs."""
    numa = _numa(n)
    links = []
    for a, b in itertools.combinations(range(n), 2):
        if a // 2 == b // 2:
            links.append(_link(a, b, bridge_gbytes, "nvlink"))
        else:
            bw = pcie_gbytes if numa[a] == numa[b] else CROSS_SOCKET_GBYTES
            links.append(_link(a, b, bw, "pcie" if numa[a] == numa[b] else "smp"))
    return NodeTopology(gpu_count=n, gpu_model=gpu_model,
                        interconnect=Interconnect.NVLINK_PAIRS, links=tuple(links),
                        gpu_numa=numa, nic_numa=tuple(range(max(numa) + 1)) if n else ())


def pcie_only(n: int, *, gpu_model: str | None = None,
              pcie_gbytes: float = PCIE3_GBYTES) -> NodeTopology:
    """GPUs on PCIe switches, one switch per socket; peer traffic crosses UPI between them."""
    numa = _numa(n)
    links = tuple(
        _link(a, b, pcie_gbytes if numa[a] == numa[b] else CROSS_SOCKET_GBYTES,
              "pcie" if numa[a] == numa[b] else "smp")
        for a, b in itertools.combinations(range(n), 2))
    return NodeTopology(gpu_count=n, gpu_model=gpu_model, interconnect=Interconnect.PCIE,
                        links=links, gpu_numa=numa, nic_numa=(0,) if n else ())


def for_instance(instance_type: str, gpu_count: int, gpu_model: str | None,
                 interconnect: Interconnect) -> NodeTopology:
    """The reference topology of an instance type (vendors' instance pages)."""
    it = instance_type.lower()
    model = gpu_model or ""
    if gpu_count <= 0:
        return NodeTopology()
    if interconnect is Interconnect.NVLINK_FULL:
        return nvswitch(gpu_count, gpu_model=model or "A100")
    if interconnect is Interconnect.NVLINK_PAIRS:
        if gpu_count == 8 and (it.startswith(("p3.16", "p3dn")) or model.upper() == "V100"):
            return cube_mesh_v100()
        return nvlink_pairs(gpu_count, gpu_model=gpu_model)
    gen4 = model.upper() in {"A10", "A10G", "L4", "L40S", "A100", "H100"}
    return pcie_only(gpu_count, gpu_model=gpu_model,
                     pcie_gbytes=PCIE4_GBYTES if gen4 else PCIE3_GBYTES)


def reference(interconnect: Interconnect, gpu_count: int = 8,
              gpu_model: str | None = None) -> NodeTopology:
    """A representative node for an interconnect class (when only the class is known)."""
    if interconnect is Interconnect.NVLINK_FULL:
        return nvswitch(gpu_count, gpu_model=gpu_model or "A100")
    if interconnect is Interconnect.NVLINK_PAIRS:
        return cube_mesh_v100() if gpu_count == 8 else nvlink_pairs(gpu_count)
    return pcie_only(max(gpu_count, 1), gpu_model=gpu_model)


def _bandwidth_matrix(topo: NodeTopology) -> list[list[float]]:
    n = topo.gpu_count
    m = [[0.0] * n for _ in range(n)]
    for link in topo.links:
        if link.a < n and link.b < n:
            bw = link.gbps / GBIT_PER_GBYTE
            m[link.a][link.b] = max(m[link.a][link.b], bw)
            m[link.b][link.a] = max(m[link.b][link.a], bw)
    return m


def ring_bandwidth_gbytes(topo: NodeTopology, gpus: Sequence[int]) -> float:
    """Bottleneck link (GB/s per direction) of the best ring through `gpus`; inf for one GPU."""
    if len(gpus) <= 1:
        return math.inf
    m = _bandwidth_matrix(topo)
    first, rest = gpus[0], list(gpus[1:])
    best = 0.0
    # (k-1)!/2 rings; k <= 8 in practice (2520 rings).
    for perm in itertools.permutations(rest):
        if len(perm) > 1 and perm[0] > perm[-1]:
            continue  # each ring once (skip its mirror image)
        ring = (first, *perm)
        bw = min(m[ring[i]][ring[(i + 1) % len(ring)]] for i in range(len(ring)))
        best = max(best, bw)
    return best


@dataclass(frozen=True, slots=True)
class Allocation:
    gpus: tuple[int, ...]
    ring_gbytes: float  # bottleneck of the best ring, GB/s per direction
    numa_nodes: int  # NUMA nodes the set spans
    nic_local: float  # fraction of chosen GPUs with an RDMA NIC on their NUMA node


def _numa_ok(policy: str, span: int, min_span: int) -> bool:
    if policy == "single-numa-node":
        return span == 1
    if policy == "restricted":
        return span == min_span
    return True  # none | best-effort: any set is admitted


def allocate(topo: NodeTopology, k: int, used: Iterable[int] = ()) -> Allocation | None:
    """Pick k free GPUs maximising ring bandwidth, then NUMA locality, then NIC locality.

    The kubelet topologyManager policy of the node is honoured:
    `single-numa-node` admits only sets inside one NUMA node, `restricted`
    only sets spanning the fewest NUMA nodes that can hold k GPUs. Returns
    None when no admissible set exists. Ties go to the lowest GPU ids so that
    the free rest stays contiguous (less fragmentation).
    """
    taken = set(used)
    free = [g for g in range(topo.gpu_count) if g not in taken]
    if k <= 0 or k > len(free):
        return None
    numa = list(topo.gpu_numa) or [0] * topo.gpu_count
    nic_numa = set(topo.nic_numa)
    per_numa: dict[int, int] = {}
    for g in free:
        per_numa[numa[g]] = per_numa.get(numa[g], 0) + 1
    sizes = sorted(per_numa.values(), reverse=True)
    min_span = next(i + 1 for i in range(len(sizes)) if sum(sizes[:i + 1]) >= k)
    best: tuple[tuple[float, int, float], Allocation] | None = None
    subsets: Iterable[tuple[int, ...]]
    if math.comb(len(free), k) <= _MAX_SUBSETS:
        subsets = itertools.combinations(free, k)
    else:
        subsets = [tuple(free[:k])]
    for subset in subsets:
        span = len({numa[g] for g in subset})
        if not _numa_ok(topo.topology_manager_policy, span, min_span):
            continue
        ring = ring_bandwidth_gbytes(topo, subset)
        nic = sum(1 for g in subset if numa[g] in nic_numa) / k
        key = (ring, -span, nic)
        if best is None or key > best[0]:
            best = (key, Allocation(tuple(subset), ring, span, nic))
    return best[1] if best else None


def nvlink_floor_gbytes(topo: NodeTopology) -> float:
    """Bandwidth of the topology's weakest NVLink link (inf without NVLink): a ring at or
    above it runs on NVLink only, since every topology here has PCIe/SMP links below its
    weakest NVLink (NV1 25 GB/s > PCIe gen3 15.75 GB/s in the cube-mesh)."""
    bws = [link.gbps / GBIT_PER_GBYTE for link in topo.links if link.kind == "nvlink"]
    return min(bws) if bws else math.inf


def disjoint_sets(topo: NodeTopology, k: int, used: Iterable[int] = (), *,
                  nvlink: bool = False) -> tuple[Allocation, ...]:
    """k-GPU sets carved one after another from the free GPUs with `allocate` (each the best
    ring of what is left); with `nvlink`, only sets whose ring runs on NVLink alone.

    How many replicas of a k-GPU job a node can still take: a 2-GPU NVLink job on a
    4-GPU pairs node with GPUs 0 and 3 taken gets nothing (1 and 2 meet across PCIe).
    """
    taken = set(used)
    floor = nvlink_floor_gbytes(topo) if nvlink and k > 1 else 0.0
    out: list[Allocation] = []
    while True:
        alloc = allocate(topo, k, taken)
        if alloc is None or alloc.ring_gbytes < floor - 1e-9:
            return tuple(out)
        out.append(alloc)
        taken.update(alloc.gpus)


def largest_nvlink_set(topo: NodeTopology, used: Iterable[int] = ()) -> int:
    """Size of the largest set of free GPUs connected by NVLink (the pool summary the LP sees)."""
    taken = set(used)
    free = {g for g in range(topo.gpu_count) if g not in taken}
    adj: dict[int, set[int]] = {g: set() for g in free}
    for link in topo.links:
        if link.kind == "nvlink" and link.a in free and link.b in free:
            adj[link.a].add(link.b)
            adj[link.b].add(link.a)
    best, seen = 0, set()
    for g in free:
        if g in seen:
            continue
        stack, size = [g], 0
        seen.add(g)
        while stack:
            cur = stack.pop()
            size += 1
            for nxt in adj[cur] - seen:
                seen.add(nxt)
                stack.append(nxt)
        best = max(best, size if size > 1 or topo.interconnect is not Interconnect.PCIE else 1)
    return best


def fragmentation(topo: NodeTopology, used: Iterable[int] = ()) -> float:
    """Share of free GPUs outside the largest NVLink-connected free set (0 = none stranded)."""
    taken = set(used)
    free = topo.gpu_count - len([g for g in taken if 0 <= g < topo.gpu_count])
    if free <= 0:
        return 0.0
    return 1.0 - largest_nvlink_set(topo, taken) / free


def allreduce_s(k: int, size_gbytes: float, ring_gbytes: float) -> float:
    """Ring all-reduce time: 2(k-1)/k x S / B (bandwidth term only)."""
    if k <= 1 or math.isinf(ring_gbytes):
        return 0.0
    if ring_gbytes <= 0:
        return math.inf
    return 2.0 * (k - 1) / k * size_gbytes / ring_gbytes


def speedup(k: int, link: NodeTopology | Interconnect, *, model_params: float = 1.0e9,
            bytes_per_param: float = 2.0, step_compute_s: float = 0.5,
            overlap: float = 0.5, gpu_model: str | None = None) -> float:
    """Predicted data-parallel speedup of k GPUs over one (module docstring's model).

    `link` is a node topology (the best k-set in it is used) or just an
    interconnect class (a reference 8-GPU node of that class). Defaults: a
    1e9-parameter model with fp16 gradients (2 GB), 0.5 s compute per step,
    half of it overlappable with communication.
    """
    if k <= 1:
        return float(max(k, 0))
    topo = reference(link, max(8, k), gpu_model) if isinstance(link, Interconnect) else link
    alloc = allocate(NodeTopology(gpu_count=topo.gpu_count, gpu_model=topo.gpu_model,
                                  interconnect=topo.interconnect, links=topo.links,
                                  gpu_numa=topo.gpu_numa, nic_numa=topo.nic_numa), k)
    if alloc is None:
        return 0.0
    t_ar = allreduce_s(k, model_params * bytes_per_param / 1e9, alloc.ring_gbytes)
    step = step_compute_s + max(0.0, t_ar - overlap * step_compute_s)
    return k * step_compute_s / step


def efficiency(k: int, link: NodeTopology | Interconnect, **kw: float) -> float:
    """speedup / k (1.0 = perfect scaling)."""
    return speedup(k, link, **kw) / k if k > 0 else 0.0  # type: ignore[arg-type]
