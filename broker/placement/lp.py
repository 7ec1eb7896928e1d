r"""The cost/latency placement program, built with numpy/scipy.sparse, solved by HiGHS.

Model (one epoch; candidates.py supplies the feasible pairs and their costs)
--------------------------------------------------------------------------
Sets: W pending workloads; O options (cluster x pool x pricing); C(w) ⊆ O the
pruned candidates of w; D(w) the spread domains of w's candidates; cl(o) the
cluster of o; R = {cpu, memory, gpu}.

Data: R_w replicas; d_{w,r} per-replica demand; c_{w,o} per-replica cost =
compute + egress + latency + bias (candidates.py); P_w unplaced penalty per
replica (ledger.unplaced_penalty: > every option's cost, x priority factor);
h_{o,r} headroom (feasibility.capacity_shares: the policy's ratio for cpu and memory, 1
for GPUs, which are whole devices and never overcommitted; 1 for every resource of a cloud
pool of GPU nodes, which are bought for their GPUs); F_{o,r} free capacity (clipped at 0);
N_{o,r} allocatable per node; f_o the fixed charge of opening one node of o (the
packing model, candidates.node_charges: price x (boot + idle timer + max(billing minimum,
min(horizon, longest work on o)))), less the share the forecast arrivals would pay
(candidates.fill_shares: 1/2 x min(λL / (F + N), 1 - d/N), below 1/2), or ε =
NEW_NODE_EPSILON_USD (the per-replica model, a tie-breaker);
A_o nodes the pool may add; Q_{c,r} quota headroom (vCPU, GPU) of cluster c;
p_{w,o} USD/h per replica; B_t tenant budget; B_w workload budget.

Variables: x_{w,o} ∈ Z≥0 replicas of w on o (o ∈ C(w)); u_w ∈ [0, R_w] unplaced;
n_o ∈ Z, 0 ≤ n_o ≤ A_o new nodes; y_{w,d} ∈ {0,1} w uses domain d (only for
workloads with spread or anti-affinity); m_w = min(min_domains, R_w),
M_w = max_domains; T_{w,c} the fixed share of cluster c of a `replicaSplit: weighted`
workload (weighted.py; clusters without one are infeasible for w).

    min  Σ_w Σ_{o∈C(w)} c_{w,o} x_{w,o} + Σ_w P_w u_w + Σ_o max(f_o, ε) n_o
    s.t. Σ_{o∈C(w)} x_{w,o} + u_w = R_w                          ∀w      (demand)
         Σ_w d_{w,r} x_{w,o} - h_{o,r} N_{o,r} n_o ≤ h_{o,r} F_{o,r}   ∀o,r    (capacity)
         Σ_{o: cl(o)=c} N_{o,r} n_o ≤ Q_{c,r}                      ∀c,r∈{cpu,gpu} (quota)
         Σ_{w∈t} Σ_o p_{w,o} x_{w,o} ≤ B_t                         ∀t      (budget)
         Σ_o p_{w,o} x_{w,o} ≤ B_w                                 ∀w      (budget)
         x_{w,o} ≤ R_w y_{w,d(o)}                                  ∀w,o    (spread link)
         y_{w,d} ≤ Σ_{o: d(o)=d} x_{w,o}                           ∀w,d    (spread link)
         R_w Σ_d y_{w,d} + m_w u_w ≥ m_w R_w                       ∀w      (spread min)
         Σ_d y_{w,d} ≤ M_w                                         ∀w      (spread max)
         y_{a,c} + y_{b,c} ≤ 1                     ∀ a avoids b, c cluster (anti-affinity)
         Σ_{o∈C(w): cl(o)=c} x_{w,o} ≤ T_{w,c}            ∀w weighted, c   (weighted)
         Σ_{w∈k} x_{w,o} - K_{o,k} n_o ≤ S_{o,k}            ∀o, k ∈ G(o)     (gpu-sets)

GPU sets. k = (GPUs per replica, needs NVLink) is a job's GPU class; S_{o,k} the
disjoint k-sets free on o's running nodes (feasibility.free_gpu_sets: topology.allocate
carves them, NVLink rings only for NVLink jobs; whole nodes reserved for queued
whole-node jobs left out for smaller classes), K_{o,k} those of an empty node; G(o) the
multi-GPU classes feasible on o (and single GPUs where nodes are reserved). The capacity
row alone would let a 2-GPU job use two GPUs on two nodes, or a pair that meets across PCIe.

Packing. F_o is room on nodes that run (are paid) already and costs only c; capacity
beyond it comes in whole nodes n_o at f_o each. So the program fills paid room first,
then opened nodes, and opens the pool whose charge the batch fills best: a fixed-charge
bin-packing. The relaxation spreads f_o over fractional n_o (it prices a new node's room
at f_o / N_o per unit, the per-replica model's view); integrality is restored by the
Ledger (it opens ceil nodes and charges f_o for each, so `Ledger.objective` is this
objective and LP bound <= objective holds) and, past the gap target, by the MIP.

Egress. c_{w,o} shares one copy of w's input among its R_w replicas: the linear
relaxation of "each cluster running a replica of w needs the whole copy", exact when w
runs in one cluster. The integer objective (ledger.Ledger.split_egress) charges the copy
again for each further cluster, so integer solutions are compared by what they bill,
and the LP value stays a bound.

The slack u makes the program always feasible; an unplaced replica's reason
is the family whose rows bind (planner.py). Per-pair constraints (RTT <= SLO,
GPU model/topology, taints, affinity labels, spot_ok, health) are already
applied by dropping infeasible pairs.

Solving strategy
----------------
0. On large batches (pricing.seed), the columns C(w) come from the row duals of a sample
   of the batch (its capacities scaled to its share, priced to convergence): the
   per_workload options cheapest at those prices, instead of the k cheapest by cost; on the
   largest (decomposed by pool family, planner.py), every GPU job all its feasible options.
1. LP relaxation with HiGHS (simplex; row duals = shadow prices for explain.py).
2. Column generation (pricing.py): options pruned away by top-k whose reduced
   cost c - A'y is negative are added and the LP re-solved warm, until none
   prices out (then the bound is that of the unpruned program) or the time
   budget ends (then `lagrangian_bound` is the valid bound).
3. Two roundings (rounding.py) through the integer `Ledger` (which recomputes n and
   respects every coupling constraint): the floor of x loaded most valuable
   workload first, then repaired; and an LP-guided greedy (on seeded batches instead the
   floor rounding with the GPU family first, rounding.family_first). The greedy
   incumbent is the third candidate; the cheapest wins. Then local moves on it:
   ejections for unplaced replicas (`rounding.improve`) and node closing
   (`rounding.close_nodes`: re-pack the workloads of a pool with new nodes into
   room already paid or opened, so it opens one node fewer) and merges
   (`rounding.merge_splits`: a workload split over clusters, each paying its input's
   copy, filled again in one of them); each kept only if the objective drops. Node
   closing and merges run on models too large for the whole MIP only; the merges also
   on the neighbourhood MIP's plan (step 4).
4. gap = (best - bound) / |bound|. Only when it exceeds the target, a
   time-boxed MIP (HiGHS branch-and-cut, warm-started from the best
   rounding): the whole program when it is small (its dual bound tightens
   `bound`), else a neighbourhood of the rounding (the unplaced and their neighbours, or
   on batches decomposed by pool family the whole GPU family; `fix_outside`: every
   workload outside it keeps its rounded x and u; HiGHS gets only the free
   columns, the fixed ones folded into the row bounds as
   row_lo - A_fix x_fix <= A_free x_free <= row_hi - A_fix x_fix); its
   solution is kept if cheaper. Because greedy is a candidate, the result is
   never worse than greedy's.
5. On the plan kept, placements of latency-SLO services short of their asked replicas
   that serve none under queueing give their room to workloads that then serve
   (rounding.release_unserving; kept only where some other fill is: docs/placement.md
   section 2 step 5). This objective, which prices every placed replica alike, may rise
   by it (and so end above greedy's); `stats.objective` is the plan's after it.

PuLP is the solver-agnostic back-end (`solver="pulp-cbc" | "pulp-glpk" |
"pulp-highs" | "pulp-gurobi" | "pulp-cplex"`, and `lp_path` writes the model as
an LP file for debugging); it solves the same matrix, and its plan gets the same local
moves (planner.polish).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from broker.placement import lp_rows
from broker.placement.candidates import BoolArray, CandidateSet, FloatArray, IntArray
from broker.placement.feasibility import gpu_class
from broker.placement.ledger import node_costs

# Threads of HiGHS's task scheduler (`_one_thread`).
HIGHS_THREADS = 1
# Rows a W x O pass works on at a time (_dual_adjusted): 256 x 2000 float64 is 4 MB.
ROW_BLOCK = 256
_BANNER_LOCK = threading.Lock()
_banner_state = {"silenced": False}


class SolverError(Exception):
    """The chosen solver back-end is unknown or failed outright (not infeasibility)."""


@dataclass(slots=True)
class Model:
    """The matrix form: min c'x s.t. row_lo <= A x <= row_hi, col_lo <= x <= col_hi."""

    cost: FloatArray
    col_lo: FloatArray
    col_hi: FloatArray
    integer: IntArray  # 1 = integer column
    a: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    row_names: list[tuple[str, str]]  # (family, key)
    x_w: IntArray  # workload of each x column
    x_o: IntArray  # option of each x column
    n_x: int
    u_start: int
    n_start: int
    n_opts: IntArray  # option of each n column
    y_start: int
    n_y: int
    y_keys: list[tuple[int, str, str]]  # (workload, "spread"|"cluster", domain) per y column
    cap_rows: dict[tuple[int, int], int] = field(default_factory=dict)  # (option, res) -> row
    budget_rows: dict[str, int] = field(default_factory=dict)  # tenant -> row
    # (option, GPU class) -> row of the gpu-sets family
    set_rows: dict[tuple[int, tuple[int, bool]], int] = field(default_factory=dict)


