"""Conversions between table rows / JSON columns and `broker.domain` values.

The JSON form of a `WorkloadSpec` is the dataclass's own field names
(snake_case), so it round-trips exactly: `spec_from_json(spec_to_json(s)) == s`.

Reading is defensive: rows written by older versions may hold what today's
validation refuses (a 301-digit jsonb integer from `durationS: 1e300`, a NUL in
SQLite text). `read_spec` repairs such a spec (`broker.limits.sanitize_json`,
`clip_spec`) and names the fields it changed, so one bad row can neither make a
list answer 500 nor hand the placement loop a number it cannot solve with.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from broker.domain import (
    Assignment,
    Cluster,
    ClusterWeight,
    DataSource,
    Interconnect,
    NativeObjects,
    Offer,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Site,
    SiteHealth,
    Spread,
    Toleration,
    Workload,
    WorkloadKind,
    WorkloadSpec,
    WorkloadStatus,
)
from broker.limits import clip_spec, sanitize_json
from broker.placement.observed import ObservedNode
from broker.store.models import OfferRow, PoolRow, SiteRow, WorkloadRow
from providers.base import Quota


def spec_to_json(s: WorkloadSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": s.name, "kind": str(s.kind), "image": s.image, "replicas": s.replicas,
        "resources": {"cpu": s.resources.cpu, "memory_gib": s.resources.memory_gib,
                      "gpu": s.resources.gpu},
        "gpu_model": s.gpu_model, "interconnect": str(s.interconnect),
        "user_region": s.user_region, "latency_slo_ms": s.latency_slo_ms,
        "data": [{"size_gb": d.size_gb, "location": d.location, "url": d.url,
                  "sha256": d.sha256} for d in s.data],
        "image_gb": s.image_gb, "duration_s": s.duration_s,
        "affinity": dict(s.affinity), "anti_affinity": dict(s.anti_affinity),
        "avoid_workloads": list(s.avoid_workloads),
        "tolerations": [{"key": t.key, "operator": t.operator, "value": t.value,
                         "effect": t.effect} for t in s.tolerations],
        "spread": None if s.spread is None else {
            "topology": s.spread.topology, "min_domains": s.spread.min_domains,
            "max_domains": s.spread.max_domains},
        "priority": s.priority, "budget_usd_per_hour": s.budget_usd_per_hour,
        "spot_ok": s.spot_ok, "labels": dict(s.labels), "env": dict(s.env),
        "command": list(s.command),
    }
    # Newer fields only when set: a spec without them hashes as before (Idempotency-Key).
    if s.cluster_names:
        out["cluster_names"] = list(s.cluster_names)
    if s.replica_weights:
        out["replica_weights"] = [
            {"weight": e.weight, "cluster_names": list(e.cluster_names),
             "exclude": list(e.exclude), "match_labels": dict(e.match_labels)}
            for e in s.replica_weights]
    if s.native is not None:
        out["native"] = {"kind": s.native.kind, "workload": dict(s.native.workload),
                         "companions": [dict(c) for c in s.native.companions],
                         "defaulted": list(s.native.defaulted)}
    return out


def spec_from_json(d: Mapping[str, Any]) -> WorkloadSpec:
    r = d["resources"]
    spread = d.get("spread")
    return WorkloadSpec(
        name=d["name"], kind=WorkloadKind(d["kind"]), image=d["image"],
        replicas=int(d["replicas"]),
        resources=Resources(float(r["cpu"]), float(r["memory_gib"]), int(r["gpu"])),
        gpu_model=d.get("gpu_model"),
        interconnect=Interconnect(d.get("interconnect", "none")),
        user_region=d.get("user_region"), latency_slo_ms=d.get("latency_slo_ms"),
        data=tuple(DataSource(x["size_gb"], x["location"], x.get("url", ""),
                              x.get("sha256", "")) for x in d.get("data", ())),
        image_gb=d.get("image_gb", 0.5), duration_s=d.get("duration_s"),
        affinity=dict(d.get("affinity", {})), anti_affinity=dict(d.get("anti_affinity", {})),
        avoid_workloads=tuple(d.get("avoid_workloads", ())),
        tolerations=tuple(Toleration(t["key"], t.get("operator", "Equal"), t.get("value", ""),
                                     t.get("effect", "")) for t in d.get("tolerations", ())),
        spread=None if spread is None else Spread(spread["topology"], spread["min_domains"],
                                                  spread.get("max_domains")),
        priority=int(d.get("priority", 0)), budget_usd_per_hour=d.get("budget_usd_per_hour"),
        spot_ok=bool(d.get("spot_ok", True)), labels=dict(d.get("labels", {})),
        env=dict(d.get("env", {})), command=tuple(d.get("command", ())),
        cluster_names=tuple(d.get("cluster_names", ())), native=_native(d.get("native")),
        replica_weights=tuple(
            ClusterWeight(weight=int(e["weight"]), cluster_names=tuple(e["cluster_names"]),
                          exclude=tuple(e["exclude"]), match_labels=dict(e["match_labels"]))
            for e in d.get("replica_weights", ())),
    )


def _native(d: Mapping[str, Any] | None) -> NativeObjects | None:
    if not d:
        return None
    return NativeObjects(kind=str(d["kind"]), workload=dict(d["workload"]),
                         companions=tuple(dict(c) for c in d.get("companions", ())),
                         defaulted=tuple(d.get("defaulted", ())))


def _canonical_stdlib(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str).encode()


try:
    import orjson

    def _canonical(obj: Mapping[str, Any]) -> bytes:
        # Same bytes as _canonical_stdlib for JSON-native values, ~10x faster.
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
except ImportError:  # pragma: no cover - orjson is in the broker extra
    _canonical = _canonical_stdlib


def spec_sha256(spec_json: Mapping[str, Any]) -> str:
    """A canonical hash of a spec: equal specs hash equal whatever the input format."""
    return hashlib.sha256(_canonical(spec_json)).hexdigest()


def read_spec(raw: Mapping[str, Any]) -> tuple[WorkloadSpec, list[str]]:
    """A stored spec, repaired to today's limits, and the API names of what was repaired."""
    clean, changed = sanitize_json(raw)
    spec, clipped = clip_spec(spec_from_json(clean))
    return spec, list(dict.fromkeys([_camel(p) for p in changed] + clipped))


