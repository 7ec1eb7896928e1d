"""The edge hub's vocabulary: what `HubCore` (edge_core.py) is told, keeps and answers.

Outputs (`Action`): `Send` (a command to a site's agent), `PublishRoute` (a retained
route) and `Record` (an event to persist). State: `SiteState` per site (health, last
heard, measured RTTs, what its heartbeat says it runs), `ServiceState` per service
(primary, standby, route epoch), `PendingCommand` per command awaiting its ack. Results:
`FailoverRecord` per failover, with its timings.

Plain dataclasses, no behaviour: the rules live in edge_core.py. Separate so the state
machine reads as transitions, and the shell (edge_hub.py) and tests can name these types
without the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.domain import Site, SiteHealth
from broker.placement.standby import EdgeServiceNeed
from edge_agent.protocol import Command, DataItem, Route, ServiceSpec

__all__ = [
    "Action",
    "EdgeService",
    "FailoverRecord",
    "PendingCommand",
    "PublishRoute",
    "Record",
    "Send",
    "ServiceState",
    "SiteState",
]


@dataclass(frozen=True)
class EdgeService:
    """A latency-critical service the hub keeps served with a warm standby."""

    need: EdgeServiceNeed
    spec: ServiceSpec
    data: tuple[DataItem, ...] = ()
    images: tuple[str, ...] = ()
    # Where the placement LP put it (the dispatcher already started it there): serve
    # there first when it is feasible, rather than re-deciding.
    prefer_site: str = ""


@dataclass(frozen=True)
class Send:
    site: str
    command: Command


@dataclass(frozen=True)
class PublishRoute:
    route: Route


@dataclass(frozen=True)
class Record:
    kind: str
    data: dict[str, Any]


Action = Send | PublishRoute | Record


@dataclass
class SiteState:
    site: Site | None
    health: SiteHealth = SiteHealth.HEALTHY
    last_seen_ms: float = 0.0
    session: int = -1
    rtt_ms: dict[str, float] = field(default_factory=dict)
    load_cpu_frac: float = 0.0
    services: dict[str, str] | None = None  # from the latest heartbeat
    last_beat_ms: float = 0.0
    rejoin_from_ms: float = 0.0  # first heartbeat of a down site's current run
    rtt_recorded_ms: float | None = None  # last `edge_site_rtt` record


@dataclass
class ServiceState:
    svc: EdgeService
    primary: str = ""
    standby: str = ""
    standby_ready: bool = False
    epoch: int = 0
    routed: str = ""
    told: set[str] = field(default_factory=set)  # sites that were given this service
    moving_to: str = ""  # rebalance target being warmed


@dataclass
class PendingCommand:
    command: Command
    service: str
    purpose: str  # serve | standby | prewarm
    sent_ms: float
    detected_ms: float | None = None
    last_seen_ms: float | None = None
    cause: str = ""
    batch: tuple[str, ...] = ()  # services of a batched promote (else just `service`)
    attempts: int = 0
    created_ms: float = 0.0  # when the hub decided (sent_ms moves with each publish)


@dataclass(frozen=True)
class FailoverRecord:
    service: str
    from_site: str
    to_site: str
    cause: str  # will | heartbeat | rebalance
    detected_ms: float
    detect_ms: float
    serving_ms: float
    epoch: int
    agent_ack_ms: float | None = None  # hub decided -> agent says it serves (agent clock)
    ack_transit_ms: float | None = None  # agent sent the ack -> hub got it (agent clock)
