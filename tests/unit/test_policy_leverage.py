"""`policy leverage`: the measuring stick of whether the policy's actions change decisions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from broker.domain import PolicyAction
from broker.placement.policy import HEADROOM_MAX, HEADROOM_MIN, LEAD_MAX_S, ActorCritic
from broker.sim.explain import action_values, leverage
from broker.sim.randomize import random_draft
from broker.sim.scenario import Scenario
from providers.catalog import Catalog


def constant_model(headroom: float, lead_s: float) -> ActorCritic:
    """A policy whose mean action is the same in every state: zero bias, this headroom/lead."""
    m = ActorCritic()
    frac = (headroom - HEADROOM_MIN) / (HEADROOM_MAX - HEADROOM_MIN)
    lead = lead_s / LEAD_MAX_S
    with torch.no_grad():
        for head in (m.bias_head, m.global_head):
            last = head[-1]
            assert isinstance(last, nn.Linear)
            last.weight.zero_()
            last.bias.zero_()
        glob = m.global_head[-1]
        assert isinstance(glob, nn.Linear)
        glob.bias.copy_(torch.tensor([math.log(frac / (1 - frac)), math.log(lead / (1 - lead))]))
    return m


@pytest.fixture(scope="module")
def small() -> tuple[Scenario, Catalog]:
    catalog = Catalog.load()
    return random_draft(catalog, 5, n_clusters=4, n_edge=0, horizon_s=1800.0,
                        n_events=40).to_scenario(catalog), catalog


def test_fixed_weights_change_nothing(small: tuple[Scenario, Catalog]) -> None:
    fixed = PolicyAction()
    out = leverage(constant_model(fixed.headroom, fixed.prewarm_lead_s), *small,
                   decision_interval_s=60.0)
    assert out["states"] > 5
    assert out["epochs"] >= out["states"]
    assert out["decisions_changed_frac"] == 0.0
    spread = out["action_spread"]
    assert isinstance(spread, dict)
    assert spread["headroom"] == [fixed.headroom, fixed.headroom]
    assert spread["prewarm_lead_s"] == [fixed.prewarm_lead_s, fixed.prewarm_lead_s]


def test_a_different_action_changes_decisions(small: tuple[Scenario, Catalog]) -> None:
    out = leverage(constant_model(0.61, 880.0), *small, decision_interval_s=60.0)
    frac = out["decisions_changed_frac"]
    assert isinstance(frac, float)
    assert frac > 0.2
    spread = out["action_spread"]
    assert isinstance(spread, dict)
    assert spread["headroom"] == [0.61, 0.61]


def test_action_values_name_every_number() -> None:
    vals = action_values(PolicyAction(cluster_bias_usd_per_hour={"a": 0.1, "b": -0.2}))
    assert vals["cluster_bias_usd_per_hour"] == [0.1, -0.2]
    assert vals["headroom"] == [0.9]
    assert vals["prewarm_lead_s"] == [120.0]
