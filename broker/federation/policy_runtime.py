"""The trained RL policy in the live broker: loaded once at start, asked once per epoch.

`install_policy` (a start-up step, see `broker.app.start_up`) reads `settings.policy`:

- `checkpoint = "none"` (default) or `enabled = false`: fixed weights
  (`PlacementSettings.headroom`, `latency_weight_usd_per_ms`), exactly what the plain `lp`
  policy does;
- `checkpoint = "shipped"` (or `""`, its spelling before the default changed): the checkpoint
  shipped in `broker/policy_data/policy.pt`; if the package lacks it, a warning and the
  operator's fixed weights;
- `checkpoint = "/some/path.pt"`: that file; missing or unreadable -> `ConfigError` naming
  the file, so `skyfed serve` refuses to start instead of silently steering with defaults.

Why fixed weights by default: the shipped checkpoint costs more than fixed-weight `lp` on the
shipped scenarios (docs/twin.md "The policy"), and a retrain that would replace it did not
pass the gate (not worse than lp on cost anywhere, better somewhere); a policy measured worse
than lp is something an operator opts into, not a default.

A checkpoint whose recorded fixed weights differ from today's, or that records none
(policy.fixed_weights_warnings), still loads: each difference is logged as a warning and
named in the start-up banner (`describe`), since its actions are offsets from those values
and it steers elsewhere on a planner whose defaults moved.

It sets `Runtime.policy` to a `PolicyRuntime`, which the placement loop calls as its action
function and the explain API uses for SHAP.

`PolicyRuntime.decide(snapshot)` is synchronous torch inference: the placement loop calls it
in the same worker thread as the planner, never on the event loop. Besides the action it
returns what the decision record needs: which policy steered (source, checkpoint path,
sha256 prefix), the action values, and for a learned policy the observation the policy saw
plus a SHAP reference state (`_baseline_and_remember`), compactly, so
`explain --policy` can compute SHAP attributions later without slowing the loop.

Why not SHAP at decision time: the permutation estimator costs ~0.1 s per epoch for a few
clusters and grows with clusters x features; the loop should spend that on solving. The
stored observation is a few KB per placement.

torch is imported only when a checkpoint is actually loaded (this module stays light for
the placement loop's import).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from broker.domain import FederationSnapshot, Placement, PolicyAction
from broker.errors import ConfigError
from broker.settings import PlacementSettings, Settings

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.placement.policy import ActorCritic, GraphObs

log = logging.getLogger(__name__)

HISTORY_EPOCHS = 32  # batches averaged into the SHAP baseline
OBS_DECIMALS = 5
SHAP_TOP = 5

# The policy's per-cluster actions: decision-record key -> PolicyAction field (cluster name ->
# value). They name every cluster of the federation, other tenants' private ones too, so a
# placement's record keeps only its chosen clusters' entries (per_placement).
PER_CLUSTER_FIELDS = {"bias_usd_per_hour": "cluster_bias_usd_per_hour",
                      "idle_timeout_s": "idle_timeout_s", "warm_nodes": "warm_nodes",
                      "spot_bias_usd_per_hour": "spot_bias_usd_per_hour",
                      "consolidate_below": "consolidate_below",
                      "reserve_nodes": "reserve_nodes"}
# The per-pool actions (cluster -> pool -> value), recorded under their field names.
PER_POOL_FIELDS = ("pool_idle_timeout_s", "pool_warm_nodes", "pool_spot_bias_usd_per_hour")


@dataclass(frozen=True)
class PolicyDecision:
    """One epoch's action and the policy part of its decision records (JSON-able)."""

    action: PolicyAction
    record: Mapping[str, object] = field(default_factory=dict)


