"""The twin's per-epoch shortcuts give the very snapshots and decisions of the plain path.

`SimConfig.reuse_observations` (sim/snapshot.py) keeps each pool's observed nodes until the
pool changes, and the merge's pool until one of its inputs changes; off, every node is read
and every pool merged every epoch. Both runs of a shipped scenario's first
hours must see equal snapshots and make equal plans at every epoch, and end with equal
metrics; and the shortcut must actually have been taken (else the test proves nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from broker.domain import FederationSnapshot, PolicyAction
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.sim import snapshot as sim_snapshot
from broker.sim.engine import Engine, SimConfig
from broker.sim.scenario import Scenario, load_scenario
from providers.catalog import Catalog

SCENARIOS = Path(__file__).resolve().parents[2] / "config" / "scenarios"


def cut(name: str, hours: float) -> tuple[Scenario, Catalog]:
    """The first `hours` of a shipped scenario (also used by test_twin_determinism)."""
    catalog = Catalog.load()
    scn = load_scenario(SCENARIOS / name / "scenario.toml", catalog)
    end = hours * 3600.0
    return dataclasses.replace(scn, horizon_s=end, events=tuple(
        e for e in scn.events if e.submit_s < end)), catalog


def _record(scn: Scenario, catalog: Catalog, policy: str, *, reuse: bool
            ) -> tuple[list[tuple[FederationSnapshot, EpochPlan]], dict[str, object]]:
    seen: list[tuple[FederationSnapshot, EpochPlan]] = []

    def planner(snap: FederationSnapshot, action: PolicyAction, cfg: PlannerConfig,
                name: str) -> EpochPlan:
        plan = plan_epoch(snap, action, cfg, policy=name)
        # Wall-clock timings aside, the plan is its decisions.
        seen.append((snap, dataclasses.replace(plan, stats=dataclasses.replace(
            plan.stats, build_s=0.0, solve_s=0.0))))
        return plan

    # The twin's planner stops on counted work, not the clock (PlannerConfig.deterministic),
    # so both runs decide alike however loaded the machine is.
    eng = Engine(scn, catalog, SimConfig(policy=policy, check_invariants=True,
                                         reuse_observations=reuse), planner=planner)
    return seen, eng.run()


@pytest.mark.parametrize(("name", "hours", "policy"), [
    ("edge-heavy", 1.1, "lp"),  # a site fails at 1 h: evictions, migrations; prewarm
    ("retail-peak", 0.6, "karpenter"),  # consolidation drains, spot hazard, scale-in
])
def test_reused_observations_give_the_same_snapshots_and_plans(
        name: str, hours: float, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scn, catalog = cut(name, hours)
    reads = 0
    observe = sim_snapshot.observe

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return observe(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sim_snapshot, "observe", counting)
    plain, plain_metrics = _record(scn, catalog, policy, reuse=False)
    plain_reads, reads = reads, 0
    fast, fast_metrics = _record(scn, catalog, policy, reuse=True)
    assert len(fast) == len(plain) > 20
    for i, ((snap_a, plan_a), (snap_b, plan_b)) in enumerate(zip(plain, fast, strict=True)):
        assert snap_b.clusters == snap_a.clusters, f"epoch {i} at {snap_a.now_s} s"
        assert snap_b == snap_a, f"epoch {i} at {snap_a.now_s} s"
        assert plan_b == plan_a, f"epoch {i} at {snap_a.now_s} s"
    assert fast_metrics.pop("decision_ms_p99") is not None
    plain_metrics.pop("decision_ms_p99")
    assert fast_metrics == plain_metrics
    assert reads < plain_reads / 2  # most pools were not read again
    # ... nor merged again: an unchanged pool is last epoch's Pool (placement MergeMemo).
    assert _kept_pools(fast) > _pool_count(fast) / 4
    assert _kept_pools(plain) == 0


def _kept_pools(run: list[tuple[FederationSnapshot, EpochPlan]]) -> int:
    """Pools that are the very object they were in the epoch before."""
    return sum(a is b for (prev, _), (snap, _) in itertools.pairwise(run)
               for c_prev, c in zip(prev.clusters, snap.clusters, strict=True)
               for a, b in zip(c_prev.pools, c.pools, strict=True))


def _pool_count(run: list[tuple[FederationSnapshot, EpochPlan]]) -> int:
    return sum(len(c.pools) for snap, _ in run[1:] for c in snap.clusters)
