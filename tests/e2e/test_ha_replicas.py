"""Broker replicas as processes: `skyfed serve` x N on one PostgreSQL database (issue 13).

Finding 4: two replicas on one database placed 49 of 50 workloads twice (every replica ran
its own placement loop). Done-means: three replicas place each of 500 workloads exactly
once, and when the leader is killed (-9) another takes over. Simulated member clusters;
each test has its own schema.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.bench.api import free_port
from broker.bench.e2e import Options, prepare, submit_all
from broker.bench.replicas import ReplicaSet, placement_counts, wait_leader, wait_placed
from broker.store import migrate
from tests.e2e.test_foundation_restart import wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
async def url(pg_url: str) -> AsyncIterator[str]:
    u = f"{pg_url}?schema=t_replicas_{secrets.token_hex(5)}"
    try:
        yield u
    finally:
        await migrate.drop_schema(u)


@pytest.fixture
def pg_url() -> str:
    from tests.integration.conftest import PG_HOST, PG_PORT, PG_URL, require_service

    require_service("PostgreSQL", PG_HOST, PG_PORT)
    return PG_URL


async def _submit_spread(rs: ReplicaSet, replicas: list[int], token: str,
                         names: list[str]) -> int:
    """Submit `names` round-robin over `replicas` (2 clients each); the errors."""
    parts = await asyncio.gather(*(
        submit_all(rs.ports[r], token, names[k::len(replicas)], 2)
        for k, r in enumerate(replicas)))
    return sum(errors for errors, _ in parts)


async def test_two_replicas_place_each_workload_once(url: str, tmp_path: Path) -> None:
    """Finding 4's regression: on 3f27126 both replicas placed (49 of 50 twice)."""
    token = await prepare(url, Options(clusters=4, workloads=0, clients=1, warmup=0,
                                       timeout_s=60, seed=1))
    rs = ReplicaSet(url, 2, tmp_path)
    try:
        await rs.start_all()
        names = [f"two-{i:03d}" for i in range(50)]
        assert await _submit_spread(rs, [0, 1], token, names) == 0
        counts = await wait_placed(url, "two-", 50, 60)
        await asyncio.sleep(1.0)  # a second placer would have written by now
        counts = await placement_counts(url, "two-")
    finally:
        rs.stop_all()
    assert counts == {"workloads": 50, "placed": 50, "double_placed": 0, "duplicated": 0}, \
        rs.logs()


async def test_three_replicas_place_500_once_and_survive_a_leader_kill(
        url: str, tmp_path: Path) -> None:
    token = await prepare(url, Options(clusters=8, workloads=0, clients=1, warmup=0,
                                       timeout_s=60, seed=2))
    rs = ReplicaSet(url, 3, tmp_path)
    try:
        await rs.start_all()
        epoch, lead, _ = await wait_leader(url, rs)
        first = [f"three-{i:03d}" for i in range(250)]
        assert await _submit_spread(rs, [0, 1, 2], token, first) == 0
        assert (await wait_placed(url, "three-", 250, 60))["placed"] == 250
        rs.kill(lead)  # kill -9 of the leader
        new_epoch, new_lead, failover_s = await wait_leader(url, rs, not_epoch=epoch,
                                                            timeout_s=10)
        second = [f"three-{i:03d}" for i in range(250, 500)]
        assert await _submit_spread(rs, rs.alive(), token, second) == 0
        await wait_placed(url, "three-", 500, 90)
        await asyncio.sleep(1.0)
        counts = await placement_counts(url, "three-")
    finally:
        rs.stop_all()
    assert new_lead != lead
    assert new_epoch > epoch
    assert failover_s < 5
    assert counts == {"workloads": 500, "placed": 500, "double_placed": 0, "duplicated": 0}, \
        rs.logs()


def test_a_second_broker_on_one_sqlite_database_refuses_to_start(tmp_path: Path) -> None:

    env = os.environ | {"SKYFED_DATA_DIR": str(tmp_path), "SKYFED_API__HOST": "127.0.0.1"}
    env.pop("SKYFED_STORE__URL", None)
    env.pop("SKYFED_STORE_URL", None)
    cmd = [sys.executable, "-m", "broker.cli", "serve", "--migrate"]
    port = free_port()
    first = subprocess.Popen([*cmd, "--port", str(port)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(port, first)
        second = subprocess.run([*cmd, "--port", str(free_port())], env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        first.terminate()
        first.wait(timeout=20)
    assert second.returncode == 1
    assert "SQLite supports one broker" in second.stderr
    assert f"pid {first.pid}" in second.stderr
