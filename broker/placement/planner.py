"""One epoch's decisions from a snapshot of state: the functional core.

INTERFACE FIXED EARLY so the live loop (broker/federation) and the twin
(broker/sim) can be built against it in parallel. Keep these names and fields
stable; add fields with defaults.

    plan = plan_epoch(snapshot, action, config, policy="lp")

- `snapshot`: FederationSnapshot (clusters with pools and current usage, the
  pending batch, measured RTTs, user regions, tenants).
- `action`: PolicyAction (per-cluster bias, headroom, prewarm lead, latency
  weight) — from the RL policy or fixed defaults.
- `policy`: "lp" (the LP), "greedy" (cheapest feasible first, the seed's
  selectCloudProvider), "traditional" (filter + least-allocated/balanced
  scoring with static cluster weights, Cluster Autoscaler least-waste),
  "karpenter" (the same federation layer with Karpenter v1 provisioning);
  baselines.py says what each copies. Same inputs, same output type.

Pure: no I/O, no clock reads except `time.perf_counter` for the reported
build/solve durations (they never change a decision, apart from the wall-clock
time boxes, which `PlannerConfig.deterministic` replaces by counted work), no
globals, inputs never mutated.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from broker.domain import FederationSnapshot, Placement, PolicyAction, Workload
from broker.placement import (
    consolidate,
    decisions,
    explain,
    lp,
    migrate,
    mip_stage,
    pricing,
    rounding,
)
from broker.placement.baselines import greedy, karpenter, traditional
from broker.placement.candidates import (
    NODE_BOOT_S,
    PAID_NODE_COST_FRACTION,
    SUNK_SITE_COST_FRACTION,
    CandidateSet,
    build_candidates,
)
from broker.placement.decisions import DecisionConfig
from broker.placement.feasibility import size_for_slo
from broker.placement.kinds import Migration, NodeReplace, PoolScale, PoolScaleIn, Prewarm, Retry
from broker.placement.ledger import Ledger, penalties, tenant_budgets
from broker.placement.memo import PlanMemo

__all__ = [
    "FULL_NODE_POLICIES",
    "POLICIES",
    "PREWARM_POLICIES",
    "SLO_QUEUEING_POLICIES",
    "DecisionConfig",
    "EpochPlan",
    "Migration",
    "NodeReplace",
    "PlannerConfig",
    "PlannerError",
    "PoolScale",
    "PoolScaleIn",
    "Prewarm",
    "Retry",
    "SolveStats",
    "candidates",
    "plan_candidates",
    "plan_epoch",
    "solved_batch",
]

POLICIES = ("lp", "greedy", "traditional", "karpenter")
# Policies whose plan orders nodes ahead of forecast demand (SCENARIO.md): every one except
# those copying systems without it (Kubernetes + Cluster Autoscaler, Karpenter).
PREWARM_POLICIES = ("lp", "greedy")
# Policies that plan services for their latency SLO under queueing (feasibility.size_for_slo:
# RTT + the M/M/c wait, replicas added where the wait needs them). The baselines copy systems
# that filter on RTT alone (Karmada, Cluster Autoscaler, Karpenter, the seed's greedy).
SLO_QUEUEING_POLICIES = ("lp",)
# Policies copying systems that schedule pods up to a node's allocatable (kube-scheduler's
# NodeResourcesFit; Cluster Autoscaler and Karpenter size nodes for the pending pods' requests):
# they plan with no headroom, whatever the action says. The headroom ratio is skyfed's own
# allocation parameter (the RL policy's), kept by lp and by greedy (so lp vs greedy measures
# the optimiser alone). With 0.9 a pod that fills a node was planned onto two new nodes.
FULL_NODE_POLICIES = ("traditional", "karpenter")


# Decomposition by pool family, on batches of at least FAMILY_MIN_BATCH x seed_sample
# workloads (10,000 by default; the live loop solves at most 500 an epoch, the twin's epochs
# fewer still): every workload that needs GPUs gets all its feasible options as columns
# (pricing.with_gpu_columns), and the neighbourhood MIP frees that whole family (every GPU
# job, and whatever else is unplaced: _family) instead of the unplaced and their neighbours,
# in a box that runs until FAMILY_TIME_FRAC x time_limit_s (55 s by default) after plan_epoch
# began, and at least the neighbourhood's own box. At 20000x2000 the rounding leaves ~45,000
# USD of GPU jobs' penalties above the LP's that single moves do not recover, and the
# family's MIP (~48,000 free columns) takes 12-25 s. Constants, not PlannerConfig fields:
# recorded configs (pickled, positional) must keep loading.
FAMILY_MIN_BATCH = 40
FAMILY_TIME_FRAC = 11.0
# No pricing round runs on a family batch: its columns are the seed's (priced to convergence
# on a sample) and, for every GPU job, all its feasible options, and the family MIP takes
# the time a round would. At 20000x2000 seed 1 a round (~70,000 columns) takes ~14 s, 2.3x
# the first solve its start was estimated by, so from 2026-12-05 to 12-07, when pricing
# shared the family box and stopped 20 s (4 x time_limit_s) before its end, the round ran
# past that reserve, and in one bench run of three the family MIP, left 9.7 s where it
# needs 12-14 s from its start, returned nothing: 859,191.72 (3.81 % above the proven bound)
# against 848,678.18-848,923.21 (2.54-2.57 %) in 58-59 s. Without the round, three plans:
# 850,565.47-850,615.91 (2.77 %) in 34-40 s (seed 3: 838,239.90 against 835,938-835,970 with
# the round, which fit there; seed 2 got no round either way; docs/placement.md section 7).


class PlannerError(ValueError):
    """Bad planner input: an unknown policy or solver, a workload not in the batch."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    solver: str = "highs"  # highs | pulp-cbc | pulp-glpk | pulp-highs | pulp-gurobi | pulp-cplex
    k_candidates: int = 8
    mip_gap: float = 0.01
    time_limit_s: float = 5.0
    unplaced_penalty_usd: float = 1000.0
    # Hours a service's cost is counted over in the objective (batch/train use duration_s).
    service_horizon_h: float = 1.0
    # Static per-cluster weights of the Karmada layer of "traditional" and "karpenter";
    # empty = proportional to cluster capacity (baselines.capacity_weights).
    static_weights: Mapping[str, float] = field(default_factory=dict)
    # Write the LP model here (LP format, PuLP back-end) for debugging; "" = don't.
    lp_path: str = ""
    # Seed the LP's incumbent with the greedy solution (LP never worse than greedy).
    greedy_incumbent: bool = True
    # Attach a decision record (explain.py) to every placement.
    explain: bool = True
    # Column generation: rounds of reduced-cost pricing over the pruned-away
    # options, and columns added per workload per round (0 rounds = plain top-k).
    pricing_rounds: int = 8
    pricing_columns: int = 4
    # Stop pricing when a round improves the bound by less than this fraction,
    # or when it would take the solve past this fraction of time_limit_s.
    pricing_min_gain: float = 0.001
    pricing_time_frac: float = 0.3
    # Column seeding from a sample's capacity prices (pricing.seed), for batches of at least
    # pricing.SEED_MIN_BATCH x seed_sample workloads: the sample's size, the options each
    # workload gets from its prices, and the pricing rounds the sample may take (0 = none).
    seed_sample: int = 250
    seed_columns: int = 4
    seed_rounds: int = 30
    # Time box of the ejection moves after rounding (fraction of time_limit_s).
    improve_time_frac: float = 0.1
    # Time box of the node-closing moves after them (rounding.close_nodes; fraction of
    # time_limit_s), and their cap in tried moves when deterministic. They run on models
    # above mip_max_columns only: the whole MIP packs the smaller ones.
    close_time_frac: float = 0.1
    close_max_tries: int = 600
    # The MIP stage (run only while the gap is above mip_gap): the whole program when it has
    # at most this many columns (HiGHS then closes it within the time box; at 1000x200,
    # ~10,000 columns, it did not close its root node in 5 s and never beat the rounding),
    # else a neighbourhood MIP (lp.fix_outside) over the workloads the rounding left
    # unplaced and those placed where they could go, time-boxed to
    # neighbourhood_time_frac x time_limit_s (it returns as soon as it is solved; at 5000x500
    # on the loaded 2-core machine a 1 s box found nothing, a 3 s one 2.5 % off the rounding).
    mip_max_columns: int = 5000
    neighbourhood_time_frac: float = 0.6
    # The LP relaxation must finish (its x guides the rounding, its value is the
    # bound): a separate, generous limit; `time_limit_s` boxes pricing + MIP.
    lp_time_limit_s: float = 60.0
    # Counted work instead of the clock, so the same input gives the same plan on a loaded
    # machine (the twin: docs/twin.md "Seeds and statistics"). The live broker keeps the
    # wall-clock boxes above (it must answer within its epoch). When True, no stage reads
    # the clock to decide: pricing stops on pricing_rounds / pricing_min_gain only; the
    # ejection moves after at most improve_max_tries tried moves; every MIP (whole or
    # neighbourhood) after mip_max_nodes branch-and-bound nodes (HiGHS `mip_max_nodes`), and
    # the whole MIP runs whatever time is left. Every HiGHS solve keeps a wall-clock limit
    # only as a safety net (safety_time_limit_s, for relaxations at least lp_time_limit_s),
    # far above what the caps take; if one ever binds, that plan depends on the clock again.
    # The caps are what the 5 s boxes reach on a quiet machine (measured on the bench's
    # generated batches, CPU time standing in for a quiet machine's wall time): the 0.5 s
    # ejection box tried 127 moves in 0.10 CPU s at 5000x500 (~600 in 0.5 s); a whole MIP
    # at 200x50 with mip_gap 0 took 123 nodes in 4.2 CPU s (~150 in the <= 5 s box).
    # Pricing has no such cap: at 5000x500 its first solve alone (2.3 CPU s) spends the
    # 1.5 s box, while deterministic pricing runs up to pricing_rounds (more work there).
    deterministic: bool = False
    improve_max_tries: int = 600
    mip_max_nodes: int = 150
    safety_time_limit_s: float = 600.0
    # Objective price of a replica on fixed, already-paid sites (PricingModel.EDGE) as a
    # fraction of the apportioned price: 1.0 = apportioned; candidates.SUNK_SITE_COST_FRACTION
    # (0.1) = marginal running cost (the digital twin uses it; see docs/twin.md).
    site_cost_fraction: float = SUNK_SITE_COST_FRACTION
    # The packing model (lp.py, candidates.py): a fixed charge per opened node (boot time plus
    # the provider's minimum billing or the work up to the horizon), none on paid room;
    # `paid_cost_fraction` scales replicas' node shares on cloud pools (1 = full share).
    # False = the per-replica model (every replica its node share, new nodes ~free).
    packing: bool = True
    paid_cost_fraction: float = PAID_NODE_COST_FRACTION
    node_boot_s: float = NODE_BOOT_S
    # Take out the plan's placements of latency-SLO services that are short of what they
    # asked and serve none under queueing, and give their room to the rest
    # (rounding.release_unserving; the lp policies only).
    release_unserving: bool = True
    # The constants of the non-placement decisions (decisions.py, migrate.py).
    decisions: DecisionConfig = field(default_factory=DecisionConfig)


