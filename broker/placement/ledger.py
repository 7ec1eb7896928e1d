"""Integer bookkeeping of one plan: what is placed where, and what is left. Pure.

Every policy (LP repair, greedy, traditional) places replicas through a
`Ledger`, so every plan obeys the same hard coupling constraints:

- capacity per pool and resource: usage <= headroom x (free + new_nodes x node),
  new_nodes <= can_add_nodes (free clipped at 0);
- provider quota per cluster: vCPUs / GPUs of new nodes <= quota headroom
  (`candidates.quota_headrooms`, a stale quota counts at a fraction);
- tenant and per-workload budgets in USD/h;
- spread: at most `max_domains` domains;
- anti-affinity between workloads of the batch (`avoid_workloads`);
- GPU sets: at most S + K x new nodes replicas of each multi-GPU class on a pool
  (`CandidateSet.gpu_sets`, feasibility.py; the pool adds nodes for sets as for capacity);
- weighted shares: at most `CandidateSet.target(w)[c]` replicas of w in cluster c
  (`replicaSplit: weighted`, weighted.py), so no policy moves a share elsewhere.

`min_domains` is checked by `spread_ok` after filling (all-or-nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from broker.domain import FederationSnapshot, Workload
from broker.placement.candidates import CandidateSet, FloatArray, IntArray
from broker.placement.feasibility import gpu_class

_EPS = 1e-7
# Objective cost of one new node in the per-replica model (on top of the apportioned price),
# and the least one costs in the packing model: a tie-breaker that keeps the LP from adding
# nodes it does not need (lp.py uses the same).
NEW_NODE_EPSILON_USD = 1e-3


def node_costs(cs: CandidateSet) -> FloatArray:
    """USD per new node of each option in the objective: the packing model's fixed charge
    (`CandidateSet.node_usd`, at least epsilon), or epsilon in the per-replica model."""
    if cs.node_usd is None:
        return np.full(len(cs.options), NEW_NODE_EPSILON_USD)
    return np.maximum(cs.node_usd, NEW_NODE_EPSILON_USD)


def unplaced_penalty(cs: CandidateSet, i: int, base_usd: float) -> float:
    """Penalty per unplaced replica: above any option's cost, scaled by priority.

    "Any option's cost" counts, in the packing model, a whole new node opened for one
    replica, so leaving a replica out never looks cheaper than buying it a node.
    Higher priority -> larger penalty, so under contention the LP places
    higher-priority workloads first (and any policy's objective says so).
    """
    row = cs.cost[i] if cs.node_usd is None else cs.cost[i] + cs.node_usd
    finite = row[np.isfinite(row)]
    top = float(finite.max()) if finite.size else 0.0
    prio = cs.workloads[i].spec.priority
    factor = (1.0 + prio) if prio >= 0 else 1.0 / (1.0 - prio)
    return max(base_usd, 10.0 * top) * factor


def penalties(cs: CandidateSet, base_usd: float) -> FloatArray:
    """unplaced_penalty of every workload of the batch."""
    return np.array([unplaced_penalty(cs, i, base_usd) for i in range(len(cs.workloads))],
                    dtype=np.float64)


def tenant_budgets(snapshot: FederationSnapshot) -> dict[str, float]:
    """USD/h each capped tenant may still add this epoch: its budget minus the run rate of
    what it already runs (`Tenant.committed_usd_per_hour`, summed by the snapshot merge).
    The budget holds across epochs, not only within one batch."""
    out: dict[str, float] = {}
    for t in snapshot.tenants:
        left = t.budget_left_usd_per_hour
        if left is not None:
            out[t.name] = left
    return out


def conflicts(workloads: Sequence[Workload]) -> list[set[int]]:
    """Per workload: indices of batch workloads it must not share a cluster with."""
    by_name: dict[str, list[int]] = {}
    for i, w in enumerate(workloads):
        by_name.setdefault(w.spec.name, []).append(i)
        if w.id != w.spec.name:
            by_name.setdefault(w.id, []).append(i)
    out: list[set[int]] = [set() for _ in workloads]
    for i, w in enumerate(workloads):
        for name in w.spec.avoid_workloads:
            for j in by_name.get(name, ()):
                if j != i:
                    out[i].add(j)
                    out[j].add(i)
    return out


class Ledger:
    """Residual capacity, quotas and budgets while replicas are placed."""

    def __init__(self, cs: CandidateSet, snapshot: FederationSnapshot) -> None:
        self.cs = cs
        n_o = len(cs.options)
        # The option table's read-only arrays are shared; only what changes is copied.
        self.node = cs.table.node
        self.free = np.maximum(cs.table.free, 0.0)
        self.can_add = cs.table.can_add
        self.usage = np.zeros((n_o, 3))
        self.new_nodes = np.zeros(n_o, dtype=np.int64)
        self.h = cs.headroom_vec()
        self.cluster_of = [o.cluster.name for o in cs.options]
        self.quota_left: dict[str, list[float | None]] = {
            name: list(left) for name, left in cs.table.quota.items()}
        names = sorted(self.quota_left)
        self._cidx = {n: k for k, n in enumerate(names)}
        self._opt_c = np.array([self._cidx[c] for c in self.cluster_of], dtype=np.int64)
        # quota_left as arrays (inf = no quota), kept in step by _sync_quota
        self._q = np.array([[np.inf if v is None else float(v) for v in self.quota_left[n]]
                            for n in names], dtype=np.float64).reshape(-1, 2)
        self.tenant_left: dict[str, float] = tenant_budgets(snapshot)
        self.spend_w = np.zeros(len(cs.workloads))
        self.x: list[dict[int, int]] = [{} for _ in cs.workloads]
        self.domains: list[dict[str, int]] = [{} for _ in cs.workloads]
        self.clusters_of_w: list[dict[str, int]] = [{} for _ in cs.workloads]
        self.conflicts = conflicts(cs.workloads)
        self.node_usd = node_costs(cs)
        self.cls = [gpu_class(w) for w in cs.workloads]
        self.set_used = dict.fromkeys(cs.gpu_sets, 0)
        self._set_keys: dict[int, list[tuple[int, tuple[int, bool]]]] = {}
        for key in cs.gpu_sets:
            self._set_keys.setdefault(key[0], []).append(key)

    def _sync_quota(self, cluster: str) -> None:
        for col in (0, 1):
            v = self.quota_left[cluster][col]
            self._q[self._cidx[cluster], col] = np.inf if v is None else float(v)

    # -- queries ---------------------------------------------------------------
    def placed(self, i: int) -> int:
        return sum(self.x[i].values())

    def node_cap(self, o: int) -> int:
        """Most nodes pool `o` may have added, given can_add and the quota left."""
        n_max = int(self.can_add[o])
        q = self.quota_left[self.cluster_of[o]]
        for dim, left in ((0, q[0]), (2, q[1])):
            per = self.node[o, dim]
            if left is not None and per > 0:
                n_max = min(n_max, int(self.new_nodes[o]) + math.floor(left / per + _EPS))
        return max(n_max, int(self.new_nodes[o]))

    def capacity_fit(self, i: int) -> IntArray:
        """Replicas of workload i each option could still take by capacity and quota alone.

        Vectorised over options: a fast upper bound of `max_fit` that lets
        `fill` skip full options without calling max_fit on each.
        """
        node = self.node
        n_cap = self.can_add.astype(np.float64)
        for dim, col in ((0, 0), (2, 1)):
            left = self._q[self._opt_c, col]
            with np.errstate(divide="ignore", invalid="ignore"):
                by_quota = np.where(node[:, dim] > 0,
                                    self.new_nodes + np.floor(left / node[:, dim] + _EPS),
                                    np.inf)
            n_cap = np.minimum(n_cap, by_quota)
        n_cap = np.maximum(n_cap, self.new_nodes)
        cap = self.h * (self.free + n_cap[:, None] * node) - self.usage
        d = self.cs.demand[i]
        m = np.full(len(self.cs.options), float(self.cs.replicas[i]))
        for r in range(3):
            if d[r] > 0:
                m = np.minimum(m, np.floor(cap[:, r] / d[r] + _EPS))
        out: IntArray = np.maximum(m, 0).astype(np.int64)
        return out

    def max_fit(self, i: int, o: int) -> int:
        """Most replicas of workload i that can still go to option o."""
        cs = self.cs
        if not cs.feasible[i, o]:
            return 0
        spec = cs.workloads[i].spec
        m = int(cs.replicas[i]) - self.placed(i)
        if m <= 0:
            return 0
        cap = self.h * (self.free[o] + self.node_cap(o) * self.node[o]) - self.usage[o]
        d = cs.demand[i]
        for r in range(3):
            if d[r] > 0:
                m = min(m, math.floor(cap[r] / d[r] + _EPS))
        cls = self.cls[i]
        if cls is not None and (o, cls) in cs.gpu_sets:
            free, per_node = cs.gpu_sets[(o, cls)]
            m = min(m, free + per_node * self.node_cap(o) - self.set_used[(o, cls)])
        usdh = float(cs.usd_per_hour[i, o])
        if usdh > 0:
            tenant = cs.workloads[i].tenant
            if tenant in self.tenant_left:
                m = min(m, math.floor(self.tenant_left[tenant] / usdh + _EPS))
            if spec.budget_usd_per_hour is not None:
                left = spec.budget_usd_per_hour - self.spend_w[i]
                m = min(m, math.floor(left / usdh + _EPS))
        if spec.spread is not None and spec.spread.max_domains is not None and cs.domain[i]:
            dom = cs.domain[i][o]
            if dom not in self.domains[i] and len(self.domains[i]) >= spec.spread.max_domains:
                return 0
        cname = self.cluster_of[o]
        if any(cname in self.clusters_of_w[j] for j in self.conflicts[i]):
            return 0
        share = cs.target(i)
        if share:
            m = min(m, share.get(cname, 0) - self.clusters_of_w[i].get(cname, 0))
        return max(0, m)

    # -- updates ---------------------------------------------------------------
    def _count_sets(self, i: int, o: int, m: int) -> None:
        cls = self.cls[i]
        if cls is not None and (o, cls) in self.set_used:
            self.set_used[(o, cls)] += m

    def _nodes_needed(self, o: int) -> int:
        """New nodes pool o needs for what is placed on it: capacity and GPU sets."""
        need = 0
        for r in range(3):
            if self.node[o, r] > 0 and self.h[r] > 0:
                lack = self.usage[o, r] / self.h[r] - self.free[o, r]
                need = max(need, math.ceil(lack / self.node[o, r] - _EPS))
        for key in self._set_keys.get(o, ()):
            free, per_node = self.cs.gpu_sets[key]
            over = self.set_used[key] - free
            if over > 0 and per_node > 0:
                need = max(need, -(-over // per_node))
        return max(need, 0)

    def add(self, i: int, o: int, m: int) -> None:
        """Place m replicas of workload i on option o (caller checked max_fit)."""
        if m <= 0:
            return
        cs = self.cs
        self.usage[o] += m * cs.demand[i]
        self._count_sets(i, o, m)
        grow = max(0, self._nodes_needed(o) - int(self.new_nodes[o]))
        if grow:
            q = self.quota_left[self.cluster_of[o]]
            if q[0] is not None:
                q[0] -= grow * self.node[o, 0]
            if q[1] is not None:
                q[1] -= grow * self.node[o, 2]
            self._sync_quota(self.cluster_of[o])
            self.new_nodes[o] += grow
        usd = m * float(cs.usd_per_hour[i, o])
        tenant = cs.workloads[i].tenant
        if tenant in self.tenant_left:
            self.tenant_left[tenant] -= usd
        self.spend_w[i] += usd
        self.x[i][o] = self.x[i].get(o, 0) + m
        if cs.domain[i]:
            dom = cs.domain[i][o]
            self.domains[i][dom] = self.domains[i].get(dom, 0) + m
        cname = self.cluster_of[o]
        self.clusters_of_w[i][cname] = self.clusters_of_w[i].get(cname, 0) + m

    def remove(self, i: int) -> None:
        """Take every replica of workload i back out (e.g. spread min not met)."""
        cs = self.cs
        for o, m in self.x[i].items():
            self.usage[o] -= m * cs.demand[i]
            self._count_sets(i, o, -m)
            shrink = max(0, int(self.new_nodes[o]) - self._nodes_needed(o))
            if shrink:
                q = self.quota_left[self.cluster_of[o]]
                if q[0] is not None:
                    q[0] += shrink * self.node[o, 0]
                if q[1] is not None:
                    q[1] += shrink * self.node[o, 2]
                self._sync_quota(self.cluster_of[o])
                self.new_nodes[o] -= shrink
            tenant = cs.workloads[i].tenant
            if tenant in self.tenant_left:
                self.tenant_left[tenant] += m * float(cs.usd_per_hour[i, o])
        self.spend_w[i] = 0.0
        self.x[i] = {}
        self.domains[i] = {}
        self.clusters_of_w[i] = {}

    def fill(self, i: int, order: Sequence[int] | IntArray, *,
             per_option_cap: int | None = None) -> int:
        """Place what is left of workload i on options in `order`; returns replicas placed."""
        spec = self.cs.workloads[i].spec
        cap_dom: int | None = None
        if spec.spread is not None and spec.spread.min_domains > 1 and self.cs.domain[i]:
            cap_dom = max(1, int(self.cs.replicas[i]) // min(spec.spread.min_domains,
                                                            int(self.cs.replicas[i])))
        placed = 0
        room = self.capacity_fit(i) if len(order) > 16 else None
        for o in order:
            if room is not None and room[int(o)] <= 0:
                continue
            m = self.max_fit(i, int(o))
            if per_option_cap is not None:
                m = min(m, per_option_cap)
            if cap_dom is not None:
                m = min(m, cap_dom - self.domains[i].get(self.cs.domain[i][int(o)], 0))
            if m > 0:
                self.add(i, int(o), m)
                placed += m
            if self.placed(i) >= self.cs.replicas[i]:
                break
        return placed

    def spread_ok(self, i: int) -> bool:
        """min_domains holds, counting unplaced replicas as the LP does."""
        spec = self.cs.workloads[i].spec
        if spec.spread is None or spec.spread.min_domains <= 1 or not self.x[i]:
            return True
        r = int(self.cs.replicas[i])
        need = min(spec.spread.min_domains, r)
        unplaced = r - self.placed(i)
        return len(self.domains[i]) * r + need * unplaced >= need * r

    def split_egress(self, i: int) -> float:
        """USD of workload i's data moves beyond what its per-replica costs count.

        `CandidateSet.egress` shares one copy of the input among all R replicas, the LP's
        linear view; but every cluster that runs any replica needs the whole input (the
        twin moves it to each, as a cluster's storage would stage it). So m of the R
        replicas in cluster c cost egress_c x (R - m) more than their per-replica terms:
        0 when all run in one cluster, the full copy again for each further cluster. The
        LP's bound stays valid (this is never negative)."""
        xi = self.x[i]
        if not xi or not self.cs.workloads[i].spec.data:
            return 0.0
        r = int(self.cs.replicas[i])
        seen: dict[str, int] = {}
        for o in xi:
            seen.setdefault(self.cluster_of[o], o)
        return sum(float(self.cs.egress[i, o]) * (r - self.clusters_of_w[i][c])
                   for c, o in seen.items())

    def objective(self, pen: FloatArray) -> float:
        cs = self.cs
        total = 0.0
        for i, xi in enumerate(self.x):
            for o, m in xi.items():
                total += m * float(cs.cost[i, o])
            total += (int(cs.replicas[i]) - self.placed(i)) * float(pen[i])
            total += self.split_egress(i)
        # The LP's charge per new node (lp.py's n columns), so LP bound <= objective holds.
        return total + float(self.node_usd @ self.new_nodes)

    def snapshot_x(self) -> list[Mapping[int, int]]:
        return [dict(xi) for xi in self.x]
