"""Integer bookkeeping of one plan: what is placed where, and what is left. Pure.

Every policy (LP repair, greedy, traditional) places replicas through a
`Ledger`, so every plan obeys the same hard coupling constraints:

- capacity per pool and resource: usage <= share x (free + new_nodes x node), the share
  the candidate set's (`CandidateSet.shares`: the headroom, or all of a cloud GPU node);
  new_nodes <= can_add_nodes (free clipped at 0);
- provider quota per cluster: vCPUs / GPUs of new nodes <= quota headroom
  (`candidates.OptionTable.quota`, a stale quota counts at a fraction);
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

# Float slack of the integer fits. In capacity it is absolute, in the resource's units
# (vCPU, GiB, GPUs), so a fit never overshoots room by more than this: as a fraction of one
# replica (floor(room / d + eps)) it let a 16 GiB replica onto 15.9999984 GiB of room (found
# by the hard-constraint property test).
_EPS = 1e-7
# Objective cost of one new node in the per-replica model (on top of the apportioned price),
# and the least one costs in the packing model: a tie-breaker that keeps the LP from adding
# nodes it does not need (lp.py uses the same).
NEW_NODE_EPSILON_USD = 1e-3
# Ledger.fill tries this many options one by one before screening the rest with
# capacity_fit (a vectorised pass over every option, ~10x one max_fit).
_SCREEN_AFTER = 16


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
    out: list[set[int]] = [set() for _ in workloads]
    if not any(w.spec.avoid_workloads for w in workloads):
        return out  # the common batch: no name index to build (every Ledger calls this)
    by_name: dict[str, list[int]] = {}
    for i, w in enumerate(workloads):
        by_name.setdefault(w.spec.name, []).append(i)
        if w.id != w.spec.name:
            by_name.setdefault(w.id, []).append(i)
    for i, w in enumerate(workloads):
        for name in w.spec.avoid_workloads:
            for j in by_name.get(name, ()):
                if j != i:
                    out[i].add(j)
                    out[j].add(i)
    return out


class Ledger:
    """Residual capacity, quotas and budgets while replicas are placed.

    The per-replica queries (`max_fit`, `node_cap`) and updates (`add`, `remove`) run
    thousands of times an epoch on 3-vectors, so they read Python-float mirrors of the
    arrays (`_node_l`, `_free_l`, `_use_l`, ...) instead of numpy rows: numpy's per-call
    overhead on a 3-element row was most of their cost. Same IEEE arithmetic in the same
    order, so the same answers; `usage` (numpy) is kept in step for the baselines' scoring,
    and `capacity_fit` divides a cached room table whose rows are recomputed only where a
    pool or its cluster's quota changed.
    """

    def __init__(self, cs: CandidateSet, snapshot: FederationSnapshot) -> None:
        self.cs = cs
        n_o = len(cs.options)
        # The option table's read-only arrays are shared; only what changes is copied.
        self.node = cs.table.node
        self.free = np.maximum(cs.table.free, 0.0)
        self._can_add = cs.table.can_add
        self._can_l: list[int] = self._can_add.tolist()  # its mirror (node_cap)
        self._usage = np.zeros((n_o, 3))
        self._stale: set[int] = set()  # options whose _usage row lags _use_l
        self.new_nodes = np.zeros(n_o, dtype=np.int64)
        self._new_l: list[int] = [0] * n_o  # new_nodes' mirror, kept in step by _grow
        self.h = cs.shares()  # O x 3
        self.cluster_of: Sequence[str] = cs.table.cluster_of if len(cs.table.cluster_of) == \
            n_o else [o.cluster.name for o in cs.options]
        self.quota_left: dict[str, list[float | None]] = {
            name: list(left) for name, left in cs.table.quota.items()}
        self._cluster_opts: Mapping[str, Sequence[int]] = cs.table.cluster_options
        if len(self.cluster_of) and not self._cluster_opts:
            opts: dict[str, list[int]] = {}
            for o, c in enumerate(self.cluster_of):
                opts.setdefault(c, []).append(o)
            self._cluster_opts = opts
        self.tenant_left: dict[str, float] = tenant_budgets(snapshot)
        self.spend_w = np.zeros(len(cs.workloads))
        self.x: list[dict[int, int]] = [{} for _ in cs.workloads]
        self.domains: list[dict[str, int]] = [{} for _ in cs.workloads]
        self.clusters_of_w: list[dict[str, int]] = [{} for _ in cs.workloads]
        self.conflicts = conflicts(cs.workloads)
        self.node_usd = node_costs(cs)
        # Workloads rounding.release_unserving took out, with the replicas they had placed.
        self.released: dict[int, int] = {}
        # Python mirrors of what the per-replica paths read (see the class docstring).
        shared = len(cs.table.node_rows) == n_o  # the table's read-only rows
        self._node_l: Sequence[Sequence[float]] = cs.table.node_rows if shared \
            else self.node.tolist()
        self._free_l: Sequence[Sequence[float]] = cs.table.free_rows if shared \
            else self.free.tolist()
        self._use_l: list[list[float]] = [[0.0, 0.0, 0.0] for _ in range(n_o)]
        self._h_l: list[list[float]] = self.h.tolist()
        self._dem_l: list[list[float]] = cs.demand.tolist()
        self._rep_l: list[int] = cs.replicas.tolist()
        self._placed: list[int] = [0] * len(cs.workloads)
        self._opt_q = [self.quota_left[c] for c in self.cluster_of]  # shared lists, per option
        # room[o] = h x (free + node_cap(o) x node) - usage: what capacity_fit divides by the
        # demand; rows recomputed when their pool (or its cluster's quota) changed.
        self._room = np.zeros((n_o, 3))
        self._room_stale: set[int] = set()
        self._room_all_stale = True
        self.cls = [gpu_class(w) for w in cs.workloads]
        self.set_used = dict.fromkeys(cs.gpu_sets, 0)
        self._set_keys: dict[int, list[tuple[int, tuple[int, bool]]]] = {}
        for key in cs.gpu_sets:
            self._set_keys.setdefault(key[0], []).append(key)

    @property
    def usage(self) -> FloatArray:
        """O x 3 resources placed per option (the mirror's rows copied in when read)."""
        if self._stale:
            for o in self._stale:
                self._usage[o] = self._use_l[o]
            self._stale.clear()
        return self._usage

    @property
    def can_add(self) -> IntArray:
        """O: nodes each pool may add at most (the table's; a caller may swap in a stricter
        array for a while, as the baselines and rounding.close_nodes do)."""
        return self._can_add

    @can_add.setter
    def can_add(self, value: IntArray) -> None:
        self._can_add = value
        self._can_l = value.tolist()
        self._room_all_stale = True

    # -- queries ---------------------------------------------------------------
    def placed(self, i: int) -> int:
        return self._placed[i]

    def node_cap(self, o: int) -> int:
        """Most nodes pool `o` may have added, given can_add and the quota left."""
        n_max = self._can_l[o]
        new = self._new_l[o]
        q = self._opt_q[o]
        node = self._node_l[o]
        if q[0] is not None and node[0] > 0:
            n_max = min(n_max, new + math.floor(q[0] / node[0] + _EPS))
        if q[1] is not None and node[2] > 0:
            n_max = min(n_max, new + math.floor(q[1] / node[2] + _EPS))
        return max(n_max, new)

    def one_fits(self, i: int, o: int, nodes: int) -> bool:
        """Whether one more replica of workload i fits pool o by capacity, were `nodes` new
        nodes added there (explain.why_not: can_add for capacity, node_cap for quota)."""
        h, free, node, use = self._h_l[o], self._free_l[o], self._node_l[o], self._use_l[o]
        d = self._dem_l[i]
        return all(h[r] * (free[r] + nodes * node[r]) - use[r] >= d[r] - 1e-9
                   for r in range(3))

    def last_node_fill(self, o: int) -> float:
        """How full pool o's last new node is, by its dominant resource (0 with none new):
        the emptier, the cheaper to close (rounding.close_nodes)."""
        n = self._new_l[o]
        if n <= 0:
            return 0.0
        h, free, node, use = self._h_l[o], self._free_l[o], self._node_l[o], self._use_l[o]
        fill = 0.0
        for r in range(3):
            if node[r] > 0 and h[r] > 0:
                fill = max(fill, (use[r] / h[r] - free[r]) / node[r] - (n - 1))
        return fill

    def capacity_fit(self, i: int) -> IntArray:
        """Replicas of workload i each option could still take by capacity and quota alone.

        Vectorised over options: a fast upper bound of `max_fit` that lets
        `fill` skip full options without calling max_fit on each.
        """
        room = self._room_now()
        d = self.cs.demand[i]
        m = np.full(len(self.cs.options), float(self.cs.replicas[i]))
        for r in range(3):
            if d[r] > 0:
                m = np.minimum(m, np.floor((room[:, r] + _EPS) / d[r]))
        out: IntArray = np.maximum(m, 0).astype(np.int64)
        return out

    def _room_now(self) -> FloatArray:
        """`_room` with its stale rows recomputed (all of them at once after can_add moved)."""
        if self._room_all_stale:
            n_cap = np.array([self.node_cap(o) for o in range(len(self.cs.options))],
                             dtype=np.float64)
            self._room = self.h * (self.free + n_cap[:, None] * self.node) - self.usage
            self._room_all_stale = False
            self._room_stale.clear()
        elif self._room_stale:
            hs, room = self._h_l, self._room
            for o in self._room_stale:
                nc, free, node, use, h = self.node_cap(o), self._free_l[o], self._node_l[o], \
                    self._use_l[o], hs[o]
                room[o] = [h[r] * (free[r] + nc * node[r]) - use[r] for r in range(3)]
            self._room_stale.clear()
        return self._room

    def max_fit(self, i: int, o: int) -> int:
        """Most replicas of workload i that can still go to option o."""
        m = self._rep_l[i] - self._placed[i]
        if m <= 0:
            return 0
        cs = self.cs
        if not cs.feasible[i, o]:
            return 0
        spec = cs.workloads[i].spec
        n_cap = self.node_cap(o)
        h, free, node, use = self._h_l[o], self._free_l[o], self._node_l[o], self._use_l[o]
        d = self._dem_l[i]
        for r in range(3):
            dr = d[r]
            if dr > 0:
                cap = h[r] * (free[r] + n_cap * node[r]) - use[r]
                fit = math.floor((cap + _EPS) / dr)
                if fit < m:
                    m = fit
        cls = self.cls[i]
        if cls is not None and (o, cls) in cs.gpu_sets:
            free_sets, per_node = cs.gpu_sets[(o, cls)]
            m = min(m, free_sets + per_node * n_cap - self.set_used[(o, cls)])
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
        if self.conflicts[i] and any(cname in self.clusters_of_w[j] for j in self.conflicts[i]):
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
        h, free, node, use = self._h_l[o], self._free_l[o], self._node_l[o], self._use_l[o]
        for r in range(3):
            if node[r] > 0 and h[r] > 0:
                lack = use[r] / h[r] - free[r]
                need = max(need, math.ceil((lack - _EPS) / node[r]))
        for key in self._set_keys.get(o, ()):
            free_sets, per_node = self.cs.gpu_sets[key]
            over = self.set_used[key] - free_sets
            if over > 0 and per_node > 0:
                need = max(need, -(-over // per_node))
        return max(need, 0)

    def _use(self, i: int, o: int, m: int) -> None:
        """Usage of pool o changes by m replicas of workload i (mirror and array alike)."""
        use, d = self._use_l[o], self._dem_l[i]
        for r in range(3):
            use[r] += m * d[r]
        self._stale.add(o)
        self._room_stale.add(o)

    def _grow(self, o: int, by: int) -> None:
        """Pool o adds `by` nodes (negative: fewer), against its cluster's quota."""
        q, node = self._opt_q[o], self._node_l[o]
        if q[0] is not None:
            q[0] -= by * node[0]
        if q[1] is not None:
            q[1] -= by * node[2]
        self.new_nodes[o] += by
        self._new_l[o] += by
        if q[0] is not None or q[1] is not None:
            self._room_stale.update(self._cluster_opts[self.cluster_of[o]])

    def add(self, i: int, o: int, m: int) -> None:
        """Place m replicas of workload i on option o (caller checked max_fit)."""
        if m <= 0:
            return
        cs = self.cs
        self._use(i, o, m)
        self._count_sets(i, o, m)
        grow = max(0, self._nodes_needed(o) - self._new_l[o])
        if grow:
            self._grow(o, grow)
        usd = m * float(cs.usd_per_hour[i, o])
        tenant = cs.workloads[i].tenant
        if tenant in self.tenant_left:
            self.tenant_left[tenant] -= usd
        self.spend_w[i] += usd
        self.x[i][o] = self.x[i].get(o, 0) + m
        self._placed[i] += m
        if cs.domain[i]:
            dom = cs.domain[i][o]
            self.domains[i][dom] = self.domains[i].get(dom, 0) + m
        cname = self.cluster_of[o]
        self.clusters_of_w[i][cname] = self.clusters_of_w[i].get(cname, 0) + m

    def remove(self, i: int) -> None:
        """Take every replica of workload i back out (e.g. spread min not met)."""
        cs = self.cs
        for o, m in self.x[i].items():
            self._use(i, o, -m)
            self._count_sets(i, o, -m)
            shrink = max(0, self._new_l[o] - self._nodes_needed(o))
            if shrink:
                self._grow(o, -shrink)
            tenant = cs.workloads[i].tenant
            if tenant in self.tenant_left:
                self.tenant_left[tenant] += m * float(cs.usd_per_hour[i, o])
        self.spend_w[i] = 0.0
        self.x[i] = {}
        self._placed[i] = 0
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
        want = self._rep_l[i]
        if self._placed[i] >= want:
            return 0
        opts = order.tolist() if isinstance(order, np.ndarray) else [int(o) for o in order]
        room: IntArray | None = None
        for k, o in enumerate(opts):
            if k == _SCREEN_AFTER:
                # Still short after the first options (most fills stop there): screen the
                # rest with the vectorised upper bound, skipping options max_fit would
                # refuse anyway (it only falls as replicas are added).
                room = self.capacity_fit(i)
            if room is not None and room[o] <= 0:
                continue
            m = self.max_fit(i, o)
            if per_option_cap is not None:
                m = min(m, per_option_cap)
            if cap_dom is not None:
                m = min(m, cap_dom - self.domains[i].get(self.cs.domain[i][o], 0))
            if m > 0:
                self.add(i, o, m)
                placed += m
            if self._placed[i] >= want:
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