@dataclass(frozen=True, slots=True)
class SolveStats:
    # optimal | time_limit | work_limit (the deterministic MIP's node cap) | heuristic |
    # lp_failed (greedy fallback)
    status: str
    objective: float
    lp_bound: float | None
    gap: float | None
    build_s: float
    solve_s: float
    variables: int = 0
    constraints: int = 0
    # Which stage produced the kept solution: rounded | gpu-first | gpu-alone | guided | greedy
    # (+moves, +packed, +merged: the local moves that changed it) |
    # mip | neighbourhood-mip | family-mip (the neighbourhood of a batch decomposed by pool
    # family) | heuristic.
    source: str = ""
    mip_used: bool = False
    pricing_rounds: int = 0
    heuristic_objective: float | None = None  # best rounding before any MIP
    # max(LP bound, MIP dual bound); `gap` is measured against it.
    best_bound: float | None = None


@dataclass(frozen=True, slots=True)
class EpochPlan:
    placements: tuple[Placement, ...]
    unplaced: Mapping[str, str]  # workload id -> reason (names the binding constraint family)
    scale: tuple[PoolScale, ...]  # nodes each pool must add for this plan
    stats: SolveStats
    # Every other decision of the epoch (see the types above); carried out by the actuator
    # live and simulated by the twin, which decides nothing itself.
    scale_in: tuple[PoolScaleIn, ...] = ()
    prewarm: tuple[Prewarm, ...] = ()
    retries: tuple[Retry, ...] = ()
    migrations: tuple[Migration, ...] = ()
    # Nodes replaced by one cheaper node each (Karpenter's replace consolidation, consolidate.py).
    replacements: tuple[NodeReplace, ...] = ()
    # Replicas planned beyond those asked, per workload, so that a latency-SLO service serves
    # inside its SLO under queueing (SLO_QUEUEING_POLICIES; feasibility.size_for_slo). Its
    # placement holds them; the shells run them as part of the service.
    slo_extra_replicas: Mapping[str, int] = field(default_factory=dict)


