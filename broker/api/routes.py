"""The `/v1` resource routes. Thin: parse, validate, one unit of work, respond.

POST /v1/workloads is the hot path (benchmark goal >= 1,000/s): it reads the
raw body (JSON or YAML), validates it with pydantic, and stores it with
`Store.submit_workload` (one durable statement on PostgreSQL: insert unless
the Idempotency-Key exists, plus the event) before the 201.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Header, Path, Query, Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from broker.api import lifecycle, manifests
from broker.api.conditions import status_extra
from broker.api.deps import Auth, RuntimeDep, current_principal, get_runtime, scope_of
from broker.api.openapi import PAGE_SCHEMA, answers, merge_answers
from broker.api.problems import BodyTooLargeError
from broker.api.schemas import NAME_RE, ClusterIn, SiteIn, WorkloadIn
from broker.api.views import (
    JsonResponse,
    cluster_detail_view,
    cluster_view,
    event_view,
    observed_view,
    placement_view,
    site_cluster_view,
    site_view,
    tenant_decision,
    workload_view,
)
from broker.api.watch import stream as watch_stream
from broker.domain import Offer, WorkloadSpec, WorkloadStatus
from broker.errors import ConflictError, IdempotencyError, SpecError
from broker.federation.runtime import Runtime
from broker.limits import TEXT_PATTERN, is_text
from broker.placement.durations import DurationPredictor
from broker.store import ClusterRecord, Principal
from broker.store.mapping import spec_sha256, spec_to_json
from providers.errors import NotFoundError as ProviderNotFoundError

try:
    import orjson

    _loads: Any = orjson.loads
    _JSONError: Any = orjson.JSONDecodeError
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads
    _JSONError = ValueError

_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

router = APIRouter(prefix="/v1")
Limit = Annotated[int, Query(ge=1, le=1000)]
# Ids are ours (`w-<hex>`, `p-<hex>`); anything else cannot name a row.
ID_PATTERN = r"^[A-Za-z0-9._-]+$"
WorkloadId = Annotated[str, Path(min_length=1, max_length=64, pattern=ID_PATTERN)]
# A workload's id (`w-` and 16 hex digits) or its name (no name looks like an id).
WorkloadRef = Annotated[str, Path(min_length=1, max_length=253, pattern=NAME_RE,
                                  description="The workload's id or its name")]
PlacementId = Annotated[str, Path(min_length=1, max_length=64, pattern=ID_PATTERN)]
MemberName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME_RE)]
Cursor = Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_=-]*$")]
MAX_DOCUMENTS = 100
_BODY = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/WorkloadIn"}},
                     "application/yaml": {"schema": {"$ref": "#/components/schemas/WorkloadIn"}}},
         "required": True}


async def parse_documents(request: Request) -> list[Any]:
    """The body's documents: JSON (one document, or a `kind: List`), or YAML when the
    content type says so (multi-document: a workload with its companions and policy)."""
    raw = await request.body()
    if not raw.strip():
        raise SpecError("request body is empty", loc=("body",))
    if "yaml" in request.headers.get("content-type", ""):
        try:
            docs = [d for d in yaml.load_all(raw, Loader=_YamlLoader) if d is not None]
        except yaml.YAMLError as e:
            raise SpecError(f"body is not valid YAML: {e}", loc=("body",)) from e
        if not docs:
            raise SpecError("request body holds no document", loc=("body",))
    else:
        try:
            docs = [_loads(raw)]
        except _JSONError as e:
            raise SpecError(f"body is not valid JSON: {e}", loc=("body",)) from e
    if len(docs) == 1 and isinstance(docs[0], dict) and docs[0].get("kind") == "List" \
            and isinstance(docs[0].get("items"), list):
        docs = [d for d in docs[0]["items"] if d is not None]
    if len(docs) > MAX_DOCUMENTS:
        raise SpecError(f"at most {MAX_DOCUMENTS} documents per request", loc=("body",))
    return docs


def _is_skyfed_body(docs: list[Any]) -> bool:
    """One skyfed `Workload` (or something that is no Kubernetes document at all: the
    Workload model then says what is wrong with it)."""
    if len(docs) != 1:
        return False
    doc = docs[0]
    if not isinstance(doc, dict) or not isinstance(doc.get("apiVersion"), str):
        return True
    return doc["apiVersion"] == "skyfed.io/v1" and doc.get("kind") != "PlacementPolicy"


async def spec_of(request: Request, rt: Runtime, tenant: str) -> WorkloadSpec:
    """The submitted workload: a skyfed `Workload`, or Kubernetes manifests (manifests.py)."""
    docs = await parse_documents(request)
    if _is_skyfed_body(docs):
        return WorkloadIn.model_validate(docs[0]).to_domain()
    predictor = DurationPredictor()  # no history kept live yet: its prior per size class
    spec = manifests.convert(docs, duration_of=lambda res, n: predictor.predict(
        tenant, res, n, at_s=0.0).duration_s)
    if spec.resources.gpu > 0:
        await _require_gpu_pool(rt, spec, manifests.gpu_loc(docs))
    if spec.replica_weights:
        await _require_weighted_clusters(rt, tenant, manifests.weighted_cluster_names(docs))
    return spec


async def _require_weighted_clusters(rt: Runtime, tenant: str,
                                     names: list[tuple[str, tuple[str | int, ...]]]) -> None:
    """A static weight naming no member this tenant may use would never get its share: refuse
    it, naming the entry. A member private to another tenant is answered like one that does
    not exist (a tenant learns nothing of the others' clusters)."""
    if not names:
        return
    async with rt.store.unit() as uow:
        usable = await uow.clusters.usable_names(tenant)
    for name, loc in names:
        if name not in usable:
            raise SpecError(f"no member cluster or site named {name!r} that this tenant may "
                            "use (GET /v1/clusters lists them)", loc=loc)


async def _require_gpu_pool(rt: Runtime, spec: WorkloadSpec,
                            loc: tuple[str | int, ...]) -> None:
    """A GPU request with no GPU anywhere in the federation can never be placed: refuse it
    now, naming the request, instead of keeping it pending forever."""
    async with rt.store.unit() as uow:
        clusters = await uow.clusters.list()
        sites = await uow.sites.list()
    if any(p.node.gpu > 0 for c in clusters for p in c.pools) \
            or any(s.capacity.gpu > 0 for s in sites):
        return
    raise SpecError(f"{spec.resources.gpu} {manifests.GPU} requested, but no cluster or site "
                    "of the federation has a GPU pool", loc=loc)


_IDEM_PARAM = {"name": "Idempotency-Key", "in": "header", "required": False,
               "schema": {"type": "string", "minLength": 1, "maxLength": 200,
                          "pattern": TEXT_PATTERN},
               "description": "Retrying with the same key returns the same workload."}


@router.post("/workloads", status_code=201,
             openapi_extra={"requestBody": _BODY, "parameters": [_IDEM_PARAM]},
             responses=answers(201, 200, 401, 409, 413, 422, 503),
             summary="Submit a workload (idempotent with Idempotency-Key)")
async def submit_workload(request: Request) -> Response:
    # The hot path: auth and the header are read inline, not through FastAPI's
    # dependency solver (measurably cheaper per request).
    principal = await current_principal(request)
    idempotency_key = request.headers.get("idempotency-key")
    if idempotency_key is not None and (not 0 < len(idempotency_key) <= 200
                                        or not is_text(idempotency_key)):
        raise SpecError("Idempotency-Key must be 1-200 characters without control characters",
                        loc=("header", "Idempotency-Key"))
    rt = get_runtime(request)
    metrics = request.app.state.metrics
    try:
        spec = await spec_of(request, rt, principal.tenant)
    except (ValidationError, SpecError):
        metrics.rejected.labels("422").inc()
        raise
    except BodyTooLargeError:
        metrics.rejected.labels("413").inc()
        raise
    spec_json = spec_to_json(spec)
    digest = spec_sha256(spec_json)
    for attempt in (1, 2):
        try:
            rec, created = await rt.store.submit_workload(
                tenant=principal.tenant, spec=spec, spec_json=spec_json,
                idempotency_key=idempotency_key, request_sha256=digest)
            break
        except IdempotencyError:
            metrics.rejected.labels("409").inc()
            raise
        except ConflictError:
            # Lost a race with an identical first submission: read the winner.
            if idempotency_key is None or attempt == 2:
                raise
    if created:
        metrics.submitted.labels(str(spec.kind)).inc()
        rt.wake_placement()  # event-driven (batched for placement.batch_window_s), any replica
    return JsonResponse(workload_view(rec), status_code=201 if created else 200,
                        headers={"Location": f"/v1/workloads/{rec.workload.id}"})


_SSE = {"text/event-stream": {"schema": {
    "type": "object", "description": "One server-sent event: `event` ADDED or MODIFIED, "
                                     "`data` the workload (JSON), `id` the event-log id",
    "properties": {"event": {"type": "string", "enum": ["ADDED", "MODIFIED"]},
                   "data": {"type": "string"}, "id": {"type": "string"}}}}}


@router.get("/workloads", responses=merge_answers(
    answers(200, 401, 422, 503, ok=PAGE_SCHEMA), {200: {"content": _SSE}}),
            summary="List this tenant's workloads (oldest first), or watch them (watch=true)")
async def list_workloads(
        request: Request, rt: RuntimeDep, principal: Auth, limit: Limit = 50,
        cursor: Cursor = None, status: WorkloadStatus | None = None,
        watch: Annotated[bool, Query(description="Stream changes as server-sent events "
                                                 "(like kubectl get -w)")] = False,
        timeout_seconds: Annotated[int, Query(alias="timeoutSeconds", ge=0, le=3600,
                                              description="End a watch after this long "
                                                          "(0: the listing only)")] = 300,
        last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0,
                                                    le=2**53)] = None,
) -> Response:
    if watch:
        return StreamingResponse(watch_stream(
            rt.store, tenant=scope_of(principal), timeout_s=float(timeout_seconds),
            poll_s=rt.settings.api.watch_poll_s, resume_after=last_event_id,
            gone=request.is_disconnected), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"})
    async with rt.store.unit() as uow:
        page = await uow.workloads.list(tenant=scope_of(principal), status=status,
                                        limit=limit, cursor=cursor)
    return JsonResponse({"items": [workload_view(r) for r in page.items],
                         "nextCursor": page.next_cursor})


@router.get("/workloads/{ref}", responses=answers(200, 401, 404, 422, 503),
            summary="One workload (by id or name) with its status")
async def get_workload(rt: RuntimeDep, principal: Auth, ref: WorkloadRef) -> Response:
    async with rt.store.unit() as uow:
        rec = await uow.workloads.resolve(ref, tenant=scope_of(principal))
        placement = await uow.placements.get_active_for_workload(rec.workload.id)
    view = workload_view(rec)
    view["status"] |= status_extra(rec, placement)
    return JsonResponse(view)


@router.put("/workloads/{ref}", status_code=200,
            openapi_extra={"requestBody": _BODY},
            responses=answers(200, 201, 401, 404, 409, 413, 422, 503),
            summary="Create or change a workload by name (skyfed apply)")
async def put_workload(request: Request, rt: RuntimeDep, principal: Auth,
                       ref: WorkloadRef) -> Response:
    """Upsert: a new name is created (201); a changed spec is rolled out, scaled in place
    or re-planned (lifecycle.py), 200. `ref` may also be the id of a live workload."""
    spec = await spec_of(request, rt, principal.tenant)
    async with rt.store.unit() as uow:
        rec, created, change = await lifecycle.upsert(uow, tenant=principal.tenant, ref=ref,
                                                      spec=spec)
    if change != "unchanged" and rt.placement_loop is not None:
        rt.placement_loop.wake()
    if change in ("rollout", "scale-down") and rt.dispatcher is not None:
        rt.dispatcher.wake()
    return JsonResponse(workload_view(rec) | {"change": change},
                        status_code=201 if created else 200,
                        headers={"Location": f"/v1/workloads/{rec.workload.id}"})


_PATCH_BODY = {"content": {"application/merge-patch+json": {"schema": {"type": "object"}},
                           "application/json": {"schema": {"type": "object"}}},
               "required": True}


@router.patch("/workloads/{ref}", openapi_extra={"requestBody": _PATCH_BODY},
              responses=answers(200, 401, 404, 409, 413, 422, 503),
              summary="Change a workload with a JSON merge patch (RFC 7396)")
async def patch_workload(request: Request, rt: RuntimeDep, principal: Auth,
                         ref: WorkloadRef) -> Response:
    docs = await parse_documents(request)
    if len(docs) != 1:
        raise SpecError("a merge patch is one JSON object", loc=("body",))
    async with rt.store.unit() as uow:
        current = await uow.workloads.resolve(ref, tenant=principal.tenant)
    old = current.workload.spec
    doc = lifecycle.patched_document(workload_view(current), docs[0],
                                     native=old.native is not None)
    spec = dataclasses.replace(WorkloadIn.model_validate(doc).to_domain(),
                               native=old.native, cluster_names=old.cluster_names,
                               replica_weights=old.replica_weights)
    async with rt.store.unit() as uow:
        rec, _, change = await lifecycle.upsert(uow, tenant=principal.tenant,
                                                ref=current.workload.id, spec=spec)
    if change != "unchanged" and rt.placement_loop is not None:
        rt.placement_loop.wake()
    if change in ("rollout", "scale-down") and rt.dispatcher is not None:
        rt.dispatcher.wake()
    return JsonResponse(workload_view(rec) | {"change": change})


@router.delete("/workloads/{ref}", responses=answers(200, 401, 404, 422, 503),
               summary="Cancel a workload (idempotent)")
async def cancel_workload(request: Request, rt: RuntimeDep, principal: Auth,
                          ref: WorkloadRef) -> Response:
    async with rt.store.unit() as uow:
        found = await uow.workloads.resolve(ref, tenant=scope_of(principal))
        rec = await uow.workloads.cancel(found.workload.id, tenant=scope_of(principal))
    request.app.state.metrics.cancelled.inc()
    return JsonResponse(workload_view(rec))


@router.post("/clusters", status_code=201, responses=answers(201, 200, 401, 409, 413, 422, 503),
             summary="Register or replace a member cluster")
async def register_cluster(rt: RuntimeDep, principal: Auth, body: ClusterIn) -> Response:
    # Where each pool's price comes from until sync has one (the snapshot's provenance).
    sources = {p.name: "catalog" if p.price_usd_per_hour is None else "registration"
               for p in body.pools}
    body = body.with_catalog(_catalog_offer(rt))
    shared = _shared(principal, body.lend_to)
    async with rt.store.unit() as uow:
        created = await uow.clusters.upsert(body.to_domain(), tenant=principal.tenant,
                                            account=body.account, attrs=body.attrs,
                                            shared=shared, lent_to=body.lend_to)
        await uow.clusters.set_attrs(body.name, {"price_sources": sources})
        rec = await uow.clusters.get(body.name)
    rt.wake_placement()  # pending work may fit now (it waits with backoff until then)
    return JsonResponse(cluster_view(rec), status_code=201 if created else 200)


@router.get("/clusters", responses=answers(200, 401, 503, ok=PAGE_SCHEMA),
            summary="List member clusters (registered, and what was observed)")
async def list_clusters(rt: RuntimeDep, principal: Auth) -> Response:
    async with rt.store.unit() as uow:
        recs = await uow.clusters.list_records(tenant=scope_of(principal))
        inventory = await uow.inventory.list()
        now = uow.now
    return JsonResponse({"items": [
        cluster_view(r) | {"observed": observed_view(inventory.get(r.cluster.name), now)}
        for r in recs], "nextCursor": None})


@router.get("/clusters/{name}", responses=answers(200, 401, 404, 422, 503),
            summary="One member: registration, observed inventory, price and quota provenance")
async def get_cluster(rt: RuntimeDep, principal: Auth, name: MemberName) -> Response:
    """A registered cluster, or an edge site as the edge cluster the planner sees, merged
    from every sensor the way the placement loop merges it (placement/snapshot.py)."""
    from broker.federation.snapshot import SnapshotReader

    reader = SnapshotReader(rt.settings.snapshot, rt.settings.placement)
    merged, readings, record = await reader.cluster(rt.store, name,
                                                    tenant=scope_of(principal))
    if isinstance(record, ClusterRecord):
        base = cluster_view(record)
        quota = readings.quotas.get((record.account or "", merged.region)) \
            if record.account else None
    else:
        base, quota = site_cluster_view(record, merged), None
    limit = quota.vcpu_limit if quota is not None else record.cluster.quota_vcpu \
        if isinstance(record, ClusterRecord) else None
    used = quota.vcpu_used if quota is not None and quota.vcpu_limit is not None else None
    return JsonResponse(cluster_detail_view(base, merged, readings.inventory.get(name),
                                            limit, used, readings.now_s))


async def _drain(rt: Runtime, principal: Principal, kind: str, name: str) -> Response:
    """Mark a member draining (federation/drain.py): the placement loop moves its workloads
    elsewhere by migrations, then removes it. Removed at once when nothing runs there."""
    tenant = scope_of(principal)
    async with rt.store.unit() as uow:
        repo = uow.clusters if kind == "cluster" else uow.sites
        rec = await repo.get(name, tenant=tenant)  # 404 unless it is the caller's (or admin)
        running = await uow.placements.list_active_on_cluster(name)
        if not running:
            await repo.delete(name, tenant=tenant)
            return JsonResponse({"name": name, "kind": kind, "removed": True,
                                 "draining": False, "workloads": 0})
        await repo.set_attrs(name, {"draining": True})
        # The member's owner's event (a federation event only for a federation-wide one),
        # whoever drains it: an admin draining a tenant's private member names it to no one else.
        await uow.events.append(f"{kind}.draining", name, {"workloads": len(running)},
                                tenant=None if rec.shared else rec.tenant)
    if rt.placement_loop is not None:
        rt.placement_loop.wake()
    return JsonResponse({"name": name, "kind": kind, "removed": False, "draining": True,
                         "workloads": len(running)}, status_code=202)


@router.delete("/clusters/{name}", responses=answers(200, 202, 401, 404, 422, 503),
               summary="Remove a member cluster: drain it first (its workloads migrate)")
async def delete_cluster(rt: RuntimeDep, principal: Auth, name: MemberName) -> Response:
    return await _drain(rt, principal, "cluster", name)


@router.delete("/sites/{name}", responses=answers(200, 202, 401, 404, 422, 503),
               summary="Remove an edge site: drain it first (its workloads migrate)")
async def delete_site(rt: RuntimeDep, principal: Auth, name: MemberName) -> Response:
    return await _drain(rt, principal, "site", name)


@router.post("/sites", status_code=201, responses=answers(201, 200, 401, 409, 413, 422, 503),
             summary="Register or replace an edge site")
async def register_site(rt: RuntimeDep, principal: Auth, body: SiteIn) -> Response:
    shared = _shared(principal, body.lend_to)
    async with rt.store.unit() as uow:
        created = await uow.sites.upsert(body.to_domain(), tenant=principal.tenant,
                                         attrs=body.attrs, shared=shared, lent_to=body.lend_to)
        rec = await uow.sites.get(body.name)
    rt.wake_placement()  # pending work may fit now (it waits with backoff until then)
    return JsonResponse(site_view(rec), status_code=201 if created else 200)


@router.get("/sites", responses=answers(200, 401, 503, ok=PAGE_SCHEMA),
            summary="List edge sites")
async def list_sites(rt: RuntimeDep, principal: Auth) -> Response:
    async with rt.store.unit() as uow:
        recs = await uow.sites.list_records(tenant=scope_of(principal))
    return JsonResponse({"items": [site_view(r) for r in recs], "nextCursor": None})


@router.get("/placements/{placement_id}", responses=answers(200, 401, 404, 422, 503),
            summary="One placement with its decision record")
async def get_placement(rt: RuntimeDep, principal: Auth,
                        placement_id: PlacementId) -> Response:
    async with rt.store.unit() as uow:
        rec = await uow.placements.get(placement_id, tenant=scope_of(principal))
    view = placement_view(rec)
    if not principal.is_admin:
        view["decision"] = tenant_decision(view["decision"])
    return JsonResponse(view)


@router.get("/events", responses=answers(200, 401, 422, 503, ok=PAGE_SCHEMA),
            summary="The event log (oldest first): failovers, syncs, placements")
async def list_events(
        rt: RuntimeDep, principal: Auth, limit: Limit = 100,
        after: Annotated[int, Query(ge=0, le=2**53)] = 0,
        kind: Annotated[str | None, Query(max_length=64, pattern=TEXT_PATTERN)] = None,
        subject: Annotated[str | None, Query(max_length=253, pattern=TEXT_PATTERN)] = None,
) -> Response:
    """A tenant sees its own events plus the federation's (site health, failovers,
    price changes); the admin sees all. Page with `after=<last id>`."""
    async with rt.store.unit() as uow:
        events = await uow.events.list(tenant=scope_of(principal), after_id=after,
                                       limit=limit, kind=kind, subject=subject,
                                       include_system=True)
    items = [event_view(e) for e in events]
    nxt = str(items[-1]["id"]) if len(items) == limit else None
    return JsonResponse({"items": items, "nextCursor": nxt})


@router.get("/providers", responses=answers(200, 401, 503, ok=PAGE_SCHEMA),
            summary="Provider accounts and their price/quota sync health")
async def list_providers(rt: RuntimeDep, principal: Auth) -> Response:
    async with rt.store.unit() as uow:
        accounts = await uow.quotas.list_accounts()
    return JsonResponse({"items": [
        {"name": a.name, "provider": a.provider, "stale": a.stale, "failures": a.failures,
         "lastOkS": a.last_ok_s, "lastError": a.last_error} for a in accounts],
        "nextCursor": None})


def _shared(principal: Principal, lend_to: list[str]) -> bool:
    """An admin's or operator's member is federation-wide; a tenant's is private to it and
    the tenants it lends it to (`lendTo`), which only a private member has."""
    if principal.registers_shared and lend_to:
        raise SpecError("lendTo: an admin's or operator's registration is federation-wide "
                        "(lent to every tenant); only a tenant's private member is lent",
                        loc=("body", "lendTo"))
    return principal.registers_shared


def _catalog_offer(rt: Runtime) -> Callable[[str, str, str], Offer]:
    """`(provider, region, instance_type) -> Offer` from the offline catalog (loaded once
    per process); LookupError when it has no such offer."""
    catalog = rt.offline_catalog()

    def offer_of(provider: str, region: str, instance_type: str) -> Offer:
        try:
            offer: Offer = catalog.offer(provider, region, instance_type)
        except ProviderNotFoundError as e:
            raise LookupError(str(e)) from e
        return offer

    return offer_of
