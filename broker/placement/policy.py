"""The RL policy: an actor-critic over the federation graph (torch). Pure: state -> action.

What it steers (DESIGN.md "The placement problem"): the LP keeps every hard constraint; the
policy only outputs a `PolicyAction` (ACTIONS: name, range, fixed-weights value):
- per cluster (one output per graph node, applied to each of its pools): the affinity bias
  (USD/h added to each replica's objective there), the scale-in idle timeout, the warm pool
  (empty nodes kept instead of scaled in), the spot bias (USD/h added to its spot
  options only, which steers the spot share), when to consolidate (the utilisation under
  which `lp`'s rule drains a node of restartable work) and how much to reserve (whole free
  nodes a multi-GPU pool keeps for whole-node jobs beyond the queued ones);
- global: the headroom (allocation ratio: share of pool capacity the LP may fill) and the
  prewarm lead time (how far ahead the forecast provisions nodes).

A neutral zone makes "do nothing" learnable: a raw output within NEUTRAL_LOGIT of the fixed
weights' logit is the fixed weights' value exactly (outside it the sigmoid resumes from that
value, so the map stays continuous and monotone). Why: with a plain sigmoid only one raw
point in R gives lp's value, so a trained mean never equals lp and every state pays whatever
small deviation the policy drifted to (the v2 checkpoint lost 2.7 % on edge-heavy this way,
mostly through a prewarm lead that left 120 s); with the zone, lp is a region the policy
starts in and stays in wherever deviating does not pay.
Each range is wide enough to change a decision (tests/unit/test_policy_actions.py builds a
state where each one does): a bias of 0.25 USD/h per replica outweighs the price gap between
two clouds' vCPUs (a few cents), headroom 0.5..1 decides whether a pool's last node is
filled or a new one is bought, idle timeout 0..30 min spans "at once" (Karpenter's
consolidateAfter 0 s) to three times Cluster Autoscaler's 10 min default.

Input (`GraphObs`, built from a FederationSnapshot by broker/placement/observe.py, the one
observation both the live broker and the twin use): one graph node per cluster/site with
NODE_FEATURES, directed edges to each node's nearest neighbours carrying EDGE_FEATURES, and
BATCH_FEATURES of the pending batch.

Network: a node MLP encoder, MP_ROUNDS rounds of mean-aggregated message passing written in
plain torch (message = MLP([h_src, e]), update h += MLP([h, mean msg])), mean-pooling into a
global vector joined with the batch features. Actor heads: per-node means (one per per-cluster
action) and global means, with one state-independent learned log-std per action (diagonal
Gaussian in an unsquashed space, squashed by a sigmoid into the action ranges; an integer
action takes the floor). Critic: MLP(global) -> V.

Algorithm: PPO with GAE (Schulman et al. 2017; 2016), not A2C. Why: every environment step
of the twin is a real LP solve, so samples are expensive; PPO's clipped surrogate reuses each
rollout for several epochs of minibatch updates without the policy collapsing, while A2C
uses each sample once. GAE(lambda) trades bias for variance on the long, noisy episodes.

Without a checkpoint, `FixedPolicy` returns the operator's fixed weights (what `lp` uses).
Checkpoints are small (a few hundred KB): `ActorCritic.save` / `ActorCritic.load`.

A checkpoint records the fixed weights it was trained against (`fixed_weights()`: each
action's default and the DecisionConfig timers, in its metadata under "fixed_weights").
Why: outputs are offsets from those values in logit space (the neutral zone is centred on
them), so when a default moves the same file steers somewhere else; the v2 checkpoint,
trained with a 600 s idle timer, lost to lp after lp's timer became 120 s.
`ActorCritic.fixed_weights_warnings()` names every value that differs from today's (or says
the checkpoint has no record); the shells print it (the live start-up banner, `skyfed
policy`, `bench twin`'s notes). This module only compares values.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from broker.domain import PolicyAction
from broker.placement.consolidate import CA_UTILIZATION_THRESHOLD
from broker.placement.decisions import DecisionConfig

NODE_FEATURES = (
    "free_cpu_frac", "free_gpu_frac", "price_usd_per_vcpu_hour", "spot_discount",
    "reclaim_rate_per_hour", "queue_frac", "recent_demand", "healthy", "is_edge",
    "booting_frac", "idle_node_frac", "spot_capacity_frac", "forecast_cpu_frac",
    "forecast_gpu_frac",
)
EDGE_FEATURES = ("rtt_100ms", "bandwidth_10gbps")
BATCH_FEATURES = (
    "pending_replicas_log", "pending_cpu_log", "pending_gpu_log", "latency_sensitive_frac",
    "train_frac", "time_of_day_sin", "time_of_day_cos", "forecast_cpu_log", "forecast_gpu_log",
    "forecast_window_log",
)
HIDDEN = 32
MP_ROUNDS = 2


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One output of the policy: a PolicyAction field, its range and the fixed weights' value.

    Every output is a Gaussian in an unsquashed space mapped by a sigmoid onto [low, high]
    (an integer output onto low..high, each integer an equal share of the sigmoid's range).
    `default` is the fixed weights' value (PolicyAction's default, what `lp` uses): the
    untrained policy's mean action, so training starts from lp (a residual policy). Raw
    values within NEUTRAL_LOGIT of `start_logit()` give `default` exactly (module docstring).
    """

    name: str
    per_cluster: bool
    low: float
    high: float
    default: float
    integer: bool = False

    def squash(self, raw: np.ndarray) -> np.ndarray:
        start = self.start_logit()
        off = np.asarray(raw, dtype=np.float64) - start
        inside = np.abs(off) <= NEUTRAL_LOGIT
        shifted = start + np.sign(off) * np.maximum(np.abs(off) - NEUTRAL_LOGIT, 0.0)
        sig = 1.0 / (1.0 + np.exp(-np.clip(shifted, -30.0, 30.0)))
        if self.integer:
            span = self.high - self.low + 1.0
            val = np.minimum(np.floor(self.low + span * sig), self.high)
        else:
            val = self.low + (self.high - self.low) * sig
        return np.asarray(np.where(inside, self.default, val))

    def start_logit(self) -> float:
        """The raw output whose value is `default` (the neutral zone's centre)."""
        return self._plain_logit(self.default)

    def raw_for(self, value: float) -> float:
        """A raw output that `squash` maps to `value` (inverse across the neutral zone)."""
        start = self.start_logit()
        if value == self.default:
            return start
        plain = self._plain_logit(value)
        return plain + math.copysign(NEUTRAL_LOGIT, plain - start)

    def _plain_logit(self, value: float) -> float:
        if self.integer:
            frac = (value - self.low + 0.5) / (self.high - self.low + 1.0)
        else:
            frac = (value - self.low) / (self.high - self.low)
        frac = min(max(frac, 1e-3), 1 - 1e-3)
        return math.log(frac / (1 - frac))


