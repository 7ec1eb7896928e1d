"""The one worker pool of the twin's runs (broker/sim/parallel.py): results in the order
of the calls, whatever order the workers finish in, and a failed run fails the batch."""

from __future__ import annotations

import time

import pytest

from broker.sim.parallel import in_order, spawned


def _sleep_then(delay_s: float, value: int) -> int:
    time.sleep(delay_s)  # noqa: TID251 - a worker process, not async code
    return value


def test_results_come_back_in_the_order_of_the_calls_not_of_finishing() -> None:
    finished: list[int] = []
    ticks: list[None] = []
    with spawned(2) as pool:
        assert pool is not None
        # The first call sleeps longest, so it finishes last.
        out = in_order(pool, _sleep_then, [(2.0, 10), (0.0, 20), (0.0, 30)],
                       done=lambda i, _r: finished.append(i), poll_s=0.05,
                       tick=lambda: ticks.append(None))
    assert out == [10, 20, 30]
    assert sorted(finished) == [0, 1, 2]
    assert finished[-1] == 0
    assert len(ticks) >= 2  # the waits end every poll_s while a run is still going


def test_a_failed_run_raises_its_error() -> None:
    with spawned(2) as pool:
        assert pool is not None
        with pytest.raises(ZeroDivisionError):
            in_order(pool, divmod, [(1, 1), (1, 0), (2, 1)])


def test_one_job_runs_inline() -> None:
    with spawned(1) as pool:
        assert pool is None