@dataclass(slots=True)
class Relaxation:
    status: str
    objective: float
    x: FloatArray
    row_dual: FloatArray
    solve_s: float


@dataclass(slots=True)
class MipResult:
    status: str
    objective: float | None
    bound: float | None
    x: FloatArray | None
    solve_s: float
    extra: dict[str, float] = field(default_factory=dict)


def build(cs: CandidateSet, pen: FloatArray, tenant_budgets: dict[str, float]) -> Model:
    """Assemble the matrix of the module docstring from a candidate set."""
    n_w = len(cs.workloads)
    replicas = cs.replicas
    lens = np.array([c.size for c in cs.cand], dtype=np.int64)
    x_w = np.repeat(np.arange(n_w, dtype=np.int64), lens)
    x_o = np.concatenate(cs.cand).astype(np.int64) if n_w else np.zeros(0, dtype=np.int64)
    n_x = x_w.size
    u_start = n_x
    # Every option gets its n column and capacity rows, used by a column or not,
    # so the row set does not depend on the candidates (pricing.py adds columns
    # to a solved model and maps the solution onto a rebuilt one row for row).
    used_opts = np.arange(len(cs.options), dtype=np.int64)
    n_start = u_start + n_w
    n_col_of = {int(o): n_start + k for k, o in enumerate(used_opts)}
    y_start = n_start + used_opts.size
    inf = math.inf
    rows = lp_rows.Rows()
    # demand rows 0..W-1 (vectorised): row w holds w's x columns and u_w
    starts = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    rows.r.append(np.concatenate((x_w, np.arange(n_w, dtype=np.int64))))
    rows.c.append(np.concatenate((np.arange(n_x, dtype=np.int64),
                                  u_start + np.arange(n_w, dtype=np.int64))))
    rows.v.append(np.ones(n_x + n_w))
    rows.lo.extend(float(r) for r in replicas)
    rows.hi.extend(float(r) for r in replicas)
    rows.names.extend(("demand", w.id) for w in cs.workloads)
    cap_rows = lp_rows.capacity_rows(cs, rows, x_w, x_o, used_opts, n_col_of)
    lp_rows.quota_rows(cs, rows, used_opts, n_col_of)
    budget_rows = lp_rows.budget_rows(cs, rows, x_w, x_o, tenant_budgets)
    y_keys = lp_rows.spread_rows(cs, rows, x_w, x_o, starts, u_start, y_start)
    lp_rows.weighted_rows(cs, rows, x_o, starts)
    set_rows = lp_rows.gpu_set_rows(cs, rows, x_w, x_o, n_col_of)
    n_y = len(y_keys)
    n_col = y_start + n_y
    cost = np.zeros(n_col)
    cost[:n_x] = cs.cost[x_w, x_o]
    cost[u_start:n_start] = pen
    cost[n_start:y_start] = node_costs(cs)[used_opts]
    col_lo = np.zeros(n_col)
    col_hi = np.full(n_col, inf)
    # x <= R_w is implied by the demand row; an explicit bound would make the
    # demand duals degenerate (and reduced-cost pricing useless).
    col_hi[:n_x] = inf
    col_hi[u_start:n_start] = replicas
    node_hi = lp_rows.node_bounds(cs, used_opts)
    col_hi[n_start:y_start] = node_hi
    col_hi[:n_x] = lp_rows.fit_bounds(cs, x_w, x_o, used_opts, node_hi)
    col_hi[y_start:] = 1.0
    integer = np.ones(n_col, dtype=np.int64)
    integer[u_start:n_start] = 0
    if rows.r:
        r_all = np.concatenate(rows.r)
        c_all = np.concatenate(rows.c)
        v_all = np.concatenate(rows.v)
    else:
        r_all = c_all = np.zeros(0, dtype=np.int64)
        v_all = np.zeros(0)
    a = sp.csc_matrix((v_all, (r_all, c_all)), shape=(len(rows.lo), n_col))
    a.sum_duplicates()
    return Model(cost=cost, col_lo=col_lo, col_hi=col_hi, integer=integer, a=a,
                 row_lo=np.array(rows.lo), row_hi=np.array(rows.hi), row_names=rows.names,
                 x_w=x_w, x_o=x_o, n_x=n_x, u_start=u_start, n_start=n_start,
                 n_opts=used_opts.astype(np.int64), y_start=y_start, n_y=n_y,
                 y_keys=y_keys, cap_rows=cap_rows, budget_rows=budget_rows,
                 set_rows=set_rows)


