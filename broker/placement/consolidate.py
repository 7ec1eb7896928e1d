"""Scale-down of nodes that still run work, as the baselines' autoscalers do it. Pure.

Why: a policy that copies Cluster Autoscaler or Karpenter must also copy how they give nodes
back, or the comparison credits them with nodes they would have removed (or charges them for
nodes they would have kept). Pools are made of nodes, so a node with replicas can only go
when its replicas are drained and fit elsewhere; this module decides which nodes; the shells
drain them (their replicas are evicted and placed again, as `kubectl drain` does) and remove
them.

- `karpenter` (Karpenter v1 defaults, `consolidationPolicy: WhenEmptyOrUnderutilized`,
  `consolidateAfter: 0s`, disruption budget `nodes: 10%`, feature gate
  `SpotToSpotConsolidation=false`). Karpenter simulates rescheduling a candidate's pods
  (`computeConsolidation` in kubernetes-sigs/karpenter pkg/controllers/disruption/
  consolidation.go): if they fit on the other nodes it deletes the node; if they need exactly
  one new node it replaces the node by it, provided that node is cheaper. Both paths here:
  - delete: a ready cloud node whose requests fit in the free room of the pool's other ready
    nodes is drained and removed at once. Candidates least utilised first; receivers are not
    candidates.
  - replace (`replacements`): a ready, busy on-demand node whose reported workloads
    (`NodeState.workloads`, specs in `snapshot.workloads`; a node that does not say is left
    alone) all fit on one node of another pool of the same cluster that they tolerate (spot
    only if every one is `spot_ok`; their GPU model, GPU interconnect and GPU set on an empty
    node) and that is cheaper (`launchPrice < candidatePrice`,
    `RemoveInstanceTypeOptionsByPriceAndMinValues`) gets the cheapest such node, which the
    pool can still add (max_nodes, the cluster's quota). A spot node is never replaced: a
    spot candidate whose replacement may be spot goes to `computeSpotToSpotConsolidation`,
    which does nothing while the gate is off (its default), even when an on-demand type is
    cheaper. Only in pools nothing is deleted from this epoch (one command at a time, as
    Karpenter's disruption loop), candidates least utilised first.
  The disruption budget is shared: at most ceil(10 % of the pool's nodes) per epoch
  (Karpenter scales percentage budgets rounding up), less the pool's nodes already being
  replaced (leaving: Karpenter subtracts the nodes marked for deletion,
  `BuildDisruptionBudgets` in helpers.go). What is not modelled: multi-node consolidation
  (several nodes -> one), pods split between the other nodes and the new one (the new node
  takes all of the candidate's pods), the budget's NodePool scope (here per pool) and its
  count of initialized nodes only.
- `traditional` (Cluster Autoscaler defaults, `--scale-down-utilization-threshold=0.5`,
  `--scale-down-unneeded-time=10m`): a ready cloud node whose utilisation (the larger of
  requested / allocatable CPU and memory; GPUs for GPU nodes) has been below 0.5 for 10 min
  (`NodeState.underused_since_s`) and whose requests fit on the pool's other nodes is
  removed; one non-empty node per cluster per epoch (`--max-drain-parallelism` default 1).

- `lp` (packing, this planner's own rule): a ready cloud node under Cluster Autoscaler's 0.5
  utilisation whose requests fit whole on one other node of its cluster, of any pool its
  workloads tolerate (`tolerates`), is drained only when (1) every workload it reports
  (`NodeState.workloads`; a node that does not say is left alone) is restartable: a batch
  or training job that accepts spot (`spot_ok`: it has agreed to be stopped and restarted,
  which is what a checkpointing job does), so no service is ever drained and none drops
  below its replicas; and (2) the saving pays the restart: the node's price over the hours
  its longest job still has (`durations.remaining_s` of its predicted run time and its age
  since submission: what the prediction leaves, or as long again as it has been there once
  it outlives it; at most the objective horizon) exceeds the restart cost, each job's whole
  run rate (`Placement.cost_usd_per_hour`: a gang restarts whole; where the snapshot holds
  no price for it, `share_rate`) over its lost work (`lost_work_s`: its age until its first
  checkpoint, then RESTART_LOST_S, half of an assumed 30-minute checkpoint interval,
  CHECKPOINT_INTERVAL_S, an assumption stated as one), plus the receiver's extra paid time
  (`extension_usd`: the receiver stays up until the moved work ends, where its own work
  would have let it go earlier; nothing when its own work outlasts it). At most ceil(10 %)
  of a pool's nodes per epoch (Karpenter's default disruption budget), and never below the
  nodes the pool's prewarm forecast needs (`decisions.forecast_floor`: a node drained now
  would be ordered back); the receiver is the one whose paid time the move extends least
  (then best fit), its room is then taken, and a receiver is not drained in the same epoch
  (`_lp_cluster`). Where no running node can take the work, the receiver may be a new node
  of a cheaper pool of the cluster (Karpenter's replace, `_replacement`: it takes all the
  node's requests, its workloads tolerate it, the pool and quota can add it), charged its
  price over its boot (as the node charge counts it: candidates.boot_estimates) and the
  moved work's hours, plus the work's run rate over the boot
  (break-before-make: the drained work is placed again by the next epoch, which may choose
  any option; `DecisionConfig.consolidate_replace`). The policy may move the 0.5 threshold
  per cluster (`PolicyAction.consolidate_below`: when to consolidate; 0 never drains); the
  restart condition (2) holds whatever it says.

For karpenter and traditional, "fit" is checked on the aggregate free room of the receivers
(CPU, memory, GPUs) and the largest free GPU set of one receiver for the node's GPUs: the
node's own per-pod layout is not in the snapshot. Receivers are the pool's other usable
nodes but those drained, or scaled in as idle, this epoch, and the room the nodes drained
before a candidate take is no longer free for it (one simulation over the epoch's removals,
as Karpenter's scheduling simulation
and Cluster Autoscaler's removal simulation exclude the nodes they remove).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from broker.domain import (
    Cluster,
    FederationSnapshot,
    NodeLeaving,
    NodeState,
    Pool,
    PricingModel,
    Workload,
    WorkloadKind,
)
from broker.placement import durations
from broker.placement.candidates import NODE_BOOT_S, boot_estimates
from broker.placement.feasibility import (
    gpu_class,
    pool_taints,
    sets_per_new_node,
    tolerates_all,
    tolerations_of,
)
from broker.placement.kinds import NodeReplace, PoolScaleIn

Pair = tuple[str, str]
CA_UTILIZATION_THRESHOLD = 0.5
CA_UNNEEDED_S = 600.0
CA_MAX_DRAIN = 1
KARPENTER_BUDGET_FRACTION = 0.1
# A restartable job checkpoints every 30 minutes: an assumption (no public trace gives it;
# the twin's world model, sim/engine.py, resumes a stopped job from its last checkpoint).
CHECKPOINT_INTERVAL_S = 1800.0
# Work a restarted job loses on average: half a checkpoint interval (the `lp` rule).
RESTART_LOST_S = CHECKPOINT_INTERVAL_S / 2
# Hours the `lp` rule counts a drained node's saving over at most (PlannerConfig's default
# service horizon: what the objective prices a node over).
SAVING_HORIZON_H = 1.0


@dataclass(frozen=True, slots=True)
class _Room:
    cpu: float
    mem: float
    gpu: int
    largest_gpu: int


def utilization(n: NodeState, p: Pool) -> float:
    """Cluster Autoscaler's node utilisation: GPUs on GPU nodes, else max(CPU, memory)."""
    if p.node.gpu > 0:
        return (p.node.gpu - n.gpu_free) / p.node.gpu
    cpu = n.cpu_allocated / p.node.cpu if p.node.cpu > 0 else 0.0
    mem = n.memory_allocated_gib / p.node.memory_gib if p.node.memory_gib > 0 else 0.0
    return max(cpu, mem)


