"""Whole process (issue 14): `skyfed apply` of the Kubernetes docs' nginx Deployment, then
of the same file with 5 replicas, scales the same workload (no duplicate); `skyfed get
workloads -w` prints the transitions; `skyfed describe workload NAME` shows conditions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.test_cluster_observed_cli import CLUSTER, until
from tests.e2e.test_foundation_restart import REPO, cli, env_for, free_port, start, wait_ready
from tests.unit.test_k8s_manifests import NGINX

pytestmark = pytest.mark.e2e


def test_apply_scales_the_same_workload_and_watch_prints_transitions(tmp_path: Path) -> None:
    port = free_port()
    env = env_for(tmp_path, port)
    proc = start(env, "--migrate")
    watch: subprocess.Popen[str] | None = None
    try:
        wait_ready(port, proc)
        h = {"Authorization": f"Bearer {(tmp_path / 'token').read_text().strip()}"}
        base = f"http://127.0.0.1:{port}/v1"
        assert httpx.post(f"{base}/clusters", json=CLUSTER, headers=h).status_code == 201
        watch = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "get", "workloads", "-w",
             "--watch-timeout", "25"], env=env, cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        deploy = tmp_path / "deploy.yaml"
        deploy.write_text(yaml.safe_dump(NGINX))
        out = cli(env, "apply", str(deploy))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("workload/nginx-deployment created: w-")
        wid = out.stdout.split(": ")[1].split()[0]
        until(lambda: httpx.get(f"{base}/workloads/{wid}", headers=h).json()["status"][
            "phase"] == "running")
        assert watch.stdout is not None
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(watch.stdout or ()), daemon=True)
        reader.start()
        until(lambda: any(wid in line for line in seen))  # the watch is connected
        deploy.write_text(yaml.safe_dump(NGINX).replace("replicas: 3", "replicas: 5"))
        out = cli(env, "apply", str(deploy))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"workload/nginx-deployment configured: {wid} (replanned")
        until(lambda: (w := httpx.get(f"{base}/workloads/nginx-deployment", headers=h).json())
              ["status"]["phase"] == "running" and w["status"]["readyReplicas"] == 5,
              timeout_s=30)
        listed = httpx.get(f"{base}/workloads", headers=h).json()["items"]
        assert [w["id"] for w in listed] == [wid]  # the same workload, no duplicate
        described = cli(env, "describe", "workload", "nginx-deployment", "-o", "json")
        assert described.returncode == 0, described.stderr
        conditions = {c["type"]: c for c in json.loads(described.stdout)["status"][
            "conditions"]}
        assert conditions["Ready"]["status"] == "True"
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=30)
        reader.join(timeout=10)
        phases = [line.split()[3] for line in seen if wid in line]
        # The watch was connected before the second apply: its re-plan shows in full.
        assert "pending" in phases
        assert "placed" in phases
        assert phases[-1] == "running"
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
