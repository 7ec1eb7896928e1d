"""Tokens and tenant budgets: who may call, and how much a tenant may spend.

- `POST /v1/tokens` (admin): a token for a tenant in a role (`admin`, `operator`,
  `tenant`), optionally expiring after `expiresInS`; the token is shown once.
- `GET /v1/tokens`: the admin sees every token, anyone else its tenant's; never the token
  itself. `DELETE /v1/tokens/{id}` revokes (admin: any; others: their tenant's; another
  tenant's token is a 404 like a missing one). A revoked or expired token is refused by
  every replica within 1 s (api/deps.py).
- `PUT /v1/tenants/{name}/budget` (admin) sets the cap on the run rate of a tenant's
  placements in USD/h (`null` removes it); `GET` (admin, or the tenant itself) shows the
  cap, the committed run rate and the spend to date (`store.auth.TenantRepo.spend`). The
  placement loop keeps committed + new placements within the cap across epochs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import Field
from starlette.responses import Response

from broker import limits as lim
from broker.api.deps import Admin, Auth, RuntimeDep, scope_of
from broker.api.openapi import PAGE_SCHEMA, answers
from broker.api.schemas import TENANT_RE, TenantName, _Model
from broker.api.views import JsonResponse
from broker.domain import Role
from broker.errors import NotFoundError
from broker.store import TokenInfo

router = APIRouter(prefix="/v1")
TokenId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9._-]+$")]
TenantPath = Annotated[str, Path(min_length=1, max_length=64, pattern=TENANT_RE)]
EXPIRES_IN_MAX_S = 10 * 365 * 86400


class TokenIn(_Model):
    tenant: TenantName
    role: Role = Role.TENANT
    description: str = Field(default="", max_length=200, pattern=lim.MULTILINE_PATTERN)
    expires_in_s: int | None = Field(default=None, ge=1, le=EXPIRES_IN_MAX_S,
                                     description="Seconds until the token expires "
                                     "(default: never).")


class BudgetIn(_Model):
    budget_usd_per_hour: float | None = Field(
        ge=0, le=lim.BUDGET_USD_PER_HOUR_MAX,
        description="Cap on the run rate of the tenant's placements, USD/h (null: no cap).")


def token_view(t: TokenInfo) -> dict[str, object]:
    return {"id": t.id, "tenant": t.tenant, "role": str(t.role), "description": t.description,
            "createdS": t.created_s, "expiresS": t.expires_s, "revoked": t.revoked}


@router.post("/tokens", status_code=201, responses=answers(201, 401, 403, 413, 422, 503),
             summary="Create a token for a tenant, in a role, optionally expiring (admin only)")
async def create_token(rt: RuntimeDep, _admin: Admin, body: TokenIn) -> Response:
    async with rt.store.unit() as uow:
        expires = None if body.expires_in_s is None else uow.now + body.expires_in_s
        token_id, token = await uow.tokens.create(tenant=body.tenant, role=body.role,
                                                  description=body.description,
                                                  expires_s=expires)
    return JsonResponse({"id": token_id, "tenant": body.tenant, "role": str(body.role),
                         "token": token, "expiresS": expires}, status_code=201)


@router.get("/tokens", responses=answers(200, 401, 503, ok=PAGE_SCHEMA),
            summary="List tokens (the admin: all; others: their tenant's), never the secret")
async def list_tokens(rt: RuntimeDep, principal: Auth) -> Response:
    async with rt.store.unit() as uow:
        tokens = await uow.tokens.list(tenant=scope_of(principal))
    return JsonResponse({"items": [token_view(t) for t in tokens], "nextCursor": None})


@router.delete("/tokens/{token_id}", responses=answers(200, 401, 404, 422, 503),
               summary="Revoke a token (idempotent; refused by every replica within 1 s)")
async def revoke_token(request: Request, rt: RuntimeDep, principal: Auth,
                       token_id: TokenId) -> Response:
    async with rt.store.unit() as uow:
        info = await uow.tokens.revoke(token_id, tenant=scope_of(principal))
    request.app.state.token_cache.drop(token_id)
    return JsonResponse(token_view(info))


async def _budget_view(rt: RuntimeDep, name: str) -> dict[str, object]:
    async with rt.store.unit() as uow:
        tenant = await uow.tenants.get(name)
        committed, spent = await uow.tenants.spend(name)
    left = None if tenant.budget_usd_per_hour is None \
        else max(0.0, tenant.budget_usd_per_hour - committed)
    return {"tenant": name, "budgetUsdPerHour": tenant.budget_usd_per_hour,
            "committedUsdPerHour": round(committed, 6), "leftUsdPerHour":
            None if left is None else round(left, 6), "spentUsd": round(spent, 6)}


@router.put("/tenants/{name}/budget", responses=answers(200, 401, 403, 413, 422, 503),
            summary="Set a tenant's budget in USD/h (null removes it; admin only)")
async def set_budget(rt: RuntimeDep, _admin: Admin, name: TenantPath,
                     body: BudgetIn) -> Response:
    async with rt.store.unit() as uow:
        await uow.tenants.set_budget(name, body.budget_usd_per_hour)
    return JsonResponse(await _budget_view(rt, name))


@router.get("/tenants/{name}/budget", responses=answers(200, 401, 404, 422, 503),
            summary="A tenant's budget, committed run rate and spend to date")
async def get_budget(rt: RuntimeDep, principal: Auth, name: TenantPath) -> Response:
    if not principal.is_admin and principal.tenant != name:
        raise NotFoundError(kind="tenant", key=name)
    return JsonResponse(await _budget_view(rt, name))
