"""A workload's conditions, like a Kubernetes object's: `Scheduled`, `Dispatched`, `Ready`,
`Degraded`, each with `status` ("True"/"False"), `reason` (CamelCase) and `message`, and its
per-cluster replicas (`status.clusters`: ready/desired as the reconciler last read them from
each member's driver).

Derived, not stored: from the workload's phase and message, its retry state (the
planner's attempts, backoff and reason), its active placement (written, applied, dispatch
attempts and last error) and the placement's per-cluster readings, so they can never
disagree with what `GET` shows elsewhere.

A workload the planner could not place (yet) is `Scheduled=False` with reason
`Unschedulable` (Kubernetes' PodScheduled reason for the same case) and the planner's reason
with its attempt and backoff as message; one it placed only partly is `Scheduled=False`,
`PartiallyPlaced`: `3 of 5 replicas placed on a; 2 pending: <reason> (attempt N; next try
in S s)`, `Ready=False` and `Degraded=True` (`ReplicasPending`) until the rest is placed
(the placement loop keeps asking for it) and `status.pendingReplicas` counts them.
"""

from __future__ import annotations

from typing import Any

from broker.domain import WorkloadStatus, replicas_short
from broker.store import PlacementRecord, WorkloadRecord


def _cond(kind: str, ok: bool, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message}


def clusters_of(p: PlacementRecord | None) -> list[dict[str, Any]]:
    if p is None:
        return []
    want: dict[str, int] = {}
    for a in p.placement.assignments:
        want[a.cluster] = want.get(a.cluster, 0) + a.replicas
    out = []
    for cluster, desired in sorted(want.items()):
        seen = p.cluster_status.get(cluster) or {}
        out.append({"cluster": cluster, "desired": desired, "ready": seen.get("ready"),
                    "phase": seen.get("phase"), "message": seen.get("message", "")})
    return out


def pending_replicas(r: WorkloadRecord, p: PlacementRecord | None) -> int:
    """Replicas still waiting for the planner: all of a pending workload's, the rest of a
    partly placed one's, none once it finished."""
    st = r.workload.status
    if st is WorkloadStatus.PENDING:
        return r.workload.spec.replicas
    if st not in (WorkloadStatus.PLACED, WorkloadStatus.RUNNING):
        return 0
    return replicas_short(r.workload, None if p is None else p.placement)


def _scheduled(r: WorkloadRecord, p: PlacementRecord | None, where: str,
               short: int) -> dict[str, str]:
    st, msg = r.workload.status, r.message
    if p is not None and short:
        want = r.workload.spec.replicas
        why = r.retry_message
        return _cond("Scheduled", False, "PartiallyPlaced",
                     f"{want - short} of {want} replicas placed on {where}; {short} pending"
                     + (f": {why}" if why else ""))
    if p is not None:
        return _cond("Scheduled", True, "Placed", f"on {where}")
    if st is WorkloadStatus.UNPLACEABLE:  # written by brokers before the planner kept them
        return _cond("Scheduled", False, "Unplaceable", msg)
    if st is WorkloadStatus.PENDING and r.retry_message:
        return _cond("Scheduled", False, "Unschedulable", r.retry_message)
    return _cond("Scheduled", False, "Pending", msg or "waiting for the planner")


def conditions(r: WorkloadRecord, p: PlacementRecord | None) -> list[dict[str, str]]:
    st, msg = r.workload.status, r.message
    where = ", ".join(sorted({a.cluster for a in p.placement.assignments})) if p else ""
    short = pending_replicas(r, p) if p is not None else 0
    scheduled = _scheduled(r, p, where, short)
    if p is None:
        dispatched = _cond("Dispatched", False, "NotScheduled")
    elif p.dispatched:
        dispatched = _cond("Dispatched", True, "Applied", f"applied to {where}")
    else:
        dispatched = _cond("Dispatched", False,
                           "Retrying" if p.dispatch_attempts else "Applying",
                           p.last_error)
    per = clusters_of(p)
    lagging = [c for c in per if c["ready"] is not None and c["ready"] < c["desired"]]
    counts = ", ".join(f"{c['cluster']} {c['ready'] if c['ready'] is not None else '?'}/"
                       f"{c['desired']}" for c in per)
    ready_reason = {WorkloadStatus.RUNNING: "Running", WorkloadStatus.SUCCEEDED: "Succeeded",
                    WorkloadStatus.FAILED: "Failed", WorkloadStatus.CANCELLED: "Cancelled",
                    WorkloadStatus.PLACED: "Starting"}.get(st, "NotScheduled")
    ready = _cond("Ready", st is WorkloadStatus.RUNNING and not lagging and not short,
                  "ReplicasPending" if short else ready_reason, counts or msg)
    if st is WorkloadStatus.RUNNING and lagging:
        degraded = _cond("Degraded", True, "ReplicasNotReady", counts)
    elif p is not None and not p.dispatched and p.dispatch_attempts:
        degraded = _cond("Degraded", True, "DispatchFailing", p.last_error)
    elif short:
        degraded = _cond("Degraded", True, "ReplicasPending", scheduled["message"])
    elif st is WorkloadStatus.FAILED:
        degraded = _cond("Degraded", True, "Failed", msg)
    else:
        degraded = _cond("Degraded", False, "AsExpected")
    return [scheduled, dispatched, ready, degraded]


def status_extra(r: WorkloadRecord, p: PlacementRecord | None) -> dict[str, Any]:
    """What `status` gains when the placement was read: conditions, clusters, and the
    replicas still pending (`pendingReplicas`)."""
    per = clusters_of(p)
    ready = [c["ready"] for c in per if c["ready"] is not None]
    return {"conditions": conditions(r, p), "clusters": per,
            "readyReplicas": sum(ready) if ready else None,
            "pendingReplicas": pending_replicas(r, p)}
