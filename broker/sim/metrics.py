"""The twin's metrics: SCENARIO.md's keys, integrated over simulated time.

Formulas (also in docs/twin.md):
- utilization_cpu = integral(reserved vCPU) / integral(provisioned vCPU) over every paid node
  (booting nodes included: they are billed; edge/onprem sites included: they are paid for).
  utilization_gpu the same over GPUs (None without GPUs).
- cost_usd = integral(sum over nodes of price_usd_per_hour)/3600 + egress of data moves
  (catalog USD/GB) + edge/onprem sites at their amortised price_per_hour.
- scale_out_response_s_p50/p95: from a `scale` event (or a service submit) to the moment its
  requested replica count runs; requests still open at the horizon count as (horizon - t).
- cross_zone_traffic_frac = cross bytes / all bytes, over data moves (cross when source and
  destination regions differ), replica-to-replica traffic of multi-replica services
  (SERVICE_PEER_GB_PER_REPLICA_HOUR per replica, the fraction of replica pairs in different
  (cluster, zone) domains, each replica in the zone of the node it runs on) and user traffic
  under topology-aware routing (SERVICE_USER_GB_PER_REPLICA_HOUR per desired replica, split
  over the clusters serving it by replicas, each cluster's share entering its zones evenly;
  the share entering a zone without replicas of the service crosses a zone).
- gpu_job_start_s_p50: train jobs with GPUs, submit -> all replicas running (placement +
  provisioning + image pull + data move); jobs not started by the horizon count as
  (horizon - submit).
- gpu_util_std: the time-weighted standard deviation, across GPUs, of each GPU's busy fraction
  over its paid lifetime: every `sample_s` each paid GPU node (booting ones included) adds
  `sample_s` of paid time to each of its GPUs and busy time to the first `used` of them (GPUs
  are allocated lowest index first); at the end f_g = busy_g / paid_g, weights w_g = paid_g,
  std = sqrt(sum w (f - mean_w f)^2 / sum w). An idle, paid GPU counts 0 for as long as it is
  paid, so packing work onto fewer GPUs and releasing the rest never scores worse.
- speedup_8gpu: mean placement/training.py speedup of the 8-GPU jobs as they ran (where their GPUs
  were: one node's topology, or several nodes over RDMA/TCP, zones, clusters).
- slo_violation_frac = integral(violating replica-s) / integral(target replica-s) over every
  service from its submission until it ends: target = the replicas it asks for now (desired);
  violating = target minus the replicas that serve it: running replicas, and for a service
  with a latency SLO only those in clusters where RTT(user_region, cluster) + the M/M/c
  waiting time (placement/queueing.py, offered load from the desired replica count) <= SLO.
  SCENARIO.md: "fewer ready replicas than it asked for" is a violation, so replicas never
  placed count from the moment they were asked for (start-up, a scale-out that boots, work
  a policy leaves unplaced), as do replicas lost to a failure or serving out of SLO. Before
  2026-12-01 only latency-SLO services counted, with target = min(desired, most replicas
  ever running), so a service a policy never placed counted nothing: on federation-day the
  seed's greedy left 56 % of the first epoch's replicas (services too large for one pool)
  unplaced for hours and looked 30 % cheaper than lp while serving a third less.
- queued_replica_h = integral(replicas waiting for placement) / 3600, jobs and services alike:
  work a policy has not started, which cost_usd does not see.
- unfinished_gpu_h: GPU-hours of training work, at the trace's (reference-hardware) run
  time, that the run had not done by the horizon: a GPU train job never started counts its
  whole run x its GPUs, one stopped counts what its last checkpoint did not keep, one running
  what its placement-dependent run (placement/training.py) still had to go. cost_usd stops
  billing at the horizon, so a policy that runs jobs on slower GPUs, or starts them later,
  pays less inside the horizon for less work done; this is that work (lower is better).
- cost_with_unfinished_usd = cost_usd + unfinished_gpu_h x the scenario's cheapest list price
  of one reference-GPU-hour of training on a cloud on-demand pool: min over its cloud GPU
  pools that are not spot of price_usd_per_hour / (GPUs per node x gpu_throughput of the
  model) (placement/training.py; the scenario's list price, before any price event). What
  finishing the work left at the horizon would cost at least, so a policy that leaves more
  of it does not look cheaper for that (a lower bound: it ignores multi-GPU slowdowns and
  any wait); cost_usd where the scenario has no such pool.
- user_rtt_ms_mean = integral(sum over running replicas of services with a user region of
  RTT(user region, the replica's cluster)) / integral(those replicas), in ms (None without
  such services; lower is better). slo_violation_frac sees latency only where a service
  states an SLO; this is what every service's users wait on the network, so a policy that
  serves users from a cheap region far away shows it here.
- unplaced: workloads with replicas still pending at the horizon that a planning epoch left
  pending: an epoch ran after they last joined the queue (`WorkloadState.queued_for_epoch`).
  Replicas the horizon's own epoch evicts (a drain, a consolidation) would be placed at the
  next epoch, which the run does not reach: before 2026-12-02 they counted, so a policy that
  consolidates looked as if it left work unplaced (lp 0.2-0.4 on retail-peak and edge-heavy).
- decision_ms_p99: wall-clock ms of the planner call (plus observe + forward pass for lp+rl
  in the epochs where the policy decides).
"""

