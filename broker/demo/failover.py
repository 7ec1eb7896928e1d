"""Watch an edge failover from the outside, through the public MQTT protocol.

Why an observer instead of asking the hub: what users experience is the
retained route topic, so that is what the demo times. The observer subscribes
to every site's status (the Last Will `offline` lands there) and every route;
the demo kills an agent with SIGKILL and reads off

- detect_ms: kill -> the agent's Last Will seen on the broker (the hub gets
  the same message at the same time and declares the site down);
- serving_ms: kill -> a route for the service naming another site, published
  only after that site acked the promotion (the standby is serving);
- the new route (site, standby, epoch).

Topic filtering is strict (amqtt may hand a client retained messages of other
clients' subscriptions, FACTS.md), so anything not parsed is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from edge_agent.protocol import DEFAULT_PREFIX, Route, Status, Topics, decode


@dataclass(frozen=True, slots=True)
class FailoverObservation:
    service: str
    killed_site: str
    detect_ms: float | None
    serving_ms: float | None
    new_site: str
    new_standby: str
    epoch: int


@dataclass
class RouteWatcher:
    """Latest route per service and status per site, with arrival times (ms)."""

    host: str
    port: int
    prefix: str = DEFAULT_PREFIX
    routes: dict[str, tuple[Route, float]] = field(default_factory=dict)
    statuses: dict[str, tuple[Status, float]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RouteWatcher]:
        """Subscribe and keep the view fresh until the block exits."""
        import aiomqtt

        topics = Topics(self.prefix)
        client = aiomqtt.Client(self.host, self.port, timeout=5.0,
                                identifier=f"skyfed-demo-{uuid.uuid4().hex[:8]}")
        async with client:
            await client.subscribe(topics.all_routes(), qos=1)
            await client.subscribe(topics.all_sites("status"), qos=1)
            task = asyncio.create_task(self._consume(client, topics), name="demo:route-watcher")
            try:
                yield self
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _consume(self, client: Any, topics: Topics) -> None:
        async for message in client.messages:
            now = time.time() * 1000.0
            topic = str(message.topic)
            payload = message.payload
            if not isinstance(payload, bytes | bytearray | str):
                continue
            route_prefix = f"{self.prefix}/routes/"
            if topic.startswith(route_prefix):
                r = decode(Route, payload)
                if r is not None and r.service == topic[len(route_prefix):]:
                    self.routes[r.service] = (r, now)
            else:
                parsed = topics.parse(topic)
                if parsed is not None and parsed[0] == "status":
                    s = decode(Status, payload)
                    if s is not None and s.site == parsed[1]:
                        self.statuses[s.site] = (s, now)
            self.changed.set()

    async def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Wait until `predicate(self)` is true; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.25))
        return True

    def route(self, service: str) -> Route | None:
        got = self.routes.get(service)
        return got[0] if got else None

    def online(self, site: str) -> bool:
        got = self.statuses.get(site)
        return got is not None and got[0].state == "online"


async def observe_failover(watcher: RouteWatcher, service: str, kill: Any,
                           timeout_s: float = 10.0) -> FailoverObservation:
    """Kill the site serving `service` (via `kill(site)`) and time what follows."""
    before = watcher.route(service)
    if before is None or not before.site:
        raise LookupError(f"no route for service {service!r} yet")
    site = before.site
    t_kill = time.time() * 1000.0
    kill(site)

    def offline(w: RouteWatcher) -> bool:
        got = w.statuses.get(site)
        return got is not None and got[0].state == "offline" and got[1] >= t_kill

    def moved(w: RouteWatcher) -> bool:
        got = w.routes.get(service)
        return (got is not None and got[0].epoch > before.epoch and got[0].site not in ("", site))

    await watcher.wait_for(offline, timeout_s)
    status = watcher.statuses.get(site)
    detect_ms = status[1] - t_kill if status and offline(watcher) else None
    await watcher.wait_for(moved, timeout_s)
    got = watcher.routes.get(service)
    if got is None or not moved(watcher):
        return FailoverObservation(service, site, detect_ms, None, "", "", before.epoch)
    route, at_ms = got
    return FailoverObservation(service=service, killed_site=site, detect_ms=detect_ms,
                               serving_ms=at_ms - t_kill, new_site=route.site,
                               new_standby=route.standby_site, epoch=route.epoch)
