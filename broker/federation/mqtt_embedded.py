"""An in-process MQTT broker (amqtt) for the embedded default (`skyfed demo`).

Why it exists: the defaults must run with nothing installed but the package
(DESIGN.md), and the edge hub and agents need an MQTT broker. Production uses
Mosquitto (deploy/mosquitto/) or another real broker; this one is for a single
user on one machine.

What we pin down, because amqtt's defaults are unsafe (FACTS.md):

- a FULL config is always passed: amqtt's defaults bind 0.0.0.0:1883 and
  publish `$SYS` topics every 20 s; we bind loopback only and load no `$SYS`
  plugin and no packet-logging plugins (they log every packet);
- anonymous access is allowed only because the listener is loopback-only;
- amqtt sends a connecting client retained messages matching *other* clients'
  subscriptions: every skyfed client filters incoming topics (`Topics.parse`),
  and this broker must never be shared between tenants.

Port 0 picks a free port; `port` tells which after `start()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)


def broker_config(host: str = "127.0.0.1", port: int = 1883) -> dict[str, Any]:
    """The full amqtt config we run with (see module docstring)."""
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise ValueError(f"embedded MQTT broker binds loopback only, not {host!r}")
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}",
                                  "max_connections": 1000}},
        "timeout_disconnect_delay": 0,
        "plugins": {
            "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
        },
    }


class EmbeddedBroker:
    """`async with EmbeddedBroker(port=0) as b: ... b.url` or `await start()/stop()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 1883) -> None:
        self.host = host
        self.port = port
        self._config = broker_config(host, port)
        self._broker: Any = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    async def start(self) -> None:
        from amqtt.broker import Broker

        logging.getLogger("amqtt").setLevel(logging.WARNING)
        logging.getLogger("transitions").setLevel(logging.WARNING)
        self._broker = Broker(self._config)
        await self._broker.start()
        if self.port == 0:
            self.port = self._bound_port()
        log.info("embedded MQTT broker listening on %s", self.url)

    def _bound_port(self) -> int:
        for server in self._broker._servers.values():  # noqa: SLF001 - amqtt has no accessor
            for sock in server.instance.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("embedded MQTT broker started without a listening socket")

    async def stop(self) -> None:
        if self._broker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._broker.shutdown()
            self._broker = None

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
