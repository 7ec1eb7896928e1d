"""The MQTT contract between the broker's edge hub and the `skyfed-edge` agents.

This module is the only thing the broker imports from `edge_agent` (import-linter
enforces it), so it must stay light: pydantic, json, logging, nothing else.

Topics (``{p}`` is the prefix, ``skyfed/v1`` by default; tests use unique
prefixes because several suites share one Mosquitto)::

    {p}/sites/{site}/status     agent -> hub   QoS 1, RETAINED; Last Will "offline" (retained)
    {p}/sites/{site}/heartbeat  agent -> hub   QoS 0
    {p}/sites/{site}/commands   hub -> agent   QoS 1
    {p}/sites/{site}/acks       agent -> hub   QoS 1
    {p}/sites/{site}/telemetry  agent -> hub   QoS 1 (journal events) / QoS 0 (progress)
    {p}/sites/{site}/echo       agent -> agent QoS 1 (MQTT round-trip probe through the broker)
    {p}/routes/{service}        hub -> anyone  QoS 1, RETAINED: where the service is served now

Why these QoS levels:

- status is retained so a hub that (re)starts learns every site's last state at
  once, and the Will is retained so a crashed site stays "offline" for late
  subscribers. QoS 1 because losing an "offline" would hide a failure.
- heartbeats are QoS 0 and never retained: the next one supersedes a lost one,
  the hub's timeout tolerates a few losses, and a retained heartbeat would make a
  dead site look alive to a late subscriber.
- commands and acks are QoS 1 (at least once). Duplicates are harmless because
  every command carries a `command_id`; the agent answers a repeated id with the
  ack it already gave, without acting twice. QoS 2 would add a round trip to the
  failover path for nothing.
- telemetry that comes from the agent's journal is QoS 1 and carries an
  `event_id`, so replay after a partition is at-least-once on the wire and
  exactly-once after the hub's de-duplication. Progress reports are QoS 0.
- echo is QoS 1 although a lost probe is harmless: the PUBACK the agent sends
  back carries the TCP ACK at once; with QoS 0 the broker's next packet to the
  agent (a failover command) could wait ~40 ms on Nagle + delayed ACK.
- routes are retained so a client (or a new hub replica) that subscribes later
  learns where a service runs; `epoch` orders them so a stale route never wins.

Every payload is JSON with a `schema_version`. `decode()` returns None (and logs)
for malformed payloads and unknown versions: a bad message from one peer must
never crash the loops on the other side.

Bounds (hostile input is normal input): every number is finite (`NaN` and
`Infinity` are refused) and bounded (timestamps within `TS_MS_MAX`, counters and
epochs within 2^53, fractions within 0..1); names and ids refuse control
characters and the MQTT wildcards; free text refuses control characters except
tab, CR and LF; maps and lists have maximum sizes. A `Telemetry` message with
`ts_ms: 1e308` was once stored as an event no list could answer; now it does not
decode. The broker keeps the same rules for its API in `broker/limits.py` (this
module may not import the broker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

__all__ = [
    "COUNT_MAX",
    "DEFAULT_PREFIX",
    "QOS",
    "SCHEMA_VERSION",
    "TS_MS_MAX",
    "Ack",
    "Command",
    "CommandKind",
    "DataItem",
    "Echo",
    "Heartbeat",
    "Message",
    "Route",
    "ServiceSpec",
    "ServiceState",
    "Status",
    "Telemetry",
    "Topics",
    "decode",
    "encode",
    "now_ms",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_PREFIX = "skyfed/v1"

# Per-topic QoS and retain flags (see module docstring for why).
QOS: dict[str, tuple[int, bool]] = {
    "status": (1, True),
    "heartbeat": (0, False),
    "commands": (1, False),
    "acks": (1, False),
    "telemetry": (1, False),
    "echo": (1, False),
    "routes": (1, True),
}

SITE_TOPICS = ("status", "heartbeat", "commands", "acks", "telemetry", "echo")

ServiceState = Literal["starting", "standby", "serving", "failed", "stopped"]
CommandKind = Literal["start", "stop", "promote", "demote", "prewarm", "ping"]


def now_ms() -> float:
    """Wall-clock milliseconds: messages carry it so both sides can measure delays."""
    return time.time() * 1000.0


# Wire bounds (see the module docstring).
TS_MS_MAX = 1e13  # milliseconds since 1970: the year 2286
COUNT_MAX = 2**53  # counters, epochs, sessions: exact in a float and in JavaScript
_TEXT = r"^[^\x00-\x1f\x7f]*$"
_MULTILINE = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
_NAME = r"^[^\x00-\x1f\x7f/+#]+$"  # also an MQTT topic level: no wildcards, no '/'
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=_NAME)]
MaybeName = Annotated[str, Field(max_length=253, pattern=r"^[^\x00-\x1f\x7f/+#]*$")]
Ident = Annotated[str, Field(max_length=128, pattern=_TEXT)]
Text = Annotated[str, Field(max_length=4096, pattern=_MULTILINE)]
Ms = Annotated[float, Field(ge=0, le=TS_MS_MAX)]
RttMs = Annotated[float, Field(ge=0, le=1e6)]
Frac = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=0, le=COUNT_MAX)]
Scalar = (Text | Annotated[int, Field(ge=-COUNT_MAX, le=COUNT_MAX)]
          | Annotated[float, Field(ge=-COUNT_MAX, le=COUNT_MAX)] | bool | None)


class _Msg(BaseModel):
    # defer_build: a model's validator is built on first use, so the agent never pays for
    # the ones it does not use (about 0.5 MB of its ~39 MB RSS; tests/e2e/test_edge_cli.py).
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False,
                              defer_build=True)

    schema_version: Literal[1] = 1

    @model_validator(mode="before")
    @classmethod
    def _version_required_on_the_wire(cls, data: Any, info: ValidationInfo) -> Any:
        """Built in code the version defaults; decoded from the wire it must be there."""
        if (info.context or {}).get("wire") and isinstance(data, dict) \
                and "schema_version" not in data:
            raise ValueError("schema_version missing")
        return data


class Status(_Msg):
    """Retained site presence. The Last Will is `Status(state="offline")`."""

    site: Name
    state: Literal["online", "offline"]
    ts_ms: Ms = Field(default_factory=now_ms)
    started_ms: Ms = 0.0
    agent_version: str = Field(default="0.1.0", max_length=64, pattern=_TEXT)
    # Bumps on every new MQTT session: a hub can tell a reconnect from a stale retained copy.
    session: Count = 0


class Heartbeat(_Msg):
    """Liveness and load. `services` maps service name -> ServiceState."""

    site: Name
    seq: Count
    ts_ms: Ms = Field(default_factory=now_ms)
    cpu_frac: Frac = 0.0  # whole-host CPU busy fraction 0..1
    mem_frac: Frac = 0.0  # whole-host memory used fraction 0..1
    gpu_frac: Frac | None = None  # mean GPU utilisation 0..1, None without GPUs
    rss_mb: float = Field(default=0.0, ge=0, le=1e9)  # the agent's own resident memory
    broker_rtt_ms: RttMs | None = None  # MQTT round trip agent -> broker -> agent
    # probe name (a user region or peer site; "host:port" when unnamed) -> TCP connect ms
    peer_rtt_ms: dict[Name, RttMs] = Field(default_factory=dict, max_length=1000)
    services: dict[Name, ServiceState] = Field(default_factory=dict, max_length=10_000)


class ServiceSpec(BaseModel):
    """A service the agent runs. An empty `command` means no local process (the
    service runs elsewhere on the site, e.g. in its k3s): the agent then tracks
    only its role, which is what a route switch needs."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False,
                              defer_build=True)

    name: Name
    command: tuple[Annotated[str, Field(max_length=32_768, pattern=_MULTILINE)], ...] = \
        Field(default=(), max_length=1000)
    env: dict[Annotated[str, Field(min_length=1, max_length=253, pattern=_TEXT)],
              Annotated[str, Field(max_length=32_768, pattern=_MULTILINE)]] = \
        Field(default_factory=dict, max_length=1000)
    # healthy when 127.0.0.1:port accepts
    health_tcp_port: int | None = Field(default=None, ge=1, le=65_535)
    # sent to the process on promote (e.g. SIGUSR1=10)
    promote_signal: int | None = Field(default=None, ge=1, le=64)
    # what clients connect to once it serves, published in the route
    endpoint: str = Field(default="", max_length=2048, pattern=_TEXT)