def quiet_highs() -> Any:
    """A new `highspy.Highs()`, without the banner HiGHS prints at its first construction.

    Why: HiGHS writes "Running HiGHS ..." from C++ straight to file descriptor 1 the first
    time a `Highs` is built in a process, before `output_flag` can be set; it would pollute
    `skyfed ... --json` output and `skyfed serve` logs. So the first construction runs with
    fd 1 pointed at /dev/null (Python's `redirect_stdout` cannot catch a C-level write) and
    restored in `finally`. The lock makes concurrent first solves (the placement loop and a
    what-if in another thread) safe; anything another thread writes to stdout during those
    few milliseconds is dropped too. Later constructions print nothing and skip all this.
    """
    import highspy

    if _banner_state["silenced"]:
        return _one_thread(highspy.Highs())  # type: ignore[no-untyped-call]
    with _BANNER_LOCK:
        if _banner_state["silenced"]:
            return _one_thread(highspy.Highs())  # type: ignore[no-untyped-call]
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
            finally:
                os.close(devnull)
            h = highspy.Highs()  # type: ignore[no-untyped-call]
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        # Whatever started HiGHS's process-wide task scheduler before (another library's
        # instance), it starts again with HIGHS_THREADS at the next run.
        h.resetGlobalScheduler(True)
        _banner_state["silenced"] = True
        return _one_thread(h)