def plan_epoch(
    snapshot: FederationSnapshot,
    action: PolicyAction,
    config: PlannerConfig,
    *,
    policy: str = "lp",
    memo: PlanMemo | None = None,
) -> EpochPlan:
    """Every decision of this epoch (see the module docstring).

    Of `snapshot.pending`, only the workloads due (decisions.due: not backing off) are
    solved; the others are neither placed nor unplaced this epoch. For
    SLO_QUEUEING_POLICIES the batch's latency-SLO services are first sized for their SLO
    under queueing (feasibility.size_for_slo; the added replicas in `slo_extra_replicas`).
    Then, on the same snapshot: retries for what stayed unplaced, prewarms, migrations and
    scale-ins. `memo`: what the caller's earlier plans resolved (memo.py: speed only, the
    same plan with or without it); a fresh one per call by default.
    """
    if policy not in POLICIES:
        raise PlannerError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if policy in FULL_NODE_POLICIES and action.headroom != 1.0:
        action = dataclasses.replace(action, headroom=1.0)
    action = decisions.bounded_action(action, config.decisions)
    t0 = time.perf_counter()
    memo = PlanMemo() if memo is None else memo
    snapshot, queued, extra = solved_batch(snapshot, config, policy=policy, memo=memo,
                                           headroom=action.headroom)
    batch = snapshot.pending
    if batch:
        cs = candidates(snapshot, action, config, queued=queued, memo=memo)
        plan = plan_candidates(cs, snapshot, config, policy=policy,
                               candidates_s=time.perf_counter() - t0)
    else:
        plan = EpochPlan((), {}, (), SolveStats("optimal", 0.0, 0.0, 0.0, 0.0, 0.0,
                                                source="empty"))
    if extra:
        plan = dataclasses.replace(plan, slo_extra_replicas=extra)
    return with_decisions(plan, snapshot, action, config, policy=policy, memo=memo)


