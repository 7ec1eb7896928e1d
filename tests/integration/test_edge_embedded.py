"""The embedded amqtt broker with the real agent and hub code (the `skyfed demo` path)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from broker.domain import Resources, Site
from broker.federation.edge_hub import EdgeHub, EdgeService
from broker.federation.mqtt_embedded import EmbeddedBroker, broker_config
from broker.placement.standby import EdgeServiceNeed
from broker.settings import EdgeSettings, MqttSettings
from edge_agent.agent import AgentConfig, EdgeAgent
from edge_agent.protocol import ServiceSpec

pytestmark = pytest.mark.integration


def test_config_is_loopback_only_without_sys() -> None:
    cfg = broker_config(port=0)
    assert cfg["listeners"]["default"]["bind"] == "127.0.0.1:0"
    assert not any("sys" in p.lower() or "Logger" in p for p in cfg["plugins"])
    with pytest.raises(ValueError, match="loopback"):
        broker_config("0.0.0.0")


async def test_agents_and_hub_over_embedded_broker(tmp_path: Path) -> None:
    prefix = f"emb-{uuid.uuid4().hex[:8]}/v1"
    async with EmbeddedBroker(port=0) as broker:
        assert broker.port > 0
        stop = asyncio.Event()
        agents = [EdgeAgent(AgentConfig(site=s, port=broker.port, prefix=prefix,
                                        data_dir=tmp_path / s)) for s in ("a", "b")]
        hub = EdgeHub(settings=EdgeSettings(), mqtt=MqttSettings(url=broker.url), prefix=prefix)
        for s in ("a", "b"):
            hub.add_site(Site(s, 34.7, 135.5, capacity=Resources(4, 8)))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(hub.run(stop))
            for a in agents:
                tg.create_task(a.run(stop))
            deadline = time.monotonic() + 10
            while not all(hub.core.health(s).value == "healthy" for s in ("a", "b")):
                assert time.monotonic() < deadline, "agents never became healthy"
                await asyncio.sleep(0.02)
            await hub.add_service(EdgeService(EdgeServiceNeed("svc", 34.7, 135.5,
                                                              rtt_target_ms=100),
                                              ServiceSpec(name="svc")))
            state = hub.core.services["svc"]
            while not (state.routed and state.standby_ready):
                assert time.monotonic() < deadline, "service never got a route and standby"
                await asyncio.sleep(0.02)
            roles = {a.site: a.supervisor.state("svc") for a in agents}
            stop.set()
        assert sorted(roles.values()) == ["serving", "standby"]
        assert roles[state.primary] == "serving"