def _one_thread(h: Any) -> Any:
    """`h` on HIGHS_THREADS threads. Why one: the models here are small (a twin epoch's MIP
    has ~250 columns and closes at its root node), and HiGHS's worker threads cost more
    than they save on them: replaying federation-day's first 4 h of plans (462 epochs,
    125 MIPs) took 1.76 / 1.64 s of MIP CPU with the default and 1.08 / 0.98 s with one
    thread, and on the loaded 2-core machine the MIPs' wall time was 2-3x their CPU time
    with the default (waiting for a worker). The plans were the same. HiGHS takes the
    thread count once per process, when its scheduler starts: every instance sets it."""
    h.setOptionValue("threads", HIGHS_THREADS)
    return h


def _highs(model: Model, *, integer: bool, time_limit_s: float, mip_gap: float) -> object:
    h = quiet_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.01, float(time_limit_s)))
    if integer:
        h.setOptionValue("mip_rel_gap", float(mip_gap))
    a = model.a
    n_col, n_row = a.shape[1], a.shape[0]
    integrality = (model.integer if integer else np.zeros(n_col, dtype=np.int64)).astype(
        np.int32)
    h.passModel(n_col, n_row, int(a.nnz), 1, 1, 0.0, model.cost, model.col_lo, model.col_hi,
                model.row_lo, model.row_hi, a.indptr.astype(np.int32),
                a.indices.astype(np.int32), a.data.astype(np.float64), integrality)
    return h


