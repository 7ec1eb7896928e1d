"""Priority preemption: a workload the epoch could not place may evict lower-priority batch
work (pure: snapshot and plan in, decisions out; the actuator carries them out).

For each workload left (partly) unplaced, highest priority first (at most `limit` an epoch):

1. candidates: running `batch`/`train` workloads of the same tenant with strictly lower
   priority (services are never preempted), not already chosen this epoch. A priority is
   the tenant's own number: it orders the tenant's work and cannot rank one tenant above
   another, so one tenant never evicts another's;
2. the epoch is planned again for that workload alone on a snapshot where the candidates'
   replicas are gone (their placements out of `running`, their requests off each pool's
   `used`), with the same planner (`replan`, the live loop's `plan_epoch`): every hard
   constraint (resources, GPU model, taints, affinity, latency, quota) still holds;
3. if it is placed in full there, the candidates on the pools it landed on are chosen,
   lowest priority (then largest) first, one at a time, each time asking the planner again,
   until it is placed in full with only the chosen ones gone.

Nothing is evicted when the trial does not place it in full: a preemption that would not
let the higher-priority workload run only destroys work. The evicted workloads go back to
pending (their work restarts), and the next epoch places the higher-priority one first
(its unplaced penalty is larger).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from broker.domain import (
    FederationSnapshot,
    Placement,
    Resources,
    Workload,
    WorkloadKind,
)

PREEMPTIBLE = (WorkloadKind.BATCH, WorkloadKind.TRAIN)
Replan = Callable[[FederationSnapshot], tuple[Placement, ...]]


@dataclasses.dataclass(frozen=True, slots=True)
class Preemption:
    """Evict `victim` (its replicas on `cluster`/`pool` and everywhere else) so `by` fits."""

    victim: str
    by: str
    cluster: str
    pool: str
    victim_priority: int
    by_priority: int


def _placed(replan: Replan, snapshot: FederationSnapshot, gone: Mapping[str, Placement],
            workloads: Mapping[str, Workload], u: Workload) -> Placement | None:
    """`u`'s placement when the `gone` placements have ended, if it is placed in full."""
    trial = [p for p in replan(_without(snapshot, gone, workloads,
                                        dataclasses.replace(u, attempts=0)))
             if p.workload_id == u.id]
    return trial[0] if trial and trial[0].placed_replicas >= u.spec.replicas else None


def _without(snapshot: FederationSnapshot, gone: Mapping[str, Placement],
             workloads: Mapping[str, Workload], pending: Workload) -> FederationSnapshot:
    """The snapshot as if the `gone` placements had ended, asking for `pending` only."""
    freed: dict[tuple[str, str], Resources] = {}
    for wid, p in gone.items():
        res = workloads[wid].spec.resources
        for a in p.assignments:
            key = (a.cluster, a.pool)
            freed[key] = freed.get(key, Resources()) + res.scale(a.replicas)
    clusters = tuple(dataclasses.replace(c, pools=tuple(
        dataclasses.replace(p, used=_clamp(p.used - freed[(c.name, p.name)]), node_states=())
        if (c.name, p.name) in freed else p for p in c.pools)) for c in snapshot.clusters)
    return dataclasses.replace(snapshot, clusters=clusters, pending=(pending,), running=tuple(
        p for p in snapshot.running if p.workload_id not in gone))


def _clamp(r: Resources) -> Resources:
    return Resources(max(0.0, r.cpu), max(0.0, r.memory_gib), max(0, r.gpu))


def plan_preemptions(snapshot: FederationSnapshot, unplaced: Mapping[str, str],
                     replan: Replan, *, limit: int = 10) -> tuple[Preemption, ...]:
    """The evictions of this epoch (see the module docstring). `unplaced`: the epoch plan's
    workloads left (partly) unplaced; `replan`: the planner on a snapshot."""
    running = {p.workload_id: p for p in snapshot.running}
    workloads = {wid: w for wid, w in snapshot.workloads.items()
                 if wid in running and w.spec.kind in PREEMPTIBLE}
    waiting = sorted((w for w in snapshot.pending if w.id in unplaced),
                     key=lambda w: (-w.spec.priority, w.submitted_s, w.id))
    out: list[Preemption] = []
    taken: set[str] = set()
    for u in waiting[:limit]:
        candidates = {wid: running[wid] for wid, w in workloads.items()
                      if w.tenant == u.tenant and w.spec.priority < u.spec.priority
                      and wid not in taken}
        if not candidates:
            continue
        trial = _placed(replan, snapshot, candidates, workloads, u)
        if trial is None:
            continue
        landed = {(a.cluster, a.pool) for a in trial.assignments}
        # The fewest victims on the pools it landed on, lowest priority (then largest)
        # first: each added one is checked with the planner itself (its headroom, its
        # per-node fit), not with a sum of requests.
        order = sorted((wid for wid, p in candidates.items()
                        if {(a.cluster, a.pool) for a in p.assignments} & landed),
                       key=lambda wid: (workloads[wid].spec.priority,
                                        -workloads[wid].spec.total.cpu, wid))
        chosen: list[str] = []
        for wid in order:
            chosen.append(wid)
            if _placed(replan, snapshot, {v: candidates[v] for v in chosen}, workloads,
                       u) is not None:
                break
        else:
            continue
        for wid in chosen:
            taken.add(wid)
            a = candidates[wid].assignments[0]
            out.append(Preemption(victim=wid, by=u.id, cluster=a.cluster, pool=a.pool,
                                  victim_priority=workloads[wid].spec.priority,
                                  by_priority=u.spec.priority))
    return tuple(out)
