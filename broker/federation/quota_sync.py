"""Quota and price sync: keep every provider account's offers and quotas fresh in the store.

Per account and region, on an interval: fetch offers (with live prices) and quotas through the
account's CloudProvider, with tenacity retries (exponential backoff + jitter) on throttling,
5xx and timeouts (``ProviderError.retryable``). Then, in one unit of work:

- offers are upserted; a price that moved emits one ``price.changed`` event per region;
- a timestamped quota snapshot is inserted; a limit lower than the last-known-good one emits
  ``quota.cut``; the account is marked fresh.

When a region still fails after the retries, a failed snapshot (``ok=False``) is recorded and
nothing else is touched: the last-known-good offers and quotas stay. After
``stale_after_failures`` consecutive failed passes the account is marked stale (placement then
treats its quota conservatively). One account failing never stops the others; a bad account
(unknown region, expired credentials) is reported with its name and the loop goes on.

Prometheus (default registry, served on /metrics): ``skyfed_sync_duration_seconds``,
``skyfed_sync_failures_total``, ``skyfed_sync_staleness_seconds`` and
``skyfed_burn_rate_usd_per_hour`` (per tenant and cluster: nodes x price of its pools).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from broker.clock import Clock
from broker.errors import StoreError
from broker.federation.looping import PollingLoop
from providers.base import CloudProvider, Offer, Quota
from providers.errors import ConfigError, ProviderError

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")

SYNC_DURATION = Histogram("skyfed_sync_duration_seconds",
                          "Time to sync one account+region (offers and quotas)",
                          ["account", "region"])
SYNC_FAILURES = Counter("skyfed_sync_failures_total",
                        "Sync attempts that failed after retries", ["account", "region", "error"])
SYNC_STALENESS = Gauge("skyfed_sync_staleness_seconds",
                       "Seconds since the account's last successful sync", ["account"])
# Per provider, summed over clusters: /metrics is unauthenticated and shows federation-level
# aggregates only, never a tenant's or a cluster's name (a tenant's own spend: its budget API).
BURN_RATE = Gauge("skyfed_burn_rate_usd_per_hour",
                  "Provisioned nodes x price per hour, summed per provider", ["provider"])

PRICE_EPS = 1e-9
MAX_EVENT_ITEMS = 20


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    provider: CloudProvider
    regions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 4
    initial_s: float = 0.5
    max_s: float = 10.0
    jitter_s: float = 0.5


@dataclass(slots=True)
class RegionResult:
    account: str
    region: str
    ok: bool
    offers: int = 0
    quotas: int = 0
    price_changes: int = 0
    quota_cuts: int = 0
    error: str = ""


@dataclass(slots=True)
class _AccountHealth:
    failures: int = 0
    last_ok_s: float | None = None
    stale: bool = False
    errors: list[str] = field(default_factory=list)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


class QuotaSync(PollingLoop):
    """The loop (a `PollingLoop`: each step is one ``sync_once``) and that pass."""

    name = "quota_sync"

    def __init__(
        self, store: Store, accounts: Sequence[Account], clock: Clock, *,
        interval_s: float = 300.0, stale_after_failures: int = 3,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(clock, interval_s=interval_s)
        self._store = store
        self._accounts = list(accounts)
        self._stale_after = stale_after_failures
        self._retry = retry or RetryPolicy()
        self._sleep = sleep or asyncio.sleep
        self._health: dict[str, _AccountHealth] = {a.name: _AccountHealth()
                                                   for a in self._accounts}
        # two accounts of one cloud share its (provider, region) offer rows: write one at a time
        self._offer_locks: dict[str, asyncio.Lock] = {}

    async def step(self) -> list[RegionResult]:
        return await self.sync_once()

    async def sync_once(self) -> list[RegionResult]:
        """One pass over every account and region; accounts run concurrently."""
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._sync_account(a), name=f"sync-{a.name}")
                     for a in self._accounts]
        results = [r for t in tasks for r in t.result()]
        await self._update_burn_rate()
        return results

    async def _sync_account(self, account: Account) -> list[RegionResult]:
        results = [await self._sync_region(account, r) for r in account.regions]
        health = self._health[account.name]
        failed = [r for r in results if not r.ok]
        async with self._store.unit() as uow:
            if failed:
                health.failures += 1
                error = "; ".join(f"{r.region}: {r.error}" for r in failed)[:2000]
                if health.failures >= self._stale_after:
                    await uow.quotas.mark_account_stale(
                        account.name, provider=account.provider.name, error=error)
                    health.stale = True
            else:
                health.failures, health.stale = 0, False
                health.last_ok_s = self.clock.now()
                await uow.quotas.mark_account_fresh(account.name,
                                                    provider=account.provider.name)
        if health.last_ok_s is not None:
            SYNC_STALENESS.labels(account.name).set(self.clock.now() - health.last_ok_s)
        return results

    async def _with_retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        p = self._retry
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(p.attempts),
            wait=wait_exponential_jitter(multiplier=p.initial_s, max=p.max_s, jitter=p.jitter_s),
            retry=retry_if_exception(_retryable), reraise=True, sleep=self._sleep,
        ):
            with attempt:
                return await fn()
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _sync_region(self, account: Account, region: str) -> RegionResult:
        prov = account.provider
        started = self.clock.now()
        try:
            with SYNC_DURATION.labels(account.name, region).time():
                offers = await self._with_retry(lambda: prov.list_offers(region=region))
                quotas = await self._with_retry(lambda: prov.get_quotas(region=region))
        except ProviderError as exc:
            SYNC_FAILURES.labels(account.name, region, type(exc).__name__).inc()
            log.warning("sync %s/%s failed: %s", account.name, region, exc)
            async with self._store.unit() as uow:
                await uow.quotas.insert_snapshot(account=account.name, provider=prov.name,
                                                 quotas=(), ok=False, error=str(exc)[:2000],
                                                 taken_s=started)
            return RegionResult(account.name, region, ok=False, error=str(exc))
        lock = self._offer_locks.setdefault(f"{prov.name}:{region}", asyncio.Lock())
        try:
            async with lock:
                return await self._write(account, region, offers, quotas, started)
        except StoreError as exc:  # e.g. another broker wrote the same rows: next pass retries
            SYNC_FAILURES.labels(account.name, region, type(exc).__name__).inc()
            log.warning("sync %s/%s could not be stored: %s", account.name, region, exc)
            return RegionResult(account.name, region, ok=False, error=f"store: {exc}")

    async def _write(self, account: Account, region: str, offers: list[Offer],
                     quotas: list[Quota], taken_s: float) -> RegionResult:
        prov = account.provider.name
        res = RegionResult(account.name, region, ok=True, offers=len(offers), quotas=len(quotas))
        async with self._store.unit() as uow:
            before = {o.instance_type: o for o in await uow.offers.list(provider=prov,
                                                                           region=region)}
            changes = _price_changes(before, offers)
            await uow.offers.upsert_many(offers)
            if changes:
                res.price_changes = len(changes)
                await uow.events.append("price.changed", f"{prov}:{region}", {
                    "account": account.name, "count": len(changes),
                    "changes": changes[:MAX_EVENT_ITEMS]})
            last = await uow.quotas.last_known_good(account.name)
            cuts = _quota_cuts(last.quotas if last else (), quotas, region)
            if cuts:
                res.quota_cuts = len(cuts)
                await uow.events.append("quota.cut", f"{prov}:{region}",
                                        {"account": account.name, "cuts": cuts})
            # snapshots are per account: keep the other regions' latest quotas with this one
            kept = [q for q in (last.quotas if last else ()) if q.region != region]
            await uow.quotas.insert_snapshot(account=account.name, provider=prov,
                                             quotas=[*kept, *quotas], ok=True, taken_s=taken_s)
        return res

    async def _update_burn_rate(self) -> None:
        try:
            async with self._store.unit() as uow:
                records = await uow.clusters.list_records()
        except Exception:  # metrics must never break the sync pass
            log.exception("burn-rate update failed")
            return
        total: dict[str, float] = {}
        for rec in records:
            usd = sum(p.nodes * p.price_usd_per_hour for p in rec.cluster.pools)
            total[rec.cluster.provider] = total.get(rec.cluster.provider, 0.0) + usd
        for provider, usd in total.items():
            BURN_RATE.labels(provider).set(usd)

    def health(self, account: str) -> tuple[int, bool]:
        """(consecutive failed passes, stale) for `account`, as this loop sees it."""
        h = self._health[account]
        return h.failures, h.stale


def _price_changes(before: Mapping[str, Offer], after: Sequence[Offer]) -> list[dict[str, Any]]:
    out = []
    for o in after:
        old = before.get(o.instance_type)
        if old is None:
            continue
        for attr in ("price_usd_per_hour", "spot_price_usd_per_hour"):
            a, b = getattr(old, attr), getattr(o, attr)
            if a is not None and b is not None and abs(a - b) > PRICE_EPS * max(1.0, abs(a)):
                out.append({"instance_type": o.instance_type, "field": attr, "old": a, "new": b})
    return out


def _quota_cuts(before: Sequence[Quota], after: Sequence[Quota],
                region: str) -> list[dict[str, Any]]:
    old = {q.metric: q for q in before if q.region == region}
    return [{"metric": q.metric, "old_limit": old[q.metric].limit, "new_limit": q.limit}
            for q in after if q.metric in old and q.limit < old[q.metric].limit]


# ---- accounts file -----------------------------------------------------------------------

def _resolve(value: Any) -> Any:
    """``"env:NAME"`` -> the environment variable (secrets stay out of the file)."""
    if isinstance(value, str) and value.startswith("env:"):
        var = value[4:]
        if var not in os.environ:
            raise ConfigError(f"environment variable {var!r} is not set")
        return os.environ[var]
    return value


def load_accounts(path: Path) -> list[Account]:
    """Accounts from a TOML file (format in docs/providers.md); errors name the account."""
    from providers.registry import make_provider

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read accounts file {str(path)!r}: {exc}") from exc
    out = []
    for i, entry in enumerate(data.get("account", [])):
        name = str(entry.get("name") or f"account-{i}")
        try:
            kind = str(entry["provider"])
            regions = tuple(str(r) for r in entry.get("regions", []))
            if not regions:
                raise ConfigError("needs at least one region in `regions`")
            opts = {k: _resolve(v) for k, v in (entry.get("options") or {}).items()}
            opts.setdefault("regions", regions)
            out.append(Account(name=name, provider=make_provider(kind, opts), regions=regions))
        except (ConfigError, KeyError) as exc:
            raise ConfigError(f"account {name!r} in {str(path)!r}: {exc}") from exc
    return out


def make_quota_sync(rt: Runtime) -> QuotaSync | None:
    """On when ``[sync] accounts_file`` is configured, else off (None)."""
    s = rt.settings.sync
    if not s.accounts_file:
        return None
    accounts = load_accounts(Path(s.accounts_file))
    rt.accounts.update({a.name: a.provider for a in accounts})  # the actuator's too
    return QuotaSync(rt.loop_store(), accounts, rt.clock, interval_s=s.interval_s,
                     stale_after_failures=s.stale_after_failures)
