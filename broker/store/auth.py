"""Tenants and API tokens. Tokens are random (`sf_` + 32 url-safe bytes) and
only their sha256 is stored: a database leak does not leak credentials, and a
token is shown exactly once, when it is created."""

from __future__ import annotations

import builtins
import hashlib
import secrets

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from broker.domain import Tenant
from broker.errors import NotFoundError
from broker.store.models import ApiTokenRow, TenantRow
from broker.store.records import Principal

TOKEN_PREFIX = "sf_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class TenantRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def ensure(self, name: str, *, budget_usd_per_hour: float | None = None) -> Tenant:
        """Create the tenant if missing; return it either way."""
        row = await self._s.get(TenantRow, name)
        if row is None:
            row = TenantRow(name=name, budget_usd_per_hour=budget_usd_per_hour,
                            created_s=self._now)
            self._s.add(row)
            await self._s.flush()
        return Tenant(name=row.name, budget_usd_per_hour=row.budget_usd_per_hour)

    async def get(self, name: str) -> Tenant:
        row = await self._s.get(TenantRow, name)
        if row is None:
            raise NotFoundError(kind="tenant", key=name)
        return Tenant(name=row.name, budget_usd_per_hour=row.budget_usd_per_hour)

    async def list(self) -> builtins.list[Tenant]:
        rows = (await self._s.scalars(select(TenantRow).order_by(TenantRow.name))).all()
        return [Tenant(name=r.name, budget_usd_per_hour=r.budget_usd_per_hour) for r in rows]


class TokenRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def create(self, *, tenant: str, is_admin: bool = False, description: str = "",
                     token: str | None = None) -> tuple[str, str]:
        """Create a token for `tenant` (created if missing). Returns (token_id, token).

        `token` may be given (the configured admin token); otherwise one is
        generated. The plain token is never stored: show it to the user now.
        """
        await TenantRepo(self._s, self._now).ensure(tenant)
        plain = token or new_token()
        token_id = "tok-" + secrets.token_hex(6)
        await self._s.execute(insert(ApiTokenRow).values(
            id=token_id, token_sha256=hash_token(plain), tenant=tenant, is_admin=is_admin,
            description=description, created_s=self._now, revoked=False))
        return token_id, plain

    async def resolve(self, token: str) -> Principal | None:
        """The principal behind a plain token, or None (unknown or revoked)."""
        row = (await self._s.execute(
            select(ApiTokenRow.id, ApiTokenRow.tenant, ApiTokenRow.is_admin)
            .where(ApiTokenRow.token_sha256 == hash_token(token),
                   ApiTokenRow.revoked.is_(False)))).first()
        if row is None:
            return None
        return Principal(tenant=row.tenant, is_admin=row.is_admin, token_id=row.id)

    async def has_admin(self) -> bool:
        q = select(ApiTokenRow.id).where(ApiTokenRow.is_admin.is_(True),
                                         ApiTokenRow.revoked.is_(False)).limit(1)
        return (await self._s.execute(q)).first() is not None

    async def revoke(self, token_id: str) -> None:
        res = await self._s.execute(
            update(ApiTokenRow).where(ApiTokenRow.id == token_id).values(revoked=True))
        if getattr(res, "rowcount", 0) == 0:
            raise NotFoundError(kind="token", key=token_id)