def new_highs(model: Model, *, time_limit_s: float) -> Any:
    """A HiGHS instance holding the LP relaxation of `model` (not yet solved)."""
    return _highs(model, integer=False, time_limit_s=time_limit_s, mip_gap=0.0)


def run_relaxation(h: Any, model: Model, t0: float, *, n_extra: int = 0) -> Relaxation:
    """(Re-)solve the LP held by `h`, warm from its last basis; `n_extra` columns were added."""
    h.run()
    status = h.modelStatusToString(h.getModelStatus()).lower()
    sol = h.getSolution()
    x = np.asarray(sol.col_value, dtype=np.float64)
    duals = np.asarray(sol.row_dual, dtype=np.float64)
    obj = float(h.getInfo().objective_function_value)
    if x.size != model.cost.size + n_extra or status != "optimal":
        raise SolverError(f"HiGHS did not solve the LP relaxation (status {status}); "
                          "raise PlannerConfig.lp_time_limit_s")
    return Relaxation(status=status, objective=obj, x=x, row_dual=duals,
                      solve_s=time.perf_counter() - t0)


def solve_relaxation(model: Model, *, time_limit_s: float) -> Relaxation:
    """LP relaxation with HiGHS: objective (a lower bound), primal x, row duals."""
    t0 = time.perf_counter()
    return run_relaxation(new_highs(model, time_limit_s=time_limit_s), model, t0)


