"""Small federations for the placement tests (plain values, no I/O)."""

from __future__ import annotations

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Interconnect,
    Pool,
    PricingModel,
    Resources,
    Tenant,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)

CPU_NODE = Resources(cpu=8, memory_gib=32)
GPU_NODE = Resources(cpu=96, memory_gib=1152, gpu=8)


def pool(name: str, *, price: float, nodes: int = 2, max_nodes: int = 4,
         node: Resources = CPU_NODE, pricing: PricingModel = PricingModel.ON_DEMAND,
         gpu_model: str | None = None, interconnect: Interconnect = Interconnect.NONE,
         used: Resources | None = None) -> Pool:
    return Pool(name=name, instance_type=name, node=node, nodes=nodes, max_nodes=max_nodes,
                price_usd_per_hour=price, pricing=pricing, gpu_model=gpu_model,
                interconnect=interconnect, used=used or Resources())


def federation() -> tuple[Cluster, ...]:
    """Three clouds and one edge site with CPU and GPU pools."""
    return (
        Cluster(name="aws-use1", provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                pools=(pool("m5", price=0.384),
                       pool("m5-spot", price=0.15, pricing=PricingModel.SPOT),
                       pool("p4d", price=32.77, nodes=1, max_nodes=2, node=GPU_NODE,
                            gpu_model="A100", interconnect=Interconnect.NVLINK_FULL)),
                quota_vcpu=400),
        Cluster(name="gcp-euw4", provider="gcp", region="europe-west4", lat=53.4, lon=6.8,
                pools=(pool("n2", price=0.31),
                       pool("a2", price=29.4, nodes=0, max_nodes=2, node=GPU_NODE,
                            gpu_model="A100", interconnect=Interconnect.NVLINK_FULL))),
        Cluster(name="azure-eus", provider="azure", region="eastus", lat=37.4, lon=-79.4,
                pools=(pool("d8", price=0.40),
                       pool("nc", price=12.0, nodes=1, max_nodes=2,
                            node=Resources(cpu=24, memory_gib=448, gpu=4), gpu_model="V100",
                            interconnect=Interconnect.PCIE)),
                taints=("dedicated=batch:NoSchedule",)),
        Cluster(name="edge-nyc", provider="edge", region="nyc", lat=40.7, lon=-74.0,
                pools=(pool("edge", price=0.9, nodes=1, max_nodes=1,
                            node=Resources(cpu=16, memory_gib=64, gpu=1),
                            pricing=PricingModel.EDGE, gpu_model="T4"),)),
    )


def workload(wid: str, *, kind: WorkloadKind = WorkloadKind.SERVICE, replicas: int = 1,
             cpu: float = 1.0, mem: float = 2.0, gpu: int = 0, **spec: object) -> Workload:
    ws = WorkloadSpec(name=wid, kind=kind, image="img", replicas=replicas,
                      resources=Resources(cpu=cpu, memory_gib=mem, gpu=gpu),
                      **spec)  # type: ignore[arg-type]
    return Workload(id=wid, tenant=str(spec.get("labels", {}).get("tenant", "t1"))
                    if isinstance(spec.get("labels"), dict) else "t1", spec=ws)


def snapshot(pending: tuple[Workload, ...], clusters: tuple[Cluster, ...] | None = None,
             **kw: object) -> FederationSnapshot:
    return FederationSnapshot(
        now_s=0.0, clusters=clusters if clusters is not None else federation(),
        pending=pending,
        user_regions=(UserRegion("nyc", 40.7, -74.0), UserRegion("amsterdam", 52.4, 4.9)),
        tenants=(Tenant("t1"),), **kw)  # type: ignore[arg-type]
