"""The RL policy: an actor-critic over the federation graph (torch). Pure: state -> action.

What it steers (DESIGN.md "The placement problem"): the LP keeps every hard constraint; the
policy only outputs a `PolicyAction`:
- per-cluster affinity bias (USD/h added to each replica's objective in that cluster),
- the headroom ratio (share of pool capacity the LP may fill; the rest absorbs bursts),
- the prewarm lead time (how far ahead the forecast provisions nodes).

Input (`GraphObs`, built from a FederationSnapshot by broker/placement/observe.py, the one
observation both the live broker and the twin use): one graph node per cluster/site with
NODE_FEATURES, directed edges to each node's nearest neighbours carrying EDGE_FEATURES, and
BATCH_FEATURES of the pending batch.

Network: a node MLP encoder, MP_ROUNDS rounds of mean-aggregated message passing written in
plain torch (message = MLP([h_src, e]), update h += MLP([h, mean msg])), mean-pooling into a
global vector joined with the batch features. Actor heads: a per-node bias mean and two global
means (headroom, lead), all with state-independent learned log-std (diagonal Gaussian in an
unsquashed space, squashed by tanh/sigmoid into the action ranges). Critic: MLP(global) -> V.

Algorithm: PPO with GAE (Schulman et al. 2017; 2016), not A2C. Why: every environment step
of the twin is a real LP solve, so samples are expensive; PPO's clipped surrogate reuses each
rollout for several epochs of minibatch updates without the policy collapsing, while A2C
uses each sample once. GAE(lambda) trades bias for variance on the long, noisy episodes.

Without a checkpoint, `FixedPolicy` returns the operator's fixed weights (what `lp` uses).
Checkpoints are small (a few hundred KB): `ActorCritic.save` / `ActorCritic.load`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from broker.domain import PolicyAction

NODE_FEATURES = (
    "free_cpu_frac", "free_gpu_frac", "price_usd_per_vcpu_hour", "spot_discount",
    "reclaim_rate_per_hour", "queue_frac", "recent_demand", "healthy", "is_edge",
    "booting_frac",
)
EDGE_FEATURES = ("rtt_100ms", "bandwidth_10gbps")
BATCH_FEATURES = (
    "pending_replicas_log", "pending_cpu_log", "pending_gpu_log", "latency_sensitive_frac",
    "train_frac", "time_of_day_sin", "time_of_day_cos",
)
HIDDEN = 32
MP_ROUNDS = 2
# Action ranges (the squash maps the Gaussian sample into these).
BIAS_MAX_USD_PER_HOUR = 0.25
HEADROOM_MIN, HEADROOM_MAX = 0.6, 1.0
LEAD_MAX_S = 900.0
CHECKPOINT_VERSION = 1
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "policy_data" / "policy.pt"


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
    raw: np.ndarray  # unsquashed sample: [N + 2]
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
        self.bias_head = _mlp(3 * hidden, 1)
        self.global_head = _mlp(2 * hidden, 2)
        self.value_head = _mlp(2 * hidden, 1)
        self.log_std = nn.Parameter(torch.full((3,), -0.7))  # bias, headroom, lead
        self._start_at(PolicyAction())

    def _start_at(self, action: PolicyAction) -> None:
        """Initialise the heads so the untrained mean action is the operator's fixed weights.

        Why: the policy learns deviations from what `lp` already does (a residual policy), so
        an untrained or briefly trained checkpoint starts from lp's behaviour instead of from
        an arbitrary point of the action space.
        """
        with torch.no_grad():
            for head in (self.bias_head, self.global_head):
                last = head[-1]
                if isinstance(last, nn.Linear):
                    last.weight.mul_(0.1)
                    last.bias.zero_()
            glob = self.global_head[-1]
            if isinstance(glob, nn.Linear):
                frac = (min(max(action.headroom, HEADROOM_MIN + 1e-3), HEADROOM_MAX - 1e-3)
                        - HEADROOM_MIN) / (HEADROOM_MAX - HEADROOM_MIN)
                lead = min(max(action.prewarm_lead_s / LEAD_MAX_S, 1e-3), 1 - 1e-3)
                glob.bias.copy_(torch.tensor([math.log(frac / (1 - frac)),
                                              math.log(lead / (1 - lead))]))

    # -------------------------------------------------------------- forward
    def forward_tensors(self, node_x: torch.Tensor, edge_index: torch.Tensor,
                        edge_x: torch.Tensor, batch_x: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batched forward. node_x [B,N,F], edge_index [2,E], edge_x [B,E,EF], batch_x [B,BF].

        Returns (mean [B, N+2], log_std [N+2], value [B]). Batched so SHAP can evaluate many
        perturbed states in one call.
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
        bias = self.bias_head(node_in).squeeze(-1)  # [B, N]
        glob = self.global_head(g)  # [B, 2]
        mean = torch.cat([bias, glob], dim=-1)
        log_std = torch.cat([self.log_std[0].expand(n), self.log_std[1:]])
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
        torch.save({"version": CHECKPOINT_VERSION, "state": self.state_dict(),
                    "hidden": self.encode[0].out_features, "rounds": len(self.messages),
                    "meta": meta or {}}, Path(path))

    @classmethod
    def load(cls, source: str | Path | bytes) -> ActorCritic:
        """Load a checkpoint from a path or bytes; raises ValueError on a foreign file."""
        buf: io.BytesIO | Path = io.BytesIO(source) if isinstance(source, bytes) else Path(source)
        blob = torch.load(buf, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"not a skyfed policy checkpoint (version {CHECKPOINT_VERSION})")
        model = cls(hidden=int(blob["hidden"]), rounds=int(blob["rounds"]))
        model.load_state_dict(blob["state"])
        model.eval()
        return model

    @classmethod
    def load_default(cls) -> ActorCritic | None:
        """The checkpoint shipped in broker/policy_data, or None (use FixedPolicy)."""
        if not DEFAULT_CHECKPOINT.exists():
            return None
        return cls.load(DEFAULT_CHECKPOINT)


def gaussian_log_prob(raw: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
                      ) -> torch.Tensor:
    var = (2 * log_std).exp()
    return (-((raw - mean) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def to_action(names: Sequence[str], raw: np.ndarray,
              latency_weight_usd_per_ms: float = 0.001) -> PolicyAction:
    """Squash a raw sample [N+2] into a PolicyAction within the documented ranges."""
    n = len(names)
    bias = np.tanh(raw[:n]) * BIAS_MAX_USD_PER_HOUR
    sig = 1.0 / (1.0 + np.exp(-raw[n:n + 2]))
    headroom = HEADROOM_MIN + (HEADROOM_MAX - HEADROOM_MIN) * float(sig[0])
    return PolicyAction(
        cluster_bias_usd_per_hour={name: round(float(b), 5) for name, b in zip(names, bias,
                                                                              strict=True)},
        headroom=round(headroom, 4), prewarm_lead_s=round(LEAD_MAX_S * float(sig[1]), 1),
        latency_weight_usd_per_ms=latency_weight_usd_per_ms)


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


def output_names(obs: GraphObs) -> list[str]:
    return [f"bias[{n}]" for n in obs.names] + ["headroom", "prewarm_lead_s"]


def _squashed_fn(model: ActorCritic, obs: GraphObs) -> Callable[[np.ndarray], np.ndarray]:
    """f(X [rows, N*F+B]) -> policy outputs [rows, N+2] in action units (batched)."""
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
        m = mean.numpy()
        out = np.empty_like(m)
        out[:, :n] = np.tanh(m[:, :n]) * BIAS_MAX_USD_PER_HOUR
        sig = 1.0 / (1.0 + np.exp(-m[:, n:]))
        out[:, n] = HEADROOM_MIN + (HEADROOM_MAX - HEADROOM_MIN) * sig[:, 0]
        out[:, n + 1] = LEAD_MAX_S * sig[:, 1]
        return out

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
