"""Live Azure VM prices from the Azure Retail Prices API (unauthenticated REST, JSON).

Why: the ARM API has no prices and libcloud's bundled `azure_linux` table is a snapshot of
the day the wheel was built, so "live prices" need this API. One filtered query per region
(`serviceName eq 'Virtual Machines' and armRegionName eq '<region>' and priceType eq
'Consumption'`), pages followed through `NextPageLink` (the API returns 100 items a page).
Documented at https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices

Kept per `armSkuName`: the Linux pay-as-you-go price and the Linux spot price per hour (items
whose `productName` names Windows, `Low Priority` meters and anything not priced per hour
are skipped). Errors map into providers/errors.py: 429 -> ThrottledError, 5xx and network
errors -> TransientError (retried by the sync loop), other failures -> ProviderError.
"""

from __future__ import annotations

from typing import Any

import httpx

from providers.errors import ProviderError, ThrottledError, TransientError

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
MAX_PAGES = 200  # a region has a few thousand VM meters: ~50 pages


def _filter(region: str) -> str:
    return (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
            "and priceType eq 'Consumption'")


def prices_from_items(items: list[Any]) -> dict[str, tuple[float | None, float | None]]:
    """armSkuName -> (Linux on-demand USD/h, Linux spot USD/h) from API items."""
    out: dict[str, tuple[float | None, float | None]] = {}
    for it in items:
        if not isinstance(it, dict):
            continue
        sku, product = str(it.get("armSkuName") or ""), str(it.get("productName") or "")
        meter = f"{it.get('skuName') or ''} {it.get('meterName') or ''}"
        price = it.get("retailPrice", it.get("unitPrice"))
        if (not sku or "Windows" in product or "Low Priority" in meter
                or it.get("unitOfMeasure") != "1 Hour" or it.get("currencyCode", "USD") != "USD"
                or isinstance(price, bool) or not isinstance(price, int | float) or price <= 0):
            continue
        od, spot = out.get(sku, (None, None))
        if "Spot" in meter:
            spot = float(price)
        else:
            od = float(price)
        out[sku] = (od, spot)
    return out


async def retail_prices(url: str, region: str, *, timeout_s: float = 30.0,
                        client: httpx.AsyncClient | None = None
                        ) -> dict[str, tuple[float | None, float | None]]:
    """Every VM size's Linux on-demand and spot price in `region` (see module docstring)."""
    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout_s)
    items: list[Any] = []
    try:
        next_url: str | None = url
        params: dict[str, str] | None = {"currencyCode": "USD", "$filter": _filter(region)}
        for _ in range(MAX_PAGES):
            if not next_url:
                break
            body = await _page(http, next_url, params, region)
            items.extend(body.get("Items") or [])
            next_url, params = body.get("NextPageLink"), None
    finally:
        if own:
            await http.aclose()
    return prices_from_items(items)


async def _page(http: httpx.AsyncClient, url: str, params: dict[str, str] | None,
                region: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"provider": "azure", "region": region}
    try:
        resp = await http.get(url, params=params)
    except httpx.HTTPError as exc:
        raise TransientError(f"retail prices API unreachable: {type(exc).__name__}: {exc}",
                             **kw) from exc
    if resp.status_code == 429:
        raise ThrottledError("retail prices API throttled (429)", **kw)
    if resp.status_code >= 500:
        raise TransientError(f"retail prices API answered {resp.status_code}", **kw)
    if resp.status_code != 200:
        raise ProviderError(f"retail prices API answered {resp.status_code}: "
                            f"{resp.text[:200]}", **kw)
    try:
        body = resp.json()
    except ValueError as exc:
        raise ProviderError(f"retail prices API sent malformed JSON: {exc}", **kw) from exc
    if not isinstance(body, dict):
        raise ProviderError("retail prices API sent an unexpected body", **kw)
    return body
