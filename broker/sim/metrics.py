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
  destination regions differ) and replica-to-replica traffic of multi-replica services
  (SERVICE_PEER_GB_PER_REPLICA_HOUR per replica, the fraction of replica pairs in different
  (cluster, zone) domains; replicas spread evenly over a cluster's zones, as the default
  Kubernetes topology spread does).
- gpu_job_start_s_p50: train jobs with GPUs, submit -> all replicas running (placement +
  provisioning + image pull + data move); jobs not started by the horizon count as
  (horizon - submit).
- gpu_util_std: every `sample_s`, the population std of per-node GPU allocation fraction over
  ready GPU nodes; averaged over samples with >= 2 GPU nodes.
- speedup_8gpu: mean physics.speedup of jobs using 8 GPUs, under the interconnect they got.
- slo_violation_frac = integral(violating replica-s) / integral(target replica-s) over services
  with a latency SLO: target = min(desired, most replicas ever running); violating = target
  minus replicas running where RTT(user_region, cluster) <= SLO. (Initial start-up is scale-out
  response, not an SLO violation; losing served replicas to a failure is.)
- unplaced: workloads with replicas still pending at the horizon.
- decision_ms_p99: wall-clock ms of the planner call (plus observe + forward pass for lp+rl
  in the epochs where the policy decides).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from broker.sim import physics
from broker.sim.state import WorkloadState

if TYPE_CHECKING:
    from broker.sim.engine import Engine

METRIC_KEYS = (
    "utilization_cpu", "utilization_gpu", "cost_usd", "scale_out_response_s_p50",
    "scale_out_response_s_p95", "cross_zone_traffic_frac", "gpu_job_start_s_p50",
    "gpu_util_std", "speedup_8gpu", "slo_violation_frac", "unplaced", "decision_ms_p99",
)


