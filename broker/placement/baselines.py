"""The policies skyfed is compared against. Pure; same inputs and ledger as the LP.

Each copies a named system at its documented default (docs/twin.md, "Baselines"):

- `greedy`: the seed's `selectCloudProvider(podRequest, cloudQuotes)`: keep the quotes whose
  `available >= podRequest.resources`, price each by `calculateTotalCost(q, duration)`, take
  the cheapest (`sort((a, b) => a.cost - b.cost)[0]`). Here: workloads one at a time
  (priority, then arrival order); all of a workload's replicas go to the cheapest option
  (own compute + egress) that can hold them all; none can: it is not placed this epoch
  (the seed returns no quote). Workloads whose spread asks for several domains cannot sit on
  one option: for them the cheapest options are filled in order. So are weighted workloads
  (`replicaSplit: weighted`): the Ledger holds each cluster to its share.
- `traditional`: Karmada + kube-scheduler + Cluster Autoscaler at their defaults.
  Karmada `replicaScheduling: Divided` with `weightPreference.staticWeightList` weights
  proportional to cluster capacity (`capacity_weights`: vCPU at max_nodes), residual
  replicas spread as Karmada does since v1.8 ("divide replicas by static weight evenly":
  a weighted draw, here seeded by the workload id so the plan is a pure function);
  inside each member cluster kube-scheduler scores every pod on its own:
  `NodeResourcesLeastAllocated` ((free - request) / capacity, mean of CPU and memory, x100)
  plus `NodeResourcesBalancedAllocation` (100 x (1 - |cpu_frac - mem_frac|)) over the pools
  with room now; pods left pending make Cluster Autoscaler grow one node group chosen by the
  `least-waste` expander (least (idle CPU / new CPU + idle memory / new memory) after the
  pending pods are placed, expander/waste/waste.go). No cost model. A workload with input
  data is kept to the clusters where its data lives (no egress) when one is feasible: the
  PropagationPolicy `clusterAffinity` an operator writes for a data-heavy job (without it,
  static weights ship every job's data across regions). A workload whose PlacementPolicy
  says `replicaSplit: weighted` brings its own static weights: its shares
  (`CandidateSet.targets`, weighted.py, Karmada's Webster division) replace the capacity
  weights, the data-locality and kept-member-cluster rules (a user's weights win).
- `karpenter`: Karmada's division as above, kube-scheduler scoring for existing room, and
  Karpenter v1 provisioning for the pods left pending: the instance type (pool) with the
  lowest price per pod for the pending batch, over spot and on-demand (Karpenter's default
  `price-capacity-optimized` spot strategy and `lowest-price` on-demand; spot wins ties).
  The twin models no capacity-pool exhaustion beyond max_nodes and quota, so "capacity" is
  those limits.

All place through `Ledger`, so they obey every hard constraint too; their objective is
computed with the LP's cost function so the numbers compare.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping

import numpy as np

from broker.domain import FederationSnapshot, PricingModel
from broker.placement.candidates import CandidateSet
from broker.placement.ledger import Ledger


def arrival_order(cs: CandidateSet) -> list[int]:
    """Higher priority first, then by submit time, then by id (deterministic)."""
    return sorted(range(len(cs.workloads)), key=lambda i: (
        -cs.workloads[i].spec.priority, cs.workloads[i].submitted_s, cs.workloads[i].id))


def greedy(cs: CandidateSet, snapshot: FederationSnapshot) -> Ledger:
    """The seed's selectCloudProvider: the cheapest option holding all replicas."""
    ledger = Ledger(cs, snapshot)
    # The seed's quote price: apportioned compute even when the LP's objective is marginal.
    compute = cs.compute if cs.list_compute is None else cs.list_compute
    own_cost = np.where(cs.feasible, compute + cs.egress, np.inf)
    for i in arrival_order(cs):
        row = own_cost[i]
        # the feasible options, cheapest first (a stable sort of those alone: the same order
        # as sorting the whole row and dropping the infinite tail, for half the work)
        finite = np.flatnonzero(np.isfinite(row))
        order = finite[np.argsort(row[finite], kind="stable")]
        spec = cs.workloads[i].spec
        if (spec.spread is not None and spec.spread.min_domains > 1) or cs.target(i):
            ledger.fill(i, order)
        else:
            _place_whole(ledger, i, order, int(cs.replicas[i]))
        if not ledger.spread_ok(i):
            ledger.remove(i)
    return ledger


