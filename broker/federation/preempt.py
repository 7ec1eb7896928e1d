"""Priority preemption, live: the epoch's evictions (placement/preemption.py) are recorded as
`preemption` decisions in the epoch's unit of work, and the actuator carries them out
(`evict`): delete the victim's replicas on its clusters, send it back to pending, and log an
event on each side naming the other (`workload.preempted` on the victim, with `by`;
`workload.preempting` on the workload it makes room for, with `victim`). Idempotent: a
victim that is no longer placed or running is superseded; deleting what is gone succeeds.
The workload room was made for is due at the next epoch (its retry backoff cleared).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from broker.domain import FederationSnapshot, Placement, Workload, WorkloadStatus
from broker.placement.planner import EpochPlan
from broker.placement.preemption import Preemption, plan_preemptions
from broker.store import DecisionRecord, Store, UnitOfWork
from providers.base import ClusterDriver

LIVE = (WorkloadStatus.PLACED, WorkloadStatus.RUNNING)


async def preemptions(snap: FederationSnapshot, plan: EpochPlan,
                      plan_fn: Callable[[FederationSnapshot], EpochPlan]
                      ) -> tuple[Preemption, ...]:
    """The evictions this epoch asks for (computed off the event loop)."""
    if not plan.unplaced or not snap.running:
        return ()

    def replan(s: FederationSnapshot) -> tuple[Placement, ...]:
        return plan_fn(s).placements

    return await asyncio.to_thread(plan_preemptions, snap, plan.unplaced, replan)


async def record(uow: UnitOfWork, moves: tuple[Preemption, ...],
                 tenants: Mapping[str, str]) -> int:
    """One `preemption` decision per victim without one open."""
    todo = {f"preempt:{m.victim}": m for m in moves}
    if not todo:
        return 0
    busy = await uow.decisions.existing(list(todo))
    return await uow.decisions.add_many([
        {"kind": "preemption", "key": key, "tenant": tenants.get(m.victim),
         "cluster": m.cluster, "pool": m.pool, "workload_id": m.victim,
         "spec": {"by": m.by, "by_priority": m.by_priority,
                  "victim_priority": m.victim_priority}}
        for key, m in todo.items() if key not in busy])


async def stop_replicas(store: Store, drivers: Mapping[str, ClusterDriver],
                        workload_id: str) -> Workload | None:
    """Delete a live workload's replicas on every cluster of its active placement; None, and
    nothing done, when it is not live. The caller then requeues it (`requeue`: the next epoch
    places it again), in the unit of work that records why: a preemption's eviction, a
    consolidation's drain (actuator.py)."""
    async with store.unit() as uow:
        w = (await uow.workloads.get(workload_id)).workload
        active = await uow.placements.get_active_for_workload(workload_id)
    if w.status not in LIVE or active is None:
        return None
    for cluster in sorted({a.cluster for a in active.placement.assignments}):
        driver = drivers.get(cluster)
        if driver is not None:
            await driver.delete(workload_id=w.id)
    return w


async def evict(store: Store, drivers: Mapping[str, ClusterDriver],
                rec: DecisionRecord) -> tuple[str, str]:
    """Carry out one preemption decision: (state, event)."""
    by = str(rec.spec.get("by", ""))
    reason = (f"preempted by {by} (priority {rec.spec.get('by_priority')} > "
              f"{rec.spec.get('victim_priority')})")
    w = await stop_replicas(store, drivers, rec.workload_id)
    if w is None:
        return "superseded", "superseded"
    async with store.unit() as uow:
        await uow.workloads.requeue(w.id, reason=reason)
        await uow.events.append("workload.preempted", w.id, {"by": by, "reason": reason},
                                tenant=w.tenant)
        by_tenant = None
        if by:
            made_room = (await uow.workloads.get(by)).workload
            by_tenant = made_room.tenant
            # Room was made for it: due at the next epoch, whatever its backoff said.
            await uow.workloads.set_retry(by, attempts=0,
                                          last_attempt_s=made_room.last_attempt_s or 0.0,
                                          not_before_s=None)
        await uow.events.append("workload.preempting", by, {"victim": w.id},
                                tenant=by_tenant)
    return "done", "done"
