"""The broker's background loops: what one is (`Loop`), the periodic kind (`PollingLoop`),
and how each runs (`supervise`).

Why one class: every periodic loop (placement, dispatcher, reconciler, quota sync,
telemetry, driver refresh) used to write its own `run(stop)`, and two of them waited on
real time, so a ManualClock could not drive them and the twin could not share them.
`PollingLoop` is the one way to repeat a step: `step()`, then sleep `interval_s` on the
injected `Clock` until the interval passes, `wake()` is called, or `stop` is set.

    class Dispatcher(PollingLoop):
        name = "dispatcher"

        def __init__(self, store, drivers, clock, *, poll_s=1.0):
            super().__init__(clock, interval_s=poll_s)

        async def step(self) -> None:
            await self.dispatch_once()

A wake that arrives while a step runs is kept: the loop steps again at once after it
(nothing is lost when the API wakes the placement loop mid-epoch). With `batch_window_s`
a wake starts the next step only after that window, so a burst of wakes (submissions)
is served by one step (the placement loop solves them as one batch). A step that raises
ends `run`; `supervise` logs it and restarts the loop with backoff, so one broken loop
never takes the API down. The edge hub is a `Loop` with its own MQTT-driven `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from abc import ABC, abstractmethod
from typing import Protocol, runtime_checkable

from broker.clock import Clock, sleep_or_stop
from broker.errors import ConfigError

log = logging.getLogger("skyfed")

BACKOFF_MAX_S = 30.0

__all__ = ["BACKOFF_MAX_S", "Loop", "PollingLoop", "supervise"]


@runtime_checkable
class Loop(Protocol):
    """What the composition root runs: a `name` (logs, task names) and `run(stop)`.

    `run` must return promptly once `stop` is set.
    """

    name: str

    async def run(self, stop: asyncio.Event) -> None: ...


class PollingLoop(ABC):
    """A periodic loop on the injected clock; subclasses set `name` and write `step()`.

    `interval_s` is the pause between the end of one step and the start of the next
    (finite, > 0; a ConfigError names the loop otherwise). `wake()` starts the next step
    now; it is safe to call from any coroutine on the loop's event loop, any number of
    times (wakes coalesce). `clock` is public so steps can read the same time they sleep on.
    """

    name: str = "loop"

    def __init__(self, clock: Clock, *, interval_s: float, batch_window_s: float = 0.0) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ConfigError(f"loop {self.name}: interval_s must be a finite number > 0, "
                              f"got {interval_s}")
        if not (math.isfinite(batch_window_s) and batch_window_s >= 0):
            raise ConfigError(f"loop {self.name}: batch_window_s must be a finite number "
                              f">= 0, got {batch_window_s}")
        self.clock = clock
        self.interval_s = interval_s
        self.batch_window_s = batch_window_s
        self._wake = asyncio.Event()

    @abstractmethod
    async def step(self) -> object:
        """One pass of the loop's work; its return value is for callers and tests."""

    def wake(self) -> None:
        """Run the next step now instead of after the interval."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Step, then wait (interval, wake or stop), until `stop` is set."""
        while not stop.is_set():
            self._wake.clear()  # a wake during the step below is kept for the wait after it
            await self.step()
            await sleep_or_stop(self.clock, self.interval_s, stop, wake=self._wake)
            if self._wake.is_set() and self.batch_window_s > 0:
                await sleep_or_stop(self.clock, self.batch_window_s, stop)


async def supervise(loop: Loop, stop: asyncio.Event, *, initial_backoff_s: float = 1.0,
                    max_backoff_s: float = BACKOFF_MAX_S) -> None:
    """Run `loop` until `stop`; log and restart it with backoff when it crashes.

    The backoff doubles per crash up to `max_backoff_s` and waits on `stop`, so
    shutdown is never delayed by a sleeping supervisor.
    """
    backoff_s = initial_backoff_s
    while not stop.is_set():
        try:
            await loop.run(stop)
            if stop.is_set():
                return
            log.warning("loop %s returned before stop; restarting", loop.name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop %s crashed; restarting in %.0f s", loop.name, backoff_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=backoff_s)
        backoff_s = min(backoff_s * 2, max_backoff_s)