class DataItem(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False,
                              defer_build=True)

    url: str = Field(max_length=2048, pattern=_TEXT)
    sha256: str = Field(pattern=r"^([0-9a-fA-F]{64})?$")
    size_bytes: Count | None = None
    # file name in the cache; default: the sha256
    name: str = Field(default="", max_length=255, pattern=_TEXT)


class Command(_Msg):
    """Hub -> agent. `command_id` is the idempotency key (see `Ack`)."""

    command_id: Ident
    site: Name
    kind: CommandKind
    ts_ms: Ms = Field(default_factory=now_ms)
    service: ServiceSpec | None = None  # start (standby=True: warm, not serving)
    service_name: MaybeName = ""  # stop / promote / demote
    standby: bool = False
    epoch: Count = 0  # route epoch this command belongs to; agents ignore older epochs
    # Batched promote/demote: service name -> its route epoch. One packet and one ack
    # for every service a failed site moves onto this site (the failover hot path).
    services: dict[Name, Count] = Field(default_factory=dict, max_length=10_000)
    data: tuple[DataItem, ...] = Field(default=(), max_length=1000)  # prewarm
    images: tuple[Annotated[str, Field(max_length=1024, pattern=_TEXT)], ...] = \
        Field(default=(), max_length=1000)  # prewarm


