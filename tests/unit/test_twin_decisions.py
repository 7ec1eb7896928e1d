"""The twin decides nothing itself (issue 10 item 2): it carries out the plan's scale-in,
prewarm, migration and retry decisions exactly, and without them it never scales in,
prewarms or moves anything on its own (before this change the engine's `_scale_in`,
`_prewarm` and `_due` decided those).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from typing import Any

from broker.domain import Assignment, FederationSnapshot, Placement, PolicyAction, PricingModel
from broker.placement.planner import (
    EpochPlan,
    Migration,
    PlannerConfig,
    PoolScaleIn,
    Prewarm,
)
from broker.sim import physics
from broker.sim.engine import Engine, PlannerFn, SimConfig, default_planner
from broker.sim.realize import TwinNoise
from tests.unit.test_twin_engine import doc, scenario
from tests.unit.test_twin_scenario import FakeCatalog

REAL = default_planner()


def _two_clusters() -> dict[str, Any]:
    d = doc(nodes=3, max_nodes=6, horizon_s=3000.0)
    c2 = copy.deepcopy(d["clusters"][0])
    c2["name"] = "c2"
    c2["pools"][0].update(nodes=1, max_nodes=2)
    d["clusters"].append(c2)
    return d


def _engine(d: dict[str, Any], trace: str, planner: PlannerFn) -> Engine:
    return Engine(scenario(d, trace), FakeCatalog(),
                  SimConfig(policy="lp", check_invariants=True, noise=TwinNoise.off()),
                  planner=planner)


def _only_placements(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                     policy: str) -> EpochPlan:
    return replace(REAL(snap, action, cfg, policy), scale_in=(), prewarm=(), migrations=(),
                   retries=())


def test_without_such_decisions_the_twin_never_scales_in_prewarms_or_moves() -> None:
    # A burst of jobs that end early: the real planner scales the idle nodes in; a planner
    # that returns only placements leaves every node there.
    trace = "".join(f"j{i},{i * 20},batch,1,4,4,0,300,,,0,,0\n" for i in range(6))
    d = doc(nodes=1, max_nodes=6, horizon_s=3600.0)
    real = _engine(d, trace, REAL)
    real.run()
    bare = _engine(d, trace, _only_placements)
    bare.run()
    grown = max(len(p.node_list) for c in bare.clusters.values() for p in c.pools)
    assert grown > 1
    assert [p.nodes for p in real.clusters["c1"].pools] == [0]  # the planner scaled in
    assert [p.nodes for p in bare.clusters["c1"].pools] == [grown]
    assert bare.metrics.prewarmed_nodes == 0
    assert bare.metrics.migrations == {}


def test_the_twin_carries_out_scale_in_prewarm_and_a_migration_exactly() -> None:
    calls: list[float] = []

    def planner(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                policy: str) -> EpochPlan:
        plan = _only_placements(snap, action, cfg, policy)
        calls.append(snap.now_s)
        if snap.now_s != 600.0:
            return plan
        [s] = [p for p in snap.running if p.workload_id == "s"]
        target = Placement("s", (Assignment("c2", "cpu4", PricingModel.ON_DEMAND, 1, 1.0),),
                           1.0)
        return replace(plan, scale_in=(PoolScaleIn("c1", "cpu4", ("c1/cpu4/2",)),),
                       prewarm=(Prewarm("c2", "cpu4", nodes=1, reason="forecast"),),
                       migrations=(Migration("s", s.assignments, target, "better"),))

    eng = _engine(_two_clusters(), "s,0,service,1,1,1,0,,,,0,,0\n", planner)
    eng.run()
    assert 600.0 in calls
    c1, c2 = eng.clusters["c1"].pools[0], eng.clusters["c2"].pools[0]
    assert c1.nodes == 2  # exactly the one named node went
    assert c2.nodes == 2  # one prewarmed node joined
    assert eng.metrics.prewarmed_nodes == 1
    assert eng.metrics.migrations == {"better": 1}
    ws = eng.workloads["s"]
    assert [(g.cluster, g.count, g.running) for g in ws.groups] == [("c2", 1, True)]
    assert c1.used_cpu == 0.0  # the source was drained once the target was ready
    assert ws.max_running == 2  # both ran for a while: never below its replicas


def test_a_retry_decision_is_what_holds_work_back() -> None:
    # A job that fits nowhere: the planner's Retry is stored on it, and the planner is asked
    # again only once it is due (backoff doubles: 30, 60, 120 s ... at epoch 30 s).
    seen: list[tuple[float, int]] = []

    def planner(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                policy: str) -> EpochPlan:
        plan = REAL(snap, action, cfg, policy)
        seen.extend((snap.now_s, w.attempts) for w in snap.pending if w.id == "big"
                    and any(r.workload_id == "big" for r in plan.retries))
        return plan

    eng = _engine(doc(horizon_s=600.0), "big,0,batch,1,64,4,0,300,,,0,,0\n", planner)
    eng.run()
    assert [a for _, a in seen] == list(range(len(seen)))
    times = [t for t, _ in seen]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[:3] == [30.0, 60.0, 120.0]


def test_with_a_batching_window_a_submission_wakes_the_loop_as_live() -> None:
    trace = "a,7,batch,1,1,1,0,60,,,0,,0\n"
    placed: dict[str, float] = {}
    for window in (None, 0.5):
        eng = Engine(scenario(doc(horizon_s=200.0), trace), FakeCatalog(),
                     SimConfig(policy="lp", noise=TwinNoise.off(), batch_window_s=window),
                     planner=REAL)
        eng.run()
        placed[str(window)] = eng.workloads["a"].started_s or -1.0
    # The grid (epoch 30 s) places it at 30 s; woken, at 7 + 0.5 s; then the pod starts.
    assert placed["None"] == 30.0 + physics.POD_START_S
    assert placed["0.5"] == 7.5 + physics.POD_START_S
