"""Decision records and counterfactuals: why a workload went where it went. Pure.

Every placement carries `Placement.decision`, a JSON-able dict:

- `chosen`: per assignment the option, replicas, USD/h and the objective's
  breakdown (compute, egress, latency penalty, policy bias) in USD;
- `runner_up`: the cheapest candidate option not used, its cost for the same
  replicas, the difference, and which constraint family kept it out (if one);
- `binding`: LP rows touching this workload's columns whose dual (shadow
  price, HiGHS row dual of the LP relaxation) is non-zero: capacity of a pool,
  a quota, a budget, spread, anti-affinity; `shadow_price_usd` is what one
  more unit of that row's right-hand side would save;
- `infeasible`: per constraint family, how many options it ruled out;
- `solver`: status, gap, where the kept solution came from.

`whatif` re-solves the same batch with one workload forced onto one cluster
and reports the difference (its cost, its RTT, the objective, who else moved).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from broker.domain import Assignment, FederationSnapshot, Placement, PolicyAction
from broker.placement.candidates import CandidateSet, FloatArray
from broker.placement.decisions import bounded_action
from broker.placement.feasibility import family_masks, may_use, size_for_slo
from broker.placement.ledger import Ledger

if TYPE_CHECKING:
    from broker.placement import lp
    from broker.placement.planner import EpochPlan, PlannerConfig, SolveStats


def _r(v: float) -> float:
    return round(float(v), 6)


def breakdown(cs: CandidateSet, w: int, o: int, replicas: int) -> dict[str, float]:
    # Python floats, not numpy scalars: this runs for every assignment of every epoch,
    # and numpy scalar arithmetic is ~10x slower (same IEEE results; round() is _r's).
    compute, egress = float(cs.compute[w, o]), float(cs.egress[w, o])
    latency, bias = float(cs.latency[w, o]), float(cs.bias[w, o])
    return {"compute": round(compute * replicas, 6), "egress": round(egress * replicas, 6),
            "latency": round(latency * replicas, 6), "bias": round(bias * replicas, 6),
            "total": round((compute + egress + latency + bias) * replicas, 6)}


def why_not(ledger: Ledger, w: int, o: int) -> str:
    """The constraint family that keeps more replicas of w off option o now."""
    cs = ledger.cs
    if not cs.feasible[w, o]:
        return "infeasible"
    spec = cs.workloads[w].spec
    cname = ledger.cluster_of[o]
    if any(cname in ledger.clusters_of_w[j] for j in ledger.conflicts[w]):
        return "anti-affinity"
    share = cs.target(w)
    if share and ledger.clusters_of_w[w].get(cname, 0) >= share.get(cname, 0):
        return "weighted"
    if spec.spread is not None and spec.spread.max_domains is not None and cs.domain[w]:
        dom = cs.domain[w][o]
        if dom not in ledger.domains[w] and len(ledger.domains[w]) >= spec.spread.max_domains:
            return "spread"
    usdh = float(cs.usd_per_hour[w, o])
    tenant = cs.workloads[w].tenant
    if usdh > 0 and tenant in ledger.tenant_left and ledger.tenant_left[tenant] < usdh:
        return "budget"
    if usdh > 0 and spec.budget_usd_per_hour is not None and \
            spec.budget_usd_per_hour - ledger.spend_w[w] < usdh:
        return "budget"
    if not ledger.one_fits(w, o, int(ledger.can_add[o])):
        return "capacity"
    if not ledger.one_fits(w, o, ledger.node_cap(o)):
        return "quota"
    return "cost"


def unplaced_reason(ledger: Ledger, w: int) -> str:
    cs = ledger.cs
    counts = cs.infeasible_counts[w]
    seen = cs.options_visible(w)
    if not seen:
        return "no options: the federation has no pools this tenant may use"
    if cs.cand[w].size == 0:
        parts = ", ".join(f"{fam} ruled out {n}" for fam, n in
                          sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"infeasible: no option passes every constraint of {seen} ({parts})"
    if cs.target(w):
        return _weighted_reason(ledger, w)
    if w in ledger.released:
        spec = cs.workloads[w].spec
        return (f"slo: the {ledger.released[w]} replicas that fit would serve none inside its "
                f"{spec.latency_slo_ms:g} ms SLO at its load (M/M/c waiting), so their room "
                "went to work that serves; it stays pending")
    fams: dict[str, int] = {}
    for o in cs.cand[w]:
        fam = why_not(ledger, w, int(o))
        fams[fam] = fams.get(fam, 0) + 1
    spec = cs.workloads[w].spec
    if not ledger.x[w] and spec.spread is not None and spec.spread.min_domains > 1:
        fams["spread"] = fams.get("spread", 0) + 1
    fam, n = max(fams.items(), key=lambda kv: kv[1])
    return f"{fam}: binds on {n} of {cs.cand[w].size} candidate options"


def _weighted_reason(ledger: Ledger, w: int) -> str:
    """Why a weighted workload's shares are short: per cluster, its share, what it got and
    the family that keeps more off its candidate options (weighted.py: a share is never
    moved to another cluster, as Karmada binds it to its cluster)."""
    cs = ledger.cs
    short = []
    for cname, share in sorted(cs.target(w).items()):
        got = ledger.clusters_of_w[w].get(cname, 0)
        if got >= share:
            continue
        fams: dict[str, int] = {}
        for o in cs.cand[w]:
            if ledger.cluster_of[int(o)] == cname:
                fam = why_not(ledger, w, int(o))
                fams[fam] = fams.get(fam, 0) + 1
        fam = max(fams.items(), key=lambda kv: kv[1])[0] if fams else "infeasible"
        short.append(f"{cname} holds {got} of its {share} ({fam})")
    return ("weighted: " + "; ".join(short) + "; a weighted share stays on its cluster") \
        if short else "weighted: every share placed"


# The binding rows a record lists per workload (largest |shadow price| first).
BINDING_ROWS_SHOWN = 7


def binding_index(model: lp.Model | None, relax: lp.Relaxation | None
                  ) -> dict[int, list[tuple[int, float]]]:
    """Workload -> (LP row, shadow price) of the rows with a non-zero dual that touch its
    columns, largest |price| first (ties in row order), at most BINDING_ROWS_SHOWN.

    Computed once per plan: a row's price is rounded once however many workloads share
    the row (a busy pool's capacity row touches hundreds).
    """
    if model is None or relax is None or model.n_x == 0:
        return {}
    a = model.a
    n_w = model.n_start - model.u_start
    duals = relax.row_dual
    binding = np.abs(duals) > 1e-5  # USD; smaller shadow prices are noise
    binding[:n_w] = False  # demand rows are reported separately
    end = int(a.indptr[model.n_x])
    rows = a.indices[:end]
    cols = np.repeat(np.arange(model.n_x), np.diff(a.indptr[:model.n_x + 1]))
    keep = binding[rows]
    if not keep.any():
        return {}
    # (workload, row) pairs as one int64 key: a 1-D unique, sorted by workload then row.
    n_rows = np.int64(a.shape[0])
    keys = np.unique(model.x_w[cols[keep]].astype(np.int64) * n_rows + rows[keep])
    ws, rs = keys // n_rows, keys % n_rows
    uniq, inv = np.unique(rs, return_inverse=True)
    price_u = [_r(-float(duals[r])) for r in uniq.tolist()]  # Python's round, as before
    price = np.array(price_u, dtype=np.float64)[inv]
    # By workload, then |price| descending, then row (a stable sort's ties in row order);
    # the first BINDING_ROWS_SHOWN of each workload, sorted in numpy rather than per
    # workload in Python (a busy pool's row touches hundreds of workloads).
    order = np.lexsort((rs, -np.abs(price), ws))
    ws_o, rs_o, pr_o = ws[order], rs[order], price[order]
    starts = np.flatnonzero(np.r_[True, ws_o[1:] != ws_o[:-1]])
    rank = np.arange(ws_o.size) - np.repeat(starts, np.diff(np.r_[starts, ws_o.size]))
    shown = rank < BINDING_ROWS_SHOWN
    out: dict[int, list[tuple[int, float]]] = {}
    for w, r, pr in zip(ws_o[shown].tolist(), rs_o[shown].tolist(), pr_o[shown].tolist(),
                        strict=True):
        out.setdefault(w, []).append((r, pr))
    return out


def _binding(model: lp.Model | None, relax: lp.Relaxation | None, w: int,
             index: dict[int, list[tuple[int, float]]]) -> list[dict[str, Any]]:
    if model is None or relax is None or model.n_x == 0:
        return []
    out: list[dict[str, Any]] = []
    for r, price in index.get(w, ()):
        family, key = model.row_names[r]
        out.append({"family": family, "row": key, "shadow_price_usd": price})
    dem = float(relax.row_dual[w]) if w < relax.row_dual.size else 0.0
    out.append({"family": "demand", "row": model.row_names[w][1],
                "marginal_replica_usd": _r(dem)})
    return out


def decision(ledger: Ledger, w: int, pen: FloatArray, stats: SolveStats,
             model: lp.Model | None, relax: lp.Relaxation | None,
             policy: str, reason: str | None,
             index: dict[int, list[tuple[int, float]]] | None = None,
             visible: int | None = None) -> dict[str, Any]:
    """Workload w's decision record (module docstring); `index` (binding_index) and
    `visible` (cs.options_visible(w)) may be passed in by a caller that has them."""
    cs = ledger.cs
    wl = cs.workloads[w]
    costs = {o: breakdown(cs, w, o, m) for o, m in ledger.x[w].items()}
    chosen = []
    for o, m in sorted(ledger.x[w].items()):
        opt = cs.options[o]
        rtt = float(cs.rtt_ms[w, o])
        chosen.append({"option": opt.key, "cluster": opt.cluster.name, "pool": opt.pool.name,
                       "pricing": str(opt.pricing), "replicas": m,
                       "usd_per_hour": _r(float(cs.usd_per_hour[w, o]) * m),
                       "rtt_ms": None if math.isnan(rtt) else _r(rtt),
                       "cost_usd": costs[o]})
    placed = ledger.placed(w)
    total = sum(c["total"] for c in costs.values())
    runner = None
    for o in cs.cand[w]:
        o = int(o)
        if o in ledger.x[w]:
            continue
        reps = placed or int(cs.replicas[w])
        cost = breakdown(cs, w, o, reps)
        runner = {"option": cs.options[o].key, "cost_usd": cost,
                  "difference_usd": _r(cost["total"] - total) if placed else None,
                  "kept_out_by": why_not(ledger, w, o)}
        break
    return {
        "policy": policy,
        "workload": wl.id,
        "replicas": int(cs.replicas[w]),
        "placed": placed,
        "chosen": chosen,
        "objective_usd": _r(total + (int(cs.replicas[w]) - placed) * float(pen[w])),
        "runner_up": runner,
        "binding": _binding(model, relax, w,
                            index if index is not None else binding_index(model, relax)),
        "infeasible": dict(cs.infeasible_counts[w]),
        "options": cs.options_visible(w) if visible is None else visible,
        "candidates": int(cs.cand[w].size),
        "unplaced_reason": reason,
        "solver": {"status": stats.status, "gap": stats.gap, "source": stats.source},
    }


def _new_nodes_by_workload(ledger: Ledger) -> dict[tuple[int, int], int]:
    """Split each pool's new nodes over its workloads by dominant share (largest remainder)."""
    out: dict[tuple[int, int], int] = {}
    per_opt: dict[int, list[tuple[int, float]]] = {}
    growing = set(np.flatnonzero(ledger.new_nodes > 0).tolist())
    if not growing:
        return out  # nothing to split (every workload's share would be 0 nodes)
    node_l, dem_l = ledger.node.tolist(), ledger.cs.demand.tolist()
    for w, xi in enumerate(ledger.x):
        for o, m in xi.items():
            if o not in growing:
                continue
            node, d = node_l[o], dem_l[w]
            shares = [m * d[r] / node[r] for r in range(3) if node[r] > 0]
            share = max(shares) if shares else 0.0
            per_opt.setdefault(o, []).append((w, share))
    for o, items in per_opt.items():
        n = int(ledger.new_nodes[o])
        total = sum(s for _, s in items) or 1.0
        raw = [(w, n * s / total) for w, s in items]
        base = {w: math.floor(v) for w, v in raw}
        rest = n - sum(base.values())
        for w, _ in sorted(raw, key=lambda t: -(t[1] - math.floor(t[1])))[:rest]:
            base[w] += 1
        for w, k in base.items():
            out[(w, o)] = k
    return out


def assemble(cs: CandidateSet, ledger: Ledger, pen: FloatArray, stats: SolveStats,
             relax: lp.Relaxation | None, model: lp.Model | None, *, policy: str,
             with_records: bool = True) -> EpochPlan:
    """Turn a filled ledger into the planner's EpochPlan with decision records."""
    from broker.placement.planner import EpochPlan, PoolScale

    del cs  # the ledger's candidate set is authoritative (it may hold extra columns)
    cs_l = ledger.cs
    nodes = _new_nodes_by_workload(ledger)
    index = binding_index(model, relax) if with_records else {}
    # Options each workload's tenant may see, counted once for the batch (the records' count).
    visible = np.full(len(cs_l.workloads), len(cs_l.options), dtype=np.int64) \
        if cs_l.visible is None else cs_l.visible.sum(axis=1)
    placements: list[Placement] = []
    unplaced: dict[str, str] = {}
    for w, wl in enumerate(cs_l.workloads):
        placed = ledger.placed(w)
        reason = unplaced_reason(ledger, w) if placed < cs_l.replicas[w] else None
        if reason is not None:
            unplaced[wl.id] = reason
        if placed == 0:
            continue
        assigns = tuple(
            Assignment(cluster=cs_l.options[o].cluster.name, pool=cs_l.options[o].pool.name,
                       pricing=cs_l.options[o].pricing, replicas=m,
                       price_usd_per_hour=float(cs_l.usd_per_hour[w, o]) * m,
                       new_nodes=nodes.get((w, o), 0))
            for o, m in sorted(ledger.x[w].items()))
        rtts = [v for v in (float(cs_l.rtt_ms[w, o]) for o in ledger.x[w]) if not math.isnan(v)]
        record: Mapping[str, object] = decision(
            ledger, w, pen, stats, model, relax, policy, reason, index,
            visible=int(visible[w])) if with_records else {}
        placements.append(Placement(
            workload_id=wl.id, assignments=assigns,
            cost_usd_per_hour=float(sum(a.price_usd_per_hour for a in assigns)),
            rtt_ms=max(rtts) if rtts else None, decision=record))
    scale = tuple(PoolScale(cluster=cs_l.options[o].cluster.name, pool=cs_l.options[o].pool.name,
                            add_nodes=int(n)) for o, n in enumerate(ledger.new_nodes) if n > 0)
    return EpochPlan(placements=tuple(placements), unplaced=unplaced, scale=scale, stats=stats)


def summary(plan: EpochPlan, workload_id: str) -> dict[str, Any]:
    """Cost, RTT and clusters of one workload in a plan (for counterfactual diffs)."""
    for p in plan.placements:
        if p.workload_id == workload_id:
            return {"placed": p.placed_replicas, "cost_usd_per_hour": _r(p.cost_usd_per_hour),
                    "rtt_ms": p.rtt_ms, "clusters": sorted({a.cluster for a in p.assignments}),
                    "objective_usd": p.decision.get("objective_usd")}
    return {"placed": 0, "cost_usd_per_hour": 0.0, "rtt_ms": None, "clusters": [],
            "unplaced_reason": plan.unplaced.get(workload_id)}


def whatif(snapshot: FederationSnapshot, action: PolicyAction, config: PlannerConfig,
           workload_id: str, force_cluster: str, *, policy: str = "lp") -> dict[str, Any]:
    """Re-solve with workload_id forced onto force_cluster; report the difference.

    Hard constraints still hold: if the forced cluster is infeasible for the
    workload it ends up unplaced and the answer says which family forbids it.
    """
    from broker.placement.planner import (
        SLO_QUEUEING_POLICIES,
        PlannerError,
        candidates,
        plan_candidates,
    )

    action = bounded_action(action, config.decisions)  # the timers plan_epoch plans with
    if policy in SLO_QUEUEING_POLICIES:  # as plan_epoch sizes them, so "before" is the plan
        snapshot = replace(snapshot, pending=size_for_slo(
            snapshot, snapshot.pending, headroom=action.headroom)[0])
    ids = [w.id for w in snapshot.pending]
    if workload_id not in ids:
        raise PlannerError(f"workload {workload_id!r} is not in the snapshot's pending batch")
    tenant = snapshot.pending[ids.index(workload_id)].tenant
    # Another tenant's private cluster is as unknown as a missing one: same error, same words.
    if not any(c.name == force_cluster and may_use(tenant, c) for c in snapshot.clusters):
        raise PlannerError(f"unknown cluster {force_cluster!r}")
    # The cost model of plan_epoch (site pricing, packing), so "before" is the real plan.
    cs = candidates(snapshot, action, config)
    base = plan_candidates(cs, snapshot, config, policy=policy)
    w = ids.index(workload_id)
    in_cluster = np.array([o.cluster.name == force_cluster for o in cs.options], dtype=bool)
    feasible = cs.feasible.copy()
    feasible[w] &= in_cluster
    cost = cs.cost.copy()
    cost[w] = np.where(feasible[w], cost[w], np.inf)
    row = np.flatnonzero(feasible[w])
    cand = list(cs.cand)
    cand[w] = row[np.argsort(cost[w, row], kind="stable")].astype(np.int64)
    forced_cs = replace(cs, feasible=feasible, cost=cost, cand=tuple(cand))
    forced = plan_candidates(forced_cs, snapshot, config, policy=policy)
    before, after = summary(base, workload_id), summary(forced, workload_id)
    own = {w.id for w in snapshot.pending if w.tenant == tenant}  # never others' workloads
    moved = sorted(
        p.workload_id for p in forced.placements if p.workload_id != workload_id
        and p.workload_id in own
        and _clusters(base, p.workload_id) != sorted({a.cluster for a in p.assignments}))
    blocked: list[str] = []
    if row.size == 0:
        node = cs.option_node()
        masks = family_masks(snapshot, [snapshot.pending[w]], cs.options,
                             cs.demand[w:w + 1], node)
        blocked = [fam for fam, m in masks.items() if not m[0][in_cluster].any()]
    rtt_b, rtt_a = before.get("rtt_ms"), after.get("rtt_ms")
    return {
        "workload": workload_id, "forced_cluster": force_cluster,
        "before": before, "after": after,
        "delta_cost_usd_per_hour": _r(_num(after["cost_usd_per_hour"])
                                      - _num(before["cost_usd_per_hour"])),
        "delta_rtt_ms": _r(_num(rtt_a) - _num(rtt_b))
        if isinstance(rtt_a, float | int) and isinstance(rtt_b, float | int) else None,
        "delta_objective_usd": _r(forced.stats.objective - base.stats.objective),
        "others_moved": moved,
        "forced_infeasible": row.size == 0,
        "forbidden_by": blocked,
    }


def _clusters(plan: EpochPlan, workload_id: str) -> list[str]:
    for p in plan.placements:
        if p.workload_id == workload_id:
            return sorted({a.cluster for a in p.assignments})
    return []



def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) else 0.0
