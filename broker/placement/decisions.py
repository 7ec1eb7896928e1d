"""An epoch's pool and queue decisions besides placements: retry/backoff, scale-in, prewarm. Pure.

plan_epoch (planner.py) calls these after the solve, on the same snapshot, so the live loop
and the twin get the same decisions from the same rules; neither shell decides on its own.

Retry/backoff (`due`, `retries`), as kube-scheduler's unschedulable queue: a workload the
plan leaves (partly) unplaced gets `Retry(attempts = a + 1, not_before_s = now + backoff(a+1))`
with

    backoff(a) = min(retry_max_s, retry_base_s * 2 ** (a - 1))

(podInitialBackoffSeconds doubled per attempt, capped like podMaxInUnschedulablePodsDuration,
5 min). It is due again once `now - last_attempt_s >= backoff(attempts)`, or earlier when
capacity grew after its last attempt (`snapshot.capacity_changed_s`, a "cluster event") and
at least `retry_min_s` passed. Re-solving an unchanged infeasible batch decides nothing new.

Scale-in (`scale_in`), per-node timers as Cluster Autoscaler's `--scale-down-unneeded-time`:
a node observed empty (`NodeState.idle_since_s`, kept by the inventory poller live and the
engine in the twin) for at least `scale_in_idle_s` is removed, unless the pool is growing
this epoch; never more nodes than the pool's free capacity after this epoch's placements
holds (aggregate CPU and memory), never a booting or leaving node, never on fixed sites.
The policy may set the timer per pool or per cluster (`PolicyAction.for_pool`:
`pool_idle_timeout_s`, else `idle_timeout_s`, else `scale_in_idle_s`; plan_epoch raises a
set timer to `policy_idle_min_s`, the ski-rental break-even below: `bounded_action`) and a
warm pool
(`pool_warm_nodes`, else `warm_nodes`): that many empty ready nodes of the pool are kept
(the longest idle go first). Look-ahead (policies
with prewarm, `forecast=True`): scale-in never takes a pool below what the prewarm rule
below would order back over the same lead L, i.e. it removes at most the largest k with
floor((used + rate * L - (nodes - k) * unit) / unit + 1/2) <= 0: a node the forecast says
is needed within the lead is kept instead of being removed now and bought (and booted,
and paid while booting) again. Those policies' default timer is then `forecast_idle_s`
(the ski-rental break-even: keep an idle node as long as buying it again costs, its boot
time) instead of Cluster Autoscaler's 10 minutes: the nodes the forecast needs are kept by
the rule above, so the timer only waits out demand the forecast cannot see.

Prewarm (`prewarm_nodes`, `prewarm_for_placements`):
- nodes ahead of forecast demand, per cloud pool in its bottleneck unit (GPUs for GPU pools,
  else vCPU), with the policy's lead time L = `PolicyAction.prewarm_lead_s`:

      overflow = used + rate * L - nodes * unit
      order    = min(floor(overflow / unit + 1/2), max(1, max_nodes // 10), max_nodes - nodes)

  where `used` and `nodes` include this epoch's placements and scale-ups and `rate` is the
  pool's net rate (`forecast_rate`): its demand EWMA (FederationSnapshot.demand, what was
  placed there) minus its release EWMA (FederationSnapshot.freed, what workloads that ended
  there gave back), so a pool whose jobs end as fast as new ones arrive forecasts no
  growth. Half a node of forecast overflow buys one.
- images and data for a placed workload whose start waits on new nodes or on data, on cloud
  and Kubernetes clusters (edge standbys are the hub's). It is ordered now; on Kubernetes
  the image is pulled on each node of the pool as it joins (a DaemonSet) and the data is
  downloaded onto one node of the pool (providers/kubernetes_prewarm.py), so neither
  overlaps a new node's boot. The twin starts a replica after node, image and data in turn
  (docs/twin.md, "pod start").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from broker.domain import (
    Cluster,
    FederationSnapshot,
    Placement,
    PolicyAction,
    Pool,
    PricingModel,
    Workload,
)
from broker.placement.candidates import NODE_BOOT_S, options_and_table
from broker.placement.kinds import PoolScale, PoolScaleIn, Prewarm, Retry
from broker.placement.memo import PlanMemo

Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class DecisionConfig:
    """The constants of the rules above (docs/placement.md gives each one's source)."""

    # Cluster Autoscaler's default --scale-down-unneeded-time (10 min).
    scale_in_idle_s: float = 600.0
    # The idle timer of policies with a forecast (scale_in's look-ahead), nodes the forecast
    # needs being kept: the ski-rental break-even, an idle node kept as long as buying it
    # again costs (its boot time, billed while it boots: candidates.NODE_BOOT_S, the
    # packing model's boot charge), 2-competitive against knowing the next arrival (Karlin,
    # Manasse, Rudolph, Sleator, "Competitive snoopy caching", Algorithmica 1988).
    forecast_idle_s: float = NODE_BOOT_S
    # The least idle timer a policy's action may set (PolicyAction.idle_timeout_s and
    # pool_idle_timeout_s; a lower value counts as this): the same break-even, so no learned
    # timer removes a node sooner than buying it back costs. Policies' own defaults
    # (karpenter's 0 s) are not actions and keep their values. 0 = any timer.
    policy_idle_min_s: float = NODE_BOOT_S
    # Charge each pool's new node its measured boot (Pool.boot_s, observed.py rule 6;
    # candidates.boot_estimates) instead of the assumed NODE_BOOT_S in the packing model's
    # node charge. The timers above stay as set: a pool's measured boot as its timer was
    # tried and not kept (docs/placement.md, "Measured boot times"). False: NODE_BOOT_S.
    observed_boot: bool = True
    # The net forecast: the prewarm rule (and the look-ahead scale-in and lp's drains, which
    # keep what it would order back) forecasts a pool's demand rate minus the rate its ended
    # workloads gave capacity back (FederationSnapshot.freed), not arrivals alone. False:
    # arrivals alone, the rule before 2026-12-06 (docs/placement.md, "node prewarm").
    net_forecast: bool = True
    # The look-ahead of the packing model's node charge: a new node is charged less the share
    # of it that the forecast arrivals of its cluster would pay (candidates.fill_shares), so
    # a batch of one job no longer opens the smallest node where a bigger one costs less
    # per unit of work. False: the whole charge to the batch, the model before 2026-12-07
    # (docs/placement.md, "The node charge's look-ahead").
    fill_forecast: bool = True
    # Backoff: first wait, cap (kube-scheduler's 5 min), and the least wait after capacity grew.
    retry_base_s: float = 10.0
    retry_max_s: float = 300.0
    retry_min_s: float = 60.0
    # Node prewarm: at most this fraction of max_nodes per epoch (at least one node).
    prewarm_max_fraction: float = 0.1
    # Migrations (placement/migrate.py): a move for a better option must save at least this
    # fraction of the current cost (hysteresis) and pay its one-off cost back within
    # `migration_payback_h`; a move costs `migration_overlap_h` of the target's price
    # (both sides run until the target is ready) plus the egress of its data.
    migrate: bool = True
    migration_min_saving_fraction: float = 0.2
    migration_payback_h: float = 1.0
    migration_overlap_h: float = 0.1
    # A "better" move's saving counts the price of the cloud nodes that run the service's
    # replicas alone (they are given back once it leaves), less those replicas' shares
    # (migrate._freed_nodes). False: the replicas' shares alone, the rule before 2026-12-07,
    # which left one replica alone on an on-demand node for hours.
    migrate_freed_nodes: bool = True
    # lp's drain of an under-used node whose work no running node can take may count a new
    # node of a cheaper pool of its cluster as the receiver (Karpenter's replace; the work is
    # placed again by the next epoch, consolidate.py). False: running receivers only, the
    # rule before 2026-12-07, which kept an 8-GPU node up for hours for half its GPUs' work.
    consolidate_replace: bool = True
    # A "better" move must also save at least this much per hour (a restart is not worth
    # cents), and at most this fraction of the running workloads (at least one) moves for
    # "better" per epoch: a disruption budget, as Karpenter's default `budgets: nodes: 10%`.
    migration_min_saving_usd_per_hour: float = 0.05
    migration_budget_fraction: float = 0.1


def backoff_s(attempts: int, cfg: DecisionConfig) -> float:
    """Wait after `attempts` unsuccessful attempts (see the module docstring)."""
    if attempts <= 0:
        return 0.0
    return min(cfg.retry_max_s, cfg.retry_base_s * 2.0 ** min(attempts - 1, 30))


def due(w: Workload, now_s: float, cfg: DecisionConfig,
        capacity_changed_s: float | None = None) -> bool:
    """Whether the planner tries `w` this epoch (see the module docstring)."""
    if w.attempts <= 0 or w.last_attempt_s is None:
        return True
    waited = now_s - w.last_attempt_s
    if waited >= backoff_s(w.attempts, cfg) - 1e-9:
        return True
    return capacity_changed_s is not None and capacity_changed_s > w.last_attempt_s \
        and waited >= cfg.retry_min_s - 1e-9


def retries(batch: Sequence[Workload], unplaced: Mapping[str, str], now_s: float,
            cfg: DecisionConfig) -> tuple[Retry, ...]:
    """A Retry for every workload of the solved batch the plan left (partly) unplaced."""
    out = []
    for w in batch:
        reason = unplaced.get(w.id)
        if reason is None:
            continue
        attempts = w.attempts + 1
        out.append(Retry(w.id, not_before_s=now_s + backoff_s(attempts, cfg),
                         attempts=attempts, reason=reason))
    return tuple(out)


def fixed_pool(c: Cluster, p: Pool) -> bool:
    """Fixed hardware (an edge site's): never scaled in or prewarmed, so no policy timer,
    warm pool or spot bias acts on it (placement/observe.py leaves it out of the pools)."""
    return c.is_edge or p.pricing is PricingModel.EDGE


def placed_usage(placements: Iterable[Placement], specs: Mapping[str, Workload]
                 ) -> dict[Pair, tuple[float, float, int]]:
    """CPU, memory and GPUs this epoch's placements put on each (cluster, pool)."""
    out: dict[Pair, tuple[float, float, int]] = {}
    for p in placements:
        w = specs.get(p.workload_id)
        if w is None:
            continue
        r = w.spec.resources
        for a in p.assignments:
            cpu, mem, gpu = out.get((a.cluster, a.pool), (0.0, 0.0, 0))
            out[(a.cluster, a.pool)] = (cpu + r.cpu * a.replicas,
                                        mem + r.memory_gib * a.replicas, gpu + r.gpu * a.replicas)
    return out


def forecast_rate(snapshot: FederationSnapshot, cfg: DecisionConfig, cluster: str,
                  pool: str) -> tuple[float, float]:
    """(vCPU/s, GPU/s) rate the prewarm forecast extrapolates for one pool: its demand rate
    minus its release rate with `cfg.net_forecast` (either may be negative then), else its
    demand rate alone."""
    cpu, gpu = snapshot.demand_of(cluster, pool)
    if not cfg.net_forecast:
        return cpu, gpu
    out_cpu, out_gpu = snapshot.freed_of(cluster, pool)
    return cpu - out_cpu, gpu - out_gpu


def _forecast(p: Pool, placed: Mapping[Pair, tuple[float, float, int]], key: Pair,
              demand: tuple[float, float]) -> tuple[float, float, float]:
    """(used, demand rate per s, unit) of a pool in its bottleneck unit (GPUs for GPU
    pools, else vCPU), this epoch's placements included: the prewarm forecast's inputs
    (`demand`: the pool's (vCPU/s, GPU/s) rates, `forecast_rate`)."""
    cpu, _, gpu = placed.get(key, (0.0, 0.0, 0))
    if p.node.gpu:
        return float(p.used.gpu + gpu), demand[1], float(p.node.gpu)
    return p.used.cpu + cpu, demand[0], p.node.cpu


def _forecast_keeps(p: Pool, placed: Mapping[Pair, tuple[float, float, int]], key: Pair,
                    demand: tuple[float, float], lead_s: float, nodes: int) -> int:
    """How many of `nodes` the prewarm forecast over `lead_s` needs (module docstring):
    the fewest n with floor((used + rate * lead - n * unit) / unit + 1/2) <= 0."""
    used, rate, unit = _forecast(p, placed, key, demand)
    if unit <= 0:
        return 0
    need = used + max(0.0, rate) * max(0.0, lead_s)
    return max(0, min(nodes, math.floor(need / unit - 0.5 + 1e-9) + 1))


def forecast_floor(snapshot: FederationSnapshot,
                   placed: Mapping[Pair, tuple[float, float, int]],
                   action: PolicyAction, cfg: DecisionConfig) -> Callable[[Cluster, Pool], int]:
    """Nodes of a pool the prewarm forecast needs over the policy's lead (what `scale_in`
    keeps with `forecast`), as a function of (cluster, pool): lp's drains never take a pool
    below it (placement/consolidate.py), so a node drained now is not ordered back by the
    next epoch's prewarm."""
    lead = max(0.0, action.prewarm_lead_s)

    def floor(c: Cluster, p: Pool) -> int:
        return _forecast_keeps(p, placed, (c.name, p.name),
                               forecast_rate(snapshot, cfg, c.name, p.name), lead, p.nodes)
    return floor


def bounded_action(action: PolicyAction, cfg: DecisionConfig) -> PolicyAction:
    """`action` with every idle timer it sets raised to `cfg.policy_idle_min_s`: what
    plan_epoch plans with, so scale-in and the packing model's node charge (candidates.py,
    boot plus idle timer) read the same timer. Timers it does not set stay unset."""
    low = cfg.policy_idle_min_s
    if not any(v < low for v in action.idle_timeout_s.values()) and not any(
            v < low for m in action.pool_idle_timeout_s.values() for v in m.values()):
        return action
    return dataclasses.replace(
        action,
        idle_timeout_s={c: max(low, v) for c, v in action.idle_timeout_s.items()},
        pool_idle_timeout_s={c: {p: max(low, v) for p, v in m.items()}
                             for c, m in action.pool_idle_timeout_s.items()})


def scale_in(snapshot: FederationSnapshot, cfg: DecisionConfig,
             placed: Mapping[Pair, tuple[float, float, int]],
             growing: set[Pair], action: PolicyAction | None = None, *,
             forecast: bool = False, memo: PlanMemo | None = None) -> tuple[PoolScaleIn, ...]:
    """Nodes idle past their timer (see the module docstring), longest idle first; with
    `forecast`, never below what the prewarm forecast needs over the policy's lead, and
    after `forecast_idle_s` instead of `scale_in_idle_s` where the policy sets no timer.
    Only pools with empty nodes are looked at (the option table counts them)."""
    now = snapshot.now_s
    lead = max(0.0, action.prewarm_lead_s) if action is not None else 0.0
    default = cfg.forecast_idle_s if forecast else cfg.scale_in_idle_s
    options, table = options_and_table(snapshot, memo)
    out = []
    for j in np.flatnonzero((table.empty > 0) & ~table.fixed).tolist():
        o = options[j]
        c, p = o.cluster, o.pool
        if (c.name, p.name) in growing:
            continue
        empty = p.empty_nodes
        timer, warm = default, 0
        if action is not None:
            timer = max(0.0, action.for_pool("idle_timeout_s", c.name, p.name, default))
            warm = max(0, int(action.for_pool("warm_nodes", c.name, p.name, 0.0)))
        idle = [n for n in empty if now - (n.idle_since_s or 0.0) >= timer - 1e-9]
        if len(empty) - len(idle) < warm:  # the warm pool: keep the newest idle ones
            idle.sort(key=lambda n: (n.idle_since_s or 0.0, n.name))
            idle = idle[:max(0, len(empty) - warm)]
        if not idle:
            continue
        cpu, mem, _ = placed.get((c.name, p.name), (0.0, 0.0, 0))
        free_cpu = p.free.cpu - cpu
        free_mem = p.free.memory_gib - mem
        k = int(min(free_cpu // max(p.node.cpu, 1e-9),
                    free_mem // max(p.node.memory_gib, 1e-9)))
        if forecast:
            k = min(k, p.nodes - _forecast_keeps(
                p, placed, (c.name, p.name), forecast_rate(snapshot, cfg, c.name, p.name), lead,
                p.nodes))
        if k <= 0:
            continue
        idle.sort(key=lambda n: (n.idle_since_s or 0.0, n.name))
        out.append(PoolScaleIn(c.name, p.name, tuple(n.name for n in idle[:k])))
    return tuple(out)


def prewarm_nodes(snapshot: FederationSnapshot, action: PolicyAction, cfg: DecisionConfig,
                  placed: Mapping[Pair, tuple[float, float, int]],
                  scale: Sequence[PoolScale], memo: PlanMemo | None = None
                  ) -> tuple[Prewarm, ...]:
    """Nodes ordered ahead of forecast demand (see the module docstring), for every pool at
    once over the option table (the arithmetic of `_forecast`, element by element)."""
    lead = max(0.0, action.prewarm_lead_s)
    if lead <= 0:
        return ()
    options, table = options_and_table(snapshot, memo)
    n_o = len(options)
    if not n_o:
        return ()
    at = table.option_of
    added = np.zeros(n_o)
    for sc in scale:
        j = at.get((sc.cluster, sc.pool))
        if j is not None:
            added[j] += max(0, sc.add_nodes)
    put_cpu, put_gpu = np.zeros(n_o), np.zeros(n_o)
    for key, (cpu, _, gpu) in placed.items():
        j = at.get(key)
        if j is not None:
            put_cpu[j], put_gpu[j] = cpu, gpu
    rates = np.array([forecast_rate(snapshot, cfg, *key) for key in at],
                     dtype=np.float64).reshape(-1, 2)
    is_gpu = table.node[:, 2] != 0
    used = np.where(is_gpu, table.used_gpu + put_gpu, table.used_cpu + put_cpu)
    rate = np.where(is_gpu, rates[:, 1], rates[:, 0])
    unit = np.where(is_gpu, table.node[:, 2], table.node[:, 0])
    ok = table.healthy & ~table.fixed & (rate > 0) & (unit > 0)
    nodes = table.nodes + added
    with np.errstate(divide="ignore", invalid="ignore"):
        overflow = used + rate * lead - nodes * unit
        count = np.minimum(np.minimum(np.floor(overflow / unit + 0.5),
                                      np.maximum(1.0, np.trunc(table.max_nodes
                                                               * cfg.prewarm_max_fraction))),
                           table.max_nodes - nodes)
    out = []
    for j in np.flatnonzero(ok & (count > 0)).tolist():
        o = options[j]
        out.append(Prewarm(o.cluster.name, o.pool.name, nodes=int(count[j]), reason="forecast"))
    return tuple(out)


def prewarm_for_placements(snapshot: FederationSnapshot, placements: Iterable[Placement],
                           specs: Mapping[str, Workload]) -> tuple[Prewarm, ...]:
    """Images and data of placed workloads that wait on new nodes or data (module doc)."""
    clusters = {c.name: c for c in snapshot.clusters}
    out = []
    for p in placements:
        w = specs.get(p.workload_id)
        if w is None:
            continue
        for a in p.assignments:
            c = clusters.get(a.cluster)
            if c is None or c.is_edge or a.pricing is PricingModel.EDGE:
                continue
            if a.new_nodes <= 0 and not w.spec.data:
                continue
            out.append(Prewarm(a.cluster, a.pool, images=(w.spec.image,), data=w.spec.data,
                               workload_id=w.id, reason="placement"))
    return tuple(out)
