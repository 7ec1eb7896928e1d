"""RFC 9457 `application/problem+json` for every error, in one place.

Body: `{"type", "title", "status", "detail", "instance", "errors": [{"loc", "msg"}]}`.
`errors[].loc` names the offending field as a path (`["body", "spec", "replicas"]`,
`["header", "Idempotency-Key"]`, `["query", "limit"]`), so a client can point at it.

A 503 (the store failed or is unreachable) carries `Retry-After`: the request
changed nothing and may be retried as is. Bad input is never a 503: a value the
database refuses (a NUL character) is a 422 (`broker/store/engine.py` maps it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from broker.api.views import dumps
from broker.errors import BrokerError, SpecError

log = logging.getLogger("skyfed.api")
PROBLEM = "application/problem+json"
RETRY_AFTER_S = 1


def retry_after() -> dict[str, str]:
    """The header every 503 carries: the broker's store usually recovers in 0.1-0.2 s."""
    return {"Retry-After": str(RETRY_AFTER_S)}


class BodyTooLargeError(Exception):
    """The request body passed `api.max_body_bytes` (raised while it is read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit


def problem(status: int, title: str, detail: str, *, instance: str = "",
            errors: Sequence[dict[str, Any]] = (), headers: Mapping[str, str] | None = None,
            ) -> Response:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status,
                            "detail": detail, "instance": instance}
    if errors:
        body["errors"] = list(errors)
    return Response(dumps(body), status_code=status, media_type=PROBLEM, headers=headers)


def validation_problem(exc: ValidationError | RequestValidationError, path: str,
                       prefix: tuple[str | int, ...] = ()) -> Response:
    errors = [{"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]}
              for e in exc.errors()]
    first = errors[0] if errors else {"loc": [], "msg": "invalid"}
    where = ".".join(str(x) for x in first["loc"])
    return problem(422, "Invalid request", f"{where}: {first['msg']}", instance=path,
                   errors=errors)


def error_response(request: Request, exc: Exception) -> Response:
    """The problem+json answer for any exception a request raised (one mapping for
    FastAPI's handlers and the middleware's fast route)."""
    path = request.url.path
    if isinstance(exc, BrokerError):
        errors: list[dict[str, Any]] = []
        if isinstance(exc, SpecError) and exc.loc:
            errors = [{"loc": list(exc.loc), "msg": exc.message}]
        if exc.status >= 500:
            log.error("%s %s: %s", request.method, path, exc.message)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else (
            retry_after() if exc.status == 503 else None)
        return problem(exc.status, exc.title, exc.message, instance=path, errors=errors,
                       headers=headers)
    if isinstance(exc, RequestValidationError):
        return validation_problem(exc, path)
    if isinstance(exc, ValidationError):
        return validation_problem(exc, path, ("body",))
    if isinstance(exc, BodyTooLargeError):
        return problem(413, "Request body too large", str(exc), instance=path,
                       errors=[{"loc": ["body"], "msg": str(exc)}])
    if isinstance(exc, StarletteHTTPException):
        if exc.status_code == 400:  # FastAPI: a body it cannot decode (not UTF-8, not JSON)
            return problem(422, "Invalid request", f"body: {exc.detail}", instance=path,
                           errors=[{"loc": ["body"], "msg": str(exc.detail)}])
        return problem(exc.status_code, str(exc.detail), str(exc.detail), instance=path,
                       headers=exc.headers)
    log.error("unhandled error on %s %s", request.method, path, exc_info=exc)
    return problem(500, "Internal broker error", type(exc).__name__, instance=path)


def install(app: FastAPI) -> None:
    """Register `error_response` for every exception type the API can raise."""

    async def handler(request: Request, exc: Exception) -> Response:
        return error_response(request, exc)

    for exc_type in (BrokerError, RequestValidationError, ValidationError, BodyTooLargeError,
                     StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handler)
