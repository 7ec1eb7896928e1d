"""The agent/hub contract: topics, versioned models, decode never raising."""

from __future__ import annotations

import json
import logging

import pytest

from edge_agent.protocol import (
    QOS,
    Ack,
    Command,
    Heartbeat,
    Route,
    ServiceSpec,
    Status,
    Topics,
    decode,
    encode,
)


def test_topics_round_trip_through_parse() -> None:
    t = Topics("test/abc/")
    assert t.status("s1") == "test/abc/sites/s1/status"
    assert t.route("web") == "test/abc/routes/web"
    assert t.parse(t.heartbeat("s1")) == ("heartbeat", "s1")
    assert t.parse(t.route("web")) == ("routes", "web")
    assert t.parse("other/sites/s1/status") is None
    assert t.parse("test/abc/sites/s1/unknown") is None
    assert t.all_sites("acks") == "test/abc/sites/+/acks"


@pytest.mark.parametrize("bad", ["", "a/b", "a+", "#", "x\0"])
def test_topic_names_reject_wildcards(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid site/service name"):
        Topics().status(bad)


def test_encode_decode_round_trip() -> None:
    cmd = Command(command_id="c1", site="s1", kind="start",
                  service=ServiceSpec(name="web", command=("sleep", "1")), standby=True, epoch=3)
    back = decode(Command, encode(cmd))
    assert back == cmd
    assert back is not None
    assert back.service is not None
    assert back.service.command == ("sleep", "1")


@pytest.mark.parametrize("payload", [
    b"not json", b"[1,2]", b'{"schema_version": 2, "site": "s", "state": "online"}',
    b'{"site": "s", "state": "online"}', b'{"schema_version": 1, "site": "s", "state": "maybe"}',
    b"\xff\xfe",
])
def test_decode_drops_bad_payloads_and_logs(payload: bytes,
                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edge_agent.protocol"):
        assert decode(Status, payload) is None
    assert "dropping" in caplog.text


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    raw = json.loads(encode(Ack(command_id="c", site="s", ok=True)))
    raw["new_field_from_v1_1"] = 5
    assert decode(Ack, json.dumps(raw)) is not None


def test_qos_table_retains_only_status_and_routes() -> None:
    retained = {k for k, (_, retain) in QOS.items() if retain}
    assert retained == {"status", "routes"}
    assert QOS["heartbeat"][0] == 0
    assert QOS["commands"][0] == 1


def test_heartbeat_and_route_defaults() -> None:
    hb = Heartbeat(site="s", seq=1)
    assert hb.schema_version == 1
    assert hb.services == {}
    r = Route(service="web", site="s2", epoch=4)
    assert decode(Route, encode(r)) == r
