"""Request dependencies: the broker's `Runtime`, and bearer-token authentication.

Handlers take `rt: RuntimeDep` (the `Runtime` that `create_app` put on `app.state`).
The hot path (`POST /v1/workloads`) skips FastAPI's dependency solver and calls
`get_runtime(request)` and `current_principal(request)` directly.

Tokens are looked up by their sha256 (`store.auth`). A small in-process cache
keeps the hot path to one SQL statement per request; entries live `TTL_S`
seconds, so a token revoked through any replica (or expired) stops working on
every replica within that time: the revocation is a row in the shared database,
and no replica trusts its cache for longer than 1 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from broker.errors import AuthError, ForbiddenError
from broker.federation.runtime import Runtime
from broker.store import Principal

TTL_S = 1.0
MAX_ENTRIES = 10_000


class TokenCache:
    """Resolved tokens for `ttl_s` seconds of `clock` (monotonic seconds; tests pass
    their own to check the expiry without waiting on a loaded machine)."""

    def __init__(self, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[str, tuple[Principal, float]] = {}

    def get(self, token: str) -> Principal | None:
        hit = self._entries.get(token)
        if hit is None:
            return None
        if hit[1] <= self.clock():
            del self._entries[token]
            return None
        return hit[0]

    def drop(self, token_id: str) -> None:
        """Forget a token at once on this replica (it was revoked here); the others forget
        it within `ttl_s`."""
        for key in [k for k, (p, _) in self._entries.items() if p.token_id == token_id]:
            del self._entries[key]

    def put(self, token: str, principal: Principal) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[token] = (principal, self.clock() + self.ttl_s)


def get_runtime(request: Request) -> Runtime:
    """The `Runtime` the app was created over (`broker.app.create_app`)."""
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def current_principal(request: Request) -> Principal:
    header = request.headers.get("authorization")
    if not header:
        raise AuthError("missing bearer token (send 'Authorization: Bearer <token>')")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError("Authorization header must be 'Bearer <token>'")
    cache: TokenCache = request.app.state.token_cache
    principal = cache.get(token)
    if principal is None:
        async with get_runtime(request).store.unit() as uow:
            principal = await uow.tokens.resolve(token)
        if principal is None:
            raise AuthError("unknown or revoked token")
        cache.put(token, principal)
    return principal


async def admin_principal(principal: Annotated[Principal, Depends(current_principal)],
                          ) -> Principal:
    if not principal.is_admin:
        raise ForbiddenError("this call needs the admin token")
    return principal


Auth = Annotated[Principal, Depends(current_principal)]
Admin = Annotated[Principal, Depends(admin_principal)]


def scope_of(p: Principal) -> str | None:
    """The tenant filter for reads: admins see every tenant, others only their own."""
    return None if p.is_admin else p.tenant