class PolicyRuntime:
    """See the module docstring. Thread-safe: the loop and what-ifs may call `decide` at once."""

    def __init__(self, model: ActorCritic | None, settings: PlacementSettings, *,
                 source: str, checkpoint: str = "", sha256: str = "", why: str = "") -> None:
        self.model = model
        # Where the checkpoint's recorded fixed weights differ from today's (module docstring).
        self.warnings: tuple[str, ...] = (model.fixed_weights_warnings() if model is not None
                                          else ())
        self.source = source  # "checkpoint" | "fixed"
        self.checkpoint = checkpoint
        self.sha256 = sha256
        self._why = why  # why fixed weights, for the start-up log
        self._settings = settings
        self._fixed = PolicyAction(headroom=settings.headroom,
                                   latency_weight_usd_per_ms=settings.latency_weight_usd_per_ms)
        self._lock = threading.Lock()
        self._history: deque[np.ndarray] = deque(maxlen=HISTORY_EPOCHS)  # batch features

    @classmethod
    def fixed(cls, settings: PlacementSettings, *, why: str = "") -> PolicyRuntime:
        return cls(None, settings, source="fixed", why=why)

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.model is None:
            return f"fixed weights (headroom {self._fixed.headroom}, latency weight " \
                   f"{self._fixed.latency_weight_usd_per_ms} USD/ms){self._why}"
        line = f"RL policy checkpoint {self.checkpoint} (sha256 {self.sha256})"
        if self.warnings:
            line += "; WARNING: " + "; ".join(self.warnings)
        return line

    def identity(self) -> dict[str, object]:
        out: dict[str, object] = {"source": self.source}
        if self.model is not None:
            out |= {"checkpoint": self.checkpoint, "sha256": self.sha256}
        return out

    def __call__(self, snapshot: FederationSnapshot) -> PolicyAction:
        return self.decide(snapshot).action

    def decide(self, snapshot: FederationSnapshot, *, remember: bool = True) -> PolicyDecision:
        """The action for this epoch (torch inference: call it off the event loop).

        `remember=False` for counterfactual snapshots (what-if): their one-workload batch
        must not shift the "usual batch" of the SHAP reference.
        """
        if self.model is None or not snapshot.clusters:
            return PolicyDecision(self._fixed, self._action_record(self._fixed))
        from broker.placement.observe import observe

        one_torch_thread()
        try:
            obs = observe(snapshot, net_forecast=self.model.net_forecast_observed)
            action = replace(self.model.act(obs).action,
                             latency_weight_usd_per_ms=self._settings.latency_weight_usd_per_ms)
        except Exception as exc:  # a broken policy must not stop placement
            log.exception("RL policy failed on this snapshot; using fixed weights")
            record = self._action_record(self._fixed)
            record["fallback"] = f"policy error: {type(exc).__name__}: {exc}"
            return PolicyDecision(self._fixed, record)
        baseline = self._baseline_and_remember(obs, remember=remember)
        record = self._action_record(action)
        record["observation"] = encode_observation(obs, baseline)
        return PolicyDecision(action, record)

    def _action_record(self, action: PolicyAction) -> dict[str, object]:
        return self.identity() | {
            "headroom": action.headroom, "prewarm_lead_s": action.prewarm_lead_s,
            "latency_weight_usd_per_ms": action.latency_weight_usd_per_ms,
            **{key: dict(getattr(action, attr)) for key, attr in PER_CLUSTER_FIELDS.items()},
            **{key: {c: dict(v) for c, v in getattr(action, key).items()}
               for key in PER_POOL_FIELDS}}

    def _baseline_and_remember(self, obs: GraphObs, *, remember: bool = True
                               ) -> tuple[np.ndarray, np.ndarray]:
        """The SHAP reference state: every cluster at the clusters' mean, the usual batch.

        Node features: the mean over this observation's clusters, the same for each, so
        attributions say what sets a cluster apart from the others (why its bias differs,
        why headroom is not what an even federation would get). Batch features: the mean of
        the last HISTORY_EPOCHS batches including this one, so a batch as usual explains
        nothing and a burst shows up. (A history of whole observations would make the
        reference equal the state in a steady federation and every attribution 0.)
        """
        with self._lock:
            recent = [*self._history, obs.batch_x.copy()]
            if remember:
                self._history.append(recent[-1])
            batch = np.mean(np.stack(recent[-HISTORY_EPOCHS:]), axis=0)
        node = np.broadcast_to(obs.node_x.mean(axis=0, keepdims=True), obs.node_x.shape)
        return np.array(node), batch


def share_observation(record: Mapping[str, object], holder_id: str) -> dict[str, object]:
    """`record` without its observation, pointing at the placement that holds it instead.

    Why: every placement of an epoch saw the same observation (a few KB per placement,
    ~9 KB at 40 clusters); the placement loop stores it once per epoch, in the first
    placement it writes, and the others carry `observation_in: <that placement id>`.
    """
    out = {k: v for k, v in record.items() if k != "observation"}
    out["observation_in"] = holder_id
    return out


def per_placement(record: Mapping[str, object], placement: Placement) -> dict[str, object]:
    """The epoch's policy record narrowed to one placement: the bias (0 when absent) and every
    other per-cluster and per-pool action of its chosen clusters only, never another
    cluster's name."""
    out = dict(record)
    bias = record.get("bias_usd_per_hour")
    chosen = sorted({a.cluster for a in placement.assignments})
    out["bias_usd_per_hour"] = {c: (bias.get(c, 0.0) if isinstance(bias, Mapping) else 0.0)
                                for c in chosen}
    for key in (*(k for k in PER_CLUSTER_FIELDS if k != "bias_usd_per_hour"),
                *PER_POOL_FIELDS):
        values = record.get(key)
        if isinstance(values, Mapping):
            out[key] = {c: values[c] for c in chosen if c in values}
    return out