def solve_mip(model: Model, start: FloatArray | None, *, time_limit_s: float,
              mip_gap: float, max_nodes: int | None = None,
              substitute_fixed: bool = False,
              options: Mapping[str, bool | int | float] | None = None) -> MipResult:
    """Time-boxed MIP, warm-started; reports the dual bound so the gap is honest.

    A warm start HiGHS misprices is solved again from scratch (`_mispriced_start`): the
    objective returned is always what the returned x costs.

    `max_nodes` caps branch-and-bound nodes (status "work_limit" when it stops there): with
    it and a time limit that does not bind, the result does not depend on the machine's load.
    `substitute_fixed` (the neighbourhood MIP, `fix_outside`): HiGHS gets only the columns
    with lo < hi, the fixed ones moved into the row bounds (and their cost into a constant),
    so it neither reads nor presolves the ~95 % of the model that cannot move; x, objective
    and bound come back for the whole model. `options`: more HiGHS options, by name.
    """
    t0 = time.perf_counter()
    free: IntArray | None = None
    sub, const = model, 0.0
    if substitute_fixed:
        free = np.flatnonzero(model.col_lo != model.col_hi)
        sub, const = _without_fixed(model, free)
    import highspy

    h = _highs(sub, integer=True, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))  # type: ignore[attr-defined]
    for name, value in (options or {}).items():
        if h.setOptionValue(name, value) != highspy.HighsStatus.kOk:  # type: ignore[attr-defined]
            raise SolverError(f"HiGHS rejected the option {name}={value!r}")
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start if free is None else start[free])
        h.setSolution(sol)  # type: ignore[attr-defined]
    h.run()  # type: ignore[attr-defined]
    status = h.modelStatusToString(h.getModelStatus()).lower()  # type: ignore[attr-defined]
    info = h.getInfo()  # type: ignore[attr-defined]
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)  # type: ignore[attr-defined]
    has_sol = int(info.primal_solution_status) >= 2 and x.size == sub.cost.size
    if has_sol and free is not None:
        full = model.col_lo.copy()  # the fixed columns' values (lo == hi)
        full[free] = x
        x = full
    result = MipResult(
        status="time_limit" if "time limit" in status
        else "work_limit" if "solution limit" in status else status,
        objective=float(info.objective_function_value) + const if has_sol else None,
        bound=float(info.mip_dual_bound) + const if math.isfinite(info.mip_dual_bound)
        else None,
        x=x if has_sol else None, solve_s=time.perf_counter() - t0)
    if start is not None and _mispriced_start(model, result):
        return _from_scratch(model, start, result, time_limit_s=time_limit_s, mip_gap=mip_gap,
                             max_nodes=max_nodes, substitute_fixed=substitute_fixed,
                             options=options, t0=t0)
    return result


# Relative difference between HiGHS's objective and what its x costs past which the warm
# start was mispriced (HiGHS's own values agree to ~1e-12 relative).
MISPRICED_REL = 1e-6


def _mispriced_start(model: Model, result: MipResult) -> bool:
    """Whether HiGHS reported an objective its solution does not cost.

    Why: HiGHS 1.16.0 can misprice a MIP start in its presolved space. On the 5000x500
    bench batch seed 1 its log read "MIP start solution is feasible: objective value is
    181345.10" and then "... feasible in the reduced space: objective value is 175211.70";
    it took that value as the incumbent and as the dual bound, stopped at its root as
    "optimal", and returned the start. The same neighbourhood solved without the start:
    179,678.14, its dual bound 179,678.09. HiGHS 1.15.1 prices that start right. Seen on
    5000x500 seeds 1 and 2 and in 36 of federation-day's 705 MIPs (lp, seed 1); never on
    1000x200 seeds 1-3 or in retail-peak's, gpu-training's and edge-heavy's 245."""
    if result.x is None or result.objective is None:
        return False
    real = float(model.cost @ result.x)
    return abs(real - result.objective) > MISPRICED_REL * max(1.0, abs(real))


def _from_scratch(model: Model, start: FloatArray, warm: MipResult, *, time_limit_s: float,
                  mip_gap: float, max_nodes: int | None, substitute_fixed: bool,
                  options: Mapping[str, bool | int | float] | None, t0: float) -> MipResult:
    """The MIP again without its mispriced start, in what is left of the box: its plan if
    it costs less than the start, else the start at what it costs; the warm run's objective
    and bound, which rest on the wrong price, are dropped."""
    left = time_limit_s - (time.perf_counter() - t0)
    cold = solve_mip(model, None, time_limit_s=left, mip_gap=mip_gap, max_nodes=max_nodes,
                     substitute_fixed=substitute_fixed, options=options) if left > 0.01 else None
    start_cost = float(model.cost @ start)
    cold_cost = float(model.cost @ cold.x) if cold is not None and cold.x is not None \
        else math.inf
    if cold is not None and cold_cost < start_cost:
        return MipResult(status=cold.status, objective=cold_cost, bound=cold.bound, x=cold.x,
                         solve_s=time.perf_counter() - t0)
    return MipResult(status=cold.status if cold is not None else warm.status,
                     objective=start_cost, bound=cold.bound if cold is not None else None,
                     x=start.copy(), solve_s=time.perf_counter() - t0)


