"""`skyfed bench e2e` end to end at a tiny size (a broker process on the real PostgreSQL):
the documented JSON and every workload running. Not timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_foundation_restart import REPO, env_for, free_port
from tests.integration.conftest import PG_HOST, PG_PORT, PG_URL, require_service

pytestmark = pytest.mark.e2e


def test_bench_e2e_places_and_runs_everything_and_prints_the_documented_json(
        tmp_path: Path) -> None:
    require_service("PostgreSQL", PG_HOST, PG_PORT)
    env = env_for(tmp_path, free_port())
    log = tmp_path / "broker.log"
    out = subprocess.run(
        [sys.executable, "-m", "broker.cli", "bench", "e2e", "--clusters", "3", "--workloads",
         "12", "--clients", "4", "--warmup", "2", "--timeout-s", "60", "--pg-url", PG_URL,
         "--broker-log", str(log), "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("submit_to_placed_ms", "submit_to_running_ms"):
        assert set(result[key]) == {"p50", "p99"}
        assert 0 <= result[key]["p50"] <= result[key]["p99"]
    assert result["submit_to_placed_ms"]["p50"] <= result["submit_to_running_ms"]["p50"]
    assert (result["errors"], result["running"], result["workloads"]) == (0, 12, 12)
    assert result["epochs"] >= 1
    assert "placement epoch:" in log.read_text()  # the broker's own account, kept on request
