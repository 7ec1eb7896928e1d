"""The `skyfed-edge` agent: one MQTT session to the broker, per edge site.

Long-lived tasks, all owned by `EdgeAgent.run`'s TaskGroup:

- the connection loop: connects with a retained Last Will `offline`, publishes
  `online` (retained), subscribes to its commands, then runs the heartbeat,
  message and outbox loops until the session breaks; reconnects with
  exponential backoff and jitter (tenacity), interruptible by `stop`;
- the supervisor (services.py): keeps services running whether or not the
  broker is reachable;
- load and RTT probe loops (probe.py), on their own slower cadences;
- prewarm jobs (prewarm.py), which outlive sessions.

Everything that happens is appended to the journal (journal.py) first; the
outbox loop publishes unsent events and marks them sent after the PUBACK, so a
reconnect replays exactly what the broker has not seen.

Imports are kept light on purpose (heartbeat path: asyncio, aiomqtt, pydantic,
sqlite3): httpx is imported only when a prewarm arrives, rich/typer never.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from edge_agent.config import AgentConfig
from edge_agent.journal import Journal
from edge_agent.probe import LoadSampler, probe_all
from edge_agent.protocol import (
    COUNT_MAX,
    Ack,
    Command,
    DataItem,
    Echo,
    Heartbeat,
    ServiceSpec,
    Status,
    Telemetry,
    Topics,
    cancel_all,
    decode,
    encode,
    now_ms,
)
from edge_agent.services import Supervisor

log = logging.getLogger("skyfed.edge")
AGENT_VERSION = "0.1.0"

# Small MQTT packets must not wait for Nagle's algorithm: with it, a QoS 1
# command/ack exchange stalls ~40 ms on the peer's delayed ACK (measured here).
# The broker side needs the same (`set_tcp_nodelay true`, deploy/mosquitto/).
NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


__all__ = ["AgentConfig", "EdgeAgent"]


class _SessionLost(Exception):
    """The broker connection broke after it had been up (resets the backoff)."""


@dataclass
class _Stats:
    sessions: int = 0
    heartbeats: int = 0
    commands: int = 0
    duplicates: int = 0
    replayed: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class EdgeAgent:
    def __init__(self, config: AgentConfig) -> None:
        Topics.check_name(config.site)
        self.config = config
        self.site = config.site
        self.topics = Topics(config.prefix)
        self.journal = Journal(config.data_dir / f"{config.site}.journal.sqlite")
        self.supervisor = Supervisor(on_event=self._event)
        self.load = LoadSampler()
        self.stats = _Stats()
        self.connected = asyncio.Event()
        self._started_ms = now_ms()
        self._session_started_ms = 0.0
        self._seq = 0
        self._broker_rtt_ms: float | None = None
        self._peer_rtt_ms: dict[str, float] = {}
        self._echo_sent: dict[int, float] = {}
        self._epochs: dict[str, int] = {}
        self._outbox_wake = asyncio.Event()
        self._progress: dict[str, tuple[int, int | None]] = {}
        self._jobs: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._cache: Any = None

    # lifecycle
    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; then say `offline` (retained) and disconnect."""
        self._restore()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self.supervisor.run(stop), name=f"{self.site}-supervisor")
                tg.create_task(self._guard(self._load_loop(stop), "load"))
                tg.create_task(self._guard(self._probe_loop(stop), "probe"))
                tg.create_task(self._guard(self._connection_loop(stop), "connection"))
                await stop.wait()
                for job in list(self._jobs):
                    job.cancel()
        finally:
            self._tg = None
            if self._cache is not None:
                await self._cache.aclose()
            self.journal.close()

    async def _guard(self, coro: Awaitable[None], what: str) -> None:
        """Top of a long-lived task: log and keep the agent up on a bug in one loop."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("agent %s loop crashed", what)

    def _restore(self) -> None:
        """Bring back the services the journal says we run (restart without broker)."""
        for key, value in self.journal.state("svc/").items():
            spec = ServiceSpec.model_validate(value["spec"])
            self._epochs[spec.name] = int(value.get("epoch", 0))
            self.supervisor.start(spec, standby=value.get("role") != "serving")
            log.info("restored service %s from journal (%s)", key, value.get("role"))

    # events
    def _event(self, kind: str, data: dict[str, Any]) -> None:
        self.journal.append(kind, now_ms(), data)
        self._outbox_wake.set()

    # connection
    async def _connection_loop(self, stop: asyncio.Event) -> None:
        import aiomqtt
        import tenacity

        async def sleep_unless_stopped(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

        was_lost = False
        while not stop.is_set():
            retrying = tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception_type(aiomqtt.MqttError),
                wait=tenacity.wait_exponential(multiplier=0.05, max=self.config.reconnect_max_s)
                + tenacity.wait_random(0, 0.1),
                sleep=sleep_unless_stopped,
                before_sleep=lambda rs: log.warning(
                    "broker %s:%s unreachable (attempt %d): %s", self.config.host,
                    self.config.port, rs.attempt_number,
                    rs.outcome.exception() if rs.outcome else None),
            )
            try:
                await retrying(self._session_once, stop)
                return
            except _SessionLost as exc:
                if not was_lost:
                    self._event("broker_lost", {"error": str(exc)})
                was_lost = True

    async def _session_once(self, stop: asyncio.Event) -> None:
        import aiomqtt

        if stop.is_set():
            return
        c = self.config
        will = aiomqtt.Will(self.topics.status(self.site),
                            encode(Status(site=self.site, state="offline",
                                          started_ms=self._started_ms)),
                            qos=1, retain=True)
        tls_params = aiomqtt.TLSParameters(ca_certs=c.tls_ca) if c.tls else None
        client = aiomqtt.Client(
            c.host, c.port, identifier=f"skyfed-edge-{self.site}", username=c.username,
            password=c.password, will=will, keepalive=c.keepalive_s, clean_session=True,
            tls_params=tls_params, timeout=c.connect_timeout_s, socket_options=NODELAY)
        async with client:
            try:
                await self._session(client, stop)
            except aiomqtt.MqttError as exc:
                self.connected.clear()
                raise _SessionLost(str(exc)) from exc

    async def _session(self, client: Any, stop: asyncio.Event) -> None:
        self.stats.sessions += 1
        self._session_started_ms = now_ms()
        await client.subscribe(self.topics.commands(self.site), qos=1)
        await client.subscribe(self.topics.echo(self.site), qos=1)
        await client.publish(self.topics.status(self.site),
                             encode(Status(site=self.site, state="online",
                                           started_ms=self._started_ms,
                                           session=self.stats.sessions)),
                             qos=1, retain=True)
        self.connected.set()
        self._outbox_wake.set()  # replay whatever the journal holds unsent
        log.info("site %s connected to %s:%s", self.site, self.config.host, self.config.port)
        done = await _first_done(stop.wait(), self._heartbeat_loop(client),
                                 self._message_loop(client), self._outbox_loop(client))
        if done == 0:  # clean stop: retained offline (a clean DISCONNECT sends no Will)
            self.connected.clear()
            await client.publish(self.topics.status(self.site),
                                 encode(Status(site=self.site, state="offline",
                                               started_ms=self._started_ms)),
                                 qos=1, retain=True, timeout=2.0)

    async def _heartbeat_loop(self, client: Any) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self.config.heartbeat_ms / 1000.0
        topic = self.topics.heartbeat(self.site)
        echo_every = max(1, round(self.config.echo_every_s / interval_s))
        next_t = loop.time()
        while True:
            self._seq += 1
            hb = Heartbeat(site=self.site, seq=self._seq, cpu_frac=self.load.cpu_frac,
                           mem_frac=self.load.mem_frac, gpu_frac=self.load.gpu_frac,
                           rss_mb=round(self.load.rss_mb, 2), broker_rtt_ms=self._broker_rtt_ms,
                           peer_rtt_ms=self._peer_rtt_ms, services=self.supervisor.states())
            await client.publish(topic, encode(hb), qos=0)
            self.stats.heartbeats += 1
            if self._seq % echo_every == 0:
                await self._send_echo(client)
                await self._send_progress(client)
            next_t += interval_s
            delay = next_t - loop.time()
            if delay < -interval_s:  # fell far behind (e.g. SIGSTOP): don't burst
                next_t = loop.time()
                delay = 0.0
            await asyncio.sleep(max(0.0, delay))

    async def _send_echo(self, client: Any) -> None:
        nonce = self._seq
        self._echo_sent = {n: t for n, t in self._echo_sent.items() if nonce - n < 100}
        self._echo_sent[nonce] = time.perf_counter()
        await client.publish(self.topics.echo(self.site),
                             encode(Echo(site=self.site, nonce=nonce, sent_ms=now_ms())), qos=1)

    async def _send_progress(self, client: Any) -> None:
        progress, self._progress = self._progress, {}
        for name, (done, total) in progress.items():
            msg = Telemetry(site=self.site, kind="prewarm_progress",
                            data={"item": name, "bytes": done, "total_bytes": total})
            await client.publish(self.topics.telemetry(self.site), encode(msg), qos=0)

    async def _message_loop(self, client: Any) -> None:
        topic = self.topics.acks(self.site)
        async for message in client.messages:
            for body in self.receive(str(message.topic), message.payload):
                await client.publish(topic, body, qos=1)

    def receive(self, topic: str, payload: object) -> list[bytes]:
        """One inbound MQTT message through the agent: the acks to publish (encoded).

        Synchronous and without network I/O (the supervisor only declares services
        here; its loop starts them), so any payload can be fed in by a test: topic
        filter, decode (bounded models, `edge_agent.protocol`), site check, then
        `_handle`. Anything malformed is dropped and logged by `decode`.
        """
        parsed = self.topics.parse(topic)
        if parsed is None or parsed[1] != self.site:
            return []  # amqtt may deliver foreign retained messages: filter by topic
        if not isinstance(payload, bytes | bytearray | str):
            return []
        if parsed[0] == "commands":
            cmd = decode(Command, payload)
            return [] if cmd is None else self._handle(cmd)
        if parsed[0] == "echo":
            echo = decode(Echo, payload)
            t0 = None if echo is None else self._echo_sent.pop(echo.nonce, None)
            if t0 is not None:
                self._broker_rtt_ms = round((time.perf_counter() - t0) * 1000.0, 3)
        return []

    async def _outbox_loop(self, client: Any) -> None:
        topic = self.topics.telemetry(self.site)
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake.clear()
            for event_id, ts_ms, kind, data in self.journal.unsent():
                replayed = ts_ms < self._session_started_ms
                msg = Telemetry(site=self.site, kind=kind, ts_ms=ts_ms, event_id=event_id,
                                replayed=replayed, data=_flat(data))
                await client.publish(topic, encode(msg), qos=1)
                self.journal.mark_sent(event_id)
                self.stats.replayed += int(replayed)
            self.journal.prune()

    # commands
    def _handle(self, cmd: Command) -> list[bytes]:
        """Act on a command once; a repeated id gets the first answer again (duplicate).

        The ack is journalled before it is published: a crash in between makes the
        hub's re-send get the journalled ack, never a second execution."""
        self.stats.commands += 1
        prior = self.journal.seen(cmd.command_id)
        if prior is not None:
            self.stats.duplicates += 1
            old = decode(Ack, prior)
            if old is None:
                return []
            return [encode(old.model_copy(update={"duplicate": True, "ts_ms": now_ms()}))]
        if cmd.site != self.site:
            ack = Ack(command_id=cmd.command_id, site=self.site, ok=False,
                      message=f"command for site {cmd.site!r} delivered to {self.site!r}")
        else:
            ack = self._execute(cmd)
        body = encode(ack)
        self.journal.remember(cmd.command_id, ack.ts_ms, body.decode())
        return [body]

    def _execute(self, cmd: Command) -> Ack:
        def ack(ok: bool, message: str = "", done_ms: float | None = None) -> Ack:
            return Ack(command_id=cmd.command_id, site=self.site, ok=ok, message=message,
                       done_ms=done_ms)

        name = cmd.service.name if cmd.service is not None else cmd.service_name
        if cmd.kind == "start" and cmd.epoch < self._epochs.get(name, 0):
            return Ack(command_id=cmd.command_id, site=self.site, ok=False,
                       message=f"stale epoch {cmd.epoch} < {self._epochs[name]} for {name!r}",
                       epoch=self._epochs[name])
        if cmd.kind == "start":
            if cmd.service is None:
                return ack(False, "start without a service spec")
            self.supervisor.start(cmd.service, standby=cmd.standby)
            self._remember_service(cmd.service, "standby" if cmd.standby else "serving", cmd.epoch)
            return ack(True, "started", now_ms())
        if cmd.kind in ("promote", "demote"):
            return self._switch(cmd)
        if cmd.kind == "stop":
            self.supervisor.stop_service(name)
            self.journal.drop_state(f"svc/{name}")
            return ack(True, "stopped", now_ms())
        if cmd.kind == "prewarm":
            self._start_prewarm(cmd)
            return ack(True, "prewarm started")
        return ack(True, "pong", now_ms())  # ping

    def _switch(self, cmd: Command) -> Ack:
        """Promote/demote one or many services: a role flip, then the ack; journal after."""
        wanted = cmd.services or {cmd.service_name: cmd.epoch}
        role = "serving" if cmd.kind == "promote" else "standby"
        failed: list[str] = []
        switched: list[tuple[str, int]] = []
        for name, epoch in wanted.items():
            if epoch < self._epochs.get(name, 0):
                failed.append(name)
                continue
            ok = (self.supervisor.promote(name) if cmd.kind == "promote"
                  else self.supervisor.demote(name))
            if ok:
                switched.append((name, epoch))
            else:
                failed.append(name)
        done = now_ms()
        for name, epoch in switched:
            self._update_role(name, role, epoch)
            self._event(f"service_{cmd.kind}d", {"service": name, "epoch": epoch})
        return Ack(command_id=cmd.command_id, site=self.site, ok=not failed, done_ms=done,
                   message=role if not failed else f"not switched (unknown or stale): {failed}",
                   failed=tuple(failed),
                   epoch=max((self._epochs.get(n, 0) for n in failed), default=0))

    def _remember_service(self, spec: ServiceSpec, role: str, epoch: int) -> None:
        self._epochs[spec.name] = max(epoch, self._epochs.get(spec.name, 0))
        self.journal.put_state(f"svc/{spec.name}", {"spec": spec.model_dump(mode="json"),
                                                    "role": role, "epoch": epoch})

    def _update_role(self, name: str, role: str, epoch: int) -> None:
        self._epochs[name] = max(epoch, self._epochs.get(name, 0))
        key = f"svc/{name}"
        value = self.journal.state(key).get(key)
        if value is not None:
            value.update(role=role, epoch=epoch)
            self.journal.put_state(key, value)

    # prewarm
    def _start_prewarm(self, cmd: Command) -> None:
        if self._tg is None:
            return
        task = self._tg.create_task(self._prewarm(cmd), name=f"prewarm-{cmd.command_id}")
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _prewarm(self, cmd: Command) -> None:
        from edge_agent.prewarm import DataCache, PrewarmError, pull_image

        c = self.config
        if self._cache is None:
            self._cache = DataCache(c.data_dir / "cache", max_bytes=c.cache_max_bytes,
                                    max_concurrent=c.max_concurrent_downloads)

        def progress(name: str, done: int, total: int | None) -> None:
            self._progress[name] = (done, total)

        async def one_item(item: DataItem) -> None:
            t0 = time.perf_counter()
            try:
                path = await self._cache.fetch(item, progress=progress)
            except (PrewarmError, OSError) as exc:
                self._event("prewarm_failed", {"item": item.url, "error": str(exc),
                                               "command_id": cmd.command_id})
                return
            self._event("prewarm_done", {"item": path.name, "sha256": item.sha256,
                                         "bytes": path.stat().st_size,
                                         "seconds": round(time.perf_counter() - t0, 3),
                                         "command_id": cmd.command_id})

        async def one_image(image: str) -> None:
            if not c.pull_command:  # no container runtime here (processes only)
                self._event("prewarm_skipped", {"image": image, "command_id": cmd.command_id,
                                                "reason": "no --pull-command configured"})
                return
            try:
                await pull_image(image, command=c.pull_command)
            except PrewarmError as exc:
                self._event("prewarm_failed", {"image": image, "error": str(exc),
                                               "command_id": cmd.command_id})
                return
            self._event("prewarm_done", {"image": image, "command_id": cmd.command_id})

        await asyncio.gather(*(one_item(i) for i in cmd.data), *(one_image(i) for i in cmd.images))

    # probes
    async def _load_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.load.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.load_every_s)

    async def _probe_loop(self, stop: asyncio.Event) -> None:
        targets = [*self.config.peers, *self.config.probes]
        if not targets:
            return
        while not stop.is_set():
            self._peer_rtt_ms = await probe_all(targets)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.probe_every_s)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_KEY_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _flat(data: dict[str, Any]) -> dict[str, str | int | float | bool | None]:
    """Journal data as `Telemetry` accepts it (64 keys; strings of 4,096 characters
    without control characters; numbers finite within 2^53). A value the wire model
    refused would stall the outbox on that event forever, so it is coerced here."""
    out: dict[str, str | int | float | bool | None] = {}
    for k, v in list(data.items())[:64]:
        key = _KEY_CONTROL.sub("?", str(k))[:64] or "_"
        if v is None or isinstance(v, bool) or (isinstance(v, int | float) and abs(v) <= COUNT_MAX):
            out[key] = v
        else:
            out[key] = _CONTROL.sub("?", str(v))[:4096]
    return out


async def _first_done(*aws: Awaitable[Any]) -> int:
    """Run `aws` as tasks owned here; when the first finishes, cancel the rest.

    Returns the index of the first one; re-raises its exception if it failed.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_all(tasks)
    first = next(i for i, t in enumerate(tasks) if t in done)
    exc = tasks[first].exception()
    if exc is not None:
        raise exc
    return first
