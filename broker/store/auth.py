"""Tenants and API tokens. Tokens are random (`sf_` + 32 url-safe bytes) and
only their sha256 is stored: a database leak does not leak credentials, and a
token is shown exactly once, when it is created."""

from __future__ import annotations

import builtins
import hashlib
import secrets

from sqlalchemy import insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from broker.domain import Role, Tenant, WorkloadStatus
from broker.errors import NotFoundError
from broker.store.models import ApiTokenRow, PlacementRow, TenantRow, WorkloadRow
from broker.store.records import Principal, TokenInfo

TOKEN_PREFIX = "sf_"
LIVE = (str(WorkloadStatus.PLACED), str(WorkloadStatus.RUNNING))


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

    async def set_budget(self, name: str, budget_usd_per_hour: float | None) -> Tenant:
        """Set (None: remove) the tenant's cap on the run rate of its placements, USD/h.
        The tenant is created if missing (a budget may precede its first token)."""
        row = await self._s.get(TenantRow, name)
        if row is None:
            self._s.add(TenantRow(name=name, budget_usd_per_hour=budget_usd_per_hour,
                                  created_s=self._now))
        else:
            row.budget_usd_per_hour = budget_usd_per_hour
        await self._s.flush()
        return Tenant(name=name, budget_usd_per_hour=budget_usd_per_hour)

    async def spend(self, name: str) -> tuple[float, float]:
        """(committed USD/h, spent USD to date) of a tenant, from the broker's placements.

        Committed: the run rate of its active placements of placed/running workloads (what
        the snapshot merge counts against the budget). Spent: each placement's run rate
        times the time it held: until now while live, until its workload last changed
        (finished, failed, cancelled) or until it was replaced. An estimate from the
        broker's own records, not a provider's bill.
        """
        q = (select(PlacementRow.cost_usd_per_hour, PlacementRow.created_s,
                    PlacementRow.updated_s, PlacementRow.active, WorkloadRow.status,
                    WorkloadRow.updated_s)
             .join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.tenant == name))
        committed = spent = 0.0
        for usdh, created, p_updated, active, status, w_updated in (await self._s.execute(q)):
            live = bool(active) and status in LIVE
            if live:
                committed += float(usdh)
            end = self._now if live else float(w_updated if active else p_updated)
            spent += float(usdh) * max(0.0, end - float(created)) / 3600.0
        return committed, spent


class TokenRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def create(self, *, tenant: str, is_admin: bool = False, description: str = "",
                     token: str | None = None, role: Role | None = None,
                     expires_s: float | None = None) -> tuple[str, str]:
        """Create a token for `tenant` (created if missing). Returns (token_id, token).

        `role` defaults to admin when `is_admin`, else tenant. `expires_s`: epoch seconds
        after which the token stops resolving (None: never). `token` may be given (the
        configured admin token); otherwise one is generated. The plain token is never
        stored: show it to the user now.
        """
        role = role or (Role.ADMIN if is_admin else Role.TENANT)
        await TenantRepo(self._s, self._now).ensure(tenant)
        plain = token or new_token()
        token_id = "tok-" + secrets.token_hex(6)
        await self._s.execute(insert(ApiTokenRow).values(
            id=token_id, token_sha256=hash_token(plain), tenant=tenant,
            is_admin=role is Role.ADMIN, role=str(role), expires_s=expires_s,
            description=description, created_s=self._now, revoked=False))
        return token_id, plain

    async def resolve(self, token: str) -> Principal | None:
        """The principal behind a plain token, or None (unknown, revoked or expired)."""
        row = (await self._s.execute(
            select(ApiTokenRow.id, ApiTokenRow.tenant, ApiTokenRow.role)
            .where(ApiTokenRow.token_sha256 == hash_token(token),
                   ApiTokenRow.revoked.is_(False),
                   or_(ApiTokenRow.expires_s.is_(None), ApiTokenRow.expires_s > self._now))
        )).first()
        if row is None:
            return None
        return Principal(tenant=row.tenant, role=_role(row.role), token_id=row.id)

    async def has_admin(self) -> bool:
        q = select(ApiTokenRow.id).where(ApiTokenRow.role == str(Role.ADMIN),
                                         ApiTokenRow.revoked.is_(False)).limit(1)
        return (await self._s.execute(q)).first() is not None

    async def list(self, *, tenant: str | None = None) -> builtins.list[TokenInfo]:
        """Tokens, oldest first (`tenant=None`: every tenant's), revoked ones included."""
        q = select(ApiTokenRow).order_by(ApiTokenRow.created_s, ApiTokenRow.id)
        if tenant is not None:
            q = q.where(ApiTokenRow.tenant == tenant)
        return [_info(r) for r in (await self._s.scalars(q)).all()]

    async def revoke(self, token_id: str, *, tenant: str | None = None) -> TokenInfo:
        """Revoke a token (idempotent); another tenant's token is not found, as a missing
        one is. Every replica refuses it from its next look-up (api/deps.py's cache)."""
        row = await self._s.get(ApiTokenRow, token_id)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFoundError(kind="token", key=token_id)
        row.revoked = True
        await self._s.flush()
        return _info(row)


def _role(raw: str) -> Role:
    try:
        return Role(raw)
    except ValueError:  # a role this version does not know grants nothing extra
        return Role.TENANT


def _info(r: ApiTokenRow) -> TokenInfo:
    return TokenInfo(id=r.id, tenant=r.tenant, role=_role(r.role), description=r.description,
                     created_s=r.created_s, expires_s=r.expires_s, revoked=bool(r.revoked))
