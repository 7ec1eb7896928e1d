"""Evolution strategies for the policy: whole episodes, paired, scored against each other.

`skyfed train --algorithm es`. Why beside PPO: PPO's reward is per decision interval, the
policy run's increment minus fixed-weight lp's increment over the same simulated minutes
(rollout.Recorder). Once the two runs place differently their trajectories diverge (a node
bought ten minutes earlier, a job queued in one run and running in the other), so each
step's difference is mostly that divergence, not the action's effect; the last PPO retrain
(v5, docs/twin.md "The policy") saw its step reward fall while it trained. What an operator
judges is the episode: its cost and its service, against lp's on the same day. This
trainer optimises exactly that, with a policy search that needs no per-step credit:

- each iteration draws `pairs` scenarios as PPO's training does (rollout.draw: drafts from
  the real traces and synthetic ones, never a shipped scenario's window), and for each a
  Gaussian direction e; the policy with parameters theta + sigma e and theta - sigma e runs
  the whole scenario (mean actions, as `bench twin` runs it) with the same seed: common
  random numbers, so the scenario's own swings cancel in the pair (antithetic sampling);
- each run's episode score, relative to its pair's mean (`pair_scores`), in percent-like
  units weighted by the reward weights (the same `RewardWeights`, so --reward-weights and
  --tune-trials apply):

      s = -( w_cost  * 100 (cost - c) / c             c: the pair's mean cost
           + w_slo   * 100 (slo_violation_frac - mean)
           + w_xzone * 100 (cross_zone_traffic_frac - mean)
           + w_queue * 10 (queued_replica_h - mean) / (mean + 1)
           + w_gpu   * (gpu_job_start_s_p50 - mean) / 60 )

  so 1 point is 1 % of cost, 1 point of violating replica-time or of cross-zone bytes, 10 %
  more queueing, or a minute of GPU job start;
- the gradient estimate is sum_k d_k e_k / (K sigma) with d_k = (s+ - s-) / 2 divided by
  the iteration's standard deviation of d (clipped at 3), and Adam takes the step
  (Salimans et al. 2017, "Evolution strategies as a scalable alternative to reinforcement
  learning"; mirrored sampling and fitness shaping as there);
- every `eval_every` iterations the current parameters run the held-out drafts
  (`held_out`: one trace draft of each kind, services, edge, gpu and mixed, and two
  synthetic ones, seeds outside the training range; twice as many with `--es-held-out 2`)
  against fixed-weight lp; the parameters
  with the best held-out score are the result. That score is robust (`robust_score`): the
  drafts' mean score plus the worst one where it is negative, so a policy that gains 3
  points on services and loses 2 on GPU work ranks below one that gains 1 everywhere. The
  bar a checkpoint must pass (docs/twin.md "The policy") is "never worse than lp, better
  somewhere"; a mean alone picked parameters that lost on the GPU kind.

Which parameters: the last linear layer of each actor head (node, pool readout, global;
`ES_LAYERS`). The layers below keep their initial (seeded) weights or, with `start`, the
checkpoint's: a fixed set of features of the observation that the trained readout combines,
state by state. Few enough numbers (~360) for the estimate to move in a few hundred
episodes, each of which costs a real twin run. The untrained readout is lp exactly (the
neutral zone, action_space.py), so training starts from lp and leaves it only where the
episodes say it pays.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from broker.placement.policy import (
    ACTIONS,
    GLOBAL_ACTIONS,
    HIDDEN,
    MP_ROUNDS,
    NODE_ACTIONS,
    POOL_ACTIONS,
    ActorCritic,
)
from broker.sim.controller import PolicyController
from broker.sim.engine import Engine, SimConfig
from broker.sim.rollout import Draw, RewardWeights, _catalog, _extra, draw, scenario_of
from broker.sim.tracedraft import KINDS

ES_LAYERS = ("node_head.2.", "global_head.2.", "pool_head.2.")
METRICS = ("cost_usd", "slo_violation_frac", "cross_zone_traffic_frac", "queued_replica_h",
           "gpu_job_start_s_p50")
CLIP_D = 3.0


def es_keys(model: ActorCritic) -> list[str]:
    """The state-dict keys ES moves (the heads' last layers), in a fixed order."""
    return [k for k in model.state_dict() if k.startswith(ES_LAYERS)]


def free_mask(model: ActorCritic, keys: Sequence[str], frozen: Collection[str]) -> np.ndarray:
    """1.0 for each coordinate of the ES vector that may move, 0.0 for the rows of the heads'
    last layers that output an action in `frozen` (action names, `ACTIONS`): those keep
    their start, the neutral zone of a fresh model, so the action is the fixed weights' in
    every state (or, from `--start`, the checkpoint's). A pool-scope action is frozen in the
    node head (its per-cluster base) and the pool readout alike."""
    known = {a.name for a in ACTIONS}
    unknown = sorted(set(frozen) - known)
    if unknown:
        raise ValueError(f"es_freeze: unknown action(s) {unknown} (known: {sorted(known)})")
    rows = {"node_head.2.": NODE_ACTIONS, "global_head.2.": GLOBAL_ACTIONS,
            "pool_head.2.": POOL_ACTIONS}
    state = model.state_dict()
    parts = []
    for k in keys:
        names = next(acts for prefix, acts in rows.items() if k.startswith(prefix))
        ok = np.array([a.name not in frozen for a in names], dtype=np.float64)
        t = state[k]
        parts.append((np.repeat(ok[:, None], t.shape[1], axis=1) if t.ndim == 2 else ok).ravel())
    return np.concatenate(parts)


def get_vector(model: ActorCritic, keys: Sequence[str]) -> np.ndarray:
    state = model.state_dict()
    return np.concatenate([state[k].detach().numpy().ravel() for k in keys]).astype(np.float64)


def with_vector(state: dict[str, torch.Tensor], keys: Sequence[str], theta: np.ndarray
                ) -> dict[str, torch.Tensor]:
    """`state` with the ES keys replaced by the slices of `theta` (a new dict)."""
    out = dict(state)
    at = 0
    for k in keys:
        n = out[k].numel()
        out[k] = torch.as_tensor(theta[at:at + n], dtype=out[k].dtype).reshape(out[k].shape)
        at += n
    return out


def _num(m: dict[str, object], key: str) -> float:
    v = m.get(key)
    return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else 0.0


def pair_scores(runs: Sequence[dict[str, object]], w: RewardWeights) -> list[float]:
    """Each run's score relative to the mean of `runs` (module docstring's s)."""
    mean = {k: sum(_num(m, k) for m in runs) / len(runs) for k in METRICS}
    c = max(mean["cost_usd"], 1e-9)
    out = []
    for m in runs:
        d = {k: _num(m, k) - mean[k] for k in METRICS}
        out.append(-(w.cost * 100.0 * d["cost_usd"] / c
                     + w.slo * 100.0 * d["slo_violation_frac"]
                     + w.xzone * 100.0 * d["cross_zone_traffic_frac"]
                     + w.queue * 10.0 * d["queued_replica_h"] / (mean["queued_replica_h"] + 1.0)
                     + w.gpu * d["gpu_job_start_s_p50"] / 60.0))
    return out


def robust_score(scores: Sequence[float]) -> float:
    """The held-out drafts' mean score plus the worst score where it is negative (a loss
    against lp on any draft counts twice)."""
    if not scores:
        return 0.0
    return float(np.mean(scores)) + min(0.0, float(min(scores)))


@dataclass(frozen=True)
class PairTask:
    """One antithetic pair (or, with `eps` None, one held-out comparison with lp)."""

    state: dict[str, torch.Tensor]
    keys: tuple[str, ...]
    theta: np.ndarray
    eps: np.ndarray | None
    sigma: float
    draw: Draw
    decision_interval_s: float
    scenarios: tuple[Path, ...]
    data: Path | None


def _policy_run(task: PairTask, theta: np.ndarray) -> dict[str, object]:
    catalog = _catalog()
    scn = scenario_of(task.draw, catalog, list(_extra(task.scenarios)), task.data)
    model = ActorCritic(hidden=HIDDEN, rounds=MP_ROUNDS)
    model.load_state_dict(with_vector(task.state, task.keys, theta))
    model.eval()
    eng = Engine(scn, catalog, SimConfig(policy="lp+rl",
                                         decision_interval_s=task.decision_interval_s),
                 controller=PolicyController(model))
    return eng.run()


def run_pair(task: PairTask) -> tuple[dict[str, object], dict[str, object]]:
    """(theta + sigma eps, theta - sigma eps) metrics; without `eps`, (lp, theta) metrics."""
    torch.set_num_threads(1)
    if task.eps is None:
        catalog = _catalog()
        scn = scenario_of(task.draw, catalog, list(_extra(task.scenarios)), task.data)
        lp = Engine(scn, catalog, SimConfig(policy="lp")).run()
        return lp, _policy_run(task, task.theta)
    return (_policy_run(task, task.theta + task.sigma * task.eps),
            _policy_run(task, task.theta - task.sigma * task.eps))


HELD_OUT_MAX_PER_KIND = 2


def held_out(seed: int, data: Path | None, per_kind: int = 1) -> list[Draw]:
    """The held-out drafts the trainer picks its result on: `per_kind` of each trace kind
    (with `data`) and 2 x `per_kind` synthetic ones, seeds outside the training draws' range.
    `per_kind` 1 gives the six drafts every checkpoint before it was picked on; a larger
    value keeps those six first and adds new ones (each seed owns ten slots per range, so
    `per_kind` is at most HELD_OUT_MAX_PER_KIND)."""
    if not 1 <= per_kind <= HELD_OUT_MAX_PER_KIND:
        raise ValueError(f"es held-out drafts per kind: {per_kind} is not within "
                         f"1..{HELD_OUT_MAX_PER_KIND}")
    kinds = KINDS if data is not None else ()
    out = [Draw(50_000_000 + seed * 10 + r * len(kinds) + k, 0, 0, 7200.0, 0, trace=True,
                kind=kind)
           for r in range(per_kind) for k, kind in enumerate(kinds)]
    out += [Draw(60_000_000 + seed * 10 + k, 6, 1, 5400.0, 200) for k in range(2 * per_kind)]
    return out


@dataclass
class EsOutcome:
    state: dict[str, torch.Tensor]
    iterations: int
    episodes: int
    seconds: float
    history: list[dict[str, object]]
    best_held_out: float


class _Adam:
    def __init__(self, n: int, lr: float) -> None:
        self.lr, self.m, self.v, self.t = lr, np.zeros(n), np.zeros(n), 0

    def step(self, grad: np.ndarray) -> np.ndarray:
        """The ascent step for `grad` (Kingma & Ba 2015, default betas)."""
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        mh = self.m / (1 - 0.9 ** self.t)
        vh = self.v / (1 - 0.999 ** self.t)
        out: np.ndarray = self.lr * mh / (np.sqrt(vh) + 1e-8)
        return out


def train_es(model: ActorCritic, *, weights: RewardWeights, seed: int, budget_s: float,
             iterations: int | None, pairs: int, sigma: float, lr: float, eval_every: int,
             decision_interval_s: float, scenarios: tuple[Path, ...], data: Path | None,
             trace_share: float, extra_share: float,
             pool_map: Callable[[Callable[[PairTask], tuple[dict[str, object],
                                                           dict[str, object]]],
                                 list[PairTask]], list[tuple[dict[str, object],
                                                             dict[str, object]]]],
             progress: Callable[[float, str], None] | None = None,
             on_best: Callable[[dict[str, torch.Tensor], list[dict[str, object]]], None]
             | None = None, frozen: Collection[str] = (),
             held_out_per_kind: int = 1) -> EsOutcome:
    """ES on `model`'s heads (module docstring); `pool_map` runs the pairs (in processes).
    `on_best(state, history)` is called each time the held-out score improves, with the
    state dict of the new best parameters (`skyfed train` writes it to its --out file, so a
    run that is stopped keeps what it had found). `frozen`: actions ES leaves where they
    start (`free_mask`). `held_out_per_kind`: how many held-out drafts of each kind pick the
    result (`held_out`)."""
    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    keys = tuple(es_keys(model))
    base_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    theta = get_vector(model, keys)
    mask = free_mask(model, keys, frozen)
    adam = _Adam(theta.size, lr)
    share = trace_share if data is not None else 0.0
    checks = held_out(seed, data, held_out_per_kind)
    t0 = time.perf_counter()
    history: list[dict[str, object]] = []
    best_theta, best_score = theta.copy(), -math.inf
    episodes = it = 0

    def evaluate(th: np.ndarray) -> tuple[float, float, float, list[float]]:
        tasks = [PairTask(base_state, keys, th, None, sigma, d, decision_interval_s,
                          scenarios, data) for d in checks]
        res = pool_map(run_pair, tasks)
        scores, costs, slos = [], [], []
        for lp, rl in res:
            s = pair_scores([lp, rl], weights)
            scores.append(s[1] - s[0])
            costs.append(100.0 * (_num(rl, "cost_usd") / max(_num(lp, "cost_usd"), 1e-9) - 1))
            slos.append(_num(rl, "slo_violation_frac") - _num(lp, "slo_violation_frac"))
        return (robust_score(scores), float(np.mean(costs)), float(np.mean(slos)),
                [round(c, 3) for c in costs])

    def check(th: np.ndarray) -> None:
        """Run the held-out drafts at `th`; keep it if it is the best so far."""
        nonlocal best_score, best_theta, episodes
        score, dcost, dslo, each = evaluate(th)
        episodes += 2 * len(checks)
        history.append({"iteration": it, "held_out_score": round(score, 3),
                        "held_out_cost_vs_lp_pct": round(dcost, 3),
                        "held_out_cost_vs_lp_pct_each": each,
                        "held_out_slo_vs_lp": round(dslo, 5)})
        if score > best_score:
            best_score, best_theta = score, th.copy()
            if on_best is not None:
                on_best(with_vector(base_state, keys, best_theta), list(history))

    while True:
        if iterations is not None and it >= iterations:
            break
        if iterations is None and time.perf_counter() - t0 >= budget_s:
            break
        if it % eval_every == 0:
            check(theta)
        # Drawn whole, then masked: the free coordinates get the same noise whatever is frozen.
        eps = noise.standard_normal((pairs, theta.size)) * mask
        tasks = [PairTask(base_state, keys, theta, eps[k], sigma,
                          draw(rng, len(scenarios), extra_share, share), decision_interval_s,
                          scenarios, data) for k in range(pairs)]
        res = pool_map(run_pair, tasks)
        episodes += 2 * pairs
        d = np.array([(s[0] - s[1]) / 2.0 for s in (pair_scores(list(r), weights)
                                                     for r in res)])
        sd = float(d.std())
        if sd > 1e-12:
            d = np.clip(d / sd, -CLIP_D, CLIP_D)
            theta = theta + adam.step(d @ eps / (pairs * sigma))
        it += 1
        if progress is not None:
            done = it / iterations if iterations else \
                (time.perf_counter() - t0) / max(budget_s, 1e-9)
            progress(min(1.0, done), f"iteration {it} held-out {best_score:.2f}")
    check(theta)
    return EsOutcome(with_vector(base_state, keys, best_theta), it, episodes,
                     time.perf_counter() - t0, history, best_score)
