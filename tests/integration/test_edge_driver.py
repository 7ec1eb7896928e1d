"""providers/edge.py's EdgeSiteDriver over the hub's MQTT session, with a real agent."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import aiomqtt
import pytest

from broker.domain import Resources, Site
from broker.federation.edge_hub import EdgeHub
from broker.settings import EdgeSettings, MqttSettings
from edge_agent.agent import AgentConfig, EdgeAgent
from providers.base import ApplySpec, ClusterDriver, WorkloadPhase
from providers.edge import EdgeSiteDriver
from providers.errors import NotFoundError, TransientError

pytestmark = pytest.mark.integration


async def test_driver_applies_reports_and_deletes(mqtt_addr: tuple[str, int],
                                                  tmp_path: Path) -> None:
    prefix = f"drv-{uuid.uuid4().hex[:8]}/v1"
    url = f"mqtt://{mqtt_addr[0]}:{mqtt_addr[1]}"
    hub = EdgeHub(settings=EdgeSettings(), mqtt=MqttSettings(url=url), prefix=prefix)
    hub.add_site(Site("shop-1", 34.7, 135.5, capacity=Resources(8, 16)))  # the hub hears only
    # registered sites (edge_inbox.py)
    agent = EdgeAgent(AgentConfig(site="shop-1", host=mqtt_addr[0], port=mqtt_addr[1],
                                  prefix=prefix, data_dir=tmp_path, heartbeat_ms=50))
    driver = EdgeSiteDriver(site="shop-1", transport=hub, cpu=8, memory_gib=16,
                            command_timeout_s=3)
    assert isinstance(driver, ClusterDriver)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(hub.run(stop))
        tg.create_task(agent.run(stop))
        try:
            await asyncio.wait_for(agent.connected.wait(), 10)
            await asyncio.wait_for(hub.connected.wait(), 10)
            spec = ApplySpec(workload_id="w-1", tenant="t", name="w", kind="batch",
                             image="img", replicas=1, cpu=1, memory_gib=1)
            await driver.apply(spec=spec)
            await driver.apply(spec=spec)  # idempotent
            deadline = time.monotonic() + 5
            while (await driver.status(workload_id="w-1")).phase is not WorkloadPhase.RUNNING:
                assert time.monotonic() < deadline, "never reported running"
                await asyncio.sleep(0.05)
            assert [s.workload_id for s in await driver.list_status()] == ["w-1"]
            inv = await driver.inventory()
            assert inv[0].ready
            assert inv[0].allocatable_cpu == 8
            await driver.delete(workload_id="w-1")
            while "w-1" in (hub.site_services(site="shop-1") or {}):
                assert time.monotonic() < deadline + 5, "never removed"
                await asyncio.sleep(0.05)
            with pytest.raises(NotFoundError):
                await driver.status(workload_id="w-1")
            ghost = EdgeSiteDriver(site="nowhere", transport=hub, cpu=1, memory_gib=1,
                                   command_timeout_s=0.3)
            with pytest.raises(TransientError, match="no ack"):
                await ghost.apply(spec=spec)
        finally:
            stop.set()
    async with aiomqtt.Client(*mqtt_addr, identifier=f"clean-{uuid.uuid4().hex[:8]}") as c:
        await c.publish(f"{prefix}/sites/shop-1/status", b"", qos=1, retain=True)