# ------------------------------------------------------------------ observation codec
def _rounded(a: np.ndarray) -> list[Any]:
    return np.round(a.astype(np.float64), OBS_DECIMALS).tolist()  # type: ignore[no-any-return]


def encode_observation(obs: GraphObs, baseline: tuple[np.ndarray, np.ndarray]
                       ) -> dict[str, object]:
    """The observation and its reference as plain JSON lists (rounded to 5 decimals).

    The reference's node rows are all the clusters' mean, and its pool rows all the pools'
    mean, so one row of each is stored.
    """
    pool_mean = obs.pool_x.mean(axis=0) if len(obs.pools) else np.zeros(0)
    return {"names": list(obs.names), "node_x": _rounded(obs.node_x),
            "batch_x": _rounded(obs.batch_x), "edge_index": obs.edge_index.tolist(),
            "edge_x": _rounded(obs.edge_x), "baseline_node_mean": _rounded(baseline[0][0]),
            "baseline_batch_x": _rounded(baseline[1]),
            "pools": [list(p) for p in obs.pools], "pool_x": _rounded(obs.pool_x),
            "pool_cluster": obs.pool_cluster.tolist(),
            "baseline_pool_mean": _rounded(pool_mean)}


def decode_observation(blob: Mapping[str, Any]) -> tuple[GraphObs, GraphObs]:
    """(observation, baseline) from `encode_observation`'s dict; ValueError if malformed.
    Records written before the per-pool actions have no pools."""
    from broker.placement.policy import (
        BATCH_FEATURES,
        EDGE_FEATURES,
        NODE_FEATURES,
        POOL_FEATURES,
        GraphObs,
    )

    try:
        names = tuple(str(n) for n in blob["names"])
        n = len(names)
        edge_index = np.asarray(blob["edge_index"], dtype=np.int64).reshape(2, -1)
        edge_x = np.asarray(blob["edge_x"], dtype=np.float32).reshape(-1, len(EDGE_FEATURES))

        def node(key: str) -> np.ndarray:
            return np.asarray(blob[key], dtype=np.float32).reshape(n, len(NODE_FEATURES))

        mean = np.asarray(blob["baseline_node_mean"], dtype=np.float32).reshape(
            1, len(NODE_FEATURES))

        def batch(key: str) -> np.ndarray:
            return np.asarray(blob[key], dtype=np.float32).reshape(len(BATCH_FEATURES))

        pools = tuple((str(c), str(p)) for c, p in blob.get("pools", []))
        pf = len(POOL_FEATURES)
        pool_x = np.asarray(blob.get("pool_x", []), dtype=np.float32).reshape(len(pools), pf)
        pool_cluster = np.asarray(blob.get("pool_cluster", []), dtype=np.int64).reshape(
            len(pools))
        pool_mean = np.asarray(blob.get("baseline_pool_mean", []), dtype=np.float32)
        base_pools = np.repeat(pool_mean.reshape(1, pf), len(pools), axis=0) if pools \
            else pool_x
        obs = GraphObs(names, node("node_x"), edge_index, edge_x, batch("batch_x"), pools,
                       pool_x, pool_cluster)
        base = GraphObs(names, np.repeat(mean, n, axis=0), edge_index, edge_x,
                        batch("baseline_batch_x"), pools, base_pools, pool_cluster)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"stored policy observation is malformed: {exc}") from exc
    return obs, base


# ------------------------------------------------------------------ SHAP
def explain_policy(model: ActorCritic, record: Mapping[str, Any], *,
                   clusters: Sequence[str] = (), top: int = SHAP_TOP) -> dict[str, object]:
    """SHAP attributions of the policy's outputs for the observation stored in `record`.

    `record` is a decision record's `policy_action` entry. Outputs explained: headroom,
    prewarm lead and the bias of each of `clusters` (the placement's chosen clusters).
    Each output lists its value, its baseline value (the policy on the baseline
    observation) and its `top` features by |SHAP value|; the values of all features sum to
    value - baseline (permutation estimator, additive per permutation). Synchronous torch:
    call it off the event loop.
    """
    from broker.placement.attribution import shap_values

    one_torch_thread()
    obs, base = decode_observation(record["observation"])
    now, then = model.act(obs).action, model.act(base).action
    wanted = ["headroom", "prewarm_lead_s", *(f"bias[{c}]" for c in clusters)]
    values = shap_values(model, obs, [base], top=top)
    out: dict[str, object] = {}
    for name in wanted:
        if name not in values:
            continue
        out[name] = {"value": _output(now, name), "baseline": _output(then, name),
                     "top_features": [{"feature": f, "shap": round(v, 6)}
                                      for f, v in values[name]]}
    return out


