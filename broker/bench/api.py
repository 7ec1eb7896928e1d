"""`skyfed bench api`: submissions/s and latency of `POST /v1/workloads`.

For each backend it starts a real broker (`skyfed serve --api-only`, one
uvicorn worker, a subprocess) on a fresh database -- a throw-away schema in
the PostgreSQL database named by `--pg-url`, then a SQLite file in a temp dir
-- creates a tenant token, and drives it with `--clients` concurrent async
httpx clients for `--seconds` (after a short warm-up that is not counted).
Each request carries a fresh Idempotency-Key, as a careful client would, so
the measured path includes the idempotency lookup. Only 201s count as
accepted; everything else (and transport errors) counts in `errors`.

Numbers depend on the machine: the load generator shares its CPUs with the
broker and the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


T = TypeVar("T")


def run_bench(main: Coroutine[Any, Any, T], *, as_json: bool) -> T | None:
    """Run a bench command's coroutine. A broker or set-up failure is one line on stderr and
    exit 1; with `as_json` the result is printed as JSON and None returned (nothing left to
    print); otherwise the result is returned for the command's table."""
    from broker.errors import BrokerError

    try:
        result = asyncio.run(main)
    except (BrokerError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    if as_json:
        typer.echo(json.dumps(result))
        return None
    return result


BODY: dict[str, Any] = {
    "apiVersion": "skyfed.io/v1", "kind": "Workload",
    "metadata": {"name": "bench-web", "labels": {"app": "bench"}},
    "spec": {"kind": "service", "image": "nginx:1.27", "replicas": 2,
             "resources": {"cpu": "500m", "memory": "1Gi"},
             "userRegion": "eu-central", "latencySloMs": 40},
}


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    accepted: int
    seconds: float
    clients: int

    def as_dict(self) -> dict[str, Any]:
        return {"rps": round(self.rps, 1), "p50_ms": round(self.p50_ms, 2),
                "p99_ms": round(self.p99_ms, 2), "errors": self.errors,
                "accepted": self.accepted, "seconds": round(self.seconds, 2),
                "clients": self.clients}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def prepare(url: str) -> str:
    """Migrate `url` and create a tenant token; returns the token."""
    from broker.store import Store, migrate

    await migrate.upgrade(url)
    store = Store.from_url(url, pool_size=1)
    try:
        async with store.unit() as uow:
            _, token = await uow.tokens.create(tenant="bench", description="skyfed bench api")
    finally:
        await store.close()
    return token


def start_broker(url: str, data_dir: Path, port: int, *, api_only: bool = True,
                 log_file: Path | None = None,
                 log_level: str = "WARNING") -> subprocess.Popen[bytes]:
    """`skyfed serve` on `url` (only the API unless `api_only=False`: then every loop too).

    Its log goes to `log_file` when given (a long run must not fill an unread pipe), else
    to a pipe that `wait_ready` reads when the broker exits early.
    """
    env = os.environ | {"SKYFED_STORE__URL": url, "SKYFED_DATA_DIR": str(data_dir),
                        "SKYFED_API__HOST": "127.0.0.1", "SKYFED_LOG_LEVEL": log_level}
    env.pop("SKYFED_STORE_URL", None)
    cmd = [sys.executable, "-m", "broker.cli", "serve", *(["--api-only"] if api_only else []),
           "--port", str(port)]
    if log_file is None:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with log_file.open("wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)


async def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base, timeout=2) as c:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else "(see its log file)"
                raise RuntimeError(f"broker exited with {proc.returncode}: {err.strip()[-500:]}")
            try:
                if (await c.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"broker at {base} not ready after {timeout_s} s")


class RawClient:
    """A minimal HTTP/1.1 keep-alive client for one connection.

    httpx spends ~1 ms of CPU per request on this 2-core machine -- as much as
    the broker itself -- so with `--client raw` (the default) the generator
    writes pre-built request bytes and parses only the status line and
    Content-Length. Use `--client httpx` to measure with httpx anyway.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> int:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._conn
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n{head}"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = await reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self._conn is not None:
            writer = self._conn[1]
            self._conn = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def drive(base: str, token: str, *, clients: int, seconds: float, warmup_s: float,
                client: str = "raw") -> Result:
    import httpx

    body = json.dumps(BODY).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from = start + warmup_s
    end = measure_from + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    host, _, port = base.removeprefix("http://").partition(":")

    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as c:

        async def post(raw: RawClient | None, h: dict[str, str]) -> int:
            if raw is not None:
                return await asyncio.wait_for(raw.post("/v1/workloads", body, h), 10)
            return (await c.post("/v1/workloads", content=body, headers=h)).status_code

        async def worker() -> None:
            nonlocal errors
            h = dict(headers)
            raw = RawClient(host, int(port)) if client == "raw" else None
            try:
                while True:
                    t0 = time.perf_counter()
                    if t0 >= end:
                        return
                    h["Idempotency-Key"] = uuid.uuid4().hex
                    try:
                        ok = await post(raw, h) == 201
                    except (httpx.HTTPError, OSError, asyncio.IncompleteReadError,
                            TimeoutError, ValueError):
                        ok = False
                        if raw is not None:
                            await raw.close()
                            raw = RawClient(host, int(port))
                    t1 = time.perf_counter()
                    if t0 >= measure_from and t1 <= end:
                        if ok:
                            latencies.append(t1 - t0)
                        else:
                            errors += 1
            finally:
                if raw is not None:
                    await raw.close()

        async with asyncio.TaskGroup() as tg:
            for _ in range(clients):
                tg.create_task(worker())
    latencies.sort()
    n = len(latencies)

    def pct(q: float) -> float:
        return latencies[min(n - 1, int(q * n))] * 1000 if n else float("nan")

    return Result(rps=n / seconds, p50_ms=pct(0.5), p99_ms=pct(0.99), errors=errors,
                  accepted=n, seconds=seconds, clients=clients)


async def run_backend(url: str, data_dir: Path, *, clients: int, seconds: float,
                      warmup_s: float, client: str) -> Result:
    token = await prepare(url)
    port = free_port()
    proc = start_broker(url, data_dir, port)
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_ready(base, proc)
        return await drive(base, token, clients=clients, seconds=seconds, warmup_s=warmup_s,
                           client=client)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def bench(pg_url: str, backends: list[str], *, clients: int, seconds: float,
                warmup_s: float, client: str = "raw") -> dict[str, dict[str, Any]]:
    from broker.store import migrate

    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="skyfed-bench-") as tmp:
        for backend in backends:
            if backend == "postgresql":
                sep = "&" if "?" in pg_url else "?"
                url = f"{pg_url}{sep}schema=bench_{secrets.token_hex(5)}"
                try:
                    res = await run_backend(url, Path(tmp) / "pg", clients=clients,
                                            seconds=seconds, warmup_s=warmup_s, client=client)
                finally:
                    await migrate.drop_schema(url)
            elif backend == "sqlite":
                url = f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
                res = await run_backend(url, Path(tmp) / "sqlite", clients=clients,
                                        seconds=seconds, warmup_s=warmup_s, client=client)
            else:
                raise typer.BadParameter(f"unknown backend {backend!r}")
            # The machine's 1-minute load average at the end of the run: numbers from a
            # shared 2-core box are only comparable at similar load.
            out[backend] = res.as_dict() | {"client": client,
                                            "load_avg_1m": round(os.getloadavg()[0], 2)}
    return out


def api(clients: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 32,
        seconds: Annotated[float, typer.Option(min=1, help="Measured seconds per backend.")] = 20,
        warmup_s: Annotated[float, typer.Option(min=0, help="Unmeasured warm-up.")] = 2.0,
        pg_url: Annotated[str, typer.Option(help="PostgreSQL to test in (a temp schema).")]
        = DEFAULT_PG,
        backend: Annotated[list[str] | None, typer.Option(
            help="postgresql and/or sqlite (default both).")] = None,
        client: Annotated[str, typer.Option(
            help="Load generator: raw (lean asyncio HTTP/1.1) or httpx.")] = "raw",
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Submission throughput and latency against a broker it starts (PostgreSQL, SQLite)."""
    if client not in ("raw", "httpx"):
        raise typer.BadParameter(f"--client must be raw or httpx, not {client!r}")
    results = run_bench(bench(pg_url, backend or ["postgresql", "sqlite"], clients=clients,
                              seconds=seconds, warmup_s=warmup_s, client=client),
                        as_json=as_json)
    if results is None:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"POST /v1/workloads, {clients} clients, {seconds:g} s, 1 worker")
    for col in ("backend", "submissions/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['rps']:.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      str(r["errors"]))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("api")(api)
