"""Explain and what-if routes: why a placement went where it went, and what else would cost.

GET  /v1/placements/{id}/explain   the decision record written with the placement
                                   (cost breakdown, runner-up, binding constraints with
                                   shadow prices, infeasibility counts per family)
POST /v1/placements/{id}/whatif    {"cluster": "NAME"}: re-solve with the workload forced
                                   onto that cluster and return the difference

Tenants see their own placements only (admins see all). The re-solve runs
off the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from broker.api.deps import Auth, get_services, scope_of
from broker.api.views import JsonResponse
from broker.errors import SpecError

router = APIRouter(prefix="/v1")


class WhatIfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str = Field(min_length=1, max_length=200,
                         description="Cluster to force the workload onto.")


@router.get("/placements/{placement_id}/explain",
            summary="Why this placement: cost breakdown, runner-up, binding constraints")
async def explain_placement(request: Request, principal: Auth, placement_id: str) -> Response:
    async with get_services(request).store.unit() as uow:
        rec = await uow.placements.get(placement_id, tenant=scope_of(principal))
        decision = await uow.placements.get_decision(placement_id, tenant=scope_of(principal))
    return JsonResponse({
        "placementId": rec.id, "workloadId": rec.placement.workload_id,
        "active": rec.active, "dispatched": rec.dispatched,
        "costUsdPerHour": rec.placement.cost_usd_per_hour, "rttMs": rec.placement.rtt_ms,
        "decision": decision,
    })


@router.post("/placements/{placement_id}/whatif",
             summary="Re-solve with the workload forced onto a cluster; show the difference")
async def whatif_placement(request: Request, principal: Auth, placement_id: str,
                           body: WhatIfIn) -> Response:
    from broker.federation.placement_loop import whatif_for_placement
    from broker.placement.planner import PlannerError

    services = get_services(request)
    catalog = services.extras.get("catalog")
    try:
        out = await whatif_for_placement(
            services.store, services.settings.placement, placement_id, body.cluster,
            tenant=scope_of(principal), catalog=catalog)
    except PlannerError as exc:
        raise SpecError(str(exc), loc=("body", "cluster")) from exc
    return JsonResponse(out)