# Action ranges (docs/twin.md "The policy's actions" says why each is this wide).
BIAS_MAX_USD_PER_HOUR = 0.25
HEADROOM_MIN, HEADROOM_MAX = 0.5, 1.0
LEAD_MAX_S = 1800.0
IDLE_TIMEOUT_MAX_S = 1800.0
WARM_NODES_MAX = 3
SPOT_BIAS_MAX_USD_PER_HOUR = 0.1
CONSOLIDATE_BELOW_MAX = 0.9
RESERVE_NODES_MAX = 2
# Half-width of the neutral zone around each action's fixed-weights logit (module docstring):
# the initial exploration std is exp(-0.3) = 0.74, so about half of the sampled values of
# each action are lp's while training starts.
NEUTRAL_LOGIT = 0.5
_FIXED = PolicyAction()
ACTIONS = (
    ActionSpec("cluster_bias_usd_per_hour", True, -BIAS_MAX_USD_PER_HOUR,
               BIAS_MAX_USD_PER_HOUR, 0.0),
    # lp's own timer (decisions.py: the forecast policies' ski-rental break-even).
    ActionSpec("idle_timeout_s", True, 0.0, IDLE_TIMEOUT_MAX_S,
               DecisionConfig().forecast_idle_s),
    ActionSpec("warm_nodes", True, 0.0, float(WARM_NODES_MAX), 0.0, integer=True),
    ActionSpec("spot_bias_usd_per_hour", True, -SPOT_BIAS_MAX_USD_PER_HOUR,
               SPOT_BIAS_MAX_USD_PER_HOUR, 0.0),
    ActionSpec("consolidate_below", True, 0.0, CONSOLIDATE_BELOW_MAX,
               CA_UTILIZATION_THRESHOLD),
    ActionSpec("reserve_nodes", True, 0.0, float(RESERVE_NODES_MAX), 0.0, integer=True),
    ActionSpec("headroom", False, HEADROOM_MIN, HEADROOM_MAX, _FIXED.headroom),
    ActionSpec("prewarm_lead_s", False, 0.0, LEAD_MAX_S, _FIXED.prewarm_lead_s),
)
NODE_ACTIONS = tuple(a for a in ACTIONS if a.per_cluster)
GLOBAL_ACTIONS = tuple(a for a in ACTIONS if not a.per_cluster)
CHECKPOINT_VERSION = 3
# Format 2 (before consolidate_below and reserve_nodes) loads with those at the fixed weights.
_V2_NODE_ACTIONS = 4
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "policy_data" / "policy.pt"
FIXED_WEIGHTS_KEY = "fixed_weights"


