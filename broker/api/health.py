"""Liveness, readiness and metrics (unauthenticated: for probes and Prometheus).

`/healthz` answers while the process runs. `/readyz` answers 200 only when the
database is reachable and at the code's migration head. `/metrics` exposes the
process-wide default registry (where the loops register their `skyfed_*`
metrics) plus the API's own registry.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import PlainTextResponse, Response

from broker.api.deps import RuntimeDep
from broker.api.openapi import answers
from broker.api.problems import problem, retry_after
from broker.api.views import JsonResponse
from broker.errors import StoreError

router = APIRouter()


@router.get("/healthz", responses=answers(200), summary="Liveness")
async def healthz() -> Response:
    return JsonResponse({"status": "ok"})


@router.get("/readyz", responses=answers(200, 503),
            summary="Readiness: database reachable and migrated")
async def readyz(rt: RuntimeDep) -> Response:
    store = rt.store
    try:
        await store.ping()
        await store.check_schema()
    except StoreError as e:
        return problem(503, "Not ready", e.message, instance="/readyz", headers=retry_after())
    return JsonResponse({"status": "ready", "database": store.dialect})


@router.get("/metrics", summary="Prometheus metrics (skyfed_*)",
            response_class=PlainTextResponse, responses={
    200: {"description": "Prometheus text format",
          "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    body = generate_latest(REGISTRY) + generate_latest(request.app.state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
