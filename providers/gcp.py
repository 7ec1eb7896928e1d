"""Google Compute Engine as a CloudProvider, on libcloud's GCE driver.

- Regions: ``regions.list`` (live), coordinates from the catalog.
- Offers: machine types of the region's first zone (libcloud prices them from its bundled
  per-vCPU/GB table where it can) merged onto the catalog (which adds GPU machine types and spot).
- Quotas: the region resource's ``quotas`` (``CPUS`` -> ``vcpu``, ``INSTANCES`` -> ``instances``,
  ``NVIDIA_<X>_GPUS`` -> ``gpu:<X>``, the rest under their GCE metric name, lowercased).
- scale_pool: instances labelled ``skyfed-io-pool=<pool>`` (GCE label keys allow no ``.``/``/``)
  in the region's first zone are created until the pool has at least the requested count;
  remove_nodes deletes exactly the named instances of the pool.

Auth: a service account (``auth_type="SA"``, ``client_email`` + key file), an installed-app
token (``"IA"``) or the metadata server on GCE (``"GCE"``); libcloud caches the token in
``credential_file``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.base import Capability, Offer, Quota, Region
from providers.catalog import Catalog
from providers.cloud import LibcloudBase, matching, new_names
from providers.errors import ConfigError, NotFoundError

POOL_LABEL = "skyfed-io-pool"


@dataclass(frozen=True, slots=True)
class GcpOptions:
    project: str
    client_email: str = ""
    key: str = field(default="", repr=False)  # path to the SA key file, or the IA client secret
    auth_type: str = "SA"  # SA | IA | GCE
    credential_file: str | None = None  # libcloud's token cache
    regions: tuple[str, ...] = ("us-central1",)
    image: str = "debian-12"  # image family/name used by scale_pool
    endpoint_host: str | None = None  # only for tests / private endpoints
    endpoint_port: int | None = None
    secure: bool = True
    max_concurrency: int = 4
    timeout_s: float = 30.0


def _quota_metric(metric: str) -> str:
    if metric == "CPUS":
        return "vcpu"
    if metric == "INSTANCES":
        return "instances"
    m = re.fullmatch(r"(?:PREEMPTIBLE_)?NVIDIA_(.+)_GPUS", metric)
    if m:
        prefix = "preemptible_gpu" if metric.startswith("PREEMPTIBLE") else "gpu"
        return f"{prefix}:{m.group(1)}"
    return metric.lower()


def _label_value(v: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", v.lower())[:63]


def _gce_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` as GCE label keys and values allow them (no `.`, `/`, capitals)."""
    return {re.sub(r"[^a-z0-9_-]", "-", k.lower()): _label_value(v) for k, v in labels.items()}


