"""The broker's processes run OpenBLAS on one thread unless the operator says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import broker, numpy, threadpoolctl; "
         "print(sorted({p['num_threads'] for p in threadpoolctl.threadpool_info() "
         "if p['internal_api'] == 'openblas'}))")


def _threads(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_openblas_runs_one_thread_in_the_broker() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads(env) == "[1]"


def test_the_operators_setting_wins() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads({**env, "OPENBLAS_NUM_THREADS": "2"}) == "[2]"
