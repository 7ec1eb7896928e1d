"""The edge hub's front door: which MQTT messages reach `HubCore`. Pure and synchronous.

`Inbox.admit(topic, payload, now_ms)` parses the topic, decodes the payload as the
model of its kind (`edge_agent.protocol`: finite, bounded numbers; no control
characters), checks that the message names the site of its topic, and that the
site is registered (known to the core through `HubCore.add_site`, which the hub's
site loader feeds from the store). `Inbox.feed(message, now_ms)` hands an admitted
message to the core and returns the core's actions.

Everything else is dropped: never fed to the core, never stored as an event.
Drops are counted in the Prometheus counter `skyfed_mqtt_rejected_total{kind,reason}`
(reason: `topic`, `invalid`, `site_mismatch`, `unregistered`) and logged at most
once per `log_every_s` per (kind, reason), so a noisy or hostile publisher cannot
flood the log. Why: a telemetry message from an unregistered site with `ts_ms: 1e308`
was once stored as an `edge.event` with tenant NULL, and every `GET /v1/events`
answered 500 from then on.

Telemetry `data` keys that would overwrite the hub's own fields of the stored event
(`site`, `kind`, `event_id`, `ts_ms`, `replayed`) are dropped: one site must not
write events that look like another site's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from broker.federation.edge_core import Action, HubCore
from edge_agent.protocol import Ack, Heartbeat, Route, Status, Telemetry, Topics, decode

__all__ = ["REJECTED", "Admitted", "Inbox"]

log = logging.getLogger(__name__)

REJECTED = Counter("skyfed_mqtt_rejected_total",
                   "MQTT messages the edge hub dropped (unknown topic, invalid payload, "
                   "site mismatch, unregistered site)", ["kind", "reason"])

Inbound = Status | Heartbeat | Ack | Telemetry | Route
_MODELS: dict[str, type[Inbound]] = {"status": Status, "heartbeat": Heartbeat, "acks": Ack,
                                      "telemetry": Telemetry, "routes": Route}
_RESERVED = frozenset({"site", "kind", "event_id", "ts_ms", "replayed"})


@dataclass(frozen=True)
class Admitted:
    kind: str  # status | heartbeat | acks | telemetry | routes
    name: str  # the site (or, for routes, the service) of the topic
    message: Inbound


class Inbox:
    """See the module docstring. `clock_s` only paces the log (seconds, any origin)."""

    def __init__(self, core: HubCore, topics: Topics, *, log_every_s: float = 10.0,
                 clock_s: Callable[[], float] | None = None) -> None:
        import time

        self.core = core
        self.topics = topics
        self.log_every_s = log_every_s
        self._clock_s = clock_s or time.monotonic
        self._logged: dict[tuple[str, str], float] = {}
        self.rejected: dict[tuple[str, str], int] = {}  # this inbox's own counts, for tests

    def admit(self, topic: str, payload: object, now_ms: float) -> Admitted | None:
        """The decoded message if it may reach the core; None (counted, logged) if not."""
        parsed = self.topics.parse(topic)
        if parsed is None or parsed[0] not in _MODELS:
            return self._reject("unknown", "topic", topic)
        kind, name = parsed
        if kind == "routes" and not payload:
            return None  # a cleared retained route: nothing to learn, nothing wrong
        if not isinstance(payload, bytes | bytearray | str):
            return self._reject(kind, "invalid", name)
        msg = decode(_MODELS[kind], payload, log_level=logging.DEBUG)
        if msg is None:
            return self._reject(kind, "invalid", name)
        named = msg.service if isinstance(msg, Route) else msg.site
        if named != name:
            return self._reject(kind, "site_mismatch", name)
        if kind != "routes" and not self.registered(name):
            return self._reject(kind, "unregistered", name)
        if isinstance(msg, Telemetry) and _RESERVED & msg.data.keys():
            msg = msg.model_copy(update={"data": {k: v for k, v in msg.data.items()
                                                  if k not in _RESERVED}})
        return Admitted(kind, name, msg)

    def registered(self, site: str) -> bool:
        state = self.core.sites.get(site)
        return state is not None and state.site is not None

    def feed(self, got: Admitted, now_ms: float) -> list[Action]:
        """Hand an admitted message to the core; its actions for the shell to carry out."""
        m = got.message
        if isinstance(m, Heartbeat):
            return self.core.on_heartbeat(got.name, m, now_ms)
        if isinstance(m, Status):
            return self.core.on_status(got.name, m, now_ms)
        if isinstance(m, Ack):
            return self.core.on_ack(m, now_ms)
        if isinstance(m, Telemetry):
            return self.core.on_telemetry(m, now_ms)
        self.core.on_route(m)
        return []

    def _reject(self, kind: str, reason: str, name: str) -> Admitted | None:
        REJECTED.labels(kind, reason).inc()
        key = (kind, reason)
        self.rejected[key] = self.rejected.get(key, 0) + 1
        now = self._clock_s()
        if now - self._logged.get(key, -self.log_every_s) >= self.log_every_s:
            self._logged[key] = now
            log.warning("edge hub dropped %s message (%s) from %.80r; %d so far",
                        kind, reason, name, self.rejected[key])
        return None
