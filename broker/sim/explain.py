"""`skyfed policy rules` and `skyfed policy leverage`: what the policy does, and whether it matters.

`policy rules`: a shallow decision-tree surrogate of the policy, with its fidelity.

Why a surrogate: the GNN is not readable; a depth-3 tree fitted to its outputs over states the
policy actually visited is, and its held-out R^2 says how far the rules can be trusted (the
seed's section 2.3). One tree per action (policy.ACTIONS). Inputs per row: the cluster's own
node features plus the batch features (for a per-cluster action of that cluster), the pool's
own features, its cluster's and the batch features (for a per-pool action of that pool), or
the mean node features plus batch features (for headroom and prewarm lead). scikit-learn's
DecisionTreeRegressor is used for the printed rules (it comes with the `explain` extra's
shap); `xgboost_fidelity` reports a shallow XGBoost fit alongside.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from pathlib import Path

import numpy as np

from broker.domain import FederationSnapshot, PolicyAction
from broker.placement.decisions import bounded_action
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.policy import (
    ACTIONS,
    BATCH_FEATURES,
    NODE_FEATURES,
    POOL_FEATURES,
    ActorCritic,
    FixedPolicy,
    GraphObs,
    squash,
)
from broker.sim.controller import PolicyController
from broker.sim.engine import Engine, SimConfig
from broker.sim.randomize import random_draft
from broker.sim.scenario import CatalogLike, Scenario, load_scenario
from providers.catalog import Catalog


def visited_states(model: ActorCritic, catalog: Catalog, *, scenario: Path | None = None,
                   seeds: int = 4) -> list[GraphObs]:
    """States the policy visits when it drives the twin (decision every 60 s)."""
    scenarios = ([load_scenario(scenario, catalog)] if scenario else
                 [random_draft(catalog, 20_000_000 + i, n_clusters=6, n_edge=1,
                               horizon_s=5400.0, n_events=200).to_scenario(catalog)
                  for i in range(seeds)])
    out: list[GraphObs] = []
    for scn in scenarios:
        ctl = PolicyController(model)
        Engine(scn, catalog, SimConfig(policy="lp+rl", decision_interval_s=60.0),
               controller=ctl).run()
        out.extend(ctl.visited)
    return out


def _outputs(model: ActorCritic, obs: GraphObs) -> np.ndarray:
    """The mean action in action units, laid out as ActorCritic.forward_tensors' output."""
    mean = model.forward_obs(obs)[0].detach().numpy()
    return squash(obs.layout, mean)