def _without_fixed(model: Model, free: IntArray) -> tuple[Model, float]:
    """The matrix of `model` over the `free` columns, and the fixed columns' cost.

    Every other column has lo == hi: its value v moves into the row bounds
    (row_lo - A_fixed v <= A_free x <= row_hi - A_fixed v), and rows left without a free
    column are dropped (the fixed values satisfy them: they are a feasible start). Only the
    matrix fields are meaningful; the result is for HiGHS, never returned to a caller.
    """
    fixed = np.ones(model.cost.size, dtype=bool)
    fixed[free] = False
    value = model.col_lo[fixed]
    a = model.a
    shift = a[:, fixed] @ value
    sub_a = a[:, free]
    rows = np.flatnonzero(np.bincount(sub_a.indices, minlength=a.shape[0]) > 0)
    sub = replace(model, cost=model.cost[free], col_lo=model.col_lo[free],
                  col_hi=model.col_hi[free], integer=model.integer[free],
                  a=sp.csc_matrix(sub_a[rows, :]), row_lo=model.row_lo[rows] - shift[rows],
                  row_hi=model.row_hi[rows] - shift[rows])
    return sub, float(model.cost[fixed] @ value)


def fix_outside(model: Model, start: FloatArray, free_w: IntArray) -> Model:
    """`model` with the x and u columns of every workload not in `free_w` fixed at `start`.

    A neighbourhood of a feasible integer solution (large neighbourhood search): HiGHS's
    presolve removes the fixed columns, so the MIP left is over the free workloads only
    (with the nodes, quotas and budgets they share with the fixed ones), small enough to
    solve in well under a second where the whole MIP does not finish its root in 5 s.
    Its dual bound holds for the neighbourhood only, never for the whole program.
    """
    n_w = model.n_start - model.u_start
    fixed = np.ones(n_w, dtype=bool)
    fixed[free_w] = False
    cols = np.concatenate((np.flatnonzero(fixed[model.x_w]),
                           model.u_start + np.flatnonzero(fixed)))
    lo, hi = model.col_lo.copy(), model.col_hi.copy()
    lo[cols] = start[cols]
    hi[cols] = start[cols]
    return replace(model, col_lo=lo, col_hi=hi)


def reduced_costs(cs: CandidateSet, model: Model, relax: Relaxation, *,
                  for_bound: bool = False) -> FloatArray:
    """c - A'y for every feasible (workload, option) pair, in or out of the model.

    Options without capacity rows yet have zero capacity duals (nothing binds
    there). For pricing, columns of workloads with spread/anti-affinity/own
    budget/weighted rows are not priced (their link rows would change): +inf. With
    `for_bound`, they get a lower estimate instead (minus the largest |dual|
    of their own rows), so the Lagrangian bound built on it stays valid.
    """
    n_w = cs.cost.shape[0]
    y = relax.row_dual
    rc = _dual_adjusted(cs, model, y, demand=True)
    linked = linked_workloads(cs)
    if not for_bound:
        rc[linked] = np.inf
    elif linked.any():
        ids = {w.id: i for i, w in enumerate(cs.workloads)}
        worst = np.zeros(n_w)
        for r, (family, key) in enumerate(model.row_names):
            if family in ("spread", "anti-affinity", "budget", "weighted"):
                for part in key.removeprefix("workload:").split("|"):
                    i = ids.get(part)
                    if i is not None:
                        worst[i] = max(worst[i], abs(float(y[r])))
        rc -= worst[:, None]
    np.copyto(rc, np.inf, where=~cs.feasible)
    out: FloatArray = rc
    return out


def linked_workloads(cs: CandidateSet) -> BoolArray:
    """Workloads with rows of their own besides demand (spread, anti-affinity, a budget of
    their own, weighted shares): a new column of theirs changes those rows too."""
    return np.array([w.spec.spread is not None or bool(w.spec.avoid_workloads)
                     or w.spec.budget_usd_per_hour is not None or bool(cs.target(i))
                     for i, w in enumerate(cs.workloads)], dtype=bool)


