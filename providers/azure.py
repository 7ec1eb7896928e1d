"""Azure (Resource Manager) as a CloudProvider, on libcloud's Azure ARM driver.

- Regions: the subscription's Microsoft.Compute ``virtualMachines`` locations, with catalog
  coordinates.
- Offers: ``vmSizes`` of the location (vCPU, memory), priced live from the Azure Retail
  Prices API (``AzureOptions.retail_prices_url``; providers/azure_prices.py: Linux
  pay-as-you-go and spot) or, with that set to "", from libcloud's bundled ``azure_linux``
  table (the ARM API has no prices), merged onto the SkyPilot-format catalog (which adds GPU
  models, and spot prices where the API has none).
- Quotas: ``Microsoft.Compute/locations/<loc>/usages`` (``cores`` -> ``vcpu``,
  ``virtualMachines`` -> ``instances``, per-family vCPU limits under their Azure name).
- scale_pool is **not** offered (capability absent): Azure VMs need a NIC, image and credentials
  per node; scale AKS node pools through the cluster instead.

Auth is a service principal (tenant, client id, secret). libcloud always asks the token
endpoint on port 443; ``AzureOptions.login_port`` lets a private or test endpoint differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.azure_prices import RETAIL_PRICES_URL, retail_prices
from providers.base import Capability, Offer, Quota, Region
from providers.catalog import Catalog
from providers.cloud import LibcloudBase
from providers.errors import NotFoundError, ProviderError

USAGES_API_VERSION = "2023-07-01"


@dataclass(frozen=True, slots=True)
class AzureOptions:
    tenant_id: str
    subscription_id: str
    client_id: str
    client_secret: str = field(repr=False)
    regions: tuple[str, ...] = ("eastus",)
    cloud_environment: str | Mapping[str, str] = "default"  # or a dict of endpoint URLs
    endpoint_port: int | None = None
    secure: bool = True
    login_port: int = 443
    max_concurrency: int = 4
    timeout_s: float = 30.0
    retail_prices_url: str = RETAIL_PRICES_URL  # "" = libcloud's bundled price table only


def _driver_cls(login_port: int, login_secure: bool) -> Any:
    """libcloud's ARM driver whose token step honours the login endpoint's port and scheme."""
    from libcloud.common.azure_arm import AzureAuthJsonResponse, AzureResourceManagementConnection
    from libcloud.compute.drivers.azure_arm import AzureNodeDriver
    from libcloud.utils.py3 import urlencode

    class _Conn(AzureResourceManagementConnection):  # type: ignore[misc]
        def get_token_from_credentials(self) -> None:
            conn_cls: Any = self.conn_class
            conn: Any = conn_cls(self.login_host, login_port, secure=login_secure,
                                 timeout=self.timeout)
            conn.connect()
            params = urlencode({
                "grant_type": "client_credentials", "client_id": self.user_id,
                "client_secret": self.key, "resource": self.login_resource,
            })
            headers = {"Content-type": "application/x-www-form-urlencoded"}
            conn.request("POST", f"/{self.tenant_id}/oauth2/token", params, headers)
            resp_cls: Any = AzureAuthJsonResponse
            js = resp_cls(conn.getresponse(), conn)
            self.access_token = js.object["access_token"]
            self.expires_on = js.object["expires_on"]

    class _Driver(AzureNodeDriver):  # type: ignore[misc]
        connectionCls = _Conn

    return _Driver


def _quota_metric(name: str) -> str:
    return {"cores": "vcpu", "virtualMachines": "instances"}.get(name, name)


class AzureProvider(LibcloudBase):
    name = "azure"
    capabilities = frozenset({Capability.LIST_REGIONS, Capability.LIST_OFFERS,
                              Capability.LIVE_PRICES, Capability.QUOTAS})

    def __init__(self, options: AzureOptions, *, catalog: Catalog | None = None) -> None:
        super().__init__(max_concurrency=options.max_concurrency, timeout_s=options.timeout_s,
                         catalog=catalog)
        self._opts = options
        self._drv: Any = None

    def __repr__(self) -> str:
        return f"AzureProvider(subscription={self._opts.subscription_id!r})"

    def _make_driver(self) -> Any:
        o = self._opts
        env = o.cloud_environment if isinstance(o.cloud_environment, str) else dict(
            o.cloud_environment)
        cls = _driver_cls(o.login_port, o.login_port == 443 or o.secure)
        kw: dict[str, Any] = {"cloud_environment": env, "secure": o.secure,
                              "timeout": o.timeout_s}
        drv = cls(o.tenant_id, o.subscription_id, o.client_id, o.client_secret, **kw)
        if o.endpoint_port is not None:
            # not a constructor argument: libcloud would pass it positionally as tenant_id
            drv.connection.port, drv.connection.secure = o.endpoint_port, o.secure
            drv.connection.connect()
        return drv

    async def _driver(self) -> Any:
        if self._drv is None:
            self._drv = await self._call(self._make_driver)
        return self._drv

    async def list_regions(self) -> list[Region]:
        drv = await self._driver()
        locs = await self._call(drv.list_locations)
        out = []
        for loc in sorted(locs, key=lambda x: x.id):
            try:
                out.append(self.catalog.region("azure", loc.id))
            except NotFoundError:
                out.append(Region(provider="azure", name=loc.id, display_name=loc.name))
        return out

    async def list_offers(self, *, region: str) -> list[Offer]:
        from libcloud.compute.base import NodeLocation
        from libcloud.pricing import get_size_price

        drv = await self._driver()
        loc = NodeLocation(region, region, "", drv)
        sizes = await self._call(drv.list_sizes, location=loc, region=region)
        retail: dict[str, tuple[float | None, float | None]] = {}
        if self._opts.retail_prices_url:
            retail = await retail_prices(self._opts.retail_prices_url, region,
                                         timeout_s=self._opts.timeout_s)
        live = []
        for s in sizes:
            vcpu = float((s.extra or {}).get("numberOfCores") or 0)
            if not vcpu:
                continue
            key = s.name.lower().replace("_", "").replace("-", "")
            od, spot = retail.get(s.name, (None, None))
            if od is None and not retail:
                try:
                    od = get_size_price("compute", "azure_linux", key, region) or None
                except KeyError:
                    od = None
            live.append(Offer(
                provider="azure", region=region, instance_type=s.name, vcpu=vcpu,
                memory_gib=round(float(s.ram or 0) / 1024.0, 3),
                price_usd_per_hour=float(od) if od else None,
                spot_price_usd_per_hour=spot, source="live",
            ))
        return self._merge_offers(region, live)

    async def get_quotas(self, *, region: str) -> list[Quota]:
        drv = await self._driver()
        path = (f"/subscriptions/{self._opts.subscription_id}/providers/Microsoft.Compute/"
                f"locations/{region}/usages")
        resp = await self._call(drv.connection.request, path,
                                params={"api-version": USAGES_API_VERSION}, region=region)
        out = []
        for u in resp.object.get("value", []):
            name = (u.get("name") or {}).get("value", "")
            if name:
                out.append(Quota(provider="azure", region=region, metric=_quota_metric(name),
                                 limit=float(u.get("limit", 0)),
                                 used=float(u.get("currentValue", 0))))
        return out

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str], spot: bool = False, order: str = "",
    ) -> int:
        raise ProviderError(
            "the azure adapter does not scale VMs (Capability.SCALE_POOL absent): scale the AKS "
            f"node pool {pool!r} instead", provider="azure", region=region,
        )

    async def remove_nodes(self, *, region: str, pool: str, nodes: Sequence[str],
                           labels: Mapping[str, str] | None = None) -> int:
        raise ProviderError(
            "the azure adapter does not remove VMs (Capability.SCALE_POOL absent): scale the "
            f"AKS node pool {pool!r} instead", provider="azure", region=region,
        )
