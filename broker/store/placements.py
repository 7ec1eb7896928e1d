"""Placements: the placement loop's decisions, the dispatcher's progress.

A workload has at most one *active* placement. `record` writes a new one,
retires the previous, and moves the workload to `placed` (or another status)
inside the caller's unit of work, so decision and status commit together.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Select, Table, bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from broker.domain import Placement, WorkloadStatus
from broker.errors import NotFoundError
from broker.store.events import EventRepo
from broker.store.inventory import DemandRepo
from broker.store.mapping import (
    assignments_from_json,
    assignments_to_json,
    placement_from_values,
)
from broker.store.models import PlacementRow, WorkloadRow
from broker.store.records import PlacementRecord

LIVE = (str(WorkloadStatus.PLACED), str(WorkloadStatus.RUNNING))
_FINAL = frozenset({WorkloadStatus.SUCCEEDED, WorkloadStatus.FAILED, WorkloadStatus.CANCELLED})
_CHUNK = 500  # ids per IN (...): under every backend's bind-parameter limit
_INSERT = insert(PlacementRow.__table__)  # type: ignore[arg-type]
_W = cast(Table, WorkloadRow.__table__)
_SET_PLACED = (update(_W).where(_W.c.id == bindparam("wid"))
               .values(status=bindparam("st"), placement_id=bindparam("pid"),
                       message=bindparam("msg"), updated_s=bindparam("now")))


def new_placement_id() -> str:
    return "p-" + secrets.token_hex(8)


def _record(r: PlacementRow) -> PlacementRecord:
    return PlacementRecord(
        id=r.id, tenant=r.tenant,
        placement=placement_from_values(r.workload_id, r.assignments, r.cost_usd_per_hour,
                                        r.rtt_ms, r.decision),
        active=r.active, dispatched=r.dispatched, dispatch_attempts=r.dispatch_attempts,
        last_error=r.last_error, created_s=r.created_s, updated_s=r.updated_s,
        cluster_status=dict(r.cluster_status or {}))


class PlacementRepo:
    def __init__(self, session: AsyncSession, now: float, events: EventRepo, *,
                 leader_epoch: int | None = None) -> None:
        self._s = session
        self._now = now
        self._events = events
        self._epoch = leader_epoch  # the fencing epoch stamped on every placement written

    async def record(self, placement: Placement, *,
                     status: WorkloadStatus = WorkloadStatus.PLACED,
                     message: str = "", demand_tau_s: float | None = None) -> str | None:
        """Store `placement` as the workload's active one and set its status; returns its id.

        Returns None and writes nothing when the workload was cancelled or
        finished since it was read (the row is locked, so a concurrent cancel
        either happens first -- and wins -- or waits for this unit).
        """
        w = await self._s.get(WorkloadRow, placement.workload_id, with_for_update=True)
        if w is None:
            raise NotFoundError(kind="workload", key=placement.workload_id)
        if WorkloadStatus(w.status) in _FINAL:
            return None
        await self._s.execute(update(PlacementRow).where(
            PlacementRow.workload_id == w.id, PlacementRow.active.is_(True))
            .values(active=False, updated_s=self._now))
        pid = new_placement_id()
        clusters = sorted({a.cluster for a in placement.assignments})
        self._s.add(PlacementRow(
            id=pid, workload_id=w.id, tenant=w.tenant,
            assignments=assignments_to_json(placement.assignments),
            clusters_csv="," + ",".join(clusters) + ("," if clusters else ""),
            cost_usd_per_hour=placement.cost_usd_per_hour, rtt_ms=placement.rtt_ms,
            decision=dict(placement.decision), active=True, dispatched=False,
            dispatch_attempts=0, last_error="", created_s=self._now, updated_s=self._now,
            leader_epoch=self._epoch))
        if demand_tau_s is not None:  # the pools' demand EWMA (placement/observed.py)
            res = w.spec.get("resources") or {}
            demand = DemandRepo(self._s, self._now)
            for a in placement.assignments:
                await demand.add(a.cluster, a.pool, cpu=float(res.get("cpu", 0.0)) * a.replicas,
                                 gpu=float(res.get("gpu", 0)) * a.replicas, tau_s=demand_tau_s)
        w.status = str(status)
        w.placement_id = pid
        w.message = message
        w.updated_s = self._now
        await self._events.append(f"workload.{status}", w.id,
                                  {"placement": pid, "clusters": clusters,
                                   "cost_usd_per_hour": placement.cost_usd_per_hour},
                                  tenant=w.tenant)
        return pid

    async def move(self, workload_id: str, *, from_cluster: str, to_cluster: str,
                   to_pool: str, by: str, cause: str = "") -> str | None:
        """Record that `workload_id` now runs on `to_cluster` instead of `from_cluster`.

        For a move someone else carried out (the edge hub's failover or rebalance): a new
        active placement, already dispatched, with the replicas of `from_cluster` on
        `to_cluster`/`to_pool`; the workload's status is left as it is. Idempotent: None
        (nothing written) when there is no active placement, when it already names
        `to_cluster` and not `from_cluster`, or when it has nothing on `from_cluster` and
        more than one assignment (which one moved is unknown).
        """
        old = (await self._s.scalars(select(PlacementRow).where(
            PlacementRow.workload_id == workload_id, PlacementRow.active.is_(True)))).first()
        if old is None:
            return None
        current = assignments_from_json(old.assignments)
        names = {a.cluster for a in current}
        if from_cluster not in names:
            if to_cluster in names or len(current) != 1:
                return None
            from_cluster = current[0].cluster
        moved = tuple(dataclasses.replace(a, cluster=to_cluster, pool=to_pool, new_nodes=0)
                      if a.cluster == from_cluster else a for a in current)
        old.active, old.updated_s = False, self._now
        pid = new_placement_id()
        clusters = sorted({a.cluster for a in moved})
        self._s.add(PlacementRow(
            id=pid, workload_id=workload_id, tenant=old.tenant,
            assignments=assignments_to_json(moved),
            clusters_csv="," + ",".join(clusters) + ",",
            cost_usd_per_hour=old.cost_usd_per_hour, rtt_ms=None,
            decision={"moved_by": by, "cause": cause, "from_cluster": from_cluster,
                      "to_cluster": to_cluster, "previous_placement": old.id},
            active=True, dispatched=True, dispatch_attempts=0, last_error="",
            created_s=self._now, updated_s=self._now, leader_epoch=self._epoch))
        w = await self._s.get(WorkloadRow, workload_id)
        if w is not None:
            w.placement_id, w.updated_s = pid, self._now
        await self._events.append("placement.moved", workload_id, {
            "placement": pid, "from": from_cluster, "to": to_cluster, "by": by,
            "cause": cause}, tenant=old.tenant)
        return pid

    async def record_many(self, items: Sequence[tuple[Placement, str]], *,
                          status: WorkloadStatus = WorkloadStatus.PLACED,
                          demand_tau_s: float | None = None,
                          extends: Mapping[str, tuple[str, Placement]] | None = None
                          ) -> dict[str, str]:
        """`record` for a whole epoch in a few statements; workload id -> placement id.

        The same contract per item (placement, message): workloads cancelled or finished
        meanwhile are skipped (their rows are locked first, so a concurrent cancel either
        wins or waits); with `demand_tau_s`, the requests count into each pool's demand
        EWMA (one update per pool). One lock query, one retire, one insert, one status
        update and one event insert (each batched), instead of five round trips per
        placement.

        `extends`: workload id -> (placement id, added) where the item's placement is that
        active placement grown by `added`'s replicas (the placement loop's top-up of a
        partly placed workload). Written only while that placement is still the workload's
        and the workload placed or running (a requeue, cancel, move or change in between
        wins: the next epoch plans again); the workload keeps its status, its event is
        `workload.grown`, and only `added` counts into the demand EWMA.
        """
        grows = extends or {}
        live: dict[str, tuple[str, str]] = {}  # workload id -> (tenant, status written)
        requests: dict[str, tuple[float, float]] = {}  # workload id -> (cpu, gpu) per replica
        ids = [p.workload_id for p, _ in items]
        for i in range(0, len(ids), _CHUNK):
            q = (select(WorkloadRow.id, WorkloadRow.status, WorkloadRow.tenant,
                        WorkloadRow.spec, WorkloadRow.placement_id)
                 .where(WorkloadRow.id.in_(ids[i:i + _CHUNK])).with_for_update())
            for wid, st, tenant, spec, pid in (await self._s.execute(q)).all():
                if WorkloadStatus(st) in _FINAL:
                    continue
                if wid in grows and (st not in LIVE or pid != grows[wid][0]):
                    continue
                live[wid] = (tenant, st if wid in grows else str(status))
                res = (spec or {}).get("resources") or {}
                requests[wid] = (float(res.get("cpu", 0.0)), float(res.get("gpu", 0)))
        todo = [(p, m) for p, m in items if p.workload_id in live]
        if not todo:
            return {}
        wids = [p.workload_id for p, _ in todo]
        for i in range(0, len(wids), _CHUNK):
            await self._s.execute(update(PlacementRow).where(
                PlacementRow.workload_id.in_(wids[i:i + _CHUNK]),
                PlacementRow.active.is_(True)).values(active=False, updated_s=self._now))
        out: dict[str, str] = {}
        rows, marks, events = [], [], []
        for p, message in todo:
            wid = p.workload_id
            tenant, st = live[wid]
            pid = out[wid] = new_placement_id()
            clusters = sorted({a.cluster for a in p.assignments})
            rows.append({"id": pid, "workload_id": wid, "tenant": tenant,
                         "assignments": assignments_to_json(p.assignments),
                         "clusters_csv": "," + ",".join(clusters) + ("," if clusters else ""),
                         "cost_usd_per_hour": p.cost_usd_per_hour, "rtt_ms": p.rtt_ms,
                         "decision": dict(p.decision), "active": True, "dispatched": False,
                         "dispatch_attempts": 0, "last_error": "", "created_s": self._now,
                         "updated_s": self._now, "leader_epoch": self._epoch})
            marks.append({"wid": wid, "st": st, "pid": pid, "msg": message, "now": self._now})
            data: dict[str, Any] = {"placement": pid, "clusters": clusters,
                                    "cost_usd_per_hour": p.cost_usd_per_hour}
            if wid in grows:
                data |= {"previous": grows[wid][0], "replicas": p.placed_replicas,
                         "added": grows[wid][1].placed_replicas}
            events.append(("workload.grown" if wid in grows else f"workload.{st}", wid, data,
                           tenant))
        await self._s.execute(_INSERT, rows)
        await self._s.execute(_SET_PLACED, marks)
        await self._events.append_many(events)
        if demand_tau_s is not None:
            await self._add_demand([(grows[p.workload_id][1] if p.workload_id in grows else p, m)
                                    for p, m in todo], requests, demand_tau_s)
        return out

    async def _add_demand(self, todo: Sequence[tuple[Placement, str]],
                          requests: Mapping[str, tuple[float, float]], tau_s: float) -> None:
        """The pools' demand EWMA (placement/observed.py), summed per pool for the batch."""
        per_pool: dict[tuple[str, str], tuple[float, float]] = {}
        for p, _ in todo:
            cpu, gpu = requests.get(p.workload_id, (0.0, 0.0))
            for a in p.assignments:
                c, g = per_pool.get((a.cluster, a.pool), (0.0, 0.0))
                per_pool[(a.cluster, a.pool)] = (c + cpu * a.replicas, g + gpu * a.replicas)
        demand = DemandRepo(self._s, self._now)
        for (cluster, pool), (cpu, gpu) in sorted(per_pool.items()):
            await demand.add(cluster, pool, cpu=cpu, gpu=gpu, tau_s=tau_s)

    async def get(self, placement_id: str, *, tenant: str | None = None) -> PlacementRecord:
        return _record(await self._row(placement_id, tenant))

    async def set_cluster_status_many(self, statuses: Mapping[str, Mapping[str, Any]]
                                      ) -> None:
        """Placement id -> {cluster: {ready, desired, phase, message}} (the reconciler)."""
        for pid, value in statuses.items():
            await self._s.execute(update(PlacementRow).where(PlacementRow.id == pid)
                                  .values(cluster_status=dict(value)))

    async def get_active_for_workload(self, workload_id: str) -> PlacementRecord | None:
        row = (await self._s.scalars(select(PlacementRow).where(
            PlacementRow.workload_id == workload_id, PlacementRow.active.is_(True)))).first()
        return None if row is None else _record(row)

    async def list_undispatched(self, *, limit: int = 500) -> list[PlacementRecord]:
        """Active placements not yet applied, of workloads placed or running (a running
        one's placement changed in place: grown by the placement loop, scaled down or rolled
        out by the API); oldest first."""
        q = (select(PlacementRow).join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.active.is_(True), PlacementRow.dispatched.is_(False),
                    WorkloadRow.status.in_(LIVE))
             .order_by(PlacementRow.created_s, PlacementRow.id).limit(limit))
        return await self._plain(q)  # the dispatcher needs no decision records

    async def mark_dispatched(self, placement_id: str) -> None:
        """Idempotent: marking twice is the same as once."""
        row = await self._row(placement_id, None)
        if not row.dispatched:
            row.dispatched = True
            row.dispatch_attempts += 1
            row.last_error = ""
            row.updated_s = self._now
            await self._events.append("placement.dispatched", row.workload_id,
                                      {"placement": row.id}, tenant=row.tenant)

    async def mark_dispatched_many(self, placement_ids: Sequence[str]) -> int:
        """`mark_dispatched` for many: one update and one (batched) event insert per chunk."""
        done = 0
        ids = list(placement_ids)
        for i in range(0, len(ids), _CHUNK):
            q = (update(PlacementRow).where(PlacementRow.id.in_(ids[i:i + _CHUNK]),
                                            PlacementRow.dispatched.is_(False))
                 .values(dispatched=True, dispatch_attempts=PlacementRow.dispatch_attempts + 1,
                         last_error="", updated_s=self._now)
                 .returning(PlacementRow.id, PlacementRow.workload_id, PlacementRow.tenant))
            rows = (await self._s.execute(q)).all()
            await self._events.append_many([("placement.dispatched", wid, {"placement": pid},
                                             tenant) for pid, wid, tenant in rows])
            done += len(rows)
        return done

    async def record_dispatch_failure(self, placement_id: str, error: str) -> int:
        """Count a failed apply; returns the attempts so far."""
        row = await self._row(placement_id, None)
        row.dispatch_attempts += 1
        row.last_error = error
        row.updated_s = self._now
        return row.dispatch_attempts

    async def list_active_on_cluster(self, cluster: str) -> list[PlacementRecord]:
        """Active placements with replicas on `cluster` whose workload is placed/running."""
        q = (select(PlacementRow).join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.active.is_(True), WorkloadRow.status.in_(LIVE),
                    PlacementRow.clusters_csv.like(f"%,{cluster},%"))
             .order_by(PlacementRow.created_s, PlacementRow.id))
        return [_record(r) for r in (await self._s.scalars(q)).all()]

    async def active_ids(self) -> list[tuple[str, str, WorkloadStatus]]:
        """(placement id, workload id, workload status) of every active placement of a
        placed/running workload: the cheap half of `list_active`, for callers that cache
        placements and specs by id (neither changes once written)."""
        q = (select(PlacementRow.id, PlacementRow.workload_id, WorkloadRow.status)
             .join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.active.is_(True), WorkloadRow.status.in_(LIVE))
             .order_by(PlacementRow.created_s, PlacementRow.id))
        return [(str(p), str(w), WorkloadStatus(st))
                for p, w, st in (await self._s.execute(q)).all()]

    async def get_plain_many(self, placement_ids: Sequence[str]) -> list[PlacementRecord]:
        """Placements by id, without their decision records."""
        out: list[PlacementRecord] = []
        ids = list(placement_ids)
        for i in range(0, len(ids), _CHUNK):
            out += await self._plain(select(PlacementRow).where(
                PlacementRow.id.in_(ids[i:i + _CHUNK])))
        return out

    async def list_active_for(self, workload_ids: Sequence[str]) -> list[PlacementRecord]:
        """The active placements (without decision records) of these workloads, if live."""
        out: list[PlacementRecord] = []
        ids = list(dict.fromkeys(workload_ids))
        for i in range(0, len(ids), _CHUNK):
            q = (select(PlacementRow)
                 .join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
                 .where(PlacementRow.active.is_(True), WorkloadRow.status.in_(LIVE),
                        PlacementRow.workload_id.in_(ids[i:i + _CHUNK])))
            out += await self._plain(q)
        return out

    async def list_active(self, *, limit: int = 10_000,
                          decisions: bool = True) -> list[PlacementRecord]:
        """Every active placement of a placed/running workload (the `running` snapshot).

        `decisions=False` leaves the (large) decision records out: `placement.decision` is
        then empty, which is all the planner's snapshot needs.
        """
        q = (select(PlacementRow).join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.active.is_(True), WorkloadRow.status.in_(LIVE))
             .order_by(PlacementRow.created_s, PlacementRow.id).limit(limit))
        if not decisions:
            return await self._plain(q)
        return [_record(r) for r in (await self._s.scalars(q)).all()]

    async def _plain(self, q: Select[Any]) -> list[PlacementRecord]:
        """Active placements of `q` as plain rows without their decision records (which
        are large): no ORM objects, for the loops that read many every pass."""
        cols = (PlacementRow.id, PlacementRow.tenant, PlacementRow.workload_id,
                PlacementRow.assignments, PlacementRow.cost_usd_per_hour, PlacementRow.rtt_ms,
                PlacementRow.dispatched, PlacementRow.dispatch_attempts, PlacementRow.last_error,
                PlacementRow.created_s, PlacementRow.updated_s, PlacementRow.cluster_status)
        rows = (await self._s.execute(q.with_only_columns(*cols))).all()
        return [PlacementRecord(
            id=r[0], tenant=r[1], placement=placement_from_values(r[2], r[3], r[4], r[5], {}),
            active=True, dispatched=r[6], dispatch_attempts=r[7], last_error=r[8],
            created_s=r[9], updated_s=r[10], cluster_status=dict(r[11] or {})) for r in rows]

    async def list_to_withdraw(self, *, limit: int = 500) -> list[PlacementRecord]:
        """Dispatched, still-active placements whose workload was cancelled: delete them."""
        q = (select(PlacementRow).join(WorkloadRow, WorkloadRow.id == PlacementRow.workload_id)
             .where(PlacementRow.active.is_(True), PlacementRow.dispatched.is_(True),
                    WorkloadRow.status == str(WorkloadStatus.CANCELLED))
             .order_by(PlacementRow.created_s).limit(limit))
        return await self._plain(q)

    async def retire(self, placement_id: str) -> None:
        """Make a placement inactive (withdrawn or superseded); idempotent."""
        row = await self._row(placement_id, None)
        row.active = False
        row.updated_s = self._now

    async def get_decision(self, placement_id: str, *,
                           tenant: str | None = None) -> Mapping[str, Any]:
        return dict((await self._row(placement_id, tenant)).decision)

    async def put_decision(self, placement_id: str, decision: Mapping[str, Any]) -> None:
        row = await self._row(placement_id, None)
        row.decision = dict(decision)
        row.updated_s = self._now

    async def _row(self, placement_id: str, tenant: str | None) -> PlacementRow:
        row = await self._s.get(PlacementRow, placement_id)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFoundError(kind="placement", key=placement_id)
        return row
