"""One epoch's decisions from a snapshot of state: the functional core.

INTERFACE FIXED EARLY so the live loop (broker/federation) and the twin
(broker/sim) can be built against it in parallel; the Placement work fills in
the body. Keep these names and fields stable; add fields with defaults.

    plan = plan_epoch(snapshot, action, config, policy="lp")

- `snapshot`: FederationSnapshot (clusters with pools and current usage, the
  pending batch, measured RTTs, user regions, tenants).
- `action`: PolicyAction (per-cluster bias, headroom, prewarm lead, latency
  weight) — from the RL policy or fixed defaults.
- `policy`: "lp" (the LP), "greedy" (cheapest feasible first, the seed's
  selectCloudProvider), "traditional" (filter + least-allocated/balanced
  scoring with static cluster weights). Same inputs, same output type.

Pure: no I/O, no clock reads, no globals, inputs never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.domain import FederationSnapshot, Placement, PolicyAction


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    solver: str = "highs"
    k_candidates: int = 8
    mip_gap: float = 0.01
    time_limit_s: float = 5.0
    unplaced_penalty_usd: float = 1000.0
    # Hours a service's cost is counted over in the objective (batch/train use duration_s).
    service_horizon_h: float = 1.0
    # Static per-cluster weights for the "traditional" baseline (Karmada-style).
    static_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolScale:
    cluster: str
    pool: str
    add_nodes: int


@dataclass(frozen=True, slots=True)
class SolveStats:
    status: str  # optimal | time_limit | infeasible | heuristic
    objective: float
    lp_bound: float | None
    gap: float | None
    build_s: float
    solve_s: float
    variables: int = 0
    constraints: int = 0


@dataclass(frozen=True, slots=True)
class EpochPlan:
    placements: tuple[Placement, ...]
    unplaced: Mapping[str, str]  # workload id -> reason (names the binding constraint family)
    scale: tuple[PoolScale, ...]  # nodes each pool must add for this plan
    stats: SolveStats


def plan_epoch(
    snapshot: FederationSnapshot,
    action: PolicyAction,
    config: PlannerConfig,
    *,
    policy: str = "lp",
) -> EpochPlan:
    """Decide this epoch's placements. See the module docstring."""
    raise NotImplementedError("filled in by the Placement work")
