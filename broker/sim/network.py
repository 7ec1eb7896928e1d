"""Where bytes go in the twin: RTT tables, location keys and data-move time/cost. Pure.

Catalog first (Skyplane-measured RTT, throughput and egress via providers/catalog.py), the
coordinate estimate of providers/geo.py or physics.THROUGHPUT_FALLBACK_GBPS otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from broker.sim import physics
from broker.sim.scenario import CatalogLike, ClusterSpec, Scenario, TraceEvent
from providers.errors import ProviderError
from providers.geo import estimate_rtt_ms


def user_rtt_table(scenario: Scenario) -> dict[tuple[str, str], float]:
    """RTT in ms between every user region and cluster, both key orders."""
    table: dict[tuple[str, str], float] = {}
    for u in scenario.user_regions:
        for c in scenario.clusters:
            ms = estimate_rtt_ms(u.lat, u.lon, c.lat, c.lon)
            table[(u.name, c.name)] = table[(c.name, u.name)] = ms
    return table


def cluster_rtt_ms(a: ClusterSpec, b: ClusterSpec, catalog: CatalogLike | None) -> float:
    if catalog is not None and not a.fixed and not b.fixed:
        with contextlib.suppress(ProviderError):
            return catalog.rtt_ms(a.region_key, b.region_key)[0]
    return estimate_rtt_ms(a.lat, a.lon, b.lat, b.lon)


def location_key(loc: str, clusters: Mapping[str, ClusterSpec]) -> str:
    """`provider:region` of a trace location (a cluster name, a region, or already a key)."""
    if loc in clusters:
        return clusters[loc].region_key
    if ":" in loc:
        return loc
    for c in clusters.values():
        if c.region == loc:
            return c.region_key
    return loc


@dataclass(frozen=True, slots=True)
class DataMove:
    seconds: float
    gb: float
    cross_region: bool
    egress_usd: float


def egress_rate(src_key: str, dst_key: str, catalog: CatalogLike | None) -> float:
    """USD per GB the twin charges for moving data from `src_key` to `dst_key` (both
    `provider:region`): the catalog's price (its own fallbacks included), 0 in one region."""
    if src_key == dst_key or catalog is None:
        return 0.0
    with contextlib.suppress(ProviderError):
        return float(catalog.egress_usd_per_gb(src_key, dst_key))
    return 0.0


def egress_table(scenario: Scenario, catalog: CatalogLike | None) -> dict[tuple[str, str], float]:
    """The egress prices the planner sees in the twin's snapshot: every data location of the
    trace (as written, and as its `provider:region` key) to every cluster's region, at the
    rate `data_move` charges. Without it the planner priced moves with its fallback constants
    (candidates.egress_usd_per_gb: 0.09 USD/GB across providers) while the twin charged the
    catalog's (0.12 from GCP), so it bought moves the twin then billed higher."""
    clusters = {c.name: c for c in scenario.clusters}
    dsts = {c.region_key for c in scenario.clusters}
    table: dict[tuple[str, str], float] = {}
    for loc in sorted({e.data_region for e in scenario.events if e.data_region}):
        src = location_key(loc, clusters)
        for dst in dsts:
            table[(loc, dst)] = table[(src, dst)] = egress_rate(src, dst, catalog)
    return table


def data_move(ev: TraceEvent, dst: ClusterSpec, clusters: Mapping[str, ClusterSpec],
              catalog: CatalogLike | None, network_gbps: float) -> DataMove:
    """Moving a workload's input to `dst`: min(node NIC, measured pair throughput, uplink)."""
    if ev.data_gb <= 0 or not ev.data_region:
        return DataMove(0.0, 0.0, False, 0.0)
    src = location_key(ev.data_region, clusters)
    dst_key = dst.region_key
    gbps = network_gbps
    cross = src != dst_key
    egress = egress_rate(src, dst_key, catalog)
    if cross:
        tput = physics.THROUGHPUT_FALLBACK_GBPS
        if catalog is not None:
            with contextlib.suppress(ProviderError):
                tput = catalog.throughput_gbps(src, dst_key)
        gbps = min(gbps, tput)
        if dst.uplink_gbps is not None:
            gbps = min(gbps, dst.uplink_gbps)
    return DataMove(physics.transfer_s(ev.data_gb, gbps), ev.data_gb, cross,
                    ev.data_gb * egress)
