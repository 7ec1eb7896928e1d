"""Explain and what-if routes: why a placement went where it went, and what else would cost.

GET  /v1/placements/{id}/explain   the decision record written with the placement
                                   (cost breakdown, runner-up, binding constraints with
                                   shadow prices, infeasibility counts per family, the
                                   policy action used); `?policy=true` adds SHAP
                                   attributions of the RL policy's outputs (headroom,
                                   prewarm lead, bias of the chosen clusters) against its
                                   input features, for the observation stored at decision
                                   time (computed now, off the event loop, ~0.1 s)
POST /v1/placements/{id}/whatif    {"cluster": "NAME"}: re-solve with the workload forced
                                   onto that cluster and return the difference

Tenants see their own placements only (admins see all). The re-solve runs
off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from broker.api.deps import Auth, RuntimeDep, scope_of
from broker.api.openapi import answers
from broker.api.routes import PlacementId
from broker.api.views import JsonResponse, tenant_decision
from broker.errors import NotFoundError, SpecError
from broker.limits import TEXT_PATTERN
from broker.store import UnitOfWork

if TYPE_CHECKING:
    from broker.federation.policy_runtime import PolicyRuntime

router = APIRouter(prefix="/v1")


class WhatIfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str = Field(min_length=1, max_length=200, pattern=TEXT_PATTERN,
                         description="Cluster to force the workload onto.")


@router.get("/placements/{placement_id}/explain", responses=answers(200, 401, 404, 422, 503),
            summary="Why this placement: cost breakdown, runner-up, binding constraints")
async def explain_placement(
        rt: RuntimeDep, principal: Auth, placement_id: PlacementId,
        policy: Annotated[bool, Query(
            description="Add SHAP attributions of the RL policy's outputs.")] = False,
) -> Response:
    async with rt.store.unit() as uow:
        rec = await uow.placements.get(placement_id, tenant=scope_of(principal))
        decision = await uow.placements.get_decision(placement_id, tenant=scope_of(principal))
        steering = decision.get("policy_action")
        if policy and isinstance(steering, Mapping) and "observation_in" in steering:
            steering = await _shared_observation(uow, steering)
    out: dict[str, Any] = {
        "placementId": rec.id, "workloadId": rec.placement.workload_id,
        "active": rec.active, "dispatched": rec.dispatched,
        "costUsdPerHour": rec.placement.cost_usd_per_hour, "rttMs": rec.placement.rtt_ms,
        "decision": decision,
    }
    if policy:
        clusters = sorted({a.cluster for a in rec.placement.assignments})
        out["policyExplanation"] = await asyncio.to_thread(
            _policy_explanation, steering, clusters, rt.policy)
    if not principal.is_admin:
        async with rt.store.unit() as uow:
            usable = await uow.clusters.usable_names(principal.tenant)
        out = redact(out, usable)
    return JsonResponse(out)


def redact(out: dict[str, Any], usable: frozenset[str]) -> dict[str, Any]:
    """A tenant's view of an explanation: the policy's observation (every cluster of the
    federation, by name, with its price and load) is left out, and SHAP features of
    clusters the tenant may not use are dropped. Its own decision record already names
    only clusters it may use (placement/candidates.py `visible`)."""
    decision = tenant_decision(out["decision"])
    expl = out.get("policyExplanation")
    if isinstance(expl, Mapping) and isinstance(expl.get("outputs"), Mapping):
        outputs = {}
        for name, o in expl["outputs"].items():
            feats = [f for f in o.get("top_features", ())
                     if str(f.get("feature", "")).partition(".")[0] in usable | {"batch"}]
            outputs[name] = {**o, "top_features": feats}
        out = {**out, "policyExplanation": {**expl, "outputs": outputs}}
    return {**out, "decision": decision}


async def _shared_observation(uow: UnitOfWork, steering: Mapping[str, Any]) -> dict[str, Any]:
    """Fill in the epoch's observation from the placement the loop stored it in.

    Read without tenant scope: the observation describes the whole federation as the
    policy saw it, which every placement of that epoch shares.
    """
    out = dict(steering)
    try:
        holder = await uow.placements.get_decision(str(steering["observation_in"]), tenant=None)
    except NotFoundError:
        return out
    obs = (holder.get("policy_action") or {}).get("observation")
    if obs is not None:
        out["observation"] = obs
    return out


def _policy_explanation(record: object, clusters: list[str], policy: PolicyRuntime | None
                        ) -> dict[str, Any]:
    """SHAP of the stored observation, or why there is none (fixed weights, checkpoint gone)."""
    from broker.federation.policy_runtime import explain_policy, model_for

    if isinstance(record, Mapping) and "observation_in" in record and "observation" not in record:
        return {"available": False, "source": record.get("source"),
                "reason": f"the epoch's observation was stored with placement "
                          f"{record['observation_in']}, which no longer exists"}
    if not isinstance(record, Mapping) or "observation" not in record:
        source = record.get("source", "unknown") if isinstance(record, Mapping) else "unknown"
        return {"available": False, "source": source,
                "reason": "no learned policy steered this placement (fixed weights or a "
                          "record from before policy records), so there is nothing to attribute"}
    try:
        model = model_for(record, policy)
        outputs = explain_policy(model, record, clusters=clusters)
    except (LookupError, ValueError) as exc:
        return {"available": False, "source": record.get("source"), "reason": str(exc)}
    return {"available": True, "source": record.get("source"),
            "checkpoint": record.get("checkpoint"), "sha256": record.get("sha256"),
            "method": "permutation SHAP; reference: clusters at their mean, usual batch",
            "outputs": outputs}


@router.post("/placements/{placement_id}/whatif",
             responses=answers(200, 401, 404, 413, 422, 503),
             summary="Re-solve with the workload forced onto a cluster; show the difference")
async def whatif_placement(rt: RuntimeDep, principal: Auth, placement_id: PlacementId,
                           body: WhatIfIn) -> Response:
    from broker.federation.placement_loop import whatif_for_placement
    from broker.federation.snapshot import SnapshotReader
    from broker.placement.planner import PlannerError

    try:
        out = await whatif_for_placement(
            rt.store, rt.settings.placement, placement_id, body.cluster,
            tenant=scope_of(principal), catalog=rt.catalog, action_fn=rt.policy,
            reader=SnapshotReader(rt.settings.snapshot, rt.settings.placement,
                                  catalog=rt.catalog))
    except PlannerError as exc:
        raise SpecError(str(exc), loc=("body", "cluster")) from exc
    return JsonResponse(out)