def solved_batch(snapshot: FederationSnapshot, config: PlannerConfig, *, policy: str,
                 memo: PlanMemo | None = None, headroom: float = 1.0
                 ) -> tuple[FederationSnapshot, tuple[Workload, ...], dict[str, int]]:
    """The snapshot with the batch plan_epoch solves as `pending`, the pending work backing
    off this epoch (`queued`: whole nodes are reserved for its large jobs), and the
    replicas SLO sizing added per workload.

    Only the workloads due (decisions.due) are solved; for SLO_QUEUEING_POLICIES the
    latency-SLO services are sized for their SLO under queueing (feasibility.size_for_slo:
    more replicas, and the wait in the latency mask), counting the room of CPU and memory at
    `headroom` (the plan's PolicyAction.headroom, as its capacity rows). Anything that
    solves "the model plan_epoch solves" (the placement bench's reference bound) starts
    from here.
    """
    batch = tuple(w for w in snapshot.pending if decisions.due(
        w, snapshot.now_s, config.decisions, snapshot.capacity_changed_s))
    due_ids = {w.id for w in batch}
    queued = tuple(w for w in snapshot.pending if w.id not in due_ids)
    extra: dict[str, int] = {}
    if policy in SLO_QUEUEING_POLICIES:
        batch, extra = size_for_slo(snapshot, batch, memo, headroom=headroom)
    if policy in SLO_QUEUEING_POLICIES or len(batch) != len(snapshot.pending):
        snapshot = dataclasses.replace(snapshot, pending=batch)
    return snapshot, queued, extra


def candidates(snapshot: FederationSnapshot, action: PolicyAction,
               config: PlannerConfig, *, queued: Sequence[Workload] = (),
               memo: PlanMemo | None = None) -> CandidateSet:
    """The candidate set of `snapshot.pending` as plan_epoch prices it under `config`
    (`queued`: pending work not in the batch, for the whole-node reservation)."""
    return build_candidates(snapshot, action, k=config.k_candidates,
                            service_horizon_h=config.service_horizon_h,
                            site_cost_fraction=config.site_cost_fraction,
                            packing=config.packing,
                            paid_cost_fraction=config.paid_cost_fraction,
                            node_boot_s=config.node_boot_s,
                            node_idle_s=config.decisions.forecast_idle_s,
                            observed_boot=config.decisions.observed_boot,
                            fill_forecast=config.decisions.fill_forecast, queued=queued,
                            memo=memo)


