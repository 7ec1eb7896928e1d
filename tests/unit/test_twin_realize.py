"""Seeded runs of a fixed trace: what varies with the seed, what never does, what policies see."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from broker.domain import FederationSnapshot, PolicyAction
from broker.placement.durations import PRIOR_MEDIAN_S, PRIOR_WEIGHT
from broker.placement.planner import EpochPlan, PlannerConfig
from broker.sim.engine import Engine, SimConfig, default_planner
from broker.sim.realize import STREAMS, TwinNoise, realize, stream
from broker.sim.scenario import Scenario
from tests.unit.test_twin_engine import doc, scenario
from tests.unit.test_twin_scenario import FakeCatalog


def mixed_trace(n: int = 60) -> str:
    rows = ["s1,0,service,2,1,1,0,,u,50,0,,0\n"]
    for i in range(n):
        rows.append(f"j{i},{i * 10},batch,1,1,1,0,{300 + i},,,0,,0\n")
        if i % 10 == 5:
            rows.append(f"s1,{i * 10},scale,{2 + i % 3},,,,,,,,,\n")
    return "".join(rows)


def fixed_part(scn: Scenario) -> list[tuple[object, ...]]:
    """Everything of an event that is the trace's, not the seed's."""
    return sorted((e.id, e.kind, e.tenant, e.replicas, e.cpu, e.memory_gib, e.gpu,
                   e.trace_duration_s if e.trace_duration_s is not None else e.duration_s)
                  for e in scn.events)


def with_seed(scn: Scenario, seed: int) -> Scenario:
    import dataclasses

    return dataclasses.replace(scn, seed=seed)


def test_seeds_vary_the_random_parts_and_keep_the_trace() -> None:
    scn = scenario(doc(nodes=1, max_nodes=4), mixed_trace())
    a, b = realize(with_seed(scn, 1)), realize(with_seed(scn, 2))
    assert fixed_part(a) == fixed_part(b) == fixed_part(scn)
    assert [e.submit_s for e in a.events] != [e.submit_s for e in b.events]
    dur_a = {e.id: e.duration_s for e in a.events if e.kind == "batch"}
    dur_b = {e.id: e.duration_s for e in b.events if e.kind == "batch"}
    assert dur_a != dur_b
    # Same seed, same run; the input scenario is not touched.
    assert realize(with_seed(scn, 1)).events == a.events
    assert scn.realization is None
    assert all(e.predicted_duration_s is None for e in scn.events)
    # Realizing twice does not jitter twice.
    assert realize(a) is a


def test_jitter_is_bounded_and_keeps_each_services_row_order() -> None:
    scn = scenario(doc(nodes=1, max_nodes=4), mixed_trace())
    for seed in range(5):
        r = realize(with_seed(scn, seed), TwinNoise(arrival_jitter_s=30.0, duration_sigma=0.0))
        times = [e.submit_s for e in r.events]
        assert times == sorted(times)
        for wid in {e.id for e in scn.events}:
            before = [e.submit_s for e in scn.events if e.id == wid]
            after = [e.submit_s for e in r.events if e.id == wid]
            assert all(0.0 <= b - a <= 30.0 + 1e-9 for a, b in zip(before, after, strict=True))
        svc = [(e.kind, e.replicas) for e in r.events if e.id == "s1"]
        assert svc == [(e.kind, e.replicas) for e in scn.events if e.id == "s1"]


def test_duration_noise_is_lognormal_with_mean_one() -> None:
    scn = scenario(doc(nodes=1, max_nodes=4), mixed_trace(400))
    r = realize(scn, TwinNoise(arrival_jitter_s=0.0, duration_sigma=0.1))
    factors = [e.duration_s / e.trace_duration_s for e in r.events
               if e.duration_s is not None and e.trace_duration_s]
    assert len(factors) == 400
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.02)
    assert statistics.pstdev(math.log(f) for f in factors) == pytest.approx(0.1, abs=0.02)


def test_noise_off_replays_the_trace_exactly() -> None:
    scn = scenario(doc(nodes=1, max_nodes=4), mixed_trace())
    r = realize(scn, TwinNoise.off())
    assert [(e.id, e.submit_s, e.duration_s) for e in r.events] == [
        (e.id, e.submit_s, e.duration_s) for e in scn.events]


def test_predictions_use_only_jobs_finished_before_the_submission() -> None:
    # a: 0..100 s; b is submitted at 50 s (a still running): prior; c at 200 s: knows a.
    trace = ("a,0,batch,1,1,1,0,100,,,0,,0\n"
             "b,50,batch,1,1,1,0,5000,,,0,,0\n"
             "c,200,batch,1,1,1,0,100,,,0,,0\n")
    r = realize(scenario(doc(), trace), TwinNoise.off())
    pred = {e.id: e.predicted_duration_s for e in r.events}
    prior = PRIOR_MEDIAN_S["cpu-1-4"]
    assert pred["a"] == pytest.approx(prior)
    assert pred["b"] == pytest.approx(prior)
    k = PRIOR_WEIGHT
    assert pred["c"] == pytest.approx(math.exp((k * math.log(prior) + math.log(100.0)) / (k + 1)))
    assert r.realization is not None
    expected = statistics.fmean(abs(pred[i] - d) / d for i, d in
                                (("a", 100.0), ("b", 5000.0), ("c", 100.0)))
    assert r.realization.duration_prediction_mape == pytest.approx(expected)
    assert r.realization.jobs == 3


def test_the_planner_sees_the_prediction_never_the_true_duration() -> None:
    seen: dict[str, float | None] = {}
    real = default_planner()

    def spy(snap: FederationSnapshot, action: PolicyAction, config: PlannerConfig,
            policy: str) -> EpochPlan:
        for w in snap.pending:
            seen[w.id] = w.spec.duration_s
        return real(snap, action, config, policy)

    trace = "a,0,batch,1,1,1,0,4321,,,0,,0\n"
    eng = Engine(scenario(doc(), trace), FakeCatalog(), SimConfig(), planner=spy)
    eng.run()
    ev = eng.scenario.events[0]
    assert ev.trace_duration_s == 4321.0
    assert seen["a"] == pytest.approx(PRIOR_MEDIAN_S["cpu-1-4"])
    assert seen["a"] != ev.duration_s


def test_streams_are_named_and_independent() -> None:
    draws = {name: stream(3, name).random() for name in STREAMS}
    assert len(set(draws.values())) == len(STREAMS)
    assert stream(3, STREAMS[0]).random() == draws[STREAMS[0]]
    assert stream(4, STREAMS[0]).random() != draws[STREAMS[0]]
    with pytest.raises(ValueError, match="unknown random stream"):
        stream(3, "weather")
    with pytest.raises(ValueError, match="duration_sigma"):
        TwinNoise(duration_sigma=math.nan)


def _faulty(horizon_s: float = 7200.0) -> Scenario:
    faults = [{"at_s": 1800.0, "target": "c1", "kind": "site_down", "duration_s": 300.0},
              {"at_s": 3600.0, "target": "c1", "kind": "price_change", "factor": 2.0,
               "duration_s": 600.0},
              {"at_s": 100.0, "target": "c1", "kind": "partition", "duration_s": 60.0},
              {"at_s": 9000.0, "target": "c1", "kind": "quota_cut", "quota_vcpu": 4.0}]
    return scenario(doc(nodes=1, max_nodes=4, horizon_s=horizon_s, faults=faults),
                    mixed_trace())


def test_fault_times_vary_with_the_seed_within_the_bound_and_keep_durations() -> None:
    # Issue 11 item 5: "the twin's random parts vary: spot hazard, fault timing, ...".
    scn = _faulty()
    runs = [realize(with_seed(scn, seed)).faults for seed in range(8)]
    assert len({tuple(f.at_s for f in r) for r in runs}) == 8  # every seed its own times
    for r in runs:
        for f, written in zip(r, scn.faults, strict=True):
            assert dataclasses.replace(f, at_s=written.at_s) == written  # only the time moves
            width = max(0.0, min(600.0, written.at_s, scn.horizon_s - written.at_s))
            assert abs(f.at_s - written.at_s) <= width + 1e-9
            assert f.at_s >= 0.0
        assert r[2].at_s != scn.faults[2].at_s
        assert abs(r[2].at_s - 100.0) <= 100.0  # narrowed near t=0: still in [0, horizon)
        assert r[3] == scn.faults[3]  # past the horizon: never fires, left as written
    # The written time is the mean: the draws are symmetric about it.
    shift = [realize(with_seed(scn, s)).faults[0].at_s - 1800.0 for s in range(400)]
    assert statistics.fmean(shift) == pytest.approx(0.0, abs=40.0)
    assert max(shift) > 500.0
    assert min(shift) < -500.0
    assert realize(with_seed(scn, 3)).faults == runs[3]  # same seed, same times


def test_fault_timing_draws_from_its_own_stream() -> None:
    # The other streams' draws do not move: arrivals and run times are the same with fault
    # jitter on or off, with or without faults in the file; and a fault's draw depends on
    # its place alone (dropping a later fault does not move an earlier one).
    scn = _faulty()
    on = realize(scn)
    off = realize(scn, TwinNoise(fault_jitter_s=0.0))
    bare = realize(dataclasses.replace(scn, faults=()))
    assert on.events == off.events == bare.events
    assert off.faults == scn.faults
    first_two = realize(dataclasses.replace(scn, faults=scn.faults[:2])).faults
    assert first_two == on.faults[:2]
    assert realize(scn, TwinNoise.off()).faults == scn.faults  # the trace exactly


def test_every_policy_of_a_seed_meets_the_same_fault_times() -> None:
    # Paired comparison: the site goes down at the same (jittered) second under every policy.
    scn = _faulty()
    written = scn.faults[0]
    seen = set()
    for policy in ("traditional", "karpenter", "greedy", "lp"):
        eng = Engine(scn, FakeCatalog(), SimConfig(policy=policy))
        eng.run()
        seen.add((eng.scenario.faults, eng.clusters["c1"].down_until))
    assert len(seen) == 1
    faults, down_until = seen.pop()
    assert down_until == pytest.approx(faults[0].at_s + written.duration_s)
    assert faults[0].at_s != written.at_s


def test_a_whatif_fault_keeps_the_time_asked_for() -> None:
    from broker.sim.whatif import with_whatif

    scn = with_whatif(_faulty(), "cluster=c1:down@2400+60")
    r = realize(scn)
    assert r.faults[-1].at_s == 2400.0
    assert r.faults[0].at_s != scn.faults[0].at_s  # the scripted ones still move
