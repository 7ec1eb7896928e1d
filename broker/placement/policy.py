"""The RL policy: an actor-critic over the federation graph (torch). Pure: state -> action.

What it steers (DESIGN.md "The placement problem"): the LP keeps every hard constraint; the
policy only outputs a `PolicyAction`. The actions, their ranges, scopes (per cluster, per
pool, global), fixed-weights values and the neutral zone are broker/placement/action_space.py's.

Input (`GraphObs`, built from a FederationSnapshot by broker/placement/observe.py, the one
observation both the live broker and the twin use): one graph node per cluster/site with
NODE_FEATURES, directed edges to each node's nearest neighbours carrying EDGE_FEATURES,
BATCH_FEATURES of the pending batch, and one row of POOL_FEATURES per scalable pool with the
index of its cluster.

Network: a node MLP encoder, MP_ROUNDS rounds of mean-aggregated message passing written in
plain torch (message = MLP([h_src, e]), update h += MLP([h, mean msg])), mean-pooling into a
global vector joined with the batch features. Actor heads: a node head (one mean per
NODE_ACTIONS entry per node), a pool readout, and a global head, with one state-independent
learned log-std per action (diagonal Gaussian in an unsquashed space, squashed by a sigmoid
into the action ranges; an integer action takes the floor). Critic: MLP(global) -> V.

Pool readout: a pool-scope action's mean for pool j of cluster c is the node head's output
for c plus MLP([encode_pool(pool_x[j]), h[c], global]) (`pool_head`, whose last layer starts
at zero). Why a readout over the pools rather than pool nodes in the graph: the pools of a
cluster share its network position (RTT, bandwidth, health), which message passing already
carries at the cluster level, so the readout adds what differs per pool (shape, price, spot,
idle nodes, its own forecast) at no cost to the graph; and a format-3 checkpoint, whose
per-cluster outputs are the node head's, loads with a zero readout and gives every pool of a
cluster that cluster's value, the decisions it made before.

Algorithm: PPO with GAE (Schulman et al. 2017; 2016), not A2C. Why: every environment step
of the twin is a real LP solve, so samples are expensive; PPO's clipped surrogate reuses each
rollout for several epochs of minibatch updates without the policy collapsing, while A2C
uses each sample once. GAE(lambda) trades bias for variance on the long, noisy episodes.

Without a checkpoint, `FixedPolicy` returns the operator's fixed weights (what `lp` uses).
Checkpoints are small (a few hundred KB): `ActorCritic.save` / `ActorCritic.load`. Format 4
(pool readout); 3 and 2 load (see `_upgrade_v3`, `_upgrade_v2`).

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from broker.domain import PolicyAction
from broker.placement.action_space import (
    ACTIONS,
    BIAS_MAX_USD_PER_HOUR,
    CLUSTER_ACTIONS,
    CONSOLIDATE_BELOW_MAX,
    FIXED_WEIGHTS_KEY,
    GLOBAL_ACTIONS,
    HEADROOM_MAX,
    HEADROOM_MIN,
    IDLE_TIMEOUT_MAX_S,
    LEAD_MAX_S,
    NEUTRAL_LOGIT,
    NODE_ACTIONS,
    POOL_ACTIONS,
    RESERVE_NODES_MAX,
    SPOT_BIAS_MAX_USD_PER_HOUR,
    WARM_NODES_MAX,
    ActionSpec,
    Layout,
    fixed_weights,
    fixed_weights_warnings,
    squash,
    to_action,
)

__all__ = [
    "ACTIONS",
    "BATCH_FEATURES",
    "BIAS_MAX_USD_PER_HOUR",
    "CHECKPOINT_VERSION",
    "CLUSTER_ACTIONS",
    "CONSOLIDATE_BELOW_MAX",
    "DEFAULT_CHECKPOINT",
    "EDGE_FEATURES",
    "FIXED_WEIGHTS_KEY",
    "GLOBAL_ACTIONS",
    "HEADROOM_MAX",
    "HEADROOM_MIN",
    "HIDDEN",
    "IDLE_TIMEOUT_MAX_S",
    "LEAD_MAX_S",
    "MP_ROUNDS",
    "NEUTRAL_LOGIT",
    "NODE_ACTIONS",
    "NODE_FEATURES",
    "POOL_ACTIONS",
    "POOL_FEATURES",
    "RESERVE_NODES_MAX",
    "SPOT_BIAS_MAX_USD_PER_HOUR",
    "WARM_NODES_MAX",
    "ActionSample",
    "ActionSpec",
    "ActorCritic",
    "FixedPolicy",
    "GraphObs",
    "Layout",
    "LearnedPolicy",
    "fixed_weights",
    "fixed_weights_warnings",
    "gaussian_log_prob",
    "obs_tensors",
    "squash",
    "to_action",
]

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
POOL_FEATURES = (
    "free_cpu_frac", "free_gpu_frac", "price_usd_per_vcpu_hour", "is_spot",
    "reclaim_rate_per_hour", "is_gpu", "node_vcpu_log", "nodes_of_max", "booting_frac",
    "idle_node_frac", "idle_age_frac", "forecast_frac",
)
HIDDEN = 32
MP_ROUNDS = 2
CHECKPOINT_VERSION = 4
# Format 2 (before consolidate_below and reserve_nodes) loads with those at the fixed weights.
_V2_NODE_ACTIONS = 4
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "policy_data" / "policy.pt"


def _no_pools() -> np.ndarray:
    return np.zeros((0, len(POOL_FEATURES)), dtype=np.float32)


def _no_index() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class GraphObs:
    names: tuple[str, ...]
    node_x: np.ndarray  # [N, len(NODE_FEATURES)] float32
    edge_index: np.ndarray  # [2, E] int64: src, dst
    edge_x: np.ndarray  # [E, len(EDGE_FEATURES)] float32
    batch_x: np.ndarray  # [len(BATCH_FEATURES)] float32
    # The scalable pools, (cluster, pool) names, their features and their clusters' rows.
    pools: tuple[tuple[str, str], ...] = ()
    pool_x: np.ndarray = field(default_factory=_no_pools)  # [P, len(POOL_FEATURES)] float32
    pool_cluster: np.ndarray = field(default_factory=_no_index)  # [P] int64 into names

    @property
    def layout(self) -> Layout:
        return Layout(len(self.names), len(self.pools))


@dataclass(frozen=True)
class ActionSample:
    action: PolicyAction
    raw: np.ndarray  # unsquashed sample, obs.layout
    log_prob: float
    value: float


def _mlp(i: int, o: int, hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, hidden), nn.Tanh(), nn.Linear(hidden, o))


_CLUSTER_COLS = [NODE_ACTIONS.index(a) for a in CLUSTER_ACTIONS]
_POOL_COLS = [NODE_ACTIONS.index(a) for a in POOL_ACTIONS]
_STD_CLUSTER = [ACTIONS.index(a) for a in CLUSTER_ACTIONS]
_STD_POOL = [ACTIONS.index(a) for a in POOL_ACTIONS]
_STD_GLOBAL = [ACTIONS.index(a) for a in GLOBAL_ACTIONS]


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
        self.pool_encode = _mlp(len(POOL_FEATURES), hidden)
        self.pool_head = _mlp(4 * hidden, len(POOL_ACTIONS))
        # One learned log-std per action kind (shared by the clusters or pools), ACTIONS order.
        self.log_std = nn.Parameter(torch.full((len(ACTIONS),), -0.3))
        # The loaded checkpoint's metadata; a fresh model's records today's fixed weights.
        self.meta: dict[str, object] = {FIXED_WEIGHTS_KEY: fixed_weights()}
        self._start_at_fixed()

    def _start_at_fixed(self) -> None:
        """Initialise the heads so the untrained mean action is the operator's fixed weights.

        Why: the policy learns deviations from what `lp` already does (a residual policy), so
        an untrained or briefly trained checkpoint starts from lp's behaviour instead of from
        an arbitrary point of the action space. The pool readout starts at exactly zero: a
        pool starts at its cluster's value.
        """
        with torch.no_grad():
            for head, specs in ((self.node_head, NODE_ACTIONS), (self.global_head,
                                                                 GLOBAL_ACTIONS)):
                last = head[-1]
                if isinstance(last, nn.Linear):
                    last.weight.mul_(0.1)
                    last.bias.copy_(torch.tensor([a.start_logit() for a in specs]))
            _zero_last(self.pool_head)

    # -------------------------------------------------------------- forward
    def forward_tensors(self, node_x: torch.Tensor, edge_index: torch.Tensor,
                        edge_x: torch.Tensor, batch_x: torch.Tensor,
                        pool_x: torch.Tensor | None = None,
                        pool_cluster: torch.Tensor | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batched forward. node_x [B,N,F], edge_index [2,E], edge_x [B,E,EF], batch_x [B,BF],
        pool_x [B,P,PF], pool_cluster [P] (None: no pools).

        Returns (mean [B, W], log_std [W], value [B]) in `Layout(N, P)` (W its width).
        Batched so SHAP can evaluate many perturbed states in one call.
        """
        h = self.encode(node_x)
        src, dst = edge_index[0], edge_index[1]
        b, n = node_x.shape[0], node_x.shape[1]
        deg = torch.zeros(n).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1.0)
        for msg, upd in zip(self.messages, self.updates, strict=True):
            m = msg(torch.cat([h[:, src, :], edge_x], dim=-1))
            agg = torch.zeros_like(h).index_add_(1, dst, m) / deg[None, :, None]
            h = h + upd(torch.cat([h, agg], dim=-1))
        g = torch.cat([h.mean(dim=1), self.batch(batch_x)], dim=-1)  # [B, 2H]
        node_in = torch.cat([h, g[:, None, :].expand(-1, n, -1)], dim=-1)
        per_node = self.node_head(node_in)  # [B, N, len(NODE_ACTIONS)]
        parts = [per_node[:, :, _CLUSTER_COLS].transpose(1, 2).reshape(b, -1)]
        p = 0 if pool_x is None or pool_cluster is None else int(pool_cluster.shape[0])
        if p and pool_x is not None and pool_cluster is not None:
            pool_in = torch.cat([self.pool_encode(pool_x), h[:, pool_cluster, :],
                                 g[:, None, :].expand(-1, p, -1)], dim=-1)
            pool_mean = per_node[:, pool_cluster][:, :, _POOL_COLS] + self.pool_head(pool_in)
            parts.append(pool_mean.transpose(1, 2).reshape(b, -1))
        parts.append(self.global_head(g))  # [B, G]
        mean = torch.cat(parts, dim=-1)
        log_std = torch.cat([self.log_std[_STD_CLUSTER].repeat_interleave(n),
                             self.log_std[_STD_POOL].repeat_interleave(p),
                             self.log_std[_STD_GLOBAL]])
        return mean, log_std, self.value_head(g).squeeze(-1)

    def forward_obs(self, obs: GraphObs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        node_x, edge_index, edge_x, batch_x, pool_x, pool_cluster = obs_tensors(obs)
        mean, log_std, value = self.forward_tensors(node_x[None], edge_index, edge_x[None],
                                                    batch_x[None], pool_x[None], pool_cluster)
        return mean[0], log_std, value[0]

    def act(self, obs: GraphObs, *, sample: bool = False,
            generator: torch.Generator | None = None) -> ActionSample:
        """Deterministic (the mean) unless `sample`; `generator` makes sampling reproducible."""
        with torch.no_grad():
            mean, log_std, value = self.forward_obs(obs)
            std = log_std.exp()
            raw = mean + std * torch.randn(mean.shape, generator=generator) if sample else mean
            logp = gaussian_log_prob(raw, mean, log_std)
        return ActionSample(to_action(obs.names, raw.numpy(), obs.pools), raw.numpy().copy(),
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

    @property
    def net_forecast_observed(self) -> bool:
        """Whether this model was trained on forecast features of net growth (its record's
        `observation.net_forecast`; observe.py): the shells build its observation that way,
        so a checkpoint trained on arrivals alone (es3, no record) still gets arrivals."""
        rec = self.meta.get(FIXED_WEIGHTS_KEY)
        return isinstance(rec, dict) and rec.get("observation.net_forecast") == 1.0

    @classmethod
    def load(cls, source: str | Path | bytes) -> ActorCritic:
        """Load a checkpoint from a path or bytes; raises ValueError on a foreign file."""
        buf: io.BytesIO | Path = io.BytesIO(source) if isinstance(source, bytes) else Path(source)
        blob = torch.load(buf, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("version") not in (2, 3, CHECKPOINT_VERSION):
            raise ValueError(f"not a skyfed policy checkpoint (version 2, 3 or "
                             f"{CHECKPOINT_VERSION})")
        model = cls(hidden=int(blob["hidden"]), rounds=int(blob["rounds"]))
        state = blob["state"]
        if blob["version"] == 2:
            state = _upgrade_v2(state, model.state_dict())
        if blob["version"] in (2, 3):
            state = _upgrade_v3(state, model.state_dict())
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


def _zero_last(head: nn.Sequential) -> None:
    last = head[-1]
    if isinstance(last, nn.Linear):
        last.weight.zero_()
        last.bias.zero_()


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


def _upgrade_v3(old: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """A format-3 state dict in format 4's layout: the pool readout (pool_encode, pool_head)
    is added with a zero last layer, so each pool gets its cluster's per-cluster output, as
    format 3 applied it to every pool of the cluster: the same decisions."""
    out = dict(old)
    for key, value in fresh.items():
        if key.startswith(("pool_encode.", "pool_head.")):
            out[key] = value.clone()
    out["pool_head.2.weight"] = torch.zeros_like(fresh["pool_head.2.weight"])
    out["pool_head.2.bias"] = torch.zeros_like(fresh["pool_head.2.bias"])
    return out


def gaussian_log_prob(raw: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
                      ) -> torch.Tensor:
    var = (2 * log_std).exp()
    return (-((raw - mean) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def obs_tensors(obs: GraphObs) -> tuple[torch.Tensor, ...]:
    """(node_x, edge_index, edge_x, batch_x, pool_x, pool_cluster) as tensors."""
    return (torch.as_tensor(obs.node_x, dtype=torch.float32),
            torch.as_tensor(obs.edge_index, dtype=torch.int64),
            torch.as_tensor(obs.edge_x, dtype=torch.float32),
            torch.as_tensor(obs.batch_x, dtype=torch.float32),
            torch.as_tensor(obs.pool_x, dtype=torch.float32).reshape(-1, len(POOL_FEATURES)),
            torch.as_tensor(obs.pool_cluster, dtype=torch.int64))


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
