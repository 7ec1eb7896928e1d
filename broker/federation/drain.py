"""Removing a member that runs workloads: drain first (`DELETE /v1/clusters/{name}`,
`DELETE /v1/sites/{name}`), then remove it.

1. The API marks the member `draining` (its attrs) and wakes the placement loop. From then on
   the snapshot sees it unhealthy (`snapshot._member`): nothing new is placed there.
2. Each epoch (`with_drains`, leader only, inside the placement loop's tick): the live
   workloads still on a draining member and not already moving are planned again with
   `plan_epoch` on the epoch's snapshot, as if pending; each one placed in full becomes a
   `Migration` (reason `drain`) of the epoch's plan. The actuator carries it out like any
   migration: start at the target, wait until ready, switch, delete at the source; a
   workload never drops below its replicas, and nothing is moved by a second mechanism.
3. When no active placement and no open migration names the member any more, it is removed
   (its row; an event `cluster.deleted` / `site.deleted`).

A workload that fits nowhere else stays where it is (the member is not removed), and its
status message says why; deleting the member again changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from broker.domain import FederationSnapshot, Workload
from broker.placement.planner import EpochPlan, Migration
from broker.store import Store

DRAINING = "draining"
PlanFn = Callable[[FederationSnapshot], EpochPlan]


async def draining_members(store: Store) -> tuple[set[str], set[str]]:
    """(clusters, sites) marked draining."""
    async with store.unit() as uow:
        clusters = {r.cluster.name for r in await uow.clusters.list_records()
                    if r.attrs.get(DRAINING)}
        sites = {r.site.name for r in await uow.sites.list_records() if r.attrs.get(DRAINING)}
    return clusters, sites


async def with_drains(store: Store, snap: FederationSnapshot, plan: EpochPlan,
                      plan_fn: PlanFn) -> EpochPlan:
    """`plan` plus a drain migration for each workload still on a draining member; removes
    the drained members (see the module docstring)."""
    clusters, sites = await draining_members(store)
    members = clusters | sites
    if not members:
        return plan
    async with store.unit() as uow:
        moving = {d.workload_id for d in await uow.decisions.list_open(kinds=("migration",))}
        busy_members = {a["cluster"] for d in await uow.decisions.list_open(
            kinds=("migration",)) for a in (d.spec.get("source") or [])}
        on: dict[str, list[str]] = {m: [r.placement.workload_id for r in
                                        await uow.placements.list_active_on_cluster(m)]
                                    for m in sorted(members)}
        todo = sorted({wid for ids in on.values() for wid in ids} - moving)
        workloads = await uow.workloads.get_many(todo) if todo else {}
        for m in sorted(members):
            if not on[m] and m not in busy_members:
                if m in clusters:
                    await uow.clusters.delete(m)
                else:
                    await uow.sites.delete(m)
    if not workloads:
        return plan
    sources = {p.workload_id: p.assignments for p in snap.running}
    pending = tuple(dataclasses.replace(w, attempts=0, last_attempt_s=None)
                    for w in workloads.values() if w.id in sources)
    sub = dataclasses.replace(snap, pending=pending, running=tuple(
        p for p in snap.running if p.workload_id not in workloads))
    replan = await asyncio.to_thread(plan_fn, sub)
    moves = tuple(Migration(workload_id=p.workload_id, source=sources[p.workload_id],
                            target=p, reason="drain")
                  for p in replan.placements
                  if p.placed_replicas >= _replicas(workloads.get(p.workload_id))
                  and not ({a.cluster for a in p.assignments} & members))
    return dataclasses.replace(plan, migrations=(*plan.migrations, *moves))


def _replicas(w: Workload | None) -> int:
    return 0 if w is None else w.spec.replicas
