"""Session loops end even when one swallows a cancellation (Python 3.11 wait_for race)."""

from __future__ import annotations

import asyncio
import contextlib

from edge_agent.protocol import cancel_all


async def _stubborn(started: asyncio.Event) -> None:
    started.set()
    # What asyncio.wait_for does on 3.11 when its result races the cancel (gh-86296).
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(10)
    await asyncio.sleep(10)


async def test_a_loop_that_swallows_one_cancel_is_cancelled_again() -> None:
    started = asyncio.Event()
    task = asyncio.ensure_future(_stubborn(started))
    await started.wait()
    await asyncio.wait_for(cancel_all([task]), 2.0)
    assert task.cancelled()
