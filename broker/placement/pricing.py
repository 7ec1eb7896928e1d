"""Column generation for the placement LP, warm-started in one HiGHS instance. Pure.

Pruning each workload to its k cheapest options is only a starting point:
under contention those fill up and the LP would leave replicas unplaced while
other options are free. Each round prices every feasible pair not yet in the
model (reduced cost c - A'y, lp.reduced_costs), adds up to `per_workload` of
the most negative ones per workload with `Highs.addCols`, and re-solves from
the previous basis (new columns start non-basic at 0, so a round costs a few
simplex iterations, not a fresh solve). It stops when no column prices out
(the LP value is then the bound of the unpruned program), when a round gains
less than `min_gain`, or when `budget_s` is spent; in the last two cases the
caller uses lp.lagrangian_bound.

The rows do not depend on the candidates (lp.build makes capacity rows and n
columns for every option), so at the end the model is rebuilt from the grown
candidate set and the solution mapped onto it column by column: x by
(workload, option), u/n/y by offset; row duals carry over unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.placement import lp
from broker.placement.candidates import CandidateSet, FloatArray, IntArray
from broker.placement.feasibility import gpu_class
from broker.placement.ledger import Ledger

Int32Array = npt.NDArray[np.int32]  # what highspy's addCols takes for starts and indices


# CandidateSet fields indexed by workload (first axis, or one tuple entry per workload):
# what a sample of the batch keeps a part of (`subset`).
PER_WORKLOAD_FIELDS = ("workloads", "demand", "replicas", "feasible", "cost", "compute",
                       "egress", "latency", "bias", "usd_per_hour", "rtt_ms", "cand",
                       "infeasible_counts", "domain", "visible", "list_compute", "targets")


# seed() runs on batches of at least this many times its sample: on smaller ones the
# sample's pricing costs about what the smaller LP saves (1000x200 with a sample of 250:
# 0.14 s CPU for the sample, the same pricing rounds after it, the same objective within
# 0.1 %).
SEED_MIN_BATCH = 8


@dataclasses.dataclass(slots=True)
class Priced:
    cs: CandidateSet
    model: lp.Model
    relax: lp.Relaxation
    rounds: int
    converged: bool


def _new_pairs(cs: CandidateSet, rc: FloatArray, in_model: set[tuple[int, int]],
               per_workload: int) -> list[tuple[int, int]]:
    m = max(1, min(per_workload, rc.shape[1]))
    if rc.shape[1] > m:
        top = np.argpartition(rc, m - 1, axis=1)[:, :m]
    else:
        top = np.tile(np.arange(rc.shape[1]), (rc.shape[0], 1))
    vals = np.take_along_axis(rc, top, axis=1)
    out = []
    for w in np.flatnonzero((vals < -1e-6).any(axis=1)).tolist():
        for o, v in zip(top[w].tolist(), vals[w].tolist(), strict=True):
            if v < -1e-6 and (w, o) not in in_model:
                out.append((w, o))
    return out


def _columns(cs: CandidateSet, model: lp.Model, pairs: list[tuple[int, int]]
             ) -> tuple[FloatArray, FloatArray, FloatArray, Int32Array, Int32Array, FloatArray]:
    """cost, lower, upper, CSC starts, row indices, values of the new x columns.

    Each column holds, in this order: its demand row (1), its option's capacity rows
    (the per-replica demand, where it is > 0), its gpu-sets row (1) and its tenant's
    budget row (USD/h); built as one (pairs x 6) table, missing entries dropped.
    """
    n = len(pairs)
    ws = np.fromiter((w for w, _ in pairs), dtype=np.int64, count=n)
    opts = np.fromiter((o for _, o in pairs), dtype=np.int64, count=n)
    cap_row = np.full((len(cs.options), 3), -1, dtype=np.int64)
    for (o, r), row in model.cap_rows.items():
        cap_row[o, r] = row
    rows = np.full((n, 6), -1, dtype=np.int64)
    vals = np.zeros((n, 6))
    rows[:, 0] = ws
    vals[:, 0] = 1.0
    demand = cs.demand[ws]
    rows[:, 1:4] = np.where(demand > 0, cap_row[opts], -1)
    vals[:, 1:4] = demand
    cls_of: dict[int, tuple[int, bool] | None] = {}
    for k, (w, o) in enumerate(pairs):
        if w not in cls_of:
            cls_of[w] = gpu_class(cs.workloads[w])
        cls = cls_of[w]
        s_row = model.set_rows.get((o, cls)) if cls is not None else None
        if s_row is not None:
            rows[k, 4] = s_row
            vals[k, 4] = 1.0
        t_row = model.budget_rows.get(cs.workloads[w].tenant)
        if t_row is not None:
            rows[k, 5] = t_row
            vals[k, 5] = float(cs.usd_per_hour[w, o])
    keep = rows >= 0
    counts = keep.sum(axis=1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int32)
    cost: FloatArray = cs.cost[ws, opts].astype(np.float64)
    idx: Int32Array = rows[keep].astype(np.int32)
    return cost, np.zeros(n), np.full(n, np.inf), starts, idx, vals[keep]


def generate(cs: CandidateSet, pen: FloatArray, budgets: dict[str, float], model: lp.Model,
             *, rounds: int, per_workload: int, min_gain: float, budget_s: float,
             lp_time_limit_s: float, resolve_dual: bool = False) -> Priced:
    """Solve the LP of `model` (built from `cs`) with column generation.

    The first solve starts from scratch: seeding it with the greedy solution
    (`setSolution`) took more dual simplex iterations, not fewer, with the packing
    model (5000x500: 14,838 vs 10,690 iterations, 6.2 vs 2.5 s CPU; 1000x200:
    3,076 vs 2,184). Re-solves after a round use primal simplex, or with `resolve_dual`
    (the planner's seeded batches) dual simplex: there a round adds ~16,000 columns
    (5000x500) and dual simplex re-solved it ~0.9 s faster (seeds 1-3), 20000x2000 7.7 s
    instead of ~31 s CPU. It ends on another vertex of the same LP optimum.

    `budget_s` bounds pricing's end, not only its start: a round starts only if it ends
    inside it when it takes as long as the last round did (reduced costs, new columns and
    re-solve; before the first round, the first solve). 5000x500: the first solve ended at
    ~1.3 s of the 1.5 s box, and the round started after it took ~1.1 s more. 20000x2000: a
    round took ~10 s where its re-solve alone took ~7.3 s, and a second round estimated from
    the re-solve alone started and cut the family MIP's box short (batches decomposed by pool
    family now run no round: planner.py).
    """
    t0 = time.perf_counter()
    h: Any = lp.new_highs(model, time_limit_s=lp_time_limit_s)
    relax = lp.run_relaxation(h, model, t0)
    # Added columns start non-basic at 0: the basis stays primal feasible, so
    # primal simplex re-solves in a few iterations (dual simplex, the default
    # for the first solve, takes 3-10x longer on small batches).
    if not resolve_dual:
        h.setOptionValue("simplex_strategy", 4)
    x_w, x_o = list(model.x_w.tolist()), list(model.x_o.tolist())
    in_model = set(zip(x_w, x_o, strict=True))
    done = 0
    converged = False
    view = model
    last_s = time.perf_counter() - t0  # the first solve, then the last round: the estimate
    for _ in range(rounds):
        if time.perf_counter() - t0 + last_s > budget_s:
            break
        t_round = time.perf_counter()
        rc = lp.reduced_costs(cs, view, relax)
        pairs = _new_pairs(cs, rc, in_model, per_workload)
        if not pairs:
            converged = True
            break
        before = relax.objective
        c, lo, hi, starts, idx, val = _columns(cs, model, pairs)
        h.addCols(len(pairs), c, lo, hi, int(idx.size), starts, idx, val)
        for w, o in pairs:
            x_w.append(w)
            x_o.append(o)
            in_model.add((w, o))
        relax = lp.run_relaxation(h, model, t0, n_extra=len(x_w) - model.n_x)
        last_s = time.perf_counter() - t_round
        view = dataclasses.replace(model, x_w=np.array(x_w, dtype=np.int64),
                                   x_o=np.array(x_o, dtype=np.int64))
        done += 1
        if before - relax.objective <= min_gain * max(abs(before), 1e-9):
            break
    if done == 0:
        return Priced(cs, model, relax, 0, converged)
    return _rebuild(cs, pen, budgets, model, relax, x_w, x_o, done, converged)


def _rebuild(cs: CandidateSet, pen: FloatArray, budgets: dict[str, float], model: lp.Model,
             relax: lp.Relaxation, x_w: list[int], x_o: list[int], done: int,
             converged: bool) -> Priced:
    """The grown candidate set as a clean model, with the incremental solution mapped on."""
    grown = with_pairs(cs, np.asarray(x_w, dtype=np.int64),
                       np.asarray(x_o, dtype=np.int64))
    clean = lp.build(grown, pen, budgets)
    old = relax.x
    # Column of each (w, o) in the incremental model: the first n_x as built, the added
    # ones after the y columns. Matched by the key w * |O| + o (every clean pair is there).
    n_o = np.int64(len(cs.options))
    key_old = np.asarray(x_w, dtype=np.int64) * n_o + np.asarray(x_o, dtype=np.int64)
    col_old = np.arange(key_old.size, dtype=np.int64)
    col_old[model.n_x:] += model.y_start + model.n_y - model.n_x
    order = np.argsort(key_old, kind="stable")
    key_new = clean.x_w * n_o + clean.x_o
    pos = np.minimum(np.searchsorted(key_old[order], key_new), key_old.size - 1)
    if not np.array_equal(key_old[order[pos]], key_new):
        raise lp.SolverError("pricing: a column of the grown model is not in the solved one")
    x = np.zeros(clean.cost.size)
    x[:clean.n_x] = old[col_old[order[pos]]]
    x[clean.u_start:] = old[model.u_start:model.y_start + model.n_y]
    mapped = lp.Relaxation(status=relax.status, objective=relax.objective, x=x,
                           row_dual=relax.row_dual, solve_s=relax.solve_s)
    return Priced(grown, clean, mapped, done, converged)


def subset(cs: CandidateSet, idx: IntArray) -> CandidateSet:
    """The candidate set of the workloads `idx` of `cs` (same options, same capacity)."""
    parts: dict[str, Any] = {}
    for name in PER_WORKLOAD_FIELDS:
        value = getattr(cs, name)
        if isinstance(value, np.ndarray):
            parts[name] = value[idx]
        elif isinstance(value, tuple) and value:
            parts[name] = tuple(value[int(i)] for i in idx)
    return dataclasses.replace(cs, **parts)


def scaled_capacity(model: lp.Model, alpha: float) -> lp.Model:
    """`model` with every shared capacity scaled by `alpha`: pool room (capacity rows),
    nodes each pool may add (n bounds), provider quotas and free GPU sets; the x <= fit
    cuts dropped (they hold for whole pools, not for a share of one)."""
    shared = np.array([fam in ("capacity", "quota", "gpu-sets") for fam, _ in model.row_names],
                      dtype=bool)
    row_hi = model.row_hi.copy()
    row_hi[shared] *= alpha
    col_hi = model.col_hi.copy()
    col_hi[model.n_start:model.y_start] *= alpha
    col_hi[:model.n_x] = np.inf
    return dataclasses.replace(model, row_hi=row_hi, col_hi=col_hi)


def seed(cs: CandidateSet, pen: FloatArray, budgets: dict[str, float], *, sample: int,
         per_workload: int, rounds: int, min_gain: float, budget_s: float,
         lp_time_limit_s: float) -> CandidateSet:
    """Each workload's columns chosen by the capacity prices of a sample of the batch.

    Under contention the k cheapest options of a workload are the ones everybody wants:
    on the 5000x500 bench batch 63 % of the replicas of the unpruned LP's optimum sit
    outside them, at ranks up to 48 and beyond, and pricing them in round by round
    re-solves an ever larger LP (2.7-8 s CPU a round there). The prices of capacity are
    set by the batch as a whole, so a sample tells them: `sample` workloads evenly spread
    over the batch, every shared capacity (pool room, addable nodes, quotas, GPU sets,
    tenant budgets) scaled by their share of the batch's replicas, priced to convergence
    (or `rounds`, `min_gain`, `budget_s`) at a fraction of the cost. Each workload of
    the batch then gets, instead of its k cheapest, the `per_workload` options cheapest
    under the sample's row duals (lp.option_prices); workloads with spread, anti-affinity,
    weighted shares or a budget of their own keep their columns as well (their own rows
    are not in the sample's prices). Batches under SEED_MIN_BATCH x `sample` are returned
    as they are. Only the columns change: the LP, its bound and pricing are those of the
    whole batch.
    """
    n_w = len(cs.workloads)
    if not seeds(n_w, sample=sample, per_workload=per_workload) or not len(cs.options):
        return cs
    total = float(cs.replicas.sum())
    idx = (np.arange(sample, dtype=np.int64) * n_w) // sample
    alpha = float(cs.replicas[idx].sum()) / total if total > 0 else 0.0
    if alpha <= 0:
        return cs
    part = subset(cs, idx)
    part_budgets = {t: b * alpha for t, b in budgets.items()}
    model = scaled_capacity(lp.build(part, pen[idx], part_budgets), alpha)
    priced = generate(part, pen[idx], part_budgets, model, rounds=rounds,
                      per_workload=per_workload, min_gain=min_gain, budget_s=budget_s,
                      lp_time_limit_s=lp_time_limit_s)
    prices = lp.option_prices(cs, priced.model, priced.relax.row_dual)
    m = min(per_workload, prices.shape[1])
    top = np.argpartition(prices, m - 1, axis=1)[:, :m]
    linked = lp.linked_workloads(cs)
    cand = []
    for w, own in enumerate(cs.cand):
        picked = top[w][np.isfinite(prices[w, top[w]])]
        merged = np.union1d(own, picked).astype(np.int64) if linked[w] else \
            np.unique(picked).astype(np.int64)
        cand.append(merged[np.argsort(cs.cost[w, merged], kind="stable")].astype(np.int64))
    return dataclasses.replace(cs, cand=tuple(cand))


def seeds(n_workloads: int, *, sample: int, per_workload: int) -> bool:
    """Whether `seed` reseeds a batch of `n_workloads` (SEED_MIN_BATCH x sample or more)."""
    return sample > 0 and per_workload > 0 and n_workloads >= SEED_MIN_BATCH * sample


def with_gpu_columns(cs: CandidateSet) -> CandidateSet:
    """Every feasible option as a column of each workload that needs GPUs (cheapest first).

    Decomposition by pool family: on the largest batches what the plan leaves unplaced is
    GPU jobs (20000x2000 seed 1: all 727,169 USD of the unpruned LP's penalties, 87 % of
    its objective), and a GPU job is feasible only on the few pools of its GPU model (21
    options on average there, 44,000 pairs in all), so it gets all of them instead of the
    seed's 4. The LP went from 867,018.92 to 861,238.10 (its penalties to the unpruned
    LP's) for ~36,000 more columns, and the family's MIP (mip_stage.run) can then move
    a job to any pool of its model.
    """
    gpu = np.flatnonzero(cs.demand[:, 2] > 0)
    if not gpu.size:
        return cs
    cand = list(cs.cand)
    for w in gpu.tolist():
        merged = np.union1d(cs.cand[w], np.flatnonzero(cs.feasible[w])).astype(np.int64)
        cand[w] = merged[np.argsort(cs.cost[w, merged], kind="stable")].astype(np.int64)
    return dataclasses.replace(cs, cand=tuple(cand))


def with_ledger_columns(cs: CandidateSet, g: Ledger) -> CandidateSet:
    """Add the options a ledger used to each workload's candidates (cheapest first)."""
    ws = [w for w, xi in enumerate(g.x) for _ in xi]
    os_ = [o for xi in g.x for o in xi]
    return with_pairs(cs, np.array(ws, dtype=np.int64), np.array(os_, dtype=np.int64))


def with_pairs(cs: CandidateSet, ws: IntArray, opts: IntArray) -> CandidateSet:
    """`cs` with option opts[i] added to the candidates of workload ws[i]: each workload's
    options once, cheapest first, ties by option index (what a per-workload union and stable
    sort by cost gives), every workload's list re-sorted so.

    One sort over all the pairs: the per-workload union and sort it replaces cost ~15 ms a
    call at 1000x200 (1,000 small numpy calls), and the planner makes two or three a plan.
    """
    n_w, n_o = len(cs.cand), np.int64(max(1, len(cs.options)))
    lens = np.fromiter((c.size for c in cs.cand), dtype=np.int64, count=n_w)
    own_o = np.concatenate(cs.cand).astype(np.int64) if n_w else np.zeros(0, dtype=np.int64)
    key = np.unique(np.concatenate((
        np.repeat(np.arange(n_w, dtype=np.int64), lens) * n_o + own_o,
        ws.astype(np.int64) * n_o + opts.astype(np.int64))))
    w_k, o_k = key // n_o, key % n_o
    order = np.lexsort((o_k, cs.cost[w_k, o_k], w_k))
    w_s, o_s = w_k[order], o_k[order]
    bounds = np.searchsorted(w_s, np.arange(n_w + 1, dtype=np.int64))
    cand = tuple(o_s[bounds[w]:bounds[w + 1]].copy() for w in range(n_w))
    return dataclasses.replace(cs, cand=cand)