def datasets(model: ActorCritic, states: list[GraphObs]
             ) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per output: inputs, targets and input names. A per-cluster action is fitted on that
    cluster's own node features plus the batch features; a per-pool one on the pool's
    features, its cluster's and the batch's; a global one on the mean node features plus the
    batch features."""
    node_names = [f"node.{f}" for f in NODE_FEATURES]
    pool_names = [f"pool.{f}" for f in POOL_FEATURES]
    mean_names = [f"mean.{f}" for f in NODE_FEATURES]
    batch_names = [f"batch.{f}" for f in BATCH_FEATURES]
    names = {"cluster": node_names + batch_names,
             "pool": pool_names + node_names + batch_names, "global": mean_names + batch_names}
    xs: dict[str, list[np.ndarray]] = {a.name: [] for a in ACTIONS}
    ys: dict[str, list[float]] = {a.name: [] for a in ACTIONS}
    for obs in states:
        out = _outputs(model, obs)
        glob_x = np.concatenate([obs.node_x.mean(axis=0), obs.batch_x])
        for spec in ACTIONS:
            col = out[obs.layout.block(spec)]
            if spec.scope == "cluster":
                rows = [np.concatenate([obs.node_x[i], obs.batch_x])
                        for i in range(len(obs.names))]
            elif spec.scope == "pool":
                rows = [np.concatenate([obs.pool_x[j], obs.node_x[obs.pool_cluster[j]],
                                        obs.batch_x]) for j in range(len(obs.pools))]
            else:
                rows = [glob_x]
            xs[spec.name] += rows
            ys[spec.name] += [float(v) for v in col]
    return {a.name: (np.asarray(xs[a.name]).reshape(len(ys[a.name]), len(names[a.scope])),
                     np.asarray(ys[a.name]), names[a.scope]) for a in ACTIONS}


def _split(x: np.ndarray, y: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    idx = list(range(len(y)))
    random.Random(seed).shuffle(idx)
    cut = max(1, int(0.75 * len(idx)))
    tr, te = idx[:cut], idx[cut:] or idx[:1]
    return x[tr], y[tr], x[te], y[te]


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss = float(((y - y.mean()) ** 2).sum())
    if ss <= 1e-12:
        return 1.0 if float(((y - pred) ** 2).sum()) <= 1e-12 else 0.0
    return 1.0 - float(((y - pred) ** 2).sum()) / ss


def surrogate_rules(model: ActorCritic, *, scenario: Path | None = None, depth: int = 3,
                    seed: int = 0, states: list[GraphObs] | None = None) -> dict[str, object]:
    """Fit the surrogates; returns {"states": n, "outputs": {name: {"r2", "rules", "leaves",
    ...}}}.

    `states` defaults to the states the policy visits in the twin (`visited_states`).
    """
    from sklearn.tree import DecisionTreeRegressor, export_text

    if states is None:
        states = visited_states(model, Catalog.load(), scenario=scenario)
    outputs: dict[str, dict[str, object]] = {}
    for name, (x, y, names) in datasets(model, states).items():
        if len(y) == 0:  # e.g. a per-pool action where no visited state has a scalable pool
            outputs[name] = {"r2": None, "xgboost_r2": None, "rules": "", "leaves": [],
                             "samples": 0}
            continue
        xtr, ytr, xte, yte = _split(x, y, seed)
        tree = DecisionTreeRegressor(max_depth=depth, random_state=seed).fit(xtr, ytr)
        leaf = tree.tree_.children_left == -1
        outputs[name] = {
            "r2": round(_r2(yte, tree.predict(xte)), 4),
            "xgboost_r2": xgboost_fidelity(xtr, ytr, xte, yte, depth, seed),
            "rules": export_text(tree, feature_names=names, decimals=3),
            # Each leaf's value (the action the rule gives), low to high: whether the rules'
            # leaves differ materially is read here.
            "leaves": sorted(round(float(v), 4) for v in tree.tree_.value[leaf].reshape(-1)),
            "samples": len(y),
        }
    return {"states": len(states), "outputs": outputs}


def xgboost_fidelity(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray,
                     depth: int, seed: int) -> float | None:
    """Held-out R^2 of a shallow gradient-boosted surrogate (None without xgboost)."""
    try:
        import xgboost
    except ImportError:
        return None
    reg = xgboost.XGBRegressor(n_estimators=50, max_depth=depth, learning_rate=0.3,
                               random_state=seed, n_jobs=1)
    reg.fit(xtr, ytr)
    return round(_r2(yte, np.asarray(reg.predict(xte))), 4)


# ------------------------------------------------------------------ leverage


def decisions_of(plan: EpochPlan) -> tuple[Hashable, ...]:
    """What an epoch decided, as a comparable value: placements (workload -> cluster, pool,
    pricing, replicas), what stayed unplaced, pool scale-ups, scale-ins, node prewarms and
    migrations (workload -> target). Prices, records and solve statistics are left out: a
    different number with the same decisions is the same decision."""
    return (
        tuple(sorted((p.workload_id, tuple(sorted(
            (a.cluster, a.pool, a.pricing.value, a.replicas) for a in p.assignments)))
            for p in plan.placements)),
        tuple(sorted(plan.unplaced)),
        tuple(sorted((s.cluster, s.pool, s.add_nodes) for s in plan.scale if s.add_nodes)),
        tuple(sorted((s.cluster, s.pool, tuple(sorted(s.nodes)), s.reason)
                     for s in plan.scale_in)),
        tuple(sorted((p.cluster, p.pool, p.nodes) for p in plan.prewarm if p.nodes > 0)),
        tuple(sorted((m.workload_id, m.reason, tuple(sorted(
            (a.cluster, a.pool, a.pricing.value, a.replicas) for a in m.target.assignments)))
            for m in plan.migrations)),
    )


def action_values(action: PolicyAction) -> dict[str, list[float]]:
    """Every number of a PolicyAction by field name (a per-cluster map gives all its values, a
    per-pool map all its pools' values)."""
    out: dict[str, list[float]] = {}
    for name in action.__dataclass_fields__:
        v = getattr(action, name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[name] = [float(v)]
        elif hasattr(v, "values"):
            out[name] = [float(y) for x in v.values()
                         for y in (x.values() if hasattr(x, "values") else (x,))]
    return out


class LeverageProbe:
    """The planner the engine calls during `leverage`: plans each snapshot twice, with the
    policy's action (the plan the twin carries out) and with the fixed weights (a
    counterfactual on the same snapshot), and counts the epochs whose decisions differ."""

    def __init__(self, fixed: PolicyAction) -> None:
        self.fixed = fixed
        self.epochs = 0
        self.changed = 0

    def __call__(self, snapshot: FederationSnapshot, action: PolicyAction,
                 config: PlannerConfig, policy: str) -> EpochPlan:
        plan = plan_epoch(snapshot, action, config, policy=policy)
        self.epochs += 1
        if action != self.fixed:
            base = plan_epoch(snapshot, self.fixed, config, policy=policy)
            self.changed += decisions_of(plan) != decisions_of(base)
        return plan


def leverage(model: ActorCritic, scenario: Scenario, catalog: CatalogLike | None, *,
             decision_interval_s: float = 300.0) -> dict[str, object]:
    """`skyfed policy leverage`: replay `scenario` under lp+rl with the model's mean action.

    Returns {"states": visited states, "action_spread": {field: [min, max]} over every
    visited state's action as plan_epoch plans with it (`decisions.bounded_action`: idle
    timers under the break-even raised to it), "decisions_changed_frac": epochs (planner
    calls) whose placement, scale, scale-in, prewarm or migration decisions differ from the
    fixed weights' plan of the same snapshot / epochs, "epochs": epochs}. The replay follows
    the policy's plans; the fixed plan is only compared. Decision cadence as `bench twin`
    runs lp+rl (SimConfig's).
    """
    ctl = PolicyController(model)
    fixed = FixedPolicy().action
    probe = LeverageProbe(fixed)
    cfg = SimConfig(policy="lp+rl", decision_interval_s=decision_interval_s,
                    fixed_action=fixed)
    Engine(scenario, catalog, cfg, planner=probe, controller=ctl).run()
    spread: dict[str, list[float]] = {}
    for obs in ctl.visited:
        applied = bounded_action(model.act(obs).action, cfg.planner.decisions)
        for name, vals in action_values(applied).items():
            if not vals:
                continue
            lo, hi = spread.get(name, [min(vals), max(vals)])
            spread[name] = [min(lo, *vals), max(hi, *vals)]
    return {"states": len(ctl.visited),
            "action_spread": {k: [round(lo, 4), round(hi, 4)] for k, (lo, hi) in spread.items()},
            "decisions_changed_frac": round(probe.changed / probe.epochs, 4) if probe.epochs
            else 0.0,
            "epochs": probe.epochs}