class Ack(_Msg):
    command_id: Ident
    site: Name
    ok: bool
    ts_ms: Ms = Field(default_factory=now_ms)
    message: str = Field(default="", pattern=_MULTILINE)
    # When the agent switched the service's role (promote); for timing.
    done_ms: Ms | None = None
    duplicate: bool = False
    # services of a batched command that did not switch
    failed: tuple[Name, ...] = Field(default=(), max_length=10_000)
    # The highest route epoch the agent knows for the command's services: lets a
    # restarted hub catch up after a "stale epoch" refusal.
    epoch: Count = 0


class Telemetry(_Msg):
    """A journal event or a progress report. `event_id` lets the hub drop replays."""

    site: Name
    # e.g. service_failed, service_restarted, prewarm_progress, prewarm_done
    kind: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    ts_ms: Ms = Field(default_factory=now_ms)
    event_id: Ident = ""
    replayed: bool = False
    data: dict[Annotated[str, Field(min_length=1, max_length=64, pattern=_TEXT)],
               Scalar] = \
        Field(default_factory=dict, max_length=64)


class Echo(_Msg):
    site: Name
    nonce: Count
    sent_ms: Ms


class Route(_Msg):
    service: Name
    site: MaybeName  # "" when no site serves it
    epoch: Count
    ts_ms: Ms = Field(default_factory=now_ms)
    endpoint: str = Field(default="", max_length=2048, pattern=_TEXT)
    standby_site: MaybeName = ""


Message = Status | Heartbeat | Command | Ack | Telemetry | Echo | Route
M = TypeVar("M", bound=_Msg)
_WIRE = {"wire": True}


def encode(msg: _Msg) -> bytes:
    return msg.model_dump_json(exclude_defaults=False).encode()


