"""`skyfed bench failover`: edge failover timings with real agent processes on a real broker.

What runs: `--agents` real `skyfed-edge` processes (one per site) and the edge
hub (in this process) on one MQTT broker (default: the Mosquitto on
127.0.0.1:1883) under a unique topic prefix; `--services` latency-critical
services, each with a primary and a warm standby chosen by
`broker/placement/standby.py`. Then, in turn:

- crash: `kill -9` an agent that serves services (its socket closes, the
  broker sends its Last Will);
- partition: `SIGSTOP` an agent (its socket stays open and silent, like a
  cut link: only missed heartbeats reveal it).

For every service the victim served we measure, from the moment of the signal:
`detect_ms` (the hub declares the site down) and `serving_ms` (a subscriber
receives the new retained route, published after the standby acked its
promotion). Victims are restarted / resumed and the federation left to settle
between rounds. Agent RSS and CPU are sampled on the idle agents.

Numbers depend on the machine: on a loaded 2-core box 50 Python agents at a
100 ms heartbeat are real work; `--agents 10 --services 100` is a quick run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import typer

from broker.domain import Resources, Site, SiteHealth

if TYPE_CHECKING:  # the hub and the protocol load when the bench runs, not with the CLI
    from broker.federation.edge_hub import EdgeHub
    from edge_agent.protocol import Route

CENTER = (34.69, 135.50)  # Osaka; sites and users spread over ~50 km


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""

    @app.command("failover")
    def failover(
        agents: int = typer.Option(50, help="agent processes (edge sites)"),
        services: int = typer.Option(500, help="latency-critical services"),
        crashes: int = typer.Option(5, help="kill -9 rounds"),
        partitions: int = typer.Option(5, help="SIGSTOP rounds"),
        broker: str = typer.Option("mqtt://127.0.0.1:1883", help="MQTT broker URL"),
        heartbeat_ms: int = typer.Option(100),
        suspect_after_ms: int = typer.Option(300),
        down_after_ms: int = typer.Option(600),
        seed: int = typer.Option(1),
        private_broker: bool = typer.Option(
            False, help="start a private mosquitto on a free loopback port with "
                        "set_tcp_nodelay true (as deploy/mosquitto/ ships) instead of --broker"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """Crash and partition edge agents; report detection and serving times."""
        if agents < 3:
            raise typer.BadParameter("need at least 3 agents (primary, standby, spare)",
                                     param_hint="--agents")
        with contextlib.ExitStack() as stack:
            if private_broker:
                broker = stack.enter_context(_private_mosquitto())
            cfg = BenchConfig(agents=agents, services=services, crashes=crashes,
                              partitions=partitions, broker=broker, heartbeat_ms=heartbeat_ms,
                              suspect_after_ms=suspect_after_ms, down_after_ms=down_after_ms,
                              seed=seed)
            result = asyncio.run(run_bench(cfg, log=None if as_json else _stderr))
            result["private_broker"] = private_broker
        if as_json:
            typer.echo(json.dumps(result, indent=2))
        else:
            _print_table(result)


@contextlib.contextmanager
def _private_mosquitto() -> Iterator[str]:
    """A throwaway mosquitto (anonymous, loopback, no persistence, TCP_NODELAY)."""
    import shutil

    if shutil.which("mosquitto") is None:
        raise typer.BadParameter("mosquitto is not installed", param_hint="--private-broker")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory(prefix="skyfed-bench-mosquitto-") as d:
        conf = Path(d) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                        "set_tcp_nodelay true\npersistence false\nmax_inflight_messages 100\n"
                        "max_queued_messages 100000\n")
        proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("private mosquitto did not start") from None
                    time.sleep(0.05)  # noqa: TID251 - not in async code
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BenchConfig:
    agents: int = 50
    services: int = 500
    crashes: int = 5
    partitions: int = 5
    broker: str = "mqtt://127.0.0.1:1883"
    heartbeat_ms: int = 100
    suspect_after_ms: int = 300
    down_after_ms: int = 600
    seed: int = 1
    settle_timeout_s: float = 120.0


@dataclass
class _Run:
    cfg: BenchConfig
    prefix: str
    data_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    routes: list[tuple[float, Route]] = field(default_factory=list)
    watcher_reconnects: int = 0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100.0 * (len(s) - 1))))
    return round(s[k], 2)


def _spawn(run: _Run, site: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "edge_agent.cli", "run", "--site", site, "--broker",
         run.cfg.broker, "--prefix", run.prefix, "--data-dir", str(run.data_dir / site),
         "--heartbeat-ms", str(run.cfg.heartbeat_ms), "--log-level", "ERROR"],
        stdin=subprocess.DEVNULL)


async def _wait(pred: Callable[[], bool], timeout_s: float, what: str,
                detail: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            extra = f": {detail()}" if detail is not None else ""
            raise TimeoutError(f"bench: {what} not reached in {timeout_s} s{extra}")
        await asyncio.sleep(0.02)


async def _watch_routes(run: _Run, ready: asyncio.Event) -> None:
    """The users' view: a subscriber to every route, timestamping arrivals.

    Reconnects if its session breaks (counted in `watcher_reconnects`: the
    retained routes it then re-receives are not failovers and are not matched)."""
    import aiomqtt

    from edge_agent.protocol import Route, Topics, decode

    url = urlsplit(run.cfg.broker)
    topics = Topics(run.prefix)
    while True:
        try:
            async with aiomqtt.Client(
                    url.hostname or "127.0.0.1", url.port or 1883,
                    identifier=f"bench-watch-{uuid.uuid4().hex[:8]}",
                    socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)) as client:
                await client.subscribe(topics.all_routes(), qos=1)
                ready.set()
                async for m in client.messages:
                    if isinstance(m.payload, bytes | bytearray) and m.payload:
                        route = decode(Route, m.payload)
                        if route is not None:
                            run.routes.append((time.time() * 1000.0, route))
        except aiomqtt.MqttError:
            run.watcher_reconnects += 1
            await asyncio.sleep(0.1)


async def _cleanup_retained(run: _Run, sites: list[str], services: list[str]) -> None:
    """Leave nothing behind in the shared broker's retained store."""
    import aiomqtt

    from edge_agent.protocol import Topics

    url = urlsplit(run.cfg.broker)
    topics = Topics(run.prefix)
    with contextlib.suppress(aiomqtt.MqttError):
        async with aiomqtt.Client(url.hostname or "127.0.0.1", url.port or 1883,
                                  identifier=f"bench-clean-{uuid.uuid4().hex[:8]}") as c:
            for s in sites:
                await c.publish(topics.status(s), b"", qos=1, retain=True)
            for name in services:
                await c.publish(topics.route(name), b"", qos=1, retain=True)


