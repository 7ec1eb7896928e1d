"""Cluster telemetry: the data-aware inputs placement reads (usage, QPS, p99, errors, SLA).

Two sources, both optional:

- **Kubernetes Metrics API** (``metrics.k8s.io``, i.e. metrics-server): node CPU/memory in use,
  per member cluster whose driver declares ``Capability.METRICS`` (providers/kubernetes.py's
  ``node_usage``; the SDK stays inside providers/).
- **Prometheus HTTP API** (``/api/v1/query``, via httpx): one PromQL expression per metric from
  ``settings.telemetry.queries`` (e.g. ``qps = sum by (cluster) (rate(http_requests_total[1m]))``).
  Each result series is attributed to the cluster named by its ``cluster`` label (or ``"*"``
  when the query aggregates everything).

The loop keeps the latest values in memory (``latest``; the broker's loop is ``Runtime.telemetry``)
and writes them under ``attrs["telemetry"]`` of each cluster in the store, with the time they
were read. The snapshot merge (placement/snapshot.py) sums the per-node usage per pool and
counts the larger of measured and requested as a pool's usage, so headroom and the policy's
free-capacity features see nodes that run hotter than their pods requested. A failing
source is logged and the others are still read; values are never invented.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from broker.clock import Clock
from broker.errors import BrokerError
from broker.federation.looping import PollingLoop
from providers.base import Capability, ClusterDriver

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.store import Store

log = logging.getLogger(__name__)

CLUSTER_LABEL = "cluster"
ALL = "*"

# Sensible defaults for services instrumented with the usual HTTP server metrics.
DEFAULT_QUERIES: dict[str, str] = {
    "qps": 'sum by (cluster) (rate(http_requests_total[1m]))',
    "p99_latency_ms": "1000 * histogram_quantile(0.99, sum by (cluster, le) "
                      "(rate(http_request_duration_seconds_bucket[5m])))",
    "error_rate": 'sum by (cluster) (rate(http_requests_total{code=~"5.."}[1m])) / '
                  "sum by (cluster) (rate(http_requests_total[1m]))",
}


class TelemetryError(BrokerError):
    """A telemetry source answered badly (bad PromQL, unreachable, malformed)."""


@dataclass(frozen=True, slots=True)
class Sample:
    metric: str
    labels: Mapping[str, str]
    value: float


class PrometheusReader:
    """Instant queries against Prometheus' HTTP API."""

    def __init__(self, base_url: str, queries: Mapping[str, str], *,
                 client: httpx.AsyncClient | None = None, timeout_s: float = 10.0) -> None:
        self._base = base_url.rstrip("/")
        self.queries = dict(queries)
        self._client = client
        self._timeout_s = timeout_s

    async def query(self, metric: str, promql: str) -> list[Sample]:
        """One metric's samples; TelemetryError names the metric and Prometheus' reason."""
        client = self._client or httpx.AsyncClient(timeout=self._timeout_s)
        try:
            resp = await client.get(f"{self._base}/api/v1/query", params={"query": promql},
                                    timeout=self._timeout_s)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise TelemetryError(f"prometheus query for {metric!r} failed: {exc}") from exc
        finally:
            if self._client is None:
                await client.aclose()
        if body.get("status") != "success":
            raise TelemetryError(f"prometheus rejected the query for {metric!r}: "
                                 f"{body.get('errorType', '')} {body.get('error', '')}".strip())
        data = body.get("data") or {}
        out = []
        if data.get("resultType") == "scalar":
            out.append(Sample(metric, {}, float(data["result"][1])))
        vector = data.get("result") or [] if data.get("resultType") == "vector" else []
        for series in vector:
            value = float(series["value"][1])
            if math.isfinite(value):
                out.append(Sample(metric, dict(series.get("metric") or {}), value))
        return out

    async def read_all(self) -> dict[str, dict[str, float]]:
        """metric -> cluster -> value, for every configured query (failed ones omitted)."""
        out: dict[str, dict[str, float]] = {}
        for metric, promql in self.queries.items():
            try:
                samples = await self.query(metric, promql)
            except TelemetryError as exc:
                log.warning("%s", exc)
                continue
            per: dict[str, float] = {}
            for s in samples:
                key = s.labels.get(CLUSTER_LABEL, ALL)
                per[key] = per.get(key, 0.0) + s.value
            out[metric] = per
        return out


