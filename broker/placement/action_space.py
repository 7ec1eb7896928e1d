"""The RL policy's action space: what each output steers, its range, its fixed-weights value,
and the map from raw network outputs to a `PolicyAction`. Pure (numpy only).

Scopes (ActionSpec.scope):
- "cluster", one value per graph node, for all its pools: the affinity bias (USD/h added to
  each replica's objective there), when to consolidate (the utilisation under which `lp`'s
  rule drains a node of restartable work) and how much to reserve (whole free nodes a
  multi-GPU pool keeps for whole-node jobs beyond the queued ones);
- "pool", one value per scalable pool (policy.py's pool readout; observe.py's pools): the
  scale-in idle timeout, the warm pool (empty nodes kept instead of scaled in) and the spot
  bias (USD/h added to a spot pool's options, which steers the spot share). Per pool, not per
  cluster, because a cluster's pools differ where these decisions bite: an 8-GPU node costs
  30x a CPU node to keep idle and boots slower, a spot pool is reclaimed and an on-demand one
  is not (issue 12: "per pool: warm-pool size, idle timeout and spot share");
- "global": the headroom (allocation ratio: share of pool capacity the LP may fill) and the
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

Raw layout (`Layout`): the cluster-scope outputs action by action (N each), then the
pool-scope ones (P each), then the global ones.

The fixed weights a checkpoint is trained against (`fixed_weights()`) are recorded in its
metadata; `fixed_weights_warnings` says what moved since (policy.py's module docstring).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from broker.domain import PolicyAction
from broker.placement.consolidate import CA_UTILIZATION_THRESHOLD
from broker.placement.decisions import DecisionConfig

SCOPES = ("cluster", "pool", "global")


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One output of the policy: a PolicyAction field, its range and the fixed weights' value.

    Every output is a Gaussian in an unsquashed space mapped by a sigmoid onto [low, high]
    (an integer output onto low..high, each integer an equal share of the sigmoid's range).
    `default` is the fixed weights' value (PolicyAction's default, what `lp` uses): the
    untrained policy's mean action, so training starts from lp (a residual policy). Raw
    values within NEUTRAL_LOGIT of `start_logit()` give `default` exactly (module docstring).
    `scope`: "cluster", "pool" or "global"; a pool-scope action fills PolicyAction's
    `pool_<name>` map.
    """

    name: str
    scope: str
    low: float
    high: float
    default: float
    integer: bool = False

    @property
    def field(self) -> str:
        """The PolicyAction field this output fills."""
        return f"pool_{self.name}" if self.scope == "pool" else self.name

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


# Action ranges (docs/twin.md "The policy" says why each is this wide).
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
# The order is the checkpoints' (log-std per action, the node head's outputs): never reorder.
ACTIONS = (
    ActionSpec("cluster_bias_usd_per_hour", "cluster", -BIAS_MAX_USD_PER_HOUR,
               BIAS_MAX_USD_PER_HOUR, 0.0),
    # lp's own timer (decisions.py: the forecast policies' ski-rental break-even).
    ActionSpec("idle_timeout_s", "pool", 0.0, IDLE_TIMEOUT_MAX_S,
               DecisionConfig().forecast_idle_s),
    ActionSpec("warm_nodes", "pool", 0.0, float(WARM_NODES_MAX), 0.0, integer=True),
    ActionSpec("spot_bias_usd_per_hour", "pool", -SPOT_BIAS_MAX_USD_PER_HOUR,
               SPOT_BIAS_MAX_USD_PER_HOUR, 0.0),
    ActionSpec("consolidate_below", "cluster", 0.0, CONSOLIDATE_BELOW_MAX,
               CA_UTILIZATION_THRESHOLD),
    ActionSpec("reserve_nodes", "cluster", 0.0, float(RESERVE_NODES_MAX), 0.0, integer=True),
    ActionSpec("headroom", "global", HEADROOM_MIN, HEADROOM_MAX, _FIXED.headroom),
    ActionSpec("prewarm_lead_s", "global", 0.0, LEAD_MAX_S, _FIXED.prewarm_lead_s),
)
# The node head's outputs, one per graph node each (format 3's per-cluster actions): the
# cluster-scope actions' means, and the base the pool readout adds to for pool-scope ones.
NODE_ACTIONS = tuple(a for a in ACTIONS if a.scope != "global")
CLUSTER_ACTIONS = tuple(a for a in ACTIONS if a.scope == "cluster")
POOL_ACTIONS = tuple(a for a in ACTIONS if a.scope == "pool")
GLOBAL_ACTIONS = tuple(a for a in ACTIONS if a.scope == "global")
FIXED_WEIGHTS_KEY = "fixed_weights"
# Whether the observation's forecast features extrapolate net growth (observe.growth_rates:
# the prewarm rule's rate, demand minus releases, growth only) rather than arrivals alone
# (before 2026-12-07). Recorded as `observation.net_forecast`: a checkpoint trained on the
# other meaning reads the same feature columns as something else.
OBSERVE_NET_FORECAST = True


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each output sits in a raw vector of a graph of `clusters` nodes and `pools`
    pools: cluster-scope blocks (N each), pool-scope blocks (P each), global values."""

    clusters: int
    pools: int

    @property
    def width(self) -> int:
        return (len(CLUSTER_ACTIONS) * self.clusters + len(POOL_ACTIONS) * self.pools
                + len(GLOBAL_ACTIONS))

    def block(self, spec: ActionSpec) -> slice:
        """The slice of `spec`'s values (one per cluster, pool, or one)."""
        if spec.scope == "cluster":
            k = CLUSTER_ACTIONS.index(spec)
            return slice(k * self.clusters, (k + 1) * self.clusters)
        base = len(CLUSTER_ACTIONS) * self.clusters
        if spec.scope == "pool":
            k = POOL_ACTIONS.index(spec)
            return slice(base + k * self.pools, base + (k + 1) * self.pools)
        base += len(POOL_ACTIONS) * self.pools
        j = GLOBAL_ACTIONS.index(spec)
        return slice(base + j, base + j + 1)


