"""Tenancy commands: `skyfed token create|list|revoke` and `skyfed budget set|get`.

`token ...` is an operator command: it talks to the database named by the config (works
with the broker stopped; a revocation reaches every replica within 1 s, api/deps.py).
`budget ...` talks HTTP to a running broker like `skyfed get` (set needs the admin token;
a tenant's token may read its own budget and spend).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from broker.commands.core import (
    ConfigOpt,
    OutputOpt,
    ServerOpt,
    TokenOpt,
    UrlOpt,
    _client,
    _emit,
    _run,
    _store_url,
    fail,
)

if TYPE_CHECKING:
    from broker.store import UnitOfWork

T = TypeVar("T")
token_app = typer.Typer(no_args_is_help=True, help="API tokens (talks to the database).")
budget_app = typer.Typer(no_args_is_help=True, help="Tenant budgets and spend (talks HTTP).")
ROLES = ("admin", "operator", "tenant")


def _with_store(url: str, fn: Callable[[UnitOfWork], Awaitable[T]]) -> T:
    from broker.store import Store

    async def go() -> T:
        store = Store.from_url(url, pool_size=1)
        try:
            await store.check_schema()
            async with store.unit() as uow:
                return await fn(uow)
        finally:
            await store.close()

    return _run(lambda: asyncio.run(go()))


@token_app.command("create")
def token_create(tenant: Annotated[str, typer.Option(help="Tenant the token acts for.")],
                 config: ConfigOpt = None, url: UrlOpt = None,
                 role: Annotated[str, typer.Option(help="admin | operator | tenant")] = "tenant",
                 admin: Annotated[bool, typer.Option(help="Same as --role admin.")] = False,
                 expires_in: Annotated[int | None, typer.Option(
                     "--expires-in", min=1, help="Seconds until it expires (default never).")]
                 = None,
                 description: Annotated[str, typer.Option()] = "") -> None:
    """Create an API token (printed once; only its hash is stored)."""
    from broker.domain import Role

    if role not in ROLES:
        raise fail(f"--role must be one of {', '.join(ROLES)} (got {role!r})")
    chosen = Role.ADMIN if admin else Role(role)

    async def create(uow: UnitOfWork) -> str:
        expires = None if expires_in is None else uow.now + expires_in
        _, token = await uow.tokens.create(tenant=tenant, role=chosen, description=description,
                                           expires_s=expires)
        return token

    typer.echo(_with_store(_store_url(config, url), create))


def _when(at_s: float | None) -> str:
    if at_s is None:
        return "never"
    return dt.datetime.fromtimestamp(at_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@token_app.command("list")
def token_list(config: ConfigOpt = None, url: UrlOpt = None,
               tenant: Annotated[str | None, typer.Option(help="Only this tenant's.")] = None,
               output: OutputOpt = "table") -> None:
    """List tokens (id, tenant, role, expiry, revoked); never the tokens themselves."""
    from broker.api.tenancy import token_view

    async def list_(uow: UnitOfWork) -> list[dict[str, Any]]:
        return [token_view(t) for t in await uow.tokens.list(tenant=tenant)]

    items = _with_store(_store_url(config, url), list_)
    if output != "table":
        _emit(items, output)
        return
    typer.echo(f"{'ID':<18} {'TENANT':<20} {'ROLE':<9} {'EXPIRES':<21} REVOKED  DESCRIPTION")
    for t in items:
        typer.echo(f"{t['id']:<18} {t['tenant']:<20} {t['role']:<9} "
                   f"{_when(t['expiresS']):<21} {'yes' if t['revoked'] else 'no':<8} "
                   f"{t['description']}")


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(metavar="ID")],
                 config: ConfigOpt = None, url: UrlOpt = None) -> None:
    """Revoke a token by id (`skyfed token list`); every replica refuses it within 1 s."""
    async def revoke(uow: UnitOfWork) -> str:
        return (await uow.tokens.revoke(token_id)).tenant

    owner = _with_store(_store_url(config, url), revoke)
    typer.echo(f"revoked {token_id} (tenant {owner})")


@budget_app.command("set")
def budget_set(tenant: Annotated[str, typer.Argument(metavar="TENANT")],
               usd_per_hour: Annotated[float | None, typer.Argument(
                   metavar="USD_PER_HOUR", help="Cap in USD/h; omit with --clear.")] = None,
               clear: Annotated[bool, typer.Option("--clear", help="Remove the cap.")] = False,
               config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
               output: OutputOpt = "table") -> None:
    """Set a tenant's budget (the cap on the run rate of its placements, USD/h)."""
    if (usd_per_hour is None) == (not clear):
        raise fail("give USD_PER_HOUR or --clear (not both)")
    with _client(config, server, token) as c:
        out = _run(lambda: c.request("PUT", f"/v1/tenants/{tenant}/budget",
                                     json={"budgetUsdPerHour": usd_per_hour}))
    _print_budget(out, output)


@budget_app.command("get")
def budget_get(tenant: Annotated[str, typer.Argument(metavar="TENANT")],
               config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
               output: OutputOpt = "table") -> None:
    """A tenant's budget, committed run rate, what is left and spend to date."""
    with _client(config, server, token) as c:
        out = _run(lambda: c.request("GET", f"/v1/tenants/{tenant}/budget"))
    _print_budget(out, output)


def _print_budget(b: dict[str, Any], output: str) -> None:
    if output != "table":
        _emit(b, output)
        return

    def usd(v: Any, unit: str) -> str:
        return "no cap" if v is None else f"{v:.6g} {unit}"

    typer.echo(f"tenant     {b['tenant']}")
    typer.echo(f"budget     {usd(b['budgetUsdPerHour'], 'USD/h')}")
    typer.echo(f"committed  {usd(b['committedUsdPerHour'], 'USD/h')}")
    typer.echo(f"left       {usd(b['leftUsdPerHour'], 'USD/h')}")
    typer.echo(f"spent      {usd(b['spentUsd'], 'USD')} (to date, from placements)")


def register(app: typer.Typer) -> None:
    """Mount this module's commands on the root app."""
    app.add_typer(token_app, name="token")
    app.add_typer(budget_app, name="budget")
