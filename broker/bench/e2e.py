"""`skyfed bench e2e`: submit-to-placed and submit-to-running latency of the whole broker.

It starts a real broker (`skyfed serve`, a subprocess with its own event loop: API,
placement loop, dispatcher, actuator, reconciler, ...) on PostgreSQL, in a throw-away schema
of the database named by `--pg-url`, with `--clusters` simulated member clusters registered
before it starts (apply -> running at once; pools large enough that nothing must scale). It
then submits `--workloads` services through `POST /v1/workloads` from `--clients`
concurrent clients, each sending its next one as soon as the last was answered (the raw
HTTP/1.1 client of bench/api.py), and waits until every workload runs.

The latencies are the broker's own records, not the client's view: from a workload's
`submitted_s` (stored by the submission) to the time of its first `workload.placed` event
(the placement loop's unit of work) and its first `workload.running` event (the
reconciler's, once the driver reported it running). A short warm-up (`--warmup`
workloads, not counted) runs first, so start-up costs (policy and catalog loads, the first
solve) are not in the figures. `errors`: submissions not answered 201, plus workloads not
running by `--timeout-s`.

Numbers depend on the machine: the clients, the broker and PostgreSQL share its CPUs; the
JSON carries the 1-minute load average and the broker's own epoch timings (from /metrics).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import secrets
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.bench.api import (
    DEFAULT_PG,
    RawClient,
    free_port,
    run_bench,
    start_broker,
    wait_ready,
)

SPEC: dict[str, Any] = {"kind": "service", "image": "nginx:1.27", "replicas": 2,
                        "resources": {"cpu": "500m", "memory": "1Gi"}}


@dataclass(frozen=True, slots=True)
class Options:
    clusters: int
    workloads: int
    clients: int
    warmup: int
    timeout_s: float
    seed: int
    broker_log: Path | None = None
    log_level: str = "WARNING"


async def prepare(url: str, opts: Options) -> str:
    """Migrate, register the simulated clusters, create the tenant's token; returns it."""
    from broker.domain import Cluster, Pool, Resources
    from broker.store import Store, migrate
    from providers.catalog import Catalog

    await migrate.upgrade(url)
    rng = random.Random(opts.seed)
    regions = [r for r in Catalog.load().regions() if r.lat is not None and r.lon is not None]
    store = Store.from_url(url, pool_size=2)
    try:
        async with store.unit() as uow:
            await uow.tenants.ensure("admin")
            for i in range(opts.clusters):
                region = regions[i % len(regions)]
                pool = Pool(name="cpu", instance_type="bench-16x64", node=Resources(16, 64, 0),
                            nodes=64, max_nodes=64,
                            price_usd_per_hour=round(rng.uniform(0.5, 1.0), 4))
                cluster = Cluster(name=f"sim-{i:03d}", provider=region.provider,
                                  region=region.name, pools=(pool,), lat=region.lat,
                                  lon=region.lon)
                await uow.clusters.upsert(cluster, tenant="admin",
                                          attrs={"driver": "simulated"})
            _, token = await uow.tokens.create(tenant="bench", description="skyfed bench e2e")
    finally:
        await store.close()
    return token


async def submit_all(port: int, token: str, names: list[str], clients: int) -> tuple[int, float]:
    """POST every workload of `names` from `clients` connections; (errors, seconds)."""
    todo = iter(names)
    errors = 0
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def client() -> None:
        nonlocal errors
        raw = RawClient("127.0.0.1", port)
        h = dict(headers)
        try:
            for name in todo:
                body = json.dumps({"apiVersion": "skyfed.io/v1", "kind": "Workload",
                                   "metadata": {"name": name}, "spec": SPEC}).encode()
                h["Idempotency-Key"] = uuid.uuid4().hex
                try:
                    status = await asyncio.wait_for(raw.post("/v1/workloads", body, h), 30)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                    status = 0
                    await raw.close()
                    raw = RawClient("127.0.0.1", port)
                errors += status != 201
        finally:
            await raw.close()

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(clients):
            tg.create_task(client())
    return errors, time.perf_counter() - t0


async def wait_running(url: str, prefix: str, want: int, timeout_s: float) -> int:
    """Poll the store until `want` workloads named `prefix*` run; returns how many do."""
    from sqlalchemy import text

    from broker.store import Store

    store = Store.from_url(url, pool_size=1)
    q = text("SELECT count(*) FROM workloads WHERE status = 'running' AND name LIKE :p")
    deadline = time.monotonic() + timeout_s
    running = 0
    try:
        while time.monotonic() < deadline:
            async with store.unit() as uow:
                running = int((await uow.session.execute(q, {"p": prefix + "%"})).scalar() or 0)
            if running >= want:
                break
            await asyncio.sleep(0.2)
    finally:
        await store.close()
    return running