@dataclass(slots=True)
class ClusterTelemetry:
    read_s: float
    node_cpu_used: float | None = None
    node_memory_used_gib: float | None = None
    app: dict[str, float] = field(default_factory=dict)
    # node -> (cpu cores, memory GiB) in use: the snapshot merge sums them per pool.
    nodes: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"read_s": self.read_s, "node_cpu_used": self.node_cpu_used,
                "node_memory_used_gib": self.node_memory_used_gib, "app": dict(self.app),
                "nodes": {k: [v[0], v[1]] for k, v in self.nodes.items()}}


class TelemetryLoop(PollingLoop):
    """Each step is one `read_once`, every `interval_s`."""

    name = "telemetry"

    def __init__(self, store: Store, clock: Clock, *, drivers: Mapping[str, ClusterDriver],
                 prometheus: PrometheusReader | None, interval_s: float = 30.0) -> None:
        super().__init__(clock, interval_s=interval_s)
        self._store = store
        self._drivers = drivers
        self._prom = prometheus
        self.latest: dict[str, ClusterTelemetry] = {}

    async def step(self) -> dict[str, ClusterTelemetry]:
        return await self.read_once()

    async def read_once(self) -> dict[str, ClusterTelemetry]:
        now = self.clock.now()
        result: dict[str, ClusterTelemetry] = {}
        for name, drv in self._drivers.items():
            node_usage = getattr(drv, "node_usage", None)
            if Capability.METRICS not in drv.capabilities or node_usage is None:
                continue
            try:
                usage: dict[str, tuple[float, float]] = await node_usage()
            except Exception as exc:  # noqa: BLE001  one cluster's metrics must not stop others
                log.warning("metrics.k8s.io on %s failed: %s", name, exc)
                continue
            result[name] = ClusterTelemetry(
                read_s=now, node_cpu_used=round(sum(u[0] for u in usage.values()), 3),
                node_memory_used_gib=round(sum(u[1] for u in usage.values()), 3),
                nodes={str(k): (float(v[0]), float(v[1])) for k, v in usage.items()})
        if self._prom is not None:
            for metric, per in (await self._prom.read_all()).items():
                for cluster, value in per.items():
                    result.setdefault(cluster, ClusterTelemetry(read_s=now)).app[metric] = value
        self.latest = result
        await self._persist(result)
        return result

    async def _persist(self, result: Mapping[str, ClusterTelemetry]) -> None:
        try:
            async with self._store.unit() as uow:
                for rec in await uow.clusters.list_records():
                    t = result.get(rec.cluster.name)
                    if t is not None:
                        await uow.clusters.set_attrs(rec.cluster.name,
                                                     {"telemetry": t.as_json()})
        except BrokerError as exc:
            log.warning("storing telemetry failed: %s", exc)

def make_telemetry(rt: Runtime) -> TelemetryLoop | None:
    """On when Prometheus is configured or a driver serves metrics (`rt.drivers` as the
    start-up steps left it)."""
    t = rt.settings.telemetry
    prom = (PrometheusReader(t.prometheus_url, t.queries or DEFAULT_QUERIES)
            if t.prometheus_url else None)
    metric_drivers = {n: d for n, d in rt.drivers.items()
                      if Capability.METRICS in d.capabilities}
    if prom is None and not metric_drivers:
        return None
    return TelemetryLoop(rt.loop_store(), rt.clock, drivers=rt.drivers, prometheus=prom,
                         interval_s=t.interval_s)
