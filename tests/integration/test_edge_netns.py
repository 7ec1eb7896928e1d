"""Agents in Linux network namespaces: a real link cut (silent partition) and, where the
kernel has netem, real added delay for the RTT probes.

Needs root and a working `ip netns`; otherwise skipped with the reason. A private
mosquitto listens on the host end of a veth pair, so the agent inside the
namespace reaches it only through the link we cut. Namespaces are removed after.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from broker.domain import Resources, Site
from broker.federation.edge_hub import EdgeHub, EdgeService
from broker.placement.standby import EdgeServiceNeed
from broker.settings import EdgeSettings, MqttSettings
from edge_agent.agent import AgentConfig, EdgeAgent
from edge_agent.protocol import Heartbeat, ServiceSpec, Topics, decode

pytestmark = pytest.mark.integration


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("mosquitto") is None:
        return "needs iproute2 (ip) and mosquitto"
    probe = f"sfprobe{uuid.uuid4().hex[:6]}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Link:
    ns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    port: int
    netem_error: str | None = None

    def cut(self) -> None:
        _sh("ip", "link", "set", self.host_if, "down")

    def heal(self) -> None:
        _sh("ip", "link", "set", self.host_if, "up")


@pytest.fixture
def link(tmp_path: Path) -> Iterator[Link]:
    why = _netns_unavailable()
    if why:
        pytest.skip(f"network-namespace tests skipped: {why}")
    tag = uuid.uuid4().hex[:6]
    octet = int(tag[:2], 16) % 250 + 1
    lk = Link(ns=f"sfns{tag}", host_if=f"sfh{tag}", ns_if=f"sfn{tag}",
              host_ip=f"10.231.{octet}.1", ns_ip=f"10.231.{octet}.2", port=0)
    _sh("ip", "netns", "add", lk.ns)
    mosq: subprocess.Popen[bytes] | None = None
    try:
        _sh("ip", "link", "add", lk.host_if, "type", "veth", "peer", "name", lk.ns_if)
        _sh("ip", "link", "set", lk.ns_if, "netns", lk.ns)
        _sh("ip", "addr", "add", f"{lk.host_ip}/30", "dev", lk.host_if)
        _sh("ip", "link", "set", lk.host_if, "up")
        _sh("ip", "netns", "exec", lk.ns, "ip", "addr", "add", f"{lk.ns_ip}/30", "dev", lk.ns_if)
        _sh("ip", "netns", "exec", lk.ns, "ip", "link", "set", lk.ns_if, "up")
        _sh("ip", "netns", "exec", lk.ns, "ip", "link", "set", "lo", "up")
        r = _sh("ip", "netns", "exec", lk.ns, "tc", "qdisc", "add", "dev", lk.ns_if, "root",
                "netem", "delay", "25ms", check=False)
        lk.netem_error = None if r.returncode == 0 else (r.stderr.strip() or "tc failed")
        with socket.socket() as s:
            s.bind((lk.host_ip, 0))
            lk.port = int(s.getsockname()[1])
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(f"listener {lk.port} {lk.host_ip}\nallow_anonymous true\n"
                        f"set_tcp_nodelay true\npersistence false\nuser {getpass.getuser()}\n")
        mosq = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((lk.host_ip, lk.port), timeout=0.2).close()
                break
            except OSError:
                if mosq.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("private mosquitto did not start") from None
                time.sleep(0.05)  # noqa: TID251 - sync fixture
        yield lk
    finally:
        if mosq is not None:
            mosq.terminate()
            mosq.wait(10)
        _sh("ip", "link", "del", lk.host_if, check=False)
        _sh("ip", "netns", "del", lk.ns, check=False)


def _agent_in_ns(lk: Link, site: str, prefix: str, data_dir: Path
                 ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["ip", "netns", "exec", lk.ns, sys.executable, "-m", "edge_agent.cli", "run",
         "--site", site, "--broker", f"mqtt://{lk.host_ip}:{lk.port}", "--prefix", prefix,
         "--data-dir", str(data_dir), "--keepalive-s", "30", "--log-level", "ERROR"],
        cwd=Path(__file__).resolve().parents[2])


async def _until(pred, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_real_link_cut_fails_over_by_heartbeat_and_heals(link: Link,
                                                              tmp_path: Path) -> None:
    prefix = f"ns-{uuid.uuid4().hex[:8]}/v1"
    hub = EdgeHub(settings=EdgeSettings(suspect_after_ms=300, down_after_ms=600),
                  mqtt=MqttSettings(url=f"mqtt://{link.host_ip}:{link.port}"), prefix=prefix)
    hub.add_site(Site("cut", 34.69, 135.50, capacity=Resources(8, 32)))
    hub.add_site(Site("near", 34.70, 135.52, capacity=Resources(8, 32)))
    far = EdgeAgent(AgentConfig(site="near", host=link.host_ip, port=link.port, prefix=prefix,
                                data_dir=tmp_path / "near"))
    proc = _agent_in_ns(link, "cut", prefix, tmp_path / "cut")
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(hub.run(stop))
            tg.create_task(far.run(stop))
            try:
                await _until(lambda: all(hub.core.health(s).value == "healthy"
                                         for s in ("cut", "near")), 20)
                await hub.add_service(EdgeService(EdgeServiceNeed("web", 34.69, 135.50),
                                                  ServiceSpec(name="web")))
                st = hub.core.services["web"]
                await _until(lambda: st.routed == "cut" and st.standby_ready, 10)
                t0 = time.monotonic()
                link.cut()  # no FIN, no RST: the broker still holds the agent's socket
                await _until(lambda: st.routed == "near", 5)
                took_s = time.monotonic() - t0
                assert hub.core.failovers[-1].cause == "heartbeat"
                assert 0.5 < took_s < 2.5, f"partition failover took {took_s:.2f} s"
                link.heal()  # the same TCP session resumes: heartbeats flow again
                await _until(lambda: hub.core.health("cut").value == "healthy", 15)
                await _until(lambda: (st.standby == "cut" and st.standby_ready)
                             or st.routed == "cut", 10)
            finally:
                stop.set()
    finally:
        proc.terminate()
        proc.wait(10)


async def test_netem_delay_shows_in_rtt_probes(link: Link, tmp_path: Path) -> None:
    if link.netem_error:
        pytest.skip(f"tc netem unavailable in this kernel ({link.netem_error}); "
                    "RTT-under-delay test skipped")
    prefix = f"ns-{uuid.uuid4().hex[:8]}/v1"
    proc = _agent_in_ns(link, "slow", prefix, tmp_path / "slow")
    rtts: list[float] = []
    try:
        async with aiomqtt.Client(link.host_ip, link.port, identifier="rtt-watch") as c:
            await c.subscribe(Topics(prefix).heartbeat("slow"))
            async with asyncio.timeout(20):
                async for m in c.messages:
                    hb = decode(Heartbeat, m.payload) if isinstance(m.payload, bytes) else None
                    if hb is not None and hb.broker_rtt_ms is not None:
                        rtts.append(hb.broker_rtt_ms)
                        if len(rtts) >= 2:
                            break
    finally:
        proc.terminate()
        proc.wait(10)
    assert min(rtts) >= 25.0  # 25 ms added one way on the namespace's egress
