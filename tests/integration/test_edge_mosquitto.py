"""A private Mosquitto with the shipped config (deploy/mosquitto/): ACLs and offline autonomy.

Each test starts its own `mosquitto` process on a free loopback port with the
shipped mosquitto.conf, password file (made by gen-passwords.sh) and ACL
(rendered for the test's unique topic prefix). The system Mosquitto on 1883 is
not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from edge_agent.agent import AgentConfig, EdgeAgent
from edge_agent.protocol import Ack, Command, ServiceSpec, Telemetry, Topics, decode, encode

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"
_SKIP_KEYS = {"listener", "password_file", "acl_file", "persistence", "persistence_location",
              "log_dest", "log_type", "autosave_interval", "certfile", "keyfile", "cafile",
              "tls_version"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    port: int
    conf: Path
    passwords: dict[str, str]
    prefix: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.2):
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"private mosquitto did not start: {err}")
            time.sleep(0.05)  # noqa: TID251 - sync fixture helper

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client(self, user: str, **kw: object) -> aiomqtt.Client:
        return aiomqtt.Client("127.0.0.1", self.port, username=user,
                              password=self.passwords[user],
                              identifier=f"{user}-{uuid.uuid4().hex[:6]}", **kw)  # type: ignore[arg-type]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if shutil.which("mosquitto") is None or shutil.which("mosquitto_passwd") is None:
        pytest.fail("mosquitto and mosquitto_passwd are required (apt-get install mosquitto)")
    prefix = f"acl{uuid.uuid4().hex[:8]}/v1"
    out = subprocess.run([str(DEPLOY / "gen-passwords.sh"), str(tmp_path / "passwd"),
                          "site-a", "site-b"], check=True, capture_output=True, text=True)
    passwords = dict(line.split() for line in out.stdout.splitlines())
    (tmp_path / "acl").write_text((DEPLOY / "acl").read_text().replace("skyfed/v1", prefix))
    port = _free_port()
    kept = [ln for ln in (DEPLOY / "mosquitto.conf").read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and ln.split()[0] not in _SKIP_KEYS]
    assert "set_tcp_nodelay true" in kept
    assert "allow_anonymous false" in kept
    conf = tmp_path / "mosquitto.conf"
    conf.write_text("\n".join([*kept, f"listener {port} 127.0.0.1",
                               f"password_file {tmp_path / 'passwd'}",
                               f"acl_file {tmp_path / 'acl'}", "persistence false",
                               "log_dest stderr",
                               # run as us: don't drop root to `mosquitto`, which cannot
                               # read pytest's private tmp dir
                               f"user {getpass.getuser()}"]) + "\n")
    b = Broker(port, conf, passwords, prefix)
    b.start()
    yield b
    b.stop()


async def _collect(client: aiomqtt.Client, into: list[tuple[str, bytes]]) -> None:
    async for m in client.messages:
        into.append((str(m.topic), bytes(m.payload) if isinstance(m.payload, bytes) else b""))


@contextlib.asynccontextmanager
async def _listening(client: aiomqtt.Client, topic: str, qos: int = 1
                     ) -> AsyncIterator[list[tuple[str, bytes]]]:
    got: list[tuple[str, bytes]] = []
    await client.subscribe(topic, qos=qos)
    task = asyncio.create_task(_collect(client, got))
    try:
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_acl_agent_publishes_only_as_itself(broker: Broker) -> None:
    t = Topics(broker.prefix)
    async with broker.client("skyfed-broker") as hub, broker.client("site-a") as a:
        async with _listening(hub, f"{broker.prefix}/#") as seen:
            await a.publish(t.heartbeat("site-b"), b"spoofed", qos=1)  # not its site
            await a.publish(t.commands("site-a"), b"self-command", qos=1)  # commands are hub's
            await a.publish(t.heartbeat("site-a"), b"own", qos=1)
            await asyncio.sleep(0.3)
        topics = {tp for tp, _ in seen}
        assert t.heartbeat("site-a") in topics
        assert t.heartbeat("site-b") not in topics
        assert t.commands("site-a") not in topics


async def test_acl_agent_reads_only_its_own_commands(broker: Broker) -> None:
    t = Topics(broker.prefix)
    async with broker.client("skyfed-broker") as hub, broker.client("site-a") as a:
        async with _listening(a, f"{broker.prefix}/sites/+/commands") as got:
            await hub.publish(t.commands("site-b"), b"for-b", qos=1)
            await hub.publish(t.commands("site-a"), b"for-a", qos=1)
            await asyncio.sleep(0.3)
        assert [p for _, p in got] == [b"for-a"]


async def test_wrong_password_is_refused(broker: Broker) -> None:
    broker.passwords["intruder"] = "nope"
    with pytest.raises(aiomqtt.MqttError):
        async with broker.client("intruder"):
            pass
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client("127.0.0.1", broker.port, username="site-a", password="bad"):
            pass


async def test_offline_autonomy_restart_and_journal_replay(broker: Broker, tmp_path: Path) -> None:
    """Broker down: the service keeps running and is restarted when it dies; on
    reconnect the journal is replayed once (no duplicates); a re-sent command
    id is answered from the journal, not executed twice."""
    t = Topics(broker.prefix)
    port = _free_port()
    spec = ServiceSpec(name="web", health_tcp_port=port,
                       command=(sys.executable, "-m", "http.server", str(port),
                                "--bind", "127.0.0.1"))
    cfg = AgentConfig(site="site-a", port=broker.port, username="site-a",
                      password=broker.passwords["site-a"], prefix=broker.prefix,
                      data_dir=tmp_path / "agent", reconnect_max_s=0.3, heartbeat_ms=50)
    agent = EdgeAgent(cfg)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.connected.wait(), 10)
        cmd = Command(command_id="cmd-1", site="site-a", kind="start", service=spec)
        async with broker.client("skyfed-broker") as hub:
            async with _listening(hub, t.acks("site-a")) as acks:
                await hub.publish(t.commands("site-a"), encode(cmd), qos=1)
                await _until(lambda: agent.supervisor.state("web") == "serving", 15)
                pid = agent.supervisor.pid("web")
                await hub.publish(t.commands("site-a"), encode(cmd), qos=1)  # redelivery
                await _until(lambda: len(acks) == 2, 5)
            first, second = (decode(Ack, p) for _, p in acks)
            assert first is not None
            assert first.ok
            assert not first.duplicate
            assert second is not None
            assert second.duplicate
            assert second.command_id == "cmd-1"
            assert agent.supervisor.pid("web") == pid  # not started twice

        broker.stop()  # the site is cut off from the broker
        await _until(lambda: not agent.connected.is_set(), 5)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the service dies while offline
        await _until(lambda: agent.supervisor.pid("web") not in (None, pid)
                     and agent.supervisor.state("web") == "serving", 15)
        assert agent.journal.count(sent=False) >= 2  # failed + restarted, not yet told

        broker.start()
        async with broker.client("skyfed-broker") as hub:
            async with _listening(hub, t.telemetry("site-a")) as tel:
                await _until(lambda: agent.journal.count(sent=False) == 0, 15)
                await asyncio.sleep(0.2)
            events = [e for e in (decode(Telemetry, p) for _, p in tel) if e is not None]
        replayed = [e for e in events if e.replayed]
        kinds = {e.kind for e in replayed}
        assert {"service_failed", "service_restarted"} <= kinds
        ids = [e.event_id for e in events]
        assert len(ids) == len(set(ids))  # each journal event sent once
    finally:
        stop.set()
        await asyncio.wait_for(run, 15)


async def _until(pred, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
