"""Solver-agnostic back-end: the same matrix through PuLP (CBC, GLPK, HiGHS, Gurobi, CPLEX).

Slower to build than the numpy path (FACTS.md: ~2.5 s for 1000x200 through
PuLP vs ~0.03 s), so it is for debugging and for licensed solvers; with
`PlannerConfig.lp_path` it writes the model as an LP file. PuLP reports
"Optimal" after a time-limit stop, so the gap is always recomputed here from
an LP relaxation bound, never read from PuLP's status.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from broker.domain import FederationSnapshot
from broker.placement import lp, rounding
from broker.placement.candidates import CandidateSet, FloatArray
from broker.placement.ledger import Ledger

if TYPE_CHECKING:
    from broker.placement.planner import PlannerConfig, SolveStats

_SOLVERS = {
    "pulp-cbc": "PULP_CBC_CMD",
    "pulp-glpk": "GLPK_CMD",
    "pulp-highs": "HiGHS",
    "pulp-gurobi": "GUROBI",
    "pulp-cplex": "CPLEX_PY",
}


def _problem(model: lp.Model, *, relax: bool) -> tuple[Any, list[Any]]:
    import pulp

    prob = pulp.LpProblem("skyfed_placement", pulp.LpMinimize)
    cat = [("Continuous" if relax or not model.integer[j] else "Integer")
           for j in range(model.cost.size)]
    xs = [pulp.LpVariable(f"v{j}", lowBound=float(model.col_lo[j]),
                          upBound=None if not np.isfinite(model.col_hi[j])
                          else float(model.col_hi[j]), cat=cat[j])
          for j in range(model.cost.size)]
    prob += pulp.lpSum(float(c) * xs[j] for j, c in enumerate(model.cost) if c != 0.0)
    a = model.a.tocsr()
    for r in range(a.shape[0]):
        cols = a.indices[a.indptr[r]:a.indptr[r + 1]]
        vals = a.data[a.indptr[r]:a.indptr[r + 1]]
        expr = pulp.lpSum(float(v) * xs[int(c)] for c, v in zip(cols, vals, strict=True))
        lo, hi = float(model.row_lo[r]), float(model.row_hi[r])
        name = f"r{r}_{model.row_names[r][0]}"
        if lo == hi:
            prob += (expr == lo), name
        else:
            if np.isfinite(hi):
                prob += (expr <= hi), name + "_hi"
            if np.isfinite(lo):
                prob += (expr >= lo), name + "_lo"
    return prob, xs


def _solver(name: str, time_limit_s: float, mip_gap: float) -> Any:
    import pulp

    from broker.placement.planner import PlannerError

    if name not in _SOLVERS:
        raise PlannerError(f"unknown solver {name!r}; expected highs or one of "
                           f"{', '.join(sorted(_SOLVERS))}")
    available = pulp.listSolvers(onlyAvailable=True)
    if _SOLVERS[name] not in available:
        raise PlannerError(f"solver {name!r} ({_SOLVERS[name]}) is not available here; "
                           f"available: {', '.join(available)}")
    return pulp.getSolver(_SOLVERS[name], msg=False, timeLimit=time_limit_s, gapRel=mip_gap)


def solve(cs: CandidateSet, snapshot: FederationSnapshot, model: lp.Model, pen: FloatArray,
          config: PlannerConfig, build_s: float, incumbent: Ledger | None
          ) -> tuple[Ledger, SolveStats, lp.Relaxation | None, lp.Model]:
    """Solve `model` through PuLP; returns what planner._solve_lp returns."""
    from broker.placement.planner import SolveStats, polish, release

    t0 = time.perf_counter()
    solver = _solver(config.solver, config.time_limit_s, config.mip_gap)
    relax = lp.solve_relaxation(model, time_limit_s=config.lp_time_limit_s) \
        if model.cost.size else None
    prob, xs = _problem(model, relax=False)
    if config.lp_path:
        prob.writeLP(config.lp_path)
    prob.solve(solver)
    x = np.array([v.varValue if v.varValue is not None else 0.0 for v in xs],
                 dtype=np.float64)
    ledger = Ledger(cs, snapshot)
    rounding.load_integer(ledger, model, x, floor=False)
    rounding.repair(ledger, model, x, pen)
    best, source = ledger, "pulp"
    if incumbent is not None and incumbent.objective(pen) < best.objective(pen) - 1e-9:
        best, source = incumbent, "greedy"
    # The moves the HiGHS path runs after its rounding: PuLP's plan gets them too (the
    # merge moves fix a job the MIP split under its one-shared-copy pricing, docs/placement.md).
    source += polish(best, pen, config, model)
    source += "+released" * (release(best, pen, snapshot, config) > 0)
    obj = best.objective(pen)
    bound = relax.objective if relax is not None else obj
    gap = max(0.0, obj - bound) / max(abs(bound), 1e-9)
    status = "optimal" if gap <= config.mip_gap else "time_limit"
    stats = SolveStats(status=status, objective=obj, lp_bound=bound, gap=gap,
                       build_s=build_s, solve_s=time.perf_counter() - t0,
                       variables=int(model.cost.size), constraints=int(model.a.shape[0]),
                       source=source, mip_used=True)
    return best, stats, relax, model