def _camel(path: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), path)


def read_workload(row: WorkloadRow) -> tuple[Workload, list[str]]:
    spec, repaired = read_spec(row.spec)
    return Workload(id=row.id, tenant=row.tenant, spec=spec,
                    status=WorkloadStatus(row.status), submitted_s=row.submitted_s,
                    attempts=row.attempts or 0, last_attempt_s=row.last_attempt_s), repaired


def workload_from_row(row: WorkloadRow) -> Workload:
    return read_workload(row)[0]


def pool_to_values(cluster: str, p: Pool) -> dict[str, Any]:
    return {
        "cluster": cluster, "name": p.name, "instance_type": p.instance_type,
        "node_cpu": p.node.cpu, "node_memory_gib": p.node.memory_gib, "node_gpu": p.node.gpu,
        "nodes": p.nodes, "max_nodes": p.max_nodes, "price_usd_per_hour": p.price_usd_per_hour,
        "pricing": str(p.pricing), "gpu_model": p.gpu_model, "interconnect": str(p.interconnect),
        "used_cpu": p.used.cpu, "used_memory_gib": p.used.memory_gib, "used_gpu": p.used.gpu,
        "largest_free_gpu_set": p.largest_free_gpu_set,
        "reclaim_rate_per_hour": p.reclaim_rate_per_hour,
        "taints": list(p.taints) or None,
    }


def pool_from_row(r: PoolRow) -> Pool:
    return Pool(
        name=r.name, instance_type=r.instance_type,
        node=Resources(r.node_cpu, r.node_memory_gib, r.node_gpu), nodes=r.nodes,
        max_nodes=r.max_nodes, price_usd_per_hour=r.price_usd_per_hour,
        pricing=PricingModel(r.pricing), gpu_model=r.gpu_model,
        interconnect=Interconnect(r.interconnect),
        used=Resources(r.used_cpu, r.used_memory_gib, r.used_gpu),
        largest_free_gpu_set=r.largest_free_gpu_set,
        reclaim_rate_per_hour=r.reclaim_rate_per_hour,
        taints=tuple(str(t) for t in r.taints or ()),
    )


def cluster_to_values(c: Cluster) -> dict[str, Any]:
    return {
        "name": c.name, "provider": c.provider, "region": c.region, "zones": list(c.zones),
        "lat": c.lat, "lon": c.lon, "labels": dict(c.labels), "taints": list(c.taints),
        "quota_vcpu": c.quota_vcpu, "quota_gpu": c.quota_gpu, "healthy": c.healthy,
        "quota_stale": c.quota_stale,
    }


def cluster_from_row(r: Any, pools: Sequence[PoolRow]) -> Cluster:
    return Cluster(
        name=r.name, provider=r.provider, region=r.region,
        pools=tuple(pool_from_row(p) for p in pools), zones=tuple(r.zones or ()),
        lat=r.lat, lon=r.lon, labels=dict(r.labels or {}), taints=tuple(r.taints or ()),
        quota_vcpu=r.quota_vcpu, quota_gpu=r.quota_gpu, healthy=r.healthy,
        quota_stale=r.quota_stale,
    )


def site_to_values(s: Site) -> dict[str, Any]:
    return {
        "name": s.name, "lat": s.lat, "lon": s.lon, "cpu": s.capacity.cpu,
        "memory_gib": s.capacity.memory_gib, "gpu": s.capacity.gpu,
        "price_usd_per_hour": s.price_usd_per_hour, "gpu_model": s.gpu_model,
        "interconnect": str(s.interconnect), "uplink_gbps": s.uplink_gbps,
        "health": str(s.health), "labels": dict(s.labels),
    }


