"""A catalog-priced cloud account without an API: the CloudProvider the demo, the twin and
the sync tests use.

Why: quota/price sync and the actuator's node orders must be exercised without a cloud
account, with the same contract as providers/aws.py (regions, offers with prices, quotas,
`scale_pool` growing to a count within the vCPU quota, `remove_nodes` of named machines).
Prices come from the offline catalog (times `price_factor`); faults (`error_rate`:
throttling, 5xx, timeouts, equally) come from a seeded RNG before any state changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from providers.base import Capability, Offer, Quota, Region
from providers.catalog import Catalog
from providers.cloud import new_names
from providers.errors import (
    NotFoundError,
    QuotaExceededError,
    ThrottledError,
    TransientError,
)


@dataclass(slots=True)
class SimulatedCloudOptions:
    """A catalog-priced cloud account without an API: for the demo, the twin and sync tests."""

    provider: str = "aws"  # whose catalog prices and regions to serve
    regions: tuple[str, ...] = ("us-east-1",)
    quota_vcpu: float = 1000.0
    quota_gpu: float = 64.0
    price_factor: float = 1.0  # multiply catalog prices (price_change scenarios)
    error_rate: float = 0.0  # share of calls that fail (throttle / 5xx / timeout, equally)
    timeout_s: float = 0.05  # how long an injected timeout hangs before failing
    seed: int = 0
    instance_types: tuple[str, ...] = ()  # serve only these (empty: the whole catalog)


class SimulatedCloudProvider:
    """CloudProvider over the offline catalog, with quotas and fault injection in memory."""

    capabilities = frozenset({Capability.LIST_REGIONS, Capability.LIST_OFFERS,
                              Capability.QUOTAS, Capability.SCALE_POOL})

    def __init__(self, options: SimulatedCloudOptions | None = None,
                 *, catalog: Catalog | None = None) -> None:
        self.options = options or SimulatedCloudOptions()
        self.name = self.options.provider
        self._catalog = catalog
        self._rng = random.Random(self.options.seed)
        # (region, pool, the group's labels) -> machines; -> vCPUs per machine
        self._pools: dict[tuple[str, str, Labels], list[str]] = {}
        self._vcpu: dict[tuple[str, str, Labels], float] = {}
        self._used_vcpu: dict[str, float] = {}
        self.calls = 0

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.load()
        return self._catalog

    async def _maybe_fail(self, region: str) -> None:
        self.calls += 1
        if self.options.error_rate <= 0 or self._rng.random() >= self.options.error_rate:
            return
        kind = self._rng.randrange(3)
        if kind == 0:
            raise ThrottledError("injected 429", provider=self.name, region=region)
        if kind == 1:
            raise TransientError("injected 503", provider=self.name, region=region)
        await asyncio.sleep(self.options.timeout_s)
        raise TransientError(f"injected timeout after {self.options.timeout_s:g} s",
                             provider=self.name, region=region)

    def _check_region(self, region: str) -> None:
        if region not in self.options.regions:
            raise NotFoundError(f"region {region!r} is not enabled for this account",
                                provider=self.name, region=region)

    async def list_regions(self) -> list[Region]:
        await self._maybe_fail("")
        return [self.catalog.region(self.name, r) for r in self.options.regions]

    async def list_offers(self, *, region: str) -> list[Offer]:
        self._check_region(region)
        await self._maybe_fail(region)
        f = self.options.price_factor
        return [
            dataclasses.replace(
                o,
                price_usd_per_hour=None if o.price_usd_per_hour is None
                else round(o.price_usd_per_hour * f, 6),
                spot_price_usd_per_hour=None if o.spot_price_usd_per_hour is None
                else round(o.spot_price_usd_per_hour * f, 6),
                source="live",
            )
            for o in self.catalog.offers(provider=self.name, region=region)
            if not self.options.instance_types or o.instance_type in self.options.instance_types
        ]

    async def get_quotas(self, *, region: str) -> list[Quota]:
        self._check_region(region)
        await self._maybe_fail(region)
        return [
            Quota(provider=self.name, region=region, metric="vcpu",
                  limit=self.options.quota_vcpu, used=self._used_vcpu.get(region, 0.0)),
            Quota(provider=self.name, region=region, metric="gpu", limit=self.options.quota_gpu),
        ]

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str], spot: bool = False, order: str = "",
    ) -> int:
        self._check_region(region)
        offer = self.catalog.offer(self.name, region, instance_type)
        await self._maybe_fail(region)
        key = (region, pool, _labels(labels))
        current = self._pools.get(key, [])
        add = max(0, nodes - len(current))  # grows only (CloudProvider.scale_pool)
        used = self._used_vcpu.get(region, 0.0) + add * offer.vcpu
        if used > self.options.quota_vcpu:
            raise QuotaExceededError(
                f"{nodes} x {instance_type} would use {used:g} vCPUs "
                f"> quota {self.options.quota_vcpu:g}", provider=self.name, region=region,
            )
        # A machine's name is unique in the region, as a GCE instance's in its zone.
        taken = [m for (r, _p, _l), ms in self._pools.items() if r == region for m in ms]
        self._pools[key] = sorted(current + new_names(f"skyfed-{pool}", taken, add))
        self._vcpu[key] = offer.vcpu
        self._used_vcpu[region] = used
        return len(self._pools[key])

    async def remove_nodes(self, *, region: str, pool: str, nodes: Sequence[str],
                           labels: Mapping[str, str] | None = None) -> int:
        """Remove the named machines of `pool` (`skyfed-<pool>-<i>`), never another."""
        self._check_region(region)
        await self._maybe_fail(region)
        key = (region, pool, _labels(labels))
        current = self._pools.get(key, [])
        keep = [m for m in current if m not in set(nodes)]
        self._pools[key] = keep
        self._used_vcpu[region] = self._used_vcpu.get(region, 0.0) - \
            (len(current) - len(keep)) * self._vcpu.get(key, 0.0)
        return len(keep)

    def machines(self, region: str, pool: str,
                 labels: Mapping[str, str] | None = None) -> list[str]:
        """The names of `pool`'s machines (what `remove_nodes` takes)."""
        return list(self._pools.get((region, pool, _labels(labels)), []))


Labels = tuple[tuple[str, str], ...]


def _labels(labels: Mapping[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))
