"""The decision types of an epoch (planner.EpochPlan's fields besides placements). Pure values.

Their own module so the rule modules (decisions.py, migrate.py) and planner.py share them
without a cycle; planner.py re-exports them (the public import path stays the planner's).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain import Assignment, DataSource, Placement


@dataclass(frozen=True, slots=True)
class PoolScale:
    cluster: str
    pool: str
    add_nodes: int


@dataclass(frozen=True, slots=True)
class PoolScaleIn:
    """Remove these nodes from a pool (they are empty, or their work is being migrated off)."""

    cluster: str
    pool: str
    nodes: tuple[str, ...]  # NodeState.name of each node to remove
    reason: str = "idle"  # idle | consolidate | unhealthy


@dataclass(frozen=True, slots=True)
class NodeReplace:
    """Replace one node by one cheaper node of another pool of the same cluster.

    Karpenter's replace consolidation (placement/consolidate.py): the node is tainted so no
    new work lands on it, one node of `target_pool` is ordered, and once that node is up the
    old one is drained (its replicas evicted and placed again) and removed. A replacement
    that never comes up leaves the old node as it was.
    """

    cluster: str
    pool: str  # the node's pool
    node: str  # NodeState.name of the node to replace
    target_pool: str  # the pool of the replacement node
    saving_usd_per_hour: float = 0.0  # node price minus the replacement's
    reason: str = "consolidate"


@dataclass(frozen=True, slots=True)
class Prewarm:
    """Get capacity, images or data in place before they are needed.

    `nodes` > 0 orders that many nodes ahead of forecast demand (`workload_id` empty); images
    and data are pre-pulled / copied onto `cluster`/`pool` for `workload_id` (a placed
    workload whose start would otherwise wait on them) or for forecast demand.
    """

    cluster: str
    pool: str
    nodes: int = 0
    images: tuple[str, ...] = ()
    data: tuple[DataSource, ...] = ()
    workload_id: str = ""
    reason: str = ""  # forecast | placement | standby


@dataclass(frozen=True, slots=True)
class Retry:
    """An unplaced workload waits until `not_before_s` before the planner tries it again."""

    workload_id: str
    not_before_s: float
    attempts: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Migration:
    """Move running replicas: start `target`, wait until ready, then drain `source`.

    The actuator never lets a running workload drop below its replicas. `reason`: recovered
    (its preferred cluster is back) | better (a clearly cheaper feasible option, past the
    hysteresis) | node-loss (a node is cordoned, NotReady or tainted for termination) |
    slo (measured latency broke the SLO) | consolidate (empty a node to remove it).
    """

    workload_id: str
    source: tuple[Assignment, ...]
    target: Placement
    reason: str
    saving_usd_per_hour: float = 0.0
    cost_usd: float = 0.0  # one-off cost of the move (restart, data) counted in the objective