from __future__ import annotations

import math
import operator
import statistics
from collections import Counter
from collections.abc import Iterable
from itertools import compress, count
from typing import TYPE_CHECKING

import numpy as np

from broker.placement import queueing, training
from broker.sim import physics
from broker.sim.state import Group, Node, SimPool, WorkloadState

if TYPE_CHECKING:
    from broker.sim.engine import Engine

_ZONE = operator.attrgetter("zone")
_VERSION = operator.attrgetter("version")
_PRICE_FACTOR = operator.attrgetter("price_factor")
_PENDING = operator.attrgetter("pending")
METRIC_KEYS = (
    "utilization_cpu", "utilization_gpu", "cost_usd", "scale_out_response_s_p50",
    "scale_out_response_s_p95", "cross_zone_traffic_frac", "gpu_job_start_s_p50",
    "gpu_util_std", "speedup_8gpu", "slo_violation_frac", "unplaced", "queued_replica_h",
    "unfinished_gpu_h", "cost_with_unfinished_usd", "user_rtt_ms_mean", "decision_ms_p99",
)


class Metrics:
    """Accumulators updated by the engine; `result()` gives SCENARIO.md's dict."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dirty = True
        self._all_pools: list[SimPool] | None = None
        # Per pool (in `_pools` order, from row 1): its five terms of the rates, and the
        # versions and price factors they were computed at (`_rates`).
        self._terms: np.ndarray | None = None
        self._seen: tuple[list[int], list[float]] | None = None
        # The same terms integrated per pool up to `_pool_t` (each row x seconds), and the
        # end of the last interval integrated (`pool_costs`: where the money went).
        self._pool_acc: np.ndarray | None = None
        self._pool_t = self._t = 0.0
        self.cost_rate = self.cpu_used = self.cpu_prov = self.gpu_used = self.gpu_prov = 0.0
        self.cost_usd = self.cpu_used_s = self.cpu_prov_s = self.gpu_used_s = 0.0
        self.gpu_prov_s = self.egress_usd = 0.0
        self.traffic_rate = self.xz_rate = self.slo_target = self.slo_violation = 0.0
        self.traffic_gb = self.xz_gb = self.slo_target_s = self.slo_violation_s = 0.0
        self.queue_replica_s = 0.0
        self.rtt_rate = self.rtt_replicas = self.rtt_ms_s = self.rtt_replica_s = 0.0
        self._pending_version = -1
        self._pending_cache = 0
        self.scale_out_s: list[float] = []
        self.gpu_start_s: list[float] = []
        self.speedups_8gpu: list[float] = []
        self.decision_ms: list[float] = []
        # Per GPU node: (node, its GPU count, paid seconds, busy seconds of each GPU index).
        self.gpu_time: dict[int, tuple[Node, int, list[float]]] = {}
        self.gpu_paid_s: dict[int, float] = {}
        self.faults_applied = 0
        self.hazard_reclaims = 0  # spot nodes reclaimed by the hazard (sim/hazard.py)
        self.consolidated_nodes = 0  # non-empty nodes drained and removed (consolidate.py)
        self.replaced_nodes = 0  # nodes drained once their cheaper replacement was up
        self.prewarmed_nodes = 0
        self.migrations: dict[str, int] = {}  # moves started, by Migration.reason
        self.unplaced_reasons: dict[str, str] = {}
        self.series: list[dict[str, float]] = []

    # ---------------------------------------------------------------- updates
    def pools_changed(self) -> None:
        self._dirty = True

    def _rates(self) -> None:
        """The cost and utilisation rates: each a sum over every pool, pool after pool in one
        fixed order. Each pool's terms are kept in a row of `_terms`, computed again only
        where the pool's version or price factor moved; the sums run down the rows in C
        (`np.add.accumulate`: one addition after another from 0.0, a Python loop's very
        floats; not `sum`, which rounds otherwise from Python 3.12, nor `np.sum`, whose
        order numpy does not promise)."""
        pools = self._pools()
        versions = list(map(_VERSION, pools))
        factors = list(map(_PRICE_FACTOR, pools))
        terms, last = self._terms, self._seen
        moved: Iterable[int] = range(len(pools))
        if terms is None or last is None:
            terms = self._terms = np.zeros((len(pools) + 1, 5))  # row 0: the sums' 0.0
        else:
            moved = compress(count(), map(operator.or_, map(operator.ne, versions, last[0]),
                                          map(operator.ne, factors, last[1])))
        for i in moved:
            # A pool's terms change only with its version or price (state.py); a pool
            # without GPUs has GPU terms 0.0 and 0, which leave the sums as they are.
            p = pools[i]
            n = p.nodes
            gpus = p.node.gpu
            terms[i + 1] = (n * p.price_usd_per_hour, n * p.node.cpu, p.used_cpu,
                            n * gpus if gpus else 0.0, p.used_gpu if gpus else 0)
        self._seen = (versions, factors)
        cost, cpu_p, cpu_u, gpu_p, gpu_u = np.add.accumulate(terms, axis=0)[-1].tolist()
        self.cost_rate, self.cpu_used, self.cpu_prov = cost / 3600.0, cpu_u, cpu_p
        self.gpu_used, self.gpu_prov = gpu_u, gpu_p
        self._dirty = False

    def _pools(self) -> list[SimPool]:
        """Every pool, cluster by cluster (the engine's clusters and pools never change)."""
        if self._all_pools is None:
            self._all_pools = [p for c in self.engine.clusters.values() for p in c.pools]
        return self._all_pools

    def _refresh(self, t: float) -> None:
        """Integrate each pool's terms up to `t` at the rates they had, then recompute the
        rates (only when a pool changed: between changes the rows are constant)."""
        if self._terms is not None and self._pool_acc is not None:
            self._pool_acc += self._terms[1:] * (t - self._pool_t)
        self._rates()
        if self._pool_acc is None and self._terms is not None:
            self._pool_acc = np.zeros_like(self._terms[1:])
        self._pool_t = t

    def integrate(self, t0: float, t1: float) -> None:
        if self._dirty:
            self._refresh(t0)
        self._t = t1
        dt = t1 - t0
        self.cost_usd += self.cost_rate * dt
        self.cpu_used_s += self.cpu_used * dt
        self.cpu_prov_s += self.cpu_prov * dt
        self.gpu_used_s += self.gpu_used * dt
        self.gpu_prov_s += self.gpu_prov * dt
        self.traffic_gb += self.traffic_rate * dt
        self.xz_gb += self.xz_rate * dt
        self.slo_target_s += self.slo_target * dt
        self.slo_violation_s += self.slo_violation * dt
        self.rtt_ms_s += self.rtt_rate * dt
        self.rtt_replica_s += self.rtt_replicas * dt
        if self.engine.pending:
            self.queue_replica_s += self._pending_replicas() * dt

    def _pending_replicas(self) -> int:
        """Replicas waiting for placement; cached per engine state version (cheap per event)."""
        version = self.engine.state_version
        if version != self._pending_version:
            self._pending_version = version
            eng = self.engine  # counted in C (ints: the same sum)
            self._pending_cache = sum(map(_PENDING, map(eng.workloads.__getitem__, eng.pending)))
        return self._pending_cache

    def data_moved(self, gb: float, *, cross: bool, egress_usd: float) -> None:
        self.traffic_gb += gb
        if cross:
            self.xz_gb += gb
        self.egress_usd += egress_usd

    def service_changed(self, ws: WorkloadState) -> None:
        """Recompute this service's traffic and SLO contributions (rates per second)."""
        if ws.ev.kind != "service":
            return
        self.traffic_rate -= ws.traffic_rate
        self.xz_rate -= ws.xz_rate
        self.slo_target -= ws.slo_target
        self.slo_violation -= ws.slo_violation
        self.rtt_rate -= ws.rtt_rate
        self.rtt_replicas -= ws.rtt_replicas
        running = [g for g in ws.groups if g.running] if not ws.finished else []
        ws.traffic_rate, ws.xz_rate = self._service_traffic(ws, running)
        ws.rtt_rate = ws.rtt_replicas = 0.0
        if ws.ev.user_region:
            rtt = self.engine.rtt
            for g in running:
                ms = rtt.get((ws.ev.user_region, g.cluster))
                if ms is not None:  # a region the scenario does not place is not guessed
                    ws.rtt_rate += g.count * ms
                    ws.rtt_replicas += g.count
        self.rtt_rate += ws.rtt_rate
        self.rtt_replicas += ws.rtt_replicas
        ws.slo_target = ws.slo_violation = 0.0
        if not ws.finished:
            slo = ws.ev.latency_slo_ms
            served = self._served_in_slo(ws, running, slo) \
                if slo is not None and ws.ev.user_region else sum(g.count for g in running)
            ws.slo_target = float(ws.desired)
            ws.slo_violation = float(max(0, ws.desired - served))
        self.traffic_rate += ws.traffic_rate
        self.xz_rate += ws.xz_rate
        self.slo_target += ws.slo_target
        self.slo_violation += ws.slo_violation

    def _service_traffic(self, ws: WorkloadState, running: list[Group]) -> tuple[float, float]:
        """(bytes/s, cross-zone bytes/s) of a service: peer traffic plus routed user traffic."""
        eng = self.engine
        zones_of: dict[str, Counter[int]] = {}
        for g in running:  # replicas per zone (zones in the order first met), per group kept
            zc = g.zones
            if zc is None or zc[0] != len(g.nodes):
                zc = g.zones = (len(g.nodes), Counter(map(_ZONE, g.nodes)))
            zones_of.setdefault(g.cluster, Counter()).update(zc[1])
        n = sum(sum(z.values()) for z in zones_of.values())
        if n == 0:
            return 0.0, 0.0
        peer = physics.SERVICE_PEER_GB_PER_REPLICA_HOUR / 3600.0 * n if n > 1 else 0.0
        counts = [float(c) for z in zones_of.values() for c in z.values()]
        xz = peer * physics.cross_pair_fraction(counts)
        user = physics.SERVICE_USER_GB_PER_REPLICA_HOUR / 3600.0 * max(ws.desired, n)
        for cluster, per in zones_of.items():
            share = user * sum(per.values()) / n
            zones = max(1, len(eng.clusters[cluster].spec.zones))
            xz += share * (zones - len(per)) / zones
        return peer + user, xz

    def _served_in_slo(self, ws: WorkloadState, running: list[Group], slo: float) -> int:
        """Running replicas whose cluster answers within the SLO (queueing.served_in_slo)."""
        per_cluster: dict[str, int] = {}
        for g in running:
            per_cluster[g.cluster] = per_cluster.get(g.cluster, 0) + g.count
        rtt = self.engine.rtt
        region = ws.ev.user_region or ""
        return queueing.served_in_slo(
            ((rtt.get((region, cluster), 0.0), c) for cluster, c in per_cluster.items()),
            queueing.offered_load(ws.desired), slo)

    def sample(self, now: float) -> None:
        if self._dirty:
            self._refresh(now)
        dt = self.engine.config.sample_s
        for c in self.engine.clusters.values():
            for p in c.pools:
                gpus = p.node.gpu
                if not gpus:
                    continue
                for n in p.node_list:
                    entry = self.gpu_time.get(id(n))
                    if entry is None:
                        entry = (n, gpus, [0.0] * gpus)
                        self.gpu_time[id(n)] = entry
                    self.gpu_paid_s[id(n)] = self.gpu_paid_s.get(id(n), 0.0) + dt
                    busy = entry[2]
                    for i in range(gpus - n.gpu_free):
                        busy[i] += dt
        self.series.append({
            "t_s": now, "cost_usd": self.cost_usd + self.egress_usd,
            "utilization_cpu": self.cpu_used / self.cpu_prov if self.cpu_prov else 0.0,
            "utilization_gpu": self.gpu_used / self.gpu_prov if self.gpu_prov else 0.0,
            "nodes": float(sum(p.nodes for c in self.engine.clusters.values() for p in c.pools)),
        })

    def gpu_util_std(self) -> float | None:
        """Time-weighted std across GPUs of busy / paid time (module docstring)."""
        fracs: list[tuple[float, float]] = []
        for key, (_, gpus, busy) in self.gpu_time.items():
            paid = self.gpu_paid_s.get(key, 0.0)
            if paid > 0:
                fracs.extend((min(1.0, b / paid), paid) for b in busy[:gpus])
        total = sum(w for _, w in fracs)
        if len(fracs) < 2 or total <= 0:
            return None
        mean = sum(f * w for f, w in fracs) / total
        return math.sqrt(sum(w * (f - mean) ** 2 for f, w in fracs) / total)

    def pool_costs(self) -> list[dict[str, object]]:
        """Where the money went: per pool, what its nodes cost over the run (`usd`; the
        pool's share of `cost_usd` without the egress of data moves), its node-hours, and
        the CPU and GPU utilisation of what it paid for (None for a pool without GPUs); the
        most expensive first, pools that cost nothing left out. The rows sum to `cost_usd`
        less egress (the same terms as the rates, integrated pool by pool)."""
        if self._terms is None or self._pool_acc is None:
            return []
        acc = self._pool_acc + self._terms[1:] * (self._t - self._pool_t)
        rows: list[tuple[float, str, str, dict[str, object]]] = []
        for sim, row in zip(self._pools(), acc.tolist(), strict=True):
            usd_s, cpu_p, cpu_u, gpu_p, gpu_u = row
            if usd_s <= 0:
                continue
            rows.append((usd_s, sim.cluster, sim.name, {
                "cluster": sim.cluster, "pool": sim.name, "usd": round(usd_s / 3600.0, 4),
                "node_h": round(cpu_p / sim.node.cpu / 3600.0, 3) if sim.node.cpu else None,
                "utilization_cpu": round(cpu_u / cpu_p, 4) if cpu_p > 0 else None,
                "utilization_gpu": round(gpu_u / gpu_p, 4) if gpu_p > 0 else None}))
        rows.sort(key=lambda r: (-r[0], r[1], r[2]))
        return [r[3] for r in rows]

    # ---------------------------------------------------------------- result
    def censored(self) -> tuple[list[float], list[float]]:
        """Scale-out and GPU-start samples including the ones still open at the horizon."""
        eng = self.engine
        horizon = eng.scenario.horizon_s
        scale = list(self.scale_out_s)
        gpu = list(self.gpu_start_s)
        for ws in eng.workloads.values():
            if ws.finished:
                continue
            scale.extend(horizon - t for t, _ in ws.scale_requests)
            if ws.ev.kind == "train" and ws.ev.gpu > 0 and not ws.ever_started:
                gpu.append(horizon - ws.ev.submit_s)
        return scale, gpu

    def unfinished_gpu_h(self) -> float:
        """Reference GPU-hours of training work not done by the horizon (module docstring)."""
        horizon = self.engine.scenario.horizon_s
        left_h = 0.0
        for ws in self.engine.workloads.values():
            ev = ws.ev
            if ws.finished or ev.kind != "train" or ev.gpu <= 0:
                continue
            done = ws.done_frac
            if ws.run_from_s is not None and ws.run_full_s > 0:
                done += max(0.0, horizon - ws.run_from_s) / ws.run_full_s
            left_h += max(0.0, 1.0 - done) * (ev.duration_s or 0.0) / 3600.0 \
                * ev.gpu * ev.replicas
        return left_h

    def reference_gpu_hour_usd(self) -> float | None:
        """The cheapest on-demand list price of a reference-GPU-hour among the scenario's
        cloud GPU pools (module docstring); None without one."""
        prices = [p.price_usd_per_hour / (p.node.gpu * training.gpu_throughput(p.gpu_model))
                  for c in self.engine.scenario.clusters if not c.fixed
                  for p in c.pools if p.node.gpu > 0 and not p.spot]
        return min(prices) if prices else None

    def result(self) -> dict[str, object]:
        eng = self.engine
        scale, gpu = self.censored()

        def rnd(x: float | None, nd: int = 4) -> float | None:
            return None if x is None else round(x, nd)

        cost = self.cost_usd + self.egress_usd
        unfinished_h, gpu_h_usd = self.unfinished_gpu_h(), self.reference_gpu_hour_usd()
        unplaced = sum(1 for ws in eng.workloads.values()
                       if ws.pending > 0 and not ws.finished
                       and eng.epochs_run >= ws.queued_for_epoch)
        return {
            "utilization_cpu": rnd(self.cpu_used_s / self.cpu_prov_s if self.cpu_prov_s else None),
            "utilization_gpu": rnd(self.gpu_used_s / self.gpu_prov_s if self.gpu_prov_s else None),
            "cost_usd": round(cost, 2),
            "scale_out_response_s_p50": rnd(physics.percentile(scale, 50), 1),
            "scale_out_response_s_p95": rnd(physics.percentile(scale, 95), 1),
            "cross_zone_traffic_frac": rnd(self.xz_gb / self.traffic_gb if self.traffic_gb
                                           else 0.0),
            "gpu_job_start_s_p50": rnd(physics.percentile(gpu, 50), 1),
            "gpu_util_std": rnd(self.gpu_util_std()),
            "speedup_8gpu": rnd(statistics.fmean(self.speedups_8gpu)
                                if self.speedups_8gpu else None, 3),
            "slo_violation_frac": rnd(self.slo_violation_s / self.slo_target_s
                                      if self.slo_target_s else 0.0, 5),
            "unplaced": unplaced,
            "queued_replica_h": round(self.queue_replica_s / 3600.0, 2),
            "unfinished_gpu_h": round(unfinished_h, 2),
            "cost_with_unfinished_usd": round(cost + unfinished_h * (gpu_h_usd or 0.0), 2),
            "user_rtt_ms_mean": round(self.rtt_ms_s / self.rtt_replica_s, 2)
            if self.rtt_replica_s > 0 else None,
            "decision_ms_p99": rnd(physics.percentile(self.decision_ms, 99), 2),
        }
