"""Commands from the edge hub to agents, kept until acked: the delivery half of `HubCore`.

Every decision of the hub (serve, standby, prewarm, promote, stop) goes out the same way:
a command with a fresh id, remembered as a `PendingCommand` with what its ack settles
(`purpose`: serve | standby | prewarm; nothing is remembered for a plain stop), re-sent
with the SAME id when its ack is late (agents de-duplicate), with exponential backoff so a
loaded agent or broker is not buried under re-sends, and forgotten when its site is down
(the failover that follows decides anew). Promotes for one site decided in one step go out
as one command: a failover burst costs one message per target site, not one per service.
Pure and synchronous like `HubCore`, which owns one `CommandBook`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace

from broker.federation.edge_state import Action, PendingCommand, Send, ServiceState
from edge_agent.protocol import Command

RESEND_MAX_MS = 30_000.0


class CommandBook:
    """Pending commands by id; see the module docstring."""

    def __init__(self, *, timeout_ms: float = 2000.0) -> None:
        self.pending: dict[str, PendingCommand] = {}
        self.timeout_ms = timeout_ms

    def start(self, state: ServiceState, site: str, *, standby: bool, now_ms: float) -> Send:
        """Start `state`'s service at `site`, serving or as its warm standby."""
        state.told.add(site)
        return self.command(state, site, "start", now_ms,
                            purpose="standby" if standby else "serve", standby=standby)

    def command(self, state: ServiceState, site: str, kind: str, now_ms: float, *,
                purpose: str, standby: bool = False) -> Send:
        """A `kind` command for `state`'s service at its current epoch; kept until acked
        when it has a `purpose`."""
        svc = state.svc
        cmd = Command.model_validate({
            "command_id": uuid.uuid4().hex, "site": site, "kind": kind, "ts_ms": now_ms,
            "service": svc.spec if kind == "start" else None, "service_name": svc.spec.name,
            "standby": standby, "epoch": state.epoch,
            "data": svc.data if kind == "prewarm" else (),
            "images": svc.images if kind == "prewarm" else ()})
        if purpose:
            self.pending[cmd.command_id] = PendingCommand(cmd, svc.spec.name, purpose, now_ms,
                                                          created_ms=now_ms)
        return Send(site, cmd)

    def mark_sent(self, command_id: str, now_ms: float) -> None:
        """The shell published the command: its ack timeout starts now, not at queueing."""
        p = self.pending.get(command_id)
        if p is not None:
            p.sent_ms = now_ms

    def take(self, command_id: str) -> PendingCommand | None:
        """The pending command an ack answers (None: unknown, or already settled)."""
        return self.pending.pop(command_id, None)

    def resends(self, now_ms: float, site_down: Callable[[str], bool]) -> list[Action]:
        """Late commands again (same id); commands to a down site are dropped."""
        out: list[Action] = []
        for cid, p in list(self.pending.items()):
            # back off: a loaded agent or broker must not be buried under re-sends
            timeout_ms = min(RESEND_MAX_MS, self.timeout_ms * 2 ** p.attempts)
            if now_ms - p.sent_ms > timeout_ms:
                if site_down(p.command.site):
                    del self.pending[cid]
                    continue
                p.sent_ms = now_ms
                p.attempts += 1
                out.append(Send(p.command.site, p.command))  # same id: agents de-duplicate
        return out

    def batch_promotes(self, actions: list[Action]) -> list[Action]:
        """One promote command per target site (promotes first, in site order)."""
        groups: dict[str, list[Send]] = {}
        rest: list[Action] = []
        for a in actions:
            if isinstance(a, Send) and a.command.kind == "promote":
                groups.setdefault(a.site, []).append(a)
            else:
                rest.append(a)
        out: list[Action] = []
        for site, sends in groups.items():
            if len(sends) == 1:
                out.append(sends[0])
                continue
            parts = [self.pending.pop(x.command.command_id) for x in sends]
            cmd = sends[0].command.model_copy(update={
                "command_id": uuid.uuid4().hex, "service_name": "",
                "services": {p.service: p.command.epoch for p in parts}})
            self.pending[cmd.command_id] = replace(parts[0], command=cmd,
                                                   batch=tuple(p.service for p in parts))
            out.append(Send(site, cmd))
        return out + rest