def site_from_row(r: SiteRow) -> Site:
    return Site(
        name=r.name, lat=r.lat, lon=r.lon, capacity=Resources(r.cpu, r.memory_gib, r.gpu),
        price_usd_per_hour=r.price_usd_per_hour, gpu_model=r.gpu_model,
        interconnect=Interconnect(r.interconnect), uplink_gbps=r.uplink_gbps,
        health=SiteHealth(r.health), labels=dict(r.labels or {}),
    )


def offer_to_values(o: Offer) -> dict[str, Any]:
    return {
        "provider": o.provider, "region": o.region, "instance_type": o.instance_type,
        "vcpu": o.vcpu, "memory_gib": o.memory_gib, "gpu_count": o.gpu_count,
        "gpu_model": o.gpu_model, "interconnect": str(o.interconnect),
        "price_usd_per_hour": o.price_usd_per_hour,
        "spot_price_usd_per_hour": o.spot_price_usd_per_hour, "source": o.source,
    }


def offer_from_row(r: OfferRow) -> Offer:
    return Offer(
        provider=r.provider, region=r.region, instance_type=r.instance_type, vcpu=r.vcpu,
        memory_gib=r.memory_gib, gpu_count=r.gpu_count, gpu_model=r.gpu_model,
        interconnect=Interconnect(r.interconnect), price_usd_per_hour=r.price_usd_per_hour,
        spot_price_usd_per_hour=r.spot_price_usd_per_hour, source=r.source,
    )


def quota_to_json(q: Quota) -> dict[str, Any]:
    return {"provider": q.provider, "region": q.region, "metric": q.metric,
            "limit": q.limit, "used": q.used}


def quota_from_json(d: Mapping[str, Any]) -> Quota:
    return Quota(provider=d["provider"], region=d["region"], metric=d["metric"],
                 limit=float(d["limit"]), used=float(d.get("used", 0.0)))


def assignments_to_json(items: Sequence[Assignment]) -> list[dict[str, Any]]:
    return [{"cluster": a.cluster, "pool": a.pool, "pricing": str(a.pricing),
             "replicas": a.replicas, "price_usd_per_hour": a.price_usd_per_hour,
             "new_nodes": a.new_nodes} for a in items]


def assignments_from_json(items: Sequence[Mapping[str, Any]]) -> tuple[Assignment, ...]:
    return tuple(Assignment(cluster=a["cluster"], pool=a["pool"],
                            pricing=PricingModel(a["pricing"]), replicas=int(a["replicas"]),
                            price_usd_per_hour=float(a["price_usd_per_hour"]),
                            new_nodes=int(a.get("new_nodes", 0))) for a in items)


def placement_from_values(workload_id: str, assignments: Sequence[Mapping[str, Any]],
                          cost: float, rtt_ms: float | None,
                          decision: Mapping[str, Any]) -> Placement:
    return Placement(workload_id=workload_id, assignments=assignments_from_json(assignments),
                     cost_usd_per_hour=cost, rtt_ms=rtt_ms, decision=dict(decision))


def _res_json(r: Resources) -> dict[str, Any]:
    return {"cpu": r.cpu, "memory_gib": r.memory_gib, "gpu": r.gpu}


def _res(d: Mapping[str, Any]) -> Resources:
    return Resources(float(d.get("cpu", 0.0)), float(d.get("memory_gib", 0.0)),
                     int(d.get("gpu", 0)))


def node_to_json(n: ObservedNode) -> dict[str, Any]:
    return {"name": n.name, "pool": n.pool, "instance_type": n.instance_type,
            "allocatable": _res_json(n.allocatable), "allocated": _res_json(n.allocated),
            "ready": n.ready, "ever_ready": n.ever_ready, "unschedulable": n.unschedulable,
            "taints": list(n.taints), "idle_since_s": n.idle_since_s, "prewarmed": n.prewarmed,
            "workloads": list(n.workloads)}


def node_from_json(d: Mapping[str, Any]) -> ObservedNode:
    idle = d.get("idle_since_s")
    return ObservedNode(
        name=str(d["name"]), pool=str(d.get("pool", "")),
        instance_type=str(d.get("instance_type", "")),
        allocatable=_res(d.get("allocatable") or {}), allocated=_res(d.get("allocated") or {}),
        ready=bool(d.get("ready", True)), ever_ready=bool(d.get("ever_ready", True)),
        unschedulable=bool(d.get("unschedulable", False)),
        taints=tuple(str(t) for t in d.get("taints", ())),
        idle_since_s=None if idle is None else float(idle),
        prewarmed=bool(d.get("prewarmed", False)),
        workloads=tuple(str(w) for w in d.get("workloads", ())))
