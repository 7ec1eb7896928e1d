"""The broker's error tree. Foreign errors (SQLAlchemy, asyncpg, sqlite) are
mapped into it once, inside `broker/store`, with `raise ... from exc`; the API
maps it to RFC 9457 problem+json in one handler (`broker/api/problems.py`).

    BrokerError                      (500) root; `status` is the HTTP code the API answers
     +-- ConfigError                 (500) settings that cannot work (bad URL, missing file)
     +-- AuthError                   (401) missing, unknown or revoked bearer token
     |    +-- ForbiddenError         (403) authenticated but not allowed (admin-only call)
     +-- NotFoundError               (404) no such row *for this tenant* (never 403: no leak)
     +-- SpecError                   (422) a request that is well-formed but absurd; names `loc`
     +-- StoreError                  (503) the database failed or is unreachable
          +-- ConflictError          (409) a unique key already holds a different row
          |    +-- IdempotencyError  (409) same Idempotency-Key, different body
          +-- SchemaOutdatedError    (503) the database is not at the code's migration head
          +-- FencedError            (503) a deposed leader's write, refused (store/leadership.py)

Subclasses carry data (`NotFoundError(kind="workload", key="w-1")`) so callers
can act on more than the message.
"""

from __future__ import annotations

from collections.abc import Sequence


class BrokerError(Exception):
    """Root of every error the broker raises on purpose."""

    status: int = 500
    title: str = "Internal broker error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(BrokerError):
    title = "Configuration error"


class AuthError(BrokerError):
    status = 401
    title = "Unauthorized"


class ForbiddenError(AuthError):
    status = 403
    title = "Forbidden"


class NotFoundError(BrokerError):
    status = 404
    title = "Not found"

    def __init__(self, *, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")
        self.kind = kind
        self.key = key


class SpecError(BrokerError):
    """A value that parses but makes no sense; `loc` names the offending field."""

    status = 422
    title = "Invalid request"

    def __init__(self, message: str, *, loc: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.loc = tuple(loc)


class StoreError(BrokerError):
    status = 503
    title = "Store unavailable"


class ConflictError(StoreError):
    status = 409
    title = "Conflict"


class IdempotencyError(ConflictError):
    title = "Idempotency-Key reused with a different body"

    def __init__(self, *, key: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} was already used with a different body")
        self.key = key


class SchemaOutdatedError(StoreError):
    title = "Database not migrated"


class FencedError(StoreError):
    """A singleton loop's write from a replica that no longer holds the leader epoch."""

    title = "Not the leader"
