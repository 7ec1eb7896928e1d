"""The demo federation (config/demo.toml): clusters, edge sites, users and the workload mix.

Why a file and not code: the demo must show real list prices in real regions,
and an operator trying skyfed should be able to point it at their own mix. So
the file names only instance types and regions; shapes and prices come from
the offline catalog (`providers/catalog.py`), the same numbers the broker
places with. Unknown keys are errors that name the key (SCENARIO.md's rule).

Outputs, all derived from one parsed `DemoFederation`:
- API payloads for `POST /v1/clusters`, `POST /v1/sites`, `POST /v1/workloads`
  (the wire format of broker/api/schemas.py);
- domain values (`Cluster`, `UserRegion`, `Workload`) for the baseline
  comparison, which calls the planner directly on the same batch.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.domain import (
    Cluster,
    DataSource,
    Interconnect,
    Pool,
    PricingModel,
    Resources,
    Site,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.placement.snapshot import EDGE_LABEL, site_cluster
from providers.catalog import Catalog
from providers.errors import ProviderError

DEFAULT_DEMO_CONFIG = Path(__file__).resolve().parents[2] / "config" / "demo.toml"
__all__ = ["EDGE_LABEL", "DemoFederation", "load_demo_federation"]


class DemoConfigError(ValueError):
    """config/demo.toml is malformed; the message names the offending key."""


_TOP = {"name", "tenant", "clusters", "sites", "user_regions", "workloads"}
_CLUSTER = {"name", "provider", "region", "zones", "pools", "quota_vcpu", "labels"}
_POOL = {"instance_type", "nodes", "max_nodes", "spot"}
_SITE = {"name", "lat", "lon", "cpu", "memory_gib", "gpu", "gpu_model", "price_usd_per_hour",
         "uplink_gbps"}
_USER = {"name", "key", "lat", "lon"}
_WORKLOAD = {"name", "kind", "image", "replicas", "cpu", "memory_gib", "gpu", "gpu_model",
             "interconnect", "user_region", "latency_slo_ms", "duration_s", "data_gb",
             "data_location", "priority", "edge"}


def _check_keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise DemoConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _req(where: str, table: Mapping[str, Any], key: str) -> Any:
    if key not in table:
        raise DemoConfigError(f"{where}: missing required key {key!r}")
    return table[key]


@dataclass(frozen=True, slots=True)
class DemoSite:
    name: str
    lat: float
    lon: float
    cpu: float
    memory_gib: float
    gpu: int = 0
    gpu_model: str | None = None
    price_usd_per_hour: float = 0.0
    uplink_gbps: float = 1.0


@dataclass(frozen=True, slots=True)
class DemoWorkload:
    """`spec.user_region` is the broker's key for the users (see DemoUsers.key)."""

    spec: WorkloadSpec
    edge: bool = False
    users: str | None = None  # the [[user_regions]] name


@dataclass(frozen=True, slots=True)
class DemoUsers:
    """Where users are. `key` names the place for the broker: a catalog
    `provider:region` or an edge site's name (the live placement loop resolves
    RTTs for those); lat/lon are for the map and the edge hub."""

    name: str
    key: str
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class DemoFederation:
    name: str
    tenant: str
    clusters: tuple[Cluster, ...]
    sites: tuple[DemoSite, ...]
    users: tuple[DemoUsers, ...]
    workloads: tuple[DemoWorkload, ...]

    @property
    def user_regions(self) -> tuple[UserRegion, ...]:
        return tuple(UserRegion(u.name, u.lat, u.lon) for u in self.users)

    @property
    def domain_sites(self) -> tuple[Site, ...]:
        """The edge sites as registered (`POST /v1/sites`)."""
        return tuple(Site(
            name=s.name, lat=s.lat, lon=s.lon, capacity=Resources(s.cpu, s.memory_gib, s.gpu),
            price_usd_per_hour=s.price_usd_per_hour, gpu_model=s.gpu_model,
            interconnect=Interconnect.PCIE if s.gpu else Interconnect.NONE,
            uplink_gbps=s.uplink_gbps, labels={EDGE_LABEL: "true"}) for s in self.sites)

    @property
    def site_clusters(self) -> tuple[Cluster, ...]:
        """Edge sites as the planner sees them (the snapshot merge's rule)."""
        return tuple(site_cluster(s) for s in self.domain_sites)

    # ---------------------------------------------------------------- API payloads
    def cluster_payloads(self) -> list[dict[str, Any]]:
        """The cloud clusters (edge sites are registered once, as sites)."""
        return [_cluster_payload(c) for c in self.clusters]

    def site_payloads(self) -> list[dict[str, Any]]:
        return [{
            "name": s.name, "lat": s.lat, "lon": s.lon,
            "capacity": {"cpu": s.cpu, "memory": s.memory_gib, "gpu": s.gpu},
            "priceUsdPerHour": s.price_usd_per_hour, "gpuModel": s.gpu_model,
            "uplinkGbps": s.uplink_gbps, "labels": {EDGE_LABEL: "true"},
        } for s in self.sites]

    def workload_manifests(self) -> list[dict[str, Any]]:
        return [_manifest(w) for w in self.workloads]

    def user_region(self, name: str | None) -> DemoUsers | None:
        return next((u for u in self.users if u.name == name), None)

    def domain_workloads(self, now_s: float = 0.0) -> tuple[Workload, ...]:
        return tuple(Workload(id=f"demo-{i:02d}-{w.spec.name}", tenant=self.tenant,
                              spec=w.spec, submitted_s=now_s)
                     for i, w in enumerate(self.workloads))


