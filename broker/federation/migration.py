"""Carry out one migration (planner.Migration): start at the new place, wait until ready, then
drain the old, never below the workload's replicas while it runs.

The decision row's `step` is the durable progress, written after each side effect, and each
side effect is idempotent (`ClusterDriver.apply` is keyed by workload id, `delete` of what is
gone succeeds), so an actuator that crashes anywhere resumes without losing or doubling a
replica:

    ""        the workload must still run where the decision found it (its active placement,
              dispatched, on the decision's source clusters), else the decision is superseded.
              Apply the target's assignments.                                 -> "started"
    started   every target cluster reports the target's replicas ready? If not, wait (poll);
              past `ready_timeout_s` roll back (delete the target where the source does not
              run) and fail. If ready: in ONE unit of work, record the target as the active
              placement (status running, dispatched) and the step.            -> "switched"
    switched  delete the workload on source clusters the target does not use.  -> done

Until the switch the source keeps serving (and stays the active placement, so the API, the
planner and the reconciler see one place); the reconciler leaves the target's replicas alone
while the decision is open (`migration_targets`). On a cluster that is in both source and
target (another pool, another replica count) the apply is a patch, and the driver's rolling
update keeps the ready replicas (the Kubernetes driver renders `maxUnavailable: 0`; the
simulated driver surges the same way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.domain import Assignment, Placement, Workload, WorkloadStatus
from broker.federation.dispatcher import apply_spec, pools_by_cluster
from broker.store import DecisionRecord, PlacementRecord, Store
from broker.store.mapping import assignments_to_json, placement_from_values
from providers.base import ClusterDriver
from providers.errors import NotFoundError, ProviderError

LIVE = (WorkloadStatus.PLACED, WorkloadStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class Progress:
    """What one call of `advance` did: the actuator records it (see actuator.Outcome)."""

    state: str  # running | done | failed | superseded
    step: str | None = None
    event: str = ""  # started | waiting | switched | done | failed | superseded
    error: str | None = None
    wait_s: float | None = None  # come back after this long
    spec: Mapping[str, Any] | None = None
    recorded: bool = False  # the state was already written (the switch's own unit)


def migration_spec(source: Sequence[Assignment], target: Placement, *, reason: str,
                   saving_usd_per_hour: float = 0.0, cost_usd: float = 0.0) -> dict[str, Any]:
    """The decision row's spec for a migration (JSON)."""
    return {"source": assignments_to_json(source),
            "target": {"assignments": assignments_to_json(target.assignments),
                       "cost_usd_per_hour": target.cost_usd_per_hour, "rtt_ms": target.rtt_ms,
                       "decision": dict(target.decision)},
            "reason": reason, "saving_usd_per_hour": saving_usd_per_hour, "cost_usd": cost_usd}


def target_of(rec: DecisionRecord) -> Placement:
    t = rec.spec["target"]
    return placement_from_values(rec.workload_id, t["assignments"], t["cost_usd_per_hour"],
                                 t.get("rtt_ms"), t.get("decision") or {})


def _clusters(items: Sequence[Mapping[str, Any]] | Sequence[Assignment]) -> set[str]:
    return {a.cluster if isinstance(a, Assignment) else str(a["cluster"]) for a in items}


def _replicas_by_cluster(p: Placement) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in p.assignments:
        out[a.cluster] = out.get(a.cluster, 0) + a.replicas
    return out