def with_decisions(plan: EpochPlan, snapshot: FederationSnapshot, action: PolicyAction,
                   config: PlannerConfig, *, policy: str,
                   memo: PlanMemo | None = None) -> EpochPlan:
    """`plan` (placements of `snapshot.pending`) with the epoch's other decisions added.

    Retries for the unplaced; images and data for placements that wait; node prewarm ahead
    of forecast demand (PREWARM_POLICIES: traditional and karpenter copy systems without it);
    migrations (all four rules for "lp", node-loss for every policy); then scale-in of idle
    nodes in pools nothing grows or lands on this epoch (at once for "karpenter",
    consolidateAfter 0 s), and drains of under-used nodes (consolidate.py: Karpenter's
    WhenEmptyOrUnderutilized, Cluster Autoscaler's 0.5 threshold, and for "lp" only nodes
    whose work is all restartable and whose saving pays the restart); for "karpenter" also
    replacements of nodes by one cheaper node each, in the pools nothing was drained from.
    """
    cfg = config.decisions
    specs: dict[str, Workload] = {w.id: w for w in snapshot.pending}
    placed = decisions.placed_usage(plan.placements, specs)
    prewarm = decisions.prewarm_for_placements(snapshot, plan.placements, specs)
    if policy in PREWARM_POLICIES:
        prewarm += decisions.prewarm_nodes(snapshot, action, cfg, placed, plan.scale, memo)
    moves = migrate.migrations(
        snapshot, action, cfg, k=config.k_candidates, service_horizon_h=config.service_horizon_h,
        site_cost_fraction=config.site_cost_fraction, placed=placed,
        reasons=migrate.REASONS if policy == "lp" else migrate.NODE_LOSS_ONLY,
        slo_queueing=policy in SLO_QUEUEING_POLICIES, memo=memo)
    growing = set(placed) | {(s.cluster, s.pool) for s in plan.scale if s.add_nodes > 0} | \
        {(p.cluster, p.pool) for p in prewarm if p.nodes > 0} | \
        {(a.cluster, a.pool) for m in moves for a in m.target.assignments}
    idle = decisions.scale_in(snapshot, _idle_config(cfg, policy), placed, growing, action,
                              forecast=policy in PREWARM_POLICIES, memo=memo)
    drains = consolidate.consolidations(
        snapshot, policy, growing, below=action.consolidate_below, removing=idle,
        floor=decisions.forecast_floor(snapshot, placed, action, cfg) if policy == "lp" else None,
        replace=cfg.consolidate_replace, node_boot_s=config.node_boot_s,
        observed_boot=cfg.observed_boot)
    return dataclasses.replace(
        plan, retries=decisions.retries(snapshot.pending, plan.unplaced, snapshot.now_s, cfg),
        prewarm=prewarm, migrations=moves, scale_in=idle + drains,
        replacements=consolidate.replacements(snapshot, policy, growing, drains))


def _idle_config(cfg: decisions.DecisionConfig, policy: str) -> decisions.DecisionConfig:
    """The config scale-in reads for `policy`: Karpenter's consolidateAfter 0 s removes
    empty nodes at once; the others wait their timers (decisions.scale_in)."""
    return dataclasses.replace(cfg, scale_in_idle_s=0.0) if policy == "karpenter" else cfg


def idle_timer_s(policy: str, action: PolicyAction, config: PlannerConfig, cluster: str,
                 pool: str) -> float:
    """Seconds an empty node of `pool` waits before plan_epoch's scale-in may take it under
    `policy` and `action` (the timer decisions.scale_in reads), so a caller can wake the
    loop when it expires: the live loop ticks every epoch, the twin only when something is
    due (sim/engine.py)."""
    cfg = _idle_config(config.decisions, policy)
    default = cfg.forecast_idle_s if policy in PREWARM_POLICIES else cfg.scale_in_idle_s
    bounded = decisions.bounded_action(action, config.decisions)
    return max(0.0, bounded.for_pool("idle_timeout_s", cluster, pool, default))


def plan_candidates(cs: CandidateSet, snapshot: FederationSnapshot, config: PlannerConfig,
                    *, policy: str, candidates_s: float = 0.0) -> EpochPlan:
    """The solve half of plan_epoch, on a candidate set the caller may have narrowed."""
    pen = penalties(cs, config.unplaced_penalty_usd)
    t1 = time.perf_counter()
    relax: lp.Relaxation | None = None
    model: lp.Model | None = None
    if policy == "greedy":
        ledger = greedy(cs, snapshot)
        stats = _heuristic_stats(ledger, pen, candidates_s, time.perf_counter() - t1)
    elif policy == "traditional":
        ledger = traditional(cs, snapshot, config.static_weights)
        stats = _heuristic_stats(ledger, pen, candidates_s, time.perf_counter() - t1)
    elif policy == "karpenter":
        ledger = karpenter(cs, snapshot, config.static_weights)
        stats = _heuristic_stats(ledger, pen, candidates_s, time.perf_counter() - t1)
    else:
        ledger, stats, relax, model = _solve_lp(cs, snapshot, config, pen, candidates_s)
    return explain.assemble(cs, ledger, pen, stats, relax, model, policy=policy,
                            with_records=config.explain)


def _heuristic_stats(ledger: Ledger, pen: np.ndarray, build_s: float,
                     solve_s: float) -> SolveStats:
    return SolveStats(status="heuristic", objective=ledger.objective(pen), lp_bound=None,
                      gap=None, build_s=build_s, solve_s=solve_s, source="heuristic")