def decode(model: type[M], payload: bytes | bytearray | str, *,
           log_level: int = logging.WARNING) -> M | None:
    """Parse `payload` as `model`; None (logged at `log_level`, never raised) when it is not.

    Unknown schema versions are rejected explicitly so a newer agent's message
    is reported as such rather than as a confusing validation error. The hub
    passes DEBUG: it counts and rate-limits its own log of dropped messages.
    """
    try:  # fast path: one pass in pydantic-core (the hub decodes ~500 heartbeats/s)
        return model.model_validate_json(payload, context=_WIRE)
    except ValidationError:
        pass  # classify below: unknown version, not JSON, or invalid
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: `[[[[...`
        log.log(log_level, "dropping malformed %s payload: %s", model.__name__, exc)
        return None
    if not isinstance(raw, dict):
        log.log(log_level, "dropping %s payload: not a JSON object", model.__name__)
        return None
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        log.log(log_level, "dropping %s payload with unknown schema_version %r",
                model.__name__, version)
        return None
    try:
        return model.model_validate(raw, context=_WIRE)
    except ValidationError as exc:
        log.log(log_level, "dropping invalid %s payload: %s", model.__name__,
                exc.errors(include_url=False)[:3])
        return None


class Topics:
    """Topic names under one prefix. Site and service names must not contain
    `/`, `+` or `#` (MQTT wildcards); `check_name` rejects them."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix.rstrip("/")

    @staticmethod
    def check_name(name: str) -> str:
        if not name or any(c in name for c in "/+#\0"):
            raise ValueError(f"invalid site/service name for MQTT topics: {name!r}")
        return name

    def site(self, site: str, kind: str) -> str:
        if kind not in SITE_TOPICS:
            raise ValueError(f"unknown site topic kind: {kind!r}")
        return f"{self.prefix}/sites/{self.check_name(site)}/{kind}"

    def status(self, site: str) -> str:
        return self.site(site, "status")

    def heartbeat(self, site: str) -> str:
        return self.site(site, "heartbeat")

    def commands(self, site: str) -> str:
        return self.site(site, "commands")

    def acks(self, site: str) -> str:
        return self.site(site, "acks")

    def telemetry(self, site: str) -> str:
        return self.site(site, "telemetry")

    def echo(self, site: str) -> str:
        return self.site(site, "echo")

    def route(self, service: str) -> str:
        return f"{self.prefix}/routes/{self.check_name(service)}"

    def all_sites(self, kind: str) -> str:
        """Wildcard filter for one kind over every site (the hub subscribes to these)."""
        if kind not in SITE_TOPICS:
            raise ValueError(f"unknown site topic kind: {kind!r}")
        return f"{self.prefix}/sites/+/{kind}"

    def all_routes(self) -> str:
        return f"{self.prefix}/routes/+"

    def parse(self, topic: str) -> tuple[str, str] | None:
        """`(kind, name)` for a topic under this prefix, else None.

        `kind` is a site topic kind (name = site) or "routes" (name = service).
        Callers must filter by this: amqtt may deliver retained messages from
        topics the client never subscribed to (FACTS.md).
        """
        head = self.prefix + "/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head):].split("/")
        if len(parts) == 3 and parts[0] == "sites" and parts[2] in SITE_TOPICS and parts[1]:
            return parts[2], parts[1]
        if len(parts) == 2 and parts[0] == "routes" and parts[1]:
            return "routes", parts[1]
        return None


async def cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel a session's loops and wait for them, cancelling again any that keep running.

    Both ends of the protocol run their session as a few loops and stop them this
    way. On Python 3.11 `asyncio.wait_for` (inside aiomqtt's QoS 1 publish) can
    swallow a cancellation that races its result (CPython gh-86296); the loop that
    called it then runs on, and a single cancel() would wait on it forever (seen: a
    heartbeat loop that outlived its session). Re-cancelling reaches its next await.
    """
    for t in tasks:
        t.cancel()
    pending = {t for t in tasks if not t.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.2)
        for t in pending:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