def _output(action: PolicyAction, name: str) -> float:
    """The value of output `name` (attribution.output_names) in `action`."""
    if name == "headroom":
        return action.headroom
    if name == "prewarm_lead_s":
        return action.prewarm_lead_s
    field, _, cluster = name.partition("[")
    attr = PER_CLUSTER_FIELDS.get("bias_usd_per_hour" if field == "bias" else field)
    per_cluster: Mapping[str, float] = getattr(action, attr) if attr else {}
    return float(per_cluster.get(cluster.rstrip("]"), 0.0))


def one_torch_thread() -> None:
    """Make torch single-threaded in the calling thread (costs ~0.1 us: call it per use).

    Why: the policy's tensors are tiny (tens of nodes x 32), so intra-op parallelism only
    adds synchronisation; on a busy 2-core host one forward pass took 21 ms with torch's
    default 2 threads and 0.3 ms with 1 (SHAP for 40 clusters: 3.9 s vs 0.7 s). Per thread
    because torch's (OpenMP) setting does not reach threads already started, such as
    `asyncio.to_thread`'s workers, where the policy runs.
    """
    import torch

    torch.set_num_threads(1)


# ------------------------------------------------------------------ loading
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _load_checkpoint(path: Path) -> ActorCritic:
    from broker.placement.policy import ActorCritic

    try:
        return ActorCritic.load(path)
    except Exception as exc:  # torch/pickle raise many types; one message here
        raise ConfigError(f"policy checkpoint {path} cannot be loaded "
                          f"({type(exc).__name__}: {exc}); fix settings policy.checkpoint "
                          "or set it to \"none\" for fixed weights") from exc


def load_policy(settings: Settings, *, shipped: Path | None = None) -> PolicyRuntime:
    """The runtime `settings.policy` asks for (see the module docstring). Blocking (torch).

    `shipped` replaces the packaged checkpoint's path (tests: a package without one).
    """
    placement = settings.placement
    choice = settings.policy.checkpoint.strip()
    if not settings.policy.enabled:
        return PolicyRuntime.fixed(placement, why=" (policy disabled in settings)")
    if choice.lower() == "none":
        return PolicyRuntime.fixed(placement, why=" (policy.checkpoint = \"none\"; set it to "
                                   "\"shipped\" or a path for a learned policy)")
    if choice.lower() in ("", "shipped"):
        from broker.placement.policy import DEFAULT_CHECKPOINT

        path = shipped or DEFAULT_CHECKPOINT
        if not path.is_file():
            log.warning("shipped policy checkpoint %s is missing; placing with fixed weights",
                        path)
            return PolicyRuntime.fixed(placement, why=" (shipped checkpoint missing)")
    else:
        path = Path(choice).expanduser()
        if not path.is_file():
            raise ConfigError(f"policy checkpoint {path} does not exist (settings "
                              "policy.checkpoint); set it to \"none\" for fixed weights")
    model = _load_checkpoint(path)
    runtime = PolicyRuntime(model, placement, source="checkpoint", checkpoint=str(path),
                            sha256=_sha256(path))
    for w in runtime.warnings:
        log.warning("policy checkpoint %s: %s", path, w)
    return runtime


async def install_policy(rt: Runtime) -> None:
    """Start-up step: load the policy (off the event loop) into `rt.policy`."""
    import asyncio

    policy = await asyncio.to_thread(load_policy, rt.settings)
    rt.policy = policy
    log.info("placement policy: %s", policy.describe())


def model_for(record: Mapping[str, Any], runtime: PolicyRuntime | None) -> ActorCritic:
    """The model that made `record`: the running one if the sha256 matches, else its file.

    Raises LookupError (with the reason) when that checkpoint is gone or was replaced.
    """
    sha = record.get("sha256")
    if runtime is not None and runtime.model is not None and runtime.sha256 == sha:
        return runtime.model
    path = Path(str(record.get("checkpoint", "")))
    if not path.is_file():
        raise LookupError(f"checkpoint {path} that steered this placement is not available")
    if _sha256(path) != sha:
        raise LookupError(f"checkpoint {path} changed since this placement (sha256 {sha})")
    return _load_checkpoint(path)
