"""Workloads: submission (idempotent per tenant), reads scoped by tenant, the
pending queue the placement loop drains, status changes and re-queueing.

Tenant scoping: every read/write that takes `tenant=` filters by it; a row of
another tenant is reported as `NotFoundError` (404), never as forbidden, so its
existence does not leak. `tenant=None` is for the broker's own loops and admin.
"""

from __future__ import annotations

import base64
import builtins
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, bindparam, case, func, insert, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from broker.domain import Workload, WorkloadSpec, WorkloadStatus
from broker.errors import ConflictError, IdempotencyError, NotFoundError, SpecError
from broker.store.engine import json_dumps as _dumps
from broker.store.events import EventRepo
from broker.store.mapping import (
    assignments_from_json,
    read_workload,
    spec_to_json,
    workload_from_row,
)
from broker.store.models import PlacementRow, WorkloadRow
from broker.store.records import Page, WorkloadRecord, retry_message

TERMINAL = frozenset({WorkloadStatus.SUCCEEDED, WorkloadStatus.FAILED,
                      WorkloadStatus.CANCELLED})


# The submission hot path uses statements built once (bound parameters, Core
# table inserts): SQLAlchemy then skips per-call statement construction and
# cache-key generation, which dominated the cost of a POST.
_BY_KEY = select(WorkloadRow.id, WorkloadRow.request_sha256).where(
    WorkloadRow.tenant == bindparam("tenant"),
    WorkloadRow.idempotency_key == bindparam("key"))
_INSERT = insert(WorkloadRow.__table__)  # type: ignore[arg-type]
# PostgreSQL: insert-unless-key-exists plus the `workload.submitted` event in ONE
# statement (a data-modifying CTE): one round trip instead of three. A key that
# is already used inserts nothing and returns no row; a concurrent first use
# waits for the other transaction instead of failing.
_PG_SUBMIT = text("""
WITH w AS (
  INSERT INTO workloads (id, tenant, name, kind, status, priority, spec, idempotency_key,
                         request_sha256, placement_id, message, submitted_s, updated_s,
                         applied_name)
  VALUES (:id, :tenant, :name, :kind, :status, :priority, CAST(:spec AS JSONB),
          :idempotency_key, :request_sha256, NULL, '', :submitted_s, :updated_s,
          :applied_name)
  ON CONFLICT (tenant, idempotency_key) DO NOTHING
  RETURNING id, tenant)
INSERT INTO events (ts, tenant, kind, subject, data)
SELECT :submitted_s, tenant, 'workload.submitted', id, CAST(:edata AS JSONB) FROM w
RETURNING subject
""")


_W = cast(Table, WorkloadRow.__table__)
# The planner's retry state; a pending workload's message says why it waits (a placed or
# running one keeps the placement's message: its conditions name the reason, conditions.py).
_SET_RETRY = (update(_W).where(_W.c.id == bindparam("wid"))
              .values(attempts=bindparam("n"), last_attempt_s=bindparam("last"),
                      not_before_s=bindparam("nb"), retry_reason=bindparam("why"),
                      message=case((_W.c.status == str(WorkloadStatus.PENDING),
                                    bindparam("msg")), else_=_W.c.message)))
_SET_STATUS = (update(_W).where(_W.c.id == bindparam("wid"))
               .values(status=bindparam("st"), message=bindparam("msg"),
                       updated_s=bindparam("now")))


def new_workload_id() -> str:
    return "w-" + secrets.token_hex(8)


WORKLOAD_ID_PATTERN = r"^w-[0-9a-f]{16}$"
_ID_RE = re.compile(WORKLOAD_ID_PATTERN)


def is_workload_id(ref: str) -> bool:
    """True for an id of ours; no workload name may match (schemas.NAME_RE refuses it)."""
    return _ID_RE.match(ref) is not None