def option_prices(cs: CandidateSet, model: Model, duals: FloatArray) -> FloatArray:
    """c - A'y of every (workload, option) pair of `cs` under the capacity, GPU-set and
    tenant-budget duals of `model`'s rows, without the demand rows' duals (+inf where
    infeasible).

    A demand dual is one constant per workload, so this ranks each workload's options as
    its reduced costs do; and `model` may be of another batch over the same options
    (pricing.seed's sample: its rows are keyed by option, GPU class and tenant, not by
    workload).
    """
    rc = _dual_adjusted(cs, model, duals, demand=False)
    np.copyto(rc, np.inf, where=~cs.feasible)
    return rc


def _dual_adjusted(cs: CandidateSet, model: Model, y: FloatArray, *,
                   demand: bool) -> FloatArray:
    """cs.cost minus each pair's column times the row duals y of `model`: its demand row
    (with `demand`), its option's capacity rows, its GPU-set row and its tenant's budget."""
    n_w, n_o = cs.cost.shape
    cap_dual = np.zeros((n_o, 3))
    for (o, r), row in model.cap_rows.items():
        cap_dual[o, r] = y[row]
    # rc = cost - y_w - sum over r of demand[:, r] x cap_dual[:, r], left to right, computed
    # ROW_BLOCK rows at a time: at 20000x2000 a W x O temporary is 320 MB, and a fresh one
    # per term cost its page faults as well as its pass (~0.1 s each); a block's fit in cache.
    # Resource by resource, not `cs.demand @ cap_dual.T`: an inner dimension of 3 gains
    # nothing from BLAS, and OpenBLAS's worker threads spun on after that matmul (a third
    # more CPU than wall time per plan on 2 cores, taken from whatever else ran there).
    rc = np.empty((n_w, n_o))
    scratch = np.empty((min(n_w, ROW_BLOCK), n_o))
    for a in range(0, n_w, ROW_BLOCK):
        b = min(n_w, a + ROW_BLOCK)
        block, tmp = rc[a:b], scratch[:b - a]
        if demand:
            np.subtract(cs.cost[a:b], y[a:b, None], out=block)
        else:
            block[...] = cs.cost[a:b]
        for r in range(3):
            np.multiply.outer(cs.demand[a:b, r], cap_dual[:, r], out=tmp)
            block -= tmp
    if model.set_rows:
        cls_w: dict[tuple[int, bool], list[int]] = {}
        for wi, wl in enumerate(cs.workloads):
            cls = gpu_class(wl)
            if cls is not None:
                cls_w.setdefault(cls, []).append(wi)
        for (o, cls), row in model.set_rows.items():
            rc[np.array(cls_w.get(cls, []), dtype=np.int64), o] -= y[row]
    if model.budget_rows:
        tenants = [w.tenant for w in cs.workloads]
        t_dual = np.array([y[model.budget_rows[t]] if t in model.budget_rows else 0.0
                           for t in tenants])
        rc -= t_dual[:, None] * cs.usd_per_hour
    out: FloatArray = rc
    return out


def lagrangian_bound(cs: CandidateSet, model: Model, relax: Relaxation) -> float:
    """A valid lower bound when pricing stopped early (Lasdon's column-generation bound).

    z* >= z_RMP + sum_w R_w x min(0, least reduced cost of w's columns not in
    the model): any full solution can move at most R_w replicas of w onto
    outside columns. Equal to the LP value once no column prices out.
    """
    rc = reduced_costs(cs, model, relax, for_bound=True)
    rc[model.x_w, model.x_o] = np.inf
    least = np.min(rc, axis=1, initial=np.inf) if rc.size else np.zeros(0)
    gain = np.minimum(0.0, np.where(np.isfinite(least), least, 0.0))
    return float(relax.objective + float(cs.replicas @ gain))
