"""Train the actor-critic policy in the twin: PPO + GAE on randomized scenarios. CPU only.

Why randomized: the policy will be judged on federations, traces and fault schedules it never
saw, so every episode draws a fresh scenario from broker/sim/randomize.py (regions, GPU mixes,
faults, demand shapes); `--scenario` files may be mixed in, but no constant here is fitted to
the shipped scenarios.

Reward (per decision interval, negated weighted sum of normalised deltas, each minus what
fixed-weight lp incurred over the same simulated interval of the same scenario when
`relative_reward`, see `baseline_totals`):
    r = -( w_cost  * cost_usd / COST_SCALE
         + w_slo   * slo-violating replica-s / SLO_SCALE
         + w_xzone * cross-zone GB / XZONE_SCALE
         + w_queue * pending replica-s / QUEUE_SCALE
         + w_gpu   * GPU-job start seconds of jobs started / GPU_SCALE )
The weights are tuned by optuna's TPE sampler (`tune_trials`) against the operator's target
(config/scenarios/operator_target.toml): each trial trains briefly and is scored by how far
lp+rl misses the target on held-out random scenarios, relative to fixed-weight lp.

Determinism: everything is seeded from `seed` (scenario draws, torch init and sampling,
optuna); torch runs single-threaded. A time budget (`minutes`) decides how many episodes run,
so the checkpoint records `episodes`: `--episodes N --seed S` reproduces it bit for bit.
"""

from __future__ import annotations

import math
import random
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from broker.domain import PolicyAction
from broker.placement.policy import ActorCritic, GraphObs, gaussian_log_prob, to_action
from broker.sim.controller import observe_engine
from broker.sim.engine import Engine, SimConfig
from broker.sim.randomize import random_draft
from broker.sim.scenario import CatalogLike, Scenario, ScenarioError, load_scenario
from providers.catalog import Catalog

COST_SCALE = 10.0
SLO_SCALE = 600.0
XZONE_SCALE = 10.0
QUEUE_SCALE = 3600.0
GPU_SCALE = 600.0
GAMMA, LAMBDA, CLIP, PPO_EPOCHS, LR, ENTROPY = 0.99, 0.95, 0.2, 4, 3e-4, 0.01
DEFAULT_TARGET_PATH = Path("config/scenarios/operator_target.toml")
TARGET_KEYS = ("cost_vs_lp", "slo_violation_frac", "scale_out_response_s_p50",
               "gpu_job_start_s_p50", "cross_zone_traffic_frac")


@dataclass(frozen=True)
class RewardWeights:
    cost: float = 1.0
    slo: float = 1.0
    xzone: float = 0.2
    queue: float = 1.0
    gpu: float = 0.5


@dataclass(frozen=True)
class TrainConfig:
    minutes: float = 3.0
    seed: int = 0
    episodes: int | None = None  # exact episode count (deterministic); else time budget
    scenarios: tuple[Path, ...] = ()
    tune_trials: int = 0
    target: dict[str, float] = field(default_factory=dict)
    weights: RewardWeights = field(default_factory=RewardWeights)
    episodes_per_update: int = 2
    decision_interval_s: float = 300.0
    # Reward relative to fixed-weight lp on the same scenario (see `baseline_totals`); off:
    # measured no better in an 8-minute run (docs/twin.md).
    relative_reward: bool = False


def load_target(path: Path | None) -> dict[str, float]:
    """The operator's target (TOML `[target]` table); keys in TARGET_KEYS."""
    p = path or DEFAULT_TARGET_PATH
    if not p.exists():
        if path is not None:
            raise ScenarioError(f"operator target file not found: {p}")
        return {"cost_vs_lp": -0.05, "slo_violation_frac": 0.0}
    doc = tomllib.loads(p.read_text(encoding="utf-8"))
    table = doc.get("target", {})
    out: dict[str, float] = {}
    for k, v in table.items():
        if k not in TARGET_KEYS:
            raise ScenarioError(f"{p}: unknown key {k!r} in [target] (allowed: {TARGET_KEYS})")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ScenarioError(f"{p}: target.{k} must be a number")
        out[k] = float(v)
    return out


# ------------------------------------------------------------------ rollouts


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
        obs = observe_engine(engine)
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


