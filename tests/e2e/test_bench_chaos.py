"""`skyfed bench chaos --json` as a user runs it: every scenario once, the documented keys
(fixed by issue 13), nothing lost, duplicated or placed twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


def test_bench_chaos_prints_the_documented_json() -> None:
    from tests.integration.conftest import PG_HOST, PG_PORT, require_service

    require_service("PostgreSQL", PG_HOST, PG_PORT)
    out = subprocess.run([sys.executable, "-m", "broker.cli", "bench", "chaos", "--trials", "5",
                          "--replicas", "2", "--workloads", "6", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert {"trials", "accepted", "lost", "duplicated", "double_placed", "leader_failover_s",
            "pg_recovery_s", "mqtt_recovery_s"} <= set(result)
    assert result["trials"] == 5
    assert result["scenarios"] == {"leader_kill": 1, "replica_kill": 1, "pg_loss": 1,
                                   "mqtt_restart": 1, "provider_faults": 1}
    assert result["accepted"] >= 30  # 5 x 6, plus the PostgreSQL probe
    assert (result["lost"], result["duplicated"], result["double_placed"]) == (0, 0, 0)
    assert result["running"] == result["accepted"]
    assert result["provider_error_rate"] == 0.3
    assert result["routes_kept"] is True  # the edge route survived the Mosquitto restart
    assert result["routes_checked"] == 1
    for key in ("leader_failover_s", "pg_recovery_s", "mqtt_recovery_s"):
        assert set(result[key]) >= {"p50", "max"}
        assert 0 < result[key]["max"] < 30, key  # recovered within the trial bound
