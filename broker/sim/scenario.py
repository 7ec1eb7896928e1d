"""Scenario loading for the digital twin: SCENARIO.md, exactly (the trace half is trace.py).

`load_scenario(path, catalog)` reads `scenario.toml` plus its `trace.csv(.gz)`
and returns a `Scenario`: frozen values, nothing simulated yet. Why so strict:
SCENARIO.md is a public contract; a misspelt key silently ignored would make a
user's experiment measure something else. So every unknown key is an error that
names the key and where it was found, every bad value names its field (and the
trace line), and every missing optional key takes the default documented here
and in docs/twin.md.

Defaults for keys SCENARIO.md leaves open (documented in docs/twin.md):
- top level: `seed = 0`, `horizon_s = 86400`, `epoch_s = 30`;
- `[[clusters.pools]]`: `nodes = 0`, `max_nodes = nodes` (no autoscaling unless asked),
  `spot = false`;
- cloud `zones`: one zone named after the region; edge/onprem: one zone, the site name;
- `[clusters.capacity]`: `gpu = 0`, `gpu_interconnect = "pcie"`, `price_per_hour = 0`,
  `uplink_gbps = 1.0`;
- `[[faults]]`: `at_s` is the mean start time (a seeded run moves it within +-10 min,
  sim/realize.py); `duration_s` absent means until the horizon; `spot_reclaim` takes an optional
  `nodes` (default 1) and `pool` (instance type; default: every spot pool of the target);
- trace columns other than `id, submit_s, kind` may be omitted: `tenant = "default"`,
  `replicas = 1`, numbers 0, `image_gb = 0.5`, `priority = 0`.

Prices and node shapes of cloud pools come from the catalog (`instance_type`);
edge and onprem capacity from the file.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from broker.domain import Interconnect, Resources
from broker.sim.trace import (
    REQUIRED_TRACE_COLUMNS,
    TRACE_COLUMNS,
    TRACE_KINDS,
    ScenarioError,
    TraceEvent,
    load_trace,
    parse_trace,
)
from providers.base import Offer, Region
from providers.errors import NotFoundError

__all__ = [
    "REQUIRED_TRACE_COLUMNS", "TRACE_COLUMNS", "TRACE_KINDS", "CatalogLike", "ClusterSpec",
    "Defaults", "FaultSpec", "PoolSpec", "Realization", "Scenario", "ScenarioError", "TraceEvent",
    "UserRegionSpec", "load_scenario", "load_trace", "parse_scenario", "parse_trace",
]

CLOUD_PROVIDERS = frozenset({"aws", "gcp", "azure"})
FIXED_PROVIDERS = frozenset({"onprem", "edge"})
FAULT_KINDS = frozenset({"site_down", "partition", "spot_reclaim", "quota_cut", "price_change"})
# When the catalog has no spot price (AWS: see shared/data/SOURCES.md "Known gaps"), the twin
# assumes spot = 35 % of on-demand: AWS advertises "up to 90 %" off and its Spot Instance
# Advisor lists typical savings of 60-75 % for general-purpose types. Documented in docs/twin.md.
SPOT_FRACTION_FALLBACK = 0.35


class CatalogLike(Protocol):
    """What the twin needs from `providers.catalog.Catalog` (structural, so tests can fake it)."""

    def offer(self, provider: str, region: str, instance_type: str) -> Offer: ...

    def region(self, provider: str, name: str) -> Region: ...

    def rtt_ms(self, a: str, b: str) -> tuple[float, str]: ...

    def egress_usd_per_gb(self, src: str, dst: str) -> float: ...

    def throughput_gbps(self, src: str, dst: str) -> float: ...


@dataclass(frozen=True, slots=True)
class Defaults:
    provision_delay_s: float = 120.0
    image_pull_gbps: float = 1.0
    network_gbps: float = 10.0


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    instance_type: str
    node: Resources
    nodes: int
    max_nodes: int
    spot: bool
    price_usd_per_hour: float  # per node, at this pool's pricing (spot or on-demand)
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    provider: str
    region: str
    zones: tuple[str, ...]
    lat: float
    lon: float
    pools: tuple[PoolSpec, ...]
    quota_vcpu: float | None = None
    uplink_gbps: float | None = None  # edge/onprem sites

    @property
    def region_key(self) -> str:
        return f"{self.provider}:{self.region}"

    @property
    def fixed(self) -> bool:
        return self.provider in FIXED_PROVIDERS


@dataclass(frozen=True, slots=True)
class UserRegionSpec:
    name: str
    lat: float
    lon: float


@dataclass(frozen=True, slots=True)
class FaultSpec:
    at_s: float
    target: str
    kind: str
    duration_s: float | None = None
    factor: float = 1.0
    quota_vcpu: float = 0.0
    nodes: int = 1
    pool: str | None = None
    # A seeded run moves `at_s` (sim/realize.py, fault timing); False keeps it as written
    # (a `--whatif` counterfactual, whose time the user chose). Not a scenario key.
    jitter: bool = True


@dataclass(frozen=True, slots=True)
class Realization:
    """Marks a Scenario whose events are one seeded run's (broker/sim/realize.py)."""

    seed: int
    arrival_jitter_s: float
    duration_sigma: float
    duration_prediction_mape: float | None  # over the trace's batch/train jobs; None if none
    jobs: int  # batch/train events with a run time (the MAPE's sample)
    fault_jitter_s: float = 0.0  # the scripted faults' start times moved within +-this


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    horizon_s: float
    epoch_s: float
    defaults: Defaults
    clusters: tuple[ClusterSpec, ...]
    user_regions: tuple[UserRegionSpec, ...]
    faults: tuple[FaultSpec, ...]
    events: tuple[TraceEvent, ...]
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    realization: Realization | None = None  # None: the trace as written, not yet realized

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)


