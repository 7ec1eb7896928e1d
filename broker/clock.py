"""Time, injected. Production code asks a `Clock`, never `time.time()` directly,
so the twin and the tests can run the same code on simulated time.

`now()` is epoch seconds (a float); `sleep(s)` is cooperative. `ManualClock`
only moves when a test calls `advance()`, and wakes sleepers whose deadline
has passed, in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock time (epoch seconds) and `asyncio.sleep`."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that only moves when told to (tests, the twin's live shell)."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper that is now due."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (seconds={seconds})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())


async def sleep_or_stop(clock: Clock, seconds: float, stop: asyncio.Event,
                        wake: asyncio.Event | None = None) -> None:
    """Sleep `seconds` on `clock`, or less if `stop` (or `wake`, when given) is set meanwhile.

    Every periodic loop waits this way (`broker.federation.looping.PollingLoop`), so a
    shutdown never waits out an interval, a `wake()` cuts the wait short, and a
    ManualClock drives the loops in tests. It neither clears `wake` nor `stop`. The helper
    tasks are owned here and always cancelled and awaited.
    """
    events = (stop,) if wake is None else (stop, wake)
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({*waiters, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (*waiters, sleeper):
            t.cancel()
        await asyncio.gather(*waiters, sleeper, return_exceptions=True)