class GcpProvider(LibcloudBase):
    name = "gcp"
    capabilities = frozenset({Capability.LIST_REGIONS, Capability.LIST_OFFERS,
                              Capability.LIVE_PRICES, Capability.QUOTAS, Capability.SCALE_POOL})

    def __init__(self, options: GcpOptions, *, catalog: Catalog | None = None) -> None:
        super().__init__(max_concurrency=options.max_concurrency, timeout_s=options.timeout_s,
                         catalog=catalog)
        self._opts = options
        self._drv: Any = None

    def __repr__(self) -> str:
        return f"GcpProvider(project={self._opts.project!r})"

    def _make_driver(self) -> Any:
        from libcloud.compute.providers import Provider, get_driver

        o = self._opts
        if o.auth_type not in ("SA", "IA", "GCE"):
            raise ConfigError(f"GcpOptions.auth_type must be SA, IA or GCE, not {o.auth_type!r}",
                              provider="gcp")
        drv: Any = get_driver(Provider.GCE)(
            o.client_email, o.key, project=o.project, auth_type=o.auth_type,
            credential_file=o.credential_file, timeout=o.timeout_s,
        )
        if o.endpoint_host:
            conn = drv.connection
            conn.host, conn.port, conn.secure = o.endpoint_host, o.endpoint_port, o.secure
            conn.connect()
        return drv

    async def _driver(self) -> Any:
        if self._drv is None:
            self._drv = await self._call(self._make_driver)
        return self._drv

    async def _zone(self, region: str) -> Any:
        drv = await self._driver()
        reg = await self._region(region)
        zones = sorted(z.name for z in reg.zones if z is not None and getattr(z, "name", None))
        if not zones:
            raise NotFoundError(f"region {region!r} has no zones", provider="gcp", region=region)
        return await self._call(drv.ex_get_zone, zones[0], region=region)

    async def _region(self, region: str) -> Any:
        drv = await self._driver()
        reg = await self._call(drv.ex_get_region, region, region=region)
        if reg is None:
            raise NotFoundError(f"unknown GCE region {region!r}", provider="gcp", region=region)
        return reg

    async def list_regions(self) -> list[Region]:
        drv = await self._driver()
        regions = await self._call(drv.ex_list_regions)
        out = []
        for r in sorted(regions, key=lambda r: r.name):
            try:
                out.append(self.catalog.region("gcp", r.name))
            except NotFoundError:
                out.append(Region(provider="gcp", name=r.name))
        return out

    async def list_offers(self, *, region: str) -> list[Offer]:
        drv = await self._driver()
        zone = await self._zone(region)
        sizes = await self._call(drv.list_sizes, location=zone, region=region)
        live = []
        for s in sizes:
            vcpu = float((s.extra or {}).get("guestCpus") or 0)
            if not vcpu:
                continue
            live.append(Offer(
                provider="gcp", region=region, instance_type=s.name, vcpu=vcpu,
                memory_gib=round(float(s.ram or 0) / 1024.0, 3),
                price_usd_per_hour=float(s.price) if s.price else None, source="live",
            ))
        return self._merge_offers(region, live)

    async def get_quotas(self, *, region: str) -> list[Quota]:
        reg = await self._region(region)
        return [
            Quota(provider="gcp", region=region, metric=_quota_metric(str(q["metric"])),
                  limit=float(q.get("limit", 0)), used=float(q.get("usage", 0)))
            for q in (reg.quotas or [])
        ]

    async def _zone_nodes(self, zone: Any) -> list[Any]:
        drv = await self._driver()
        nodes: list[Any] = await self._call(drv.list_nodes, ex_zone=zone, region=str(zone.name))
        return nodes

    @staticmethod
    def _in_pool(nodes: list[Any], pool: str,
                 labels: Mapping[str, str] | None) -> list[Any]:
        """The instances of node group `pool` carrying every label of `labels` (the
        cluster's): two clusters' groups of one name in one zone stay apart."""
        want = {**_gce_labels(labels or {}), POOL_LABEL: _label_value(pool)}
        return [n for n in nodes
                if want.items() <= (n.extra.get("labels") or {}).items()]

    async def _pool_nodes(self, zone: Any, pool: str,
                          labels: Mapping[str, str] | None = None) -> list[Any]:
        return self._in_pool(await self._zone_nodes(zone), pool, labels)

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str], spot: bool = False, order: str = "",
    ) -> int:
        """Create labelled instances until `pool` has at least `nodes`; returns the count.
        `order` is not sent: an instance name is unique in its zone, so a retried order
        whose insert was accepted before the instance showed asks for the same name again,
        and GCE refuses it (409, a ConflictError that fails the decision) instead of buying a
        second machine; the group's next order counts the first."""
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        drv = await self._driver()
        zone = await self._zone(region)
        every = await self._zone_nodes(zone)
        current = self._in_pool(every, pool, labels)
        if len(current) < nodes:
            gce_labels = {**_gce_labels(labels), POOL_LABEL: _label_value(pool)}
            # An instance name is unique in its zone: avoid every instance's, not the group's.
            for name in new_names(f"skyfed-{_label_value(pool)}", (n.name for n in every),
                                  nodes - len(current)):
                await self._call(
                    drv.create_node, name, instance_type,
                    self._opts.image, location=zone, ex_labels=gce_labels,
                    ex_preemptible=spot, region=region,
                )
        return len(await self._pool_nodes(zone, pool, labels))

    async def remove_nodes(self, *, region: str, pool: str, nodes: Sequence[str],
                           labels: Mapping[str, str] | None = None) -> int:
        """Delete the instances of `pool` named by `nodes` (the instance name, which is a GKE
        node's name and the tail of its providerID, or the numeric id); see
        CloudProvider.remove_nodes."""
        drv = await self._driver()
        zone = await self._zone(region)
        for node in matching(await self._pool_nodes(zone, pool, labels), nodes,
                             lambda n: (str(n.name or ""), str(n.id or ""))):
            await self._call(drv.destroy_node, node, region=region)
        return len(await self._pool_nodes(zone, pool, labels))