# --------------------------------------------------------------------------- TOML helpers


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ScenarioError(f"unknown key {key!r} in {where} (allowed: {sorted(allowed)})")


def _num(table: Mapping[str, Any], key: str, where: str, default: float | None = None, *,
         minimum: float | None = None, positive: bool = False) -> float:
    if key not in table:
        if default is None:
            raise ScenarioError(f"missing required key {key!r} in {where}")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(f"{where}.{key} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ScenarioError(f"{where}.{key} must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise ScenarioError(f"{where}.{key} must be >= {minimum}, got {value!r}")
    return float(value)


def _int(table: Mapping[str, Any], key: str, where: str, default: int | None = None,
         *, minimum: int = 0) -> int:
    if key not in table:
        if default is None:
            raise ScenarioError(f"missing required key {key!r} in {where}")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}.{key} must be >= {minimum}, got {value!r}")
    return value


def _str(table: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    if key not in table:
        if default is None:
            raise ScenarioError(f"missing required key {key!r} in {where}")
        return default
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


def _tables(doc: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ScenarioError(f"{where}{key} must be an array of tables ([[{key}]])")
    return value


# --------------------------------------------------------------------------- sections


def _parse_pool(raw: Mapping[str, Any], cluster: Mapping[str, Any], where: str,
                catalog: CatalogLike) -> PoolSpec:
    _check_keys(raw, {"instance_type", "nodes", "max_nodes", "spot"}, where)
    itype = _str(raw, "instance_type", where)
    nodes = _int(raw, "nodes", where, 0)
    max_nodes = _int(raw, "max_nodes", where, nodes)
    if max_nodes < max(nodes, 1):
        raise ScenarioError(f"{where}.max_nodes must be >= max(nodes, 1), got {max_nodes}")
    spot = raw.get("spot", False)
    if not isinstance(spot, bool):
        raise ScenarioError(f"{where}.spot must be true or false, got {spot!r}")
    try:
        offer: Offer | None = catalog.offer(cluster["provider"], cluster["region"], itype)
    except NotFoundError:
        offer = None
    if offer is None or offer.price_usd_per_hour is None:
        raise ScenarioError(
            f"{where}: instance_type {itype!r} has no price in the catalog for "
            f"{cluster['provider']}:{cluster['region']}")
    price = offer.price_usd_per_hour
    if spot:
        price = (offer.spot_price_usd_per_hour if offer.spot_price_usd_per_hour is not None
                 else price * SPOT_FRACTION_FALLBACK)
    return PoolSpec(
        name=itype + ("-spot" if spot else ""), instance_type=itype,
        node=Resources(offer.vcpu, offer.memory_gib, offer.gpu_count), nodes=nodes,
        max_nodes=max_nodes, spot=spot, price_usd_per_hour=float(price),
        gpu_model=offer.gpu_model, interconnect=offer.interconnect,
    )


def _parse_capacity(raw: Any, name: str, where: str) -> PoolSpec:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}.capacity is required for edge/onprem clusters")
    w = f"{where}.capacity"
    _check_keys(raw, {"cpu", "memory_gib", "gpu", "gpu_model", "gpu_interconnect",
                      "price_per_hour", "uplink_gbps"}, w)
    gpu = _int(raw, "gpu", w, 0)
    ic_raw = _str(raw, "gpu_interconnect", w, "pcie")
    try:
        interconnect = Interconnect(ic_raw)
    except ValueError:
        raise ScenarioError(
            f"{w}.gpu_interconnect must be pcie | nvlink-pairs | nvlink-full, got {ic_raw!r}"
        ) from None
    return PoolSpec(
        name="site", instance_type="site",
        node=Resources(_num(raw, "cpu", w, positive=True),
                       _num(raw, "memory_gib", w, positive=True), gpu),
        nodes=1, max_nodes=1, spot=False,
        price_usd_per_hour=_num(raw, "price_per_hour", w, 0.0, minimum=0.0),
        gpu_model=_str(raw, "gpu_model", w) if "gpu_model" in raw else None,
        interconnect=interconnect if gpu else Interconnect.NONE,
    )


_CLUSTER_KEYS = {"name", "provider", "region", "zones", "quota_vcpu", "pools", "lat", "lon",
                 "capacity"}


def _parse_cluster(raw: Mapping[str, Any], i: int, catalog: CatalogLike) -> ClusterSpec:
    where = f"clusters[{i}]"
    _check_keys(raw, _CLUSTER_KEYS, where)
    name = _str(raw, "name", where)
    where = f"clusters[{i}] ({name})"
    provider = _str(raw, "provider", where)
    if provider not in CLOUD_PROVIDERS | FIXED_PROVIDERS:
        raise ScenarioError(f"{where}.provider must be aws | gcp | azure | onprem | edge, "
                            f"got {provider!r}")
    quota = _num(raw, "quota_vcpu", where, minimum=0.0) if "quota_vcpu" in raw else None
    zones_raw = raw.get("zones")
    if zones_raw is not None and (not isinstance(zones_raw, list) or not zones_raw
                                  or not all(isinstance(z, str) for z in zones_raw)):
        raise ScenarioError(f"{where}.zones must be a non-empty list of strings")
    if provider in CLOUD_PROVIDERS:
        region = _str(raw, "region", where)
        if "capacity" in raw:
            raise ScenarioError(f"{where}: 'capacity' is for edge/onprem; cloud uses [[pools]]")
        pools_raw = _tables(raw, "pools", f"{where}.")
        if not pools_raw:
            raise ScenarioError(f"{where}: a cloud cluster needs at least one [[clusters.pools]]")
        pools = tuple(_parse_pool(p, {"provider": provider, "region": region},
                                  f"{where}.pools[{j}]", catalog)
                      for j, p in enumerate(pools_raw))
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ScenarioError(f"{where}: two pools with the same instance_type and spot")
        if "lat" in raw and "lon" in raw:
            lat, lon = _num(raw, "lat", where), _num(raw, "lon", where)
        else:
            try:
                reg: Region | None = catalog.region(provider, region)
            except NotFoundError:
                reg = None
            if reg is None or reg.lat is None or reg.lon is None:
                raise ScenarioError(f"{where}: region {provider}:{region} has no coordinates "
                                    "in the catalog; give lat and lon")
            lat, lon = reg.lat, reg.lon
        zones = tuple(zones_raw) if zones_raw else (region,)
        return ClusterSpec(name, provider, region, zones, lat, lon, pools, quota)
    if "pools" in raw:
        raise ScenarioError(f"{where}: edge/onprem clusters use [clusters.capacity], not pools")
    pool = _parse_capacity(raw.get("capacity"), name, where)
    uplink = _num(raw["capacity"], "uplink_gbps", f"{where}.capacity", 1.0, positive=True)
    region = _str(raw, "region", where, name)
    return ClusterSpec(name, provider, region, tuple(zones_raw) if zones_raw else (name,),
                       _num(raw, "lat", where), _num(raw, "lon", where), (pool,), quota,
                       uplink_gbps=uplink)


def _parse_fault(raw: Mapping[str, Any], i: int, clusters: Mapping[str, ClusterSpec],
                 horizon_s: float) -> FaultSpec:
    where = f"faults[{i}]"
    _check_keys(raw, {"at_s", "target", "kind", "duration_s", "factor", "quota_vcpu", "nodes",
                      "pool"}, where)
    kind = _str(raw, "kind", where)
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind must be one of {sorted(FAULT_KINDS)}, got {kind!r}")
    target = _str(raw, "target", where)
    if target not in clusters:
        raise ScenarioError(f"{where}.target {target!r} is not a cluster name")
    allowed_extra = {"price_change": {"factor"}, "quota_cut": {"quota_vcpu"},
                     "spot_reclaim": {"nodes", "pool"}}.get(kind, set())
    for key in ("factor", "quota_vcpu", "nodes", "pool"):
        if key in raw and key not in allowed_extra:
            raise ScenarioError(f"{where}.{key} does not apply to kind {kind!r}")
    duration = _num(raw, "duration_s", where, positive=True) if "duration_s" in raw else None
    return FaultSpec(
        at_s=_num(raw, "at_s", where, minimum=0.0), target=target, kind=kind,
        duration_s=duration,
        factor=_num(raw, "factor", where, positive=True) if kind == "price_change" else 1.0,
        quota_vcpu=_num(raw, "quota_vcpu", where, minimum=0.0) if kind == "quota_cut" else 0.0,
        nodes=_int(raw, "nodes", where, 1, minimum=1),
        pool=_str(raw, "pool", where) if "pool" in raw else None,
    )


def parse_scenario(doc: Mapping[str, Any], catalog: CatalogLike, *,
                   base_dir: Path | None = None,
                   events: tuple[TraceEvent, ...] | None = None,
                   source: str = "") -> Scenario:
    """Build a Scenario from a parsed TOML document. `events` overrides the trace file."""
    _check_keys(doc, {"name", "seed", "horizon_s", "epoch_s", "defaults", "clusters",
                      "user_regions", "faults", "workloads"}, "the top level")
    name = _str(doc, "name", "the top level")
    horizon_s = _num(doc, "horizon_s", "the top level", 86400.0, positive=True)
    epoch_s = _num(doc, "epoch_s", "the top level", 30.0, positive=True)
    dflt_raw = doc.get("defaults", {})
    if not isinstance(dflt_raw, dict):
        raise ScenarioError("[defaults] must be a table")
    _check_keys(dflt_raw, {"provision_delay_s", "image_pull_gbps", "network_gbps"}, "[defaults]")
    defaults = Defaults(
        provision_delay_s=_num(dflt_raw, "provision_delay_s", "defaults", 120.0, minimum=0.0),
        image_pull_gbps=_num(dflt_raw, "image_pull_gbps", "defaults", 1.0, positive=True),
        network_gbps=_num(dflt_raw, "network_gbps", "defaults", 10.0, positive=True),
    )
    clusters = tuple(_parse_cluster(c, i, catalog)
                     for i, c in enumerate(_tables(doc, "clusters", "")))
    if not clusters:
        raise ScenarioError("a scenario needs at least one [[clusters]]")
    by_name = {c.name: c for c in clusters}
    if len(by_name) != len(clusters):
        raise ScenarioError("two [[clusters]] share a name")
    users = []
    for i, u in enumerate(_tables(doc, "user_regions", "")):
        w = f"user_regions[{i}]"
        _check_keys(u, {"name", "lat", "lon"}, w)
        users.append(UserRegionSpec(_str(u, "name", w), _num(u, "lat", w), _num(u, "lon", w)))
    faults = tuple(_parse_fault(f, i, by_name, horizon_s)
                   for i, f in enumerate(_tables(doc, "faults", "")))
    if events is None:
        wl = doc.get("workloads")
        if not isinstance(wl, dict):
            raise ScenarioError("missing [workloads] table with trace = \"trace.csv\"")
        _check_keys(wl, {"trace"}, "[workloads]")
        trace_path = (base_dir or Path(".")) / _str(wl, "trace", "[workloads]")
        events = load_trace(trace_path, user_regions={u.name for u in users},
                            clusters=clusters)
    return Scenario(name=name, seed=_int(doc, "seed", "the top level", 0), horizon_s=horizon_s,
                    epoch_s=epoch_s, defaults=defaults, clusters=clusters,
                    user_regions=tuple(users), faults=faults, events=events, source=source)


def load_scenario(path: str | Path, catalog: CatalogLike) -> Scenario:
    """Read `scenario.toml` and its trace; raises ScenarioError naming what is wrong."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{p}: not valid TOML: {exc}") from exc
    return parse_scenario(doc, catalog, base_dir=p.parent, source=str(p))