def squash(layout: Layout, raw: np.ndarray) -> np.ndarray:
    """Raw outputs [..., width] -> action units, same layout."""
    out = np.empty_like(raw, dtype=np.float64)
    for spec in ACTIONS:
        sl = layout.block(spec)
        out[..., sl] = spec.squash(raw[..., sl])
    return out


def to_action(names: Sequence[str], raw: np.ndarray,
              pools: Sequence[tuple[str, str]] = (),
              latency_weight_usd_per_ms: float = _FIXED.latency_weight_usd_per_ms
              ) -> PolicyAction:
    """Squash a raw sample (Layout(len(names), len(pools))) into a PolicyAction within the
    ActionSpec ranges; `pools` are (cluster, pool) names in the observation's order; the
    latency weight is not an action (the operator's, PolicyAction's default here)."""
    layout = Layout(len(names), len(pools))
    vals = squash(layout, np.asarray(raw, dtype=np.float64))
    fields: dict[str, object] = {}
    for spec in ACTIONS:
        col = vals[layout.block(spec)]
        if spec.scope == "cluster":
            fields[spec.field] = {name: _value(spec, v) for name, v in
                                  zip(names, col, strict=True)}
        elif spec.scope == "pool":
            nested: dict[str, dict[str, float | int]] = {}
            for (cluster, pool), v in zip(pools, col, strict=True):
                nested.setdefault(cluster, {})[pool] = _value(spec, v)
            fields[spec.field] = nested
        else:
            fields[spec.field] = round(float(col[0]), 4)
    return PolicyAction(latency_weight_usd_per_ms=latency_weight_usd_per_ms,
                        **fields)  # type: ignore[arg-type]


def _value(spec: ActionSpec, v: float) -> float | int:
    return int(v) if spec.integer else round(float(v), 5)


def fixed_weights() -> dict[str, float]:
    """The fixed weights today's actions steer from (the checkpoint metadata's record).

    Each ActionSpec's default (the neutral zone's centre) by action name, the PolicyAction
    defaults the policy does not output (latency weight), and the DecisionConfig timers
    scale-in falls back to where no timer is set (`decision.<field>`), and the least idle
    timer the planner lets an action set (`decision.policy_idle_min_s`, bounded_action), and
    whether node charges count the pools' measured boots (`decision.observed_boot`, 1 = yes),
    and whether the prewarm forecast nets out released capacity (`decision.net_forecast`),
    and whether new nodes' charges count the forecast arrivals that would fill them
    (`decision.fill_forecast`), and whether a "better" move counts the nodes it frees
    (`decision.migrate_freed_nodes`), and whether lp's drains may count a new node of a
    cheaper pool as the receiver (`decision.consolidate_replace`),
    and whether the observation's forecast features do (`observation.net_forecast`).
    """
    cfg = DecisionConfig()
    out = {a.name: float(a.default) for a in ACTIONS}
    out["latency_weight_usd_per_ms"] = float(_FIXED.latency_weight_usd_per_ms)
    out["decision.scale_in_idle_s"] = float(cfg.scale_in_idle_s)
    out["decision.forecast_idle_s"] = float(cfg.forecast_idle_s)
    out["decision.policy_idle_min_s"] = float(cfg.policy_idle_min_s)
    out["decision.observed_boot"] = float(cfg.observed_boot)
    out["decision.net_forecast"] = float(cfg.net_forecast)
    out["decision.fill_forecast"] = float(cfg.fill_forecast)
    out["decision.migrate_freed_nodes"] = float(cfg.migrate_freed_nodes)
    out["decision.consolidate_replace"] = float(cfg.consolidate_replace)
    out["observation.net_forecast"] = float(OBSERVE_NET_FORECAST)
    return out


def fixed_weights_warnings(meta: Mapping[str, object]) -> tuple[str, ...]:
    """What differs between the fixed weights a checkpoint recorded (`meta`) and today's.

    One line per differing value ("fixed weight idle_timeout_s: trained against 600.0, today
    120"), one for a value only one side has, or one line saying that the checkpoint has no
    record (checkpoints saved before the record existed). Empty: trained against today's."""
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
