"""The edge hub loop: MQTT in, `HubCore` (edge_core.py) in the middle, MQTT and the store out.

`EdgeHub` (`name`, `run(stop)`) holds two MQTT sessions (see `run` for why two),
subscribes to every site's status/heartbeat/acks/telemetry and to the retained
routes, feeds the pure `HubCore` what its `Inbox` admits (registered sites,
valid payloads; `edge_inbox.py` counts and rate-limit-logs the rest),
publishes its commands and routes from a queue (so a message loop never waits on
a PUBACK), persists its records from another queue (so a slow store never delays
a failover), and ticks the core every `tick_ms` so missed heartbeats are noticed.
The health, standby and failover rules are documented in `broker/federation/edge_core.py`.

It also implements `providers.edge.EdgeTransport` (`send_command`,
`site_services`) for the dispatcher's plain edge driver, and
`make_edge_hub(rt)` is its factory (broker/app.py's `build_loops`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from broker.domain import Site, SiteHealth
from broker.federation.edge_core import (
    Action,
    EdgeService,
    FailoverRecord,
    HubCore,
    PublishRoute,
    Record,
    Send,
)
from broker.federation.edge_inbox import Inbox
from broker.federation.metrics import FAILOVERS
from broker.placement.snapshot import SITE_POOL
from broker.settings import EdgeSettings, MqttSettings
from edge_agent.protocol import (
    DEFAULT_PREFIX,
    Ack,
    Command,
    Topics,
    cancel_all,
    encode,
)

__all__ = [
    "Action",
    "EdgeHub",
    "EdgeService",
    "FailoverRecord",
    "HubCore",
    "PublishRoute",
    "Record",
    "Send",
    "StoreRecorder",
    "make_edge_hub",
]

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime

log = logging.getLogger(__name__)


class _DropPendingPublishWarnings(logging.Filter):
    """aiomqtt warns when >10 publishes are in flight; a failover burst is meant to be."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pending publish calls" not in record.getMessage()


_mqtt_log = logging.getLogger("skyfed.edge_hub.mqtt")
_mqtt_log.addFilter(_DropPendingPublishWarnings())

Clock = Callable[[], float]  # milliseconds
Recorder = Callable[[str, dict[str, Any]], Awaitable[None]]
SiteLoader = Callable[[], Awaitable[Sequence[Site]]]
ServiceLoader = Callable[[], Awaitable[Sequence[EdgeService]]]


def wall_clock_ms() -> float:
    return time.time() * 1000.0


