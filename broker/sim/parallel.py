"""Runs of the twin in worker processes: the one pool and the one in-order collector that
`bench twin` (sim/seeds.py), `bench drafts` (sim/drafts.py) and training's rollouts
(sim/train.py) share.

Workers are spawned, not forked: no torch or HiGHS state of the parent is copied into them,
and a function they run must be importable by name (module level).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def spawned(jobs: int) -> Iterator[cf.ProcessPoolExecutor | None]:
    """`jobs` spawned worker processes, or None (run inline) for jobs <= 1."""
    if jobs <= 1:
        yield None
        return
    with cf.ProcessPoolExecutor(max_workers=jobs,
                                mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def in_order(pool: cf.Executor, fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], *,
             done: Callable[[int, T], None] | None = None, poll_s: float | None = None,
             tick: Callable[[], None] | None = None) -> list[T]:
    """fn(*args) for every args of `calls` on `pool`; the results in the order of `calls`.

    `done(i, result)` is called as each finishes (in the order they finish); `tick()` after
    every wait, which ends at the latest every `poll_s` seconds (progress drained from the
    workers). If a run fails, or the caller is interrupted (Ctrl-C), the runs not started
    yet are cancelled and the error is raised.
    """
    futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
    results: dict[int, T] = {}
    pending = set(futures)
    try:
        while pending:
            finished, pending = cf.wait(pending, timeout=poll_s,
                                        return_when=cf.FIRST_COMPLETED)
            if tick is not None:
                tick()
            for fut in finished:
                i = futures[fut]
                results[i] = fut.result()
                if done is not None:
                    done(i, results[i])
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    return [results[i] for i in range(len(calls))]
