"""The policies skyfed is compared against. Pure; same inputs and ledger as the LP.

- `greedy`: the seed's `selectCloudProvider`. Workloads one at a time
  (priority, then arrival order); each goes to the cheapest feasible offer by
  its own total cost (compute + egress), spilling to the next cheapest when
  the cheapest is full. It never looks at the other workloads of the batch.
- `traditional`: what a Kubernetes-style federation (Karmada static weights
  over kube-scheduler's default scoring) does: filter the feasible pools, score
  each by `NodeResourcesLeastAllocated` ((free - request) / capacity, mean of
  CPU and memory, x100) plus `NodeResourcesBalancedAllocation`
  (100 x (1 - |cpu_frac - mem_frac|)), times the cluster's static weight; no
  cost model. Reactive: it first uses capacity that exists, and only adds nodes
  (the cluster autoscaler reacting to pending pods) for what is left.

Both place through `Ledger`, so they obey every hard constraint too; their
objective is computed with the LP's cost function so the numbers compare.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from broker.domain import FederationSnapshot
from broker.placement.candidates import CandidateSet
from broker.placement.ledger import Ledger


def arrival_order(cs: CandidateSet) -> list[int]:
    """Higher priority first, then by submit time, then by id (deterministic)."""
    return sorted(range(len(cs.workloads)), key=lambda i: (
        -cs.workloads[i].spec.priority, cs.workloads[i].submitted_s, cs.workloads[i].id))


def greedy(cs: CandidateSet, snapshot: FederationSnapshot) -> Ledger:
    """Cheapest feasible option first, one workload at a time."""
    ledger = Ledger(cs, snapshot)
    own_cost = np.where(cs.feasible, cs.compute + cs.egress, np.inf)
    for i in arrival_order(cs):
        row = own_cost[i]
        order = np.argsort(row, kind="stable")
        order = order[np.isfinite(row[order])]
        ledger.fill(i, order)
        if not ledger.spread_ok(i):
            ledger.remove(i)
    return ledger


def traditional(cs: CandidateSet, snapshot: FederationSnapshot,
                static_weights: Mapping[str, float]) -> Ledger:
    """Least-allocated + balanced-allocation scoring with static cluster weights."""
    ledger = Ledger(cs, snapshot)
    node = ledger.node
    total = np.maximum(ledger.free + ledger.node * ledger.can_add[:, None], 1e-9)
    weights = np.array([static_weights.get(o.cluster.name, 1.0) for o in cs.options])
    for i in arrival_order(cs):
        for allow_new_nodes in (False, True):
            saved = ledger.can_add.copy()
            if not allow_new_nodes:
                ledger.can_add = ledger.new_nodes.copy()
            feas = np.flatnonzero(cs.feasible[i])
            if feas.size:
                existing = ledger.free[feas] + ledger.new_nodes[feas, None] * node[feas]
                cap = np.where(allow_new_nodes, total[feas], np.maximum(existing, 1e-9))
                left = cap - ledger.usage[feas] - cs.demand[i]
                frac_left = np.clip(left[:, :2] / cap[:, :2], 0.0, 1.0)
                least = frac_left.mean(axis=1) * 100.0
                used = 1.0 - frac_left
                balanced = 100.0 * (1.0 - np.abs(used[:, 0] - used[:, 1]))
                score = (least + balanced) / 2.0 * weights[feas]
                ledger.fill(i, feas[np.argsort(-score, kind="stable")])
            ledger.can_add = saved
            if ledger.placed(i) >= cs.replicas[i]:
                break
        if not ledger.spread_ok(i):
            ledger.remove(i)
    return ledger
