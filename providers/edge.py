"""ClusterDriver for an edge site run by a `skyfed-edge` agent.

The driver sends the agent commands (start / stop a service) and reads the
service states the agent reports in its heartbeats. It does not speak MQTT
itself: `providers` may not import `edge_agent` (import-linter), so the wire
format stays in one place (`edge_agent.protocol`) and the broker's edge hub
(`broker/federation/edge_hub.py::EdgeHub`, which holds the MQTT session)
implements `EdgeTransport` for it. Tests pass a fake transport.

Latency-critical services with a warm standby and failover are the hub's own
business (`EdgeHub.add_service`); this driver is the plain "run this workload
on that site" path the dispatcher uses, with `workload_id` as the service name
(idempotent: the agent treats a repeated start of the same spec as a no-op).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from providers.base import (
    ApplySpec,
    Capability,
    DriverStatus,
    NodeInventory,
    PrewarmSpec,
    WorkloadPhase,
)
from providers.errors import NotFoundError, ProviderError, TransientError

__all__ = ["EdgeSiteDriver", "EdgeTransport"]

_PHASES = {
    "starting": WorkloadPhase.PENDING,
    "standby": WorkloadPhase.RUNNING,
    "serving": WorkloadPhase.RUNNING,
    "failed": WorkloadPhase.FAILED,
    "stopped": WorkloadPhase.SUCCEEDED,
}


class EdgeTransport(Protocol):
    """What the driver needs from whoever holds the MQTT session (the edge hub)."""

    async def send_command(self, *, site: str, kind: str,
                           service: Mapping[str, Any] | None = None, service_name: str = "",
                           standby: bool = False, timeout_s: float = 5.0,
                           data: Sequence[Mapping[str, Any]] = (),
                           images: Sequence[str] = ()) -> Mapping[str, Any]:
        """Send one command and return the agent's ack fields (`ok`, `message`, ...).

        `data` (url, sha256, size_bytes, name) and `images` are a prewarm's.
        Raises TimeoutError when no ack arrives in `timeout_s`."""
        ...

    def site_services(self, *, site: str) -> Mapping[str, str] | None:
        """Service name -> state from the site's latest heartbeat; None if never heard."""
        ...


class EdgeSiteDriver:
    """One edge site as a ClusterDriver (`name` is the site name)."""

    capabilities: frozenset[Capability] = frozenset({Capability.PREWARM})

    def __init__(self, *, site: str, transport: EdgeTransport, cpu: float, memory_gib: float,
                 gpu: int = 0, command_timeout_s: float = 5.0) -> None:
        self.name = site
        self._t = transport
        self._cpu, self._mem, self._gpu = cpu, memory_gib, gpu
        self._timeout_s = command_timeout_s
        self._applied: dict[str, ApplySpec] = {}
        self._prewarmed: set[str] = set()

    async def apply(self, *, spec: ApplySpec) -> None:
        service = {"name": spec.workload_id, "command": list(spec.command),
                   "env": dict(spec.env)}
        ack = await self._send("start", service=service)
        if not ack.get("ok"):
            raise ProviderError(f"site refused {spec.workload_id!r}: {ack.get('message', '')}",
                                provider="edge", region=self.name)
        self._applied[spec.workload_id] = spec

    async def prewarm(self, *, spec: PrewarmSpec) -> None:
        """The agent's prewarm command: it downloads (sha256-checked) and pulls in the
        background. Data without a sha256 cannot be verified by the agent and is refused."""
        unverifiable = [d.url for d in spec.data if not d.sha256]
        if unverifiable:
            raise ProviderError(f"edge prewarm needs a sha256 for every data set "
                                f"({', '.join(unverifiable)})", provider="edge",
                                region=self.name)
        data = [{"url": d.url, "sha256": d.sha256, "name": d.name,
                 "size_bytes": int(d.size_gb * 1e9) or None} for d in spec.data]
        ack = await self._send("prewarm", data=data, images=list(spec.images))
        if not ack.get("ok"):
            raise ProviderError(f"site refused prewarm {spec.key!r}: {ack.get('message', '')}",
                                provider="edge", region=self.name)
        self._prewarmed.add(spec.key)

    async def prewarm_done(self, *, key: str) -> bool:
        """True once the agent accepted the prewarm (it then runs on the site by itself and
        reports progress as `prewarm_progress` telemetry)."""
        if key not in self._prewarmed:
            raise NotFoundError(f"no prewarm {key!r}", provider="edge", region=self.name)
        return True

    async def delete(self, *, workload_id: str) -> None:
        await self._send("stop", service_name=workload_id)
        self._applied.pop(workload_id, None)

    async def status(self, *, workload_id: str) -> DriverStatus:
        states = self._t.site_services(site=self.name)
        if states is None:
            return DriverStatus(workload_id, WorkloadPhase.UNKNOWN, message="site not heard yet")
        state = states.get(workload_id)
        if state is None:
            if workload_id in self._applied:
                return DriverStatus(workload_id, WorkloadPhase.PENDING, 0, 1,
                                    "not in the site's heartbeat yet")
            raise NotFoundError(f"no workload {workload_id!r}", provider="edge",
                                region=self.name)
        phase = _PHASES.get(state, WorkloadPhase.UNKNOWN)
        ready = 1 if phase is WorkloadPhase.RUNNING else 0
        return DriverStatus(workload_id, phase, ready, 1, state)

    async def list_status(self) -> list[DriverStatus]:
        states = self._t.site_services(site=self.name) or {}
        return [DriverStatus(n, _PHASES.get(s, WorkloadPhase.UNKNOWN),
                             1 if _PHASES.get(s) is WorkloadPhase.RUNNING else 0, 1, s)
                for n, s in sorted(states.items())]

    async def inventory(self) -> list[NodeInventory]:
        return [NodeInventory(name=self.name, pool="edge", allocatable_cpu=self._cpu,
                              allocatable_memory_gib=self._mem, allocatable_gpu=self._gpu,
                              ready=self._t.site_services(site=self.name) is not None)]

    async def _send(self, kind: str, **kw: Any) -> Mapping[str, Any]:
        try:
            return await self._t.send_command(site=self.name, kind=kind,
                                              timeout_s=self._timeout_s, **kw)
        except TimeoutError as exc:
            raise TransientError(f"no ack for {kind} in {self._timeout_s} s",
                                 provider="edge", region=self.name) from exc
