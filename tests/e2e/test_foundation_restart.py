"""Whole-process test: `skyfed serve` as a process; a submitted workload survives
kill -9 and a restart; the CLI talks to it with the token file serve wrote."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(data_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYFED_")}
    return env | {"SKYFED_DATA_DIR": str(data_dir), "SKYFED_API__PORT": str(port),
                  "SKYFED_API__HOST": "127.0.0.1", "SKYFED_CONFIG": str(data_dir / "none.toml")}


def start(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", *args], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited: {proc.stderr.read().decode()[-800:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)  # a pause that also notices an early exit
    raise AssertionError("broker not ready in time")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_workload_survives_kill_9_and_restart(tmp_path: Path) -> None:
    port = free_port()
    env = env_for(tmp_path, port)
    refused = start(env)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert b"skyfed db upgrade" in err

    assert cli(env, "db", "upgrade").returncode == 0
    proc = start(env)
    try:
        wait_ready(port, proc)
        token_file = tmp_path / "token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        out = cli(env, "submit", str(REPO / "examples" / "web-service.yaml"), "-o", "json")
        assert out.returncode == 0, out.stderr
        wid = json.loads(out.stdout)[0]["id"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    proc = start(env)
    try:
        wait_ready(port, proc)
        listed = cli(env, "get", "workloads")
        assert wid in listed.stdout
        token = (tmp_path / "token").read_text().strip()
        r = httpx.get(f"http://127.0.0.1:{port}/v1/workloads/{wid}",
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        assert r.json()["metadata"]["name"] == "shop-frontend"
        missing = cli(env, "describe", "workload", "w-missing")
        assert missing.returncode == 1
        assert missing.stderr.strip().count("\n") == 0
        assert "not found" in missing.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0  # graceful shutdown on SIGTERM


def test_cli_reports_an_unreachable_server_in_one_line(tmp_path: Path) -> None:
    env = env_for(tmp_path, free_port())
    out = cli(env, "get", "workloads")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach the broker")
    assert out.stderr.strip().count("\n") == 0


def test_bench_api_prints_the_documented_json(tmp_path: Path) -> None:
    env = env_for(tmp_path, free_port())
    out = cli(env, "bench", "api", "--backend", "sqlite", "--clients", "4", "--seconds", "1",
              "--warmup-s", "0", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)["sqlite"]
    assert {"rps", "p50_ms", "p99_ms", "errors"} <= result.keys()
    assert result["rps"] > 0
    assert result["errors"] == 0
