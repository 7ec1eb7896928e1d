"""Hostile MQTT messages through the real Mosquitto into the hub and the real store
(issue 13, finding 3: a telemetry message with `ts_ms: 1e308` from an unregistered site
was stored as an `edge.event` with tenant NULL, and `GET /v1/events` then answered 500
for every principal).

The hub must drop such messages (counted in `skyfed_mqtt_rejected_total`), store no
event for them, and still record what a registered site validly reports.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import aiomqtt
import pytest
from prometheus_client import REGISTRY

from broker.domain import Resources, Site
from broker.federation.edge_hub import EdgeHub, StoreRecorder
from broker.settings import EdgeSettings, MqttSettings
from broker.store import Store
from broker.store.migrate import drop_schema, upgrade
from edge_agent.protocol import Topics

pytestmark = pytest.mark.integration


def _rejected(kind: str, reason: str) -> float:
    return REGISTRY.get_sample_value("skyfed_mqtt_rejected_total",
                                     {"kind": kind, "reason": reason}) or 0.0


def _telemetry(site: str, event_id: str, ts_ms: str) -> bytes:
    return (f'{{"schema_version": 1, "site": "{site}", "kind": "service_failed", '
            f'"event_id": "{event_id}", "ts_ms": {ts_ms}, "data": {{"service": "web"}}}}'
            ).encode()


async def test_finding3_hostile_telemetry_is_dropped_counted_and_never_stored(
        pg_url: str, mqtt_addr: tuple[str, int]) -> None:
    url = f"{pg_url}?schema=t_mqtt_{uuid.uuid4().hex[:10]}"
    await upgrade(url)
    store = Store.from_url(url, pool_size=2)
    prefix = f"harden-{uuid.uuid4().hex[:8]}/v1"
    topics = Topics(prefix)
    hub = EdgeHub(settings=EdgeSettings(), prefix=prefix, recorder=StoreRecorder(store),
                  mqtt=MqttSettings(url=f"mqtt://{mqtt_addr[0]}:{mqtt_addr[1]}"))
    hub.add_site(Site("osaka", 34.69, 135.5, capacity=Resources(8, 32)))
    unregistered = _rejected("telemetry", "unregistered")
    invalid = _rejected("telemetry", "invalid")
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(hub.run(stop))
            try:
                await asyncio.wait_for(hub.connected.wait(), 10)
                async with aiomqtt.Client(*mqtt_addr,
                                          identifier=f"evil-{uuid.uuid4().hex[:8]}") as c:
                    await c.publish(topics.telemetry("ghost"), _telemetry("ghost", "g1", "1e308"),
                                    qos=1)
                    await c.publish(topics.telemetry("ghost"), _telemetry("ghost", "g2", "5"),
                                    qos=1)
                    await c.publish(topics.telemetry("osaka"), _telemetry("osaka", "o1", "1e308"),
                                    qos=1)
                    await c.publish(topics.telemetry("osaka"),
                                    _telemetry("osaka", "o2", "Infinity"), qos=1)
                    await c.publish(topics.telemetry("osaka"), _telemetry("osaka", "o3", "7"),
                                    qos=1)
                deadline = time.monotonic() + 10
                while True:
                    async with store.unit() as uow:
                        events = await uow.events.list(kind="edge.event")
                    if events or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)  # anything else that was going to be stored is
                async with store.unit() as uow:
                    events = await uow.events.list(kind="edge.event")
            finally:
                stop.set()
    finally:
        await store.close()
        await drop_schema(url)
    assert [(e.data["site"], e.data["event_id"], e.data["ts_ms"]) for e in events] == [
        ("osaka", "o3", 7.0)]
    assert all(json.dumps(e.data, allow_nan=False) for e in events)
    # validation comes first: ghost's 1e308 counts as invalid, its sane message as unregistered
    assert _rejected("telemetry", "unregistered") - unregistered == 1
    assert _rejected("telemetry", "invalid") - invalid == 3
