"""The dashboard in a real headless Chromium against a real `skyfed serve` process.

Starts the broker on a free port with a temp SQLite data dir, registers a
cluster and submits a workload through the API, loads /ui, enters the token,
waits for the workload to appear, opens its explanation and saves a
screenshot to artifacts/dashboard.png (gitignored; CI keeps it).

Needs Debian's `chromium` and `chromium-driver`, which `make test` installs
(scripts/test_tools.sh). When they are missing the test fails, naming the command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "e2e-dashboard-token-9f3a1c"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _need_browser() -> None:
    missing = [p for p in ("chromium", "chromedriver") if shutil.which(p) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed; `make test` installs them, or run: "
                    "apt-get install -y chromium chromium-driver", pytrace=False)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "SKYFED_DATA_DIR": str(tmp_path), "SKYFED_STORE__URL": "",
           "SKYFED_API__ADMIN_TOKEN": TOKEN, "SKYFED_LOG_LEVEL": "WARNING",
           "SKYFED_MQTT__URL": f"mqtt://127.0.0.1:{_free_port()}",
           "SKYFED_MQTT__EMBEDDED": "true", "SKYFED_PLACEMENT__EPOCH_S": "0.5"}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", "--migrate",
                             "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("skyfed serve did not come up:\n"
                            f"{(tmp_path / 'serve.log').read_text()}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)  # a pause that ends early if the server dies
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _driver(profile: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1400,1800"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


CLUSTER = {"name": "aws-use1", "provider": "aws", "region": "us-east-1", "lat": 39.07,
           "lon": -77.48, "pools": [{"name": "m5", "instanceType": "m5.2xlarge",
                                     "node": {"cpu": 8, "memory": 32}, "nodes": 3,
                                     "maxNodes": 10, "priceUsdPerHour": 0.384}]}
WORKLOAD = {"apiVersion": "skyfed.io/v1", "kind": "Workload",
            "metadata": {"name": "web-e2e"},
            "spec": {"kind": "service", "image": "nginx:1.27", "replicas": 2,
                     "resources": {"cpu": 1, "memory": "2Gi"}}}


def test_dashboard_shows_a_submitted_workload_and_its_explanation(broker: str,
                                                                  tmp_path: Path) -> None:
    _need_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{broker}/v1/clusters", json=CLUSTER, headers=headers).status_code \
        in (200, 201)
    r = httpx.post(f"{broker}/v1/workloads", json=WORKLOAD, headers=headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]

    ARTIFACTS.mkdir(exist_ok=True)
    driver = _driver(tmp_path / "chromium-profile")
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(f"{broker}/ui")
        assert driver.title == "skyfed dashboard"
        driver.find_element(By.ID, "token").send_keys(TOKEN)
        driver.find_element(By.ID, "token-save").click()
        row = wait.until(ec.presence_of_element_located(
            (By.CSS_SELECTOR, f'#workloads tr[data-id="{workload_id}"]')))
        assert "web-e2e" in row.text
        # the cluster is on the map and in the clusters table
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#map [data-name="aws-use1"]')))
        assert "aws-use1" in driver.find_element(By.ID, "clusters").text
        # wait for the placement loop, then for the page's next refresh
        wait.until(lambda d: "aws-use1" in d.find_element(
            By.CSS_SELECTOR, f'#workloads tr[data-id="{workload_id}"]').text)
        driver.find_element(By.CSS_SELECTOR, f'#workloads tr[data-id="{workload_id}"]').click()
        section = wait.until(ec.visibility_of_element_located((By.ID, "explain-section")))
        explain = driver.find_element(By.ID, "explain")
        wait.until(lambda d: explain.text.strip() and "loading" not in explain.text)
        assert "chosen" in explain.text
        assert "aws-use1" in explain.text
        assert "web-e2e" in section.text
        status = driver.find_element(By.ID, "status").text
        assert "workloads" in status, status
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    finally:
        driver.quit()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
