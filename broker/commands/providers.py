"""`skyfed providers ...`: provider accounts, and one pass of the quota/price sync.

``skyfed providers sync --accounts accounts.toml`` syncs the accounts in the file (format in
docs/providers.md) into the store named by the config. Without an accounts file it syncs
*catalog accounts*: one simulated account per cloud, serving the offline catalog's prices, for
the regions of the clusters registered in the store (so a fresh install still gets offers).
Exit status 1 when any account+region failed (the others are still written).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from broker.federation.quota_sync import Account, RegionResult
    from broker.store import Store

app = typer.Typer(no_args_is_help=True)

DEFAULT_REGIONS = {"aws": ("us-east-1",), "gcp": ("us-central1",), "azure": ("eastus",)}


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(1)


@app.command("list")
def list_cmd() -> None:
    """Adapters skyfed can sync (registry names for the accounts file)."""
    from providers.registry import PROVIDERS

    for name, (module, cls, opts) in sorted(PROVIDERS.items()):
        typer.echo(f"{name:10s} {module}.{cls} (options: {opts})")


async def _catalog_accounts(store: Store) -> list[Account]:
    from broker.federation.quota_sync import Account
    from providers.simulated_cloud import SimulatedCloudOptions, SimulatedCloudProvider

    async with store.unit() as uow:
        clusters = await uow.clusters.list()
    regions: dict[str, set[str]] = {}
    for c in clusters:
        if c.provider in DEFAULT_REGIONS:
            regions.setdefault(c.provider, set()).add(c.region)
    out = []
    for provider, defaults in DEFAULT_REGIONS.items():
        rs = tuple(sorted(regions.get(provider, set()))) or defaults
        opts = SimulatedCloudOptions(provider=provider, regions=rs)
        out.append(Account(name=f"catalog-{provider}", provider=SimulatedCloudProvider(opts),
                           regions=rs))
    return out


@app.command("sync")
def sync_cmd(
    accounts: Annotated[Path | None, typer.Option("--accounts", "-a",
                                                  help="TOML accounts file.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c",
                                                help="TOML config file.")] = None,
    url: Annotated[str | None, typer.Option("--url", help="Store URL (default from config).")]
    = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table | json")] = "table",
) -> None:
    """Fetch offers, prices and quotas once per account and region into the store."""
    from broker.clock import SystemClock
    from broker.errors import BrokerError
    from broker.federation.quota_sync import QuotaSync, load_accounts
    from broker.settings import load_settings
    from broker.store import Store
    from providers.errors import ProviderError

    settings = load_settings(config)
    path = accounts or (Path(settings.sync.accounts_file) if settings.sync.accounts_file
                        else None)

    async def run() -> list[RegionResult]:
        store = Store.from_url(url or settings.store_url, clock=SystemClock())
        try:
            await store.check_schema()
            accs = load_accounts(path) if path else await _catalog_accounts(store)
            sync = QuotaSync(store, accs, SystemClock(),
                             stale_after_failures=settings.sync.stale_after_failures)
            return await sync.sync_once()
        finally:
            await store.close()

    try:
        results = asyncio.run(run())
    except (BrokerError, ProviderError) as exc:
        raise _fail(str(exc)) from exc
    if output == "json":
        typer.echo(json.dumps([asdict(r) for r in results], indent=1))
    else:
        table = Table("account", "region", "ok", "offers", "quotas", "price changes",
                      "quota cuts", "error")
        for r in results:
            table.add_row(r.account, r.region, "yes" if r.ok else "NO", str(r.offers),
                          str(r.quotas), str(r.price_changes), str(r.quota_cuts), r.error[:60])
        Console().print(table)
    if any(not r.ok for r in results):
        raise typer.Exit(1)
