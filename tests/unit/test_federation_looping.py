"""PollingLoop: the one periodic loop, on the injected clock (broker/federation/looping.py)."""

from __future__ import annotations

import asyncio
import math

import pytest

from broker.clock import ManualClock
from broker.errors import ConfigError
from broker.federation.looping import Loop, PollingLoop


class Counter(PollingLoop):
    name = "counter"

    def __init__(self, clock: ManualClock, interval_s: float = 10.0) -> None:
        super().__init__(clock, interval_s=interval_s)
        self.steps = 0
        self.gate: asyncio.Event | None = None  # when set by a test, the next step waits on it
        self.in_step = asyncio.Event()

    async def step(self) -> int:
        self.steps += 1
        if self.gate is not None:
            self.in_step.set()
            gate, self.gate = self.gate, None
            await gate.wait()
        return self.steps


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_steps_on_the_clock_wakes_at_once_and_stops_without_waiting() -> None:
    clock = ManualClock(0.0)
    loop, stop = Counter(clock), asyncio.Event()
    assert isinstance(loop, Loop)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(loop.run(stop))
        await _settle()
        assert loop.steps == 1
        assert clock.sleepers == 1  # it sleeps on the injected clock, not on real time
        clock.advance(9.9)
        await _settle()
        assert loop.steps == 1
        clock.advance(0.1)
        await _settle()
        assert loop.steps == 2
        loop.wake()
        loop.wake()  # wakes coalesce
        await _settle()
        assert loop.steps == 3
        stop.set()
        await _settle()
        assert task.done()
    assert loop.steps == 3
    assert clock.sleepers == 0


async def test_a_wake_during_a_step_is_kept() -> None:
    clock = ManualClock(0.0)
    loop, stop = Counter(clock), asyncio.Event()
    gate = loop.gate = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(loop.run(stop))
        await loop.in_step.wait()
        loop.wake()  # e.g. a submission while the placement loop solves
        gate.set()
        await _settle()
        assert loop.steps == 2  # stepped again at once, the clock never moved
        stop.set()


@pytest.mark.parametrize("interval_s", [0.0, -1.0, math.inf, math.nan])
def test_a_bad_interval_is_refused_naming_the_loop(interval_s: float) -> None:
    with pytest.raises(ConfigError, match="counter"):
        Counter(ManualClock(0.0), interval_s=interval_s)
