"""Network maps for a snapshot: RTTs, throughput and egress prices between places. Pure.

One rule for both shells (the live placement loop and the twin), so the planner and the
policy's observation see the same numbers for the same federation:

- cluster <-> cluster RTT: the catalog's (Skyplane-measured, else coordinate estimate) for two
  cloud regions; the great-circle estimate of providers/geo.py when either end is fixed
  hardware (edge / on-prem: the catalog does not know it) or the catalog has no answer.
- cluster <-> cluster throughput: the catalog's measured single-VM-pair bandwidth between two
  cloud regions, else `THROUGHPUT_FALLBACK_GBPS`.
- user region -> cluster RTT and data -> cluster egress: the catalog's, for `provider:region`
  keys it knows (the planner estimates the rest from coordinates, RttResolver below).

The catalog is passed in (a loaded `providers.catalog.Catalog` or the twin's fake): lookups
only, no I/O here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Protocol

from broker.domain import Cluster, FederationSnapshot, Workload
from providers.base import Region
from providers.errors import ProviderError
from providers.geo import RTT_FLOOR_MS, estimate_rtt_ms

# Where neither end is a cloud region the catalog measured: Skyplane's median inter-region
# single-VM-pair throughput is a few Gbit/s (Jain et al., NSDI 2023, fig. 2).
THROUGHPUT_FALLBACK_GBPS = 2.0
# Fixed hardware: edge sites and on-prem clusters (no catalog entry, paid whether used or not).
FIXED_PROVIDERS = frozenset({"edge", "onprem"})
CLOUD_PROVIDERS = frozenset({"aws", "gcp", "azure"})

Pair = tuple[str, str]


class NetworkCatalog(Protocol):
    """What the maps need from `providers.catalog.Catalog` (structural: the twin fakes it)."""

    def region(self, provider: str, name: str) -> Region: ...

    def rtt_ms(self, a: str, b: str) -> tuple[float, str]: ...

    def egress_usd_per_gb(self, src: str, dst: str) -> float: ...

    def throughput_gbps(self, src: str, dst: str) -> float: ...


def is_fixed(cluster: Cluster) -> bool:
    return cluster.provider in FIXED_PROVIDERS


def cluster_rtt_ms(a: Cluster, b: Cluster, catalog: NetworkCatalog | None) -> float | None:
    """RTT between two clusters (see the module docstring); None without coordinates."""
    if catalog is not None and not is_fixed(a) and not is_fixed(b):
        with contextlib.suppress(ProviderError):
            return catalog.rtt_ms(a.region_key, b.region_key)[0]
    if a.lat is None or a.lon is None or b.lat is None or b.lon is None:
        return None
    return estimate_rtt_ms(a.lat, a.lon, b.lat, b.lon)


def cluster_gbps(a: Cluster, b: Cluster, catalog: NetworkCatalog | None) -> float:
    if catalog is not None and not is_fixed(a) and not is_fixed(b):
        with contextlib.suppress(ProviderError):
            return catalog.throughput_gbps(b.region_key, a.region_key)
    return THROUGHPUT_FALLBACK_GBPS


def cluster_pairs(clusters: Sequence[Cluster], catalog: NetworkCatalog | None
                  ) -> tuple[dict[Pair, float], dict[Pair, float]]:
    """RTT (ms) and throughput (Gbit/s) between every two clusters, keyed by names, both orders.

    Quadratic in clusters; both shells compute it once per topology and reuse it.
    """
    rtt: dict[Pair, float] = {}
    gbps: dict[Pair, float] = {}
    for i, a in enumerate(clusters):
        for b in clusters[i + 1:]:
            ms = cluster_rtt_ms(a, b, catalog)
            if ms is not None:
                rtt[(a.name, b.name)] = rtt[(b.name, a.name)] = ms
            gbps[(a.name, b.name)] = gbps[(b.name, a.name)] = cluster_gbps(a, b, catalog)
    return rtt, gbps


def batch_maps(catalog: NetworkCatalog | None, clusters: Iterable[Cluster],
               pending: Iterable[Workload]) -> tuple[dict[Pair, float], dict[Pair, float]]:
    """Catalog RTTs (user region -> cloud cluster) and egress prices (data -> cloud cluster).

    Keys are `provider:region`; only regions the catalog knows appear (the rest fall back to
    the planner's coordinate estimate and documented egress constants).
    """
    rtt: dict[Pair, float] = {}
    egress: dict[Pair, float] = {}
    if catalog is None:
        return rtt, egress
    members = list(clusters)
    keys = {c.region_key for c in members if c.provider in CLOUD_PROVIDERS}
    by_name = {c.name: c.region_key for c in members}
    batch = list(pending)
    users = {w.spec.user_region for w in batch if w.spec.user_region and ":" in w.spec.user_region}
    # Data named by its cluster is priced from that cluster's region (the key
    # candidates.egress_usd_per_gb looks up), not left to the fallback constants.
    sources = {d.location if ":" in d.location else by_name[d.location]
               for w in batch for d in w.spec.data if ":" in d.location or d.location in by_name}
    for a in users:
        for b in keys:
            with contextlib.suppress(ProviderError):
                rtt[(a, b)] = catalog.rtt_ms(a, b)[0]
    for a in sources:
        for b in keys:
            with contextlib.suppress(ProviderError):
                egress[(a, b)] = catalog.egress_usd_per_gb(a, b)
    return rtt, egress


class RttResolver:
    """RTT between a user region and a cluster: measured first, else estimated.

    Measured values (`snapshot.rtt_ms`) are looked up under the user region's
    name and the cluster's name or `provider:region` key, in both orders.
    Otherwise the great-circle estimate of providers.geo is used, from the
    user region's coordinates (a `UserRegion` name, or a `provider:region` key
    of a cluster with coordinates). None when neither is known.
    """

    def __init__(self, snapshot: FederationSnapshot,
                 cache: dict[tuple[str, str], float | None] | None = None) -> None:
        """`cache`: resolved RTTs to reuse and add to (a `memo.PlanMemo`'s, valid for this
        snapshot's maps and places); else a new one for this resolver alone."""
        self._snapshot = snapshot
        self._coords_map: dict[str, tuple[float, float]] | None = None
        self._cache: dict[tuple[str, str], float | None] = {} if cache is None else cache

    @property
    def _coords(self) -> dict[str, tuple[float, float]]:
        """Coordinates by user-region name, cluster name and region key (built on first
        use: a resolver whose answers are all cached never needs them)."""
        coords = self._coords_map
        if coords is None:
            snapshot = self._snapshot
            coords = {u.name: (u.lat, u.lon) for u in snapshot.user_regions}
            for c in snapshot.clusters:
                if c.lat is not None and c.lon is not None:
                    coords.setdefault(c.region_key, (c.lat, c.lon))
                    coords.setdefault(c.name, (c.lat, c.lon))
            self._coords_map = coords
        return coords

    def rtt_ms(self, user_region: str, cluster: Cluster) -> float | None:
        key = (user_region, cluster.name)
        if key not in self._cache:
            self._cache[key] = self._resolve(user_region, cluster)
        return self._cache[key]

    def _resolve(self, user_region: str, cluster: Cluster) -> float | None:
        measured = self._snapshot.rtt_ms
        for other in (cluster.name, cluster.region_key):
            for pair in ((user_region, other), (other, user_region)):
                if pair in measured:
                    return float(measured[pair])
        if user_region in (cluster.region_key, cluster.name):
            return RTT_FLOOR_MS
        src = self._coords.get(user_region)
        if src is None or cluster.lat is None or cluster.lon is None:
            return None
        return estimate_rtt_ms(src[0], src[1], cluster.lat, cluster.lon)
