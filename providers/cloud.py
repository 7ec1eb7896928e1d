"""What the three libcloud-backed CloudProviders share: the thread hop, the cap, the error map.

Why one place: libcloud is synchronous, so every call runs in ``asyncio.to_thread`` under a
per-provider semaphore (a slow cloud must not eat the default thread pool), with a timeout, and
every libcloud / socket error is mapped into providers/errors.py exactly once, here
(``map_sdk_error``). Messages carry the provider, region and the SDK's text, never credentials
(the SDKs never put keys in error text; we never format options into messages).

Offers are the catalog's offers for the region, with the price replaced by the driver's when the
driver lists the size with a price (``source="live"``); sizes the driver lists that the catalog
lacks are added from the driver's numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from providers.base import Offer
from providers.catalog import Catalog
from providers.errors import (
    AuthError,
    ConflictError,
    NotFoundError,
    ProviderError,
    QuotaExceededError,
    ThrottledError,
    TransientError,
)

T = TypeVar("T")

SKYFED_POOL_LABEL = "skyfed.io/pool"
SKYFED_CLUSTER_LABEL = "skyfed.io/cluster"  # the tag a node group's machines carry


def new_names(prefix: str, taken: Iterable[str], count: int) -> list[str]:
    """`count` machine names `<prefix>-<i>` at the lowest indices no machine of the group
    holds. A targeted removal (`remove_nodes`) can leave a gap, and a GCE instance name
    must be unique in its zone, so the next order fills the gap instead of reusing a
    name that is still taken."""
    used = set(taken)
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}-{i}"
        if name not in used:
            out.append(name)
        i += 1
    return out


def client_token(order: str, name: str) -> str:
    """The idempotency token of machine `name`'s launch in `order` ("" without an order): the
    same in each retry of the order, which asks for the same name while the machine has not
    shown in the group, and another in every other order, even for a name a removal freed
    (EC2 remembers a token after its instance ends). 32 hex digits: EC2 takes up to 64 ASCII
    characters."""
    if not order:
        return ""
    return hashlib.sha256(f"{order}\n{name}".encode()).hexdigest()[:32]


def matching(machines: Iterable[T], wanted: Iterable[str],
             keys: Callable[[T], Iterable[str]]) -> list[T]:
    """The machines any of whose `keys` (instance id, name, host name) is in `wanted`:
    what `remove_nodes` terminates, and nothing else."""
    want = {w for w in wanted if w}
    return [m for m in machines if want.intersection(k for k in keys(m) if k)]

_THROTTLE_CODES = re.compile(r"RequestLimitExceeded|Throttling|TooManyRequests|rateLimitExceeded")
_QUOTA_CODES = re.compile(
    r"InstanceLimitExceeded|VcpuLimitExceeded|QuotaExceeded|QUOTA_EXCEEDED|OperationNotAllowed"
)
_NOT_FOUND_CODES = re.compile(r"NotFound|InvalidInstanceType|Unsupported|ResourceNotFound")


def map_sdk_error(exc: BaseException, *, provider: str, region: str = "") -> ProviderError:
    """The ProviderError for an exception raised by libcloud or the network under it."""
    from libcloud.common.exceptions import BaseHTTPError
    from libcloud.common.types import InvalidCredsError, ServiceUnavailableError

    if isinstance(exc, ProviderError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "code", None) or getattr(exc, "http_code", None)
    kw: dict[str, Any] = {"provider": provider, "region": region}
    if isinstance(exc, InvalidCredsError) or code in (401, 403) or "GoogleAuthError" in text:
        return AuthError(f"credentials rejected: {text}", **kw)
    if isinstance(exc, ServiceUnavailableError):
        return TransientError(text, **kw)
    if code == 429 or _THROTTLE_CODES.search(text):
        return ThrottledError(text, **kw)
    if _QUOTA_CODES.search(text):
        return QuotaExceededError(text, **kw)
    if isinstance(exc, TimeoutError | socket.timeout | ConnectionError | OSError):
        return TransientError(text, **kw)
    if isinstance(code, int) and code >= 500:
        return TransientError(text, **kw)
    if code == 404 or _NOT_FOUND_CODES.search(text):
        return NotFoundError(text, **kw)
    if code == 409 or "AlreadyExists" in text or "ResourceExistsError" in text:
        return ConflictError(text, **kw)
    if isinstance(exc, BaseHTTPError) and isinstance(code, int) and code >= 500:
        return TransientError(text, **kw)
    return ProviderError(text, **kw)


class LibcloudBase:
    """Thread hop + concurrency cap + error mapping + catalog merge for one cloud account."""

    name: str = ""

    def __init__(self, *, max_concurrency: int, timeout_s: float,
                 catalog: Catalog | None = None) -> None:
        self._sem = asyncio.Semaphore(max_concurrency)
        self._timeout_s = timeout_s
        self._catalog = catalog

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.load()
        return self._catalog

    async def _call(self, fn: Callable[..., T], *args: Any, region: str = "", **kw: Any) -> T:
        """Run a blocking SDK call in a thread, capped and timed out, errors mapped."""
        async with self._sem:
            try:
                return await asyncio.wait_for(
                    asyncio.to_thread(fn, *args, **kw), timeout=self._timeout_s
                )
            except TimeoutError as exc:
                raise TransientError(
                    f"call timed out after {self._timeout_s:g} s", provider=self.name,
                    region=region,
                ) from exc
            except ProviderError:
                raise
            except Exception as exc:  # the SDK boundary: everything is mapped once, here
                raise map_sdk_error(exc, provider=self.name, region=region) from exc

    def _merge_offers(self, region: str, live: list[Offer]) -> list[Offer]:
        """Catalog offers for `region`, priced live where the driver knows a price."""
        try:
            base = self.catalog.offers(provider=self.name, region=region)
        except NotFoundError:
            base = []
        by_type = {o.instance_type: o for o in live}
        out: list[Offer] = []
        for o in base:
            lv = by_type.pop(o.instance_type, None)
            if lv is not None and lv.price_usd_per_hour:
                o = Offer(
                    provider=o.provider, region=o.region, instance_type=o.instance_type,
                    vcpu=o.vcpu, memory_gib=o.memory_gib, gpu_count=o.gpu_count,
                    gpu_model=o.gpu_model, interconnect=o.interconnect,
                    price_usd_per_hour=lv.price_usd_per_hour,
                    spot_price_usd_per_hour=lv.spot_price_usd_per_hour
                    if lv.spot_price_usd_per_hour is not None else o.spot_price_usd_per_hour,
                    source="live",
                )
            out.append(o)
        out.extend(by_type[k] for k in sorted(by_type))
        return out
