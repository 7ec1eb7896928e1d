"""`skyfed bench chaos`: faults against broker replicas under load, with what they cost.

Setup (once): a throw-away schema in the PostgreSQL of `--pg-url`, `--replicas` full
brokers (`skyfed serve`, bench/replicas.py) on it, simulated member clusters whose
provider API fails 30 % of calls (`attrs.simulated.error_rate`: a third 429, a third 5xx,
a third timeouts that hang 1 s; a standing fault in every trial), this bench's OWN
Mosquitto on a free port (never the system one) and one real edge agent (`skyfed-edge
run`) on a registered site.

Trial k runs scenario k mod 5, each bounded by `--trial-timeout-s`:

- leader_kill: kill -9 of the leader while clients submit. `leader_failover_s` is the time
  from the kill until the loops run in another replica: its first placement written under
  the new fencing epoch.
- replica_kill: kill -9 of a random replica at a random point of the submissions.
- pg_loss: `pg_terminate_backend` of every PostgreSQL session of every replica (the server
  stays up). `pg_recovery_s`: until a submission made after it is placed.
- mqtt_restart: the bench's Mosquitto stopped and started again. `mqtt_recovery_s`: until
  the hub stores an RTT measured by the agent after the restart (agent and hub both back).
- provider_faults: load with nothing but the standing 30 % provider faults.

Clients submit every workload with an Idempotency-Key and retry it (same key, any live
replica) until answered 201/200. `accepted`: workloads answered so. `lost`: accepted but
not stored, or not placed by the end. `duplicated`: one submission stored twice.
`double_placed`: a workload the placement loop placed more often than 1 + its re-queues, or
with two active placements (bench/replicas.py `DOUBLE_PLACED`; a migration or an edge
failover moves a workload without placing it again). The election and the fencing epoch
are what keep it 0. Killed replicas restart before the next trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.bench.api import DEFAULT_PG, RawClient, run_bench
from broker.bench.mosquitto import Mosquitto
from broker.bench.replicas import DOUBLE_PLACED, ReplicaSet, leader, names_stored, query

SCENARIOS = ("leader_kill", "replica_kill", "pg_loss", "mqtt_restart", "provider_faults")
SPEC: dict[str, Any] = {"kind": "service", "image": "nginx:1.27", "replicas": 1,
                        "resources": {"cpu": "250m", "memory": "256Mi"}}
SITE = "chaos-edge-1"
PROVIDER_ERROR_RATE = 0.3


@dataclass(frozen=True, slots=True)
class Options:
    trials: int = 5
    replicas: int = 3
    workloads: int = 20  # per trial
    clusters: int = 6
    trial_timeout_s: float = 30.0
    seed: int = 0


@dataclass
class Tally:
    accepted: set[str] = field(default_factory=set)
    failover_s: list[float] = field(default_factory=list)
    pg_recovery_s: list[float] = field(default_factory=list)
    mqtt_recovery_s: list[float] = field(default_factory=list)
    routes_kept: list[bool] = field(default_factory=list)  # per Mosquitto restart
    per_scenario: dict[str, int] = field(default_factory=dict)


async def prepare(url: str, opts: Options) -> str:
    """Migrate; register the faulty simulated clusters and the edge site; a tenant token."""
    from broker.domain import Cluster, Pool, Resources, Site
    from broker.store import Store, migrate

    await migrate.upgrade(url)
    rng = random.Random(opts.seed)
    store = Store.from_url(url, pool_size=2)
    try:
        async with store.unit() as uow:
            await uow.tenants.ensure("admin")
            for i in range(opts.clusters):
                pool = Pool(name="cpu", instance_type="bench-16x64", node=Resources(16, 64, 0),
                            nodes=64, max_nodes=64,
                            price_usd_per_hour=round(rng.uniform(0.5, 1.0), 4))
                await uow.clusters.upsert(
                    Cluster(name=f"chaos-{i:02d}", provider="aws", region="us-east-1",
                            pools=(pool,), lat=38.9, lon=-77.4), tenant="admin",
                    attrs={"driver": "simulated",
                           "simulated": {"error_rate": PROVIDER_ERROR_RATE, "seed": i}})
            # dear, so the load stays on the clouds; only the route probe (its users are at
            # the site, 10 ms SLO) is placed here
            await uow.sites.upsert(Site(SITE, 35.7, 139.7, capacity=Resources(8, 32),
                                        price_usd_per_hour=50.0), tenant="admin")
            _, token = await uow.tokens.create(tenant="chaos", description="skyfed bench chaos")
    finally:
        await store.close()
    return token


class Submitter:
    """Clients that submit `names` over the live replicas, retrying each until answered."""

    def __init__(self, rs: ReplicaSet, token: str, tally: Tally, deadline: float) -> None:
        self.rs, self.token, self.tally, self.deadline = rs, token, tally, deadline
        self.done = 0
        self.reached = asyncio.Event()
        self.fault_at = 0

    async def one(self, name: str) -> None:
        body = json.dumps({"apiVersion": "skyfed.io/v1", "kind": "Workload",
                           "metadata": {"name": name}, "spec": SPEC}).encode()
        headers = {"Authorization": f"Bearer {self.token}",
                   "Content-Type": "application/json", "Idempotency-Key": name}
        attempt = 0
        while time.monotonic() < self.deadline:
            alive = self.rs.alive() or [0]
            port = self.rs.ports[alive[attempt % len(alive)]]
            attempt += 1
            raw = RawClient("127.0.0.1", port)
            try:
                status = await asyncio.wait_for(raw.post("/v1/workloads", body, headers), 5)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                status = 0
            finally:
                await raw.close()
            if status in (200, 201):
                self.tally.accepted.add(name)
                break
            await asyncio.sleep(0.05)
        self.done += 1
        if self.done >= self.fault_at:
            self.reached.set()

    async def run(self, names: list[str], clients: int = 4) -> None:
        todo = iter(names)

        async def client() -> None:
            for name in todo:
                await self.one(name)

        async with asyncio.TaskGroup() as tg:
            for _ in range(clients):
                tg.create_task(client())


async def _placed(url: str, names: list[str]) -> int:
    rows = await query(url, """SELECT count(DISTINCT w.id) FROM workloads w
                                JOIN placements p ON p.workload_id = w.id
                                WHERE w.name = ANY($1::text[])""", names)
    return int(rows[0][0] or 0)


async def _until(cond: Any, timeout_s: float, every_s: float = 0.05) -> float | None:
    """Seconds until `await cond()` is true, or None after `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await cond():
            return time.monotonic() - t0
        await asyncio.sleep(every_s)
    return None


async def _leader_kill(url: str, rs: ReplicaSet, tally: Tally, timeout_s: float) -> None:
    now = await leader(url)
    if now is None:
        return
    epoch, pid = now
    i = rs.index_of_pid(pid)
    if i is None:
        return
    t0 = time.monotonic()
    rs.kill(i)

    async def new_term_placed() -> bool:
        rows = await query(url, "SELECT count(*) FROM placements WHERE leader_epoch > $1",
                            epoch)
        return int(rows[0][0] or 0) > 0

    took = await _until(new_term_placed, timeout_s)
    tally.failover_s.append(round(time.monotonic() - t0, 3) if took is not None else timeout_s)


async def _pg_loss(url: str, rs: ReplicaSet, sub: Submitter, tally: Tally,
                   timeout_s: float) -> None:
    import psutil

    ports = set()
    for i in rs.alive():
        proc = rs.procs[i]
        if proc is None:
            continue
        for c in psutil.Process(proc.pid).net_connections(kind="tcp"):
            if c.raddr and c.raddr.port == 5432:
                ports.add(c.laddr.port)
    t0 = time.monotonic()
    await query(url, """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE client_port = ANY($1::int[]) AND client_addr = '127.0.0.1'""",
                 sorted(ports))
    probe = f"pgprobe-{uuid.uuid4().hex[:8]}"
    await sub.one(probe)
    took = await _until(lambda: _placed_one(url, probe), timeout_s)
    # not recovered within the bound: the bound is what the figure says (it fails the goal)
    tally.pg_recovery_s.append(round(time.monotonic() - t0, 3) if took is not None
                               else timeout_s)


async def _placed_one(url: str, name: str) -> bool:
    return await _placed(url, [name]) > 0


async def _rtt_at(url: str) -> float:
    rows = await query(url, "SELECT attrs FROM sites WHERE name = $1", SITE)
    if not rows or rows[0][0] is None:
        return 0.0
    attrs = rows[0][0] if isinstance(rows[0][0], dict) else json.loads(rows[0][0])
    return max((float(v.get("at_s", 0.0)) for v in (attrs.get("rtt") or {}).values()),
               default=0.0)


async def routes(mq: Mosquitto, wait_s: float = 0.5) -> dict[str, str]:
    """The retained routes on the bench's Mosquitto: service -> site."""
    import aiomqtt

    from edge_agent.protocol import DEFAULT_PREFIX, Route, Topics, decode

    out: dict[str, str] = {}
    async with aiomqtt.Client("127.0.0.1", mq.port,
                              identifier=f"chaos-routes-{uuid.uuid4().hex[:8]}") as c:
        await c.subscribe(Topics(DEFAULT_PREFIX).all_routes(), qos=1)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                async for msg in c.messages:
                    route = decode(Route, msg.payload) if isinstance(
                        msg.payload, bytes | bytearray | str) and msg.payload else None
                    if route is not None:
                        out[route.service] = route.site
    return out


async def _route_probe(rs: ReplicaSet, mq: Mosquitto, token: str, timeout_s: float) -> str:
    """Submit one edge service whose users are at SITE; wait until its route is retained."""
    body = json.dumps({"apiVersion": "skyfed.io/v1", "kind": "Workload",
                       "metadata": {"name": "chaos-route"},
                       "spec": SPEC | {"userRegion": SITE, "latencySloMs": 10}}).encode()
    raw = RawClient("127.0.0.1", rs.ports[rs.alive()[0]])
    try:
        status = await raw.post("/v1/workloads", body, {
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Idempotency-Key": "chaos-route"})
    finally:
        await raw.close()
    if status not in (200, 201):
        raise RuntimeError(f"the route probe was answered {status}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await routes(mq):
            return SITE
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no edge route was published within {timeout_s} s\n{rs.logs()}")


async def _mqtt_restart(url: str, mq: Mosquitto, tally: Tally, timeout_s: float) -> None:
    before = await routes(mq)
    t0 = time.monotonic()
    mq.stop()
    await mq.start()
    up_wall = time.time()

    async def fresh_rtt() -> bool:
        return await _rtt_at(url) > up_wall

    took = await _until(fresh_rtt, timeout_s, every_s=0.1)
    after = await routes(mq)
    tally.routes_kept.append(bool(before) and all(after.get(k) == v for k, v in before.items()))
    tally.mqtt_recovery_s.append(round(time.monotonic() - t0, 3) if took is not None
                                 else timeout_s)


async def trial(k: int, url: str, rs: ReplicaSet, mq: Mosquitto, token: str, tally: Tally,
                opts: Options, rng: random.Random) -> None:
    scenario = SCENARIOS[k % len(SCENARIOS)]
    tally.per_scenario[scenario] = tally.per_scenario.get(scenario, 0) + 1
    for i in range(rs.n):
        if i not in rs.alive():
            rs.start(i)
    for i in range(rs.n):
        await rs.wait_ready(i)
    names = [f"chaos-{k:03d}-{i:03d}" for i in range(opts.workloads)]
    sub = Submitter(rs, token, tally, time.monotonic() + opts.trial_timeout_s)
    sub.fault_at = rng.randint(1, max(1, opts.workloads - 1))
    async with asyncio.TaskGroup() as tg:
        tg.create_task(sub.run(names))
        await sub.reached.wait()
        if scenario == "leader_kill":
            await _leader_kill(url, rs, tally, opts.trial_timeout_s)
        elif scenario == "replica_kill":
            alive = rs.alive()
            if alive:
                rs.kill(rng.choice(alive))
        elif scenario == "pg_loss":
            await _pg_loss(url, rs, sub, tally, opts.trial_timeout_s)
        elif scenario == "mqtt_restart":
            await _mqtt_restart(url, mq, tally, opts.trial_timeout_s)
    accepted = [n for n in names if n in tally.accepted]
    await _until(lambda: _all_placed(url, accepted), opts.trial_timeout_s, every_s=0.2)


async def _all_placed(url: str, names: list[str]) -> bool:
    return await _placed(url, names) >= len(names)


async def _all_running(url: str, names: list[str]) -> bool:
    rows = await query(url, """SELECT count(*) FROM workloads
        WHERE name = ANY($1::text[]) AND status = 'running'""", names)
    return int(rows[0][0] or 0) >= len(names)


async def count(url: str, tally: Tally) -> dict[str, int]:
    accepted = sorted(tally.accepted)
    stored = await names_stored(url, accepted)
    placed_rows = await query(url, """SELECT w.name FROM workloads w
        WHERE w.name = ANY($1::text[]) AND EXISTS (
          SELECT 1 FROM placements p WHERE p.workload_id = w.id)""", accepted)
    placed = {str(r[0]) for r in placed_rows}
    dup = await query(url, """SELECT count(*) FROM (SELECT tenant, name FROM workloads
                               GROUP BY tenant, name HAVING count(*) > 1) d""")
    double = await query(url, DOUBLE_PLACED, "%")
    running = await query(url, """SELECT count(*) FROM workloads
        WHERE name = ANY($1::text[]) AND status = 'running'""", accepted)
    return {"running": int(running[0][0] or 0),
            "accepted": len(accepted), "lost": len([n for n in accepted if n not in stored
                                                    or n not in placed]),
            "lost_unstored": len([n for n in accepted if n not in stored]),
            "duplicated": int(dup[0][0] or 0), "double_placed": int(double[0][0] or 0)}


def _stats(values: list[float], keys: tuple[str, ...]) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(keys)
    v = sorted(values)
    out: dict[str, float | None] = {}
    for key in keys:
        out[key] = v[-1] if key == "max" else v[len(v) // 2]
    return out


async def _start_agent(mq: Mosquitto, work_dir: Path
                       ) -> tuple[subprocess.Popen[bytes], asyncio.Server]:
    """The edge agent of SITE, probing a TCP listener of this bench every 0.2 s."""
    server = await asyncio.start_server(_hang_up, "127.0.0.1", 0)
    return _agent_process(mq, work_dir, server.sockets[0].getsockname()[1]), server


def _agent_process(mq: Mosquitto, work_dir: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "edge_agent.cli", "run", "--site", SITE, "--broker",
         f"mqtt://127.0.0.1:{mq.port}", "--data-dir", str(work_dir / "agent"),
         "--probe", f"users=127.0.0.1:{port}", "--probe-every-s", "0.2",
         "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def run(pg_url: str, opts: Options) -> dict[str, Any]:
    from broker.store import migrate

    if shutil.which("mosquitto") is None:
        raise RuntimeError("mosquitto is not installed (the bench starts its own instance)")
    sep = "&" if "?" in pg_url else "?"
    url = f"{pg_url}{sep}schema=bench_chaos_{secrets.token_hex(5)}"
    rng = random.Random(opts.seed)
    tally = Tally()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skyfed-bench-chaos-") as tmp:
        work = Path(tmp)
        mq = Mosquitto(work)
        await mq.start()
        rs = ReplicaSet(url, opts.replicas, work,
                        env={"SKYFED_MQTT__URL": f"mqtt://127.0.0.1:{mq.port}"})
        agent, server = await _start_agent(mq, work)
        try:
            token = await prepare(url, opts)
            await rs.start_all()
            await _route_probe(rs, mq, token, opts.trial_timeout_s)
            for k in range(opts.trials):
                await trial(k, url, rs, mq, token, tally, opts, rng)
            await _until(lambda: _all_running(url, sorted(tally.accepted)),
                         opts.trial_timeout_s, every_s=0.2)
            counts = await count(url, tally)
        finally:
            rs.stop_all()
            agent.kill()
            agent.wait()
            server.close()
            await server.wait_closed()
            mq.stop()
            await migrate.drop_schema(url)
    return {"trials": opts.trials, **counts,
            "leader_failover_s": _stats(tally.failover_s, ("p50", "max")),
            "pg_recovery_s": _stats(tally.pg_recovery_s, ("p50", "max")),
            "mqtt_recovery_s": _stats(tally.mqtt_recovery_s, ("p50", "max")),
            # every retained route on the same site after each Mosquitto restart
            "routes_kept": all(tally.routes_kept) if tally.routes_kept else None,
            "routes_checked": len(tally.routes_kept),
            "scenarios": tally.per_scenario, "replicas": opts.replicas,
            "workloads_per_trial": opts.workloads,
            "provider_error_rate": PROVIDER_ERROR_RATE,
            "seconds": round(time.monotonic() - t_start, 1)}


def chaos(trials: Annotated[int, typer.Option(min=1, max=1000, help="Trials (scenario k mod 5 "
                                              "each).")] = 5,
          replicas: Annotated[int, typer.Option(min=2, max=8, help="Broker replicas.")] = 3,
          workloads: Annotated[int, typer.Option(min=2, max=10_000,
                                                 help="Workloads submitted per trial.")] = 20,
          trial_timeout_s: Annotated[float, typer.Option(min=1, help="Bound of each trial's "
                                                         "wait and recovery.")] = 30.0,
          seed: Annotated[int, typer.Option(help="Seed of fault points and prices.")] = 0,
          pg_url: Annotated[str, typer.Option(help="PostgreSQL to run in (a temp schema).")]
          = DEFAULT_PG,
          as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Kill -9, PostgreSQL and Mosquitto faults and provider errors against broker replicas."""
    opts = Options(trials=trials, replicas=replicas, workloads=workloads,
                   trial_timeout_s=trial_timeout_s, seed=seed)
    result = run_bench(run(pg_url, opts), as_json=as_json)
    if result is None:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"chaos: {trials} trials, {replicas} replicas, PostgreSQL, "
                        f"{int(PROVIDER_ERROR_RATE * 100)} % provider 429/5xx/timeouts")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("accepted", "lost", "duplicated", "double_placed"):
        table.add_row(key, str(result[key]))
    for key in ("leader_failover_s", "pg_recovery_s", "mqtt_recovery_s"):
        table.add_row(f"{key} p50 / max", f"{result[key]['p50']} / {result[key]['max']}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("chaos")(chaos)
