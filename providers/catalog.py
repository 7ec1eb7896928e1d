"""The offline catalog: regions, instance types, prices, inter-region RTT, egress and bandwidth.

Why offline: placement must be able to price and place without credentials, and the twin and
the demo must be reproducible. Live prices (providers/aws.py etc.) are merged on top by the
quota/price sync; this catalog is the floor that is always there.

Built by ``scripts/build_catalog.py`` into ``providers/data/catalog.json.gz`` from:

- AWS: apache-libcloud 3.9.1 ``pricing.json`` (``compute.ec2_linux``, on-demand Linux) joined with
  ``libcloud/compute/constants/ec2_instance_types.py`` (vCPU, memory, GPU count). **AWS spot
  prices are null**: no offline source has them and we do not invent them.
- Azure: SkyPilot-format catalog (anycloud-sh/catalog ``azure/vms.csv`` @62ff0a98, 2026-05-20),
  on-demand and spot.
- GCP: SkyPilot-format catalog (same repo, ``gcp/vms.csv``), on-demand and spot; GPU prices are
  added to their VM (a2/a3/a4/g2 bundle GPUs; N1 + T4/V100/P100/P4 appear as
  ``n1-standard-<4n>+<n>x<GPU>``); zones collapse to the region's cheapest zone.
- RTT (PREMIUM tier, median of avg RTT), egress USD/GB and throughput: Skyplane's measured
  matrices (skyplane-project/skyplane, NSDI'23, measured 2022).
- Region coordinates: GuGuss/cloud-providers (2022) and npm cloud-regions-country-flags 1.1.4;
  39 newer regions at their named city's centre (hand-entered in the build script, flagged).

GPU model and intra-node interconnect per instance type follow the vendors' instance-type pages
(p4d/p4de/p5*/ND A100/H100/H200 v4-v5/a2/a3/a4 -> nvlink-full; p3.8xl/16xl, p3dn, NDv2 ->
nvlink-pairs; g4dn/g5/g6/NC T4/A10/V100/N1 GPUs -> pcie; single-GPU sizes -> pcie).

Fallbacks, when a pair is not measured:

- ``rtt_ms``: 0 inside a region is not realistic, so ``INTRA_REGION_RTT_MS``; otherwise the
  coordinate estimate of providers/geo.py (``source="estimated"``); NotFoundError when a side has
  no coordinates.
- ``egress_usd_per_gb``: 0 inside a region; Skyplane's price; else the source provider's list
  price for inter-region (``INTER_REGION_EGRESS_USD_PER_GB``) or internet egress
  (``INTERNET_EGRESS_USD_PER_GB``; AWS per region from Skyplane's AWS table); edge/on-prem sources
  are 0 (no metered egress on owned hardware).
- ``throughput_gbps``: Skyplane's measurement (either direction); ``INTRA_REGION_GBPS`` inside a
  region; else the median of all measured pairs.
"""

from __future__ import annotations

import gzip
import json
import statistics
import threading
from collections import defaultdict
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from providers.base import Interconnect, Offer, Region
from providers.errors import NotFoundError
from providers.geo import estimate_rtt_ms

INTRA_REGION_RTT_MS = 1.0  # same region, different zones: typically 0.5-2 ms
INTRA_REGION_GBPS = 10.0  # one VM's NIC class in the Skyplane runs (m5.8xlarge/n2-32: 10-16 Gbps)
# Published list prices, first tier (USD/GB), 2024-2025 pricing pages:
INTER_REGION_EGRESS_USD_PER_GB = {"aws": 0.02, "gcp": 0.02, "azure": 0.02}
INTERNET_EGRESS_USD_PER_GB = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}
OWNED_PROVIDERS = frozenset({"edge", "onprem"})

_PACKAGE_DATA = "data/catalog.json.gz"
_cache: dict[str, Catalog] = {}
_lock = threading.Lock()


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


