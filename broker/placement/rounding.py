"""From a fractional LP solution to integer placements, through the Ledger. Pure.

`load_integer` puts the integer part of x into a ledger (most valuable
workloads first: fixing a replica rounds its pool up to whole nodes, which can
use the last of a cluster's quota); `repair` fills what is left (the LP's
favourite columns first, then any feasible option by cost); `guided` is an
LP-guided greedy (most valuable, least flexible workload first). `to_columns`
turns a ledger back into a column vector (the MIP's warm start). The planner
keeps the cheapest of these and the greedy incumbent (see lp.py's strategy).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from broker.domain import WorkloadKind
from broker.placement import queueing
from broker.placement.candidates import BoolArray, CandidateSet, FloatArray, IntArray
from broker.placement.ledger import Ledger
from broker.placement.lp import Model


def load_integer(ledger: Ledger, model: Model, x: FloatArray, *, floor: bool,
                 pen: FloatArray | None = None) -> None:
    """Put a (rounded) column vector into the ledger, never past max_fit.

    With `pen`, the most valuable workloads are loaded first: fixing a
    replica rounds its pool up to whole nodes, which can use the last of a
    cluster's quota, and that should go to what would cost most to leave out.
    """
    vals = np.floor(x[:model.n_x] + 1e-6) if floor else np.rint(x[:model.n_x])
    if pen is None:
        order = np.argsort(-vals, kind="stable")
    else:
        order = np.lexsort((-vals, -pen[model.x_w]))
        order = order[vals[order] > 0]
    for c in order:
        m = int(vals[c])
        if m <= 0:
            continue
        w, o = int(model.x_w[c]), int(model.x_o[c])
        ledger.add(w, o, min(m, ledger.max_fit(w, o)))


def family_first(ledger: Ledger, model: Model, x: FloatArray, pen: FloatArray,
                 first: BoolArray, x_first: FloatArray | None = None) -> None:
    """The floor rounding and its repair for the workloads in `first`, then for the rest.

    `x_first`: the solution the workloads in `first` are rounded from (default `x`; the
    planner's "gpu-alone" rounding passes the LP of the family alone, planner._round).

    `load_integer` loads every workload's floor before `repair` fills any: a GPU job the LP
    splits (x = 0.6 here, 0.4 there) has floor 0, so the floors of CPU work take the CPU
    and memory of GPU nodes before the job is repaired, and it stays out. With the GPU
    family first (planner, batches decomposed by pool family) the jobs take their room and
    the CPU work goes around them: at 20000x2000 seed 1 the rounding went from 932,049 to
    903,554 (penalties 797,027 -> 767,737; replica costs 116,064 -> 116,657).
    """
    cols = first[model.x_w]
    for part in (cols, ~cols):
        src = x_first if part is cols and x_first is not None else x
        xs = src.copy()
        xs[:model.n_x][~part] = 0.0
        load_integer(ledger, model, xs, floor=True, pen=pen)
        mask = first if part is cols else ~first
        order = np.argsort(-pen, kind="stable")
        repair(ledger, model, src, pen, order=order[mask[order]])


def guided(ledger: Ledger, model: Model, x: FloatArray, pen: FloatArray) -> None:
    """LP-guided greedy: most valuable (then least flexible) workloads first, each on
    the options the LP liked most, then the cheapest others."""
    lens = np.array([c.size for c in ledger.cs.cand])
    repair(ledger, model, x, pen, order=np.lexsort((lens, -pen)))


def repair(ledger: Ledger, model: Model, x: FloatArray, pen: FloatArray,
           order: IntArray | None = None) -> None:
    """Fill what rounding left unplaced: highest penalty first, LP's favourites first."""
    cs = ledger.cs
    lp_x = x[:model.n_x]
    starts = np.concatenate(([0], np.cumsum([c.size for c in cs.cand])))
    for w in (np.argsort(-pen, kind="stable") if order is None else order):
        w = int(w)
        if ledger.placed(w) < cs.replicas[w]:
            seg = np.arange(starts[w], starts[w + 1])
            order = seg[np.lexsort((cs.cost[w, model.x_o[seg]], -lp_x[seg]))]
            ledger.fill(w, [int(model.x_o[c]) for c in order])
        if ledger.placed(w) < cs.replicas[w]:
            # The LP's columns are full: any other feasible option, cheapest first.
            row = cs.cost[w]
            rest = np.argsort(row, kind="stable")
            ledger.fill(w, rest[np.isfinite(row[rest])])
        if not ledger.spread_ok(w):
            ledger.remove(w)


def to_columns(ledger: Ledger, model: Model) -> FloatArray:
    """The ledger's solution as a full column vector (MIP warm start)."""
    cs = ledger.cs
    col = np.zeros(model.cost.size)
    n_o = len(cs.options)
    index = dict(zip((model.x_w * n_o + model.x_o).tolist(), range(model.n_x), strict=True))
    for w, xi in enumerate(ledger.x):
        for o, m in xi.items():
            k = index.get(w * n_o + o)
            if k is not None:
                col[k] = m
        col[model.u_start + w] = cs.replicas[w] - ledger.placed(w)
    for k, o in enumerate(model.n_opts):
        col[model.n_start + k] = ledger.new_nodes[int(o)]
    for k, (w, kind, key) in enumerate(model.y_keys):
        used = ledger.domains[w] if kind == "spread" else ledger.clusters_of_w[w]
        col[model.y_start + k] = 1.0 if used.get(key, 0) > 0 else 0.0
    return col


def _local_objective(ledger: Ledger, pen: FloatArray, ws: tuple[int, ...]) -> float:
    """The objective terms a move of `ws` can change: their replicas and penalties, and
    every new node's charge (a move may open or close nodes anywhere it touches)."""
    cs = ledger.cs
    total = float(ledger.node_usd @ ledger.new_nodes)
    for w in ws:
        total += sum(m * float(cs.cost[w, o]) for o, m in ledger.x[w].items())
        total += (int(cs.replicas[w]) - ledger.placed(w)) * float(pen[w])
        total += ledger.split_egress(w)
    return total


def _restore(ledger: Ledger, saved: dict[int, dict[int, int]]) -> None:
    for w in saved:
        ledger.remove(w)
    for w, xw in saved.items():
        for o, m in xw.items():
            ledger.add(w, o, m)


def improve(ledger: Ledger, pen: FloatArray, *, budget_s: float, per_option: int = 4,
            options_per_workload: int = 6, max_tries: int | None = None) -> int:
    """Ejection moves: make room for an unplaced workload by moving one placed workload.

    For each workload with unplaced replicas (highest penalty first), for its
    cheapest feasible options, try taking out one workload placed there,
    filling the unplaced one, then re-placing the one taken out anywhere it
    fits. Kept only if the two workloads' objective drops (and spread still
    holds); otherwise the ledger is restored exactly. Stops after `budget_s` of wall
    clock or `max_tries` tried moves (None: no cap; the count makes it deterministic);
    returns the number of moves kept. This closes most of what rounding leaves on large,
    tight batches, where one replica in the wrong pool blocks another.
    """
    cs = ledger.cs
    t0 = time.perf_counter()
    on_opt: dict[int, set[int]] = {}
    for w, xw in enumerate(ledger.x):
        for o in xw:
            on_opt.setdefault(o, set()).add(w)
    rows: dict[int, IntArray] = {}

    def by_cost(w: int) -> IntArray:
        """w's options cheapest first (infeasible last), sorted on first use: a move touches
        few workloads, and sorting every row (W x O) took 0.15 s at 5000x500 and 320 MB
        at 20000x2000."""
        if w not in rows:
            rows[w] = np.argsort(np.where(cs.feasible[w], cs.cost[w], np.inf), kind="stable")
        return rows[w]

    todo = [w for w in np.argsort(-pen, kind="stable").tolist()
            if ledger.placed(w) < cs.replicas[w] and cs.feasible[w].any()]
    kept = 0
    tries = 0
    cap = math.inf if max_tries is None else max_tries
    for w in todo:
        row = by_cost(w)
        opts = [int(o) for o in row[:options_per_workload] if np.isfinite(cs.cost[w, o])]
        for o in opts:
            if time.perf_counter() - t0 > budget_s or ledger.placed(w) >= cs.replicas[w] \
                    or tries >= cap:
                break
            victims = sorted(on_opt.get(o, ()), key=lambda v: (pen[v], v))[:per_option]
            for v in victims:
                if v == w or time.perf_counter() - t0 > budget_s or tries >= cap:
                    continue
                tries += 1
                saved = {w: dict(ledger.x[w]), v: dict(ledger.x[v])}
                before = _local_objective(ledger, pen, (w, v))
                ledger.remove(v)
                ledger.fill(w, row[np.isfinite(cs.cost[w, row])])
                v_row = by_cost(v)
                ledger.fill(v, v_row[np.isfinite(cs.cost[v, v_row])])
                after = _local_objective(ledger, pen, (w, v))
                if after < before - 1e-6 and ledger.spread_ok(w) and ledger.spread_ok(v):
                    kept += 1
                    for ww in (w, v):
                        for oo in saved[ww]:
                            on_opt.get(oo, set()).discard(ww)
                        for oo in ledger.x[ww]:
                            on_opt.setdefault(oo, set()).add(ww)
                    break
                _restore(ledger, saved)
    return kept


def merge_splits(ledger: Ledger, pen: FloatArray, *, budget_s: float,
                 max_tries: int | None = None) -> int:
    """Moves that put a workload whose replicas run in several clusters into one of them.

    Every cluster that runs a replica needs the whole input (`Ledger.split_egress`), which
    the LP and the MIP price as one shared copy, so their solutions split a workload where
    a pool runs out of room and pay the copy again in each further cluster. For each such
    workload (largest split egress first), for each cluster it runs in (most replicas
    first), then a few it could run in (`_merge_clusters`): take it out and fill it again
    on that cluster's options, cheapest first. Kept only if no replica is left unplaced
    that was placed, spread still holds and the objective of the move (its replicas, its
    copies, every node charge) drops; else restored. Passes over what is still split
    until one keeps nothing (a kept move frees room). Stops after `budget_s` of wall clock
    or `max_tries` tried moves; returns the number of moves kept.
    """
    cs = ledger.cs
    t0 = time.perf_counter()
    cap = math.inf if max_tries is None else max_tries
    cluster = np.asarray(ledger.cluster_of, dtype=object)
    rows: dict[int, IntArray] = {}
    kept = tries = 0
    while True:  # passes: a kept move frees room that an earlier failed one may need
        split = [(ledger.split_egress(w), w) for w in range(len(cs.workloads))
                 if len(ledger.clusters_of_w[w]) > 1]
        todo = [w for e, w in sorted(split, key=lambda t: (-t[0], t[1])) if e > 0]
        kept_before = kept
        for w in todo:
            if w not in rows:
                rows[w] = _by_cost(cs, w)
            row = rows[w]
            for cname in _merge_clusters(ledger, w, cluster[row].tolist()):
                if time.perf_counter() - t0 > budget_s or tries >= cap:
                    return kept
                tries += 1
                saved = {w: dict(ledger.x[w])}
                placed = ledger.placed(w)
                before = _local_objective(ledger, pen, (w,))
                ledger.remove(w)
                ledger.fill(w, row[cluster[row] == cname])
                if ledger.placed(w) >= placed and ledger.spread_ok(w) and \
                        _local_objective(ledger, pen, (w,)) < before - 1e-6:
                    kept += 1
                    break
                _restore(ledger, saved)
        if kept == kept_before:
            return kept


def _by_cost(cs: CandidateSet, w: int) -> IntArray:
    """w's feasible options (finite cost), cheapest first."""
    row = np.where(cs.feasible[w], cs.cost[w], np.inf)
    order = np.argsort(row, kind="stable")
    out: IntArray = order[np.isfinite(row[order])]
    return out


def _merge_clusters(ledger: Ledger, w: int, by_cost: list[str]) -> list[str]:
    """The clusters merge_splits tries for w: those it runs in (most replicas first), then
    those of its cheapest options (`by_cost`: their clusters, cheapest option first) it
    does not run in (MERGE_OTHER_CLUSTERS of them)."""
    here = [c for c, _ in sorted(ledger.clusters_of_w[w].items(), key=lambda t: (-t[1], t[0]))]
    elsewhere: list[str] = []
    for c in by_cost:
        if c not in here and c not in elsewhere:
            elsewhere.append(c)
            if len(elsewhere) >= MERGE_OTHER_CLUSTERS:
                break
    return here + elsewhere


# merge_splits also tries the clusters of this many of a workload's cheapest options that
# it does not run in yet (one that has room for all its replicas where none of its own has).
MERGE_OTHER_CLUSTERS = 3


# close_nodes leaves a pool whose last new node is more than this full: emptying most of a
# node into room the rounding already filled cheapest-first rarely fits. On the 1000x200
# bench batch the tries past it kept 6 moves of 60 for 7 % of the gain and 85 % of the time.
CLOSE_MAX_FILL = 0.75


def close_nodes(ledger: Ledger, pen: FloatArray, *, budget_s: float,
                max_tries: int | None = None, max_fill: float = CLOSE_MAX_FILL) -> int:
    """Node-closing moves: re-pack the workloads of a pool so it opens one node fewer.

    The roundings fill options cheapest-replica first, so a pool often opens a node for a
    few replicas that fit in room other pools already pay for (running or opened nodes).
    For each pool with new nodes whose last node is at most `max_fill` used (emptiest
    first), take out every workload on it, then put them back (most valuable, then
    largest first), each on its cheapest options, with no pool allowed more new nodes
    than before and this pool one fewer; what does not fit then is filled with only this
    pool held to one fewer. Kept only if the objective (their costs, penalties and split
    copies, every node charge) drops and spread still holds, else restored; a pool is
    tried again after a kept move, and left after a failed one. Stops after `budget_s`
    of wall clock or `max_tries` tried moves; returns the number of moves kept. On the
    1000x200 bench batch: 27 moves, 61.14 USD (10,382.68 -> 10,321.54), 0.02 s CPU;
    without the fill limit 35 moves, 65.64 USD, 0.18 s.
    """
    cs = ledger.cs
    t0 = time.perf_counter()
    cap = math.inf if max_tries is None else max_tries
    on_opt: dict[int, set[int]] = {}
    for w, xw in enumerate(ledger.x):
        for o in xw:
            on_opt.setdefault(o, set()).add(w)
    rows: dict[int, IntArray] = {}

    def by_cost(w: int) -> IntArray:
        if w not in rows:
            rows[w] = _by_cost(cs, w)
        return rows[w]

    size = np.max(cs.demand / np.maximum(cs.table.node.max(axis=0), 1e-9), axis=1) \
        * cs.replicas
    table_add = ledger.can_add
    todo = sorted((int(o) for o in np.flatnonzero(ledger.new_nodes > 0)),
                  key=lambda o: (ledger.last_node_fill(o), o))
    kept = tries = 0
    for o in todo:
        while ledger.new_nodes[o] > 0 and ledger.last_node_fill(o) <= max_fill and \
                tries < cap and time.perf_counter() - t0 <= budget_s:
            tries += 1
            ws = tuple(sorted(on_opt.get(o, ()), key=lambda w: (-pen[w], -size[w], w)))
            saved = {w: dict(ledger.x[w]) for w in ws}
            before = _local_objective(ledger, pen, ws)
            limit = np.minimum(table_add, ledger.new_nodes)
            limit[o] -= 1
            for w in ws:
                ledger.remove(w)
            try:
                ledger.can_add = limit
                for w in ws:
                    ledger.fill(w, by_cost(w))
                no_o = table_add.copy()
                no_o[o] = limit[o]
                ledger.can_add = no_o
                for w in ws:
                    if ledger.placed(w) < cs.replicas[w]:
                        ledger.fill(w, by_cost(w))
            finally:
                ledger.can_add = table_add
            after = _local_objective(ledger, pen, ws)
            if after < before - 1e-6 and all(ledger.spread_ok(w) for w in ws):
                kept += 1
                for w in ws:
                    for oo in saved[w]:
                        on_opt.get(oo, set()).discard(w)
                    for oo in ledger.x[w]:
                        on_opt.setdefault(oo, set()).add(w)
                continue
            _restore(ledger, saved)
            break
    return kept


def release_unserving(ledger: Ledger, pen: FloatArray,
                      running: Sequence[Mapping[str, int]]) -> int:
    """Take out placements of latency-SLO services that cannot serve, and give their room to
    the rest; returns the services released.

    A service with a latency SLO placed short of the replicas it asked for can serve
    nothing: its whole load (what its asked replicas and those already running were sized
    for, queueing.offered_load) spreads over the replicas that run, and where they are too
    few every cluster's RTT + M/M/c wait exceeds the SLO (queueing.served_in_slo, the count
    the twin's SLO metric makes). Those replicas cost and hold room that another workload
    could serve from. The program prices every placed replica alike and cannot see this
    (on a hand-built scarce site it filled the room with 14 of a 40-replica service's
    replicas, which serve none, and left a 4-replica service that fit unplaced:
    tests/unit/test_slo_queueing.py); this pass does:
    each such service placed short of its asked replicas whose placement, counted with its
    `running` replicas (per workload: running replicas per cluster), serves none (most
    replicas first) is taken out, and the other workloads with replicas unplaced, highest
    penalty first, are filled again, cheapest options first (a fill kept only if it lowers
    their objective terms, spread holds and, for a latency-SLO service, it serves). The
    release is kept only if some fill was: where nothing else can use the room, the
    partial placement stays, as a step to a later epoch's whole one (released each epoch
    it never grows: measured on a held-out draft, one 11-replica service went from 28 %
    to 100 % of its time violating).
    A service placed with all it asked for is never taken out, serving or not: running
    slowly is more than not running.
    """
    cs = ledger.cs
    first_opt: dict[str, int] = {}
    for o, c in enumerate(ledger.cluster_of):
        first_opt.setdefault(c, o)

    def asked(i: int) -> int:
        spec = cs.workloads[i].spec
        return queueing.asked_replicas(spec.replicas, spec.slo_utilization)

    def serves(i: int) -> bool:
        spec = cs.workloads[i].spec
        per = dict(running[i])
        for c, m in ledger.clusters_of_w[i].items():
            per[c] = per.get(c, 0) + m
        load = queueing.offered_load(asked(i) + sum(running[i].values()))
        sets = []
        for c, m in per.items():
            o = first_opt.get(c)
            rtt = float(cs.rtt_ms[i, o]) if o is not None else math.nan
            sets.append((rtt if math.isfinite(rtt) else 0.0, m))  # unknown: as the twin
        assert spec.latency_slo_ms is not None
        return queueing.served_in_slo(sets, load, spec.latency_slo_ms) > 0

    slo = [i for i, w in enumerate(cs.workloads)
           if w.spec.kind is WorkloadKind.SERVICE and w.spec.latency_slo_ms is not None
           and w.spec.user_region is not None]
    # Replicas placed before this pass, most first: the largest idle placement frees most.
    idle = sorted((i for i in slo if 0 < ledger.placed(i) < asked(i) and not serves(i)),
                  key=lambda i: (-ledger.placed(i), i))
    if not idle:
        return 0
    is_slo = set(slo)
    order = np.argsort(-pen, kind="stable").tolist()
    out: set[int] = set()
    for i in idle:
        # An earlier release's refill may have filled i since: judge it as it is now.
        if not 0 < ledger.placed(i) < asked(i) or serves(i):
            continue
        had = ledger.placed(i)
        saved = {i: dict(ledger.x[i])}
        ledger.remove(i)
        gained = 0
        for w in order:
            if w == i or w in out or ledger.placed(w) >= cs.replicas[w] \
                    or not cs.feasible[w].any():
                continue
            before_x = dict(ledger.x[w])
            before = _local_objective(ledger, pen, (w,))
            if ledger.fill(w, _by_cost(cs, w)) == 0:
                continue
            if (_local_objective(ledger, pen, (w,)) >= before - 1e-6
                    or not ledger.spread_ok(w) or (w in is_slo and not serves(w))):
                _restore(ledger, {w: before_x})
                continue
            saved.setdefault(w, before_x)
            gained += 1
        if gained:
            out.add(i)
            ledger.released[i] = had
        else:
            _restore(ledger, saved)
    return len(out)
