"""Load and RTT probes the agent puts in its heartbeats.

- Load: whole-host CPU and memory through psutil (the `edge` extra), GPU
  utilisation through `nvidia-smi` when it exists. psutil and nvidia-smi are
  sampled on their own slower cadence (`LoadSampler.refresh`), not per
  heartbeat, so a 100 ms heartbeat stays cheap (idle CPU < 1 %).
- RTT to peer sites and user probe points: TCP connect time (SYN -> SYN/ACK is
  one round trip; no payload, so no server cooperation is needed). A target is
  `host:port` or `NAME=host:port`; the heartbeat reports each RTT under NAME when
  given (a user region's or peer site's name: the key the broker's placement and
  standby ranking look RTTs up by), else under `host:port`.
- RTT to the broker: the agent publishes an `Echo` on its own echo topic and
  times its return (see agent.py); that measures the MQTT path the failover
  commands take, not just the TCP path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Any

log = logging.getLogger(__name__)


def parse_hostport(value: str, *, default_port: int | None = None) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) -> (host, port); names the bad value on error."""
    host, sep, port = value.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"expected host:port, got {value!r}")
        return value, default_port
    host = host.strip("[]")
    try:
        return host, int(port)
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None


async def tcp_connect_ms(host: str, port: int, *, timeout_s: float = 1.0) -> float | None:
    """Milliseconds to open a TCP connection, or None when it fails or times out."""
    t0 = time.perf_counter()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return None
    elapsed = (time.perf_counter() - t0) * 1000.0
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return elapsed


def parse_target(value: str) -> tuple[str, str, int]:
    """`NAME=host:port` or `host:port` -> (key the RTT is reported under, host, port)."""
    name, sep, addr = value.partition("=")
    if not sep:
        name, addr = value, value
    elif not name:
        raise ValueError(f"empty probe name in {value!r}")
    host, port = parse_hostport(addr)
    return name, host, port


async def probe_all(targets: list[str], *, timeout_s: float = 1.0) -> dict[str, float]:
    """TCP connect RTTs for every target (`host:port` or `NAME=host:port`), keyed by NAME
    when given, else by `host:port`; failures are left out."""
    if not targets:
        return {}
    parsed = [parse_target(t) for t in targets]
    results = await asyncio.gather(*(tcp_connect_ms(h, p, timeout_s=timeout_s)
                                     for _, h, p in parsed))
    return {k: round(r, 3) for (k, _, _), r in zip(parsed, results, strict=True)
            if r is not None}


class LoadSampler:
    """Caches host load; `refresh()` is called every few seconds by the agent."""

    def __init__(self) -> None:
        self.cpu_frac = 0.0
        self.mem_frac = 0.0
        self.gpu_frac: float | None = None
        self.rss_mb = 0.0
        self._psutil: Any = None
        self._proc: Any = None
        try:
            import psutil  # the `edge` extra; imported lazily to keep startup small
        except ImportError:  # pragma: no cover - the extra is missing
            log.warning("psutil not installed (pip install skyfed[edge]): load reports zeros")
        else:
            self._psutil = psutil
            self._proc = psutil.Process(os.getpid())
            psutil.cpu_percent(interval=None)  # prime: the first call returns 0.0
        self._nvidia_smi = shutil.which("nvidia-smi")

    async def refresh(self) -> None:
        if self._psutil is not None:
            self.cpu_frac = self._psutil.cpu_percent(interval=None) / 100.0
            self.mem_frac = self._psutil.virtual_memory().percent / 100.0
            self.rss_mb = self._proc.memory_info().rss / 1_048_576
        if self._nvidia_smi:
            self.gpu_frac = await self._gpu_util()

    async def _gpu_util(self) -> float | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                self._nvidia_smi or "nvidia-smi", "--query-gpu=utilization.gpu",
                "--format=csv,noheader,nounits",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await asyncio.wait_for(proc.communicate(), 5.0)
        except (OSError, TimeoutError):
            return None
        values = [float(x) for x in out.decode().split() if x.replace(".", "", 1).isdigit()]
        return sum(values) / len(values) / 100.0 if values else None