def _cluster_payload(c: Cluster) -> dict[str, Any]:
    return {
        "name": c.name, "provider": c.provider, "region": c.region, "zones": list(c.zones),
        "lat": c.lat, "lon": c.lon, "labels": dict(c.labels), "quotaVcpu": c.quota_vcpu,
        "pools": [{
            "name": p.name, "instanceType": p.instance_type,
            "node": {"cpu": p.node.cpu, "memory": p.node.memory_gib, "gpu": p.node.gpu},
            "nodes": p.nodes, "maxNodes": p.max_nodes,
            "priceUsdPerHour": p.price_usd_per_hour, "pricing": p.pricing.value,
            "gpuModel": p.gpu_model, "interconnect": p.interconnect.value,
        } for p in c.pools],
    }


def _manifest(w: DemoWorkload) -> dict[str, Any]:
    s = w.spec
    spec: dict[str, Any] = {
        "kind": s.kind.value, "image": s.image, "replicas": s.replicas,
        "resources": {"cpu": s.resources.cpu, "memory": s.resources.memory_gib,
                      "gpu": s.resources.gpu, "gpuModel": s.gpu_model,
                      "interconnect": s.interconnect.value},
        "priority": s.priority,
    }
    if s.user_region:
        spec["userRegion"] = s.user_region
    if s.latency_slo_ms is not None:
        spec["latencySloMs"] = s.latency_slo_ms
    if s.duration_s is not None:
        spec["durationS"] = s.duration_s
    if s.data:
        spec["data"] = [{"sizeGb": d.size_gb, "location": d.location} for d in s.data]
    return {"apiVersion": "skyfed.io/v1", "kind": "Workload",
            "metadata": {"name": s.name, "labels": dict(s.labels)}, "spec": spec}


def _pool(where: str, cluster: Mapping[str, Any], raw: Mapping[str, Any],
          catalog: Catalog) -> Pool:
    _check_keys(where, raw, _POOL)
    itype = str(_req(where, raw, "instance_type"))
    try:
        offer = catalog.offer(str(cluster["provider"]), str(cluster["region"]), itype)
    except ProviderError as exc:  # the catalog names the unknown region or type
        raise DemoConfigError(f"{where}: {exc}") from exc
    spot = bool(raw.get("spot", False))
    price = offer.spot_price_usd_per_hour if spot else offer.price_usd_per_hour
    if price is None:
        raise DemoConfigError(f"{where}: the catalog has no {'spot' if spot else 'on-demand'} "
                              f"price for {itype} in {cluster['provider']}:{cluster['region']}")
    nodes = int(raw.get("nodes", 0))
    return Pool(
        name=f"{itype.lower().replace('_', '-')}{'-spot' if spot else ''}",
        instance_type=itype, node=Resources(offer.vcpu, offer.memory_gib, offer.gpu_count),
        nodes=nodes, max_nodes=max(nodes, int(raw.get("max_nodes", nodes))),
        price_usd_per_hour=float(price),
        pricing=PricingModel.SPOT if spot else PricingModel.ON_DEMAND,
        gpu_model=offer.gpu_model, interconnect=offer.interconnect,
        reclaim_rate_per_hour=0.05 if spot else 0.0,
    )


