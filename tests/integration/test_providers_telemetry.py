"""Telemetry's Prometheus path against a real Prometheus server scraping a tiny exporter.

Needs the `prometheus` binary (Debian package `prometheus`); `make test` installs it
(scripts/test_tools.sh).
FACTS.md: the first query result arrives ~6 s after start even with a 1 s scrape interval.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from broker.federation.telemetry import PrometheusReader, TelemetryError

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed; install it with: apt-get install -y prometheus",
                    pytrace=False)
    reg = CollectorRegistry()
    qps = Gauge("demo_requests_per_second", "QPS", ["cluster"], registry=reg)
    qps.labels("aws-use1").set(42.0)
    qps.labels("edge-mel").set(8.5)
    errors = Counter("demo_errors", "errors", ["cluster"], registry=reg)
    errors.labels("aws-use1").inc(3)
    exporter_port = _free_port()
    server, thread = start_http_server(exporter_port, addr="127.0.0.1", registry=reg)
    tmp = tmp_path_factory.mktemp("prom")
    cfg = tmp / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: demo\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter_port}']\n")
    port = _free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # first result ~6 s after start (FACTS.md)
            try:
                r = httpx.get(f"{url}/api/v1/query", params={"query": "demo_requests_per_second"},
                              timeout=1)
                if r.status_code == 200 and r.json()["data"]["result"]:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)  # noqa: TID251  (sync fixture, polling an external process)
        else:
            pytest.fail(f"prometheus gave no result in 20 s; log: {(tmp / 'prometheus.log')}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def test_reads_configured_queries_per_cluster(prometheus: str) -> None:
    reader = PrometheusReader(prometheus, {
        "qps": "sum by (cluster) (demo_requests_per_second)",
        "errors": "sum by (cluster) (demo_errors_total)",
        "total_qps": "sum(demo_requests_per_second)",
    })
    got = await reader.read_all()
    assert got["qps"] == {"aws-use1": 42.0, "edge-mel": 8.5}
    assert got["errors"] == {"aws-use1": 3.0}
    assert got["total_qps"] == {"*": 50.5}


async def test_bad_promql_names_the_metric(prometheus: str) -> None:
    reader = PrometheusReader(prometheus, {"p99_latency_ms": "sum by (cluster (oops"})
    with pytest.raises(TelemetryError, match="p99_latency_ms"):
        await reader.query("p99_latency_ms", "sum by (cluster (oops")
    assert await reader.read_all() == {}  # a bad query is skipped, not fatal


async def test_unreachable_prometheus_is_a_telemetry_error() -> None:
    reader = PrometheusReader(f"http://127.0.0.1:{_free_port()}", {"qps": "up"}, timeout_s=2)
    with pytest.raises(TelemetryError, match="qps"):
        await reader.query("qps", "up")


async def test_loop_stores_latest_values_on_the_cluster(prometheus: str, pg_url: str) -> None:
    import secrets

    from broker.clock import ManualClock
    from broker.domain import Cluster
    from broker.federation.telemetry import TelemetryLoop
    from broker.store import Store, migrate

    url = f"{pg_url}?schema=t_prov_tel_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    store = Store.from_url(url, pool_size=1, clock=ManualClock(1000.0))
    try:
        async with store.unit() as uow:
            await uow.tenants.ensure("acme")
            await uow.clusters.upsert(Cluster(name="aws-use1", provider="aws",
                                              region="us-east-1"), tenant="acme")
        loop = TelemetryLoop(store, ManualClock(2000.0), drivers={},
                             prometheus=PrometheusReader(prometheus, {
                                 "qps": "sum by (cluster) (demo_requests_per_second)"}))
        latest = await loop.read_once()
        assert latest["aws-use1"].app == {"qps": 42.0}
        assert loop.latest is latest
        async with store.unit() as uow:
            rec = await uow.clusters.get("aws-use1")
        assert rec.attrs["telemetry"]["app"] == {"qps": 42.0}
        assert rec.attrs["telemetry"]["read_s"] == 2000.0
    finally:
        await store.close()
        await migrate.drop_schema(url)
