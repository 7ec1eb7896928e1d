"""`policy leverage`: the measuring stick of whether the policy's actions change decisions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from broker.domain import PolicyAction
from broker.placement.policy import GLOBAL_ACTIONS, NODE_ACTIONS, ActorCritic
from broker.sim.explain import action_values, leverage
from broker.sim.randomize import random_draft
from broker.sim.scenario import Scenario
from providers.catalog import Catalog


def constant_model(**values: float) -> ActorCritic:
    """A policy whose mean action is the same in every state: the fixed weights, except the
    actions named in `values` (by ActionSpec name; per-cluster ones equal for every cluster)."""
    m = ActorCritic()
    with torch.no_grad():
        for head, specs in ((m.node_head, NODE_ACTIONS), (m.global_head, GLOBAL_ACTIONS)):
            last = head[-1]
            assert isinstance(last, nn.Linear)
            last.weight.zero_()
            last.bias.copy_(torch.tensor([
                a.raw_for(values[a.name]) if a.name in values
                else a.start_logit() for a in specs]))
    return m


@pytest.fixture(scope="module")
def small() -> tuple[Scenario, Catalog]:
    catalog = Catalog.load()
    return random_draft(catalog, 5, n_clusters=3, n_edge=0, horizon_s=1200.0,
                        n_events=25).to_scenario(catalog), catalog


def test_fixed_weights_change_nothing(small: tuple[Scenario, Catalog]) -> None:
    fixed = PolicyAction()
    out = leverage(constant_model(), *small, decision_interval_s=60.0)
    assert out["states"] > 5
    assert out["epochs"] >= out["states"]
    assert out["decisions_changed_frac"] == 0.0
    spread = out["action_spread"]
    assert isinstance(spread, dict)
    assert spread["headroom"] == [fixed.headroom, fixed.headroom]
    assert spread["prewarm_lead_s"] == [fixed.prewarm_lead_s, fixed.prewarm_lead_s]


def test_a_different_action_changes_decisions(small: tuple[Scenario, Catalog]) -> None:
    out = leverage(constant_model(headroom=0.61, prewarm_lead_s=880.0), *small,
                   decision_interval_s=60.0)
    frac = out["decisions_changed_frac"]
    assert isinstance(frac, float)
    assert frac > 0.2
    spread = out["action_spread"]
    assert isinstance(spread, dict)
    assert spread["headroom"] == [0.61, 0.61]


def test_the_spread_is_of_the_timers_the_planner_plans_with(
        small: tuple[Scenario, Catalog]) -> None:
    """An idle timer under DecisionConfig.policy_idle_min_s is reported as the planner
    bounds it (decisions.bounded_action), not as the network output it."""
    out = leverage(constant_model(idle_timeout_s=10.0), *small, decision_interval_s=60.0)
    spread = out["action_spread"]
    assert isinstance(spread, dict)
    timers = [v for k, v in spread.items() if "idle_timeout_s" in k]
    assert timers
    assert all(v == [120.0, 120.0] for v in timers)


def test_action_values_name_every_number() -> None:
    vals = action_values(PolicyAction(cluster_bias_usd_per_hour={"a": 0.1, "b": -0.2}))
    assert vals["cluster_bias_usd_per_hour"] == [0.1, -0.2]
    assert vals["headroom"] == [0.9]
    assert vals["prewarm_lead_s"] == [120.0]
    pooled = action_values(PolicyAction(pool_warm_nodes={"a": {"p": 1, "q": 2}, "b": {"r": 0}}))
    assert pooled["pool_warm_nodes"] == [1.0, 2.0, 0.0]
