"""Real `skyfed-edge` agent processes for the demo: start, kill -9, stop.

Why processes and not in-process agents: the demo's failover must be the real
thing: a crashed agent's socket closes, the MQTT broker publishes its Last Will,
the hub notices. An agent task inside the broker's own process could not crash
on its own. Each agent logs to `<data_dir>/edge-<site>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path


def _die_with_parent() -> None:
    """Linux: SIGTERM this agent when the demo process dies (even by SIGKILL), so an
    interrupted demo never leaves agents retrying a vanished in-process MQTT broker."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def agent_command() -> list[str]:
    """`skyfed-edge` next to this interpreter, else `python -m edge_agent.cli`."""
    script = Path(sys.executable).with_name("skyfed-edge")
    if script.exists() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "edge_agent.cli"]


@dataclass
class AgentProcess:
    site: str
    proc: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


@dataclass
class AgentFleet:
    """Owns the agent processes; `close()` always reaps every one of them."""

    data_dir: Path
    broker_url: str
    heartbeat_ms: int = 100
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    retired: list[AgentProcess] = field(default_factory=list)

    async def start(self, site: str) -> AgentProcess:
        site_dir = self.data_dir / f"edge-{site}"
        site_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / f"edge-{site}.log"
        argv = [*agent_command(), "run", "--site", site, "--broker", self.broker_url,
                "--data-dir", str(site_dir), "--heartbeat-ms", str(self.heartbeat_ms),
                "--log-level", "WARNING"]
        with log_path.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, preexec_fn=_die_with_parent)
        agent = AgentProcess(site=site, proc=proc, log_path=log_path)
        if site in self.agents:  # a restart: keep the old process to reap it on close
            self.retired.append(self.agents[site])
        self.agents[site] = agent
        return agent

    def kill(self, site: str) -> None:
        """SIGKILL, like a power cut: no goodbye, the broker learns from the Last Will."""
        agent = self.agents[site]
        if agent.alive:
            agent.proc.send_signal(signal.SIGKILL)

    def exited_early(self) -> list[str]:
        """Sites whose agent died on its own (a bad flag, a crash at start)."""
        return [s for s, a in self.agents.items() if not a.alive]

    def log_tail(self, site: str, lines: int = 5) -> str:
        try:
            text = self.agents[site].log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    async def close(self, timeout_s: float = 5.0) -> None:
        everyone = [*self.agents.values(), *self.retired]
        for agent in everyone:
            if agent.alive:
                with contextlib.suppress(ProcessLookupError):
                    agent.proc.send_signal(signal.SIGTERM)
        for agent in everyone:
            try:
                await asyncio.wait_for(agent.proc.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    agent.proc.kill()
                await agent.proc.wait()