def _place_whole(ledger: Ledger, i: int, order: np.ndarray, want: int) -> None:
    """All `want` replicas of workload i on the first option in `order` that holds them.

    Under contention most cheap options are full: past the first few, options are screened
    with the vectorised upper bound `capacity_fit` before the exact `max_fit` (same choice,
    ~4x faster greedy at 5000x500)."""
    head = 8
    for pos, o in enumerate(order):
        if pos == head:
            rest = order[head:]
            for oo in rest[ledger.capacity_fit(i)[rest] >= want]:
                if ledger.max_fit(i, int(oo)) >= want:
                    ledger.add(i, int(oo), want)
                    return
            return
        if ledger.max_fit(i, int(o)) >= want:
            ledger.add(i, int(o), want)
            return


def capacity_weights(snapshot: FederationSnapshot) -> dict[str, float]:
    """Karmada static weights proportional to each cluster's capacity (vCPU at max_nodes)."""
    return {c.name: sum(max(p.max_nodes, p.nodes) * p.node.cpu for p in c.pools)
            for c in snapshot.clusters}


def karmada_divide(workload_id: str, replicas: int,
                   weights: Mapping[str, float]) -> list[tuple[str, int]]:
    """Karmada's static-weight division: floor(w / sum w x replicas), residuals drawn.

    The residual replicas go one at a time to clusters drawn with probability proportional
    to weight (without replacement), from a generator seeded by the workload id.
    """
    live = {c: w for c, w in weights.items() if w > 0}
    total = sum(live.values())
    if replicas <= 0 or total <= 0:
        return []
    names = sorted(live, key=lambda c: (-live[c], c))
    share = {c: int(replicas * live[c] / total) for c in names}
    left = replicas - sum(share.values())
    seed = int.from_bytes(hashlib.sha256(workload_id.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    pool = list(names)
    while left > 0 and pool:
        pick = rng.choices(pool, weights=[live[c] for c in pool])[0]
        share[pick] += 1
        pool.remove(pick)
        left -= 1
    return [(c, share[c]) for c in names if share[c] > 0]


def _least_allocated(ledger: Ledger, i: int, opts: np.ndarray) -> np.ndarray:
    """kube-scheduler LeastAllocated + BalancedAllocation scores of `opts` for one pod."""
    cs = ledger.cs
    existing = ledger.free[opts] + ledger.new_nodes[opts, None] * ledger.node[opts]
    cap = np.maximum(existing, 1e-9)
    left = cap - ledger.usage[opts] - cs.demand[i]
    frac_left = np.clip(left[:, :2] / cap[:, :2], 0.0, 1.0)
    least = frac_left.mean(axis=1) * 100.0
    used = 1.0 - frac_left
    balanced = 100.0 * (1.0 - np.abs(used[:, 0] - used[:, 1]))
    out: np.ndarray = (least + balanced) / 2.0
    return out


def _schedule_existing(ledger: Ledger, i: int, opts: np.ndarray, pods: int) -> int:
    """Place up to `pods` pods one by one on existing room (no new nodes); returns placed."""
    saved = ledger.can_add.copy()
    ledger.can_add = ledger.new_nodes.copy()
    placed = 0
    try:
        while placed < pods:
            room = np.array([ledger.max_fit(i, int(o)) for o in opts], dtype=np.int64)
            ok = opts[room > 0]
            if ok.size == 0:
                break
            score = _least_allocated(ledger, i, ok)
            ledger.add(i, int(ok[int(np.argmax(score))]), 1)
            placed += 1
    finally:
        ledger.can_add = saved
    return placed


def _nodes_for(ledger: Ledger, i: int, o: int, pods: int) -> int:
    d = ledger.cs.demand[i]
    node = ledger.node[o] * ledger.h[o]
    need = 0
    for r in range(3):
        if d[r] > 0 and node[r] > 0:
            need = max(need, math.ceil(pods * d[r] / node[r] - 1e-9))
    return max(need, 1)


def least_waste(ledger: Ledger, i: int, opts: np.ndarray, pods: int) -> list[int]:
    """Cluster Autoscaler's least-waste expander: node groups by idle fraction after scale-up."""
    d = ledger.cs.demand[i]
    scored = []
    for o in opts:
        n = _nodes_for(ledger, i, int(o), pods)
        node = ledger.node[int(o)]
        waste = sum((n * node[r] - pods * d[r]) / (n * node[r]) for r in (0, 1) if node[r] > 0)
        scored.append((waste, int(o)))
    return [o for _, o in sorted(scored)]


def karpenter_launch(ledger: Ledger, i: int, opts: np.ndarray, pods: int) -> list[int]:
    """Karpenter's choice for pending pods: lowest price per pod, spot first on ties."""
    scored = []
    for o in opts:
        opt = ledger.cs.options[int(o)]
        n = _nodes_for(ledger, i, int(o), pods)
        per_pod = n * opt.pool.price_usd_per_hour / max(pods, 1)
        spot = opt.pricing is PricingModel.SPOT
        scored.append((per_pod, not spot, int(o)))
    return [o for *_, o in sorted(scored)]


Expander = Callable[[Ledger, int, np.ndarray, int], list[int]]


def federated(cs: CandidateSet, snapshot: FederationSnapshot,
              static_weights: Mapping[str, float], expander: Expander) -> Ledger:
    """Karmada division, kube-scheduler per pod on existing room, then the cluster's
    autoscaler (`expander` orders the pools it may grow) for what is left."""
    ledger = Ledger(cs, snapshot)
    weights = dict(static_weights) or capacity_weights(snapshot)
    cluster_of = np.array([ledger.cluster_of[o] for o in range(len(cs.options))], dtype=object)
    # Karmada keeps a workload's member clusters: an evicted replica is recreated by the
    # member's own controller where it ran, not divided across the federation again.
    runs_in = {p.workload_id: {a.cluster for a in p.assignments} for p in snapshot.running}
    for i in arrival_order(cs):
        feas = np.flatnonzero(cs.feasible[i])
        if feas.size == 0:
            continue
        for cname, share in _division(cs, i, feas, cluster_of, runs_in, weights):
            opts = feas[cluster_of[feas] == cname]
            left = share - _schedule_existing(ledger, i, opts, share)
            if left <= 0:
                continue
            for o in expander(ledger, i, opts, left):
                m = min(left, ledger.max_fit(i, o))
                if m > 0:
                    ledger.add(i, o, m)
                    left -= m
                if left <= 0:
                    break
        if not ledger.spread_ok(i):
            ledger.remove(i)
    return ledger


def _division(cs: CandidateSet, i: int, feas: np.ndarray, cluster_of: np.ndarray,
              runs_in: Mapping[str, set[str]],
              weights: Mapping[str, float]) -> list[tuple[str, int]]:
    """Replicas per member cluster for workload i: its own weighted shares, else Karmada's
    division by the static (capacity) weights over the clusters the rules keep."""
    if cs.target(i):
        return sorted(cs.target(i).items())
    home = runs_in.get(cs.workloads[i].id)
    if home:
        kept = feas[np.isin(cluster_of[feas], list(home))]
        feas = kept if kept.size else feas
    if cs.workloads[i].spec.data:
        # PropagationPolicy clusterAffinity to where the input data lives (no egress),
        # when such a cluster is feasible: what an operator writes for a data-heavy job.
        local = feas[cs.egress[i, feas] <= 1e-12]
        feas = local if local.size else feas
    members = {str(c): weights.get(str(c), 0.0) for c in set(cluster_of[feas])}
    return karmada_divide(cs.workloads[i].id, int(cs.replicas[i]), members)


def traditional(cs: CandidateSet, snapshot: FederationSnapshot,
                static_weights: Mapping[str, float]) -> Ledger:
    """Karmada static weights + kube-scheduler + Cluster Autoscaler (least-waste)."""
    return federated(cs, snapshot, static_weights, least_waste)


def karpenter(cs: CandidateSet, snapshot: FederationSnapshot,
              static_weights: Mapping[str, float]) -> Ledger:
    """Karmada static weights + kube-scheduler + Karpenter v1 provisioning."""
    return federated(cs, snapshot, static_weights, karpenter_launch)
