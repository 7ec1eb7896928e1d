"""Response bodies (plain dicts, camelCase like the requests) and the JSON
response class: orjson when installed (it is several times faster on the hot
POST path), the standard library otherwise."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from broker.domain import Cluster, Pool, Site, WorkloadSpec
from broker.store import ClusterRecord, Event, PlacementRecord, SiteRecord, WorkloadRecord

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - orjson is in the broker extra

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), default=str).encode()


class JsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def spec_to_api(s: WorkloadSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": str(s.kind), "image": s.image, "replicas": s.replicas,
        "resources": {"cpu": s.resources.cpu, "memory": f"{s.resources.memory_gib:g}Gi",
                      "gpu": s.resources.gpu, "gpuModel": s.gpu_model,
                      "interconnect": str(s.interconnect)},
        "userRegion": s.user_region, "latencySloMs": s.latency_slo_ms,
        "data": [{"sizeGb": d.size_gb, "location": d.location, "url": d.url,
                  "sha256": d.sha256} for d in s.data],
        "imageGb": s.image_gb, "durationS": s.duration_s, "affinity": dict(s.affinity),
        "antiAffinity": dict(s.anti_affinity), "avoidWorkloads": list(s.avoid_workloads),
        "tolerations": [{"key": t.key, "operator": t.operator, "value": t.value,
                         "effect": t.effect} for t in s.tolerations],
        "spread": None if s.spread is None else {
            "topology": s.spread.topology, "minDomains": s.spread.min_domains,
            "maxDomains": s.spread.max_domains},
        "priority": s.priority, "budgetUsdPerHour": s.budget_usd_per_hour,
        "spotOk": s.spot_ok, "env": dict(s.env), "command": list(s.command),
    }
    return out


def workload_view(r: WorkloadRecord) -> dict[str, Any]:
    """A workload answer; `sanitized` (only when non-empty) lists the spec fields that an
    older version stored outside today's limits and that were clipped on read."""
    w = r.workload
    out: dict[str, Any] = {
        "apiVersion": "skyfed.io/v1", "kind": "Workload", "id": w.id,
        "metadata": {"name": w.spec.name, "labels": dict(w.spec.labels), "uid": w.id,
                     "tenant": w.tenant, "submittedS": w.submitted_s},
        "spec": spec_to_api(w.spec),
        "status": {"phase": str(w.status), "placementId": r.placement_id,
                   "message": r.message, "updatedS": r.updated_s},
    }
    if r.sanitized:
        out["sanitized"] = list(r.sanitized)
    return out


def event_view(e: Event) -> dict[str, Any]:
    """An event answer; `sanitized` (only when non-empty) as for workloads, paths in `data`."""
    out: dict[str, Any] = {"id": e.id, "ts": e.ts, "tenant": e.tenant, "kind": e.kind,
                           "subject": e.subject, "data": e.data}
    if e.sanitized:
        out["sanitized"] = list(e.sanitized)
    return out


def _pool_view(p: Pool) -> dict[str, Any]:
    return {"name": p.name, "instanceType": p.instance_type,
            "node": {"cpu": p.node.cpu, "memory": p.node.memory_gib, "gpu": p.node.gpu},
            "nodes": p.nodes, "maxNodes": p.max_nodes,
            "priceUsdPerHour": p.price_usd_per_hour, "pricing": str(p.pricing),
            "gpuModel": p.gpu_model, "interconnect": str(p.interconnect),
            "used": {"cpu": p.used.cpu, "memory": p.used.memory_gib, "gpu": p.used.gpu}}


def cluster_view(r: ClusterRecord) -> dict[str, Any]:
    c: Cluster = r.cluster
    return {"name": c.name, "tenant": r.tenant, "provider": c.provider, "region": c.region,
            "account": r.account, "zones": list(c.zones), "lat": c.lat, "lon": c.lon,
            "labels": dict(c.labels), "taints": list(c.taints), "quotaVcpu": c.quota_vcpu,
            "quotaGpu": c.quota_gpu, "healthy": c.healthy, "quotaStale": c.quota_stale,
            "pools": [_pool_view(p) for p in c.pools], "attrs": dict(r.attrs),
            "updatedS": r.updated_s}


def site_view(r: SiteRecord) -> dict[str, Any]:
    s: Site = r.site
    return {"name": s.name, "tenant": r.tenant, "lat": s.lat, "lon": s.lon,
            "capacity": {"cpu": s.capacity.cpu, "memory": s.capacity.memory_gib,
                         "gpu": s.capacity.gpu},
            "priceUsdPerHour": s.price_usd_per_hour, "gpuModel": s.gpu_model,
            "interconnect": str(s.interconnect), "uplinkGbps": s.uplink_gbps,
            "health": str(s.health), "labels": dict(s.labels), "lastSeenS": r.last_seen_s,
            "attrs": dict(r.attrs), "updatedS": r.updated_s}


def placement_view(r: PlacementRecord) -> dict[str, Any]:
    p = r.placement
    return {"id": r.id, "workloadId": p.workload_id, "tenant": r.tenant,
            "assignments": [{"cluster": a.cluster, "pool": a.pool, "pricing": str(a.pricing),
                             "replicas": a.replicas, "priceUsdPerHour": a.price_usd_per_hour,
                             "newNodes": a.new_nodes} for a in p.assignments],
            "costUsdPerHour": p.cost_usd_per_hour, "rttMs": p.rtt_ms, "active": r.active,
            "dispatched": r.dispatched, "dispatchAttempts": r.dispatch_attempts,
            "lastError": r.last_error, "createdS": r.created_s, "decision": dict(p.decision)}
