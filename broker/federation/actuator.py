"""The actuator: carries out every decision of an epoch that is not a placement.

The placement loop writes each epoch's decisions (planner.EpochPlan's `scale`, `scale_in`,
`prewarm`, `migrations`) as `decisions` rows in the same transaction as its placements
(decision_log.py) and wakes this loop after the commit. Each pass reads the open decisions
whose backoff passed (at most `concurrency` at a time: each decision is the only open one
on what it acts on) and moves each one step on:

- **scale** (`PoolScale`; also a `Prewarm` that orders nodes): set the pool's node count through
  the way scaling.py finds (a declared cloud node group, the driver, or refused with the reason),
  then keep the order open until the nodes appear in the driver's inventory, when the pool's
  registered node count is raised to match (`order_timeout_s`: never seen -> failed). While it
  is open the placement loop counts the ordered nodes (placement/commitments.py).
- **scale_in** (`PoolScaleIn`): remove the named nodes (empty ones only) the same way. A
  consolidation (reason `consolidate`: the planner's drains of under-used nodes,
  placement/consolidate.py) first drains them, as `kubectl drain` does: the workloads the
  driver's inventory shows there are stopped on every cluster (a gang restarts whole) and sent
  back to pending (`workload.consolidated`), and the next epoch places them again; the
  decision is refused, and nothing stopped, when any of them is not restartable (a service,
  or a job that has not accepted being stopped: consolidate.restartable) or the cluster has
  no driver to say what runs there. Through a cloud node group (`attrs.scaling`) exactly the
  named nodes' machines are terminated (`CloudProvider.remove_nodes`, each machine named by
  the node's providerID), for a drain as for an idle scale-in: never another node, which may
  run work; a named node the inventory shows running work the plan did not see is kept.
- **prewarm** of images and data: `PrewarmingDriver.prewarm` (a pre-pull DaemonSet and
  data-copy Jobs on Kubernetes, the agent's prewarm command on an edge site), then wait for
  `prewarm_done`. A driver without `Capability.PREWARM`: refused with the reason.
- **migration**: migration.py (start the target, wait until ready, switch, drain).

Every step is idempotent (absolute node counts, keyed prewarms, applies keyed by workload id)
and its progress durable (`state`, `step`), so a crash repeats at most the last call. Each step
that changes something is recorded as an event `<kind>.<what>` (`scale.ordered`,
`scale.done`, `scale.refused`, `prewarm.started`, `migration.switched`, ...) with the decision
id. Provider errors: retryable ones are retried with tenacity inside a pass, then the decision
backs off (`backoff_s` doubling) and is tried again; after `max_attempts` passes, or on a
non-retryable error, it fails (recorded, with the error).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from broker.clock import Clock, sleep_or_stop
from broker.errors import BrokerError, NotFoundError
from broker.federation import scaling
from broker.federation.inventory import empty_node
from broker.federation.metrics import ACTUATIONS
from broker.federation.migration import Migrator
from broker.federation.preempt import evict, stop_replicas
from broker.placement.consolidate import restartable
from broker.settings import ActuatorSettings
from broker.store import ClusterRecord, DecisionRecord, Store
from providers.base import (
    Capability,
    CloudProvider,
    ClusterDriver,
    NodeInventory,
    PrewarmData,
    PrewarmingDriver,
    PrewarmSpec,
)
from providers.errors import ProviderError

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime

log = logging.getLogger(__name__)

POOL_KINDS = ("scale", "scale_in", "prewarm")
FINAL = ("done", "refused", "failed", "superseded")


def _busy(inventory: Sequence[NodeInventory], names: Sequence[str],
          drained: set[str]) -> list[str]:
    """The named nodes the inventory shows running work other than `drained`'s (a node it
    does not list is not busy: it is gone, or has not joined)."""
    by_name = {n.name: n for n in inventory}
    out = []
    for name in names:
        n = by_name.get(name)
        if n is None:
            continue
        if set(n.workloads) - drained or (not n.workloads and not empty_node(n)):
            out.append(name)
    return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """One step's result: the decision's new state, and the event to record (if any)."""

    state: str
    step: str | None = None
    event: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    wait_s: float | None = None  # not_before_s = now + wait_s
    spec: Mapping[str, Any] | None = None
    attempt: bool = False
    recorded: bool = False  # the step already wrote the state (migration switch)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


class Actuator:
    """See the module docstring. `wake()` after the placement loop's commit."""

    name = "actuator"

    def __init__(self, store: Store, drivers: Mapping[str, ClusterDriver], clock: Clock, *,
                 accounts: Mapping[str, CloudProvider] | None = None,
                 settings: ActuatorSettings | None = None, batch: int = 200,
                 concurrency: int = 8) -> None:
        self._store = store
        self._drivers = drivers
        self._clock = clock
        self._accounts: Mapping[str, CloudProvider] = accounts if accounts is not None else {}
        self._s = settings or ActuatorSettings()
        self._batch = batch
        self._wake = asyncio.Event()
        self._sem = asyncio.Semaphore(concurrency)
        self._migrator = Migrator(store, drivers, ready_timeout_s=self._s.ready_timeout_s,
                                  poll_s=self._s.poll_s)
        self.passes = 0

    def wake(self) -> None:
        """Act now (new decisions were committed)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.act_once()
            except BrokerError as exc:  # the store is away: keep going, try again
                log.warning("actuator pass failed: %s", exc.message)
            if not self._wake.is_set():
                await self._sleep(stop)

    async def _sleep(self, stop: asyncio.Event) -> None:
        waiters = {asyncio.ensure_future(self._wake.wait()),
                   asyncio.ensure_future(sleep_or_stop(self._clock, self._s.poll_s, stop))}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def act_once(self) -> int:
        """One pass over the due decisions; returns how many reached a final state."""
        async with self._store.unit() as uow:
            due = await uow.decisions.list_due(now=self._clock.now(), limit=self._batch)
            records = {r.cluster.name: r for r in await uow.clusters.list_records()} \
                if any(d.kind in POOL_KINDS for d in due) else {}
        self.passes += 1

        async def one(rec: DecisionRecord) -> bool:
            async with self._sem:  # a slow cloud call must not hold up the other decisions
                out = await self._step(rec, records.get(rec.cluster))
                await self._record(rec, out)
            return out.state in FINAL

        return sum(await asyncio.gather(*(one(rec) for rec in due)))

    # ---- one step -------------------------------------------------------------------------
    async def _step(self, rec: DecisionRecord, cluster: ClusterRecord | None) -> Outcome:
        now = self._clock.now()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._s.retries),
            wait=wait_exponential(multiplier=self._s.backoff_s / 4, max=2.0),
            retry=retry_if_exception(_retryable), reraise=True)
        try:
            out: Outcome = await retrying(self._dispatch, rec, cluster, now)
        except ProviderError as exc:
            return self._failed_call(rec, exc)
        return out

    async def _dispatch(self, rec: DecisionRecord, cluster: ClusterRecord | None,
                        now: float) -> Outcome:
        if rec.kind == "migration":
            p = await self._migrator.advance(rec, now)
            return Outcome(p.state, step=p.step, event=p.event, error=p.error,
                           wait_s=p.wait_s, spec=p.spec, recorded=p.recorded,
                           data={"reason": rec.spec.get("reason", "")})
        if rec.kind == "preemption":  # federation/preempt.py
            state, event = await evict(self._store, self._drivers, rec)
            return Outcome(state, event=event, data={"by": rec.spec.get("by", "")})
        if cluster is None:
            return Outcome("refused", event="refused", error=f"cluster {rec.cluster!r} is not "
                                                              "registered")
        if rec.kind == "scale_in":
            return await self._scale_in(rec, cluster)
        if "target_nodes" in rec.spec:
            return await self._scale(rec, cluster, now)
        if rec.kind == "prewarm":
            return await self._prewarm(rec, now)
        return Outcome("failed", event="failed", error=f"unknown decision kind {rec.kind!r}")

    def _failed_call(self, rec: DecisionRecord, exc: ProviderError) -> Outcome:
        error = f"{type(exc).__name__}: {exc}"
        if exc.retryable and rec.attempts + 1 < self._s.max_attempts:
            log.info("decision %d (%s) will be retried: %s", rec.id, rec.kind, error)
            return Outcome(rec.state, error=error, attempt=True,
                           wait_s=self._s.backoff_s * 2 ** rec.attempts)
        log.warning("decision %d (%s) failed: %s", rec.id, rec.kind, error)
        return Outcome("failed", event="failed", error=error, attempt=True)

    # ---- pools ----------------------------------------------------------------------------
    def _route(self, rec: DecisionRecord, cluster: ClusterRecord) -> scaling.ScaleRoute:
        return scaling.scale_route(cluster, rec.pool, drivers=self._drivers,
                                   accounts=self._accounts)

    async def _scale(self, rec: DecisionRecord, cluster: ClusterRecord, now: float) -> Outcome:
        target = int(rec.spec["target_nodes"])
        if rec.step == "":
            route = self._route(rec, cluster)
            if route.how == "refused":
                return Outcome("refused", event="refused", error=route.reason,
                               data={"target_nodes": target})
            count = await scaling.set_nodes(route, cluster, rec.pool, target,
                                            drivers=self._drivers, accounts=self._accounts,
                                            order=str(rec.spec.get("order") or ""))
            via = route.account or "driver"
            return Outcome("running", step="ordered", event="ordered", wait_s=0.0,
                           spec={"ordered_s": now, "count": count, "via": via},
                           data={"target_nodes": target, "count": count, "via": via,
                                 "reason": rec.spec.get("reason", "")})
        seen = await scaling.observed_nodes(self._drivers.get(rec.cluster), rec.pool)
        waited = now - float(rec.spec.get("ordered_s", now))
        if seen is not None and seen >= target:
            async with self._store.unit() as uow:
                await uow.clusters.set_pool_usage(rec.cluster, rec.pool, nodes=seen)
            # The order's boot, from ordering to every ordered node in the inventory (to
            # this poll's resolution): what the pool's next node is charged for
            # (decision_log.measured_boots, observed.py rule 6).
            boot = round(max(0.0, waited), 3)
            return Outcome("done", event="done", spec={"boot_s": boot},
                           data={"nodes": seen, "target_nodes": target, "boot_s": boot})
        if waited > self._s.order_timeout_s:
            return Outcome("failed", event="failed", data={"nodes": seen},
                           error=f"{target} nodes ordered, {seen} in the inventory after "
                                 f"{waited:.0f} s")
        return Outcome("running", wait_s=self._s.poll_s)

    async def _scale_in(self, rec: DecisionRecord, cluster: ClusterRecord) -> Outcome:
        route = self._route(rec, cluster)
        names = [str(n) for n in rec.spec.get("nodes") or []]
        reason = str(rec.spec.get("reason", ""))
        if route.how == "refused":
            return Outcome("refused", event="refused", error=route.reason,
                           data={"nodes": names})
        drained = [str(w) for w in rec.spec.get("drained") or []]
        draining = reason == "consolidate" and rec.step != "drained"
        # Read once: what runs on the nodes (a drain) and their machines (a node group).
        # A driver's error here is retried (backoff), not read as "no driver".
        driver = self._drivers.get(rec.cluster)
        inventory = await driver.inventory() \
            if driver is not None and (draining or route.how == "account") else None
        if draining:
            on = self._on_nodes(inventory, names)
            why = await self._unrestartable(rec.cluster, names, on)
            if why or on is None:
                return Outcome("refused", event="refused", error=why, data={"nodes": names})
            drained = await self._drain(rec, names, on)
            # Recorded before the removal: a pass that retries it must not drain the nodes
            # again (the next epoch may have placed work there meanwhile).
            async with self._store.unit() as uow:
                await uow.decisions.set_state(rec.id, "running", step="drained",
                                              spec={"drained": drained})
        kept: list[str] = []
        if route.how == "account" and inventory is not None:
            # A cloud terminates a machine whatever runs on it (a driver removes empty nodes
            # only), so a node that took work since the plan stays, as the Cluster Autoscaler
            # re-checks a node before deleting it. Only the work this pass drained may be
            # there: on a retried pass, that work may have been placed back on the node.
            kept = _busy(inventory, names, set(drained) if draining else set())
            if len(kept) == len(names):
                return Outcome("refused", event="refused", data={"nodes": names},
                               error=f"{', '.join(kept)} of {rec.cluster}/{rec.pool} run "
                                     "work the plan did not see: not removed")
        removed = [n for n in names if n not in kept]
        count = await scaling.remove_nodes(route, cluster, rec.pool, removed,
                                           drivers=self._drivers, accounts=self._accounts,
                                           inventory=inventory)
        async with self._store.unit() as uow:
            await uow.clusters.set_pool_usage(rec.cluster, rec.pool, nodes=count)
        return Outcome("done", event="done", data={"nodes": count, "removed": removed,
                                                   "kept": kept, "reason": reason,
                                                   "drained": drained})

    @staticmethod
    def _on_nodes(inventory: Sequence[NodeInventory] | None,
                  names: Sequence[str]) -> list[str] | None:
        """Ids of the broker's workloads with replicas on the named nodes, from the driver's
        `inventory`; None when there is none (no driver to ask)."""
        if inventory is None:
            return None
        wanted = set(names)
        return sorted({w for n in inventory if n.name in wanted for w in n.workloads})

    async def _unrestartable(self, cluster: str, names: Sequence[str],
                             on: Sequence[str] | None) -> str:
        """Why a consolidation of the named nodes must not drain them ("" when it may): a
        workload there (`on`, `_on_nodes`) that is not restartable (consolidate.restartable:
        a batch or training job that accepts being stopped), or one the store does not know,
        or no driver to say what runs there (`on` None). The planner drains only restartable
        work; this holds the line when the cluster changed since its snapshot."""
        if on is None:
            return f"cluster {cluster!r} has no driver to say what runs on {', '.join(names)}"
        async with self._store.unit() as uow:
            for wid in on:
                try:
                    w = (await uow.workloads.get(wid)).workload
                except NotFoundError:
                    return f"{wid} runs on {', '.join(names)} and is not a known workload"
                if not restartable(w):
                    return (f"{wid} ({w.spec.kind}, spot_ok={w.spec.spot_ok}) runs on "
                            f"{', '.join(names)}: a consolidation drains only restartable "
                            "work")
        return ""

    async def _drain(self, rec: DecisionRecord, names: Sequence[str],
                     on: Sequence[str]) -> list[str]:
        """Stop the restartable workloads `on` the named nodes (every replica: a gang restarts
        whole, as in the twin) and send them back to pending; the next epoch places them
        again and they resume from their last checkpoint. Returns their ids."""
        out = []
        reason = f"consolidated: node {', '.join(names)} of {rec.cluster}/{rec.pool} drained"
        for wid in on:
            w = await stop_replicas(self._store, self._drivers, wid)
            if w is None:
                continue
            async with self._store.unit() as uow:
                await uow.workloads.requeue(w.id, reason=reason)
                await uow.events.append("workload.consolidated", w.id,
                                        {"decision": rec.id, "cluster": rec.cluster,
                                         "pool": rec.pool, "nodes": list(names)},
                                        tenant=w.tenant)
            out.append(wid)
        return out

    # ---- prewarm --------------------------------------------------------------------------
    async def _prewarm(self, rec: DecisionRecord, now: float) -> Outcome:
        driver = self._drivers.get(rec.cluster)
        if driver is None or Capability.PREWARM not in driver.capabilities or \
                not isinstance(driver, PrewarmingDriver):
            why = "has no driver" if driver is None else "has a driver that cannot prewarm"
            return Outcome("refused", event="refused",
                           error=f"cluster {rec.cluster!r} {why} (Capability.PREWARM)")
        if rec.step == "":
            await driver.prewarm(spec=prewarm_spec(rec))
            return Outcome("running", step="started", event="started", wait_s=0.0,
                           spec={"started_s": now},
                           data={"images": list(rec.spec.get("images") or []),
                                 "data": [d.get("url", "") for d in rec.spec.get("data") or []],
                                 "workload": rec.spec.get("workload_id", ""),
                                 "reason": rec.spec.get("reason", "")})
        if await driver.prewarm_done(key=rec.key):
            return Outcome("done", event="done", data={"workload": rec.spec.get("workload_id",
                                                                                 "")})
        waited = now - float(rec.spec.get("started_s", now))
        if waited > self._s.prewarm_timeout_s:
            return Outcome("failed", event="failed", error=f"prewarm not done after "
                                                           f"{waited:.0f} s")
        return Outcome("running", wait_s=self._s.poll_s)

    # ---- record ---------------------------------------------------------------------------
    async def _record(self, rec: DecisionRecord, out: Outcome) -> None:
        now = self._clock.now()
        subject = rec.workload_id if rec.kind in ("migration", "preemption") \
            else f"{rec.cluster}/{rec.pool}"
        data = {"decision": rec.id, "cluster": rec.cluster, "pool": rec.pool,
                "state": out.state, **out.data}
        if out.error:
            data["error"] = out.error
        try:
            async with self._store.unit() as uow:
                if not out.recorded:
                    await uow.decisions.set_state(
                        rec.id, out.state, step=out.step, error=out.error, attempt=out.attempt,
                        spec=out.spec,
                        not_before_s=None if out.wait_s is None else now + out.wait_s)
                if out.event:
                    await uow.events.append(f"{rec.kind}.{out.event}", subject, data,
                                            tenant=rec.tenant)
        except BrokerError as exc:
            log.warning("cannot record decision %d: %s", rec.id, exc.message)
            return
        if out.state in FINAL:
            ACTUATIONS.labels(rec.kind, out.state).inc()
            log.info("decision %d %s %s: %s%s", rec.id, rec.kind, subject, out.state,
                     f" ({out.error})" if out.error else "")


def prewarm_spec(rec: DecisionRecord) -> PrewarmSpec:
    """The driver's view of a stored prewarm decision (its key is the idempotency key)."""
    data = tuple(PrewarmData(url=str(d.get("url", "")), sha256=str(d.get("sha256", "")),
                             size_gb=float(d.get("size_gb", 0.0)))
                 for d in rec.spec.get("data") or [])
    labels = {"skyfed.io/cluster": rec.cluster}
    if rec.spec.get("workload_id"):
        labels["skyfed.io/workload"] = str(rec.spec["workload_id"])
    return PrewarmSpec(key=rec.key, pool=rec.pool,
                       images=tuple(str(i) for i in rec.spec.get("images") or []),
                       data=data, labels=labels)


def make_actuator(rt: Runtime) -> Actuator:
    """The actuator over `rt.drivers` and `rt.accounts`; the placement loop wakes it after
    each commit."""
    return Actuator(rt.loop_store(), rt.drivers, rt.clock, accounts=rt.accounts,
                    settings=rt.settings.actuator)
