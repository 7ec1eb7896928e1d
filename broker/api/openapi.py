"""What /openapi.json promises about answers: every status a route really returns.

Each route lists its statuses with `responses=answers(...)`. Errors are RFC 9457
problem+json (`problems.py`) with the `Problem` schema; a 503 carries
`Retry-After` (the store was unreachable: retrying is right), a 401
`WWW-Authenticate`. `install(app)` adds the shared components (`Problem`,
`Page`, the bearer scheme) and marks every `/v1` operation as needing a token.

Why it matters: clients generate code and retry logic from this document, and
the schemathesis run in the test suite (`tests/integration/test_api_fuzz.py`)
fails on any status, media type or header the document does not list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

PROBLEM = "application/problem+json"
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `errors[].loc` names the offending field.",
    "required": ["type", "title", "status", "detail", "instance"],
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"}, "instance": {"type": "string"},
        "errors": {"type": "array", "items": {
            "type": "object", "required": ["loc", "msg"],
            "properties": {"loc": {"type": "array",
                                   "items": {"anyOf": [{"type": "string"},
                                                       {"type": "integer"}]}},
                           "msg": {"type": "string"}, "type": {"type": "string"}}}},
    },
}
PAGE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["items", "nextCursor"],
    "properties": {"items": {"type": "array", "items": {"type": "object"}},
                   "nextCursor": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
}

_WHY = {
    200: "OK", 201: "Created",
    202: "Accepted: draining; removed once its workloads have moved",
    401: "Missing, malformed, unknown or revoked bearer token",
    403: "Authenticated, but the call needs the admin token",
    404: "No such row for this tenant",
    409: "Conflict: a name owned by another tenant, or an Idempotency-Key reused "
         "with a different body",
    413: "Request body larger than api.max_body_bytes",
    422: "Invalid request; errors[].loc names the field. Nothing was stored",
    503: "The store is unreachable or not migrated; retry after Retry-After seconds",
}
_HEADERS = {
    401: {"WWW-Authenticate": {"required": True, "schema": {"type": "string"},
                               "description": "Bearer"}},
    503: {"Retry-After": {"required": True, "schema": {"type": "string"},
                          "description": "seconds"}},
}


def answers(*statuses: int, ok: dict[str, Any] | None = None) -> dict[int | str, Any]:
    """The `responses=` of a route: its success statuses (JSON, with `ok` as the body
    schema) and error statuses (problem+json)."""
    out: dict[int | str, Any] = {}
    for status in statuses:
        if status < 400:
            out[status] = {"description": _WHY[status],
                           "content": {"application/json": {"schema": ok or {"type": "object"}}}}
        else:
            out[status] = {"description": _WHY[status],
                           "content": {PROBLEM: {"schema": _PROBLEM_REF}}}
            if status in _HEADERS:
                out[status]["headers"] = _HEADERS[status]
    return out


def merge_answers(base: dict[int | str, Any], extra: dict[int | str, Any]
                  ) -> dict[int | str, Any]:
    """`base` with more media types (`{200: {"content": {...}}}`) for some statuses."""
    out = {k: dict(v) for k, v in base.items()}
    for status, more in extra.items():
        out[status]["content"] = {**out[status].get("content", {}), **more.get("content", {})}
    return out


def install(app: FastAPI) -> None:
    """Add `Problem`, `Page` and the bearer scheme to the document; `/v1` needs a token."""
    original: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        comps = schema.setdefault("components", {})
        comps.setdefault("schemas", {}).update(Problem=PROBLEM_SCHEMA, Page=PAGE_SCHEMA)
        comps.setdefault("securitySchemes", {})["bearerAuth"] = {
            "type": "http", "scheme": "bearer",
            "description": "`Authorization: Bearer <token>` (skyfed token create)"}
        for path, item in schema.get("paths", {}).items():
            if path.startswith("/v1/"):
                for operation in item.values():
                    operation.setdefault("security", [{"bearerAuth": []}])
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