def _gap(objective: float, bound: float) -> float:
    return max(0.0, objective - bound) / max(abs(bound), 1e-9)


def _solve_lp(cs: CandidateSet, snapshot: FederationSnapshot, config: PlannerConfig,
              pen: np.ndarray, candidates_s: float
              ) -> tuple[Ledger, SolveStats, lp.Relaxation | None, lp.Model]:
    """Price, relax, round, repair; MIP only when the gap is above target."""
    t0 = time.perf_counter()
    g = greedy(cs, snapshot) if config.greedy_incumbent else None
    budgets = tenant_budgets(snapshot)
    # Seeding is part of forming the LP, so like the relaxation it is bounded by work
    # (seed_rounds), not by a time box: cut by the clock on a loaded machine it priced a
    # few rounds and its columns were worse than the k cheapest (5000x500: 221,446 with a
    # 0.1 s box, 208,858 bounded by rounds, 209,260 unseeded).
    cs = pricing.seed(cs, pen, budgets, sample=config.seed_sample,
                      per_workload=config.seed_columns, rounds=config.seed_rounds,
                      min_gain=0.0, budget_s=math.inf,
                      lp_time_limit_s=max(config.lp_time_limit_s, config.safety_time_limit_s)
                      if config.deterministic else config.lp_time_limit_s)
    family = _family_batch(cs, config)
    if family:
        cs = pricing.with_gpu_columns(cs)
    if g is not None:
        cs = pricing.with_ledger_columns(cs, g)
    model = lp.build(cs, pen, budgets)
    build_s = candidates_s + time.perf_counter() - t0
    if config.solver != "highs":
        from broker.placement import pulp_backend

        return pulp_backend.solve(cs, snapshot, model, pen, config, build_s, g)
    t1 = time.perf_counter()
    if model.cost.size == 0:
        ledger = Ledger(cs, snapshot)
        obj = ledger.objective(pen)
        return ledger, SolveStats("optimal", obj, obj, 0.0, build_s, 0.0, source="empty"), \
            None, model
    pricing_s = config.pricing_time_frac * config.time_limit_s
    try:
        priced = pricing.generate(
            cs, pen, budgets, model, rounds=0 if family else config.pricing_rounds,
            per_workload=config.pricing_columns,
            min_gain=config.pricing_min_gain,
            budget_s=math.inf if config.deterministic else pricing_s,
            lp_time_limit_s=max(config.lp_time_limit_s, config.safety_time_limit_s)
            if config.deterministic else config.lp_time_limit_s,
            resolve_dual=_seeded_batch(cs, config))
    except lp.SolverError:
        # Never leave an epoch without a plan: fall back to the greedy incumbent.
        fallback = g if g is not None else greedy(cs, snapshot)
        obj = fallback.objective(pen)
        return fallback, SolveStats("lp_failed", obj, None, None, build_s,
                                    time.perf_counter() - t1, source="greedy"), None, model
    cs, model, relax, rounds = priced.cs, priced.model, priced.relax, priced.rounds
    status = "optimal" if relax.status == "optimal" else relax.status
    best, source, best_obj = _round(cs, snapshot, model, relax, pen, g, config, family=family)
    heuristic_obj = best_obj
    # The restricted LP's value bounds the full problem only once no column
    # prices out; otherwise use the Lagrangian bound (<= the LP value). That bound only
    # decides whether the MIP stage runs when the rounding is within mip_gap of the LP
    # value (it is lower, so the gap against it is larger); otherwise the MIP runs either
    # way and the bound is computed after it, so the MIP's time box gets its seconds
    # (20000x2000: 2.4 s of a family box that had 4.9 s left).
    bound: float | None = relax.objective if priced.converged else None
    mip_runs = _gap(best_obj, relax.objective) > config.mip_gap
    if bound is None and not mip_runs:
        bound = min(relax.objective, lp.lagrangian_bound(cs, model, relax))
        mip_runs = _gap(best_obj, bound) > config.mip_gap
    mip_used = False
    mip_bound: float | None = None
    left_s = config.safety_time_limit_s if config.deterministic else \
        config.time_limit_s - (time.perf_counter() - t1)
    if mip_runs:
        family_s = _family_left_s(config, candidates_s, t0) if family else None
        mip = mip_stage.run(cs, snapshot, model, best, pen, budgets, config, left_s,
                            family_s=family_s)
        if mip is not None:
            mip_used = True
            mip_bound = mip.bound
            mip_obj, mip_source = mip.objective, mip.source
            if mip.ledger is not None and merge_splits(mip.ledger, pen, config, model) > 0:
                mip_obj, mip_source = mip.ledger.objective(pen), mip.source + "+merged"
            if mip.ledger is not None and mip_obj < best_obj - 1e-9:
                best, source, best_obj = mip.ledger, mip_source, mip_obj
            status = mip.status if mip.status in ("time_limit", "work_limit") else status
    if release(best, pen, snapshot, config):
        best_obj, source = best.objective(pen), source + "+released"
    if bound is None:
        bound = min(relax.objective, lp.lagrangian_bound(cs, model, relax))
    best_bound = bound if mip_bound is None else max(bound, mip_bound)
    stats = SolveStats(status=status, objective=best_obj, lp_bound=bound,
                       gap=_gap(best_obj, best_bound), build_s=build_s,
                       solve_s=time.perf_counter() - t1, variables=int(model.cost.size),
                       constraints=int(model.a.shape[0]), source=source, mip_used=mip_used,
                       pricing_rounds=rounds, heuristic_objective=heuristic_obj,
                       best_bound=best_bound)
    return best, stats, relax, model


