"""Fixtures shared by every suite.

`_no_leaked_tasks` fails any async test that leaves an asyncio task running
(kopf's rule): every task must have an owner that awaits or cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before
              if not t.done() and t is not asyncio.current_task()]
    if leaked:
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test leaked asyncio tasks: {[t.get_name() for t in leaked]}")