async def latencies(url: str, prefix: str) -> dict[str, list[float]]:
    """Per workload: seconds from `submitted_s` to its first placed and running event."""
    from sqlalchemy import text

    from broker.store import Store

    store = Store.from_url(url, pool_size=1)
    q = text("""SELECT w.id, w.submitted_s, e.kind, min(e.ts) FROM workloads w
                JOIN events e ON e.subject = w.id
                WHERE w.name LIKE :p AND e.kind IN ('workload.placed', 'workload.running')
                GROUP BY w.id, w.submitted_s, e.kind""")
    out: dict[str, list[float]] = {"workload.placed": [], "workload.running": []}
    try:
        async with store.unit() as uow:
            for _, submitted, kind, ts in (await uow.session.execute(q, {"p": prefix + "%"})):
                out[str(kind)].append(max(0.0, float(ts) - float(submitted)))
    finally:
        await store.close()
    return out


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    v = sorted(values)

    def pct(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 1)

    return {"p50": pct(0.50), "p99": pct(0.99)}


async def broker_metrics(port: int) -> dict[str, Any]:
    """The broker's own placement-epoch figures, read from its /metrics."""
    import httpx

    async with httpx.AsyncClient(timeout=5) as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text

    def value(name: str) -> float:
        m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    epochs = value("skyfed_placement_epoch_seconds_count")
    total = value("skyfed_placement_epoch_seconds_sum")
    return {"epochs": int(epochs),
            "epoch_mean_ms": round(1000 * total / epochs, 1) if epochs else None}


async def run(pg_url: str, opts: Options) -> dict[str, Any]:
    from broker.store import migrate

    sep = "&" if "?" in pg_url else "?"
    url = f"{pg_url}{sep}schema=bench_e2e_{secrets.token_hex(5)}"
    with tempfile.TemporaryDirectory(prefix="skyfed-bench-e2e-") as tmp:
        try:
            token = await prepare(url, opts)
            port = free_port()
            proc = start_broker(url, Path(tmp), port, api_only=False,
                                log_file=opts.broker_log or Path(tmp) / "broker.log",
                                log_level=opts.log_level)
            try:
                await wait_ready(f"http://127.0.0.1:{port}", proc)
                return await _measure(url, port, token, opts)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            await migrate.drop_schema(url)


async def _measure(url: str, port: int, token: str, opts: Options) -> dict[str, Any]:
    if opts.warmup:
        warm = [f"warmup-{i}" for i in range(opts.warmup)]
        await submit_all(port, token, warm, min(opts.clients, opts.warmup))
        await wait_running(url, "warmup-", opts.warmup, opts.timeout_s)
    names = [f"e2e-{i:05d}" for i in range(opts.workloads)]
    t0 = time.perf_counter()
    errors, submit_s = await submit_all(port, token, names, opts.clients)
    running = await wait_running(url, "e2e-", opts.workloads, opts.timeout_s)
    wall_s = time.perf_counter() - t0
    lat = await latencies(url, "e2e-")
    out: dict[str, Any] = {
        "submit_to_placed_ms": percentiles(lat["workload.placed"]),
        "submit_to_running_ms": percentiles(lat["workload.running"]),
        "errors": errors + (opts.workloads - running),
        "workloads": opts.workloads, "running": running, "clusters": opts.clusters,
        "clients": opts.clients, "submissions_per_s": round(opts.workloads / submit_s, 1),
        "all_running_after_s": round(wall_s, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    return out | await broker_metrics(port)


def e2e(clusters: Annotated[int, typer.Option(min=1, max=1000, help="Simulated clusters.")]
        = 100,
        workloads: Annotated[int, typer.Option(min=1, max=100_000,
                                               help="Workloads to submit.")] = 2000,
        clients: Annotated[int, typer.Option(min=1, max=512,
                                             help="Concurrent API clients.")] = 32,
        warmup: Annotated[int, typer.Option(min=0, help="Uncounted warm-up workloads.")] = 10,
        timeout_s: Annotated[float, typer.Option(min=1, help="Wait this long for every "
                                                 "workload to run.")] = 300.0,
        seed: Annotated[int, typer.Option(help="Seed of the cluster prices.")] = 0,
        broker_log: Annotated[Path | None, typer.Option(
            help="Keep the broker's log here (INFO: one line per placement epoch).")] = None,
        pg_url: Annotated[str, typer.Option(help="PostgreSQL to run in (a temp schema).")]
        = DEFAULT_PG,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Submit-to-placed and submit-to-running latency of a broker it starts on PostgreSQL."""
    opts = Options(clusters=clusters, workloads=workloads, clients=clients, warmup=warmup,
                   timeout_s=timeout_s, seed=seed, broker_log=broker_log,
                   log_level="INFO" if broker_log else "WARNING")
    result = run_bench(run(pg_url, opts), as_json=as_json)
    if result is None:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"submit -> placed -> running: {workloads} workloads, {clusters} "
                        f"simulated clusters, {clients} clients, PostgreSQL")
    for col in ("", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")
    for key, label in (("submit_to_placed_ms", "submit -> placed"),
                       ("submit_to_running_ms", "submit -> running")):
        table.add_row(label, str(result[key]["p50"]), str(result[key]["p99"]))
    Console().print(table)
    typer.echo(f"errors {result['errors']}, {result['submissions_per_s']} submissions/s, "
               f"all running after {result['all_running_after_s']} s, {result['epochs']} "
               f"placement epochs (mean {result['epoch_mean_ms']} ms), load "
               f"{result['load_avg_1m']}")


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("e2e")(e2e)