def fixed_weights() -> dict[str, float]:
    """The fixed weights today's actions steer from (the checkpoint metadata's record).

    Each ActionSpec's default (the neutral zone's centre) by action name, the PolicyAction
    defaults the policy does not output (latency weight), and the DecisionConfig timers
    scale-in falls back to where no timer is set (`decision.<field>`).
    """
    cfg = DecisionConfig()
    out = {a.name: float(a.default) for a in ACTIONS}
    out["latency_weight_usd_per_ms"] = float(_FIXED.latency_weight_usd_per_ms)
    out["decision.scale_in_idle_s"] = float(cfg.scale_in_idle_s)
    out["decision.forecast_idle_s"] = float(cfg.forecast_idle_s)
    return out


def fixed_weights_warnings(meta: Mapping[str, object]) -> tuple[str, ...]:
    """What differs between the fixed weights a checkpoint recorded (`meta`) and today's.

    One line per differing value ("fixed weight idle_timeout_s: trained against 600.0, today
    120"), one for
    a value only one side has, or one line saying that the checkpoint has no record
    (checkpoints saved before the record existed). Empty: trained against today's."""
    rec = meta.get(FIXED_WEIGHTS_KEY)
    if not isinstance(rec, Mapping):
        return ("the checkpoint does not record the fixed weights it was trained against "
                "(saved before they were recorded): its actions are offsets from them and may "
                "steer elsewhere on today's planner; measure it against lp (docs/twin.md)",)
    now = fixed_weights()
    out = []
    for name in sorted(set(rec) | set(now)):
        old, new = rec.get(name), now.get(name)
        if old is None:
            out.append(f"fixed weight {name}: not recorded (new since it was trained), "
                       f"today {new:g}")
        elif new is None:
            out.append(f"fixed weight {name}: trained against {old}, no longer one")
        elif not isinstance(old, int | float) or not math.isclose(float(old), new,
                                                                    rel_tol=1e-9,
                                                                    abs_tol=1e-12):
            out.append(f"fixed weight {name}: trained against {old}, today {new:g}")
    return tuple(out)


@dataclass(frozen=True)
class GraphObs:
    names: tuple[str, ...]
    node_x: np.ndarray  # [N, len(NODE_FEATURES)] float32
    edge_index: np.ndarray  # [2, E] int64: src, dst
    edge_x: np.ndarray  # [E, len(EDGE_FEATURES)] float32
    batch_x: np.ndarray  # [len(BATCH_FEATURES)] float32


@dataclass(frozen=True)
class ActionSample:
    action: PolicyAction
    raw: np.ndarray  # unsquashed sample: [len(NODE_ACTIONS) * N + len(GLOBAL_ACTIONS)]
    log_prob: float
    value: float


def _mlp(i: int, o: int, hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, hidden), nn.Tanh(), nn.Linear(hidden, o))


