"""10,000 fuzzed MQTT payloads into the hub's core (through its inbox) and 10,000 into the
agent's message core: neither ever raises, and neither keeps or records garbage.

Payloads come from a seeded generator (`SEED`, so a failure reproduces): valid messages
of every kind from registered and unregistered sites, the same with fields replaced by
hostile values (`NaN`/`Infinity` literals, 1e308, 400-digit integers, NUL and escape
characters, 100k-character strings, wrong types, deep nesting), truncated and
non-object JSON, random bytes, and topics that disagree with the payload.

"Garbage" is checked against what the store and the wire accept: every record the hub
would persist passes `broker.limits.check_json` and encodes with orjson; the hub keeps
no state for sites it was not told about; every ack and every service the agent keeps
re-validates against its protocol model.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from broker.domain import Resources, Site
from broker.federation.edge_core import HubCore, Record
from broker.federation.edge_inbox import REJECTED, Inbox
from broker.limits import check_json
from broker.settings import EdgeSettings
from edge_agent.agent import AgentConfig, EdgeAgent
from edge_agent.protocol import Ack, ServiceSpec, Topics

SEED = 20261213
N = 10_000
PREFIX = "fz/v1"
REGISTERED = ["osaka", "kobe", "nara"]
STRANGERS = ["ghost", "evil+site", "x" * 300]
HOSTILE: list[Any] = [
    float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 10**400, -(10**30), 2**64, -1,
    0, "", "\u0000", "a\u0000b", "\u001b[2J", "x" * 100_000, None, True, [], {}, [1, [2, [3]]],
    {"schema_version": 1}, "1e308", 3.5, "online", "offline"]


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def _templates(site: str) -> dict[str, dict[str, Any]]:
    v = {"schema_version": 1}
    return {
        "status": {**v, "site": site, "state": "online", "ts_ms": 1.0, "session": 1},
        "heartbeat": {**v, "site": site, "seq": 3, "ts_ms": 2.0, "cpu_frac": 0.5,
                      "mem_frac": 0.25, "peer_rtt_ms": {"10.0.0.1:80": 1.5},
                      "services": {"web": "serving"}},
        "acks": {**v, "command_id": "c1", "site": site, "ok": True, "epoch": 1},
        "telemetry": {**v, "site": site, "kind": "service_failed", "ts_ms": 3.0,
                      "event_id": "e1", "data": {"service": "web", "code": 1}},
        "routes": {**v, "service": site, "site": "kobe", "epoch": 2},
        "commands": {**v, "command_id": "k1", "site": site, "kind": "start", "epoch": 1,
                     "service": {"name": "web", "command": [], "env": {"A": "1"}},
                     "standby": False},
        "echo": {**v, "site": site, "nonce": 5, "sent_ms": 4.0},
    }


def _mutate(rng: random.Random, doc: Any, depth: int = 0) -> Any:
    """`doc` with one to three values (at any depth) replaced by hostile ones."""
    if not isinstance(doc, dict) or not doc or depth > 3:
        return rng.choice(HOSTILE)
    out = dict(doc)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice([*out.keys(), "data", "services", "extra"])
        if key in out and isinstance(out[key], dict) and rng.random() < 0.4:
            out[key] = _mutate(rng, out[key], depth + 1)
        else:
            out[key] = rng.choice(HOSTILE)
    return out


def _payloads(rng: random.Random, kinds: list[str], sites: list[str]) -> Iterator[
        tuple[str, bytes]]:
    for _ in range(N):
        kind = rng.choice(kinds)
        site = rng.choice(sites)
        topic_site = site if rng.random() < 0.9 else rng.choice(sites)
        topic = (f"{PREFIX}/routes/{topic_site}" if kind == "routes"
                 else f"{PREFIX}/sites/{topic_site}/{kind}")
        if rng.random() < 0.03:
            topic = rng.choice([f"{PREFIX}/sites/{site}", "other/x", f"{PREFIX}/sites//acks",
                                f"{PREFIX}/sites/{site}/nope"])
        doc: Any = _templates(site)[kind]
        roll = rng.random()
        if roll < 0.3:
            body = json.dumps(doc).encode()
        elif roll < 0.75:
            body = json.dumps(_mutate(rng, doc)).encode()  # NaN/Infinity as JSON literals
        elif roll < 0.83:
            body = json.dumps(doc).encode()[:rng.randint(0, 40)]
        elif roll < 0.9:
            body = rng.choice([b"[]", b"null", b"42", b'"x"', _deep(100_000).encode(),
                               b'{"schema_version": 2}', b"\xff\xfe", b""])
        else:
            body = rng.randbytes(rng.randint(0, 64))
        yield topic, body


def test_hub_core_survives_10000_fuzzed_payloads_and_records_no_garbage() -> None:
    rng = random.Random(SEED)
    core = HubCore(EdgeSettings())
    for i, name in enumerate(REGISTERED):
        core.add_site(Site(name, 34.6 + i / 10, 135.5, capacity=Resources(8, 32)), 0.0)
    inbox = Inbox(core, Topics(PREFIX))
    before = _counted()
    records: list[Record] = []
    fed: Counter[str] = Counter()
    now = 0.0
    kinds = ["status", "heartbeat", "acks", "telemetry", "routes"]
    for topic, body in _payloads(rng, kinds, REGISTERED + STRANGERS):
        now += 7.0
        got = inbox.admit(topic, body, now)
        actions = [] if got is None else inbox.feed(got, now)
        if got is not None:
            fed[got.kind] += 1
        actions += core.tick(now)
        records += [a for a in actions if isinstance(a, Record)]
    assert set(core.sites) <= set(REGISTERED)  # nothing kept for strangers
    for rec in records:
        check_json(rec.data)  # finite, bounded, no control characters
        orjson.dumps(rec.data)
        if rec.kind == "edge_event":
            assert rec.data["site"] in REGISTERED
    assert {k for k, _ in inbox.rejected} >= set(kinds)
    assert {r for _, r in inbox.rejected} == {"invalid", "site_mismatch", "unregistered",
                                              "topic"}
    assert _counted() - before == sum(inbox.rejected.values())
    assert sum(inbox.rejected.values()) + sum(fed.values()) <= N
    assert min(fed[k] for k in kinds) > 50, fed  # valid traffic did get through
    assert any(r.kind == "edge_event" for r in records)


def _counted() -> float:
    """All drops so far, as Prometheus would scrape them."""
    return sum(s.value for m in REJECTED.collect() for s in m.samples
               if s.name == "skyfed_mqtt_rejected_total")


def test_agent_core_survives_10000_fuzzed_payloads_and_keeps_no_garbage(
        tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    agent = EdgeAgent(AgentConfig(site="osaka", prefix=PREFIX, data_dir=tmp_path))
    acks: list[bytes] = []
    try:
        for topic, body in _payloads(rng, ["commands", "echo"], ["osaka", "kobe", "x/y"]):
            acks += agent.receive(topic, body)
        state = agent.journal.state("svc/")
        services = agent.supervisor.states()
    finally:
        agent.journal.close()
    assert agent.stats.commands > 500  # valid commands did arrive
    assert acks, "no command was answered"
    for body in acks:
        ack = Ack.model_validate_json(body)
        assert ack.site == "osaka"
    for value in state.values():
        ServiceSpec.model_validate(value["spec"])
        assert 0 <= int(value["epoch"]) <= 2**53
    assert all(ServiceSpec.model_validate({"name": n}) for n in services)