def _is_healthy(hub: EdgeHub, site: str) -> bool:
    return hub.core.health(site) is SiteHealth.HEALTHY


def _unsettled(hub: EdgeHub) -> str:
    bad = [(n, s.primary, s.routed, s.standby, s.standby_ready)
           for n, s in hub.core.services.items()
           if not (s.routed and s.routed == s.primary and s.standby_ready)]
    pending = sorted({(p.purpose, p.command.kind) for p in hub.core.pending.values()})
    return f"{len(bad)} unsettled, e.g. {bad[:3]}; pending {pending}"


def _settled(hub: EdgeHub) -> bool:
    core = hub.core
    return all(s.routed and s.routed == s.primary and s.standby_ready
               for s in core.services.values()) and not any(
        p.purpose == "serve" for p in core.pending.values())


async def _round(run: _Run, hub: EdgeHub, victim: str, how: str,
                 out: dict[str, list[float]]) -> int:
    core = hub.core
    served = [n for n, s in core.services.items() if s.primary == victim]
    n_routes = len(run.routes)
    n_fail = len(core.failovers)
    proc = run.procs[victim]
    t0 = time.time() * 1000.0
    if how == "crash":
        proc.kill()
    else:
        proc.send_signal(signal.SIGSTOP)
    with contextlib.suppress(TimeoutError):
        await _wait(lambda: _failed_over(run, core, victim, served, n_routes, n_fail),
                    10.0, f"{how} failover of {victim}")
    # Count only the routes of this failure's failovers (service, epoch): a rebalance
    # left over from the previous round must not pass for a failover.
    records = [f for f in list(core.failovers)[n_fail:] if f.from_site == victim]
    epochs = {(f.service, f.epoch) for f in records}
    first_route: dict[str, float] = {}
    for t, r in run.routes[n_routes:]:
        if (r.service, r.epoch) in epochs:
            first_route.setdefault(r.service, t)
    out["serving"] += [t - t0 for t in first_route.values()]
    if records:
        out["detect"].append(min(f.detected_ms for f in records) - t0)
    out["hub"] += [f.serving_ms for f in records]
    out["agent"] += [f.agent_ack_ms for f in records if f.agent_ack_ms is not None]
    out["transit"] += [f.ack_transit_ms for f in records if f.ack_transit_ms is not None]
    # bring the site back: restart after a crash, resume after a freeze
    if how == "crash":
        proc.wait(5)
        run.procs[victim] = _spawn(run, victim)
    else:
        proc.send_signal(signal.SIGCONT)
    return len(served) - len(first_route)


