"""The digital twin's discrete-event engine: a simulated clock around the live planner.

Why this shape: every number the twin reports must be about the code that runs in production,
so each epoch builds a `FederationSnapshot` from simulated state and calls the same
`plan_epoch` the live placement loop calls. The engine only models what the world does with a
plan: nodes boot (`provision_delay_s`, plus Cluster Autoscaler's scan interval for the reactive
`traditional` autoscaler), images are pulled and data moved at modelled bandwidth, jobs run
and finish, services scale, spot nodes are reclaimed, sites fail or partition, quotas are cut
and prices change (`[[faults]]`).

Event loop: a heap of timed events plus the trace as a sorted stream. The placement loop ticks
every `epoch_s`, but an epoch with nothing pending (and no housekeeping due) is skipped, and
an epoch whose state has not changed since a plan that placed nothing is not re-solved: the
planner dominates run time, so it only runs when it can decide something new.

Policies: `traditional` (reactive scale-out after CA's scan interval, no prewarm),
`karpenter` (reactive after Karpenter's batch window, no prewarm), `greedy`, `lp` (fixed
PolicyAction), `lp+rl` (PolicyAction from a controller every `decision_interval_s`). greedy,
lp and lp+rl prewarm nodes from a demand forecast `prewarm_lead_s` ahead (see `_prewarm`).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker.domain import (
    FederationSnapshot,
    Placement,
    PolicyAction,
    UserRegion,
)
from broker.placement.planner import EpochPlan, PlannerConfig
from broker.sim import hazard, physics, training
from broker.sim.metrics import Metrics
from broker.sim.network import data_move, user_rtt_table
from broker.sim.realize import SPOT_HAZARD, TwinNoise, realize, stream
from broker.sim.scenario import CatalogLike, FaultSpec, Scenario
from broker.sim.snapshot import build_snapshot, network_of
from broker.sim.state import CapacityError, Group, Node, SimCluster, SimPool, WorkloadState
from broker.sim.state import make_cluster as _make_cluster

POLICIES = ("traditional", "karpenter", "greedy", "lp", "lp+rl")
# Policies that prewarm (SCENARIO.md): every one except those copying systems without it
# (Kubernetes + Cluster Autoscaler, Karpenter).
PREWARM_POLICIES = ("greedy", "lp", "lp+rl")
RETRY_S = 300.0  # kube-scheduler podMaxInUnschedulablePodsDuration default (5 min)
RETRY_MIN_S = 60.0
PlannerFn = Callable[[FederationSnapshot, PolicyAction, PlannerConfig, str], EpochPlan]
_ARRIVAL, _READY, _FINISH, _FAULT_START, _FAULT_END, _SAMPLE = range(6)


class Controller(Protocol):
    """Chooses the PolicyAction (the RL policy in lp+rl; the trainer's rollout recorder)."""

    def act(self, engine: Engine, now_s: float) -> PolicyAction: ...


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "lp"
    # Decision records are not needed in the twin and never change a decision: off for speed.
    # Fixed sites are priced at their marginal cost, as live (PlannerConfig's default).
    planner: PlannerConfig = field(default_factory=lambda: PlannerConfig(explain=False))
    fixed_action: PolicyAction = field(default_factory=PolicyAction)
    decision_interval_s: float = 300.0
    housekeeping_s: float = 300.0
    sample_s: float = 300.0
    check_invariants: bool = False
    # EWMA time constant of the per-pool demand rate used by the prewarm forecast.
    demand_tau_s: float = 900.0
    # The twin's random parts (arrival jitter, duration noise) of run `scenario.seed`.
    noise: TwinNoise = field(default_factory=TwinNoise)
    # Spot reclaim hazard per provider, per node-hour (sim/hazard.py's published bands).
    reclaim_per_hour: Mapping[str, float] = field(
        default_factory=lambda: dict(hazard.RECLAIM_PER_HOUR))


def default_planner() -> PlannerFn:
    from broker.placement.planner import plan_epoch

    def run(snapshot: FederationSnapshot, action: PolicyAction, config: PlannerConfig,
            policy: str) -> EpochPlan:
        return plan_epoch(snapshot, action, config, policy=policy)

    return run


class Engine:
    """One simulated run of one policy on one scenario. Use `run()` once."""

    def __init__(self, scenario: Scenario, catalog: CatalogLike | None, config: SimConfig,
                 *, planner: PlannerFn | None = None, controller: Controller | None = None,
                 progress: Callable[[float], None] | None = None) -> None:
        if config.policy not in POLICIES:
            raise ValueError(f"unknown policy {config.policy!r} (choose from {POLICIES})")
        if config.policy == "lp+rl" and controller is None:
            raise ValueError("policy 'lp+rl' needs a controller (the RL policy)")
        # This seed's events: jittered arrivals, actual run times, predicted run times.
        scenario = realize(scenario, config.noise)
        self.scenario = scenario
        self.catalog = catalog
        self.config = config
        self.planner = planner or default_planner()
        self.controller = controller
        self.progress = progress
        self.rng = random.Random(scenario.seed)
        self._hazard_rng = stream(scenario.seed, SPOT_HAZARD)
        self.clusters = {c.name: _make_cluster(c) for c in scenario.clusters}
        self.workloads: dict[str, WorkloadState] = {}
        self.pending: dict[str, None] = {}  # insertion-ordered set of ids with pending replicas
        self.now = 0.0
        self.metrics = Metrics(self)
        self.action = config.fixed_action
        self.prewarm = config.policy in PREWARM_POLICIES
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._version = 0
        self._solved_version = -1
        self._next_decision = 0.0
        self._last_housekeeping = -math.inf
        self._arrival_i = 0
        self._cap_version = 0  # bumped when capacity may have grown (release, nodes, faults)
        self._user_regions = tuple(UserRegion(u.name, u.lat, u.lon) for u in scenario.user_regions)
        self.rtt = user_rtt_table(scenario)
        self._specs = {c.name: c for c in scenario.clusters}
        self.recent_demand_cpu = 0.0  # EWMA of submitted cpu per second (observation)
        # Cluster<->cluster RTT and throughput (static topology): the policy graph's edges.
        self.network = network_of(scenario, catalog)

    @property
    def state_version(self) -> int:
        """Changes whenever pending work or capacity changed (metrics cache on it)."""
        return self._version

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, object]:
        horizon = self.scenario.horizon_s
        for f in self.scenario.faults:
            if f.at_s <= horizon:
                self._push(f.at_s, _FAULT_START, f)
        self._push(0.0, _SAMPLE, None)
        events = self.scenario.events
        epoch = self.scenario.epoch_s
        t_epoch = 0.0
        while True:
            t_arr = events[self._arrival_i].submit_s if self._arrival_i < len(events) else math.inf
            t_heap = self._heap[0][0] if self._heap else math.inf
            t_next = min(t_arr, t_heap)
            if t_next <= t_epoch and t_next <= horizon:
                self._advance(t_next)
                if t_arr <= t_heap:
                    self._arrive(events[self._arrival_i])
                    self._arrival_i += 1
                else:
                    _, _, kind, payload = heapq.heappop(self._heap)
                    self._dispatch(kind, payload)
                continue
            if t_epoch > horizon:
                break
            self._advance(t_epoch)
            self._epoch()
            if self.progress is not None:
                self.progress(t_epoch)
            t_epoch = self._next_epoch_time(t_epoch, t_next, epoch)
        self._advance(horizon)
        return self.metrics.result()

    def _next_epoch_time(self, t_epoch: float, t_next: float, epoch: float) -> float:
        nxt = t_epoch + epoch
        needs_solve = bool(self.pending) and self._version != self._solved_version
        if needs_solve:
            return nxt
        wake = min(t_next, self._last_housekeeping + self.config.housekeeping_s)
        if wake <= nxt:
            return nxt
        return math.ceil(wake / epoch - 1e-9) * epoch

    def _advance(self, t: float) -> None:
        if t > self.now:
            self.metrics.integrate(self.now, t)
            self.now = t

    def _dispatch(self, kind: int, payload: object) -> None:
        if kind in (_READY, _FINISH) and isinstance(payload, tuple):
            wid, token = str(payload[0]), int(payload[1])
            if kind == _READY:
                self._group_ready(wid, token)
            else:
                self._finish(wid, token)
        elif kind == _FAULT_START:
            self._fault(payload, start=True)  # type: ignore[arg-type]
        elif kind == _FAULT_END:
            self._fault(payload, start=False)  # type: ignore[arg-type]
        elif kind == _SAMPLE:
            self.metrics.sample(self.now)
            if self.now + self.config.sample_s <= self.scenario.horizon_s:
                self._push(self.now + self.config.sample_s, _SAMPLE, None)

    # ------------------------------------------------------------------ arrivals
    def _arrive(self, ev: object) -> None:
        from broker.sim.scenario import TraceEvent

        if not isinstance(ev, TraceEvent):
            return
        self.recent_demand_cpu += ev.cpu * ev.replicas
        if ev.kind == "scale":
            self._scale(ev.id, ev.replicas)
            return
        ws = WorkloadState(ev=ev, desired=ev.replicas, pending=ev.replicas,
                           pending_since=self.now)
        if ev.kind == "service":
            ws.scale_requests.append((self.now, ev.replicas))
        self.workloads[ev.id] = ws
        self.pending[ev.id] = None
        self._version += 1

    def _scale(self, wid: str, replicas: int) -> None:
        ws = self.workloads.get(wid)
        if ws is None or ws.finished:
            return
        delta = replicas - ws.desired
        ws.desired = replicas
        if delta > 0:
            ws.pending += delta
            ws.scale_requests.append((self.now, replicas))
            ws.tries = 0
            self.pending[wid] = None
            self._version += 1
            return
        remove = -delta
        take = min(remove, ws.pending)
        ws.pending -= take
        remove -= take
        ws.scale_requests = [(t, n) for t, n in ws.scale_requests if n <= replicas]
        # Newest groups first, not-yet-running before running.
        for g in sorted(ws.groups, key=lambda g: (g.running, -g.placed_s)):
            if remove <= 0:
                break
            k = min(remove, g.count)
            self._release(ws, g, k)
            remove -= k
        if ws.pending == 0:
            self.pending.pop(wid, None)
        self.metrics.service_changed(ws)
        self._version += 1

    # ------------------------------------------------------------------ epochs
    def _epoch(self) -> None:
        now = self.now
        if now - self._last_housekeeping >= self.config.housekeeping_s:
            self._housekeeping(now)
        policy_ms = 0.0
        if self.controller is not None and now >= self._next_decision:
            t_policy = time.perf_counter()
            self.action = self.controller.act(self, now)
            policy_ms = (time.perf_counter() - t_policy) * 1000.0
            self._next_decision = now + self.config.decision_interval_s
        if not self.pending:
            return
        batch = [w for w in self.pending if self._due(self.workloads[w], now)]
        if not batch:
            self._solved_version = self._version
            return
        for w in batch:
            ws = self.workloads[w]
            ws.tried_version, ws.tried_s = self._cap_version, now
            ws.tries += 1
        snapshot = self.snapshot(batch)
        t0 = time.perf_counter()
        plan = self.planner(snapshot, self.action, self.config.planner, self._planner_policy())
        self.metrics.decision_ms.append((time.perf_counter() - t0) * 1000.0 + policy_ms)
        for wid, reason in plan.unplaced.items():
            self.metrics.unplaced_reasons[wid] = reason
        version_before = self._version
        self._apply_scale(plan)
        for p in plan.placements:
            self._apply(p)
        self._solved_version = self._version if self._version == version_before else -1
        if self.config.check_invariants:
            self.check_invariants()

    def _due(self, ws: WorkloadState, now: float) -> bool:
        """Retry an unplaced workload with exponential backoff (epoch_s * 2^k, at most RETRY_S).

        Like kube-scheduler's unschedulable queue (pods move back on cluster events, after a
        backoff, or after podMaxInUnschedulablePodsDuration = 5 min): re-solving an unchanged
        infeasible batch every epoch costs time and decides nothing new. A capacity change
        (release, new nodes, fault) lets it back in after RETRY_MIN_S.
        """
        if ws.tries == 0:
            return True
        backoff = min(RETRY_S, self.scenario.epoch_s * 2.0 ** min(ws.tries - 1, 20))
        if now - ws.tried_s >= backoff:
            return True
        return ws.tried_version != self._cap_version and now - ws.tried_s >= RETRY_MIN_S

    def _planner_policy(self) -> str:
        return "lp" if self.config.policy == "lp+rl" else self.config.policy

    def _housekeeping(self, now: float) -> None:
        dt = now - self._last_housekeeping if math.isfinite(self._last_housekeeping) else 0.0
        self._last_housekeeping = now
        if dt > 0:
            a = 1.0 - math.exp(-dt / self.config.demand_tau_s)
            for c in self.clusters.values():
                for p in c.pools:
                    p.decay_demand(now, self.config.demand_tau_s)
            self.recent_demand_cpu *= (1 - a)
        if dt > 0 and self.config.noise.spot_hazard:
            self._spot_hazard(dt)
        self._scale_in(now)
        if self.prewarm:
            self._prewarm(now)

    def _spot_hazard(self, dt: float) -> None:
        """Spot nodes reclaimed by the per-pool hazard over the last `dt` s (sim/hazard.py);
        handled exactly as a scripted `spot_reclaim` fault of that many nodes."""
        for c in self.clusters.values():
            if c.spec.fixed:
                continue
            for p in c.pools:
                if not p.spec.spot or not p.nodes:
                    continue
                k = hazard.draw_reclaims(p.nodes, c.spec.provider, dt, self._hazard_rng,
                                         self.config.reclaim_per_hour)
                if k:
                    self.metrics.hazard_reclaims += k
                    self._reclaim(c, FaultSpec(at_s=self.now, target=c.name,
                                               kind="spot_reclaim", nodes=k, pool=p.name))
                    self._cap_version += 1
                    self._version += 1

    def _scale_in(self, now: float) -> None:
        """Remove nodes idle for SCALE_IN_IDLE_S (per-node timers, as Cluster Autoscaler)."""
        for c in self.clusters.values():
            if c.spec.fixed:
                continue
            for p in c.pools:
                idle = p.idle_nodes(now)
                chosen = {id(n) for n in idle}
                for n in p.node_list:
                    if id(n) not in chosen:
                        n.idle_since = None
                    elif n.idle_since is None:
                        n.idle_since = now
                gone = [n for n in idle if n.idle_since is not None
                        and now - n.idle_since >= physics.SCALE_IN_IDLE_S]
                if gone:
                    for n in gone:
                        p.node_list.remove(n)
                    self.metrics.pools_changed()
                    self._version += 1

    def _prewarm(self, now: float) -> None:
        """Order nodes now for demand forecast `prewarm_lead_s` ahead that would not fit.

        Forecast per cloud pool, in its bottleneck resource (GPUs for GPU pools, else vCPU):
        reserved + EWMA reservation rate * lead. Nodes are ordered for the forecast overflow
        beyond provisioned capacity, rounded to the nearest whole node (half a node of
        forecast overflow buys one; lumpy single jobs do not), at most max_nodes/10 per tick.
        Headroom is the planner's packing limit, not a reason to buy idle nodes. Ordered nodes
        are ready after `provision_delay_s`, marked prewarmed (images pulled while idle), and
        scaled in like any idle node.
        """
        lead = max(0.0, self.action.prewarm_lead_s)
        if lead <= 0:
            return
        for c in self.clusters.values():
            if c.spec.fixed or not c.healthy(now):
                continue
            for p in c.pools:
                if p.node.gpu:
                    used, rate, unit = float(p.used_gpu), p.demand_gpu_per_s, float(p.node.gpu)
                else:
                    used, rate, unit = p.used_cpu, p.demand_cpu_per_s, p.node.cpu
                if rate <= 0 or unit <= 0:
                    continue
                overflow = used + rate * lead - p.nodes * unit
                count = min(math.floor(overflow / unit + 0.5), max(1, p.spec.max_nodes // 10))
                added = self._add_nodes(c, p, count, prewarmed=True) if count > 0 else 0
                if added:
                    self.metrics.prewarmed_nodes += added
                    self._version += 1

    # ------------------------------------------------------------------ snapshot
    def snapshot(self, batch: list[str] | None = None) -> FederationSnapshot:
        ids = list(self.pending) if batch is None else batch
        return build_snapshot(self, [self.workloads[w] for w in ids])

    # ------------------------------------------------------------------ applying plans
    def _add_nodes(self, c: SimCluster, p: SimPool, count: int, *, prewarmed: bool = False) -> int:
        if count <= 0 or c.spec.fixed or not c.healthy(self.now):
            return 0
        if c.quota_vcpu is not None:
            used = sum(q.nodes * q.node.cpu for q in c.pools)
            count = min(count, int((c.quota_vcpu - used + 1e-9) // p.node.cpu))
        delay = self.scenario.defaults.provision_delay_s
        if self.config.policy == "traditional":
            delay += physics.CA_SCAN_INTERVAL_S
        elif self.config.policy == "karpenter":
            delay += physics.KARPENTER_BATCH_IDLE_S
        added = p.add_nodes(count, self.now + delay, prewarmed=prewarmed)
        if added:
            self.metrics.pools_changed()
            self._cap_version += 1
        return added

    def _apply_scale(self, plan: EpochPlan) -> None:
        """Order the nodes the plan asks for (as the live dispatcher scales pools).

        The planner sizes pools under the policy's headroom, so this is where headroom costs
        nodes. `_reserve` still adds nodes if a placement does not fit what exists (the plan
        and the twin's per-node GPU packing can disagree).
        """
        for s in plan.scale:
            c = self.clusters.get(s.cluster)
            if c is None or s.add_nodes <= 0:
                continue
            try:
                p = c.pool(s.pool)
            except KeyError:
                continue
            self._add_nodes(c, p, s.add_nodes)

    def _apply(self, placement: Placement) -> None:
        ws = self.workloads.get(placement.workload_id)
        if ws is None or ws.finished or ws.pending <= 0:
            return
        for a in placement.assignments:
            c = self.clusters.get(a.cluster)
            if c is None or not c.healthy(self.now):
                continue
            try:
                p = c.pool(a.pool)
            except KeyError:
                continue
            want = min(a.replicas, ws.pending)
            placed = self._reserve(ws, c, p, want)
            ws.pending -= placed
            if ws.pending <= 0:
                break
        if ws.pending <= 0:
            self.pending.pop(ws.ev.id, None)
            ws.tries = 0
        self._version += 1

    def _reserve(self, ws: WorkloadState, c: SimCluster, p: SimPool, want: int) -> int:
        """Reserve up to `want` replicas on pool `p`, node by node; returns placed.

        Each replica goes on one node (`SimPool.place_many`: best-fit bin-packing); nodes are
        ordered when none has room. Replicas start when their own nodes are up.
        """
        ev = ws.ev
        homes: list[tuple[Node, list[Node]]] = []
        if ev.gpu > p.node.gpu:
            for _ in range(want):
                home = self._node_for(c, p, ev.cpu, ev.memory_gib, ev.gpu)
                if home is None:
                    break
                homes.append(home)
        else:
            homes = [(n, [n] * ev.gpu) for n in self._nodes_for(c, p, ws, want)]
        gpu_nodes = [h[1] for h in homes] if ev.gpu else []
        if not homes:
            return 0
        placed = len(homes)
        p.add_demand(self.now, ev.cpu * placed, ev.gpu * placed, self.config.demand_tau_s)
        self.metrics.pools_changed()
        nodes = [h[0] for h in homes]
        nodes_ready = max([self.now] + [n.ready_at for n in nodes]
                          + [n.ready_at for grp in gpu_nodes for n in grp])
        waits_on_new = nodes_ready > self.now
        pull_needed = ev.id not in p.images or (waits_on_new and not all(
            n.prewarmed for n in nodes if n.ready_at > self.now))
        pull_s = physics.transfer_s(ev.image_gb, self.scenario.defaults.image_pull_gbps) \
            if pull_needed else 0.0
        data_s = self._data_move(ws, c)
        g = Group(cluster=c.name, pool=p.name, count=placed, gpu_nodes=gpu_nodes,
                  placed_s=self.now, nodes=nodes,
                  ready_s=nodes_ready + pull_s + data_s + physics.POD_START_S)
        self._seq += 1
        g.token = self._seq
        ws.groups.append(g)
        self._push(g.ready_s, _READY, (ev.id, g.token))
        return placed

    def _nodes_for(self, c: SimCluster, p: SimPool, ws: WorkloadState, want: int) -> list[Node]:
        """Nodes for up to `want` replicas (best fit, `SimPool.place_many`), ordering the
        nodes that are missing when nothing has room (as many as the rest needs)."""
        ev = ws.ev
        node = p.node
        if ev.cpu > node.cpu + 1e-9 or ev.memory_gib > node.memory_gib + 1e-9:
            return []
        out = p.place_many(ev.cpu, ev.memory_gib, ev.gpu, want, self.now)
        left = want - len(out)
        if left > 0:
            per_node = p.fit_count(Node(0.0, node.gpu), ev.cpu, ev.memory_gib, ev.gpu)
            if per_node > 0 and self._add_nodes(c, p, math.ceil(left / per_node)):
                out += p.place_many(ev.cpu, ev.memory_gib, ev.gpu, left, self.now)
        return out

    def _node_for(self, c: SimCluster, p: SimPool, cpu: float, mem: float,
                  gpus: int) -> tuple[Node, list[Node]] | None:
        """A replica asking for more GPUs than a node has (a shape the candidates filter
        refuses live): its GPUs spread over nodes, its CPU on the first with room."""
        node = p.node
        if cpu > node.cpu + 1e-9 or mem > node.memory_gib + 1e-9:
            return None
        short = gpus - sum(n.gpu_free for n in p.node_list)
        if short > 0:
            self._add_nodes(c, p, math.ceil(short / max(node.gpu, 1)))
        spread = p.take_spread(gpus)
        if spread is None:
            return None
        home = next((n for n in spread if n.fits(node, cpu, mem, 0)), None)
        if home is None:
            for n in spread:
                n.gpu_free += 1
            return None
        p.occupy(home, cpu, mem, 0)
        return home, spread

    def _data_move(self, ws: WorkloadState, c: SimCluster) -> float:
        move = data_move(ws.ev, c.spec, self._specs, self.catalog,
                         self.scenario.defaults.network_gbps)
        if move.gb > 0:
            self.metrics.data_moved(move.gb, cross=move.cross_region, egress_usd=move.egress_usd)
        return move.seconds

    # ------------------------------------------------------------------ lifecycle
    def _group_ready(self, wid: str, token: int) -> None:
        ws = self.workloads.get(wid)
        if ws is None or ws.finished:
            return
        g = next((g for g in ws.groups if g.token == token), None)
        if g is None:
            return
        g.running = True
        self.clusters[g.cluster].pool(g.pool).images.add(wid)
        running = ws.running
        ws.max_running = max(ws.max_running, running)
        done = [r for r in ws.scale_requests if running >= r[1]]
        for t_req, _ in done:
            self.metrics.scale_out_s.append(self.now - t_req)
        ws.scale_requests = [r for r in ws.scale_requests if running < r[1]]
        self.metrics.service_changed(ws)
        if ws.ev.kind != "service" and ws.pending == 0 and running >= ws.desired:
            self._job_started(ws)

    def _job_started(self, ws: WorkloadState) -> None:
        ev = ws.ev
        run_s = ev.duration_s or 0.0
        total_gpus = ev.gpu * ev.replicas
        if ev.kind == "train" and total_gpus >= 2:
            # Run time depends on placement (sim/training.py): trace time x s_ref / s.
            s = self._job_speedup(ws)
            run_s *= training.reference_speedup(total_gpus) / max(s, 1e-6)
            if total_gpus == 8 and not ws.ever_started:
                self.metrics.speedups_8gpu.append(s)
        if not ws.ever_started:
            ws.ever_started = True
            ws.started_s = self.now
            if ev.kind == "train" and ev.gpu > 0:
                self.metrics.gpu_start_s.append(self.now - ev.submit_s)
        self._push(self.now + run_s, _FINISH, (ev.id, ws.run_token))

    def _job_speedup(self, ws: WorkloadState) -> float:
        """The job's speedup where its GPUs are now (sim/training.py)."""
        per_node: dict[int, tuple[Node, SimPool]] = {}
        counts: dict[int, int] = {}
        for g in ws.groups:
            p = self.clusters[g.cluster].pool(g.pool)
            for grp in g.gpu_nodes:
                for n in grp:
                    per_node[id(n)] = (n, p)
                    counts[id(n)] = counts.get(id(n), 0) + 1
        shares = [training.GpuShare(counts[k], p.spec.instance_type, p.spec.gpu_model,
                                    p.spec.interconnect, p.cluster, n.zone, p.node.gpu)
                  for k, (n, p) in per_node.items()]
        pair_rtt, gbps = self.network
        return training.job_speedup(shares, tcp_gbps=self.scenario.defaults.network_gbps,
                                    cluster_gbps=gbps, cluster_rtt_ms=pair_rtt)

    def _finish(self, wid: str, token: int) -> None:
        ws = self.workloads.get(wid)
        if ws is None or ws.finished or token != ws.run_token:
            return
        for g in list(ws.groups):
            self._release(ws, g, g.count)
        ws.finished = True
        ws.pending = 0
        self.pending.pop(wid, None)
        self.metrics.service_changed(ws)
        self._version += 1

    def _release(self, ws: WorkloadState, g: Group, k: int,
                 which: list[int] | None = None) -> None:
        """Free k replicas of group g: the newest ones, or the replica indexes `which`."""
        p = self.clusters[g.cluster].pool(g.pool)
        ev = ws.ev
        idx = sorted(which if which is not None else range(g.count - k, g.count), reverse=True)
        for i in idx:
            grp = g.gpu_nodes[i] if ev.gpu and i < len(g.gpu_nodes) else []
            home = g.nodes[i] if i < len(g.nodes) else None
            spread = bool(grp) and any(n is not home for n in grp)
            if spread:
                for n in grp:
                    if n in p.node_list:
                        n.gpu_free += 1
            if home is not None:
                p.vacate(home, ev.cpu, ev.memory_gib, 0 if spread else ev.gpu, self.now)
            if grp:
                del g.gpu_nodes[i]
            if home is not None:
                del g.nodes[i]
        g.count -= len(idx)
        if g.count <= 0:
            ws.groups.remove(g)
        self.metrics.pools_changed()
        self._cap_version += 1

    def _evict(self, ws: WorkloadState, groups: list[Group],
               lost: Node | None = None) -> None:
        """Replicas lost to a fault go back to pending; a gang job restarts whole.

        With `lost` (a node that went), only a service's replicas on that node go.
        """
        if ws.finished:
            return
        if ws.ev.kind != "service":
            groups = list(ws.groups)
            ws.run_token += 1
            lost = None
        for g in groups:
            which = None if lost is None else [
                i for i in range(g.count)
                if (i < len(g.nodes) and g.nodes[i] is lost)
                or (i < len(g.gpu_nodes) and lost in g.gpu_nodes[i])]
            n = g.count if which is None else len(which)
            self._release(ws, g, n, which)
            ws.pending += n
        if ws.pending:
            self.pending[ws.ev.id] = None
            ws.tries = 0
        self.metrics.service_changed(ws)
        self._version += 1

    # ------------------------------------------------------------------ faults
    def _fault(self, f: FaultSpec, *, start: bool) -> None:
        c = self.clusters[f.target]
        end = f.at_s + f.duration_s if f.duration_s is not None else math.inf
        if start and f.duration_s is not None:
            self._push(end, _FAULT_END, f)
        self.metrics.faults_applied += 1 if start else 0
        self._cap_version += 1
        if f.kind == "site_down" and start:
            c.down_until = max(c.down_until, end)
            for ws in list(self.workloads.values()):
                mine = [g for g in ws.groups if g.cluster == c.name]
                if mine:
                    self._evict(ws, mine)
        elif f.kind == "partition" and start:
            c.partitioned_until = max(c.partitioned_until, end)
        elif f.kind == "quota_cut":
            c.quota_vcpu = f.quota_vcpu if start else c.spec.quota_vcpu
        elif f.kind == "price_change":
            for p in c.pools:
                p.price_factor = p.price_factor * f.factor if start else p.price_factor / f.factor
            self.metrics.pools_changed()
        elif f.kind == "spot_reclaim" and start:
            self._reclaim(c, f)
        self._version += 1

    def _reclaim(self, c: SimCluster, f: FaultSpec) -> None:
        for p in c.pools:
            if not p.spec.spot or (f.pool is not None and f.pool not in (p.name,
                                                                         p.spec.instance_type)):
                continue
            for _ in range(min(f.nodes, p.nodes)):
                victim = p.node_list[self.rng.randrange(p.nodes)]
                p.reclaims += 1
                if victim.replicas or victim.gpu_free < p.node.gpu:
                    for ws in list(self.workloads.values()):
                        hit = [g for g in ws.groups if g.cluster == c.name and g.pool == p.name
                               and (any(n is victim for n in g.nodes)
                                    or any(victim in grp for grp in g.gpu_nodes))]
                        if hit:
                            self._evict(ws, hit, lost=victim)
                p.node_list.remove(victim)
            self.metrics.pools_changed()

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        for c in self.clusters.values():
            for p in c.pools:
                p.check()
            if c.quota_vcpu is not None and c.quota_vcpu == c.spec.quota_vcpu:
                prov = sum(p.nodes * p.node.cpu for p in c.pools)
                if prov > c.quota_vcpu + 1e-6 and not c.spec.fixed:
                    initial = sum(p.spec.nodes * p.node.cpu for p in c.pools)
                    if prov > max(initial, c.quota_vcpu) + 1e-6:
                        raise CapacityError(f"{c.name}: {prov} vCPU provisioned > quota")
