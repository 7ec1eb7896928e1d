"""Decisions: what each epoch decided besides placements, and how far the actuator got.

The placement loop writes these rows in the same unit of work as the epoch's
placements (so a crash never keeps one without the other); the actuator reads
the open ones, carries them out and moves them on (`set_state`). Rows are never
deleted: they are the durable audit of what the broker did to the federation.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from broker.errors import NotFoundError
from broker.store.models import DecisionRow
from broker.store.records import DecisionRecord

_INSERT = insert(DecisionRow.__table__)  # type: ignore[arg-type]
OPEN = ("pending", "running")
FINAL = ("done", "refused", "failed", "superseded")
STATES = OPEN + FINAL


def _record(r: DecisionRow) -> DecisionRecord:
    return DecisionRecord(id=r.id, kind=r.kind, key=r.key, tenant=r.tenant, cluster=r.cluster,
                          pool=r.pool, workload_id=r.workload_id, spec=dict(r.spec or {}),
                          state=r.state, step=r.step, attempts=r.attempts,
                          not_before_s=r.not_before_s, last_error=r.last_error,
                          created_s=r.created_s, updated_s=r.updated_s)


class DecisionRepo:
    def __init__(self, session: AsyncSession, now: float, *,
                 leader_epoch: int | None = None) -> None:
        self._s = session
        self._now = now
        self._epoch = leader_epoch  # the fencing epoch stamped on every decision added

    async def add(self, *, kind: str, key: str, spec: Mapping[str, Any],
                  tenant: str | None = None, cluster: str = "", pool: str = "",
                  workload_id: str = "", state: str = "pending",
                  last_error: str = "") -> int:
        """Store one decision (pending unless told otherwise); returns its id."""
        if state not in STATES:
            raise ValueError(f"unknown decision state {state!r}")
        row = DecisionRow(kind=kind, key=key, tenant=tenant, cluster=cluster, pool=pool,
                          workload_id=workload_id, spec=dict(spec), state=state, step="",
                          attempts=0, not_before_s=None, last_error=last_error,
                          created_s=self._now, updated_s=self._now, leader_epoch=self._epoch)
        self._s.add(row)
        await self._s.flush()
        return int(row.id)

    async def get(self, decision_id: int) -> DecisionRecord:
        row = await self._s.get(DecisionRow, decision_id)
        if row is None:
            raise NotFoundError(kind="decision", key=str(decision_id))
        return _record(row)

    async def add_many(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """`add` (pending) for many at once (one batched insert; no ids returned). Each row:
        kind, key, spec and optionally tenant, cluster, pool, workload_id."""
        if not rows:
            return 0
        await self._s.execute(_INSERT, [
            {"kind": r["kind"], "key": r["key"], "tenant": r.get("tenant"),
             "cluster": r.get("cluster", ""), "pool": r.get("pool", ""),
             "workload_id": r.get("workload_id", ""), "spec": dict(r["spec"]),
             "state": "pending", "step": "", "attempts": 0, "not_before_s": None,
             "last_error": "", "created_s": self._now, "updated_s": self._now,
             "leader_epoch": self._epoch} for r in rows])
        return len(rows)

    async def existing(self, keys: Sequence[str], *,
                       states: Sequence[str] = OPEN) -> set[str]:
        """Which of `keys` have a decision in one of `states` (one query per 500 keys)."""
        out: set[str] = set()
        wanted = list(dict.fromkeys(keys))
        for i in range(0, len(wanted), 500):
            q = select(DecisionRow.key).where(DecisionRow.key.in_(wanted[i:i + 500]),
                                              DecisionRow.state.in_(list(states)))
            out.update(str(k) for k in (await self._s.scalars(q)).all())
        return out

    async def exists(self, key: str, *, states: Sequence[str] = OPEN) -> bool:
        """True when a decision on `key` is in one of `states`."""
        q = select(DecisionRow.id).where(DecisionRow.key == key,
                                         DecisionRow.state.in_(list(states))).limit(1)
        return (await self._s.execute(q)).first() is not None

    async def list_open(self, *, kinds: Sequence[str] | None = None,
                        limit: int = 10_000) -> builtins.list[DecisionRecord]:
        """Pending and running decisions, oldest first."""
        q = select(DecisionRow).where(DecisionRow.state.in_(OPEN))
        if kinds is not None:
            q = q.where(DecisionRow.kind.in_(list(kinds)))
        rows = (await self._s.scalars(q.order_by(DecisionRow.id).limit(limit))).all()
        return [_record(r) for r in rows]

    async def list_due(self, *, now: float | None = None,
                       limit: int = 200) -> builtins.list[DecisionRecord]:
        """Open decisions whose backoff (`not_before_s`) has passed by `now` (default: the
        unit's time), oldest first."""
        at = self._now if now is None else now
        q = (select(DecisionRow).where(
            DecisionRow.state.in_(OPEN),
            or_(DecisionRow.not_before_s.is_(None), DecisionRow.not_before_s <= at))
            .order_by(DecisionRow.id).limit(limit))
        return [_record(r) for r in (await self._s.scalars(q)).all()]

    async def list(self, *, kind: str | None = None, workload_id: str | None = None,
                   cluster: str | None = None, tenant: str | None = None,
                   states: Sequence[str] | None = None,
                   limit: int = 100) -> builtins.list[DecisionRecord]:
        """Decisions in any state (or in `states`), newest first (`tenant` scopes to one
        tenant's rows)."""
        q = select(DecisionRow)
        if kind is not None:
            q = q.where(DecisionRow.kind == kind)
        if states is not None:
            q = q.where(DecisionRow.state.in_(list(states)))
        if workload_id is not None:
            q = q.where(DecisionRow.workload_id == workload_id)
        if cluster is not None:
            q = q.where(DecisionRow.cluster == cluster)
        if tenant is not None:
            q = q.where(DecisionRow.tenant == tenant)
        rows = (await self._s.scalars(q.order_by(DecisionRow.id.desc()).limit(limit))).all()
        return [_record(r) for r in rows]

    async def set_state(self, decision_id: int, state: str, *, step: str | None = None,
                        error: str | None = None, not_before_s: float | None = None,
                        attempt: bool = False,
                        spec: Mapping[str, Any] | None = None) -> DecisionRecord:
        """Move a decision on; `attempt` counts one more try; `spec` merges into its spec."""
        if state not in STATES:
            raise ValueError(f"unknown decision state {state!r}")
        row = await self._s.get(DecisionRow, decision_id, with_for_update=True)
        if row is None:
            raise NotFoundError(kind="decision", key=str(decision_id))
        row.state = state
        if step is not None:
            row.step = step
        if error is not None:
            row.last_error = error
        row.not_before_s = not_before_s
        if attempt:
            row.attempts += 1
        if spec:
            row.spec = {**(row.spec or {}), **spec}
        row.updated_s = self._now
        return _record(row)

    async def supersede(self, *, key: str, before_id: int,
                        states: Sequence[str] = OPEN) -> builtins.list[int]:
        """Mark older open decisions on `key` superseded; returns their ids."""
        q = select(DecisionRow.id).where(DecisionRow.key == key, DecisionRow.id < before_id,
                                         DecisionRow.state.in_(list(states)))
        ids = [int(i) for i in (await self._s.scalars(q)).all()]
        if ids:
            await self._s.execute(update(DecisionRow).where(DecisionRow.id.in_(ids))
                                  .values(state="superseded", updated_s=self._now,
                                          not_before_s=None))
        return ids
