"""Run and supervise the services the broker assigns to this site.

A service is either a local process (sites without Kubernetes) or, with an
empty command, a role the agent tracks for a workload that runs elsewhere on
the site. Either way it has a role: `standby` (started and warm, not serving
traffic) or `serving`. Promotion only flips the role (and optionally signals
the already-running process), which is why it takes microseconds, not the
seconds a cold start would.

The supervisor runs independently of the MQTT session: when the broker is
unreachable, services keep running and failed ones are restarted with
exponential backoff. Every change is reported through `on_event`, which the
agent journals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_agent.protocol import ServiceSpec, ServiceState

log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], None]


@dataclass
class _Service:
    spec: ServiceSpec
    role: ServiceState  # standby | serving (the desired role)
    state: ServiceState = "starting"
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    next_start_s: float = 0.0
    started_s: float = field(default_factory=time.monotonic)


class Supervisor:
    """Owns the local service processes. `run(stop)` is its one long-lived task."""

    def __init__(self, *, on_event: EventSink, check_every_s: float = 0.5,
                 backoff_max_s: float = 30.0) -> None:
        self._services: dict[str, _Service] = {}
        self._on_event = on_event
        self._check_every_s = check_every_s
        self._backoff_max_s = backoff_max_s
        self._wake = asyncio.Event()

    # queries
    def states(self) -> dict[str, ServiceState]:
        return {name: s.state for name, s in self._services.items()}

    def state(self, name: str) -> ServiceState | None:
        s = self._services.get(name)
        return None if s is None else s.state

    def pid(self, name: str) -> int | None:
        s = self._services.get(name)
        return None if s is None or s.proc is None else s.proc.pid

    # commands
    def start(self, spec: ServiceSpec, *, standby: bool) -> None:
        """Declare a service; the supervise loop starts it. Re-declaring updates it."""
        role: ServiceState = "standby" if standby else "serving"
        cur = self._services.get(spec.name)
        if cur is not None and cur.spec == spec:
            if cur.role != role:
                self._set_role(cur, role)
            return
        if cur is not None:
            self._kill(cur)
        svc = _Service(spec=spec, role=role)
        if not spec.command:
            svc.state = role
        self._services[spec.name] = svc
        self._on_event("service_declared", {"service": spec.name, "role": role})
        self._wake.set()

    def promote(self, name: str) -> bool:
        svc = self._services.get(name)
        if svc is None:
            return False
        self._set_role(svc, "serving")
        return True

    def demote(self, name: str) -> bool:
        svc = self._services.get(name)
        if svc is None:
            return False
        self._set_role(svc, "standby")
        return True

    def stop_service(self, name: str) -> bool:
        svc = self._services.pop(name, None)
        if svc is None:
            return False
        self._kill(svc)
        self._on_event("service_stopped", {"service": name})
        return True

    def _set_role(self, svc: _Service, role: ServiceState) -> None:
        svc.role = role
        if svc.state in ("standby", "serving"):
            svc.state = role
        if role == "serving" and svc.proc is not None and svc.spec.promote_signal:
            with contextlib.suppress(ProcessLookupError):
                svc.proc.send_signal(svc.spec.promote_signal)

    # supervision
    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self._check_all()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._check_every_s)
        finally:
            for svc in self._services.values():
                self._kill(svc)
            for svc in self._services.values():
                if svc.proc is not None:
                    with contextlib.suppress(TimeoutError, ProcessLookupError):
                        await asyncio.wait_for(svc.proc.wait(), 2.0)

    async def _check_all(self) -> None:
        now = time.monotonic()
        for svc in list(self._services.values()):
            if not svc.spec.command:
                continue
            if svc.proc is None or svc.proc.returncode is not None:
                if svc.proc is not None and svc.state != "failed":
                    svc.state = "failed"
                    delay = min(self._backoff_max_s, 0.2 * 2 ** min(svc.restarts, 10))
                    svc.next_start_s = now + delay
                    self._on_event("service_failed", {"service": svc.spec.name,
                                                      "exit_code": svc.proc.returncode,
                                                      "restart_in_s": round(delay, 3)})
                if now >= svc.next_start_s:
                    await self._spawn(svc)
            elif svc.state == "starting" and await self._healthy(svc):
                svc.state = svc.role
                self._on_event("service_ready", {"service": svc.spec.name, "role": svc.role,
                                                 "restarts": svc.restarts})

    async def _spawn(self, svc: _Service) -> None:
        restarted = svc.proc is not None
        env = {**os.environ, **svc.spec.env, "SKYFED_SERVICE": svc.spec.name,
               "SKYFED_ROLE": svc.role}
        try:
            svc.proc = await asyncio.create_subprocess_exec(
                *svc.spec.command, env=env, stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:
            svc.state = "failed"
            svc.restarts += 1
            svc.next_start_s = time.monotonic() + min(self._backoff_max_s, 2.0 ** svc.restarts)
            self._on_event("service_failed", {"service": svc.spec.name, "error": str(exc)})
            return
        svc.state = "starting"
        svc.started_s = time.monotonic()
        if restarted:
            svc.restarts += 1
            self._on_event("service_restarted", {"service": svc.spec.name,
                                                 "restarts": svc.restarts})
        if await self._healthy(svc):
            svc.state = svc.role
            self._on_event("service_ready", {"service": svc.spec.name, "role": svc.role,
                                             "restarts": svc.restarts})

    async def _healthy(self, svc: _Service) -> bool:
        if svc.proc is None or svc.proc.returncode is not None:
            return False
        port = svc.spec.health_tcp_port
        if port is None:
            return True
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.5)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    @staticmethod
    def _kill(svc: _Service) -> None:
        if svc.proc is not None and svc.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                svc.proc.kill()
