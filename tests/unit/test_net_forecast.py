"""The prewarm forecast nets out the capacity ended work gives back (decisions.py, "net forecast").

Before, the forecast extrapolated arrivals alone (each pool's demand EWMA): a pool whose
short jobs churn at a steady level forecast growth of rate x lead every epoch, so it ordered
nodes nobody needed and the look-ahead scale-in kept them. Now the rate is arrivals minus
releases (FederationSnapshot.freed): what workloads that ended (finished, failed,
cancelled) gave back, the same EWMA rule, kept by the twin as its jobs finish and read live
from the workloads that reached a final status (tests/integration/test_net_forecast_live.py).
Since 2026-12-07 the policy's observation forecasts the same net growth (observe.py), for
checkpoints trained on it; es3, trained on arrivals alone, is still observed so.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.domain import FederationSnapshot, NodeState, PolicyAction, Resources
from broker.placement import decisions
from broker.placement import observe as obs_mod
from broker.placement.action_space import FIXED_WEIGHTS_KEY
from broker.placement.decisions import DecisionConfig
from broker.placement.observed import freed_rates
from broker.placement.planner import PlannerConfig, plan_epoch
from broker.placement.policy import (
    BATCH_FEATURES,
    HIDDEN,
    MP_ROUNDS,
    NODE_FEATURES,
    POOL_FEATURES,
    ActorCritic,
)
from broker.sim import state as sim_state
from broker.sim.controller import observe_engine
from broker.sim.engine import Engine, SimConfig
from broker.sim.realize import TwinNoise
from broker.sim.scenario import PoolSpec
from tests.unit.placement_world import pool
from tests.unit.test_placement_decisions import NOW, _cluster, _idle, _snap
from tests.unit.test_twin_engine import doc, scenario
from tests.unit.test_twin_scenario import FakeCatalog

CFG = PlannerConfig(explain=False, time_limit_s=2.0)
LEAD = PolicyAction(prewarm_lead_s=120.0)
GROSS = replace(CFG, decisions=DecisionConfig(net_forecast=False))


def _churning(freed: float) -> FederationSnapshot:
    # 2 nodes of 8 vCPU, 14 vCPU used; 0.1 vCPU/s placed: in 120 s arrivals alone reach
    # 14 + 12 = 26 vCPU, an overflow of 1.25 nodes (one node ordered).
    p = pool("m5", price=0.4, nodes=2, max_nodes=40, used=Resources(14, 20))
    return replace(_snap((_cluster("a", p),)), demand={("a", "m5"): (0.1, 0.0)},
                   freed={("a", "m5"): (freed, 0.0)})


def test_a_pool_whose_ended_work_gives_back_what_arrives_is_not_prewarmed() -> None:
    steady = _churning(freed=0.1)  # as much ends as arrives: no growth
    assert plan_epoch(steady, LEAD, CFG).prewarm == ()
    [pw] = plan_epoch(steady, LEAD, GROSS).prewarm  # the rule before: arrivals alone
    assert (pw.pool, pw.nodes, pw.reason) == ("m5", 1, "forecast")
    # Net growth still buys nodes: 0.1 in, 0.02 out -> 14 + 9.6 - 16 = 7.6 vCPU, ~1 node.
    [pw] = plan_epoch(_churning(freed=0.02), LEAD, CFG).prewarm
    assert pw.nodes == 1
    # And the rate is the difference, component by component (negative when shrinking).
    assert decisions.forecast_rate(_churning(freed=0.3), DecisionConfig(), "a", "m5") == \
        pytest.approx((-0.2, 0.0))
    assert decisions.forecast_rate(_churning(freed=0.3), DecisionConfig(net_forecast=False),
                                   "a", "m5") == (0.1, 0.0)


def test_scale_in_keeps_only_the_nodes_the_net_forecast_needs() -> None:
    # test_placement_decisions' look-ahead case: 4 nodes, 2 idle past the timer, 12 vCPU
    # used, 0.1 vCPU/s placed. Arrivals alone keep one idle node (12 + 12 = 24 vCPU = 3
    # nodes); with as much ending as arriving the forecast is 12 vCPU and both go.
    states: tuple[NodeState, ...] = (
        _idle("n0", None, cpu_allocated=8.0), _idle("n1", None, cpu_allocated=4.0),
        _idle("n2", NOW - 900), _idle("n3", NOW - 800))
    p = replace(pool("m5", price=0.4, nodes=4, max_nodes=40, used=Resources(12, 16)),
                node_states=states)
    snap = _snap((_cluster("a", p),), demand={("a", "m5"): (0.1, 0.0)},
                 freed={("a", "m5"): (0.1, 0.0)})
    [si] = plan_epoch(snap, LEAD, GROSS).scale_in
    assert si.nodes == ("n2",)
    [si] = plan_epoch(snap, LEAD, CFG).scale_in
    assert si.nodes == ("n2", "n3")


def test_the_release_rate_is_the_demand_ewma_of_what_ended_and_skips_absurd_amounts() -> None:
    tau = 900.0
    ended = [(100.0, "a", "m5", 6.0, 0.0), (400.0, "a", "m5", 2.0, 0.0),
             (400.0, "b", "p4", 8.0, 1.0),
             (400.0, "a", "m5", math.nan, 0.0), (400.0, "a", "m5", -5.0, 0.0),
             (math.inf, "a", "m5", 1.0, 0.0), (400.0, "b", "p4", 1.0, math.inf)]
    got = freed_rates(ended, 1000.0, tau)
    assert got[("a", "m5")][0] == pytest.approx(
        6.0 / tau * math.exp(-900.0 / tau) + 2.0 / tau * math.exp(-600.0 / tau))
    assert got[("b", "p4")] == pytest.approx((8.0 / tau * math.exp(-600.0 / tau),
                                              1.0 / tau * math.exp(-600.0 / tau)))
    # The twin's incremental rule gives the same numbers.
    sp = sim_state.SimPool(spec=PoolSpec(name="m5", instance_type="m5.2xlarge",
                                         node=Resources(8, 32, 0), nodes=0, max_nodes=4,
                                         spot=False, price_usd_per_hour=0.4),
                           cluster="a", node_list=[])
    sp.add_freed(100.0, 6.0, 0.0, tau)
    sp.add_freed(400.0, 2.0, 0.0, tau)
    sp.decay_demand(1000.0, tau)
    assert sp.freed_cpu_per_s == pytest.approx(got[("a", "m5")][0], rel=1e-12)


def test_the_twin_counts_a_finished_job_into_its_pools_release_rate_not_a_scale_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2-replica job of 1 vCPU ends; a 3-replica service scales down to 1 (capacity given
    # back by a service that goes on: not an end, as live, where a scale-down is a spec
    # change). Only the job counts.
    calls: list[tuple[float, float, float]] = []
    add = sim_state.SimPool.add_freed

    def spy(self: sim_state.SimPool, now: float, cpu: float, gpu: float, tau: float) -> None:
        calls.append((now, cpu, gpu))
        add(self, now, cpu, gpu, tau)

    monkeypatch.setattr(sim_state.SimPool, "add_freed", spy)
    d: dict[str, Any] = doc(nodes=2, max_nodes=2, horizon_s=1500.0)
    scn = scenario(d, "s,0,service,3,1,1,0,,,,0,,0\n"
                      "a,0,batch,2,1,1,0,600,,,0,,0\n"
                      "s,1000,scale,1,1,1,0,,,,0,,0\n")
    eng = Engine(scn, FakeCatalog(), SimConfig(noise=TwinNoise.off()))
    eng.run()
    assert len(calls) == 1
    t_end, cpu, gpu = calls[0]
    assert (cpu, gpu) == (2.0, 0)
    assert 600.0 <= t_end < 1000.0
    assert eng.workloads["s"].desired == 1  # the scale-down happened
    key = next(iter(eng.pool_keys))
    tau = eng.config.demand_tau_s
    assert eng.snapshot().freed[key][0] == pytest.approx(
        2.0 / tau * math.exp(-(eng.now - t_end) / tau))


def test_the_policy_observes_the_forecast_the_planner_acts_on() -> None:
    # The observation's forecast features (observe.py) extrapolate the same net rate as the
    # prewarm rule: a churning pool forecasts no growth, net growth is demand - releases
    # over the window, and a shrinking pool counts 0 (growth only), never a negative share.
    window = 120.0
    node_fc = NODE_FEATURES.index("forecast_cpu_frac")
    pool_fc = POOL_FEATURES.index("forecast_frac")
    batch_fc = BATCH_FEATURES.index("forecast_cpu_log")
    recent = NODE_FEATURES.index("recent_demand")

    def features(freed: float, *, net: bool = True) -> tuple[float, float, float, float]:
        o = obs_mod.observe(_churning(freed), forecast_window_s=window, net_forecast=net)
        return (float(o.node_x[0, node_fc]), float(o.pool_x[0, pool_fc]),
                float(o.batch_x[batch_fc]), float(o.node_x[0, recent]))

    steady = features(0.1)
    assert steady[:3] == (0.0, 0.0, 0.0)
    grow = features(0.02)  # 0.08 vCPU/s x 120 s = 9.6 vCPU against 16 provisioned
    assert grow[0] == pytest.approx(9.6 / 16, rel=1e-6)
    assert grow[1] == pytest.approx(9.6 / 16, rel=1e-6)
    assert grow[2] == pytest.approx(math.log1p(9.6), rel=1e-6)
    assert features(0.3)[:3] == (0.0, 0.0, 0.0)  # shrinking: no growth, not negative
    # Arrivals alone (the features es3 was trained on): 12 vCPU over the window.
    gross = features(0.1, net=False)
    assert gross[0] == pytest.approx(12.0 / 16, rel=1e-6)
    assert gross[2] == pytest.approx(math.log1p(12.0), rel=1e-6)
    # What arrived recently is still observed as it was, whatever ended.
    assert steady[3] == grow[3] == gross[3] > 0.0


def test_each_checkpoint_is_observed_as_it_was_trained(tmp_path: Path) -> None:
    # A checkpoint saved before 2026-12-07 (es3) was trained when the forecast columns
    # carried arrivals alone, and its record has no `observation.net_forecast`: the shells
    # give it arrivals, so its decisions are what they were. A model recording today's fixed
    # weights (every model trained or saved since) gets net growth. The twin's controller
    # builds each one's observation so.
    fresh = ActorCritic(hidden=HIDDEN, rounds=MP_ROUNDS)
    assert fresh.net_forecast_observed
    fresh.save(tmp_path / "new.pt")
    assert ActorCritic.load(tmp_path / "new.pt").net_forecast_observed
    blob = torch.load(tmp_path / "new.pt", weights_only=True)
    del blob["meta"][FIXED_WEIGHTS_KEY]["observation.net_forecast"]  # as es3 recorded it
    torch.save(blob, tmp_path / "old.pt")
    old = ActorCritic.load(tmp_path / "old.pt")
    assert not old.net_forecast_observed
    d: dict[str, Any] = doc(nodes=2, max_nodes=4, horizon_s=1500.0)
    scn = scenario(d, "a,0,batch,2,1,1,0,600,,,0,,0\nb,0,batch,2,1,1,0,300,,,0,,0\n")
    eng = Engine(scn, FakeCatalog(), SimConfig(noise=TwinNoise.off()))
    eng.run()  # both jobs ran and ended: what arrived has all been given back
    key = next(iter(eng.pool_keys))
    snap = eng.snapshot()
    assert snap.demand[key][0] > 0.0
    assert snap.freed[key][0] > 0.0
    fc = POOL_FEATURES.index("forecast_frac")
    arrivals = float(observe_engine(eng, old).pool_x[0, fc])
    net = float(observe_engine(eng, fresh).pool_x[0, fc])
    assert arrivals > 0.0
    assert net == 0.0  # releases came after the arrivals: no growth to forecast