def _failed_over(run: _Run, core: Any, victim: str, served: list[str], n_routes: int,
                 n_fail: int) -> bool:
    """Every service the victim served has a failover record and its route arrived."""
    recs = {(f.service, f.epoch) for f in list(core.failovers)[n_fail:] if f.from_site == victim}
    if {s for s, _ in recs} < set(served):
        return False
    seen = {(r.service, r.epoch) for _, r in run.routes[n_routes:]}
    return recs <= seen


def _agent_usage(run: _Run, window_s: float = 5.0) -> tuple[float, float, float]:
    """(median RSS MB, max RSS MB, mean CPU fraction of one core) over idle agents."""
    import psutil

    procs = [psutil.Process(p.pid) for p in run.procs.values() if p.poll() is None]
    t0 = [p.cpu_times() for p in procs]
    w0 = time.monotonic()
    time.sleep(window_s)  # noqa: TID251 - a sync helper, run in a thread
    wall = time.monotonic() - w0
    cpu = [(p.cpu_times().user + p.cpu_times().system - a.user - a.system) / wall
           for p, a in zip(procs, t0, strict=True)]
    rss = sorted(p.memory_info().rss / 1_048_576 for p in procs)
    return rss[len(rss) // 2], rss[-1], sum(cpu) / len(cpu)


async def run_bench(cfg: BenchConfig, *, log: Callable[[str], None] | None = None
                    ) -> dict[str, Any]:
    from broker.federation.edge_hub import EdgeHub, EdgeService
    from broker.placement.standby import EdgeServiceNeed
    from broker.settings import EdgeSettings, MqttSettings
    from edge_agent.protocol import ServiceSpec

    say = log or (lambda _m: None)
    rng = random.Random(cfg.seed)
    prefix = f"bench-{uuid.uuid4().hex[:10]}/v1"
    tmp = tempfile.TemporaryDirectory(prefix="skyfed-bench-failover-")
    run = _Run(cfg, prefix, Path(tmp.name))
    sites = [f"site-{i:03d}" for i in range(cfg.agents)]
    names = [f"svc-{i:04d}" for i in range(cfg.services)]
    settings = EdgeSettings(heartbeat_ms=cfg.heartbeat_ms, suspect_after_ms=cfg.suspect_after_ms,
                            down_after_ms=cfg.down_after_ms, rtt_target_ms=50.0)
    hub = EdgeHub(settings=settings, mqtt=MqttSettings(url=cfg.broker), prefix=prefix,
                  tick_ms=10.0)
    for s in sites:
        hub.add_site(Site(s, CENTER[0] + rng.uniform(-0.3, 0.3),
                          CENTER[1] + rng.uniform(-0.3, 0.3),
                          capacity=Resources(64, 256)))
    samples: dict[str, dict[str, list[float]]] = {
        k: {"detect": [], "serving": [], "hub": [], "agent": [], "transit": []}
        for k in ("crash", "partition")}
    unserved = {"crash": 0, "partition": 0}
    stop = asyncio.Event()
    ready = asyncio.Event()
    t_start = time.monotonic()
    try:
        async with asyncio.TaskGroup() as tg:
            hub_task = tg.create_task(hub.run(stop))
            watch_task = tg.create_task(_watch_routes(run, ready))
            try:
                await asyncio.wait_for(hub.connected.wait(), 10)
                await asyncio.wait_for(ready.wait(), 10)
                say(f"starting {cfg.agents} agents ...")
                for i, s in enumerate(sites):
                    run.procs[s] = _spawn(run, s)
                    if i % 5 == 4:
                        await asyncio.sleep(0.3)  # don't stampede two cores
                await _wait(lambda: all(hub.core.health(s) is SiteHealth.HEALTHY
                                        for s in sites), cfg.settle_timeout_s, "all agents up")
                say(f"agents up in {time.monotonic() - t_start:.1f} s; placing services ...")
                for i, n in enumerate(names):  # in waves: placement is not what we measure
                    need = EdgeServiceNeed(n, CENTER[0] + rng.uniform(-0.3, 0.3),
                                           CENTER[1] + rng.uniform(-0.3, 0.3),
                                           rtt_target_ms=50.0, resources=Resources(0.5, 1))
                    await hub.add_service(EdgeService(need, ServiceSpec(name=n,
                                                                        endpoint=f"{n}:80")))
                    if i % 50 == 49:
                        await _wait(lambda: _settled(hub), cfg.settle_timeout_s,
                                    "services placed", detail=lambda: _unsettled(hub))
                await _wait(lambda: _settled(hub), cfg.settle_timeout_s,
                            "services placed", detail=lambda: _unsettled(hub))
                rss_med, rss_max, cpu = await asyncio.to_thread(_agent_usage, run)
                say(f"placed; agent RSS median {rss_med:.1f} MB, CPU {cpu * 100:.2f} %")
                rounds = ["crash"] * cfg.crashes + ["partition"] * cfg.partitions
                for i, how in enumerate(rounds):
                    primaries = sorted({s.primary for s in hub.core.services.values()})
                    victim = rng.choice(primaries)
                    unserved[how] += await _round(run, hub, victim, how, samples[how])
                    say(f"round {i + 1}/{len(rounds)} {how} {victim}: "
                        f"{len(samples[how]['serving'])} samples so far")
                    await _wait(partial(_is_healthy, hub, victim), cfg.settle_timeout_s,
                                f"{victim} back")
                    await _wait(lambda: _settled(hub), cfg.settle_timeout_s, "settled",
                                detail=lambda: _unsettled(hub))
            finally:
                stop.set()
                watch_task.cancel()
                _ = hub_task
    finally:
        for p in run.procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
                p.terminate()
        deadline = time.monotonic() + 10.0
        for p in run.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        await _cleanup_retained(run, sites, names)
        tmp.cleanup()

    def summary(kind: str) -> dict[str, Any]:
        d, s = samples[kind]["detect"], samples[kind]["serving"]
        h, a = samples[kind]["hub"], samples[kind]["agent"]
        return {"detect_ms_p50": _percentile(d, 50), "detect_ms_p99": _percentile(d, 99),
                "serving_ms_p50": _percentile(s, 50), "serving_ms_p99": _percentile(s, 99),
                "rounds": len(d), "services_failed_over": len(s), "unserved": unserved[kind],
                # where the time goes: hub detection -> route published, and promote
                # sent -> the agent switched (wall clocks of two processes, same host)
                "hub_detect_to_route_ms_p50": _percentile(h, 50),
                "hub_detect_to_route_ms_p99": _percentile(h, 99),
                "promote_to_agent_switched_ms_p50": _percentile(a, 50),
                "promote_to_agent_switched_ms_p99": _percentile(a, 99),
                "ack_to_hub_ms_p50": _percentile(samples[kind]["transit"], 50),
                "ack_to_hub_ms_p99": _percentile(samples[kind]["transit"], 99)}

    return {
        "crash": summary("crash"), "partition": summary("partition"),
        "agent_rss_mb": round(rss_med, 2), "agent_rss_mb_max": round(rss_max, 2),
        "agent_cpu_frac": round(cpu, 5), "agents": cfg.agents, "services": cfg.services,
        "watcher_reconnects": run.watcher_reconnects,
        "heartbeat_ms": cfg.heartbeat_ms, "suspect_after_ms": cfg.suspect_after_ms,
        "down_after_ms": cfg.down_after_ms, "broker": cfg.broker,
        "goals": {"crash_serving_ms_p99": 50, "partition_serving_ms_p99": 1000,
                  "agent_rss_mb": 40},
    }


def _print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"edge failover: {result['agents']} agents, {result['services']} services, "
                    f"heartbeat {result['heartbeat_ms']} ms")
    for col in ("case", "detect p50 ms", "detect p99 ms", "serving p50 ms", "serving p99 ms",
                "rounds", "failed over", "unserved"):
        t.add_column(col, justify="right")
    for case in ("crash", "partition"):
        r = result[case]
        t.add_row(case, *(str(r[k]) for k in ("detect_ms_p50", "detect_ms_p99",
                                              "serving_ms_p50", "serving_ms_p99", "rounds",
                                              "services_failed_over", "unserved")))
    Console().print(t)
    Console().print(f"agent RSS median {result['agent_rss_mb']} MB (max "
                    f"{result['agent_rss_mb_max']} MB), agent CPU "
                    f"{result['agent_cpu_frac'] * 100:.2f} % of a core")