def _cluster(i: int, raw: Mapping[str, Any], catalog: Catalog) -> Cluster:
    where = f"clusters[{i}]"
    _check_keys(where, raw, _CLUSTER)
    name, provider, region = (str(_req(where, raw, k)) for k in ("name", "provider", "region"))
    try:
        reg = catalog.region(provider, region)
    except ProviderError as exc:
        raise DemoConfigError(f"{where} ({name}): {exc}") from exc
    pools = tuple(_pool(f"{where}.pools[{j}]", raw, p, catalog)
                  for j, p in enumerate(raw.get("pools", [])))
    return Cluster(name=name, provider=provider, region=region, pools=pools,
                   zones=tuple(raw.get("zones", ())), lat=reg.lat, lon=reg.lon,
                   labels=dict(raw.get("labels", {})), quota_vcpu=raw.get("quota_vcpu"))


def _workload(i: int, raw: Mapping[str, Any], users: Mapping[str, str]) -> DemoWorkload:
    where = f"workloads[{i}]"
    _check_keys(where, raw, _WORKLOAD)
    name = str(_req(where, raw, "name"))
    try:
        kind = WorkloadKind(str(_req(where, raw, "kind")))
        interconnect = Interconnect(str(raw.get("interconnect", "none")))
    except ValueError as exc:
        raise DemoConfigError(f"{where} ({name}): {exc}") from exc
    user = raw.get("user_region")
    if user is not None and user not in users:
        raise DemoConfigError(f"{where} ({name}): user_region {user!r} is not in [[user_regions]]")
    data: tuple[DataSource, ...] = ()
    if raw.get("data_gb"):
        data = (DataSource(size_gb=float(raw["data_gb"]),
                           location=str(_req(where, raw, "data_location"))),)
    edge = bool(raw.get("edge", False))
    spec = WorkloadSpec(
        name=name, kind=kind, image=str(_req(where, raw, "image")),
        replicas=int(raw.get("replicas", 1)),
        resources=Resources(float(raw.get("cpu", 0.0)), float(raw.get("memory_gib", 0.0)),
                            int(raw.get("gpu", 0))),
        gpu_model=raw.get("gpu_model"), interconnect=interconnect,
        user_region=None if user is None else users[user],
        latency_slo_ms=raw.get("latency_slo_ms"), data=data,
        duration_s=raw.get("duration_s"), priority=int(raw.get("priority", 0)),
        labels={EDGE_LABEL: "true"} if edge else {},
    )
    return DemoWorkload(spec=spec, edge=edge, users=user)


def load_demo_federation(path: Path | None = None, catalog: Catalog | None = None
                         ) -> DemoFederation:
    """Parse and price the demo federation; DemoConfigError names any bad key."""
    src = path or next((p for p in (Path("config/demo.toml"), DEFAULT_DEMO_CONFIG)
                        if p.exists()), DEFAULT_DEMO_CONFIG)
    try:
        raw = tomllib.loads(src.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DemoConfigError(f"{src}: {exc}") from exc
    _check_keys(str(src), raw, _TOP)
    cat = catalog or Catalog.load()
    sites = []
    for i, s in enumerate(raw.get("sites", [])):
        _check_keys(f"sites[{i}]", s, _SITE)
        sites.append(DemoSite(
            name=str(_req(f"sites[{i}]", s, "name")), lat=float(s["lat"]), lon=float(s["lon"]),
            cpu=float(s.get("cpu", 8)), memory_gib=float(s.get("memory_gib", 32)),
            gpu=int(s.get("gpu", 0)), gpu_model=s.get("gpu_model"),
            price_usd_per_hour=float(s.get("price_usd_per_hour", 0.0)),
            uplink_gbps=float(s.get("uplink_gbps", 1.0))))
    users = []
    for i, u in enumerate(raw.get("user_regions", [])):
        _check_keys(f"user_regions[{i}]", u, _USER)
        name = str(_req(f"user_regions[{i}]", u, "name"))
        users.append(DemoUsers(name, str(u.get("key", name)), float(_req(name, u, "lat")),
                               float(_req(name, u, "lon"))))
    names = {u.name: u.key for u in users}
    return DemoFederation(
        name=str(raw.get("name", "skyfed-demo")), tenant=str(raw.get("tenant", "demo")),
        clusters=tuple(_cluster(i, c, cat) for i, c in enumerate(raw.get("clusters", []))),
        sites=tuple(sites), users=tuple(users),
        workloads=tuple(_workload(i, w, names) for i, w in enumerate(raw.get("workloads", []))),
    )