def _seeded_batch(cs: CandidateSet, config: PlannerConfig) -> bool:
    """Whether the batch is large enough to be seeded (pricing.seeds): 2,000 workloads and
    more by default; the live loop's and the twin's batches are smaller. Such batches are
    rounded GPU family first (no guided greedy) and re-priced with dual simplex."""
    return pricing.seeds(len(cs.workloads), sample=config.seed_sample,
                         per_workload=config.seed_columns)


def _family_left_s(config: PlannerConfig, candidates_s: float, t0: float) -> float:
    """Seconds left of the family box (FAMILY_TIME_FRAC x time_limit_s after plan_epoch
    began: `candidates_s` before `t0`, the clock since)."""
    return FAMILY_TIME_FRAC * config.time_limit_s - candidates_s - (time.perf_counter() - t0)


def _family_batch(cs: CandidateSet, config: PlannerConfig) -> bool:
    """Whether the batch is decomposed by pool family (FAMILY_MIN_BATCH)."""
    return 0 < FAMILY_MIN_BATCH * config.seed_sample <= len(cs.workloads)


def _round(cs: CandidateSet, snapshot: FederationSnapshot, model: lp.Model,
           relax: lp.Relaxation, pen: np.ndarray, g: Ledger | None,
           config: PlannerConfig, *, family: bool = False) -> tuple[Ledger, str, float]:
    """Integer solutions from the relaxation; the cheapest wins, then local moves.

    - "rounded": floor of the LP, most valuable workloads first, then repair;
    - "gpu-first": the same for the GPU family first, then for the rest (seeded batches:
      rounding.family_first);
    - "gpu-alone": on batches decomposed by pool family (`family`), gpu-first with the GPU
      family rounded from the LP of the family alone (`_family_alone_x`: every other
      workload held out), the rest from the relaxation;
    - "guided": LP-guided greedy (most valuable, least flexible first), on batches too small
      to be seeded (pricing.seeds);
    - "greedy": the greedy incumbent (so the LP is never worse than greedy);
    then polish's local moves ("+moves", "+packed", "+merged" in the source when any was
    kept), which only lower the objective.
    """
    tries: list[tuple[Ledger, str]] = []
    floor = Ledger(cs, snapshot)
    rounding.load_integer(floor, model, relax.x, floor=True, pen=pen)
    rounding.repair(floor, model, relax.x, pen)
    tries.append((floor, "rounded"))
    if _seeded_batch(cs, config):
        gpu = cs.demand[:, 2] > 0
        gpu_first = Ledger(cs, snapshot)
        rounding.family_first(gpu_first, model, relax.x, pen, gpu)
        tries.append((gpu_first, "gpu-first"))
        alone = _family_alone_x(cs, model, gpu, config) if family else None
        if alone is not None:
            gpu_alone = Ledger(cs, snapshot)
            rounding.family_first(gpu_alone, model, relax.x, pen, gpu, x_first=alone)
            tries.append((gpu_alone, "gpu-alone"))
    else:
        # On seeded batches the guided greedy never won: 23-33 % above the floor rounding
        # (5000x500 seeds 1-3, 2000x300, 20000x2000), for 0.15 s CPU at 5000x500, 1.2 s at
        # 20000x2000.
        guided = Ledger(cs, snapshot)
        rounding.guided(guided, model, relax.x, pen)
        tries.append((guided, "guided"))
    if g is not None:
        tries.append((g, "greedy"))
    best, source = min(tries, key=lambda t: t[0].objective(pen))
    source += polish(best, pen, config, model)
    return best, source, best.objective(pen)