class ActorCritic(nn.Module):
    """See the module docstring."""

    def __init__(self, hidden: int = HIDDEN, rounds: int = MP_ROUNDS) -> None:
        super().__init__()
        nf, ef, bf = len(NODE_FEATURES), len(EDGE_FEATURES), len(BATCH_FEATURES)
        self.encode = _mlp(nf, hidden)
        self.messages = nn.ModuleList(_mlp(hidden + ef, hidden) for _ in range(rounds))
        self.updates = nn.ModuleList(_mlp(2 * hidden, hidden) for _ in range(rounds))
        self.batch = _mlp(bf, hidden)
        self.node_head = _mlp(3 * hidden, len(NODE_ACTIONS))
        self.global_head = _mlp(2 * hidden, len(GLOBAL_ACTIONS))
        self.value_head = _mlp(2 * hidden, 1)
        # One learned log-std per action kind (per-cluster ones shared by the clusters).
        self.log_std = nn.Parameter(torch.full((len(ACTIONS),), -0.3))
        # The loaded checkpoint's metadata ({} for a fresh model): see fixed_weights_warnings.
        self.meta: dict[str, object] = {FIXED_WEIGHTS_KEY: fixed_weights()}
        self._start_at_fixed()

    def _start_at_fixed(self) -> None:
        """Initialise the heads so the untrained mean action is the operator's fixed weights.

        Why: the policy learns deviations from what `lp` already does (a residual policy), so
        an untrained or briefly trained checkpoint starts from lp's behaviour instead of from
        an arbitrary point of the action space.
        """
        with torch.no_grad():
            for head, specs in ((self.node_head, NODE_ACTIONS), (self.global_head,
                                                                 GLOBAL_ACTIONS)):
                last = head[-1]
                if isinstance(last, nn.Linear):
                    last.weight.mul_(0.1)
                    last.bias.copy_(torch.tensor([a.start_logit() for a in specs]))

    # -------------------------------------------------------------- forward
    def forward_tensors(self, node_x: torch.Tensor, edge_index: torch.Tensor,
                        edge_x: torch.Tensor, batch_x: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batched forward. node_x [B,N,F], edge_index [2,E], edge_x [B,E,EF], batch_x [B,BF].

        Returns (mean [B, K*N+G], log_std [K*N+G], value [B]) with K per-cluster and G global
        actions, per-cluster outputs head by head (`raw[k*N:(k+1)*N]` is NODE_ACTIONS[k]).
        Batched so SHAP can evaluate many perturbed states in one call.
        """
        h = self.encode(node_x)
        src, dst = edge_index[0], edge_index[1]
        n = node_x.shape[1]
        deg = torch.zeros(n).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1.0)
        for msg, upd in zip(self.messages, self.updates, strict=True):
            m = msg(torch.cat([h[:, src, :], edge_x], dim=-1))
            agg = torch.zeros_like(h).index_add_(1, dst, m) / deg[None, :, None]
            h = h + upd(torch.cat([h, agg], dim=-1))
        g = torch.cat([h.mean(dim=1), self.batch(batch_x)], dim=-1)  # [B, 2H]
        node_in = torch.cat([h, g[:, None, :].expand(-1, n, -1)], dim=-1)
        per_node = self.node_head(node_in).transpose(1, 2).reshape(node_x.shape[0], -1)
        glob = self.global_head(g)  # [B, G]
        mean = torch.cat([per_node, glob], dim=-1)
        k = len(NODE_ACTIONS)
        log_std = torch.cat([self.log_std[:k].repeat_interleave(n), self.log_std[k:]])
        return mean, log_std, self.value_head(g).squeeze(-1)

    def forward_obs(self, obs: GraphObs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        node_x, edge_index, edge_x, batch_x = obs_tensors(obs)
        mean, log_std, value = self.forward_tensors(node_x[None], edge_index, edge_x[None],
                                                    batch_x[None])
        return mean[0], log_std, value[0]

    def act(self, obs: GraphObs, *, sample: bool = False,
            generator: torch.Generator | None = None) -> ActionSample:
        """Deterministic (the mean) unless `sample`; `generator` makes sampling reproducible."""
        with torch.no_grad():
            mean, log_std, value = self.forward_obs(obs)
            std = log_std.exp()
            raw = mean + std * torch.randn(mean.shape, generator=generator) if sample else mean
            logp = gaussian_log_prob(raw, mean, log_std)
        return ActionSample(to_action(obs.names, raw.numpy()), raw.numpy().copy(),
                            float(logp), float(value))

    # -------------------------------------------------------------- checkpoints
    def save(self, path: str | Path, *, meta: dict[str, object] | None = None) -> None:
        """Write the checkpoint; its metadata always records today's `fixed_weights()`."""
        torch.save({"version": CHECKPOINT_VERSION, "state": self.state_dict(),
                    "hidden": self.encode[0].out_features, "rounds": len(self.messages),
                    "meta": {**(meta or {}), FIXED_WEIGHTS_KEY: fixed_weights()}}, Path(path))

    def fixed_weights_warnings(self) -> tuple[str, ...]:
        """Where the fixed weights this model was trained against differ from today's."""
        return fixed_weights_warnings(self.meta)

    @classmethod
    def load(cls, source: str | Path | bytes) -> ActorCritic:
        """Load a checkpoint from a path or bytes; raises ValueError on a foreign file."""
        buf: io.BytesIO | Path = io.BytesIO(source) if isinstance(source, bytes) else Path(source)
        blob = torch.load(buf, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("version") not in (2, CHECKPOINT_VERSION):
            raise ValueError(f"not a skyfed policy checkpoint (version 2 or "
                             f"{CHECKPOINT_VERSION})")
        model = cls(hidden=int(blob["hidden"]), rounds=int(blob["rounds"]))
        state = blob["state"]
        if blob["version"] == 2:
            state = _upgrade_v2(state, model.state_dict())
        model.load_state_dict(state)
        meta = blob.get("meta")
        model.meta = dict(meta) if isinstance(meta, dict) else {}
        model.eval()
        return model

    @classmethod
    def load_default(cls) -> ActorCritic | None:
        """The checkpoint shipped in broker/policy_data, or None (use FixedPolicy)."""
        if not DEFAULT_CHECKPOINT.exists():
            return None
        return cls.load(DEFAULT_CHECKPOINT)


def _upgrade_v2(old: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """A format-2 state dict in format 3's layout: the per-cluster actions added since
    (NODE_ACTIONS after the first four) keep the fresh model's start (the fixed weights),
    with zero weights, so they are exactly lp's in every state."""
    out = dict(old)
    k = _V2_NODE_ACTIONS
    w, b = fresh["node_head.2.weight"].clone(), fresh["node_head.2.bias"].clone()
    w[:k], b[:k] = old["node_head.2.weight"], old["node_head.2.bias"]
    w[k:] = 0.0
    out["node_head.2.weight"], out["node_head.2.bias"] = w, b
    std = fresh["log_std"].clone()
    std[:k], std[len(NODE_ACTIONS):] = old["log_std"][:k], old["log_std"][k:]
    out["log_std"] = std
    return out


def gaussian_log_prob(raw: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
                      ) -> torch.Tensor:
    var = (2 * log_std).exp()
    return (-((raw - mean) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def squash(n: int, raw: np.ndarray) -> np.ndarray:
    """Raw outputs [..., K*N+G] -> action units, same layout (see ActorCritic.forward_tensors)."""
    out = np.empty_like(raw, dtype=np.float64)
    for k, spec in enumerate(NODE_ACTIONS):
        out[..., k * n:(k + 1) * n] = spec.squash(raw[..., k * n:(k + 1) * n])
    base = len(NODE_ACTIONS) * n
    for j, spec in enumerate(GLOBAL_ACTIONS):
        out[..., base + j] = spec.squash(raw[..., base + j])
    return out


def to_action(names: Sequence[str], raw: np.ndarray,
              latency_weight_usd_per_ms: float = 0.001) -> PolicyAction:
    """Squash a raw sample [K*N+G] into a PolicyAction within the ActionSpec ranges."""
    n = len(names)
    vals = squash(n, np.asarray(raw, dtype=np.float64))
    fields: dict[str, object] = {}
    for k, spec in enumerate(NODE_ACTIONS):
        col = vals[k * n:(k + 1) * n]
        fields[spec.name] = {name: (int(v) if spec.integer else round(float(v), 5))
                             for name, v in zip(names, col, strict=True)}
    base = len(NODE_ACTIONS) * n
    for j, spec in enumerate(GLOBAL_ACTIONS):
        fields[spec.name] = round(float(vals[base + j]), 4)
    return PolicyAction(latency_weight_usd_per_ms=latency_weight_usd_per_ms,
                        **fields)  # type: ignore[arg-type]


def obs_tensors(obs: GraphObs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.as_tensor(obs.node_x, dtype=torch.float32),
            torch.as_tensor(obs.edge_index, dtype=torch.int64),
            torch.as_tensor(obs.edge_x, dtype=torch.float32),
            torch.as_tensor(obs.batch_x, dtype=torch.float32))


@dataclass(frozen=True)
class FixedPolicy:
    """The fallback without a checkpoint: the operator's fixed PolicyAction."""

    action: PolicyAction = field(default_factory=PolicyAction)

    def decide(self, obs: GraphObs) -> PolicyAction:
        return self.action


@dataclass(frozen=True)
class LearnedPolicy:
    model: ActorCritic

    def decide(self, obs: GraphObs) -> PolicyAction:
        return self.model.act(obs).action


def feature_names(obs: GraphObs) -> list[str]:
    """Names of the flattened features SHAP explains: `<cluster>.<feature>` then batch."""
    return [f"{n}.{f}" for n in obs.names for f in NODE_FEATURES] + [
        f"batch.{f}" for f in BATCH_FEATURES]


OUTPUT_PREFIX = {"cluster_bias_usd_per_hour": "bias"}


def output_names(obs: GraphObs) -> list[str]:
    """`bias[<cluster>]`, `<action>[<cluster>]` per per-cluster action, then global ones."""
    return [f"{OUTPUT_PREFIX.get(a.name, a.name)}[{n}]" for a in NODE_ACTIONS
            for n in obs.names] + [a.name for a in GLOBAL_ACTIONS]


def _squashed_fn(model: ActorCritic, obs: GraphObs) -> Callable[[np.ndarray], np.ndarray]:
    """f(X [rows, N*F+B]) -> policy outputs [rows, K*N+G] in action units (batched)."""
    n = len(obs.names)
    nf = len(NODE_FEATURES)
    edge_index = torch.as_tensor(obs.edge_index, dtype=torch.int64)
    edge_x = torch.as_tensor(obs.edge_x, dtype=torch.float32)

    def f(x: np.ndarray) -> np.ndarray:
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
        b = xt.shape[0]
        with torch.no_grad():
            mean, _, _ = model.forward_tensors(xt[:, : n * nf].reshape(b, n, nf), edge_index,
                                               edge_x[None].expand(b, -1, -1), xt[:, n * nf:])
        return squash(n, mean.numpy())

    return f


def _flat(o: GraphObs) -> np.ndarray:
    return np.concatenate([o.node_x.reshape(-1), o.batch_x]).astype(np.float32)


def permutation_shapley(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                        base: np.ndarray, *, permutations: int = 8,
                        seed: int = 0) -> np.ndarray:
    """Shapley values by antithetic permutation sampling (Strumbelj & Kononenko 2014).

    For each sampled feature order, features switch from `base` to `x` one at a time and each
    output's change is credited to the feature switched; reversed orders are paired to cut
    variance. Exact additivity holds per permutation: sum of values = f(x) - f(base).
    Returns [features, outputs]. All rows go through `f` in one batch.
    """
    m = x.shape[0]
    rng = np.random.default_rng(seed)
    orders = []
    for _ in range(max(1, permutations // 2)):
        p = rng.permutation(m)
        orders += [p, p[::-1]]
    rows = np.empty((len(orders) * (m + 1), m), dtype=np.float32)
    for k, order in enumerate(orders):
        cur = base.copy()
        rows[k * (m + 1)] = cur
        for j, feat in enumerate(order, start=1):
            cur[feat] = x[feat]
            rows[k * (m + 1) + j] = cur
    out = np.asarray(f(rows))
    phi = np.zeros((m, out.shape[1]))
    for k, order in enumerate(orders):
        block = out[k * (m + 1):(k + 1) * (m + 1)]
        phi[order] += np.diff(block, axis=0)
    return phi / len(orders)


def shap_values(model: ActorCritic, obs: GraphObs, background: Sequence[GraphObs],
                *, top: int = 5, backend: str = "permutation", permutations: int = 8,
                ) -> dict[str, list[tuple[str, float]]]:
    """SHAP values of each policy output (in action units) against the flattened features.

    Baseline: the mean of `background` states (which must share `obs`'s graph). Backends:
    "permutation" (default, `permutation_shapley`, torch only) and "shap" (the shap library's
    permutation explainer; needs the `explain` extra, and its first call JIT-compiles for
    ~25 s on a loaded 2-core machine). Returns, per output, its `top` features by |value|.
    """
    f = _squashed_fn(model, obs)
    base = np.stack([_flat(o) for o in background] or [_flat(obs)]).mean(axis=0)
    x = _flat(obs)
    if backend == "shap":
        import shap  # optional extra

        masker = shap.maskers.Independent(base[None])
        explainer = shap.explainers.Permutation(f, masker, seed=0)
        result = explainer(x[None], max_evals=2 * x.shape[0] + 1, silent=True)
        values = np.asarray(result.values)[0]
    elif backend == "permutation":
        values = permutation_shapley(f, x, base.astype(np.float32), permutations=permutations)
    else:
        raise ValueError(f"unknown SHAP backend {backend!r} (permutation | shap)")
    names = feature_names(obs)
    out: dict[str, list[tuple[str, float]]] = {}
    for j, oname in enumerate(output_names(obs)):
        order = np.argsort(-np.abs(values[:, j]))[:top]
        out[oname] = [(names[i], float(values[i, j])) for i in order]
    return out