def draw_scenario(catalog: Catalog, rng: random.Random, extra: list[Scenario]) -> Scenario:
    if extra and rng.random() < 0.25:
        return rng.choice(extra)
    return random_draft(catalog, rng.randrange(1 << 30), n_clusters=rng.randint(4, 8),
                        n_edge=rng.randint(0, 2), horizon_s=float(rng.choice([3600, 5400, 7200])),
                        n_events=rng.randint(120, 300)).to_scenario(catalog)


def rollout(scn: Scenario, catalog: Catalog, recorder: Recorder,
            decision_interval_s: float) -> list[Step]:
    eng = Engine(scn, catalog, SimConfig(policy="lp+rl", decision_interval_s=decision_interval_s),
                 controller=recorder)
    eng.run()
    recorder.finish(eng)
    return recorder.steps


# ------------------------------------------------------------------ PPO


def gae(steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns (the episode ends at the horizon)."""
    n = len(steps)
    adv = np.zeros(n, dtype=np.float32)
    last = 0.0
    for t in reversed(range(n)):
        next_v = steps[t + 1].value if t + 1 < n else 0.0
        delta = steps[t].reward + GAMMA * next_v - steps[t].value
        last = delta + GAMMA * LAMBDA * last
        adv[t] = last
    returns = adv + np.asarray([s.value for s in steps], dtype=np.float32)
    return adv, returns


def ppo_update(model: ActorCritic, opt: torch.optim.Optimizer,
               episodes: list[list[Step]]) -> float:
    """PPO-clip epochs over whole episodes (one graph per episode = one batched forward)."""
    prepared = []
    all_adv = []
    for steps in episodes:
        if not steps:
            continue
        adv, ret = gae(steps)
        prepared.append((steps, adv, ret))
        all_adv.append(adv)
    if not prepared:
        return 0.0
    flat = np.concatenate(all_adv)
    mu, sd = float(flat.mean()), float(flat.std() + 1e-8)
    total = 0.0
    for _ in range(PPO_EPOCHS):
        for steps, adv, ret in prepared:
            node_x = torch.as_tensor(np.stack([s.obs.node_x for s in steps]))
            edge_index = torch.as_tensor(steps[0].obs.edge_index)
            t = len(steps)
            edge_x = torch.as_tensor(steps[0].obs.edge_x)[None].expand(t, -1, -1)
            batch_x = torch.as_tensor(np.stack([s.obs.batch_x for s in steps]))
            mean, log_std, value = model.forward_tensors(node_x, edge_index, edge_x, batch_x)
            raw = torch.as_tensor(np.stack([s.raw for s in steps]))
            logp = gaussian_log_prob(raw, mean, log_std)
            old = torch.as_tensor([s.log_prob for s in steps])
            a = torch.as_tensor((adv - mu) / sd)
            ratio = (logp - old).exp()
            pg = -torch.min(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a).mean()
            v_loss = 0.5 * ((value - torch.as_tensor(ret)) ** 2).mean()
            entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum()
            loss = pg + v_loss - ENTROPY * entropy / mean.shape[1]
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            total += float(loss.detach())
    return total


@dataclass
class TrainOutcome:
    model: ActorCritic
    episodes: int
    steps: int
    mean_reward_first: float
    mean_reward_last: float
    seconds: float


def train_model(catalog: Catalog, cfg: TrainConfig, *, budget_s: float,
                progress: Callable[[float, str], None] | None = None) -> TrainOutcome:
    """One training run with fixed reward weights."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    extra = [load_scenario(p, catalog) for p in cfg.scenarios]
    model = ActorCritic()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    t0 = time.perf_counter()
    episodes = steps = 0
    buffer: list[list[Step]] = []
    rewards: list[float] = []
    while True:
        if cfg.episodes is not None:
            if episodes >= cfg.episodes:
                break
        elif time.perf_counter() - t0 >= budget_s:
            break
        scn = draw_scenario(catalog, rng, extra)
        base = baseline_totals(scn, catalog, cfg.decision_interval_s) \
            if cfg.relative_reward else None
        rec = Recorder(model, cfg.weights, gen, baseline=base)
        ep = rollout(scn, catalog, rec, cfg.decision_interval_s)
        episodes += 1
        steps += len(ep)
        if ep:
            rewards.append(sum(s.reward for s in ep) / len(ep))
            buffer.append(ep)
        if len(buffer) >= cfg.episodes_per_update:
            ppo_update(model, opt, buffer)
            buffer = []
        if progress is not None:
            done = (episodes / cfg.episodes if cfg.episodes
                    else (time.perf_counter() - t0) / max(budget_s, 1e-9))
            last = rewards[-1] if rewards else 0.0
            progress(min(1.0, done), f"episode {episodes} reward {last:.3f}")
    if buffer:
        ppo_update(model, opt, buffer)
    model.eval()
    k = max(1, len(rewards) // 4)
    return TrainOutcome(model, episodes, steps, float(np.mean(rewards[:k])) if rewards else 0.0,
                        float(np.mean(rewards[-k:])) if rewards else 0.0,
                        time.perf_counter() - t0)


# ------------------------------------------------------------------ tuning


def evaluate(model: ActorCritic, catalog: Catalog, seeds: list[int]) -> list[
        tuple[dict[str, object], dict[str, object]]]:
    """(lp, lp+rl) metrics on held-out random scenarios."""
    from broker.sim.runner import run_policy

    out = []
    for s in seeds:
        scn = random_draft(catalog, 10_000_000 + s, n_clusters=6, n_edge=1, horizon_s=5400.0,
                           n_events=200).to_scenario(catalog)
        lp = run_policy(scn, "lp", catalog).metrics
        rl = run_policy(scn, "lp+rl", catalog, model=model).metrics
        out.append((lp, rl))
    return out


def target_miss(pairs: list[tuple[dict[str, object], dict[str, object]]],
                target: dict[str, float]) -> float:
    """How far lp+rl misses the operator's target (0 = met everywhere); scale-free sums."""

    def num(v: object) -> float:
        return float(v) if isinstance(v, int | float) else 0.0

    miss = 0.0
    for lp, rl in pairs:
        for k, goal in target.items():
            if k == "cost_vs_lp":
                base = max(num(lp["cost_usd"]), 1e-9)
                got = num(rl["cost_usd"]) / base - 1.0
                miss += max(0.0, got - goal) * 10.0
            else:
                got = num(rl.get(k))
                miss += max(0.0, got - goal) / max(abs(goal), 0.01)
    return miss / max(1, len(pairs))


def tune_weights(catalog: Catalog, cfg: TrainConfig, budget_s: float) -> RewardWeights:
    """optuna TPE over the reward weights (log-uniform 0.05..5), scored by target_miss."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    per_trial = budget_s / max(1, cfg.tune_trials)

    def objective(trial: optuna.Trial) -> float:
        w = RewardWeights(**{k: trial.suggest_float(k, 0.05, 5.0, log=True)
                             for k in ("cost", "slo", "xzone", "queue", "gpu")})
        episodes = (max(2, cfg.episodes // (2 * max(1, cfg.tune_trials)))
                    if cfg.episodes is not None else None)
        out = train_model(catalog, replace(cfg, weights=w, episodes=episodes),
                          budget_s=per_trial * 0.7)
        return target_miss(evaluate(out.model, catalog, [cfg.seed, cfg.seed + 1]), cfg.target)

    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=cfg.seed))
    study.optimize(objective, n_trials=cfg.tune_trials)
    return RewardWeights(**study.best_params)


def train_policy(cfg: TrainConfig, out: Path) -> dict[str, object]:
    """`skyfed train`: optional weight tuning, then training; writes the checkpoint."""
    from rich.progress import Progress

    torch.set_num_threads(1)
    catalog = Catalog.load()
    budget = cfg.minutes * 60.0
    weights = cfg.weights
    if cfg.tune_trials > 0:
        weights = tune_weights(catalog, cfg, budget * 0.5)
        budget *= 0.5
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=1.0)

        def update(frac: float, msg: str) -> None:
            bar.update(task, completed=frac, description=f"training: {msg}")

        res = train_model(catalog, replace(cfg, weights=weights), budget_s=budget,
                          progress=update)
    meta: dict[str, object] = {
        "seed": cfg.seed, "episodes": res.episodes, "steps": res.steps,
        "weights": weights.__dict__, "algorithm": "PPO+GAE",
        "train_seconds": round(res.seconds, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    res.model.save(out, meta=meta)
    return {**meta, "checkpoint": str(out), "bytes": out.stat().st_size,
            "mean_step_reward_first_quarter": round(res.mean_reward_first, 4),
            "mean_step_reward_last_quarter": round(res.mean_reward_last, 4)}


__all__ = ["TrainConfig", "load_target", "to_action", "train_policy"]