def encode_cursor(submitted_s: float, wid: str) -> str:
    return base64.urlsafe_b64encode(f"{submitted_s!r}|{wid}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ts, _, wid = raw.partition("|")
        return float(ts), wid
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecError(f"cursor {cursor!r} is not valid", loc=("query", "cursor")) from e


def _record(row: WorkloadRow) -> WorkloadRecord:
    workload, repaired = read_workload(row)
    return WorkloadRecord(workload=workload, placement_id=row.placement_id,
                          message=row.message, updated_s=row.updated_s,
                          idempotency_key=row.idempotency_key, sanitized=tuple(repaired),
                          not_before_s=row.not_before_s, retry_reason=row.retry_reason)


class WorkloadRepo:
    def __init__(self, session: AsyncSession, now: float, events: EventRepo) -> None:
        self._s = session
        self._now = now
        self._events = events

    async def submit(self, *, tenant: str, spec: WorkloadSpec,
                     spec_json: Mapping[str, Any] | None = None,
                     idempotency_key: str | None = None,
                     request_sha256: str = "",
                     by_name: bool = False) -> tuple[WorkloadRecord, bool]:
        """Store a new pending workload; returns (record, created).

        `by_name` (PUT, `skyfed apply`): the row is covered by the unique index on
        (tenant, applied_name) over live workloads, so a second live workload of that name
        made by name fails with an IntegrityError (see `create_by_name`).

        With an `idempotency_key` already used by this tenant: the same body
        (`request_sha256`) returns the first workload with created=False; a
        different body raises `IdempotencyError`. Two racing first submissions
        with one key: on PostgreSQL the second waits and then sees the first;
        on SQLite (one connection) they cannot interleave.
        `spec_json` (= `spec_to_json(spec)`) may be passed when already computed.
        """
        if spec_json is None:
            spec_json = spec_to_json(spec)
        wid = new_workload_id()
        values = {
            "id": wid, "tenant": tenant, "name": spec.name, "kind": str(spec.kind),
            "status": str(WorkloadStatus.PENDING), "priority": spec.priority,
            "spec": dict(spec_json), "idempotency_key": idempotency_key,
            "request_sha256": request_sha256, "placement_id": None, "message": "",
            "submitted_s": self._now, "updated_s": self._now,
            "applied_name": spec.name if by_name else None,
        }
        if self._s.bind is not None and self._s.bind.dialect.name == "postgresql":
            inserted = await self._insert_pg(values)
        else:
            inserted = await self._insert_portable(values)
        if not inserted:
            if idempotency_key is None:  # pragma: no cover - a NULL key never conflicts
                raise ConflictError(f"workload id {wid} already exists")
            return await self.replay(tenant=tenant, idempotency_key=idempotency_key,
                                     request_sha256=request_sha256), False
        rec = WorkloadRecord(workload=Workload(
            id=wid, tenant=tenant, spec=spec, status=WorkloadStatus.PENDING,
            submitted_s=self._now), updated_s=self._now, idempotency_key=idempotency_key)
        return rec, True

    async def create_by_name(self, *, tenant: str, spec: WorkloadSpec) -> WorkloadRecord | None:
        """A new live workload created by name, or None when another transaction created the
        tenant's live workload of that name first (the unique index refused this one; on
        PostgreSQL the insert waits for that transaction, then fails). A savepoint keeps the
        caller's transaction usable, so it can read the winner and update it instead. SQLite
        (one connection) cannot interleave two units of work, and pysqlite's SAVEPOINT outside
        an explicit BEGIN would commit early: there the insert runs as is."""
        if self._s.bind is None or self._s.bind.dialect.name != "postgresql":
            return (await self.submit(tenant=tenant, spec=spec, by_name=True))[0]
        try:
            async with self._s.begin_nested():
                rec, _ = await self.submit(tenant=tenant, spec=spec, by_name=True)
        except IntegrityError:
            return None
        return rec

    async def replay(self, *, tenant: str, idempotency_key: str,
                     request_sha256: str) -> WorkloadRecord:
        """The workload first submitted with this key; `IdempotencyError` if the body differs."""
        hit = (await self._s.execute(_BY_KEY, {"tenant": tenant,
                                               "key": idempotency_key})).first()
        if hit is None:  # pragma: no cover - the conflicting row vanished (deleted tenant)
            raise ConflictError(f"Idempotency-Key {idempotency_key!r} is in flux; retry")
        if hit.request_sha256 != request_sha256:
            raise IdempotencyError(key=idempotency_key)
        return _record(await self._row(hit.id, tenant))

    async def _insert_pg(self, values: dict[str, Any]) -> bool:
        """One statement: insert unless the key exists, and log the event with it."""
        params = values | {"spec": _dumps(values["spec"]),
                           "edata": _dumps({"name": values["name"]})}
        res = await self._s.execute(_PG_SUBMIT, params)
        return res.first() is not None

    async def _insert_portable(self, values: dict[str, Any]) -> bool:
        key = values["idempotency_key"]
        if key is not None and (await self._s.execute(
                _BY_KEY, {"tenant": values["tenant"], "key": key})).first() is not None:
            return False
        await self._s.execute(_INSERT, values)
        await self._events.append("workload.submitted", values["id"], {"name": values["name"]},
                                  tenant=values["tenant"])
        return True

    async def get(self, workload_id: str, *, tenant: str | None = None) -> WorkloadRecord:
        return _record(await self._row(workload_id, tenant))

    async def resolve(self, ref: str, *, tenant: str | None,
                      lock: bool = False) -> WorkloadRecord:
        """A workload by `ref`: its id (`w-` and 16 hex digits, a pattern no name may have)
        or its name (the tenant's live one, else the newest); NotFoundError if none."""
        return _record(await self._resolve_row(ref, tenant, lock=lock))

    async def find_by_name(self, name: str, *, tenant: str,
                           lock: bool = False) -> WorkloadRecord | None:
        """The tenant's live (not finished) workload called `name`, if any."""
        row = await self._named(name, tenant, lock=lock)
        return None if row is None or WorkloadStatus(row.status) in TERMINAL else _record(row)

    async def _resolve_row(self, ref: str, tenant: str | None, *,
                           lock: bool = False) -> WorkloadRow:
        if is_workload_id(ref):
            return await self._row(ref, tenant, lock=lock)
        row = await self._named(ref, tenant, lock=lock)
        if row is None:
            raise NotFoundError(kind="workload", key=ref)
        return row

    async def _named(self, name: str, tenant: str | None, *,
                     lock: bool = False) -> WorkloadRow | None:
        q = select(WorkloadRow).where(WorkloadRow.name == name)
        if tenant is not None:
            q = q.where(WorkloadRow.tenant == tenant)
        finished = case((WorkloadRow.status.in_([str(s) for s in TERMINAL]), 1), else_=0)
        q = q.order_by(finished, WorkloadRow.submitted_s.desc(), WorkloadRow.id).limit(1)
        if lock:
            q = q.with_for_update()
        return (await self._s.scalars(q)).first()

    async def update_spec(self, workload_id: str, spec: WorkloadSpec, *, message: str,
                          requeue: bool) -> WorkloadRecord:
        """Replace a live workload's spec (`skyfed apply`, PUT, PATCH). `requeue`: back to
        pending for the planner (its active placement retired, what runs keeps running
        until the new placement replaces it); else the caller records the placement."""
        row = await self._row(workload_id, None, lock=True)
        if WorkloadStatus(row.status) in TERMINAL:
            raise ConflictError(f"workload {workload_id} is {row.status}; submit it again")
        row.spec = dict(spec_to_json(spec))
        row.kind, row.priority = str(spec.kind), spec.priority
        row.updated_s, row.message = self._now, message
        await self._events.append("workload.updated", workload_id, {"reason": message},
                                  tenant=row.tenant)
        if requeue:
            await self.requeue(workload_id, reason=message)
            row.attempts, row.last_attempt_s, row.not_before_s = 0, None, None
            row.retry_reason = None
        return _record(row)

    async def list(self, *, tenant: str | None, status: WorkloadStatus | None = None,
                   limit: int = 50, cursor: str | None = None) -> Page:
        """Oldest first, keyset-paginated on (submitted_s, id)."""
        q = select(WorkloadRow)
        if tenant is not None:
            q = q.where(WorkloadRow.tenant == tenant)
        if status is not None:
            q = q.where(WorkloadRow.status == str(status))
        if cursor:
            ts, wid = decode_cursor(cursor)
            q = q.where((WorkloadRow.submitted_s > ts)
                        | ((WorkloadRow.submitted_s == ts) & (WorkloadRow.id > wid)))
        q = q.order_by(WorkloadRow.submitted_s, WorkloadRow.id).limit(limit + 1)
        rows = (await self._s.scalars(q)).all()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1].submitted_s, rows[-1].id) if more and rows else None
        return Page(items=tuple(_record(r) for r in rows), next_cursor=nxt)

    async def list_pending(self, *, limit: int = 500) -> builtins.list[Workload]:
        """Pending workloads of every tenant: those due first (no `not_before_s`, or it has
        passed), then those the planner told to wait (planner.Retry); within each, highest
        priority first, then oldest.

        The waiting ones are not left out: the planner decides again whether each is due
        (a capacity change may make one due early, retry.py); ordering them last keeps
        them from crowding new work out of the batch.
        """
        waiting = case((or_(WorkloadRow.not_before_s.is_(None),
                            WorkloadRow.not_before_s <= self._now), 0), else_=1)
        q = (select(WorkloadRow).where(WorkloadRow.status == str(WorkloadStatus.PENDING))
             .order_by(waiting, WorkloadRow.priority.desc(), WorkloadRow.submitted_s,
                       WorkloadRow.id)
             .limit(limit))
        return [workload_from_row(r) for r in (await self._s.scalars(q)).all()]

    async def displaced(self, ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Workload id -> clusters a failover moved it off (only those with any)."""
        out: dict[str, tuple[str, ...]] = {}
        wanted = list(dict.fromkeys(ids))
        for i in range(0, len(wanted), 500):
            q = select(WorkloadRow.id, WorkloadRow.displaced_from).where(
                WorkloadRow.id.in_(wanted[i:i + 500]), WorkloadRow.displaced_from.is_not(None))
            for wid, where in (await self._s.execute(q)).all():
                if where:
                    out[str(wid)] = tuple(str(c) for c in where)
        return out

    async def clear_displaced(self, workload_id: str) -> None:
        """It moved back (or no longer cares): forget where a failover moved it off."""
        await self._s.execute(update(WorkloadRow).where(WorkloadRow.id == workload_id)
                              .values(displaced_from=None))

    async def count_pending(self) -> int:
        """How many workloads wait for placement (backing-off ones included)."""
        q = select(func.count()).select_from(WorkloadRow).where(
            WorkloadRow.status == str(WorkloadStatus.PENDING))
        return int((await self._s.execute(q)).scalar() or 0)

    async def next_retry_s(self) -> float | None:
        """The earliest `not_before_s` of a pending workload that waits (None: none waits)."""
        q = select(func.min(WorkloadRow.not_before_s)).where(
            WorkloadRow.status == str(WorkloadStatus.PENDING),
            WorkloadRow.not_before_s > self._now)
        value = (await self._s.execute(q)).scalar()
        return None if value is None else float(value)

    async def set_retry(self, workload_id: str, *, attempts: int,
                        last_attempt_s: float | None, not_before_s: float | None,
                        reason: str | None = None) -> None:
        """Persist the planner's backoff for a workload it left (partly) unplaced, and why;
        `attempts=0` with None times and reason: it does not wait (placed in full)."""
        await self.set_retries([(workload_id, attempts, last_attempt_s, not_before_s, reason)])

    async def set_retries(self, retries: Sequence[
            tuple[str, int, float | None, float | None, str | None]]) -> None:
        """`set_retry` for many (workload id, attempts, last attempt, not before, reason): one
        batched update. A pending workload's `message` becomes `retry_message` of it."""
        if retries:
            await self._s.execute(_SET_RETRY, [
                {"wid": w, "n": n, "last": last, "nb": nb, "why": why,
                 "msg": retry_message(why, n, last, nb) if why else ""}
                for w, n, last, nb, why in retries])

    async def get_many(self, ids: Sequence[str]) -> dict[str, Workload]:
        """Workloads by id across tenants (the placement loop's commitments); unknown ids absent."""
        out: dict[str, Workload] = {}
        wanted = list(dict.fromkeys(ids))
        for i in range(0, len(wanted), 500):  # stay under every backend's bind-parameter limit
            q = select(WorkloadRow).where(WorkloadRow.id.in_(wanted[i:i + 500]))
            for r in (await self._s.scalars(q)).all():
                out[r.id] = workload_from_row(r)
        return out

    async def ended_since(self, since_s: float, *, limit: int
                          ) -> builtins.list[tuple[float, str, str, float, float]]:
        """What the workloads that ended (succeeded, failed, cancelled) at `since_s` or later
        held, newest `limit` first: (when it ended, cluster, pool, vCPUs, GPUs) per
        assignment of its last placement, its requests times the assignment's replicas (the
        prewarm's net forecast: placement/observed.py `freed_rates`). Workloads that ended
        unplaced held nothing."""
        q = (select(WorkloadRow.updated_s, WorkloadRow.spec, PlacementRow.assignments)
             .join(PlacementRow, PlacementRow.id == WorkloadRow.placement_id)
             .where(WorkloadRow.status.in_(sorted(str(s) for s in TERMINAL)),
                    WorkloadRow.updated_s >= since_s)
             .order_by(WorkloadRow.updated_s.desc()).limit(limit))
        out: builtins.list[tuple[float, str, str, float, float]] = []
        for t, spec, assignments in (await self._s.execute(q)).all():
            res = (spec or {}).get("resources") or {}
            cpu, gpu = float(res.get("cpu", 0.0)), float(res.get("gpu", 0))
            for a in assignments_from_json(assignments):
                out.append((float(t), a.cluster, a.pool, cpu * a.replicas, gpu * a.replicas))
        return out

    async def list_by_status(self, statuses: Sequence[WorkloadStatus], *,
                             limit: int = 1000) -> builtins.list[WorkloadRecord]:
        q = (select(WorkloadRow).where(WorkloadRow.status.in_([str(s) for s in statuses]))
             .order_by(WorkloadRow.submitted_s, WorkloadRow.id).limit(limit))
        return [_record(r) for r in (await self._s.scalars(q)).all()]

    async def set_status(self, workload_id: str, status: WorkloadStatus, *,
                         message: str = "", event_data: Mapping[str, Any] | None = None) -> None:
        """Set a workload's status and log `workload.<status>`."""
        row = await self._row(workload_id, None, lock=True)
        row.status = str(status)
        row.message = message
        row.updated_s = self._now
        await self._events.append(f"workload.{status}", workload_id,
                                  {"message": message, **(event_data or {})}, tenant=row.tenant)

    async def transition_many(
            self, changes: Sequence[tuple[str, WorkloadStatus, str]],
            allowed_from: Mapping[WorkloadStatus, frozenset[WorkloadStatus]]
    ) -> builtins.list[str]:
        """`set_status` for many (workload id, new status, message), each only if its current
        status is in `allowed_from[new]`: the rows are locked and read in one query, written
        in one batched update, their events in one batched insert. Returns the ids changed."""
        by_id = {wid: (st, msg) for wid, st, msg in changes}
        ids = list(by_id)
        todo: builtins.list[dict[str, Any]] = []
        events: builtins.list[tuple[str, str, Mapping[str, Any], str | None]] = []
        for i in range(0, len(ids), 500):
            q = (select(WorkloadRow.id, WorkloadRow.status, WorkloadRow.tenant)
                 .where(WorkloadRow.id.in_(ids[i:i + 500])).with_for_update())
            for wid, current, tenant in (await self._s.execute(q)).all():
                target, msg = by_id[wid]
                if WorkloadStatus(current) in allowed_from.get(target, frozenset()):
                    todo.append({"wid": wid, "st": str(target), "msg": msg, "now": self._now})
                    events.append((f"workload.{target}", wid, {"message": msg}, tenant))
        if todo:
            await self._s.execute(_SET_STATUS, todo)
            await self._events.append_many(events)
        return [t["wid"] for t in todo]

    async def cancel(self, workload_id: str, *, tenant: str | None) -> WorkloadRecord:
        """Cancel (idempotent: a finished or cancelled workload is returned unchanged)."""
        row = await self._row(workload_id, tenant, lock=True)
        if WorkloadStatus(row.status) not in TERMINAL:
            row.status = str(WorkloadStatus.CANCELLED)
            row.updated_s = self._now
            await self._events.append("workload.cancelled", workload_id, {}, tenant=row.tenant)
        return _record(row)

    async def requeue(self, workload_id: str, *, reason: str,
                      displaced_from: str | None = None) -> None:
        """Back to pending (e.g. its cluster failed): the active placement is retired.

        `displaced_from`: the failed cluster it was moved off, remembered on the workload
        (`displaced`) so a later epoch may move it back once the cluster recovers.
        """
        row = await self._row(workload_id, None, lock=True)
        if WorkloadStatus(row.status) in TERMINAL:
            return
        if displaced_from is not None:
            row.displaced_from = sorted({*(row.displaced_from or []), displaced_from})
        await self._s.execute(update(PlacementRow).where(
            PlacementRow.workload_id == workload_id, PlacementRow.active.is_(True))
            .values(active=False, updated_s=self._now))
        row.status = str(WorkloadStatus.PENDING)
        row.placement_id = None
        row.not_before_s = None  # a failover is retried at once, whatever the backoff said
        row.message = reason
        row.updated_s = self._now
        await self._events.append("workload.requeued", workload_id, {"reason": reason},
                                  tenant=row.tenant)

    async def _row(self, workload_id: str, tenant: str | None, *,
                   lock: bool = False) -> WorkloadRow:
        """The row (locked FOR UPDATE on PostgreSQL when `lock`, so status changes
        by the API and the loops serialise instead of overwriting each other)."""
        row = await self._s.get(WorkloadRow, workload_id, with_for_update=lock or None)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFoundError(kind="workload", key=workload_id)
        return row