class EdgeHub:
    """The edge hub loop: MQTT in, `HubCore` in the middle, MQTT and the recorder out."""

    name = "edge_hub"

    def __init__(self, *, settings: EdgeSettings, mqtt: MqttSettings,
                 prefix: str = DEFAULT_PREFIX, clock: Clock = wall_clock_ms,
                 recorder: Recorder | None = None, tick_ms: float = 20.0,
                 core: HubCore | None = None, client_id: str | None = None,
                 site_loader: SiteLoader | None = None, site_refresh_s: float = 30.0,
                 service_loader: ServiceLoader | None = None,
                 service_refresh_s: float = 2.0) -> None:
        self.core = core or HubCore(settings)
        self.core.expected_tick_ms = tick_ms
        self.site_loader = site_loader
        self.site_refresh_s = site_refresh_s
        self.service_loader = service_loader
        self.service_refresh_s = service_refresh_s
        self._waiters: dict[str, asyncio.Future[Ack]] = {}
        self._records: asyncio.Queue[Record] = asyncio.Queue(maxsize=10_000)
        self.mqtt = mqtt
        self.topics = Topics(prefix)
        self.inbox = Inbox(self.core, self.topics)
        self.clock = clock
        self.recorder = recorder
        self.tick_ms = tick_ms
        self.client_id = client_id or f"skyfed-hub-{uuid.uuid4().hex[:8]}"
        self.connected = asyncio.Event()
        self._client: Any = None
        # Outgoing commands and routes: the message loops never wait on a PUBACK (a
        # failover's acks would otherwise queue one broker round trip each).
        # (priority, seq, action): promotions and routes (the failover path) jump
        # the queue of standby starts, prewarms and stops; FIFO within a priority.
        self._out: asyncio.PriorityQueue[tuple[int, int, Send | PublishRoute]] = (
            asyncio.PriorityQueue())
        self._seq = 0
        self.max_in_flight = 10  # aiomqtt warns above 10 pending publishes
        self._queued: set[str] = set()  # command ids queued or in flight

    def add_site(self, site: Site) -> None:
        self.core.add_site(site, self.clock())

    async def add_service(self, svc: EdgeService) -> None:
        await self._execute(self.core.add_service(svc, self.clock()))

    async def run(self, stop: asyncio.Event) -> None:
        """Three MQTT sessions, so no packet on the failover path waits ~40 ms on
        Nagle's algorithm at a broker without `set_tcp_nodelay` (the stock Mosquitto):

        - `ctl` receives status/Wills, acks, telemetry, routes (QoS 1: the hub's
          PUBACK returns the TCP ACK at once, so the broker's next packet goes out);
        - `hb` receives the heartbeat stream (QoS 0, never answered: the hub's
          delayed ACKs would hold back anything queued behind it);
        - `pub` sends commands and routes (its PUBACKs, which the hub does not
          answer, would otherwise stall the next ack delivered to it).
        """
        import aiomqtt

        url = urlsplit(self.mqtt.url)
        delay_s = 0.05
        while not stop.is_set():
            try:
                async with (self._client_for("ctl") as ctl, self._client_for("hb") as hb,
                            self._client_for("pub") as pub):
                    self._client = pub
                    for kind in ("status", "acks", "telemetry"):
                        await ctl.subscribe(self.topics.all_sites(kind), qos=1)
                    await ctl.subscribe(self.topics.all_routes(), qos=1)
                    await hb.subscribe(self.topics.all_sites("heartbeat"), qos=0)
                    self.connected.set()
                    delay_s = 0.05
                    loops = [stop.wait(), self._messages(ctl), self._messages(hb),
                             self._ticks(hb), self._publisher(pub), self._recorder_loop()]
                    if self.site_loader is not None:
                        loops.append(self._site_refresh(self.site_loader))
                    if self.service_loader is not None:
                        loops.append(self._service_refresh(self.service_loader))
                    await _until_first(*loops)
            except aiomqtt.MqttError as exc:
                log.warning("edge hub lost MQTT broker %s:%s: %s", url.hostname, url.port, exc)
            finally:
                self._client = None
                self.connected.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)
            delay_s = min(5.0, delay_s * 2)

    def _client_for(self, role: str) -> Any:
        import aiomqtt

        url = urlsplit(self.mqtt.url)
        password = self.mqtt.password.get_secret_value() if self.mqtt.password else None
        return aiomqtt.Client(
            url.hostname or "127.0.0.1", url.port or 1883, identifier=f"{self.client_id}-{role}",
            username=self.mqtt.username, password=password, keepalive=self.mqtt.keepalive_s,
            tls_params=aiomqtt.TLSParameters() if self.mqtt.tls else None, timeout=5.0,
            logger=_mqtt_log, socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),))

    async def _messages(self, client: Any) -> None:
        """Feed what the inbox admits (registered sites, valid payloads) to the core."""
        async for message in client.messages:
            now = self.clock()
            got = self.inbox.admit(str(message.topic), message.payload, now)
            if got is None:
                continue
            if isinstance(got.message, Ack):
                waiter = self._waiters.pop(got.message.command_id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(got.message)
            actions = self.inbox.feed(got, now)
            if actions:
                await self._execute(actions)

    async def _ticks(self, hb: Any) -> None:
        while True:
            await asyncio.sleep(self.tick_ms / 1000.0)
            actions = self.core.tick(self.clock(), heartbeat_backlog=len(hb.messages))
            if actions:
                await self._execute(actions)

    async def _execute(self, actions: Sequence[Action]) -> None:
        """Queue commands and routes for the publisher (kept across reconnects); record."""
        for a in actions:
            if isinstance(a, Record):
                await self._record(a)
            elif isinstance(a, Send):
                if a.command.command_id in self._queued:
                    continue  # a re-send of a command still waiting to go out
                self._queued.add(a.command.command_id)
                self._enqueue(a)
            else:
                self._enqueue(a)

    def _enqueue(self, a: Send | PublishRoute) -> None:
        urgent = isinstance(a, PublishRoute) or a.command.kind == "promote"
        self._seq += 1
        self._out.put_nowait((0 if urgent else 1, self._seq, a))

    async def _publisher(self, client: Any) -> None:
        """Publish queued actions concurrently, at most `max_in_flight` awaiting a PUBACK.

        Tasks start in queue order and paho queues packets in call order, so the
        commands for one site keep their order on the wire."""
        sem = asyncio.Semaphore(self.max_in_flight)

        async def one(a: Send | PublishRoute) -> None:
            try:
                await self._publish(client, a)
            except BaseException:
                self._enqueue(a)  # retry on the next session
                raise
            finally:
                sem.release()
            if isinstance(a, Send):
                self._queued.discard(a.command.command_id)
                self.core.mark_sent(a.command.command_id, self.clock())

        async with asyncio.TaskGroup() as tg:
            while True:
                _, _, a = await self._out.get()
                await sem.acquire()
                tg.create_task(one(a))

    async def _publish(self, client: Any, a: Send | PublishRoute) -> None:
        if isinstance(a, Send):
            await client.publish(self.topics.commands(a.site), encode(a.command), qos=1)
        else:
            await client.publish(self.topics.route(a.route.service), encode(a.route),
                                 qos=1, retain=True)

    async def _record(self, rec: Record) -> None:
        """Log now; persist in the background (a slow store must not delay a failover)."""
        if rec.kind not in ("edge_event", "edge_site_rtt"):
            log.info("%s %s", rec.kind, rec.data)
        if rec.kind == "edge_failover":
            FAILOVERS.labels("edge_hub").inc()
        if self.recorder is not None:
            try:
                self._records.put_nowait(rec)
            except asyncio.QueueFull:
                log.warning("edge hub recorder backlog full: dropping %s", rec.kind)

    async def _recorder_loop(self) -> None:
        while True:
            rec = await self._records.get()
            if self.recorder is None:
                continue
            try:
                await self.recorder(rec.kind, rec.data)
            except asyncio.CancelledError:
                raise
            except Exception:  # the hub must keep failing over when the store is down
                log.exception("edge hub could not record %s", rec.kind)

    async def _site_refresh(self, loader: SiteLoader) -> None:
        """Pick up sites registered in the store (new ones, moved coordinates)."""
        while True:
            try:
                for site in await loader():
                    self.core.add_site(site, self.clock())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("edge hub could not load sites")
            await asyncio.sleep(self.site_refresh_s)

    async def _service_refresh(self, loader: ServiceLoader) -> None:
        """Adopt latency-critical services the placement loop put on edge sites: the hub
        then keeps a warm standby for each and fails it over. Known ones are left alone."""
        while True:
            try:
                for svc in await loader():
                    if svc.spec.name not in self.core.services:
                        await self.add_service(svc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("edge hub could not load edge services")
            await asyncio.sleep(self.service_refresh_s)

    # EdgeTransport (providers/edge.py): the dispatcher's plain path to a site
    async def send_command(self, *, site: str, kind: str,
                           service: Mapping[str, Any] | None = None, service_name: str = "",
                           standby: bool = False, timeout_s: float = 5.0,
                           data: Sequence[Mapping[str, Any]] = (),
                           images: Sequence[str] = ()) -> Mapping[str, Any]:
        cmd = Command.model_validate({
            "command_id": uuid.uuid4().hex, "site": site, "kind": kind, "service": service,
            "service_name": service_name or (service or {}).get("name", ""),
            "standby": standby, "ts_ms": self.clock(), "data": list(data),
            "images": list(images)})
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._waiters[cmd.command_id] = fut
        self._enqueue(Send(site, cmd))
        try:
            ack = await asyncio.wait_for(fut, timeout_s)
        finally:
            self._waiters.pop(cmd.command_id, None)
        return ack.model_dump()

    def site_services(self, *, site: str) -> Mapping[str, str] | None:
        st = self.core.sites.get(site)
        return None if st is None else st.services


async def _until_first(*aws: Awaitable[Any]) -> None:
    """Run `aws` as tasks owned here until one ends; cancel the rest; re-raise its error."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_all(tasks)
    for t in done:
        exc = t.exception()
        if exc is not None:
            raise exc


class StoreRecorder:
    """Persists hub records through the store API.

    - `edge_site_health`: the site's health on `sites` (the snapshot merge turns a down site
      into an unhealthy edge cluster: the hub is the one decider for edge failures);
    - `edge_site_rtt`: the agent-measured RTTs under `sites.attrs.rtt` (target -> ms and
      when), and the time the site was last heard; no event (it comes every few seconds);
    - `edge_failover` / `edge_rebalance`: the service's workload gets a new active
      placement naming the site it runs on now (`placements.move`), so the API, CLI and
      dashboard show where it runs;
    - every record but the RTTs also as an `edge.*` event (`edge_failover` ->
      `edge.failover`).
    """

    def __init__(self, store: Any) -> None:
        self._store = store

    async def __call__(self, kind: str, data: dict[str, Any]) -> None:
        from broker.errors import NotFoundError

        subject = str(data.get("service") or data.get("site") or "")
        async with self._store.unit() as uow:
            if kind == "edge_site_rtt":
                await self._rtt(uow, data)
                return
            if kind == "edge_site_health":
                # a site that runs an agent but was never registered has no row
                with contextlib.suppress(NotFoundError):
                    await uow.sites.set_health(data["site"], SiteHealth(data["health"]),
                                               reason=str(data.get("cause", "")))
            elif kind in ("edge_failover", "edge_rebalance") and data.get("to_site"):
                await self._move(uow, data, by="edge hub " + kind.removeprefix("edge_"))
            await uow.events.append("edge." + kind.removeprefix("edge_"), subject, data,
                                    tenant=await self._owner(uow, data))

    @staticmethod
    async def _owner(uow: Any, data: dict[str, Any]) -> str | None:
        """Whose event it is: the service's workload's tenant; else the owner of a private
        site; None (a federation event, every tenant sees it) for a federation-wide site."""
        from broker.errors import NotFoundError

        with contextlib.suppress(NotFoundError):
            if data.get("service"):
                return str((await uow.workloads.get(str(data["service"]))).workload.tenant)
            if data.get("site"):
                rec = await uow.sites.get(str(data["site"]))
                return None if rec.shared else str(rec.tenant)
        return None

    @staticmethod
    async def _rtt(uow: Any, data: dict[str, Any]) -> None:
        from broker.errors import NotFoundError

        at_s = float(data["at_ms"]) / 1000.0
        table = {str(k): {"ms": float(v), "at_s": at_s}
                 for k, v in dict(data.get("rtt_ms") or {}).items()}
        with contextlib.suppress(NotFoundError):
            await uow.sites.set_attrs(str(data["site"]), {"rtt": table})
            await uow.sites.set_seen(str(data["site"]), at_s)

    @staticmethod
    async def _move(uow: Any, data: dict[str, Any], *, by: str) -> None:
        """The service is the workload of the same id (edge_services.py): record its move."""
        from broker.errors import NotFoundError

        to_site = str(data["to_site"])
        pool = SITE_POOL
        with contextlib.suppress(NotFoundError):  # an older "site + shadow cluster" form
            rec = await uow.clusters.get(to_site)
            pool = rec.cluster.pools[0].name if rec.cluster.pools else SITE_POOL
        await uow.placements.move(str(data["service"]), from_cluster=str(
            data.get("from_site") or ""), to_cluster=to_site, to_pool=pool, by=by,
            cause=str(data.get("cause", "")))


def make_edge_hub(rt: Runtime) -> EdgeHub | None:
    """The hub on the configured MQTT broker, persisting to the store.

    `build_loops` keeps it as `rt.edge_hub`, where the edge sites' drivers find it as
    their `EdgeTransport` (`providers.edge.EdgeSiteDriver`). With `mqtt.embedded` the
    composition root must run `broker.federation.mqtt_embedded.EmbeddedBroker` first.
    """
    settings = rt.settings
    store = rt.loop_store()
    clock = rt.clock

    async def load_sites() -> Sequence[Site]:
        async with store.unit() as uow:
            return list(await uow.sites.list())

    from broker.federation.edge_services import edge_services_loader

    hub = EdgeHub(settings=settings.edge, mqtt=settings.mqtt, recorder=StoreRecorder(store),
                  clock=lambda: clock.now() * 1000.0, site_loader=load_sites,
                  service_loader=edge_services_loader(rt))
    return hub
