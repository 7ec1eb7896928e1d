"""A twin run changes the garbage collector's settings while it runs, and only then
(broker/heap.py): the caller's thresholds and frozen heap are as they were afterwards, also when
the run fails."""

from __future__ import annotations

import gc

import pytest

from broker.domain import FederationSnapshot, PolicyAction
from broker.heap import YOUNG_THRESHOLD
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.sim.engine import Engine, SimConfig
from broker.sim.realize import TwinNoise
from tests.unit.test_twin_engine import doc, scenario
from tests.unit.test_twin_scenario import FakeCatalog


def test_the_collector_is_quieter_during_a_run_and_restored_after() -> None:
    before = gc.get_threshold()
    gc.unfreeze()  # nothing frozen by the caller
    seen: list[tuple[tuple[int, ...], int]] = []

    def planner(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                policy: str) -> EpochPlan:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        return plan_epoch(snap, action, cfg, policy=policy)

    scn = scenario(doc(), "a,0,batch,1,2,1,0,600,,,0,,0\n")
    Engine(scn, FakeCatalog(), SimConfig(noise=TwinNoise.off()), planner=planner).run()
    assert seen
    assert all(t == (YOUNG_THRESHOLD, *before[1:]) for t, _ in seen)
    assert all(frozen > 0 for _, frozen in seen)  # the heap built before the run
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0

    def failing(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                policy: str) -> EpochPlan:
        raise RuntimeError("planner failed")

    with pytest.raises(RuntimeError, match="planner failed"):
        Engine(scn, FakeCatalog(), SimConfig(noise=TwinNoise.off()), planner=failing).run()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
