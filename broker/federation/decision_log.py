"""An epoch's non-placement decisions as `decisions` rows, written in the placement loop's
unit of work (so they commit with the placements, or not at all), and what the loop reads
back from them: the nodes still on order, per pool.

Rows (kind, key, spec), one per thing acted on:

- scale: one per pool and epoch, `pool:<cluster>/<pool>`, `target_nodes` = the pool's nodes in
  the epoch's snapshot (ordered ones included) + every `PoolScale.add_nodes` and
  `Prewarm.nodes` for it. An absolute target makes the order idempotent; a newer order on the
  same pool supersedes the older (its target already counts the older's nodes). Each order
  carries `order`, a random idempotency key its retries reuse (CloudProvider.scale_pool:
  EC2's ClientToken), so a retried launch that the cloud had accepted buys no second machine.
- scale_in: the `PoolScaleIn` nodes, `target_nodes` = nodes - removed (same key).
- prewarm (images/data): `prewarm:<cluster>/<pool>/<hash of the images and data>`; one that
  is open or done is not written again (the planner may repeat it every epoch, and for
  every workload that needs the same image on the same pool).
- migration: `workload:<id>`; not written while one for the workload is open.
- retries: not rows: `Retry.attempts`, `not_before_s` and `reason` are stored on the
  workload (a pending one's message says why it waits), and `list_pending` orders it after
  the due ones until then.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from broker.domain import FederationSnapshot, Pool
from broker.federation.metrics import DECISIONS
from broker.federation.migration import migration_spec
from broker.placement.observed import BOOT_SAMPLES, boot_s
from broker.placement.planner import EpochPlan, Prewarm
from broker.store import DecisionRecord, UnitOfWork

ORDER_KINDS = ("scale", "prewarm")


def pool_key(cluster: str, pool: str) -> str:
    return f"pool:{cluster}/{pool}"


def prewarm_key(p: Prewarm) -> str:
    """What is prewarmed where, not for whom: two workloads that need the same image on the
    same pool share one prewarm (the first one's workload is named in its events)."""
    what = hashlib.sha256(json.dumps(
        [sorted(p.images), sorted(d.url or d.location for d in p.data)]).encode()
    ).hexdigest()[:16]
    return f"prewarm:{p.cluster}/{p.pool}/{what}"


async def record_decisions(uow: UnitOfWork, plan: EpochPlan, snapshot: FederationSnapshot, *,
                           owners: Mapping[str, str],
                           tenants: Mapping[str, str]) -> dict[str, int]:
    """Write `plan`'s decisions (see the module docstring); returns how many of each kind.

    `owners`: cluster -> owning tenant (pool decisions are that tenant's events);
    `tenants`: workload id -> tenant (migrations and prewarms for a workload are its).
    A handful of statements per epoch, however many decisions: the existence checks and
    the inserts of prewarms, migrations and retries are batched.
    """
    counts = await _orders(uow, plan, snapshot, owners)
    counts["prewarm"] = counts.get("prewarm", 0) + await _prewarms(uow, plan, owners, tenants)
    counts["migration"] = await _migrations(uow, plan, tenants)
    await uow.workloads.set_retries([(r.workload_id, r.attempts, snapshot.now_s,
                                      r.not_before_s, r.reason) for r in plan.retries])
    counts["retry"] = len(plan.retries)
    return {k: n for k, n in counts.items() if n}


async def _orders(uow: UnitOfWork, plan: EpochPlan, snapshot: FederationSnapshot,
                  owners: Mapping[str, str]) -> dict[str, int]:
    """One node order per pool (scale and node prewarms together), then scale-ins."""
    pools = {(c.name, p.name): p for c in snapshot.clusters for p in c.pools}
    counts: dict[str, int] = {}
    grow: dict[tuple[str, str], dict[str, Any]] = {}
    for s in plan.scale:
        if s.add_nodes > 0:
            g = grow.setdefault((s.cluster, s.pool), {"kind": "scale", "add": 0, "why": []})
            g["add"] += s.add_nodes
            g["kind"] = "scale"
            g["why"].append("placement")
    for p in plan.prewarm:
        if p.nodes > 0:
            g = grow.setdefault((p.cluster, p.pool), {"kind": "prewarm", "add": 0, "why": []})
            g["add"] += p.nodes
            g["why"].append(f"prewarm:{p.reason or 'forecast'}")
    for (cluster, name), g in sorted(grow.items()):
        pool = pools.get((cluster, name))
        if pool is not None:
            await _add_order(uow, g["kind"], cluster, pool, owners, {
                "target_nodes": pool.nodes + g["add"], "add_nodes": g["add"],
                "from_nodes": pool.nodes, "reason": ",".join(dict.fromkeys(g["why"])),
                "order": uuid.uuid4().hex})
            counts[g["kind"]] = counts.get(g["kind"], 0) + 1
    for si in plan.scale_in:
        pool = pools.get((si.cluster, si.pool))
        if pool is None or (si.cluster, si.pool) in grow or not si.nodes:
            continue
        await _add_order(uow, "scale_in", si.cluster, pool, owners, {
            "nodes": list(si.nodes), "target_nodes": max(0, pool.nodes - len(si.nodes)),
            "from_nodes": pool.nodes, "reason": si.reason})
        counts["scale_in"] = counts.get("scale_in", 0) + 1
    return counts


async def _add_order(uow: UnitOfWork, kind: str, cluster: str, pool: Pool,
                     owners: Mapping[str, str], spec: Mapping[str, Any]) -> int:
    key = pool_key(cluster, pool.name)
    did = await uow.decisions.add(kind=kind, key=key, tenant=owners.get(cluster),
                                  cluster=cluster, pool=pool.name,
                                  spec={**spec, "instance_type": pool.instance_type})
    await uow.decisions.supersede(key=key, before_id=did)
    return did


async def _prewarms(uow: UnitOfWork, plan: EpochPlan, owners: Mapping[str, str],
                    tenants: Mapping[str, str]) -> int:
    """Image and data prewarms not open or done yet, one per pool and content."""
    todo = {prewarm_key(p): p for p in plan.prewarm if p.images or p.data}
    have = await uow.decisions.existing(list(todo), states=("pending", "running", "done"))
    return await uow.decisions.add_many([
        {"kind": "prewarm", "key": key, "cluster": p.cluster, "pool": p.pool,
         "tenant": tenants.get(p.workload_id) or owners.get(p.cluster),
         "workload_id": p.workload_id,
         "spec": {"images": list(p.images), "workload_id": p.workload_id, "reason": p.reason,
                  "data": [{"url": d.url, "sha256": d.sha256, "size_gb": d.size_gb,
                            "location": d.location} for d in p.data]}}
        for key, p in todo.items() if key not in have])


async def _migrations(uow: UnitOfWork, plan: EpochPlan, tenants: Mapping[str, str]) -> int:
    """Migrations of workloads without one open."""
    todo = {f"workload:{m.workload_id}": m for m in plan.migrations}
    busy = await uow.decisions.existing(list(todo))
    return await uow.decisions.add_many([
        {"kind": "migration", "key": key, "tenant": tenants.get(m.workload_id),
         "cluster": m.target.assignments[0].cluster if m.target.assignments else "",
         "workload_id": m.workload_id,
         "spec": migration_spec(m.source, m.target, reason=m.reason,
                                saving_usd_per_hour=m.saving_usd_per_hour, cost_usd=m.cost_usd)}
        for key, m in todo.items() if key not in busy])


def ordered_nodes(open_decisions: list[DecisionRecord]) -> dict[tuple[str, str], int]:
    """(cluster, pool) -> node count on order (open scale and node-prewarm decisions)."""
    out: dict[tuple[str, str], int] = {}
    for d in open_decisions:
        if d.kind in ORDER_KINDS and "target_nodes" in d.spec:
            key = (d.cluster, d.pool)
            out[key] = max(out.get(key, 0), int(d.spec["target_nodes"]))
    return out


def measured_boots(decisions: Sequence[DecisionRecord]) -> dict[str, dict[str, float]]:
    """cluster -> pool -> the pool's measured boot (observed.boot_s: the median of its last
    BOOT_SAMPLES) over done node orders (`decisions` newest first) that carry one: the
    actuator's `boot_s`, seconds from ordering to every ordered node in the inventory."""
    samples: dict[tuple[str, str], list[float]] = {}
    for d in decisions:
        v = d.spec.get("boot_s")
        if d.kind not in ORDER_KINDS or d.state != "done" or \
                not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        got = samples.setdefault((d.cluster, d.pool), [])
        if len(got) < BOOT_SAMPLES:
            got.append(float(v))
    out: dict[str, dict[str, float]] = {}
    for (cluster, pool), xs in samples.items():
        if (b := boot_s(xs[::-1])) is not None:  # oldest first, as boot_s takes them
            out.setdefault(cluster, {})[pool] = b
    return out


def count_metrics(counts: Mapping[str, int], placements: int) -> None:
    if placements:
        DECISIONS.labels("placement").inc(placements)
    for kind, n in counts.items():
        DECISIONS.labels(kind).inc(n)