class Metrics:
    """Accumulators updated by the engine; `result()` gives SCENARIO.md's dict."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dirty = True
        self.cost_rate = self.cpu_used = self.cpu_prov = self.gpu_used = self.gpu_prov = 0.0
        self.cost_usd = self.cpu_used_s = self.cpu_prov_s = self.gpu_used_s = 0.0
        self.gpu_prov_s = self.egress_usd = 0.0
        self.traffic_rate = self.xz_rate = self.slo_target = self.slo_violation = 0.0
        self.traffic_gb = self.xz_gb = self.slo_target_s = self.slo_violation_s = 0.0
        self.queue_replica_s = 0.0
        self._pending_version = -1
        self._pending_cache = 0
        self.scale_out_s: list[float] = []
        self.gpu_start_s: list[float] = []
        self.speedups_8gpu: list[float] = []
        self.decision_ms: list[float] = []
        self.gpu_std_samples: list[float] = []
        self.faults_applied = 0
        self.prewarmed_nodes = 0
        self.unplaced_reasons: dict[str, str] = {}
        self.series: list[dict[str, float]] = []

    # ---------------------------------------------------------------- updates
    def pools_changed(self) -> None:
        self._dirty = True

    def _rates(self) -> None:
        cost = cpu_u = cpu_p = gpu_u = gpu_p = 0.0
        for c in self.engine.clusters.values():
            for p in c.pools:
                n = p.nodes
                cost += n * p.price_usd_per_hour
                cpu_p += n * p.node.cpu
                cpu_u += p.used_cpu
                if p.node.gpu:
                    gpu_p += n * p.node.gpu
                    gpu_u += p.used_gpu
        self.cost_rate, self.cpu_used, self.cpu_prov = cost / 3600.0, cpu_u, cpu_p
        self.gpu_used, self.gpu_prov = gpu_u, gpu_p
        self._dirty = False

    def integrate(self, t0: float, t1: float) -> None:
        if self._dirty:
            self._rates()
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
        if self.engine.pending:
            self.queue_replica_s += self._pending_replicas() * dt

    def _pending_replicas(self) -> int:
        """Replicas waiting for placement; cached per engine state version (cheap per event)."""
        version = self.engine.state_version
        if version != self._pending_version:
            self._pending_version = version
            self._pending_cache = sum(self.engine.workloads[w].pending for w in self.engine.pending)
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
        eng = self.engine
        self.traffic_rate -= ws.traffic_rate
        self.xz_rate -= ws.xz_rate
        self.slo_target -= ws.slo_target
        self.slo_violation -= ws.slo_violation
        running = [g for g in ws.groups if g.running] if not ws.finished else []
        n = sum(g.count for g in running)
        rate = physics.SERVICE_PEER_GB_PER_REPLICA_HOUR / 3600.0 * n if n > 1 else 0.0
        counts: list[float] = []
        for g in running:
            counts.extend(physics.zone_split(g.count, len(eng.clusters[g.cluster].spec.zones)))
        ws.traffic_rate = rate
        ws.xz_rate = rate * physics.cross_pair_fraction(counts)
        ws.slo_target = ws.slo_violation = 0.0
        slo = ws.ev.latency_slo_ms
        if slo is not None and ws.ev.user_region and not ws.finished:
            target = min(ws.desired, ws.max_running)
            ok = sum(g.count for g in running
                     if eng.rtt.get((ws.ev.user_region, g.cluster), 0.0) <= slo)
            ws.slo_target = float(target)
            ws.slo_violation = float(max(0, target - ok))
        self.traffic_rate += ws.traffic_rate
        self.xz_rate += ws.xz_rate
        self.slo_target += ws.slo_target
        self.slo_violation += ws.slo_violation

    def sample(self, now: float) -> None:
        if self._dirty:
            self._rates()
        fracs = [1.0 - n.gpu_free / p.node.gpu
                 for c in self.engine.clusters.values() for p in c.pools if p.node.gpu
                 for n in p.node_list if n.ready_at <= now]
        if len(fracs) >= 2:
            self.gpu_std_samples.append(statistics.pstdev(fracs))
        self.series.append({
            "t_s": now, "cost_usd": self.cost_usd + self.egress_usd,
            "utilization_cpu": self.cpu_used / self.cpu_prov if self.cpu_prov else 0.0,
            "utilization_gpu": self.gpu_used / self.gpu_prov if self.gpu_prov else 0.0,
            "nodes": float(sum(p.nodes for c in self.engine.clusters.values() for p in c.pools)),
        })

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

    def result(self) -> dict[str, object]:
        eng = self.engine
        scale, gpu = self.censored()

        def rnd(x: float | None, nd: int = 4) -> float | None:
            return None if x is None else round(x, nd)

        unplaced = sum(1 for ws in eng.workloads.values() if ws.pending > 0 and not ws.finished)
        return {
            "utilization_cpu": rnd(self.cpu_used_s / self.cpu_prov_s if self.cpu_prov_s else None),
            "utilization_gpu": rnd(self.gpu_used_s / self.gpu_prov_s if self.gpu_prov_s else None),
            "cost_usd": round(self.cost_usd + self.egress_usd, 2),
            "scale_out_response_s_p50": rnd(physics.percentile(scale, 50), 1),
            "scale_out_response_s_p95": rnd(physics.percentile(scale, 95), 1),
            "cross_zone_traffic_frac": rnd(self.xz_gb / self.traffic_gb if self.traffic_gb
                                           else 0.0),
            "gpu_job_start_s_p50": rnd(physics.percentile(gpu, 50), 1),
            "gpu_util_std": rnd(statistics.fmean(self.gpu_std_samples)
                                if self.gpu_std_samples else None),
            "speedup_8gpu": rnd(statistics.fmean(self.speedups_8gpu)
                                if self.speedups_8gpu else None, 3),
            "slo_violation_frac": rnd(self.slo_violation_s / self.slo_target_s
                                      if self.slo_target_s else 0.0, 5),
            "unplaced": unplaced,
            "decision_ms_p99": rnd(physics.percentile(self.decision_ms, 99), 2),
        }