class Catalog:
    """Read-only view of the shipped catalog; cheap to query, built once per file."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw
        self._regions: dict[tuple[str, str], Region] = {}
        for p, n, lat, lon, disp in raw["regions"]:
            self._regions[(p, n)] = Region(provider=p, name=n, lat=lat, lon=lon, display_name=disp)
        self._rtt = {_pair(a, b): float(ms) for a, b, ms in raw["rtt"]}
        self._egress = {(a, b): float(c) for a, b, c in raw["egress"]}
        self._tput = {(a, b): float(g) for a, b, g in raw["throughput"]}
        self.fit: dict[str, Any] = raw.get("fit", {})
        self.sources: dict[str, str] = raw.get("sources", {})

    @classmethod
    def load(cls, path: Path | None = None) -> Catalog:
        """The catalog at `path` (default: the package data), parsed once per process."""
        key = str(path) if path else "<package>"
        with _lock:
            if key not in _cache:
                src = Path(path) if path else Path(__file__).parent / _PACKAGE_DATA
                try:
                    blob = src.read_bytes()
                except OSError as exc:
                    raise NotFoundError(f"cannot read catalog {src}: {exc}") from exc
                _cache[key] = cls(json.loads(gzip.decompress(blob)))
            return _cache[key]

    # ---- regions -----------------------------------------------------------------------
    @property
    def providers(self) -> list[str]:
        return sorted({p for p, _ in self._regions})

    def _check_provider(self, provider: str) -> None:
        if provider not in self.providers:
            raise NotFoundError(
                f"unknown provider {provider!r} (catalog has: {', '.join(self.providers)})",
                provider=provider,
            )

    def regions(self, provider: str | None = None) -> list[Region]:
        if provider is not None:
            self._check_provider(provider)
        return [r for (p, _), r in sorted(self._regions.items()) if provider in (None, p)]

    def region(self, provider: str, name: str) -> Region:
        self._check_provider(provider)
        try:
            return self._regions[(provider, name)]
        except KeyError:
            raise NotFoundError(
                f"unknown region {name!r} for provider {provider!r}", provider=provider,
                region=name,
            ) from None

    # ---- offers ------------------------------------------------------------------------
    @cached_property
    def _offers(self) -> dict[str, dict[str, list[Offer]]]:
        out: dict[str, dict[str, list[Offer]]] = {}
        for provider, rows in self._raw["prices"].items():
            types = self._raw["types"][provider]
            by_region: dict[str, list[Offer]] = defaultdict(list)
            for it, region, price, spot in rows:
                vcpu, mem, gc, model, ic = types[it]
                by_region[region].append(Offer(
                    provider=provider, region=region, instance_type=it, vcpu=float(vcpu),
                    memory_gib=float(mem), gpu_count=int(gc), gpu_model=model,
                    interconnect=Interconnect(ic), price_usd_per_hour=price,
                    spot_price_usd_per_hour=spot, source="catalog",
                ))
            out[provider] = dict(by_region)
        return out

    @cached_property
    def gpu_models(self) -> frozenset[str]:
        return frozenset(
            t[3] for types in self._raw["types"].values() for t in types.values() if t[3]
        )

    def offers(
        self, *, provider: str | None = None, region: str | None = None,
        gpu: str | None = None, instance_type: str | None = None,
    ) -> list[Offer]:
        """Offers matching every given filter; unknown provider/region/GPU raise NotFoundError.

        `gpu` matches the model name case-insensitively (``A100`` does not match ``A100-80GB``).
        An unknown instance type simply matches nothing (use `offer()` to insist on one).
        """
        if provider is not None:
            self._check_provider(provider)
            if region is not None:
                self.region(provider, region)
        elif region is not None and not any(n == region for _, n in self._regions):
            raise NotFoundError(f"unknown region {region!r}", region=region)
        want_gpu = None
        if gpu is not None:
            known = {g.lower(): g for g in self.gpu_models}
            if gpu.lower() not in known:
                raise NotFoundError(
                    f"unknown GPU model {gpu!r} (catalog has: {', '.join(sorted(known.values()))})"
                )
            want_gpu = known[gpu.lower()]
        result: list[Offer] = []
        for p, by_region in sorted(self._offers.items()):
            if provider not in (None, p):
                continue
            groups: Iterable[list[Offer]] = (
                [by_region.get(region, [])] if region is not None
                else (by_region[r] for r in sorted(by_region))
            )
            for group in groups:
                result.extend(
                    o for o in group
                    if (want_gpu is None or o.gpu_model == want_gpu)
                    and (instance_type is None or o.instance_type == instance_type)
                )
        return result

    def offer(self, provider: str, region: str, instance_type: str) -> Offer:
        found = self.offers(provider=provider, region=region, instance_type=instance_type)
        if not found:
            raise NotFoundError(
                f"unknown instance type {instance_type!r} in {provider}:{region}",
                provider=provider, region=region,
            )
        return found[0]

    # ---- network -----------------------------------------------------------------------
    def _coords(self, key: str) -> tuple[float, float]:
        provider, _, name = key.partition(":")
        if not name:
            raise NotFoundError(f"region key {key!r} is not 'provider:region'")
        r = self.region(provider, name)
        if r.lat is None or r.lon is None:
            raise NotFoundError(
                f"no measured RTT and no coordinates for {key!r}", provider=provider, region=name,
            )
        return r.lat, r.lon

    def rtt_ms(self, a: str, b: str) -> tuple[float, str]:
        """RTT between two ``provider:region`` keys and whether it was measured or estimated."""
        if a == b:
            self._coords_or_known(a)
            return INTRA_REGION_RTT_MS, "estimated"
        measured = self._rtt.get(_pair(a, b))
        if measured is not None:
            return measured, "measured"
        (la, oa), (lb, ob) = self._coords(a), self._coords(b)
        return round(estimate_rtt_ms(la, oa, lb, ob), 3), "estimated"

    def _coords_or_known(self, key: str) -> None:
        provider, _, name = key.partition(":")
        self.region(provider, name)

    def egress_usd_per_gb(self, src: str, dst: str) -> float:
        """USD per GB leaving `src` towards `dst` (see module docstring for fallbacks)."""
        if src == dst:
            return 0.0
        sp, dp = src.partition(":")[0], dst.partition(":")[0]
        if sp in OWNED_PROVIDERS:
            return 0.0
        if (src, dst) in self._egress:
            return self._egress[(src, dst)]
        if sp == dp:
            return INTER_REGION_EGRESS_USD_PER_GB.get(sp, 0.02)
        internet = self._egress.get((src, "internet"))
        if internet is not None:
            return internet
        return INTERNET_EGRESS_USD_PER_GB.get(sp, max(INTERNET_EGRESS_USD_PER_GB.values()))

    @cached_property
    def _median_gbps(self) -> float:
        return statistics.median(self._tput.values()) if self._tput else INTRA_REGION_GBPS

    def throughput_gbps(self, src: str, dst: str) -> float:
        """Measured single-VM-pair bandwidth (Skyplane, 64 TCP connections) or a fallback."""
        if src == dst:
            return INTRA_REGION_GBPS
        for k in ((src, dst), (dst, src)):
            if k in self._tput:
                return self._tput[k]
        return round(self._median_gbps, 3)
