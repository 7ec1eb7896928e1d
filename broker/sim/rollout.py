"""Episodes of the twin under the policy being trained: the reward, the lp baseline, and
one rollout as a picklable task (so `skyfed train --jobs N` runs an update's episodes in N
processes). The reward is train.py's docstring's; this module only computes it.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from broker.domain import PolicyAction
from broker.placement.policy import ActorCritic, GraphObs
from broker.sim.controller import observe_engine
from broker.sim.engine import Engine, SimConfig
from broker.sim.randomize import random_draft
from broker.sim.scenario import CatalogLike, Scenario, load_scenario
from broker.sim.tracedraft import trace_draft
from providers.catalog import Catalog

COST_SCALE = 10.0
SLO_SCALE = 600.0
XZONE_SCALE = 10.0
QUEUE_SCALE = 3600.0
GPU_SCALE = 600.0


@dataclass(frozen=True)
class RewardWeights:
    cost: float = 1.0
    slo: float = 1.0
    xzone: float = 0.2
    queue: float = 1.0
    gpu: float = 0.5

    @classmethod
    def parse(cls, text: str) -> RewardWeights:
        """`cost=1,slo=1,...` (any subset; the rest keep their defaults); ValueError names a
        bad entry."""
        known = cls.__dataclass_fields__
        values: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, eq, raw = part.partition("=")
            key = key.strip()
            if not eq or key not in known:
                raise ValueError(f"reward weight {part!r}: expected NAME=NUMBER with NAME one "
                                 f"of {', '.join(known)}")
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"reward weight {part!r}: {raw!r} is not a number") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"reward weight {part!r}: must be finite and >= 0")
            values[key] = value
        return cls(**values)


@dataclass
class Step:
    obs: GraphObs
    raw: np.ndarray
    log_prob: float
    value: float
    reward: float = 0.0


class Recorder:
    """Engine controller: samples actions and records (obs, action, reward) per decision."""

    def __init__(self, model: ActorCritic, weights: RewardWeights, gen: torch.Generator,
                 *, sample: bool = True,
                 baseline: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.model = model
        self.weights = weights
        self.gen = gen
        self.sample = sample
        self.baseline = baseline  # (times, totals T x 5) of fixed-weight lp, same scenario
        self.steps: list[Step] = []
        self._last: tuple[float, ...] | None = None
        self._last_t = 0.0
        self._started = False

    def _totals(self, engine: Engine) -> tuple[float, ...]:
        return totals(engine)

    def _base(self, t: float) -> np.ndarray:
        if self.baseline is None:
            return np.zeros(5)
        ts, tot = self.baseline
        return np.array([np.interp(t, ts, tot[:, k]) for k in range(tot.shape[1])])

    def _reward(self, engine: Engine) -> float:
        now = self._totals(engine)
        last = self._last or now
        d = [a - b for a, b in zip(now, last, strict=True)]
        self._last = now
        if self.baseline is not None:
            # What fixed-weight lp incurred over the same simulated interval is subtracted:
            # the scenario's own swings (a burst, an outage) cancel, the policy's effect stays.
            db = self._base(engine.now) - self._base(self._last_t)
            d = [a - float(b) for a, b in zip(d, db, strict=True)]
        self._last_t = engine.now
        w = self.weights
        return -(w.cost * d[0] / COST_SCALE + w.slo * d[1] / SLO_SCALE + w.xzone * d[2]
                 / XZONE_SCALE + w.queue * d[3] / QUEUE_SCALE + w.gpu * d[4] / GPU_SCALE)

    def act(self, engine: Engine, now_s: float) -> PolicyAction:
        if not self._started:
            self._started = True
            self._last = self._totals(engine)
        if self.steps:
            self.steps[-1].reward = self._reward(engine)
        obs = observe_engine(engine, self.model)
        s = self.model.act(obs, sample=self.sample, generator=self.gen)
        self.steps.append(Step(obs, s.raw, s.log_prob, s.value))
        return s.action

    def finish(self, engine: Engine) -> None:
        if self.steps:
            self.steps[-1].reward = self._reward(engine)


def totals(engine: Engine) -> tuple[float, ...]:
    """Cumulative cost, SLO-violating replica-s, cross-zone GB, queue replica-s, GPU start s."""
    m = engine.metrics
    return (m.cost_usd + m.egress_usd, m.slo_violation_s, m.xz_gb, m.queue_replica_s,
            sum(m.gpu_start_s))


class _TotalsTrace:
    """Controller for the baseline run: fixed action, totals recorded at every decision."""

    def __init__(self) -> None:
        self.t: list[float] = [0.0]
        self.rows: list[tuple[float, ...]] = [(0.0,) * 5]

    def act(self, engine: Engine, now_s: float) -> PolicyAction:
        self.t.append(now_s)
        self.rows.append(totals(engine))
        return engine.config.fixed_action


def baseline_totals(scn: Scenario, catalog: CatalogLike,
                    decision_interval_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-weight lp on `scn` (same seed, same decision cadence): cumulative totals over time.

    Why: episodes are random scenarios whose absolute cost differs by orders of magnitude, so
    an absolute reward is mostly scenario noise; the difference to lp over the same interval is
    the part the policy caused (a counterfactual baseline; Wu et al. 2018 on action-dependent
    baselines, here simply the fixed policy's own return). Doubles the simulation per episode.
    """
    trace = _TotalsTrace()
    eng = Engine(scn, catalog, SimConfig(policy="lp+rl", decision_interval_s=decision_interval_s),
                 controller=trace)
    eng.run()
    trace.t.append(eng.now)
    trace.rows.append(totals(eng))
    ts = np.array(trace.t, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    return ts[order], np.array(trace.rows, dtype=np.float64)[order]


@dataclass(frozen=True)
class Draw:
    """One episode's scenario: a random draft (seed and shape), a draft from the real
    traces (`trace`: tracedraft.trace_draft of `seed` and `horizon_s`) or `extra[index]`."""

    seed: int
    n_clusters: int
    n_edge: int
    horizon_s: float
    n_events: int
    extra: int = -1
    trace: bool = False
    kind: str | None = None  # a trace draft's kind (tracedraft.KINDS); None: drawn by seed


def draw(rng: random.Random, n_extra: int, extra_share: float = 0.25,
         trace_share: float = 0.0) -> Draw:
    """The next episode's scenario, drawn in the parent so parallel runs stay reproducible:
    one of the `n_extra` given scenarios with probability `extra_share`, else a draft from the
    real traces with probability `trace_share`, else a random one."""
    if n_extra and rng.random() < extra_share:
        return Draw(0, 0, 0, 0.0, 0, extra=rng.randrange(n_extra))
    if trace_share > 0 and rng.random() < trace_share:
        return Draw(rng.randrange(1 << 30), 0, 0,
                    horizon_s=float(rng.choice([3600, 5400, 7200, 10800])), n_events=0,
                    trace=True)
    return Draw(rng.randrange(1 << 30), n_clusters=rng.randint(4, 8), n_edge=rng.randint(0, 2),
                horizon_s=float(rng.choice([3600, 5400, 7200])),
                n_events=rng.randint(120, 300))


def draw_scenario(catalog: Catalog, rng: random.Random, extra: list[Scenario]) -> Scenario:
    return scenario_of(draw(rng, len(extra)), catalog, extra)


def scenario_of(d: Draw, catalog: Catalog, extra: list[Scenario],
                data: Path | None = None) -> Scenario:
    """The scenario `d` names (`data`: the shared/data folder, for trace draws)."""
    if d.extra >= 0:
        return extra[d.extra]
    if d.trace:
        if data is None:
            raise ValueError("a trace draw needs the data folder (TrainConfig.data)")
        return trace_draft(catalog, data, d.seed, horizon_s=d.horizon_s,
                           kind=d.kind).to_scenario(catalog)
    return random_draft(catalog, d.seed, n_clusters=d.n_clusters, n_edge=d.n_edge,
                        horizon_s=d.horizon_s, n_events=d.n_events).to_scenario(catalog)


def rollout(scn: Scenario, catalog: Catalog, recorder: Recorder,
            decision_interval_s: float) -> list[Step]:
    eng = Engine(scn, catalog, SimConfig(policy="lp+rl", decision_interval_s=decision_interval_s),
                 controller=recorder)
    eng.run()
    recorder.finish(eng)
    return recorder.steps


@dataclass(frozen=True)
class EpisodeTask:
    """Everything one episode needs, picklable for a rollout process."""

    state: dict[str, torch.Tensor]
    hidden: int
    rounds: int
    draw: Draw
    gen_seed: int
    weights: RewardWeights
    decision_interval_s: float
    relative_reward: bool
    scenarios: tuple[Path, ...]
    data: Path | None = None


@functools.lru_cache(maxsize=1)
def _catalog() -> Catalog:
    """The catalog, loaded once per rollout process."""
    return Catalog.load()


@functools.lru_cache(maxsize=4)
def _extra(paths: tuple[Path, ...]) -> tuple[Scenario, ...]:
    return tuple(load_scenario(p, _catalog()) for p in paths)


def run_episode(task: EpisodeTask) -> list[Step]:
    """One rollout with the task's weights (in a rollout process or inline)."""
    torch.set_num_threads(1)
    catalog, extra = _catalog(), list(_extra(task.scenarios))
    model = ActorCritic(hidden=task.hidden, rounds=task.rounds)
    model.load_state_dict(task.state)
    model.eval()
    scn = scenario_of(task.draw, catalog, extra, task.data)
    base = baseline_totals(scn, catalog, task.decision_interval_s) \
        if task.relative_reward else None
    rec = Recorder(model, task.weights, torch.Generator().manual_seed(task.gen_seed),
                   baseline=base)
    return rollout(scn, catalog, rec, task.decision_interval_s)
