"""`GET /v1/workloads?watch=true`: the tenant's workloads as server-sent events, like `kubectl
get -w`.

The stream first sends every live workload (`event: ADDED`), then one `event: MODIFIED` per
change, each with the workload as `GET /v1/workloads/{ref}` shows it (`data:`), its
`status.phase` the one that change recorded (so every transition shows, even several between
two reads), and the event-log id (`id:`). Changes come from the event log (every status
transition, update and cancel appends a `workload.*` event in the same unit of work as the
change), read every `poll_s`; the id read before the first listing is where it starts, so
nothing that happens while the stream opens is missed (a workload may come twice). A client
that reconnects with `Last-Event-ID` resumes after that event without the initial listing.
The stream ends after `timeoutSeconds` (0: the listing only), or when the client goes away;
a comment line keeps idle connections open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from broker.api.conditions import status_extra
from broker.api.views import dumps, workload_view
from broker.errors import NotFoundError
from broker.store import Store, UnitOfWork
from broker.store.workloads import TERMINAL

KEEPALIVE_S = 15.0
# event kind (after `workload.`) -> the phase it records
_PHASE_OF = {"submitted": "pending", "requeued": "pending", "placed": "placed",
             "running": "running", "succeeded": "succeeded", "failed": "failed",
             "cancelled": "cancelled", "unplaceable": "unplaceable", "pending": "pending"}


async def _view(uow: UnitOfWork, wid: str, tenant: str | None) -> dict[str, Any] | None:
    try:
        rec = await uow.workloads.get(wid, tenant=tenant)
    except NotFoundError:
        return None
    view = workload_view(rec)
    view["status"] |= status_extra(rec, await uow.placements.get_active_for_workload(wid))
    return view


def sse(event: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + dumps(data) + b"\n\n"


async def stream(store: Store, *, tenant: str | None, timeout_s: float, poll_s: float,
                 resume_after: int | None,
                 gone: Callable[[], Awaitable[bool]]) -> AsyncIterator[bytes]:
    """The event stream of `tenant`'s workloads (None: the admin, every tenant's). The
    timeout is wall time of the connection (the event loop's clock), not the broker's."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    async with store.unit() as uow:
        last = resume_after if resume_after is not None else await uow.events.last_id()
        if resume_after is None:
            cursor: str | None = None
            while True:
                page = await uow.workloads.list(tenant=tenant, limit=500, cursor=cursor)
                for rec in page.items:
                    if rec.workload.status not in TERMINAL:
                        yield sse("ADDED", workload_view(rec))
                cursor = page.next_cursor
                if cursor is None:
                    break
    idle_s = 0.0
    while loop.time() < end and not await gone():
        async with store.unit() as uow:
            events = await uow.events.list(tenant=tenant, after_id=last, limit=500)
            views = []
            current: dict[str, dict[str, Any] | None] = {}
            for e in events:
                last = max(last, e.id)
                if not e.kind.startswith("workload."):
                    continue
                if e.subject not in current:
                    current[e.subject] = await _view(uow, e.subject, tenant)
                view = current[e.subject]
                if view is None:
                    continue
                phase = _PHASE_OF.get(e.kind.removeprefix("workload."))
                # Each event shows the phase it recorded: a client sees every transition even
                # when several happened between two reads.
                views.append((e.id, view if phase is None else
                              {**view, "status": {**view["status"], "phase": phase}}))
        for eid, view in views:
            yield sse("MODIFIED", view, eid)
        if len(events) >= 500:
            continue  # more are waiting
        if views:
            idle_s = 0.0
        elif idle_s >= KEEPALIVE_S:
            yield b": keepalive\n\n"
            idle_s = 0.0
        await asyncio.sleep(max(0.0, min(poll_s, end - loop.time())))
        idle_s += poll_s
