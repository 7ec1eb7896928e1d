"""The digital twin's discrete-event engine: a simulated clock around the live planner.

Why this shape: every number the twin reports must be about the code that runs in production,
so each epoch builds a `FederationSnapshot` from simulated state and calls the same
`plan_epoch` the live placement loop calls. The engine only models what the world does with a
plan: nodes boot (`provision_delay_s`, plus Cluster Autoscaler's scan interval for the reactive
`traditional` autoscaler), images are pulled and data moved at modelled bandwidth, jobs run
and finish, services scale, spot nodes are reclaimed, sites fail or partition, quotas are cut
and prices change (`[[faults]]`).

The engine decides nothing itself: every decision (placements, scale-up and scale-in, node
and image/data prewarm, retry/backoff, migrations) is in the plan, and `sim/applying.py`
carries each one out; `sim/faults.py` is what the scenario's faults do.

Event loop: a heap of timed events plus the trace as a sorted stream. The placement loop ticks
every `epoch_s`, but an epoch with nothing pending (and no housekeeping due) is skipped, and
an epoch whose state has not changed since a plan that placed nothing is not re-solved: the
planner dominates run time, so it only runs when it can decide something new. The loop also
wakes at a Retry's `not_before_s` (as the live loop does), and every `housekeeping_s` the
planner runs even with nothing pending (the live loop ticks every epoch while work runs):
that is when idle nodes are scaled in, nodes prewarmed and running services moved.

Policies: `traditional` (reactive scale-out after CA's scan interval, no prewarm),
`karpenter` (reactive after Karpenter's batch window, no prewarm), `greedy`, `lp` (fixed
PolicyAction), `lp+rl` (PolicyAction from a controller every `decision_interval_s`). Which of
them prewarm nodes or move running services is the planner's (planner.PREWARM_POLICIES,
placement/migrate.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker.domain import FederationSnapshot, PolicyAction, UserRegion
from broker.heap import run_heap
from broker.placement import consolidate, training
from broker.placement.planner import EpochPlan, PlannerConfig, idle_timer_s
from broker.placement.snapshot import MergeMemo
from broker.sim import applying, faults, hazard
from broker.sim.metrics import Metrics
from broker.sim.network import egress_table, user_rtt_table
from broker.sim.realize import SPOT_HAZARD, TwinNoise, realize, stream
from broker.sim.scenario import CatalogLike, Scenario
from broker.sim.snapshot import (
    PodsMemo,
    build_snapshot,
    network_of,
    pool_replica_counts,
    replica_counts,
)
from broker.sim.state import (
    CapacityError,
    Group,
    Node,
    SimPool,
    WorkloadState,
    pod_nodes,
    remove_pod,
)
from broker.sim.state import make_cluster as _make_cluster

POLICIES = ("traditional", "karpenter", "greedy", "lp", "lp+rl")
PlannerFn = Callable[[FederationSnapshot, PolicyAction, PlannerConfig, str], EpochPlan]
# The planner policies whose consolidation reads what runs on each node (consolidate.py:
# Karpenter's replace rule, lp's drain rule).
_PODS_POLICIES = frozenset({"karpenter", "lp"})
_ARRIVAL, _READY, _FINISH, _FAULT_START, _FAULT_END, _SAMPLE, _REPLACED = range(7)


class Controller(Protocol):
    """Chooses the PolicyAction (the RL policy in lp+rl; the trainer's rollout recorder)."""

    def act(self, engine: Engine, now_s: float) -> PolicyAction: ...


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "lp"
    # Decision records are not needed in the twin and never change a decision: off for speed.
    # Fixed sites are priced at their marginal cost, as live (PlannerConfig's default).
    # Counted work, not the wall clock, bounds every planner stage, so a run is fixed by
    # scenario, policy and seed however loaded the machine is (PlannerConfig.deterministic).
    planner: PlannerConfig = field(
        default_factory=lambda: PlannerConfig(explain=False, deterministic=True))
    fixed_action: PolicyAction = field(default_factory=PolicyAction)
    decision_interval_s: float = 300.0
    housekeeping_s: float = 300.0
    sample_s: float = 300.0
    check_invariants: bool = False
    # Reuse a pool's observed nodes in the snapshot until the pool changes (sim/snapshot.py);
    # False reads every node every epoch: the same snapshots, slower (the tests' reference).
    reuse_observations: bool = True
    # None: the placement loop ticks on the scenario's `epoch_s` grid. A number: as live, a
    # submission wakes the loop, which solves after this batching window
    # (`placement.batch_window_s`); more solves, so the benches keep the grid.
    batch_window_s: float | None = None
    # EWMA time constant of the per-pool demand rate used by the prewarm forecast.
    demand_tau_s: float = 900.0
    # The twin's random parts (arrival jitter, duration noise) of run `scenario.seed`.
    noise: TwinNoise = field(default_factory=TwinNoise)
    # Spot reclaim hazard per provider, per node-hour (sim/hazard.py's published bands).
    reclaim_per_hour: Mapping[str, float] = field(
        default_factory=lambda: dict(hazard.RECLAIM_PER_HOUR))


def default_planner() -> PlannerFn:
    """plan_epoch with one memo for the run (placement/memo.py: speed only; the twin's
    snapshots hand out the same RTT map while nothing measured changed it)."""
    from broker.placement.memo import PlanMemo
    from broker.placement.planner import plan_epoch

    memo = PlanMemo()

    def run(snapshot: FederationSnapshot, action: PolicyAction, config: PlannerConfig,
            policy: str) -> EpochPlan:
        return plan_epoch(snapshot, action, config, policy=policy, memo=memo)

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
        self.hazard_rng = stream(scenario.seed, SPOT_HAZARD)
        self.clusters = {c.name: _make_cluster(c) for c in scenario.clusters}
        # Every pool, cluster by cluster, and its (cluster, pool) (neither ever changes).
        self.pools = [p for c in self.clusters.values() for p in c.pools]
        self.pool_keys = [(p.cluster, p.name) for p in self.pools]
        self.workloads: dict[str, WorkloadState] = {}
        # The workloads not finished: the only ones with replicas placed (groups). A day's
        # trace holds thousands of finished jobs the snapshot need not walk every epoch.
        self.unfinished: dict[str, WorkloadState] = {}
        self.pending: dict[str, None] = {}  # insertion-ordered set of ids with pending replicas
        self.epochs_run = 0  # planning epochs finished (WorkloadState.queued_for_epoch)
        self._in_epoch = False
        self.now = 0.0
        self.metrics = Metrics(self)
        self.action = config.fixed_action
        # Backoff starts at one epoch, as live (where it starts at `placement.epoch_s`).
        self.planner_config = dataclasses.replace(
            config.planner, decisions=dataclasses.replace(config.planner.decisions,
                                                          retry_base_s=scenario.epoch_s))
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._version = 0
        self._solved_version = -1
        self._next_decision = 0.0
        self._last_housekeeping = -math.inf
        self._arrival_i = 0
        self.capacity_changed_s: float | None = None  # release, nodes, faults (planner input)
        self._due_at: list[float] = []  # heap of Retry.not_before_s: wake the loop then
        # When the next empty node's scale-in timer expires (`_idle_due`): the loop runs then;
        # and when the planner last ran (timers that expired before it were seen by it).
        self._idle_wake = math.inf
        self._idle_fresh = False
        self._planned_s = -math.inf
        # Set when replicas become pending (`queued`): the loop wakes at the next epoch.
        self._woken = False
        self._last_epoch = -math.inf
        self._user_regions = tuple(UserRegion(u.name, u.lat, u.lon) for u in scenario.user_regions)
        self.rtt = user_rtt_table(scenario)
        # USD/GB of data moves as the twin charges them, for the planner's snapshot.
        self.egress = egress_table(scenario, catalog)
        self.specs = {c.name: c for c in scenario.clusters}
        self.recent_demand_cpu = 0.0  # EWMA of submitted cpu per second (observation)
        # Cluster<->cluster RTT and throughput (static topology): the policy graph's edges.
        self.network = network_of(scenario, catalog)
        self.merge_memo = MergeMemo()  # unchanged pools merge to the same Pool (snapshot.py)
        # What runs on each node of each pool, as `with_pods` last read it (sim/snapshot.py).
        self.pods_memo = PodsMemo()

    @property
    def state_version(self) -> int:
        """Changes whenever pending work or capacity changed (metrics cache on it)."""
        return self._version

    def push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def next_token(self) -> int:
        self._seq += 1
        return self._seq

    def bump(self) -> None:
        """Pending work or capacity changed: the planner has something new to decide."""
        self._version += 1

    def wake_at(self, t: float) -> None:
        """Run an epoch at `t` (a Retry's not_before_s), as the live loop wakes for it."""
        heapq.heappush(self._due_at, t)

    def queued(self, ws: WorkloadState) -> None:
        """`ws` has replicas pending now (submitted, scaled up, evicted): the placement loop
        runs at the next epoch, as live (`PlacementLoop.wake`), whatever woke it: the time
        the loop chose to sleep until was read before the events that happen meanwhile."""
        if ws.ev.id not in self.pending:  # it joins the queue now: the first epoch to see it
            ws.queued_for_epoch = self.epochs_run + (2 if self._in_epoch else 1)
        self.pending[ws.ev.id] = None
        self._woken = True

    def capacity_grew(self) -> None:
        """Capacity may have grown (release, nodes, faults): backing-off work may be due."""
        self.capacity_changed_s = self.now

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, object]:
        with run_heap():  # the collector's settings only (broker/heap.py): no decision changes
            return self._run()

    def _run(self) -> dict[str, object]:
        horizon = self.scenario.horizon_s
        for f in self.scenario.faults:
            if f.at_s <= horizon:
                self.push(f.at_s, _FAULT_START, f)
        self.push(0.0, _SAMPLE, None)
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
                if self._woken:  # work queued meanwhile: the loop wakes (`queued`)
                    self._woken = False
                    t_epoch = min(t_epoch, self._wake_time(epoch))
                continue
            if t_epoch > horizon:
                break
            self._advance(t_epoch)
            self._in_epoch = True
            self._epoch()
            self._in_epoch = False
            self.epochs_run += 1
            self._last_epoch = t_epoch
            self._woken = False  # what this epoch queued, `_next_epoch_time` sees
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
        while self._due_at and (self._due_at[0] <= t_epoch + 1e-9 or not self.pending):
            heapq.heappop(self._due_at)  # passed (its epoch ran), or nothing waits any more
        due = self._due_at[0] if self._due_at else math.inf
        wake = min(t_next, self._last_housekeeping + self.config.housekeeping_s, due)
        if wake <= nxt:
            return nxt
        if not self._idle_fresh:  # else the skipped epoch just computed it
            self._idle_wake = self._idle_due()
        wake = min(wake, self._idle_wake)
        if wake <= nxt:
            return nxt
        return math.ceil(wake / epoch - 1e-9) * epoch

    def _idle_due(self) -> float:
        """When the first empty cloud node's scale-in timer (planner.idle_timer_s, the
        policy's) expires that no planner run has seen expired; inf when none. The live loop
        ticks every epoch while work runs and so scales such a node in at its timer; the twin
        skips epochs with nothing to decide, and without this wake an empty node would stay
        until the next housekeeping tick (up to `housekeeping_s` more, 300 s: on an 8-GPU
        node ~8 USD) under every policy alike."""
        policy = self._planner_policy()
        best = math.inf
        for c in self.clusters.values():
            if c.spec.fixed:
                continue
            for p in c.pools:
                since = [n.idle_since for n in p.node_list if n.idle_since is not None]
                if not since:
                    continue
                timer = idle_timer_s(policy, self.action, self.planner_config, c.name, p.name)
                for t0 in since:
                    t = t0 + timer
                    if self._planned_s + 1e-9 < t < best:
                        best = t
        return best

    def _wake_time(self, epoch: float) -> float:
        """When the loop, woken now, runs: after the batching window (as live), else at the
        next epoch of the grid, never again at the time of the epoch that last ran."""
        window = self.config.batch_window_s
        if window is not None:
            return self.now + window
        return max(math.ceil(self.now / epoch - 1e-9) * epoch, self._last_epoch + epoch)

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
            faults.fault(self, payload, start=True)  # type: ignore[arg-type]
        elif kind == _FAULT_END:
            faults.fault(self, payload, start=False)  # type: ignore[arg-type]
        elif kind == _REPLACED and isinstance(payload, applying.Replacing):
            applying.replacement_up(self, payload)
        elif kind == _SAMPLE:
            self.metrics.sample(self.now)
            if self.now + self.config.sample_s <= self.scenario.horizon_s:
                self.push(self.now + self.config.sample_s, _SAMPLE, None)

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
        self.unfinished[ev.id] = ws
        self.queued(ws)
        self.metrics.service_changed(ws)  # asked-for replicas count from now (metrics.py)
        self._version += 1

    def _scale(self, wid: str, replicas: int) -> None:
        ws = self.workloads.get(wid)
        if ws is None or ws.finished:
            return
        applying.cancel_move(self, ws)
        delta = replicas - ws.desired
        ws.desired = replicas
        if delta > 0:
            ws.pending += delta
            ws.scale_requests.append((self.now, replicas))
            ws.tries = 0
            self.queued(ws)
            self.metrics.service_changed(ws)
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
            self.release(ws, g, k)
            remove -= k
        if ws.pending == 0:
            self.pending.pop(wid, None)
        self.metrics.service_changed(ws)
        self._version += 1

    # ------------------------------------------------------------------ epochs
    def _epoch(self) -> None:
        """Snapshot -> plan_epoch -> carry out every decision (sim/applying.py)."""
        now = self.now
        housekeeping = now - self._last_housekeeping >= self.config.housekeeping_s
        if housekeeping:
            self._housekeeping(now)
        policy_ms = 0.0
        if self.controller is not None and now >= self._next_decision:
            t_policy = time.perf_counter()
            self.action = self.controller.act(self, now)
            policy_ms = (time.perf_counter() - t_policy) * 1000.0
            self._next_decision = now + self.config.decision_interval_s
        if not self.pending and not housekeeping:
            # Nothing else to decide: the planner runs only if an empty node's timer expired.
            self._idle_wake = self._idle_due()
            self._idle_fresh = True
            if self._idle_wake > now + 1e-9:
                return
        self._idle_fresh = False
        applying.observe_idle(self)
        self._planned_s = now
        # Running services are offered to the migration rules every housekeeping tick (the
        # live loop offers them every epoch; per 30 s epoch here would double the run time).
        # Karpenter's replace rule and lp's drain rule read what runs on each node: built at
        # housekeeping ticks only (walking every replica each 30 s epoch would cost as much
        # again); the other policies' rules do not read it.
        snapshot = self.snapshot(running=housekeeping and self._planner_policy() == "lp",
                                 pods=housekeeping and self._planner_policy() in _PODS_POLICIES)
        t0 = time.perf_counter()
        plan = self.planner(snapshot, self.action, self.planner_config, self._planner_policy())
        if plan.placements or plan.unplaced:
            self.metrics.decision_ms.append((time.perf_counter() - t0) * 1000.0 + policy_ms)
        for wid, reason in plan.unplaced.items():
            self.metrics.unplaced_reasons[wid] = reason
        version_before = self._version
        applying.apply_plan(self, plan)
        self._solved_version = self._version if self._version == version_before else -1
        if self.config.check_invariants:
            self.check_invariants()

    def _planner_policy(self) -> str:
        return "lp" if self.config.policy == "lp+rl" else self.config.policy

    def _housekeeping(self, now: float) -> None:
        """Bring the demand EWMAs (the prewarm forecast's input) up to date; spot nodes
        reclaimed by the hazard since the last tick go."""
        dt = now - self._last_housekeeping if math.isfinite(self._last_housekeeping) else 0.0
        self._last_housekeeping = now
        if dt > 0:
            a = 1.0 - math.exp(-dt / self.config.demand_tau_s)
            for c in self.clusters.values():
                for p in c.pools:
                    p.decay_demand(now, self.config.demand_tau_s)
            self.recent_demand_cpu *= (1 - a)
        if dt > 0 and self.config.noise.spot_hazard:
            faults.spot_hazard(self, dt)

    # ------------------------------------------------------------------ snapshot
    def snapshot(self, batch: list[str] | None = None, *,
                 running: bool = False, pods: bool = False) -> FederationSnapshot:
        """The snapshot of the state now, asking for `batch` (default: all pending work);
        with `running`, the running services too (what the migration rules look at); with
        `pods`, what runs on each node (sim/snapshot.py `with_pods`)."""
        ids = list(self.pending) if batch is None else batch
        return build_snapshot(self, [self.workloads[w] for w in ids], running=running,
                              pods=pods)

    # ------------------------------------------------------------------ lifecycle
    def _group_ready(self, wid: str, token: int) -> None:
        ws = self.workloads.get(wid)
        if ws is None or ws.finished:
            return
        g = next((g for g in ws.groups if g.token == token), None)
        if g is None:
            return
        p = self.clusters[g.cluster].pool(g.pool)
        if not g.running:
            p.count_replicas(0, -g.count)
        g.running = True
        p.images.add(wid)
        ws.max_running = max(ws.max_running, ws.running)
        applying.move_ready(self, ws, g)  # a move's target is ready: drain its source
        running = ws.running
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
        if ev.kind == "train" and ev.gpu > 0:
            # Run time depends on placement (placement/training.py): trace time x s_ref / s / g,
            # g the throughput of the slowest GPU model it runs on.
            run_s /= min((training.gpu_throughput(self.clusters[g.cluster].pool(g.pool)
                                                  .spec.gpu_model) for g in ws.groups),
                         default=1.0)
        if ev.kind == "train" and total_gpus >= 2:
            s = self._job_speedup(ws)
            run_s *= training.reference_speedup(total_gpus) / max(s, 1e-6)
            if total_gpus == 8 and not ws.ever_started:
                self.metrics.speedups_8gpu.append(s)
        ws.run_from_s, ws.run_full_s = self.now, run_s
        run_s *= 1.0 - ws.done_frac  # a restarted job resumes from its last checkpoint
        if not ws.ever_started:
            ws.ever_started = True
            ws.started_s = self.now
            if ev.kind == "train" and ev.gpu > 0:
                self.metrics.gpu_start_s.append(self.now - ev.submit_s)
        self.push(self.now + run_s, _FINISH, (ev.id, ws.run_token))

    def _job_speedup(self, ws: WorkloadState) -> float:
        """The job's speedup where its GPUs are now (placement/training.py)."""
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
        ws.moving = None
        for g in list(ws.groups):
            self.release(ws, g, g.count, ended=True)
        ws.finished = True
        self.unfinished.pop(wid, None)
        ws.pending = 0
        self.pending.pop(wid, None)
        self.metrics.service_changed(ws)
        self._version += 1

    def release(self, ws: WorkloadState, g: Group, k: int,
                 which: list[int] | None = None, *, ended: bool = False) -> None:
        """Free k replicas of group g: the newest ones, or the replica indexes `which`.
        `ended`: the workload ended (finished), so its requests count into the pool's
        release rate (SimPool.add_freed; the prewarm's net forecast), as live the
        workloads that reached a final status do."""
        p = self.clusters[g.cluster].pool(g.pool)
        ev = ws.ev
        idx = sorted(which if which is not None else range(g.count - k, g.count), reverse=True)
        for i in idx:
            grp = g.gpu_nodes[i] if ev.gpu and i < len(g.gpu_nodes) else []
            home = g.nodes[i] if i < len(g.nodes) else None
            spread = bool(grp) and any(n is not home for n in grp)
            if spread:
                p.changed()
                for n in grp:
                    if p.holds(n):
                        n.gpu_free += 1
            if home is not None:
                p.vacate(home, ev.cpu, ev.memory_gib, 0 if spread else ev.gpu, self.now)
            remove_pod(ev.id, home, grp)
            if grp:
                del g.gpu_nodes[i]
            if home is not None:
                del g.nodes[i]
        g.count -= len(idx)
        if ended:
            p.add_freed(self.now, ev.cpu * len(idx), ev.gpu * len(idx), self.config.demand_tau_s)
        p.count_replicas(-len(idx), 0 if g.running else -len(idx))
        if g.count <= 0:
            ws.groups.remove(g)
        self.metrics.pools_changed()
        self.capacity_grew()

    def evict(self, ws: WorkloadState, groups: list[Group],
               lost: Node | None = None) -> None:
        """Replicas lost to a fault go back to pending; a gang job restarts whole.

        With `lost` (a node that went), only a service's replicas on that node go.
        """
        if ws.finished:
            return
        groups = applying.end_move(self, ws, groups)
        if ws.ev.kind != "service":
            groups = list(ws.groups)
            ws.run_token += 1
            lost = None
            self._checkpointed(ws)
        for g in groups:
            which = None if lost is None else [
                i for i in range(g.count)
                if (i < len(g.nodes) and g.nodes[i] is lost)
                or (i < len(g.gpu_nodes) and lost in g.gpu_nodes[i])]
            n = g.count if which is None else len(which)
            self.release(ws, g, n, which)
            ws.pending += n
        if ws.pending:
            self.queued(ws)
            ws.tries = 0
        self.metrics.service_changed(ws)
        self._version += 1

    def _checkpointed(self, ws: WorkloadState) -> None:
        """A running job stopped now keeps the work of its last checkpoint (one every
        consolidate.CHECKPOINT_INTERVAL_S of its run): every job of a trace is restartable
        (the format has no spot_ok column, so sim/snapshot.py's specs accept interruption,
        consolidate.restartable), and a restartable job is one that checkpoints."""
        start, ws.run_from_s = ws.run_from_s, None
        if start is None or ws.run_full_s <= 0:
            return
        interval = consolidate.CHECKPOINT_INTERVAL_S
        saved_s = math.floor((self.now - start) / interval + 1e-9) * interval
        ws.done_frac = min(1.0, ws.done_frac + saved_s / ws.run_full_s)

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        if any(ws.groups for w, ws in self.workloads.items() if self.unfinished.get(w) is not ws):
            raise CapacityError("a workload outside `unfinished` holds replicas")
        if pool_replica_counts(self.clusters.values()) != replica_counts(self.unfinished.values()):
            raise CapacityError("the pools' replica counts differ from the workloads' groups")
        pods: dict[int, dict[str, int]] = {}  # Node.pods as the groups say it
        for ws in self.unfinished.values():
            for g in ws.groups:
                for i in range(g.count):
                    home = g.nodes[i] if i < len(g.nodes) else None
                    gpus = g.gpu_nodes[i] if i < len(g.gpu_nodes) else []
                    for n in pod_nodes(home, gpus):
                        per = pods.setdefault(id(n), {})
                        per[ws.ev.id] = per.get(ws.ev.id, 0) + 1
        for c in self.clusters.values():
            for p in c.pools:
                p.check()
                held = p.held  # `holds`'s cache, where current, is the node list
                if held is not None and held[0] == p.reshaped and (
                        len(held[1]) != len(p.node_list) or not all(map(p.holds, p.node_list))):
                    raise CapacityError(f"{c.name}/{p.name}: the node list changed without "
                                        "changed() (SimPool.holds)")
                for n in p.node_list:
                    if n.pods != pods.get(id(n), {}):
                        raise CapacityError(f"{c.name}/{p.name}: a node's pods differ from "
                                            f"the groups: {n.pods} vs {pods.get(id(n), {})}")
            if c.quota_vcpu is not None and c.quota_vcpu == c.spec.quota_vcpu:
                prov = sum(p.nodes * p.node.cpu for p in c.pools)
                if prov > c.quota_vcpu + 1e-6 and not c.spec.fixed:
                    initial = sum(p.spec.nodes * p.node.cpu for p in c.pools)
                    if prov > max(initial, c.quota_vcpu) + 1e-6:
                        raise CapacityError(f"{c.name}: {prov} vCPU provisioned > quota")
