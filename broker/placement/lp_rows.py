"""The constraint rows and column bounds of the placement program, one family each.

`lp.build` assembles the matrix (columns, costs, the demand rows) and calls these for the
other families of the model in lp.py's docstring: capacity, quota, budget, spread,
anti-affinity, weighted-share and GPU-set rows, and the bounds on n (new nodes) and x (replicas
that can ever fit).
Separate from lp.py so that module stays the model in maths, its assembly and its solve;
each function here is one inequality family of that docstring, with its index sets.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

from broker.placement.candidates import RESOURCES, CandidateSet, FloatArray, IntArray
from broker.placement.feasibility import gpu_class
from broker.placement.ledger import conflicts


class Rows:
    """COO accumulator for the constraint matrix."""

    def __init__(self) -> None:
        self.r: list[IntArray] = []
        self.c: list[IntArray] = []
        self.v: list[FloatArray] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.names: list[tuple[str, str]] = []

    def add(self, cols: Sequence[int] | IntArray, vals: Sequence[float] | FloatArray,
            lo: float, hi: float, name: tuple[str, str]) -> None:
        row = len(self.lo)
        cols_a = np.asarray(cols, dtype=np.int64)
        self.r.append(np.full(cols_a.size, row, dtype=np.int64))
        self.c.append(cols_a)
        self.v.append(np.asarray(vals, dtype=np.float64))
        self.lo.append(lo)
        self.hi.append(hi)
        self.names.append(name)


def node_bounds(cs: CandidateSet, used_opts: IntArray) -> FloatArray:
    """n_o <= min(can_add, floor(quota / node size)): valid for integer n, and it keeps
    the relaxation from buying a fraction of a node the quota cannot fit whole."""
    used = np.asarray(used_opts, dtype=np.int64)
    node = cs.option_node()[used]
    bound = cs.table.can_add[used].astype(np.float64)
    left = cs.table.option_quota[used]  # inf: no quota
    for col, dim in ((0, 0), (1, 2)):
        per = node[:, dim]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_quota = np.floor(left[:, col] / np.where(per > 0, per, 1.0) + 1e-9)
        bound = np.where((per > 0) & np.isfinite(left[:, col]),
                         np.minimum(bound, by_quota), bound)
    out: FloatArray = np.maximum(0.0, bound)
    return out


def fit_bounds(cs: CandidateSet, x_w: IntArray, x_o: IntArray, used_opts: IntArray,
                node_hi: FloatArray) -> FloatArray:
    """x[w,o] <= floor(most the pool could ever hold / d[w]) where that is below R[w].

    A cut that is valid for integer x (w alone, with every addable node) and
    removes the relaxation's favourite cheat: half a 2-GPU job in a pool with
    one GPU free. Where it does not bind, the column stays unbounded (x <= R
    is implied, and an explicit copy would only make the demand duals degenerate).
    """
    hv = cs.shares()
    node = cs.option_node()
    most = np.zeros((len(cs.options), 3))
    used = np.asarray(used_opts, dtype=np.int64)
    most[used] = hv[used] * (np.maximum(cs.table.free[used], 0.0) + node_hi[:, None] * node[used])
    d = cs.demand[x_w]
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.where(d > 0, most[x_o] / np.where(d > 0, d, 1.0), np.inf).min(axis=1)
    fit = np.floor(exact + 1e-9)
    # Only where it cuts something off (capacity not a multiple of the demand): an
    # integral bound adds nothing and would take the shadow price from the row.
    cuts = (fit < cs.replicas[x_w]) & (fit < exact - 1e-9)
    return np.where(cuts, fit, math.inf)


def capacity_rows(cs: CandidateSet, rows: Rows, x_w: IntArray, x_o: IntArray,
                   used_opts: IntArray, n_col_of: dict[int, int]) -> dict[tuple[int, int], int]:
    """(capacity) rows per option and resource its nodes have; returns (option, res) -> row.

    Rows are numbered option by option (in `used_opts` order), resource by resource; their
    coefficients are built for all rows at once (this runs every epoch, ~600 rows).
    """
    hv = cs.shares()
    out: dict[tuple[int, int], int] = {}
    node = cs.option_node()
    used = np.asarray(used_opts, dtype=np.int64)
    has = ~(node[used] <= 0)  # (option k, resource r): a row
    row_of = np.full(has.shape, -1, dtype=np.int64)
    row_of[has] = len(rows.lo) + np.arange(int(has.sum()), dtype=np.int64)
    kk, rr = np.nonzero(has)  # the rows, option by option
    opt_k = used[kk]
    opt_list, res_list = opt_k.tolist(), rr.tolist()
    out.update(zip(zip(opt_list, res_list, strict=True), row_of[kk, rr].tolist(), strict=True))
    rows.lo.extend([-math.inf] * kk.size)
    rows.hi.extend((hv[opt_k, rr] * np.maximum(0.0, cs.table.free[opt_k, rr])).tolist())
    names = cs.table.capacity_names
    if len(names) == len(cs.options):  # made once per Cluster value (candidates.py)
        rows.names.extend(map(operator.getitem, map(names.__getitem__, opt_list), res_list))
    else:
        options = cs.options
        prefix = {o: f"{options[o].cluster.name}/{options[o].pool.name}:" for o in set(opt_list)}
        rows.names.extend(("capacity", prefix[o] + RESOURCES[r])
                          for o, r in zip(opt_list, res_list, strict=True))
    k_of = np.full(len(cs.options), -1, dtype=np.int64)
    k_of[used] = np.arange(used.size, dtype=np.int64)
    cols = np.flatnonzero(k_of[x_o] >= 0)  # x columns on a used option
    ks = k_of[x_o[cols]]
    for r in range(3):  # d[w] x[w,o] of each row
        on = has[ks, r]
        rows.r.append(row_of[ks[on], r])
        rows.c.append(cols[on].astype(np.int64))
        rows.v.append(np.asarray(cs.demand[x_w[cols[on]], r], dtype=np.float64))
    # - h[o,r] node[o,r] n_o of each row
    rows.r.append(row_of[kk, rr])
    n_col = np.array([n_col_of[o] for o in used.tolist()], dtype=np.int64)
    rows.c.append(n_col[kk])
    rows.v.append(np.asarray(-hv[opt_k, rr] * node[opt_k, rr], dtype=np.float64))
    return out


def quota_rows(cs: CandidateSet, rows: Rows, used_opts: IntArray,
                n_col_of: dict[int, int]) -> None:
    """(quota) rows: new nodes per cluster within its vCPU and GPU quota headroom."""
    node = cs.option_node()
    by_cluster: dict[str, list[int]] = {}
    for o in np.asarray(used_opts).tolist():
        by_cluster.setdefault(cs.options[o].cluster.name, []).append(o)
    for opts in by_cluster.values():
        cluster = cs.options[opts[0]].cluster
        q_cpu, q_gpu = cs.quota_left(cluster.name)
        for left, dim, unit in ((q_cpu, 0, "vcpu"), (q_gpu, 2, "gpu")):
            if left is None:
                continue
            sizes = node[opts, dim].tolist()
            cols = [n_col_of[o] for o, size in zip(opts, sizes, strict=True) if size > 0]
            if cols:
                vals = [size for size in sizes if size > 0]
                rows.add(cols, vals, -math.inf, left, ("quota", f"{cluster.name}:{unit}"))


def budget_rows(cs: CandidateSet, rows: Rows, x_w: IntArray, x_o: IntArray,
                 tenant_budgets: dict[str, float]) -> dict[str, int]:
    """(budget) rows per tenant in the batch and per workload with its own; tenant -> row."""
    price = cs.usd_per_hour[x_w, x_o]
    out: dict[str, int] = {}
    tenants = np.array([cs.workloads[int(w)].tenant for w in x_w], dtype=object)
    in_batch = {w.tenant for w in cs.workloads}
    for tenant, budget in tenant_budgets.items():
        cols = np.flatnonzero(tenants == tenant)
        if tenant in in_batch:
            out[tenant] = len(rows.lo)
            rows.add(cols, price[cols], -math.inf, budget, ("budget", f"tenant:{tenant}"))
    for w, wl in enumerate(cs.workloads):
        if wl.spec.budget_usd_per_hour is not None:
            cols = np.flatnonzero(x_w == w)
            rows.add(cols, price[cols], -math.inf, wl.spec.budget_usd_per_hour,
                     ("budget", f"workload:{wl.id}"))
    return out


def spread_rows(cs: CandidateSet, rows: Rows, x_w: IntArray, x_o: IntArray,
                 starts: IntArray, u_start: int,
                 y_start: int) -> list[tuple[int, str, str]]:
    """Spread and anti-affinity rows; returns the key of every y column made."""
    confl = conflicts(cs.workloads)
    y_col: dict[tuple[int, str, str], int] = {}

    def y(w: int, kind: str, key: str) -> int:
        return y_col.setdefault((w, kind, key), y_start + len(y_col))

    for w, wl in enumerate(cs.workloads):
        spread = wl.spec.spread
        cols = np.arange(starts[w], starts[w + 1])
        r = float(cs.replicas[w])
        if spread is not None and cs.domain[w] and (
                spread.min_domains > 1 or spread.max_domains is not None):
            dom_cols: dict[str, list[int]] = {}
            for c in cols:
                dom_cols.setdefault(cs.domain[w][int(x_o[c])], []).append(int(c))
            ys = []
            for dom, dc in dom_cols.items():
                yc = y(w, "spread", dom)
                ys.append(yc)
                for c in dc:
                    rows.add([c, yc], [1.0, -r], -math.inf, 0.0, ("spread", wl.id))
                rows.add([yc, *dc], [1.0] + [-1.0] * len(dc), -math.inf, 0.0,
                         ("spread", wl.id))
            m = float(min(spread.min_domains, int(r))) if r > 0 else 0.0
            if m > 1:
                rows.add([*ys, u_start + w], [r] * len(ys) + [m], m * r, math.inf,
                         ("spread", wl.id))
            if spread.max_domains is not None:
                rows.add(ys, [1.0] * len(ys), -math.inf, float(spread.max_domains),
                         ("spread", wl.id))
        if confl[w]:
            for c in cols:
                cname = cs.options[int(x_o[c])].cluster.name
                rows.add([int(c), y(w, "cluster", cname)], [1.0, -r], -math.inf, 0.0,
                         ("anti-affinity", wl.id))
    for w in range(len(cs.workloads)):
        for v in confl[w]:
            if v <= w:
                continue
            for (ww, kind, key), col in list(y_col.items()):
                if ww == w and kind == "cluster" and (v, "cluster", key) in y_col:
                    rows.add([col, y_col[(v, "cluster", key)]], [1.0, 1.0], -math.inf, 1.0,
                             ("anti-affinity", f"{cs.workloads[w].id}|{cs.workloads[v].id}"))
    return sorted(y_col, key=lambda k: y_col[k])


def weighted_rows(cs: CandidateSet, rows: Rows, x_o: IntArray, starts: IntArray) -> None:
    """(weighted) rows: Σ_{o: cl(o)=c} x_{w,o} <= T_{w,c} for every share of a weighted
    workload (`replicaSplit: weighted`, weighted.py).

    Upper bounds, not equalities: the shares add up to R_w and options outside them are
    infeasible, so with room everywhere the demand row makes them tight; without room in c
    the rest of c's share goes to u_w (unplaced), never to another cluster. One row per share
    whether or not it has columns yet, so the row set does not depend on the candidates
    (pricing.py rebuilds the model row for row).
    """
    cluster = np.array([o.cluster.name for o in cs.options], dtype=object)
    for w, wl in enumerate(cs.workloads):
        share = cs.target(w)
        if not share:
            continue
        cols = np.arange(starts[w], starts[w + 1])
        where = cluster[x_o[cols]] if cols.size else np.zeros(0, dtype=object)
        for cname, replicas in sorted(share.items()):
            sel = cols[where == cname]
            rows.add(sel, np.ones(sel.size), -math.inf, float(replicas),
                     ("weighted", f"{wl.id}|{cname}"))


def gpu_set_rows(cs: CandidateSet, rows: Rows, x_w: IntArray, x_o: IntArray,
                 n_col_of: dict[int, int]) -> dict[tuple[int, tuple[int, bool]], int]:
    """(gpu-sets) rows: Σ_{w of class k} x_{w,o} - K_{o,k} n_o <= S_{o,k} for every
    (option, class) of CandidateSet.gpu_sets; returns (option, class) -> row."""
    # n_col_of holds every option (lp.build), so each key's n column exists.
    out: dict[tuple[int, tuple[int, bool]], int] = {}
    if not cs.gpu_sets:
        return out
    cls_of = [gpu_class(w) for w in cs.workloads]
    by_key: dict[tuple[int, tuple[int, bool]], list[int]] = {}
    for col, (w, o) in enumerate(zip(x_w.tolist(), x_o.tolist(), strict=True)):
        cls = cls_of[w]
        if cls is not None and (o, cls) in cs.gpu_sets:
            by_key.setdefault((o, cls), []).append(col)
    # Every key gets its row, used by a column or not: the row set must not depend on the
    # candidates (pricing.py adds columns to a solved model).
    for key, (free, per_node) in cs.gpu_sets.items():
        cols = by_key.get(key, [])
        o, (k, nvlink) = key
        out[key] = len(rows.lo)
        name = f"{cs.options[o].key}:{k}{'-nvlink' if nvlink else ''}"
        rows.add([*cols, n_col_of[o]], [1.0] * len(cols) + [-float(per_node)], -math.inf,
                 float(free), ("gpu-sets", name))
    return out
