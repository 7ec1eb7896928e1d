"""The edge agent's settings (`skyfed-edge run` flags, docs/edge.md). Split from agent.py,
which re-exports it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_agent.protocol import DEFAULT_PREFIX


@dataclass(frozen=True)
class AgentConfig:
    site: str
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    prefix: str = DEFAULT_PREFIX
    heartbeat_ms: int = 100
    keepalive_s: int = 5
    data_dir: Path = Path(".skyfed-edge")
    peers: tuple[str, ...] = ()  # [SITE=]host:port of peer sites (TCP connect RTT)
    probes: tuple[str, ...] = ()  # [REGION=]host:port of user probe points (probe.py)
    probe_every_s: float = 5.0
    load_every_s: float = 2.0
    echo_every_s: float = 1.0
    cache_max_bytes: int = 10 * 1024**3
    max_concurrent_downloads: int = 2
    pull_command: str = ""  # e.g. "crictl pull {image}"
    reconnect_max_s: float = 5.0
    connect_timeout_s: float = 5.0