def _busy(n: NodeState, p: Pool) -> bool:
    return n.cpu_allocated > 1e-9 or n.memory_allocated_gib > 1e-9 or n.gpu_free < p.node.gpu


def _usable(n: NodeState) -> bool:
    return not n.booting and n.leaving is NodeLeaving.NO


def _room(receivers: Sequence[NodeState], p: Pool) -> _Room:
    return _Room(sum(p.node.cpu - n.cpu_allocated for n in receivers),
                 sum(p.node.memory_gib - n.memory_allocated_gib for n in receivers),
                 sum(n.gpu_free for n in receivers),
                 max((n.gpu_free for n in receivers), default=0))


def _fits(n: NodeState, p: Pool, room: _Room) -> bool:
    gpu_used = p.node.gpu - n.gpu_free
    return (n.cpu_allocated <= room.cpu + 1e-9 and n.memory_allocated_gib <= room.mem + 1e-9
            and gpu_used <= room.gpu and (gpu_used == 0 or gpu_used <= room.largest_gpu))


def _pool_nodes(c: Cluster, p: Pool, now_s: float, *, max_nodes: int,
                underused_for_s: float | None,
                removing: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Nodes of one pool to drain and remove (the module docstring's rule)."""
    usable = [n for n in p.node_states if _usable(n) and n.name not in removing]
    cands = [n for n in usable if _busy(n, p)]
    if underused_for_s is not None:
        cands = [n for n in cands if utilization(n, p) < CA_UTILIZATION_THRESHOLD
                 and n.underused_since_s is not None
                 and now_s - n.underused_since_s >= underused_for_s - 1e-9]
    return _drain(cands, usable, p, max_nodes)


def _drain(cands: list[NodeState], usable: Sequence[NodeState], p: Pool,
           max_nodes: int) -> tuple[str, ...]:
    """Up to `max_nodes` of `cands`, least utilised first, each whose requests fit in the
    room the other usable nodes have left: neither a drained node nor one `removing` (gone
    this epoch: the caller left it out of `usable`) receives, and the requests of the nodes
    drained before it are taken out of the room first (one simulation, as the autoscalers'
    scale-down simulations do)."""
    cands = sorted(cands, key=lambda n: (utilization(n, p), n.name))
    chosen: list[NodeState] = []
    moved = _Room(0.0, 0.0, 0, 0)
    for n in cands:
        if len(chosen) >= max_nodes:
            break
        others = [r for r in usable if r.name != n.name and r not in chosen]
        room = _room(others, p)
        room = _Room(room.cpu - moved.cpu, room.mem - moved.mem, room.gpu - moved.gpu,
                     room.largest_gpu)
        if not others or not _fits(n, p, room):
            continue
        chosen.append(n)
        moved = _Room(moved.cpu + n.cpu_allocated, moved.mem + n.memory_allocated_gib,
                      moved.gpu + p.node.gpu - n.gpu_free, 0)
    return tuple(n.name for n in chosen)


def restartable(w: Workload | None) -> bool:
    """A batch or training job that accepts being stopped and restarted (the `lp` rule)."""
    return w is not None and w.spec.kind is not WorkloadKind.SERVICE and w.spec.spot_ok


class _LpRule:
    """What the `lp` rule reads from the snapshot, computed once per epoch (not per node):
    the ids of restartable workloads, each running workload's run rate, and (for a new
    receiver) each pool's boot as the node charge counts it (candidates.boot_estimates,
    from `node_boot_s` and, with `observed_boot`, the pools' measured boots)."""

    def __init__(self, snapshot: FederationSnapshot, *, node_boot_s: float = NODE_BOOT_S,
                 observed_boot: bool = True) -> None:
        self.snapshot = snapshot
        self.movable = frozenset(wid for wid, w in snapshot.workloads.items()
                                 if restartable(w))
        self._rate: dict[str, float] | None = None
        self._boot_args = (node_boot_s, observed_boot)
        self._boots: dict[tuple[str, str], float] | None = None

    def boot_h(self, c: Cluster, q: Pool) -> float:
        """Hours a new node of `q` takes to boot (and is paid for before it runs anything)."""
        if self._boots is None:
            default, observed = self._boot_args
            self._boots = boot_estimates(self.snapshot.clusters, default, observed=observed)
        return self._boots.get((c.name, q.name), self._boot_args[0]) / 3600.0

    def rate(self) -> Mapping[str, float]:
        if self._rate is None:
            self._rate = {pl.workload_id: pl.cost_usd_per_hour
                          for pl in self.snapshot.running}
        return self._rate

    def left_h(self, n: NodeState, p: Pool) -> float:
        """Hours until the last workload on `n` is expected to end (`durations.remaining_s`
        of its predicted run time and its age since submission); infinite when a service
        or a workload the snapshot does not describe runs there, or the busy node does not
        say what runs on it; 0 on an empty node."""
        if not n.workloads:
            return math.inf if _busy(n, p) else 0.0
        snapshot = self.snapshot
        left = 0.0
        for wid in n.workloads:
            w = snapshot.workloads.get(wid)
            if w is None or w.spec.kind is WorkloadKind.SERVICE:
                return math.inf
            left = max(left, durations.remaining_s(w.spec.duration_s,
                                                   snapshot.now_s - w.submitted_s) / 3600.0)
        return left

    def lost_h(self, n: NodeState) -> float:
        """Hours of work the longest-lived of `n`'s workloads loses if stopped now
        (`lost_work_s` of its age since submission); `n` is a candidate: it reports
        workloads, all in the snapshot (restartable)."""
        specs = self.snapshot.workloads
        return max(lost_work_s(self.snapshot.now_s - specs[w].submitted_s)
                   for w in n.workloads) / 3600.0

    def restart_usd(self, n: NodeState, p: Pool) -> float:
        """What a restart of `n`'s workloads loses: each one's whole run rate (a gang
        restarts whole) over the work it has done since its last checkpoint
        (`lost_work_s`)."""
        specs = self.snapshot.workloads
        now = self.snapshot.now_s
        return sum(self.rate_of(w, p) * lost_work_s(now - specs[w].submitted_s)
                   for w in n.workloads) / 3600.0

    def rate_of(self, wid: str, p: Pool) -> float:
        """USD/h of one workload on `p`: its placement's whole run rate (a gang restarts
        whole), or `share_rate` where the snapshot holds no price for it."""
        rate = self.rate()
        return rate[wid] if wid in rate else share_rate(self.snapshot.workloads[wid], p)

    def run_rate(self, n: NodeState, p: Pool) -> float:
        """USD/h of `n`'s workloads together: what each hour they wait stopped costs."""
        return sum(self.rate_of(w, p) for w in n.workloads)

    def saving_usd(self, n: NodeState, p: Pool) -> float:
        """The node's price over the hours its longest job still has (at most the objective
        horizon): what removing it now saves if its work costs nothing elsewhere."""
        return p.price_usd_per_hour * min(SAVING_HORIZON_H, max(0.0, self.left_h(n, p)))

    def worth_draining(self, n: NodeState, p: Pool) -> bool:
        """The `lp` rule's conditions (1) and (2) for one node, before the receiver's share
        (module docstring): all restartable, and the saving beats the restart."""
        if not n.workloads or not self.movable.issuperset(n.workloads):
            return False  # (1): cheap, and what rules out almost every node
        return self.saving_usd(n, p) > self.restart_usd(n, p) + 1e-9

    def extension_usd(self, n: NodeState, p: Pool, r: NodeState, q: Pool) -> float:
        """What moving `n`'s work onto receiver `r` (pool `q`) costs in `r`'s paid time: `r`
        stays up until the moved work ends (its remaining hours plus the rerun of the lost
        work) where its own work would have let it go earlier."""
        moved_h = self.left_h(n, p) + self.lost_h(n)
        extra_h = min(SAVING_HORIZON_H, max(0.0, moved_h - self.left_h(r, q)))
        return q.price_usd_per_hour * extra_h


def lost_work_s(age_s: float) -> float:
    """Seconds of work a restartable job of this age (since submission: the snapshot's only
    clock for it) loses when stopped now: all of it before its first checkpoint, then half
    a CHECKPOINT_INTERVAL_S on average (RESTART_LOST_S)."""
    age = max(0.0, age_s)
    return age if age < CHECKPOINT_INTERVAL_S else RESTART_LOST_S


def share_rate(w: Workload, p: Pool) -> float:
    """USD/h of a workload's replicas at its dominant share of one of `p`'s nodes (what the
    planner charges a replica, candidates.py): the run rate where the snapshot holds no
    placement price for it (the twin lists running services only)."""
    r, node = w.spec.resources, p.node
    share = max(r.cpu / node.cpu if node.cpu > 0 else 0.0,
                r.memory_gib / node.memory_gib if node.memory_gib > 0 else 0.0,
                r.gpu / node.gpu if node.gpu > 0 else 0.0)
    return share * p.price_usd_per_hour * w.spec.replicas


def _lp_cluster(c: Cluster, rule: _LpRule, threshold: float, removing: frozenset[str],
                skip: frozenset[Pair] | set[Pair],
                floor: Callable[[Cluster, Pool], int] | None = None, *,
                replace: bool = True) -> list[PoolScaleIn]:
    """Nodes of one cluster the `lp` rule drains (module docstring), under `threshold` use.

    A candidate's requests must fit whole on one receiver: a usable node of a pool of the
    cluster that tolerates all of its workloads (`tolerates`: its own pool, or another of a
    shape, GPU model and pricing they accept), so a job left alone on a big node may move to
    another pool's free room. The receiver is the one whose paid time the move extends least
    (`_LpRule.extension_usd`), then best fit (least free vCPU); the node goes only if its
    saving beats the restart plus that extension; the receiver's room is then taken, and a
    receiver is not drained in the same epoch. Each pool drains
    at most ceil(10 %) of its nodes, and never below `floor` (the nodes its forecast needs,
    less those going idle this epoch). The restartable test goes first: it is a set lookup
    and rules out the nodes that run services (nearly all), so the receivers are listed only
    when a candidate qualifies.
    """
    if threshold <= 0 or not any(p.reports_workloads for p in c.pools):
        return []  # no node says what runs on it: no candidate (the twin's non-housekeeping)
    pools = [p for p in c.pools if p.pricing is not PricingModel.EDGE and p.node_states]
    movable = rule.movable
    cands = [(n, p) for p in pools if (c.name, p.name) not in skip and p.reports_workloads
             for n in p.node_states
             if n.workloads and movable.issuperset(n.workloads) and _usable(n)
             and _busy(n, p) and utilization(n, p) < threshold and rule.worth_draining(n, p)]
    if not cands:
        return []
    cands.sort(key=lambda np_: (utilization(np_[0], np_[1]), np_[1].name, np_[0].name))
    # Free room per receiver, (pool, node) -> [vCPU, GiB, GPUs, largest free GPU set].
    free = {(q.name, r.name): [q.node.cpu - r.cpu_allocated,
                               q.node.memory_gib - r.memory_allocated_gib,
                               float(r.gpu_free), float(r.largest_free_gpu_set or r.gpu_free)]
            for q in pools for r in q.node_states if _usable(r) and r.name not in removing}
    states = {(q.name, r.name): r for q in pools for r in q.node_states}
    by_name = {q.name: q for q in pools}
    chosen: dict[str, list[str]] = {}
    kept: set[tuple[str, str]] = set()  # receivers: never drained in the same epoch
    specs = rule.snapshot.workloads
    caps: dict[str, int] = {}
    quota = _Quota(c) if replace else None  # the new nodes replacements would take
    for n, p in cands:
        picked = chosen.setdefault(p.name, [])
        cap = caps.get(p.name)
        if cap is None:
            cap = math.ceil(KARPENTER_BUDGET_FRACTION * len(p.node_states))
            if floor is not None:
                going = sum(1 for m in p.node_states if m.name in removing)
                cap = min(cap, p.nodes - going - floor(c, p))
            caps[p.name] = cap
        if (p.name, n.name) in kept or len(picked) >= cap:
            continue
        wls = [specs[w] for w in n.workloads]
        tolerant = {q.name for q in pools if all(tolerates(w, c, q) for w in wls)}
        gpu_used = p.node.gpu - n.gpu_free
        fits = [key for key, room in free.items()
                if key[0] in tolerant and key != (p.name, n.name)
                and n.cpu_allocated <= room[0] + 1e-9 and n.memory_allocated_gib <= room[1]
                + 1e-9 and gpu_used <= room[2] and gpu_used <= room[3]]
        if not fits:
            # No running node takes it: a new node of a cheaper pool may (Karpenter's
            # replace), paid for the moved work's hours and its boot, which the work waits.
            if quota is None:
                continue
            target = _replacement(c, p, n, wls, quota)
            if target is None:
                continue
            boot_h = rule.boot_h(c, target)
            moved_h = boot_h + rule.left_h(n, p) + rule.lost_h(n)
            cost = target.price_usd_per_hour * min(SAVING_HORIZON_H, moved_h) \
                + rule.run_rate(n, p) * boot_h
            if rule.saving_usd(n, p) <= cost + rule.restart_usd(n, p) + 1e-9:
                continue
            quota.take(target)
            free.pop((p.name, n.name), None)
            picked.append(n.name)
            continue
        # The receiver whose paid time the move extends least (one whose own work outlasts
        # the moved work costs nothing more), then best fit (least free vCPU).
        cost, key = min((rule.extension_usd(n, p, states[k], by_name[k[0]]), free[k][0], k)
                        for k in fits)[::2]
        if rule.saving_usd(n, p) <= cost + rule.restart_usd(n, p) + 1e-9:
            continue
        room = free[key]
        room[0] -= n.cpu_allocated
        room[1] -= n.memory_allocated_gib
        room[2] -= gpu_used
        room[3] = max(0.0, room[3] - gpu_used)
        kept.add(key)
        free.pop((p.name, n.name), None)
        picked.append(n.name)
    return [PoolScaleIn(c.name, p.name, tuple(chosen[p.name]), reason="consolidate")
            for p in pools if chosen.get(p.name)]


def consolidations(snapshot: FederationSnapshot, policy: str,
                   skip: frozenset[Pair] | set[Pair] = frozenset(),
                   budget: Mapping[str, float] | None = None,
                   below: Mapping[str, float] | None = None,
                   removing: Sequence[PoolScaleIn] = (),
                   floor: Callable[[Cluster, Pool], int] | None = None,
                   replace: bool = True, node_boot_s: float = NODE_BOOT_S,
                   observed_boot: bool = True,
                   ) -> tuple[PoolScaleIn, ...]:
    """PoolScaleIn(reason="consolidate") of non-empty nodes for `policy` (module docstring);
    () for policies without such a rule. Pools in `skip` (growing this epoch) are left.
    `below`: the `lp` rule's utilisation threshold per cluster (PolicyAction.consolidate_below;
    missing clusters: CA_UTILIZATION_THRESHOLD). `removing`: this epoch's other scale-ins
    (the idle nodes going): their nodes receive nothing. `floor`: the nodes each pool keeps
    whatever the `lp` rule says (decisions.forecast_floor: what the forecast needs).
    `replace`: the `lp` rule may drain a node no running node can take the work of onto a
    new node of a cheaper pool (DecisionConfig.consolidate_replace), whose boot counts as the
    node charge counts it (`node_boot_s`: PlannerConfig.node_boot_s; `observed_boot`:
    DecisionConfig.observed_boot)."""
    if policy not in ("karpenter", "traditional", "lp"):
        return ()
    gone = frozenset(n for si in removing for n in si.nodes)
    fraction = (budget or {}).get("karpenter", KARPENTER_BUDGET_FRACTION)
    rule = _LpRule(snapshot, node_boot_s=node_boot_s, observed_boot=observed_boot) \
        if policy == "lp" else None
    out = []
    for c in snapshot.clusters:
        if c.is_edge or not c.healthy:
            continue
        if rule is not None:
            out += _lp_cluster(c, rule, (below or {}).get(c.name, CA_UTILIZATION_THRESHOLD),
                               gone, skip, floor, replace=replace)
            continue
        drains = CA_MAX_DRAIN  # Cluster Autoscaler drains one non-empty node per cluster
        for p in c.pools:
            if p.pricing is PricingModel.EDGE or (c.name, p.name) in skip or not p.node_states:
                continue
            if policy == "karpenter":
                names = _pool_nodes(c, p, snapshot.now_s, max_nodes=_budget(p, fraction),
                                    underused_for_s=None, removing=gone)
            else:
                if drains <= 0:
                    break
                names = _pool_nodes(c, p, snapshot.now_s, max_nodes=drains,
                                    underused_for_s=CA_UNNEEDED_S, removing=gone)
                drains -= len(names)
            if names:
                out.append(PoolScaleIn(c.name, p.name, names, reason="consolidate"))
    return tuple(out)


def _budget(p: Pool, fraction: float) -> int:
    """Karpenter's disruption budget for the pool now: ceil(fraction of its nodes), less the
    nodes already leaving (being replaced: Karpenter's `disrupting` count)."""
    leaving = sum(1 for n in p.node_states if n.leaving is not NodeLeaving.NO)
    return max(0, math.ceil(fraction * len(p.node_states)) - leaving)


def replacements(snapshot: FederationSnapshot, policy: str,
                 skip: frozenset[Pair] | set[Pair] = frozenset(),
                 drains: Sequence[PoolScaleIn] = (),
                 budget: Mapping[str, float] | None = None) -> tuple[NodeReplace, ...]:
    """Karpenter's replace path (module docstring): NodeReplace of on-demand nodes by one
    cheaper node each; () for other policies. Pools in `skip` (growing this epoch) and pools
    `drains` (this epoch's deletions) takes nodes from are left."""
    if policy != "karpenter":
        return ()
    fraction = (budget or {}).get("karpenter", KARPENTER_BUDGET_FRACTION)
    draining = {(d.cluster, d.pool) for d in drains if d.nodes}
    out: list[NodeReplace] = []
    for c in snapshot.clusters:
        if c.is_edge or not c.healthy:
            continue
        room = _Quota(c)
        for p in c.pools:
            if p.pricing is not PricingModel.ON_DEMAND or (c.name, p.name) in skip \
                    or (c.name, p.name) in draining or not p.node_states:
                continue
            limit = _budget(p, fraction)
            cands = [n for n in p.node_states if _usable(n) and _busy(n, p)] if limit else []
            cands.sort(key=lambda n: (utilization(n, p), n.name))
            for n in cands:
                if limit <= 0:
                    break
                pods = _pods(n, snapshot)
                target = _replacement(c, p, n, pods, room) if pods else None
                if target is None:
                    continue
                room.take(target)
                limit -= 1
                out.append(NodeReplace(c.name, p.name, n.name, target.name,
                                       saving_usd_per_hour=p.price_usd_per_hour
                                       - target.price_usd_per_hour))
    return tuple(out)


class _Quota:
    """What a cluster may still add this epoch: nodes per pool, vCPU and GPU quota."""

    def __init__(self, c: Cluster) -> None:
        self.added: dict[str, int] = {}
        self.cpu = math.inf if c.quota_vcpu is None else \
            c.quota_vcpu - sum(p.node.cpu * p.nodes for p in c.pools)
        self.gpu = math.inf if c.quota_gpu is None else \
            c.quota_gpu - sum(p.node.gpu * p.nodes for p in c.pools)

    def fits(self, q: Pool) -> bool:
        return (q.can_add_nodes - self.added.get(q.name, 0) > 0
                and q.node.cpu <= self.cpu + 1e-9 and q.node.gpu <= self.gpu + 1e-9)

    def take(self, q: Pool) -> None:
        self.added[q.name] = self.added.get(q.name, 0) + 1
        self.cpu -= q.node.cpu
        self.gpu -= q.node.gpu


def _pods(n: NodeState, snapshot: FederationSnapshot) -> tuple[Workload, ...]:
    """The specs of what runs on `n`; () when the node does not say or a spec is unknown."""
    out = []
    for wid in n.workloads:
        w = snapshot.workloads.get(wid)
        if w is None:
            return ()
        out.append(w)
    return tuple(out)


def tolerates(w: Workload, c: Cluster, q: Pool) -> bool:
    """A workload may run on a node of pool `q` of its own cluster `c`: the pool-level part
    of the candidates' hard constraints (spot, GPU model, interconnect, GPU set, the pool's
    taints: feasibility.pool_taints); the cluster's taints, labels and tenancy are the same
    for every pool of the cluster."""
    spec = w.spec
    if q.pricing is PricingModel.SPOT and not spec.spot_ok:
        return False
    if not tolerates_all(tolerations_of(spec), pool_taints(c, q)):
        return False
    if spec.gpu_model and (q.gpu_model or "").lower() != spec.gpu_model.lower():
        return False
    r = spec.resources
    if r.cpu > q.node.cpu + 1e-9 or r.memory_gib > q.node.memory_gib + 1e-9 \
            or r.gpu > q.node.gpu:
        return False
    if r.gpu > 1 and spec.interconnect.rank > q.interconnect.rank:
        return False
    cls = gpu_class(w)
    return cls is None or sets_per_new_node(q, cls) > 0


def _replacement(c: Cluster, p: Pool, n: NodeState, pods: Sequence[Workload],
                 room: _Quota) -> Pool | None:
    """The cheapest pool of `c` one of whose nodes takes all of `n`'s requests, that `n`'s
    workloads tolerate, that can still add a node, and that costs less than `n`'s pool."""
    gpu_used = p.node.gpu - n.gpu_free
    best: Pool | None = None
    for q in c.pools:
        if q.name == p.name or q.pricing is PricingModel.EDGE \
                or q.price_usd_per_hour >= p.price_usd_per_hour - 1e-12:
            continue
        if n.cpu_allocated > q.node.cpu + 1e-9 or n.memory_allocated_gib > q.node.memory_gib \
                + 1e-9 or gpu_used > q.node.gpu or not room.fits(q):
            continue
        if not all(tolerates(w, c, q) for w in pods):
            continue
        if best is None or (q.price_usd_per_hour, q.name) < (best.price_usd_per_hour, best.name):
            best = q
    return best
