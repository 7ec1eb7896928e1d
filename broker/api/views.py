"""Response bodies (plain dicts, camelCase like the requests) and the JSON
response class: orjson when installed (it is several times faster on the hot
POST path), the standard library otherwise."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from broker.domain import Cluster, NodeLeaving, Pool, Provenance, Site, WorkloadSpec
from broker.placement.observed import leaving
from broker.store import (
    ClusterRecord,
    Event,
    InventoryRecord,
    PlacementRecord,
    SiteRecord,
    WorkloadRecord,
)

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
    if s.cluster_names:
        out["clusterNames"] = list(s.cluster_names)
    if s.replica_weights:
        # The PlacementPolicy's staticWeightList as accepted (Karmada's field names).
        out["replicaSplit"] = "weighted"
        out["staticWeightList"] = [
            {"targetCluster": {"clusterNames": list(e.cluster_names), "exclude": list(e.exclude),
                               "labelSelector": {"matchLabels": dict(e.match_labels)}},
             "weight": e.weight} for e in s.replica_weights]
    if s.native is not None:
        # Kinds and names only: a Secret's data (and any other object body) is never echoed.
        out["objects"] = [_object_ref(o) for o in (s.native.workload, *s.native.companions)]
    return out


def _object_ref(obj: Any) -> dict[str, Any]:
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "name": (obj.get("metadata") or {}).get("name")}


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
    if w.spec.native is not None and w.spec.native.defaulted:
        out["status"]["defaulted"] = list(w.spec.native.defaulted)
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
            "used": {"cpu": p.used.cpu, "memory": p.used.memory_gib, "gpu": p.used.gpu},
            "bootS": p.boot_s, "taints": list(p.taints)}


def cluster_view(r: ClusterRecord) -> dict[str, Any]:
    c: Cluster = r.cluster
    return {"name": c.name, "tenant": r.tenant, "provider": c.provider, "region": c.region,
            "account": r.account, "zones": list(c.zones), "lat": c.lat, "lon": c.lon,
            "labels": dict(c.labels), "taints": list(c.taints), "quotaVcpu": c.quota_vcpu,
            "quotaGpu": c.quota_gpu, "healthy": c.healthy, "quotaStale": c.quota_stale,
            "pools": [_pool_view(p) for p in c.pools], "attrs": dict(r.attrs),
            "updatedS": r.updated_s, "shared": r.shared, "lentTo": list(r.lent_to)}


def observed_view(inv: InventoryRecord | None, now_s: float) -> dict[str, Any] | None:
    """What the driver last reported (null before the first poll); `observedAt` advances
    with every poll, `cpuAllocated` is what is requested on the nodes now."""
    if inv is None:
        return None
    counted = [n for n in inv.nodes if leaving(n) is NodeLeaving.NO]
    return {
        "nodes": len(inv.nodes), "nodesLeaving": len(inv.nodes) - len(counted),
        "cpuAllocatable": round(sum(n.allocatable.cpu for n in counted), 6),
        "cpuAllocated": round(sum(n.allocated.cpu for n in counted), 6),
        "memoryAllocatableGib": round(sum(n.allocatable.memory_gib for n in counted), 6),
        "memoryAllocatedGib": round(sum(n.allocated.memory_gib for n in counted), 6),
        "gpuFree": sum(max(0, n.allocatable.gpu - n.allocated.gpu) for n in counted),
        "observedAt": inv.observed_s, "ageS": round(max(0.0, now_s - inv.observed_s), 3),
        "lastError": inv.error or None,
    }


def _provenance(p: Provenance | None) -> dict[str, Any]:
    if p is None:
        return {"source": "none", "ageS": None, "stale": False}
    return {"source": p.source, "ageS": p.age_s, "stale": p.stale}


def cluster_detail_view(base: dict[str, Any], merged: Cluster, inv: InventoryRecord | None,
                        quota_limit: float | None, quota_used: float | None,
                        now_s: float) -> dict[str, Any]:
    """`GET /v1/clusters/{name}`: the registration plus what the snapshot merge made of it
    (placement/snapshot.py): observed inventory, where prices and quota come from and how
    old they are, and the values the planner uses now (`effective`)."""
    quota = _provenance(merged.provenance.get("quota"))
    quota |= {"vcpuLimit": quota_limit, "vcpuUsed": quota_used,
              "vcpuEffective": merged.quota_vcpu, "gpuEffective": merged.quota_gpu}
    return base | {
        "observed": observed_view(inv, now_s),
        "pricing": _provenance(merged.provenance.get("pricing")),
        "quota": quota,
        "health": _provenance(merged.provenance.get("health")) | {"healthy": merged.healthy},
        "effective": {"healthy": merged.healthy, "quotaVcpu": merged.quota_vcpu,
                      "quotaGpu": merged.quota_gpu, "quotaStale": merged.quota_stale,
                      "allowedTenants": None if merged.allowed_tenants is None
                      else sorted(merged.allowed_tenants),
                      "pools": [_pool_view(p) for p in merged.pools]},
    }


def site_cluster_view(r: SiteRecord, c: Cluster) -> dict[str, Any]:
    """An edge site registered once, shown as the edge cluster the planner sees."""
    return {"name": c.name, "tenant": r.tenant, "provider": c.provider, "region": c.region,
            "account": None, "zones": list(c.zones), "lat": c.lat, "lon": c.lon,
            "labels": dict(c.labels), "taints": list(c.taints), "quotaVcpu": None,
            "quotaGpu": None, "healthy": c.healthy, "quotaStale": False,
            "pools": [_pool_view(p) for p in c.pools], "attrs": {}, "site": True,
            "updatedS": r.updated_s}


def site_view(r: SiteRecord) -> dict[str, Any]:
    s: Site = r.site
    return {"name": s.name, "tenant": r.tenant, "lat": s.lat, "lon": s.lon,
            "capacity": {"cpu": s.capacity.cpu, "memory": s.capacity.memory_gib,
                         "gpu": s.capacity.gpu},
            "priceUsdPerHour": s.price_usd_per_hour, "gpuModel": s.gpu_model,
            "interconnect": str(s.interconnect), "uplinkGbps": s.uplink_gbps,
            "health": str(s.health), "labels": dict(s.labels), "lastSeenS": r.last_seen_s,
            "attrs": dict(r.attrs), "updatedS": r.updated_s, "shared": r.shared,
            "lentTo": list(r.lent_to)}


def tenant_decision(decision: Mapping[str, Any]) -> dict[str, Any]:
    """A decision record as a tenant may see it: without the policy's observation (every
    cluster of the federation, by name, with its price and load; stored in one placement of
    each epoch) and without `observation_in` (the id of a placement that may be another
    tenant's). The rest names only clusters the tenant may use (placement/candidates.py)."""
    out = dict(decision)
    steering = out.get("policy_action")
    if isinstance(steering, Mapping):
        out["policy_action"] = {k: v for k, v in steering.items()
                                if k not in ("observation", "observation_in")}
    return out


def placement_view(r: PlacementRecord) -> dict[str, Any]:
    p = r.placement
    return {"id": r.id, "workloadId": p.workload_id, "tenant": r.tenant,
            "assignments": [{"cluster": a.cluster, "pool": a.pool, "pricing": str(a.pricing),
                             "replicas": a.replicas, "priceUsdPerHour": a.price_usd_per_hour,
                             "newNodes": a.new_nodes} for a in p.assignments],
            "costUsdPerHour": p.cost_usd_per_hour, "rttMs": p.rtt_ms, "active": r.active,
            "dispatched": r.dispatched, "dispatchAttempts": r.dispatch_attempts,
            "lastError": r.last_error, "createdS": r.created_s, "decision": dict(p.decision)}