class Migrator:
    """Advances migrations one step at a time (see the module docstring)."""

    def __init__(self, store: Store, drivers: Mapping[str, ClusterDriver], *,
                 ready_timeout_s: float = 600.0, poll_s: float = 1.0) -> None:
        self._store = store
        self._drivers = drivers
        self._ready_timeout_s = ready_timeout_s
        self._poll_s = poll_s

    async def advance(self, rec: DecisionRecord, now: float) -> Progress:
        async with self._store.unit() as uow:
            workload = (await uow.workloads.get(rec.workload_id)).workload
            active = await uow.placements.get_active_for_workload(rec.workload_id)
        target = target_of(rec)
        if rec.step == "":
            return await self._start(rec, workload, active, target, now)
        if rec.step == "started":
            return await self._wait_and_switch(rec, workload, active, target, now)
        if rec.step == "switched":
            return await self._drain(rec, workload, target)
        return Progress("failed", event="failed", error=f"unknown migration step {rec.step!r}")

    async def _start(self, rec: DecisionRecord, workload: Workload,
                     active: PlacementRecord | None, target: Placement,
                     now: float) -> Progress:
        source = _clusters(rec.spec.get("source") or [])
        if workload.status not in LIVE or active is None or not active.dispatched:
            return Progress("superseded", event="superseded",
                            error=f"workload is {workload.status}, not running at its source")
        if _clusters(active.placement.assignments) != source:
            return Progress("superseded", event="superseded",
                            error="the workload moved since the decision")
        await self._apply(workload, target)
        return Progress("running", step="started", event="started",
                        spec={"from_placement": active.id, "started_s": now})

    async def _wait_and_switch(self, rec: DecisionRecord, workload: Workload,
                               active: PlacementRecord | None, target: Placement,
                               now: float) -> Progress:
        if (workload.status not in LIVE or active is None
                or active.id != rec.spec.get("from_placement")):
            # Requeued (its source failed), cancelled or finished meanwhile: the target's
            # replicas go wherever no placement of the workload runs now.
            keep = set() if active is None else _clusters(active.placement.assignments)
            await self._delete(rec.workload_id, _clusters(target.assignments) - keep)
            return Progress("superseded", event="superseded",
                            error="the workload was re-placed or stopped during the migration")
        missing = await self._not_ready(rec.workload_id, target)
        if missing:
            started = float(rec.spec.get("started_s", now))
            if now - started <= self._ready_timeout_s:
                return Progress("running", event="", wait_s=self._poll_s)
            await self._delete(rec.workload_id,
                               _clusters(target.assignments) - _clusters(rec.spec["source"]))
            return Progress("failed", event="failed",
                            error=f"target not ready after {now - started:.0f} s: "
                                  + "; ".join(missing))
        async with self._store.unit() as uow:
            pid = await uow.placements.record(
                target, status=WorkloadStatus.RUNNING,
                message=f"migrated ({rec.spec.get('reason', '')})")
            if pid is None:  # finished or cancelled after the check: roll back
                await uow.decisions.set_state(rec.id, "superseded", error="workload ended")
            else:
                await uow.placements.mark_dispatched(pid)
                if rec.spec.get("reason") == "recovered":
                    await uow.workloads.clear_displaced(rec.workload_id)
                await uow.decisions.set_state(rec.id, "running", step="switched",
                                              spec={"placement": pid})
        if pid is None:
            await self._delete(rec.workload_id,
                               _clusters(target.assignments) - _clusters(rec.spec["source"]))
            return Progress("superseded", event="superseded", error="workload ended",
                            recorded=True)
        return Progress("running", step="switched", event="switched", recorded=True,
                        spec={"placement": pid})

    async def _drain(self, rec: DecisionRecord, workload: Workload,
                     target: Placement) -> Progress:
        await self._delete(workload.id,
                           _clusters(rec.spec.get("source") or []) - _clusters(target.assignments))
        return Progress("done", event="done")

    async def _apply(self, workload: Workload, target: Placement) -> None:
        for cluster, pools in pools_by_cluster(target.assignments).items():
            driver = self._drivers.get(cluster)
            if driver is None:
                raise ProviderError(f"no driver for cluster {cluster!r}", provider="skyfed")
            await driver.apply(spec=apply_spec(workload, cluster, pools))

    async def _not_ready(self, workload_id: str, target: Placement) -> list[str]:
        missing = []
        for cluster, want in sorted(_replicas_by_cluster(target).items()):
            driver = self._drivers.get(cluster)
            if driver is None:
                missing.append(f"{cluster}: no driver")
                continue
            try:
                st = await driver.status(workload_id=workload_id)
            except NotFoundError:
                missing.append(f"{cluster}: not applied")
                continue
            if st.ready_replicas < want:
                missing.append(f"{cluster}: {st.ready_replicas}/{want} ready")
        return missing

    async def _delete(self, workload_id: str, clusters: set[str]) -> None:
        for cluster in sorted(clusters):
            driver = self._drivers.get(cluster)
            if driver is not None:
                await driver.delete(workload_id=workload_id)


def migration_targets(open_decisions: Sequence[DecisionRecord]) -> set[tuple[str, str]]:
    """(workload id, cluster) of every open migration's target: replicas the reconciler must
    not delete as orphans while the migration runs."""
    out: set[tuple[str, str]] = set()
    for rec in open_decisions:
        if rec.kind == "migration":
            for a in (rec.spec.get("target") or {}).get("assignments") or []:
                out.add((rec.workload_id, str(a["cluster"])))
    return out
