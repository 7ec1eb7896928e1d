"""Whole process: `skyfed serve` polls its member's inventory; `GET /v1/clusters/{name}` and
`skyfed describe cluster NAME -o json` show what runs there, the same JSON, camelCase."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_foundation_restart import cli, env_for, free_port, start, wait_ready

pytestmark = pytest.mark.e2e

CLUSTER = {"name": "sim-a", "provider": "aws", "region": "us-east-1", "lat": 38.9,
           "lon": -77.4, "pools": [{"name": "cpu", "instanceType": "m5.2xlarge", "nodes": 2,
                                    "maxNodes": 2}]}
WORKLOAD = {"apiVersion": "skyfed.io/v1", "kind": "Workload", "metadata": {"name": "api"},
            "spec": {"kind": "service", "image": "api:1", "replicas": 2,
                     "resources": {"cpu": "1500m", "memory": "1Gi"}}}


def until(fn: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        threading.Event().wait(0.25)  # a plain pause: this test is synchronous
    raise AssertionError("condition not met in time")


def same_shape(a: Any, b: Any, path: str = "") -> None:
    """Same keys everywhere (values that age between two reads may differ)."""
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float, type(None)}, path
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            same_shape(a[k], b[k], f"{path}.{k}")


def test_observed_inventory_through_api_and_cli(tmp_path: Path) -> None:
    port = free_port()
    env = env_for(tmp_path, port)
    proc = start(env, "--migrate")
    try:
        wait_ready(port, proc)
        h = {"Authorization": f"Bearer {(tmp_path / 'token').read_text().strip()}"}
        base = f"http://127.0.0.1:{port}/v1"
        assert httpx.post(f"{base}/clusters", json=CLUSTER, headers=h).status_code == 201

        def get() -> dict[str, Any]:
            r = httpx.get(f"{base}/clusters/sim-a", headers=h)
            assert r.status_code == 200, r.text
            return dict(r.json())

        first = until(lambda: (c := get())["observed"] and c)
        assert first["observed"]["nodes"] == 2
        assert first["observed"]["cpuAllocated"] == 0
        assert first["pricing"]["source"] == "catalog"  # filled in at registration
        assert first["quota"]["source"] == "none"
        r = httpx.post(f"{base}/workloads", json=WORKLOAD, headers=h)
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        until(lambda: httpx.get(f"{base}/workloads/{wid}", headers=h).json()["status"]["phase"]
              == "running")
        busy = until(lambda: (c := get())["observed"]["cpuAllocated"] == 3.0 and c)
        assert busy["observed"]["observedAt"] > first["observed"]["observedAt"]
        listed = httpx.get(f"{base}/clusters", headers=h).json()["items"]
        assert listed[0]["observed"]["cpuAllocated"] == 3.0

        out = cli(env, "describe", "cluster", "sim-a", "-o", "json")
        assert out.returncode == 0, out.stderr
        described = json.loads(out.stdout)
        api = get()
        same_shape(described, api)
        for key in ("name", "provider", "region", "pools", "pricing", "effective"):
            if key == "pricing":
                assert described[key]["source"] == api[key]["source"]
            else:
                assert described[key] == api[key], key
        assert described["observed"]["cpuAllocated"] == 3.0
        table = cli(env, "describe", "cluster", "sim-a", "-o", "table")
        assert table.returncode == 0, table.stderr
        assert "REGISTERED" in table.stdout
        assert "OBSERVED" in table.stdout
        row = next(ln for ln in table.stdout.splitlines() if "cpu allocated" in ln)
        assert row.split()[2:4] == ["-", "3"]  # nothing is registered as running; observed
        listing = cli(env, "get", "clusters")
        assert "OBSERVED" in listing.stdout
        assert "3/" in listing.stdout  # cpu allocated / allocatable
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
