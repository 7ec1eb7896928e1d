"""One real agent on the real Mosquitto, driven by a raw MQTT client playing the hub."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiomqtt
import pytest

from edge_agent.agent import AgentConfig, EdgeAgent
from edge_agent.protocol import (
    Ack,
    Command,
    DataItem,
    Heartbeat,
    ServiceSpec,
    Status,
    Telemetry,
    Topics,
    decode,
    encode,
)

pytestmark = pytest.mark.integration
BLOB = b"edge data " * 10_000


@pytest.fixture
def http_url() -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.wfile.write(BLOB)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/data.bin"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
async def hub_view(mqtt_addr: tuple[str, int]) -> AsyncIterator[tuple[Topics, aiomqtt.Client,
                                                                      list[tuple[str, bytes]]]]:
    topics = Topics(f"agt-{uuid.uuid4().hex[:8]}/v1")
    got: list[tuple[str, bytes]] = []
    async with aiomqtt.Client(*mqtt_addr, identifier=f"hubview-{uuid.uuid4().hex[:6]}") as c:
        await c.subscribe(f"{topics.prefix}/#", qos=1)

        async def collect() -> None:
            async for m in c.messages:
                got.append((str(m.topic), bytes(m.payload) if isinstance(m.payload, bytes)
                            else b""))

        task = asyncio.create_task(collect())
        try:
            yield topics, c, got
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await c.publish(topics.status("s1"), b"", qos=1, retain=True)  # leave no retained


async def _until(pred, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _of(got: list[tuple[str, bytes]], topic: str, model):  # type: ignore[no-untyped-def]
    return [m for t, p in got if t == topic and (m := decode(model, p)) is not None]


async def test_agent_heartbeats_commands_prewarm_and_clean_stop(
        hub_view: tuple[Topics, aiomqtt.Client, list[tuple[str, bytes]]],
        mqtt_addr: tuple[str, int], http_url: str, tmp_path: Path) -> None:
    topics, hub, got = hub_view
    cfg = AgentConfig(site="s1", host=mqtt_addr[0], port=mqtt_addr[1], prefix=topics.prefix,
                      data_dir=tmp_path, heartbeat_ms=50, echo_every_s=0.1, load_every_s=0.2,
                      peers=(f"{mqtt_addr[0]}:{mqtt_addr[1]}", "127.0.0.1:1"),
                      probe_every_s=0.2)
    agent = EdgeAgent(cfg)
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        await _until(lambda: any(h.broker_rtt_ms for h in _of(got, topics.heartbeat("s1"),
                                                               Heartbeat)))
        await _until(lambda: any(h.peer_rtt_ms for h in _of(got, topics.heartbeat("s1"),
                                                             Heartbeat)))
        status = _of(got, topics.status("s1"), Status)
        assert status[0].state == "online"
        hb = [h for h in _of(got, topics.heartbeat("s1"), Heartbeat) if h.peer_rtt_ms][-1]
        assert 0 < (hb.broker_rtt_ms or 0) < 1000
        assert hb.rss_mb > 0
        assert list(hb.peer_rtt_ms) == [f"{mqtt_addr[0]}:{mqtt_addr[1]}"]  # :1 refused: left out

        await hub.publish(topics.commands("s1"), b"{garbage", qos=1)  # must not kill the agent
        sha = hashlib.sha256(BLOB).hexdigest()
        cmds = [Command(command_id="c-start", site="s1", kind="start", standby=True,
                        service=ServiceSpec(name="web")),
                Command(command_id="c-promote", site="s1", kind="promote", service_name="web",
                        epoch=1),
                Command(command_id="c-stale", site="s1", kind="promote", service_name="web",
                        epoch=0),
                Command(command_id="c-pre", site="s1", kind="prewarm",
                        data=(DataItem(url=http_url, sha256=sha, name="data.bin"),))]
        for c in cmds:
            await hub.publish(topics.commands("s1"), encode(c), qos=1)
        await _until(lambda: len(_of(got, topics.acks("s1"), Ack)) >= 4)
        acks = {a.command_id: a for a in _of(got, topics.acks("s1"), Ack)}
        assert acks["c-start"].ok
        assert acks["c-promote"].ok
        assert acks["c-promote"].done_ms
        assert not acks["c-stale"].ok
        assert acks["c-stale"].failed == ("web",)
        assert agent.supervisor.state("web") == "serving"
        await _until(lambda: any(t.kind == "prewarm_done"
                                 for t in _of(got, topics.telemetry("s1"), Telemetry)))
        assert (tmp_path / "cache" / "data.bin").read_bytes() == BLOB
        await _until(lambda: any(h.services.get("web") == "serving"
                                 for h in _of(got, topics.heartbeat("s1"), Heartbeat)))
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)
    await _until(lambda: _of(got, topics.status("s1"), Status)[-1].state == "offline", 5)
