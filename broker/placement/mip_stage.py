"""The planner's MIP stage: the whole MIP on small models, a neighbourhood MIP on large ones.
Pure.

Runs only while the rounding's gap is above PlannerConfig.mip_gap (planner._solve_lp).
Models of at most mip_max_columns columns get the whole program for what is left of
time_limit_s; larger ones a neighbourhood of the rounding (lp.fix_outside: large
neighbourhood search), either the unplaced workloads and those placed on their options
(`neighbourhood`), or, on batches decomposed by pool family, the whole GPU family
(`family`). docs/placement.md section 2, step 4, has the measurements behind each choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from broker.domain import FederationSnapshot
from broker.placement import lp, pricing, rounding
from broker.placement.candidates import CandidateSet, FloatArray, IntArray
from broker.placement.ledger import Ledger

if TYPE_CHECKING:  # planner imports this module; the config is only a type here
    from broker.placement.planner import PlannerConfig


# HiGHS options of the family MIP only. Its root reduced-cost heuristic (a sub-MIP over the
# columns the root LP's reduced costs keep) spent seconds and found nothing the other
# heuristics did not: the family MIPs of 20000x2000 seeds 1-3, each solved to HiGHS's 1 % gap
# from the planner's start, took 14.3 / 11.3 / 1.2 s with it and 10.6 / 8.0 / 1.2 s without,
# to objectives within 0.003 % (873,184.72 vs 873,184.70; 998,598.31 vs 998,590.50; the
# start). The smaller MIPs (whole, neighbourhood) keep HiGHS's defaults: the twin plans with
# them, and what the option does there is not measured.
FAMILY_HIGHS_OPTIONS: Mapping[str, bool | int | float] = MappingProxyType({
    "mip_heuristic_run_root_reduced_cost": False})


@dataclass(frozen=True, slots=True)
class MipOutcome:
    status: str
    bound: float | None  # a bound of the whole program (None for a neighbourhood)
    ledger: Ledger | None
    objective: float
    source: str


def run(cs: CandidateSet, snapshot: FederationSnapshot, model: lp.Model, best: Ledger,
        pen: FloatArray, budgets: dict[str, float], config: PlannerConfig,
        left_s: float, *, family_s: float | None = None) -> MipOutcome | None:
    """The whole MIP on small models, else a neighbourhood MIP; None when there is none.

    Both start from `best`, so they only return something cheaper or nothing. Columns the
    repair used outside the model are added first (else the start would not be feasible).
    The whole MIP gets what is left of time_limit_s (none left: it does not run); the
    neighbourhood always gets its own box, so on a loaded machine, where the relaxation
    alone may take the whole time_limit_s, the epoch still gets its repair. With `family_s`
    (a batch decomposed by pool family: the seconds left until planner.FAMILY_TIME_FRAC x
    time_limit_s after plan_epoch began) the neighbourhood is the GPU family (family) and
    its box at least that long.
    Deterministic (PlannerConfig.deterministic): both stop at mip_max_nodes instead, under
    the safety time limit only.
    """
    whole = model.cost.size <= config.mip_max_columns
    if whole and left_s <= 0.05:
        return None
    if uncovered(best, cs):
        cs = pricing.with_ledger_columns(cs, best)
        model = lp.build(cs, pen, budgets)
    # to_columns reads the ledger's placements, not its candidate set: the same start as from
    # the ledger replayed onto the grown candidates (~0.1 s CPU at 5000x500).
    start = rounding.to_columns(best, model)
    if whole:
        sub, box = model, left_s
    else:
        free_w = neighbourhood(model, start) if family_s is None else family(cs, model, start)
        if free_w.size == 0:
            return None
        sub = lp.fix_outside(model, start, free_w)
        box = config.neighbourhood_time_frac * config.time_limit_s
        if config.deterministic:
            box = config.safety_time_limit_s
        elif family_s is not None:
            box = max(box, family_s)
    mip = lp.solve_mip(sub, start, time_limit_s=box, mip_gap=config.mip_gap,
                       max_nodes=config.mip_max_nodes if config.deterministic else None,
                       substitute_fixed=not whole,
                       options=FAMILY_HIGHS_OPTIONS if family_s is not None else None)
    status = mip.status if whole and mip.status in ("time_limit", "work_limit") else "optimal"
    bound = mip.bound if whole else None
    start_obj = float(model.cost @ start)
    if mip.x is None or mip.objective is None or \
            mip.objective >= start_obj - 1e-9 * max(1.0, abs(start_obj)):
        # Nothing cheaper than the start it was warm-started from: loading the same
        # solution into a new ledger would only cost time (~0.03 s CPU at 1000x200).
        return MipOutcome(status, bound, None, math.inf, "")
    cand = Ledger(cs, snapshot)
    rounding.load_integer(cand, model, mip.x, floor=False)
    rounding.repair(cand, model, mip.x, pen)
    return MipOutcome(status, bound, cand, cand.objective(pen),
                       "mip" if whole else "neighbourhood-mip" if family_s is None
                       else "family-mip")


def uncovered(ledger: Ledger, cs: CandidateSet) -> bool:
    """Whether the ledger placed replicas on options outside the workloads' candidates."""
    return any(not set(xw) <= set(cand.tolist())
               for xw, cand in zip(ledger.x, cs.cand, strict=True) if xw)


def family(cs: CandidateSet, model: lp.Model, start: FloatArray) -> IntArray:
    """The GPU family: every workload that needs GPUs (feasible somewhere), and every
    workload with unplaced replicas.

    Why the whole family and not the unplaced and their neighbours: GPU jobs of different
    models meet in a cluster's vCPU quota and in the CPU and memory of GPU nodes, so freeing
    the unplaced ones alone, or each GPU model's jobs in turn, leaves most of the gain (at
    20000x2000 seed 1 from 906,743: per model, each solved, 894,857; the family at once
    883,116). The CPU work stays fixed: freeing the CPU workloads on GPU pools as well
    (~70,000 free columns) found nothing in 30 s.
    """
    gpu = (cs.demand[:, 2] > 0) & cs.feasible.any(axis=1)
    unplaced = start[model.u_start:model.n_start] > 0.5
    out: IntArray = np.flatnonzero(gpu | unplaced)
    return out


def neighbourhood(model: lp.Model, start: FloatArray) -> IntArray:
    """Workloads with unplaced replicas, and those placed on any of their candidate options."""
    unplaced = np.flatnonzero(start[model.u_start:model.n_start] > 0.5)
    opts = np.unique(model.x_o[np.isin(model.x_w, unplaced)])
    there = np.isin(model.x_o, opts) & (start[:model.n_x] > 0.5)
    out: IntArray = np.union1d(unplaced, model.x_w[there])
    return out
