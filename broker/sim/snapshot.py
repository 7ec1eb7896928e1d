"""The FederationSnapshot the planner sees, built from the twin's simulated state. Pure.

The same value type the live loop builds from SQL: pools in aggregate (nodes include booting
ones, `used` is what is reserved), health, quotas, the pending batch, user regions and the
twin's user<->cluster RTT table (so planner and metrics judge SLOs on identical numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker.domain import (
    Cluster,
    DataSource,
    FederationSnapshot,
    Pool,
    PricingModel,
    Resources,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.sim.state import SimCluster, WorkloadState


def pending_workload(ws: WorkloadState) -> Workload:
    """A workload asking for its still-pending replicas (same id: placements refer to it).

    Its run time is the predictor's estimate at submission (realize.py), never the trace's.
    """
    ev = ws.ev
    data = (DataSource(size_gb=ev.data_gb, location=ev.data_region),) if (
        ev.data_gb > 0 and ev.data_region) else ()
    spec = WorkloadSpec(
        name=ev.id, kind=WorkloadKind(ev.kind), image=f"sim/{ev.id}", replicas=ws.pending,
        resources=Resources(ev.cpu, ev.memory_gib, ev.gpu), gpu_model=ev.gpu_model,
        user_region=ev.user_region, latency_slo_ms=ev.latency_slo_ms, data=data,
        image_gb=ev.image_gb, duration_s=ev.predicted_duration_s, priority=ev.priority)
    return Workload(id=ev.id, tenant=ev.tenant, spec=spec, submitted_s=ev.submit_s)


def build_snapshot(now: float, clusters: Iterable[SimCluster], batch: Iterable[WorkloadState],
                   user_regions: tuple[UserRegion, ...],
                   rtt_ms: Mapping[tuple[str, str], float]) -> FederationSnapshot:
    hours = max(now / 3600.0, 1.0)
    out = []
    for c in clusters:
        pools = tuple(
            Pool(name=p.name, instance_type=p.spec.instance_type, node=p.node,
                 nodes=p.nodes, max_nodes=p.spec.max_nodes,
                 price_usd_per_hour=p.price_usd_per_hour,
                 pricing=(PricingModel.EDGE if c.spec.fixed else
                          PricingModel.SPOT if p.spec.spot else PricingModel.ON_DEMAND),
                 gpu_model=p.spec.gpu_model, interconnect=p.spec.interconnect,
                 used=Resources(p.used_cpu, p.used_mem, p.used_gpu),
                 largest_free_gpu_set=p.largest_free_gpu_set(),
                 reclaim_rate_per_hour=p.reclaims / hours)
            for p in c.pools)
        out.append(Cluster(
            name=c.name, provider=c.spec.provider, region=c.spec.region, pools=pools,
            zones=c.spec.zones, lat=c.spec.lat, lon=c.spec.lon, quota_vcpu=c.quota_vcpu,
            healthy=c.healthy(now)))
    return FederationSnapshot(now_s=now, clusters=tuple(out),
                              pending=tuple(pending_workload(ws) for ws in batch),
                              user_regions=user_regions, rtt_ms=rtt_ms)
