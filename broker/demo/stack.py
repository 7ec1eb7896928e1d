"""The whole system in one process tree, on embedded defaults, for `skyfed demo`.

Built from the same composition root as `skyfed serve` (`broker.app`): the
store (SQLite in a temp data dir, migrated), the admin token, the start-up steps
and every loop of `broker.app.build_loops`, the API under uvicorn; plus
what only the demo adds: simulated member clusters (`providers.simulated`) for
the demo federation, the in-process MQTT broker when no loop provides it, an
edge hub when no loop provides one, and three real `skyfed-edge` processes.

Each piece that is not in the tree yet is skipped with a note (`notes`) rather
than crashing the demo: the demo is built while the broker grows.
Every task started here is owned by `DemoStack` and cancelled and awaited on
exit; agent processes are always reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from broker.demo.agents import AgentFleet
from broker.demo.federation import DemoFederation
from broker.domain import Interconnect, Resources, Site
from broker.errors import BrokerError
from broker.settings import Settings
from providers.simulated import SimPool, SimulatedClusterDriver

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.store import Store

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def port_open(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 0.5)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the demo owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


BOOT_S = 1.0  # a demo cloud node boots this long before it joins (real ones: minutes)
PREWARM_S = 1.0


def sim_drivers(fed: DemoFederation) -> dict[str, SimulatedClusterDriver]:
    """One simulated cluster per demo cluster and edge site. Cloud pools start at their
    registered size and grow when the actuator orders nodes (they boot for BOOT_S)."""
    drivers: dict[str, SimulatedClusterDriver] = {}
    for c in fed.clusters:
        pools = [SimPool(name=p.name, nodes=p.nodes, cpu_per_node=p.node.cpu,
                         memory_gib_per_node=p.node.memory_gib, gpu_per_node=p.node.gpu,
                         gpu_model=p.gpu_model, interconnect=p.interconnect,
                         instance_type=p.instance_type) for p in c.pools]
        drivers[c.name] = SimulatedClusterDriver(c.name, pools, startup_s=0.5, boot_s=BOOT_S,
                                                 prewarm_s=PREWARM_S)
    for s in fed.sites:
        pool = SimPool(name="site", nodes=1, cpu_per_node=s.cpu, memory_gib_per_node=s.memory_gib,
                       gpu_per_node=s.gpu, gpu_model=s.gpu_model,
                       interconnect=Interconnect.PCIE if s.gpu else Interconnect.NONE,
                       instance_type="edge")
        drivers[s.name] = SimulatedClusterDriver(s.name, [pool], startup_s=0.5)
    return drivers


def domain_sites(fed: DemoFederation) -> list[Site]:
    return [Site(name=s.name, lat=s.lat, lon=s.lon,
                 capacity=Resources(s.cpu, s.memory_gib, s.gpu),
                 price_usd_per_hour=s.price_usd_per_hour, gpu_model=s.gpu_model,
                 labels={"skyfed.io/edge": "true"}) for s in fed.sites]


class DemoStack:
    """Start with `async with DemoStack(...) as stack:`; everything stops on exit."""

    def __init__(self, settings: Settings, fed: DemoFederation, *, agents: bool = True) -> None:
        self.settings = settings
        self.fed = fed
        self.want_agents = agents
        self.notes: list[str] = []  # what was skipped, one line each
        self.token = ""
        self.url = ""
        self.runtime: Runtime | None = None
        self.loops: list[Any] = []
        self.hub: Any = None
        self.mqtt_ok = False
        self.fleet: AgentFleet | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._server: _Server | None = None
        self._mqtt: Any = None  # the embedded MQTT broker, when the demo started it
        self._loops_started = False
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> Store:
        """The broker's store (only once the stack has started)."""
        if self.runtime is None:
            raise BrokerError("the demo stack has not started")
        return self.runtime.store

    @property
    def loop_names(self) -> list[str]:
        return [str(getattr(lp, "name", type(lp).__name__)) for lp in self.loops]

    @property
    def mqtt_host_port(self) -> tuple[str, int]:
        from urllib.parse import urlsplit

        u = urlsplit(self.settings.mqtt.url)
        return u.hostname or "127.0.0.1", u.port or 1883

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def __aenter__(self) -> DemoStack:
        try:
            await self._start()
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shutdown()

    async def _start(self) -> None:
        from broker.app import (
            build_loops,
            build_runtime,
            create_app,
            ensure_admin_token,
            start_up,
        )
        from broker.store import migrate

        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        rt = self.runtime = build_runtime(s)
        await migrate.upgrade(s.store_url)
        await rt.store.check_schema()
        self.token = await ensure_admin_token(rt) or ""
        if not self.token:
            self.token = (s.data_dir / "token").read_text().strip()
        await start_up(rt)
        for name, driver in sim_drivers(self.fed).items():
            rt.drivers.setdefault(name, driver)
        self.loops = build_loops(rt)
        await self._start_mqtt()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((s.api.host, s.api.port))
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(create_app(rt), log_level="warning",
                                access_log=False, lifespan="off", loop="none")
        self._server = _Server(config)
        self._spawn(self._server.serve(sockets=[sock]), "demo:api")
        deadline = time.monotonic() + 15
        while not self._server.started and time.monotonic() < deadline:
            if self._tasks[-1].done():
                self._tasks[-1].result()  # re-raise the server's start error
            await asyncio.sleep(0.02)
        if self.want_agents and self.mqtt_ok:
            await self._start_agents()

    async def start_loops(self) -> None:
        """Start the broker's loops (placement, dispatch, ...) and the edge hub.

        Separate from start-up so the demo can submit its whole mix first: the
        placement loop then solves it as one batch, the batch the baseline
        comparison re-solves.
        """
        from broker.federation.looping import supervise

        if self._loops_started:
            return
        self._loops_started = True
        for lp in self.loops:
            self._spawn(supervise(lp, self._stop), f"demo:loop:{lp.name}")
        await self._start_hub()

    async def _start_mqtt(self) -> None:
        """An MQTT broker must listen on settings.mqtt.url before the agents start.

        A loop of the broker may already provide the embedded one; otherwise the
        demo starts `broker.federation.mqtt_embedded.EmbeddedBroker` itself.
        """
        host, port = self.mqtt_host_port
        logging.getLogger("amqtt").setLevel(logging.ERROR)
        if any("mqtt" in n for n in self.loop_names) and await port_open(host, port, 5.0):
            self.mqtt_ok = True
            return
        try:
            mod = importlib.import_module("broker.federation.mqtt_embedded")
        except ImportError:
            self.notes.append("in-process MQTT broker (broker/federation/mqtt_embedded.py is "
                              "not in the tree): edge agents and failover skipped")
            return
        broker_cls = getattr(mod, "EmbeddedBroker", None)
        if broker_cls is None:
            self.notes.append("in-process MQTT broker: broker/federation/mqtt_embedded.py has "
                              "no EmbeddedBroker: edge steps skipped")
            return
        self._mqtt = broker_cls(host, port)
        await self._mqtt.start()  # returns once it listens; no probe (amqtt logs bare connects)
        self.mqtt_ok = True

    async def _start_hub(self) -> None:
        if not self.mqtt_ok:
            return
        hub = next((lp for lp in self.loops if getattr(lp, "name", "") == "edge_hub"), None)
        if hub is None:
            try:
                from broker.federation import edge_hub
            except ImportError:
                self.notes.append("edge hub (broker/federation/edge_hub.py) missing: "
                                  "failover skipped")
                return
            from broker.federation.looping import supervise

            # The broker's own factory (it persists site health and events to the
            # store) when there is one; else a hub that records events only.
            factory = getattr(edge_hub, "make_edge_hub", None)
            hub = factory(self.runtime) if callable(factory) else None
            if hub is None:
                hub = edge_hub.EdgeHub(settings=self.settings.edge, mqtt=self.settings.mqtt,
                                       recorder=self._record)
            self.loops.append(hub)
            self._spawn(supervise(hub, self._stop), "demo:loop:edge_hub")
        for site in domain_sites(self.fed):
            hub.add_site(site)
        self.hub = hub

    async def _record(self, kind: str, data: dict[str, Any]) -> None:
        """The demo's own hub writes its records to the event log like the broker's would.

        The write is shielded: the hub may be cancelled at shutdown while it records, and
        a transaction cut in half makes SQLAlchemy log a traceback. The shielded write is
        owned by this stack (`_writes`) and awaited before the store closes.
        """
        task = asyncio.create_task(self._append_event(kind, data), name="demo:event-write")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        await asyncio.shield(task)

    async def _append_event(self, kind: str, data: dict[str, Any]) -> None:
        if self.runtime is None:
            return
        async with self.runtime.store.unit() as uow:
            subject = str(data.get("service") or data.get("site") or "")
            await uow.events.append(f"edge.{data.get('event', kind)}", subject, data)

    async def _start_agents(self) -> None:
        self.fleet = AgentFleet(self.settings.data_dir / "agents", self.settings.mqtt.url,
                                heartbeat_ms=self.settings.edge.heartbeat_ms)
        for site in self.fed.sites:
            await self.fleet.start(site.name)

    async def _shutdown(self) -> None:
        """Loops and API first (so no loop works on a vanishing agent), then the agents,
        the MQTT broker and the store."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        # Give the API and the loops a moment to stop on their own, then cancel.
        _, pending = await asyncio.wait(self._tasks, timeout=5.0) if self._tasks else ((), ())
        for t in pending:
            log.warning("demo: %s did not stop within 5 s; cancelling it", t.get_name())
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._writes, return_exceptions=True)
        if self.fleet is not None:
            await self.fleet.close()
        if self._mqtt is not None:
            await self._mqtt.stop()
        if self.runtime is not None:
            await self.runtime.store.close()

    def token_file(self) -> Path:
        return self.settings.data_dir / "token"
