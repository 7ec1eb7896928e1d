"""Azure Retail Prices API client (providers/azure_prices.py) over httpx.MockTransport."""

from __future__ import annotations

import httpx
import pytest

from providers.azure_prices import retail_prices
from providers.errors import ProviderError, ThrottledError, TransientError
from tests.contract.test_providers_contract import azure_retail_item

URL = "https://prices.example/api/retail/prices"


def client(pages: dict[str, httpx.Response]) -> httpx.AsyncClient:
    seen: list[httpx.Request] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return pages[str(req.url.params.get("page", "1"))]

    c = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    c.seen = seen  # type: ignore[attr-defined]
    return c


async def test_pages_are_followed_and_linux_spot_and_on_demand_kept() -> None:
    low = azure_retail_item("Standard_D2s_v3", 0.02, spot=True)
    low["meterName"] = low["skuName"] = "D2s v3 Low Priority"
    pages = {
        "1": httpx.Response(200, json={"Items": [
            azure_retail_item("Standard_D2s_v3", 0.096),
            azure_retail_item("Standard_D2s_v3", 0.188, windows=True), low],
            "NextPageLink": f"{URL}?page=2"}),
        "2": httpx.Response(200, json={"Items": [
            azure_retail_item("Standard_D2s_v3", 0.0192, spot=True)], "NextPageLink": None}),
    }
    async with client(pages) as c:
        got = await retail_prices(URL, "eastus", client=c)
        first = c.seen[0]  # type: ignore[attr-defined]
    assert got == {"Standard_D2s_v3": (0.096, 0.0192)}
    assert "armRegionName eq 'eastus'" in first.url.params["$filter"]
    assert first.url.params["currencyCode"] == "USD"


@pytest.mark.parametrize(("code", "error"), [(429, ThrottledError), (503, TransientError),
                                             (400, ProviderError)])
async def test_errors_map_into_the_provider_tree(code: int, error: type[ProviderError]) -> None:
    async with client({"1": httpx.Response(code, text="no")}) as c:
        with pytest.raises(error) as err:
            await retail_prices(URL, "eastus", client=c)
    assert err.value.retryable is (error is not ProviderError)


async def test_malformed_body_is_a_provider_error() -> None:
    async with client({"1": httpx.Response(200, text="<html>")}) as c:
        with pytest.raises(ProviderError, match="malformed"):
            await retail_prices(URL, "eastus", client=c)
