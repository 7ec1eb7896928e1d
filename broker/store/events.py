"""The append-only event log: what happened, when, to what (audit and UI feed)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from broker.limits import sanitize_json
from broker.store.models import EventRow
from broker.store.records import Event

_INSERT = insert(EventRow.__table__)  # type: ignore[arg-type]  # built once: appends are on hot paths


class EventRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def append(self, kind: str, subject: str, data: Mapping[str, Any] | None = None, *,
                     tenant: str | None = None, ts: float | None = None) -> None:
        """Append one event (`kind` like `workload.submitted`, `subject` the row id)."""
        await self._s.execute(_INSERT, {
            "ts": self._now if ts is None else ts, "tenant": tenant, "kind": kind,
            "subject": subject, "data": dict(data or {})})

    async def append_many(self, events: Sequence[tuple[str, str, Mapping[str, Any],
                                                       str | None]]) -> None:
        """Append (kind, subject, data, tenant) events in one statement (executemany)."""
        if events:
            await self._s.execute(_INSERT, [
                {"ts": self._now, "tenant": tenant, "kind": kind, "subject": subject,
                 "data": dict(data)} for kind, subject, data, tenant in events])

    async def last_id(self) -> int:
        """The newest event's id (0: none yet): where a watch starts."""
        return int((await self._s.scalar(select(func.max(EventRow.id)))) or 0)

    async def list(self, *, tenant: str | None = None, after_id: int = 0, limit: int = 100,
                   kind: str | None = None, subject: str | None = None,
                   include_system: bool = False) -> builtins.list[Event]:
        """Events with id > `after_id`, oldest first; `tenant=None` means all tenants.

        `include_system` adds the federation's own events (tenant NULL: site health,
        failovers, price changes) to a tenant's view.
        """
        q = select(EventRow).where(EventRow.id > after_id)
        if tenant is not None and include_system:
            q = q.where(or_(EventRow.tenant == tenant, EventRow.tenant.is_(None)))
        elif tenant is not None:
            q = q.where(EventRow.tenant == tenant)
        if kind is not None:
            q = q.where(EventRow.kind == kind)
        if subject is not None:
            q = q.where(EventRow.subject == subject)
        rows = (await self._s.scalars(q.order_by(EventRow.id).limit(limit))).all()
        return [_event(r) for r in rows]


def _event(r: EventRow) -> Event:
    """An event as stored, its `data` repaired if an older version stored what no JSON
    encoder can write (a `ts_ms: 1e308` from MQTT became a 309-digit jsonb integer)."""
    data, repaired = sanitize_json(r.data if isinstance(r.data, Mapping) else {"value": r.data})
    return Event(id=r.id, ts=r.ts, tenant=r.tenant, kind=r.kind, subject=r.subject,
                 data=data, sanitized=tuple(repaired))