def _family_alone_x(cs: CandidateSet, model: lp.Model, family: np.ndarray,
                    config: PlannerConfig) -> np.ndarray | None:
    """The LP relaxation of the GPU family (`family`: per workload, whether it needs GPUs)
    alone: `model` with every other workload held unplaced (lp.fix_outside), so the jobs' LP
    packs them into all the room, quota and GPU sets there are. None if HiGHS does not solve
    it within lp_time_limit_s.

    Why: in the relaxation of the whole batch GPU jobs are split across pools in proportions
    set together with the CPU work, and rounding that split (gpu-first) strands jobs the
    family MIP then cannot place with the CPU work fixed around them. Rounded from the
    family's own LP, the jobs take their room first and the CPU work goes around them. At
    20000x2000 seed 1 (one process, the same relaxation, the family MIP from each start in
    a 14 s box): 890,193 -> 881,601 before the family MIP and 880,285 -> 871,020 after it;
    the family's LP took 0.5 s (docs/placement.md section 7).
    """
    start = np.zeros(model.cost.size)
    start[model.u_start:model.n_start] = cs.replicas
    alone = lp.fix_outside(model, start, np.flatnonzero(family))
    try:
        relax = lp.solve_relaxation(alone, time_limit_s=config.lp_time_limit_s)
    except lp.SolverError:
        return None
    return relax.x


def polish(best: Ledger, pen: np.ndarray, config: PlannerConfig, model: lp.Model) -> str:
    """The local moves after an integer plan, in place: rounding.improve's ejection moves
    for what is still unplaced, then on models above mip_max_columns rounding.close_nodes'
    node-closing moves and the merge moves (merge_splits). All only lower the objective.
    Returns what to add to the plan's source: "+moves", "+packed", "+merged" for each kind
    that kept a move. The rounding's plans and the PuLP back-end's get them alike."""
    # Models the whole MIP takes (mip_stage.run) get their packing from it; the moves
    # stand in for it where only a neighbourhood MIP runs.
    pack = model.cost.size > config.mip_max_columns
    if config.deterministic:
        kept = rounding.improve(best, pen, budget_s=math.inf,
                                max_tries=config.improve_max_tries)
        closed = rounding.close_nodes(best, pen, budget_s=math.inf,
                                      max_tries=config.close_max_tries) if pack else 0
    else:
        improve_s = config.improve_time_frac * config.time_limit_s
        kept = rounding.improve(best, pen, budget_s=improve_s) if improve_s > 0 else 0
        close_s = config.close_time_frac * config.time_limit_s
        closed = rounding.close_nodes(best, pen, budget_s=close_s) \
            if pack and close_s > 0 else 0
    merged = merge_splits(best, pen, config, model)
    return "+moves" * (kept > 0) + "+packed" * (closed > 0) + "+merged" * (merged > 0)


def release(best: Ledger, pen: np.ndarray, snapshot: FederationSnapshot,
            config: PlannerConfig) -> int:
    """rounding.release_unserving on the final plan (the HiGHS path's and the PuLP
    back-end's), with each workload's running replicas per cluster from `snapshot.running`
    (a service scaling out already runs some); returns the services released (0 when
    `config.release_unserving` is off)."""
    if not config.release_unserving:
        return 0
    on: dict[str, dict[str, int]] = {}
    for p in snapshot.running:
        per = on.setdefault(p.workload_id, {})
        for a in p.assignments:
            per[a.cluster] = per.get(a.cluster, 0) + a.replicas
    return rounding.release_unserving(
        best, pen, [on.get(w.id, {}) for w in best.cs.workloads])


def merge_splits(ledger: Ledger, pen: np.ndarray, config: PlannerConfig,
                 model: lp.Model) -> int:
    """rounding.merge_splits on a plan (the rounding's, the neighbourhood MIP's): in the
    node-closing moves' box, or capped at close_max_tries moves when deterministic. The LP
    and the MIP price a workload's input as one copy shared by its replicas, so their plans
    split workloads over clusters that then each need the copy (measured in
    docs/placement.md, section 2 step 3: 1000x200 -0.15 %, 20000x2000 -0.06 to -0.09 %, a
    few ms). Like the node-closing moves, only on models above mip_max_columns: on the
    smaller ones (the twin's epochs, whole MIPs) they were measured and not kept, with no
    verdict over 72 held-out drafts (docs/placement.md, section 2 step 3)."""
    if model.cost.size <= config.mip_max_columns:
        return 0
    if config.deterministic:
        return rounding.merge_splits(ledger, pen, budget_s=math.inf,
                                     max_tries=config.close_max_tries)
    box = config.close_time_frac * config.time_limit_s
    return rounding.merge_splits(ledger, pen, budget_s=box) if box > 0 else 0
