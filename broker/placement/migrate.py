"""Which running workloads to move, and where: the planner's migration rules. Pure.

plan_epoch calls `migrations` after the solve, on the same snapshot (`snapshot.running` with
the specs in `snapshot.workloads`), so the live loop and the twin move the same workloads.
A running workload w, placed on pools S with r replicas, is moved (planner.Migration) when,
in this order of precedence:

1. node-loss: one of its replicas is on a node that is leaving (cordoned, NotReady, or
   tainted for termination: `NodeState.leaving`, the workloads in `NodeState.workloads`).
   Any kind. The target avoids the clusters of those nodes (the migrator drains per cluster).
2. slo: a service whose user region's RTT to a cluster it runs on (measured first,
   network.RttResolver) is above its `latency_slo_ms`.
3. recovered: a service failed over from a cluster (`snapshot.displaced`) that is healthy
   again; the target is on such a cluster, and is taken when its running cost there is no
   higher than where it runs now.
4. better: a service for which another feasible option o is clearly cheaper. With the
   per-replica running cost c(o) = compute + latency + bias of the LP's objective (an hour of
   it, candidates.py), the one-off move cost

       m(o) = migration_overlap_h * price(o) * r + egress of its data to o

   the price `freed` of the cloud nodes that run its replicas and nothing else, less their
   replicas' compute shares (`_freed_nodes`: those nodes go once it leaves; its replicas'
   shares counted only part of them; DecisionConfig.migrate_freed_nodes), and the saving
   s = (c(S) - c(o)) * r + freed per hour, it moves only when

       s >= migration_min_saving_fraction * (c(S) * r + freed)   (hysteresis: no flapping)
       s >= migration_min_saving_usd_per_hour           (a restart is not worth cents)
       s * migration_payback_h >= m(o)                  (the move pays for itself)

   and at most `migration_budget_fraction` of the running workloads (at least one) move for
   this reason per epoch (a disruption budget, as Karpenter's), largest saving first.

The target is one (cluster, pool) option, not among S, feasible for every hard constraint
(candidates.py's masks; with `slo_queueing`, planner.SLO_QUEUEING_POLICIES, the latency mask
of a service without `slo_utilization` counts the wait of one replica at the load its spec's
replicas ask for, spread over the r running ones: feasibility.running_slo_utilization) with
room for all r replicas in its free capacity under the policy's headroom after this epoch's
placements and earlier moves (or nodes the pool can still add: `Assignment.new_nodes`; for
"better" only when the move frees nodes, `_replacing`: then the new nodes count at their whole
price and boot, as Karpenter replaces a node by a cheaper one; a node bought to save part of
a node's price is not a saving); the cheapest such option by c(o) + m(o). Workloads with a
spread constraint or a weighted split (one target option would undo their per-cluster
shares), in the pending batch, partly placed (their placement holds fewer replicas than
their spec asks: the rest is pending, as the twin's `movable` requires none pending), or
without a spec are left alone. Vectorised per rule: one candidate build for all workloads
any rule selected, no per-(workload, option) loops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from broker.domain import (
    Assignment,
    FederationSnapshot,
    NodeLeaving,
    Placement,
    PolicyAction,
    Workload,
    WorkloadKind,
)
from broker.placement.candidates import (
    NODE_BOOT_S,
    BoolArray,
    CandidateSet,
    FloatArray,
    build_candidates,
)
from broker.placement.decisions import DecisionConfig
from broker.placement.feasibility import latency_mask, running_slo_utilization
from broker.placement.kinds import Migration
from broker.placement.memo import PlanMemo
from broker.placement.network import RttResolver

Pair = tuple[str, str]
REASONS = frozenset({"node-loss", "slo", "recovered", "better"})
NODE_LOSS_ONLY = frozenset({"node-loss"})


@dataclass(frozen=True, slots=True)
class _Ask:
    """A workload some rule selected: why, and which clusters its target must (not) use."""

    placement: Placement
    workload: Workload
    reason: str
    avoid: frozenset[str] = frozenset()
    only: frozenset[str] | None = None
    placed: int = 0  # replicas its placement holds


def leaving_workloads(snapshot: FederationSnapshot) -> dict[str, set[str]]:
    """workload id -> clusters where one of its replicas is on a leaving node."""
    out: dict[str, set[str]] = {}
    for c in snapshot.clusters:
        for p in c.pools:
            for n in p.node_states:
                if n.leaving is not NodeLeaving.NO:
                    for wid in n.workloads:
                        out.setdefault(wid, set()).add(c.name)
    return out


def _asks(snapshot: FederationSnapshot, reasons: frozenset[str],
          memo: PlanMemo | None = None) -> list[_Ask]:
    """Rules 1-4 of the module docstring: who may move and under which reason."""
    pending = {w.id for w in snapshot.pending}
    workloads = snapshot.workloads
    may_move: list[tuple[Placement, Workload, int]] = []
    for p in snapshot.running:
        w = workloads.get(p.workload_id)
        if w is None or not p.assignments:
            continue
        spec = w.spec
        if w.id in pending or spec.spread is not None or spec.replica_weights:
            continue
        placed = sum([a.replicas for a in p.assignments])
        if placed < spec.replicas:
            continue
        may_move.append((p, w, placed))
    if not may_move:  # e.g. only the batch's partly placed workloads: skip the node scan
        return []
    leaving = leaving_workloads(snapshot)
    healthy = {c.name for c in snapshot.clusters if c.healthy}
    by_name = {c.name: c for c in snapshot.clusters}
    resolver: RttResolver | None = None
    displaced = snapshot.displaced
    movable_only = reasons == NODE_LOSS_ONLY
    out: list[_Ask] = []
    for p, w, placed in may_move:
        if w.id in leaving:
            out.append(_Ask(p, w, "node-loss", avoid=frozenset(leaving[w.id]), placed=placed))
            continue
        spec = w.spec
        if spec.kind is not WorkloadKind.SERVICE or movable_only:
            continue
        slo, region = spec.latency_slo_ms, spec.user_region
        if slo is not None and region is not None:
            if resolver is None:
                resolver = RttResolver(snapshot, memo.rtts(snapshot) if memo is not None
                                       else None)
            if any((r := resolver.rtt_ms(region, by_name[a.cluster])) is not None and r > slo
                   for a in p.assignments if a.cluster in by_name):
                out.append(_Ask(p, w, "slo", placed=placed))
                continue
        if w.id in displaced:
            home = set(displaced[w.id]) & healthy - {a.cluster for a in p.assignments}
            if home:
                out.append(_Ask(p, w, "recovered", only=frozenset(home), placed=placed))
                continue
        out.append(_Ask(p, w, "better", placed=placed))
    return [a for a in out if a.reason in reasons]


def _as_running(w: Workload, running: int) -> Workload:
    """A running workload at its running replica count (the spec itself when they agree)."""
    if w.spec.replicas == running:
        return w
    return replace(w, spec=replace(w.spec, replicas=running))


def _feasible(asks: list[_Ask], cs: CandidateSet, slo_queueing: bool) -> BoolArray:
    """The targets every hard constraint allows; with `slo_queueing` the latency family
    judges each running latency-SLO service at feasibility.running_slo_utilization of its
    spec (the asked replicas' load over the running ones), not at RTT alone: the same mask
    as copying each spec with that `slo_utilization`, without ~1,000 copies an epoch."""
    if not slo_queueing:
        return cs.feasible
    utils = [running_slo_utilization(a.workload.spec, a.placed) for a in asks]
    if all(u is None for u in utils):
        return cs.feasible
    out: BoolArray = cs.feasible & latency_mask(cs.workloads, cs.rtt_ms, utils)
    return out


def _sources(asks: list[_Ask], cs: CandidateSet, running: FloatArray
             ) -> tuple[list[list[int]], FloatArray]:
    """Per ask, the options it runs on now and its running cost there (USD/h, all replicas;
    inf when a pool it runs on is not an option now). The cost sums each assignment's
    replicas x running cost in assignment order, as a loop would."""
    index = {(o.cluster.name, o.pool.name): o.index for o in cs.options}
    src_idx: list[list[int]] = []
    rows: list[int] = []
    cols: list[int] = []
    counts: list[int] = []
    missing = np.zeros(len(asks), dtype=bool)
    for i, ask in enumerate(asks):
        idx = []
        for a in ask.placement.assignments:
            j = index.get((a.cluster, a.pool))
            if j is None:
                missing[i] = True
                continue
            idx.append(j)
            rows.append(i)
            cols.append(j)
            counts.append(a.replicas)
        src_idx.append(idx)
    r = np.array(rows, dtype=np.int64)
    terms = running[r, np.array(cols, dtype=np.int64)] * np.array(counts, dtype=np.int64)
    now_cost: FloatArray = np.bincount(r, weights=terms, minlength=len(asks)).astype(
        np.float64, copy=False)
    now_cost[missing] = math.inf
    return src_idx, now_cost


def _freed_nodes(asks: list[_Ask], cs: CandidateSet) -> FloatArray:
    """Per ask, the USD/h its move frees beyond its replicas' shares (rule 4's `freed`): for
    a "better" service, each ready cloud node that runs its replicas and nothing else
    (`NodeState.workloads` is its id alone) is given back once they leave, so the move saves
    the node's price, where its replicas' running cost counts only their dominant share of
    it. The credit is price - compute x k per such node, k = the replicas there (its
    allocated CPU, else memory, over one replica's), at least 0. 0 for other reasons, for
    fixed-priced pools and for nodes that do not report their workloads."""
    out: FloatArray = np.zeros(len(asks))
    index = {(o.cluster.name, o.pool.name): o.index for o in cs.options}
    for i, ask in enumerate(asks):
        if ask.reason != "better":
            continue
        wid = ask.workload.id
        cpu, mem = float(cs.demand[i, 0]), float(cs.demand[i, 1])
        for j in {index[(a.cluster, a.pool)] for a in ask.placement.assignments
                  if (a.cluster, a.pool) in index}:
            if cs.table.fixed[j] or cs.table.price[j] <= 0:
                continue
            for n in cs.options[j].pool.node_states:
                if n.workloads != (wid,) or n.booting or n.leaving is not NodeLeaving.NO:
                    continue
                k = n.cpu_allocated / cpu if cpu > 0 else \
                    n.memory_allocated_gib / mem if mem > 0 else 1.0
                out[i] += max(0.0, float(cs.table.price[j])
                              - float(cs.compute[i, j]) * max(1.0, round(k)))
    return out


def _worth_first(reasons: list[str], now_cost: FloatArray, new_cost: FloatArray,
                 one_off: FloatArray, has_src: BoolArray, cfg: DecisionConfig) -> BoolArray:
    """`_worth` of every ask at once (the same arithmetic, element by element)."""
    always = np.array([r in ("node-loss", "slo") for r in reasons], dtype=bool)
    recovered = np.array([r == "recovered" for r in reasons], dtype=bool)
    known = has_src & np.isfinite(now_cost)
    with np.errstate(invalid="ignore"):
        saving = now_cost - new_cost
        better = (saving >= cfg.migration_min_saving_fraction * now_cost) & (saving > 1e-12) \
            & (saving >= cfg.migration_min_saving_usd_per_hour - 1e-12) \
            & (saving * cfg.migration_payback_h >= one_off - 1e-12)
        back = new_cost <= now_cost + 1e-9
    out: BoolArray = always | (known & np.where(recovered, back, better))
    return out


def migrations(snapshot: FederationSnapshot, action: PolicyAction, cfg: DecisionConfig, *,
               k: int, service_horizon_h: float, site_cost_fraction: float,
               placed: Mapping[Pair, tuple[float, float, int]],
               reasons: frozenset[str] = REASONS,
               slo_queueing: bool = False,
               memo: PlanMemo | None = None) -> tuple[Migration, ...]:
    """The moves of this epoch for the rules in `reasons` (see the module docstring;
    `memo`: memo.py, speed only)."""
    if not cfg.migrate or not snapshot.running:
        return ()
    asks = _asks(snapshot, reasons, memo)
    if not asks:
        return ()
    wls = [_as_running(a.workload, a.placed) for a in asks]
    cs = build_candidates(snapshot, action, k=k, service_horizon_h=service_horizon_h,
                          workloads=wls, site_cost_fraction=site_cost_fraction, columns=False,
                          memo=memo)
    if not cs.options:
        return ()
    room = _Room(cs, placed)
    feasible = _feasible(asks, cs, slo_queueing)
    running = cs.compute + cs.latency + cs.bias
    move = np.where(feasible, cfg.migration_overlap_h * cs.usd_per_hour, np.inf)
    reps = cs.replicas.astype(np.int64)
    # One-off cost: overlap running + the data's egress to the target (all replicas).
    one_off = (move + cs.egress) * reps[:, None]
    ok = feasible.copy()
    sources, now_costs = _sources(asks, cs, running)
    freed = _freed_nodes(asks, cs) if cfg.migrate_freed_nodes else np.zeros(len(asks))
    now_costs = now_costs + freed
    ii = np.repeat(np.arange(len(asks)), [len(s) for s in sources])
    ok[ii, np.array([j for s in sources for j in s], dtype=np.int64)] = False
    names: npt.NDArray[np.str_] | None = None
    for i, ask in enumerate(asks):
        if ask.avoid or ask.only is not None:
            if names is None:
                names = np.array([o.cluster.name for o in cs.options])
            if ask.avoid:
                ok[i] &= ~np.isin(names, list(ask.avoid))
            if ask.only is not None:
                ok[i] &= np.isin(names, list(ask.only))
    score = np.where(ok, running * reps[:, None] + one_off, np.inf)
    # Each ask's cheapest option first, for all at once: most asks stop there (nothing
    # feasible, or the cheapest move is not worth it, so no dearer one is).
    first = np.argmin(np.where(np.isnan(score), np.inf, score), axis=1)
    at = np.arange(len(asks))
    go = np.isfinite(score[at, first]) & _worth_first(
        [a.reason for a in asks], now_costs, running[at, first] * reps, one_off[at, first],
        np.array([bool(s) for s in sources], dtype=bool), cfg)
    out: list[Migration] = []
    better: list[tuple[float, int, int, float]] = []  # (-saving, ask, option, one-off)
    for i in np.flatnonzero(go).tolist():
        ask = asks[i]
        r = int(reps[i])
        src_idx, now_cost = sources[i], float(now_costs[i])
        if ask.reason == "better" and freed[i] > 0:
            best = _replacing(cs, room, i, r, now_cost, running, score, one_off, src_idx, cfg)
            if best is not None:
                better.append(best)
            continue
        # Options cheapest first (stable). The first is `first[i]` (argmin keeps the first of
        # equals, as a stable sort does), so the sort is made only when the loop goes on.
        order: list[int] | None = None
        pos, j = 0, int(first[i])
        while True:
            if not math.isfinite(score[i, j]):
                break
            new_cost = float(running[i, j]) * r
            if not _worth(ask.reason, now_cost, new_cost, float(one_off[i, j]), src_idx, cfg):
                break  # the cheapest fitting option is not worth it: no dearer one is
            if ask.reason == "better":  # budgeted: decided below, largest saving first
                if room.take(i, j, r, dry=True) == 0:  # a saving uses room there is
                    better.append((new_cost - now_cost, i, j, float(one_off[i, j])))
                    break
            else:
                m = _move(cs, room, ask, i, j, now_cost, float(one_off[i, j]))
                if m is not None:
                    out.append(m)
                    break
            if order is None:
                order = np.argsort(score[i], kind="stable").tolist()
            pos += 1
            if pos >= len(order):
                break
            j = order[pos]
    budget = max(1, int(cfg.migration_budget_fraction * len(snapshot.running)))
    # A move that frees nodes counts on no other move landing in its pools this epoch (room
    # is per pool, so the replicas could land on the node it empties), nor on moving into
    # a pool another move empties (two such moves could swap nodes and free none).
    emptied: set[int] = set()
    targets: set[int] = set()
    for neg_saving, i, j, one_off_j in sorted(better):
        if budget <= 0:
            break
        frees = bool(freed[i] > 0)
        if j in emptied or (frees and targets.intersection(sources[i])):
            continue
        m = _move(cs, room, asks[i], i, j, float(now_costs[i]), one_off_j,
                  saving=-neg_saving)
        if m is not None:
            out.append(m)
            budget -= 1
            targets.add(j)
            if frees:
                emptied.update(sources[i])
    return tuple(out)


def _replacing(cs: CandidateSet, room: _Room, i: int, r: int, now_cost: float,
               running: FloatArray, score: FloatArray, one_off: FloatArray,
               src_idx: list[int], cfg: DecisionConfig
               ) -> tuple[float, int, int, float] | None:
    """The best "better" move of ask i, whose move frees nodes (`_freed_nodes`), as
    (-saving, i, option, one-off), or None when none is worth it. Such a move may order
    nodes (Karpenter's replace consolidation, here make-before-break): the target's new
    nodes are counted at their whole price, in place of its replicas' shares, and their
    boot (NODE_BOOT_S) is paid once. Options in order of their share-priced cost, which no
    option's real cost is below: the scan stops at the first one not worth it even so."""
    best: tuple[float, int, int, float] | None = None
    for j in np.argsort(score[i], kind="stable").tolist():
        if not math.isfinite(score[i, j]):
            break
        share_cost = float(running[i, j]) * r
        if not _worth("better", now_cost, share_cost, float(one_off[i, j]), src_idx, cfg):
            break
        add = room.take(i, j, r, dry=True)
        if add is None:
            continue
        new_cost, once = share_cost, float(one_off[i, j])
        if add > 0:
            price = float(cs.table.price[j])
            new_cost += add * price - float(cs.compute[i, j]) * r
            once += add * price * NODE_BOOT_S / 3600.0
        if not _worth("better", now_cost, new_cost, once, src_idx, cfg):
            continue
        cand = (new_cost - now_cost, i, j, once)
        if best is None or cand < best:
            best = cand
    return best


def _move(cs: CandidateSet, room: _Room, ask: _Ask, i: int, j: int, now_cost: float,
          one_off: float, *, saving: float | None = None) -> Migration | None:
    """The move of `ask` to option j, if j has room for every replica (reserved then;
    `saving`: USD/h, where the caller priced it, else now_cost less the share-priced cost
    there)."""
    r = int(cs.replicas[i])
    new_nodes = room.take(i, j, r)
    if new_nodes is None:
        return None
    o = cs.options[j]
    price = float(cs.usd_per_hour[i, j]) * r
    rtt = float(cs.rtt_ms[i, j])
    target = Placement(ask.workload.id, (Assignment(
        o.cluster.name, o.pool.name, o.pool.pricing, r, price, new_nodes),), price,
        rtt_ms=None if math.isnan(rtt) else rtt, decision={"migration": ask.reason})
    new_cost = float(cs.compute[i, j] + cs.latency[i, j] + cs.bias[i, j]) * r
    return Migration(ask.workload.id, ask.placement.assignments, target, ask.reason,
                     saving_usd_per_hour=max(0.0, now_cost - new_cost if saving is None
                                             else saving), cost_usd=one_off)


def _worth(reason: str, now_cost: float, new_cost: float, one_off: float,
           src_idx: list[int], cfg: DecisionConfig) -> bool:
    """Rules 3-4's thresholds; node-loss and slo moves are always worth it."""
    if reason in ("node-loss", "slo"):
        return True
    if not src_idx or not math.isfinite(now_cost):
        return False  # where it runs is not an option now: the reconciler's case
    if reason == "recovered":
        return new_cost <= now_cost + 1e-9
    saving = now_cost - new_cost
    return saving >= cfg.migration_min_saving_fraction * now_cost and saving > 1e-12 \
        and saving >= cfg.migration_min_saving_usd_per_hour - 1e-12 \
        and saving * cfg.migration_payback_h >= one_off - 1e-12


class _Room:
    """Free capacity per option (headroom applied), less this epoch's placements and moves."""

    def __init__(self, cs: CandidateSet, placed: Mapping[Pair, tuple[float, float, int]]
                 ) -> None:
        self.cs = cs
        head = cs.shares()
        self.head = head
        self.node = cs.option_node()
        cap = np.array([[o.pool.provisioned.cpu, o.pool.provisioned.memory_gib,
                         o.pool.provisioned.gpu] for o in cs.options],
                       dtype=np.float64).reshape(-1, 3)
        used = []
        for o in cs.options:  # in option order (o.index)
            p = o.pool
            add = placed.get((o.cluster.name, p.name), (0.0, 0.0, 0))
            used.append([p.used.cpu + add[0], p.used.memory_gib + add[1], p.used.gpu + add[2]])
        self.free = cap * head - np.array(used, dtype=np.float64).reshape(-1, 3)
        self.can_add = cs.table.can_add.copy()

    def take(self, w: int, o: int, replicas: int, *, dry: bool = False) -> int | None:
        """Reserve `replicas` of workload `w` on option `o`: the nodes to add, None if no room
        (`dry`: only say so, reserve nothing)."""
        need = self.cs.demand[w] * replicas
        short = need - self.free[o]
        add = 0
        for r in range(3):
            if short[r] > 1e-9:
                per = self.node[o, r] * self.head[o, r]
                if per <= 0:
                    return None
                add = max(add, math.ceil(short[r] / per - 1e-9))
        if add > self.can_add[o]:
            return None
        if dry:
            return add
        self.free[o] += add * self.node[o] * self.head[o] - need
        self.can_add[o] -= add
        return add
