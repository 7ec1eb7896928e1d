"""Runs of one scenario over policies x seeds, in parallel processes where that pays.

Why processes: a run is CPU-bound Python plus HiGHS, and threads share one interpreter lock;
runs are independent, so N runs on P cores take about N / P of the time. Worker processes
start with `spawn` (not `fork`): the parent may already have torch and HiGHS loaded, whose
thread pools are not fork-safe. A worker pays ~2-4 s of imports once, so a single run stays
in-process. Results do not depend on the process layout: each run is fixed by its scenario,
policy and seed (only the wall-clock `decision_ms_p99` varies).

Progress: each run reports its simulated time through `progress(label, horizon_s)` callbacks
(runner.RichProgress); workers send `(run index, simulated s)` over a manager queue, at most
every 1 % of the horizon, and the parent forwards them.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queue_mod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from broker.sim.parallel import in_order, spawned
from broker.sim.runner import load_model, run_policy
from broker.sim.scenario import CatalogLike, Scenario

if TYPE_CHECKING:  # torch loads with a checkpoint (lp+rl) only
    from broker.placement.policy import ActorCritic

POLL_S = 0.2
PARALLEL_MIN_EVENTS = 2000  # below this a run is shorter than a worker's start-up


class ProgressSink(Protocol):
    def task(self, label: str, horizon_s: float) -> Callable[[float], None]: ...


@dataclass(frozen=True, slots=True)
class RunSpec:
    policy: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.policy} seed {self.seed}"


@dataclass
class SeedRun:
    """One finished run: picklable (no engine), so it can come back from a worker."""

    spec: RunSpec
    metrics: dict[str, object]
    series: list[dict[str, float]]
    notes: list[str] = field(default_factory=list)
    duration_prediction_mape: float | None = None


def plan_runs(policies: Sequence[str], first_seed: int, seeds: int) -> list[RunSpec]:
    """Every policy over seeds first_seed .. first_seed + seeds - 1 (policy-major order)."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    return [RunSpec(p, first_seed + i) for p in policies for i in range(seeds)]


def default_jobs(runs: int, events: int) -> int:
    """One process per core (this machine: 2), at most one per run, where it pays.

    A worker's start-up (imports of numpy, scipy, HiGHS, torch: several seconds) is more than
    a small scenario's run: measured 2026-11-30 on the shared 2-core machine, edge-heavy
    (462 events) x 4 policies x 3 seeds took 51 s in-process and 80 s in two workers. So
    scenarios under PARALLEL_MIN_EVENTS run in-process unless `--jobs` says otherwise.
    """
    if events < PARALLEL_MIN_EVENTS:
        return 1
    return max(1, min(os.cpu_count() or 1, runs))


def run_one(scenario: Scenario, spec: RunSpec, catalog: CatalogLike | None,
            model: ActorCritic | None,
            progress: Callable[[float], None] | None = None) -> SeedRun:
    if scenario.realization is not None:
        raise ValueError("run_one needs the scenario as written, not one seed's realization")
    seeded = dataclasses.replace(scenario, seed=spec.seed)
    result = run_policy(seeded, spec.policy, catalog, model=model, progress=progress)
    real = result.engine.scenario.realization if result.engine is not None else None
    return SeedRun(spec, result.metrics, result.series, result.notes,
                   real.duration_prediction_mape if real is not None else None)


def run_all(scenario: Scenario, specs: Sequence[RunSpec], catalog: CatalogLike | None, *,
            checkpoint: str | None = None, jobs: int = 1,
            progress: ProgressSink | None = None) -> list[SeedRun]:
    """Run every spec; results in the order of `specs`."""
    if jobs <= 1 or len(specs) <= 1:
        model = load_model(checkpoint) if any(s.policy == "lp+rl" for s in specs) else None
        out = []
        for spec in specs:
            cb = progress.task(f"{scenario.name} {spec.label}", scenario.horizon_s) \
                if progress is not None else None
            out.append(run_one(scenario, spec, catalog, model, cb))
        return out
    return _run_parallel(scenario, specs, checkpoint, jobs, progress)


def _run_parallel(scenario: Scenario, specs: Sequence[RunSpec], checkpoint: str | None,
                  jobs: int, progress: ProgressSink | None) -> list[SeedRun]:
    with multiprocessing.get_context("spawn").Manager() as manager, spawned(jobs) as pool:
        assert pool is not None
        q = manager.Queue() if progress is not None else None
        bars = [progress.task(f"{scenario.name} {s.label}", scenario.horizon_s)
                for s in specs] if progress is not None else []

        def finished(i: int, _run: SeedRun) -> None:
            if bars:
                bars[i](scenario.horizon_s)

        return in_order(pool, _work, [(scenario, spec, i, checkpoint, q)
                                      for i, spec in enumerate(specs)],
                        done=finished, poll_s=POLL_S, tick=lambda: _drain(q, bars))


def _drain(q: queue_mod.Queue[tuple[int, float]] | None,
           bars: list[Callable[[float], None]]) -> None:
    while q is not None:
        try:
            i, t = q.get_nowait()
        except queue_mod.Empty:
            return
        bars[i](t)


def _work(scenario: Scenario, spec: RunSpec, index: int, checkpoint: str | None,
          q: queue_mod.Queue[tuple[int, float]] | None) -> SeedRun:
    """One run in a worker process (module-level: `spawn` pickles it by name)."""
    from providers.catalog import Catalog

    model = load_model(checkpoint) if spec.policy == "lp+rl" else None
    step = scenario.horizon_s / 100.0
    last = [-step]

    def report(t: float) -> None:
        if q is not None and t - last[0] >= step:
            last[0] = t
            q.put((index, t))

    return run_one(scenario, spec, Catalog.load(), model, report if q is not None else None)
