"""Broker replicas: the singleton loops run in the elected leader only.

Every replica serves the API, explain and reads. The loops that decide and act
(`Runtime.loops()`: placement, dispatcher, actuator, reconciler, quota sync, inventory,
telemetry, driver refresh, the edge hub) run under `LeaderElector` in exactly one replica
at a time; the election and its fencing epoch are broker/store/leadership.py.

    candidate --(lock won: epoch += 1)--> leader --(session lost / stop)--> candidate

- As a candidate it retries the lock every `retry_s`. A killed leader's session ends with
  its process, so the next try after that wins: failover takes about `retry_s` plus the
  time PostgreSQL needs to notice the dead connection (immediate for a killed process,
  whose kernel closes the socket).
- As the leader it sets the `Fence` (the singleton loops write through
  `Store.fenced(fence)`), LISTENs for wakes, starts its loops, and checks its session every
  `check_s` (or at once when asyncpg reports it terminated). When the session is gone it
  clears the fence first -- so from then on every unit of work of its loops is refused
  before it starts -- then stops the loops (`grace_s`, then cancels) and closes the session.
  Late writes that were already past that check are refused by the epoch in the database.
- `WakeNotifier` runs in every replica: the API pokes it after a submission, and it sends
  one `NOTIFY` at a time (pokes arriving meanwhile coalesce into the next), so the leader's
  placement loop wakes whichever replica took the submission.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.clock import Clock, sleep_or_stop
from broker.errors import StoreError
from broker.federation.looping import Loop, supervise
from broker.federation.metrics import LEADER_EPOCH
from broker.store.leadership import Fence, PgLease, notify_wake

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.store import Store

log = logging.getLogger("skyfed")

__all__ = ["LeaderElector", "WakeNotifier", "holder_name", "make_leadership"]


def holder_name(port: int | None = None) -> str:
    """Who a replica is, in `leader_epochs.holder` and logs: host, pid, API port."""
    return f"{socket.gethostname()}:{os.getpid()}" + ("" if port is None else f":{port}")


class LeaderElector:
    """A `Loop` that campaigns for leadership and runs `loops` while it holds it."""

    name = "leader"

    def __init__(self, lease: PgLease, loops: Sequence[Loop], fence: Fence, clock: Clock, *,
                 retry_s: float = 0.5, check_s: float = 0.5, grace_s: float = 2.0,
                 on_wake: Callable[[], None] | None = None) -> None:
        self.lease = lease
        self.loops = list(loops)
        self.fence = fence
        self.clock = clock
        self.retry_s = retry_s
        self.check_s = check_s
        self.grace_s = grace_s
        self.on_wake = on_wake
        self.terms = 0  # how many times this replica was elected

    @property
    def leading(self) -> bool:
        return self.fence.epoch is not None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                epoch = await self._campaign(stop)
                if epoch is None:
                    return
                await self._lead(epoch, stop)
        finally:
            self.fence.epoch = None
            await self.lease.close()

    async def _campaign(self, stop: asyncio.Event) -> int | None:
        """Try for the lock every `retry_s` until won (its epoch) or `stop` (None)."""
        while not stop.is_set():
            try:
                if not await self.lease.alive():
                    await self.lease.connect()
                epoch = await self.lease.try_acquire(self.clock.now())
                if epoch is not None:
                    return epoch
            except StoreError as e:
                log.warning("leader election: %s; retrying in %.1f s", e.message, self.retry_s)
                await self.lease.close()
            await sleep_or_stop(self.clock, self.retry_s, stop)
        return None

    async def _lead(self, epoch: int, stop: asyncio.Event) -> None:
        """Run the loops until the session is lost or `stop`; then step down."""
        self.fence.epoch = epoch
        self.terms += 1
        LEADER_EPOCH.set(epoch)
        log.warning("leader: elected (epoch %d, %s); starting %d loops", epoch,
                    self.lease.holder, len(self.loops))
        lead_stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.on_wake is not None:
                await self.lease.listen(self.on_wake)
                self.on_wake()  # pending work submitted before this term: solve it now
            tasks = [asyncio.create_task(supervise(lp, lead_stop), name=f"loop:{lp.name}")
                     for lp in self.loops]
            while not stop.is_set():
                await sleep_or_stop(self.clock, self.check_s, stop, wake=self.lease.lost)
                if stop.is_set():
                    break
                if not await self.lease.alive():
                    log.warning("leader: lost the session (epoch %d); stepping down", epoch)
                    break
        except StoreError as e:
            log.warning("leader: %s; stepping down (epoch %d)", e.message, epoch)
        finally:
            self.fence.epoch = None  # first: no unit of work starts from here on
            LEADER_EPOCH.set(0)
            lead_stop.set()
            await _finish(tasks, self.grace_s)
            await self.lease.close()


async def _finish(tasks: Sequence[asyncio.Task[None]], grace_s: float) -> None:
    """Wait `grace_s` for `tasks` to end, then cancel until they did (a task can swallow
    one cancellation: FACTS.md, aiomqtt's QoS 1 publish)."""
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=grace_s)
    while late:
        for task in late:
            log.warning("%s ignored the step-down for %.0f s; cancelling it",
                        task.get_name(), grace_s)
            task.cancel()
        _, late = await asyncio.wait(late, timeout=1.0)


class WakeNotifier:
    """Sends `NOTIFY` for the leader's placement loop when poked (every replica runs one)."""

    name = "wake-notify"

    def __init__(self, store: Store, channel: str) -> None:
        self._store = store
        self.channel = channel
        self._poked = asyncio.Event()
        self.sent = 0

    def poke(self) -> None:
        self._poked.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waiter = asyncio.ensure_future(self._poked.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (waiter, stopper):
                    t.cancel()
                await asyncio.gather(waiter, stopper, return_exceptions=True)
            if stop.is_set():
                return
            self._poked.clear()
            try:
                await notify_wake(self._store, self.channel)
                self.sent += 1
            except StoreError as e:  # the leader's epoch timer still finds the work
                log.warning("wake notify failed: %s", e.message)


def make_leadership(rt: Runtime, loops: Sequence[Loop], *,
                    port: int | None = None) -> tuple[LeaderElector, WakeNotifier]:
    """The elector over `loops` and the wake notifier, for a PostgreSQL store.

    `rt.fence` must be the fence the loops' store (`rt.loop_store()`) was fenced with;
    sets `rt.leader` and `rt.waker`, which the API's submission path uses.
    """
    ha = rt.settings.ha
    url = rt.settings.store_url
    lease = PgLease(url, holder=holder_name(port), timeout_s=ha.session_timeout_s)

    def wake_local() -> None:
        if rt.placement_loop is not None:
            rt.placement_loop.wake()

    elector = LeaderElector(lease, loops, rt.fence, rt.clock, retry_s=ha.retry_s,
                            check_s=ha.check_s, grace_s=ha.grace_s, on_wake=wake_local)
    notifier = WakeNotifier(rt.store, lease.channel)
    rt.leader, rt.waker = elector, notifier
    return elector, notifier
