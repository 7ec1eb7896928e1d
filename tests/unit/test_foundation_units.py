"""Pure pieces of the foundation: request schemas and quantities, token hashing,
store URLs, the clock, loop supervision, the spec JSON mapping."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import ValidationError

from broker.api.schemas import ClusterIn, WorkloadIn, parse_cpu, parse_memory_gib
from broker.clock import ManualClock, SystemClock
from broker.domain import Interconnect, WorkloadKind
from broker.errors import ConfigError, ConflictError, NotFoundError, StoreError
from broker.federation.looping import supervise
from broker.store.auth import hash_token, new_token
from broker.store.engine import parse_store_url
from broker.store.mapping import spec_from_json, spec_sha256, spec_to_json
from broker.store.workloads import decode_cursor, encode_cursor

TRAIN: dict[str, Any] = {
    "apiVersion": "skyfed.io/v1", "kind": "Workload",
    "metadata": {"name": "llm", "labels": {"team": "r"}},
    "spec": {"kind": "train", "image": "pytorch", "replicas": 1,
             "resources": {"cpu": 96, "memory": "1024Gi", "gpu": 8, "gpuModel": "H100",
                           "interconnect": "nvlink-full"},
             "data": [{"sizeGb": 1200, "location": "gcp:us-central1"}],
             "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "spread": {"topology": "zone", "minDomains": 1}, "durationS": 3600},
}


@pytest.mark.parametrize(("raw", "gib"), [(4, 4), ("4Gi", 4), ("512Mi", 0.5), ("1Ti", 1024),
                                          ("2", 2), ("1G", 1e9 / 1024**3)])
def test_memory_quantities(raw: Any, gib: float) -> None:
    assert parse_memory_gib(raw) == pytest.approx(gib)


@pytest.mark.parametrize("raw", ["4Qi", "lots", "", "4 Gi Gi"])
def test_bad_memory_quantities_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="memory quantity"):
        parse_memory_gib(raw)


def test_cpu_quantities() -> None:
    assert parse_cpu("500m") == 0.5
    assert parse_cpu("2") == 2.0
    assert parse_cpu(3) == 3
    with pytest.raises(ValueError, match="CPU quantity"):
        parse_cpu("two")


def test_train_manifest_converts_to_domain() -> None:
    spec = WorkloadIn.model_validate(TRAIN).to_domain()
    assert spec.kind is WorkloadKind.TRAIN
    assert spec.resources.gpu == 8
    assert spec.resources.memory_gib == 1024
    assert spec.interconnect is Interconnect.NVLINK_FULL
    assert spec.data[0].size_gb == 1200
    assert spec.tolerations[0].operator == "Exists"
    assert spec.spread is not None
    assert spec.spread.topology == "zone"
    assert spec_from_json(spec_to_json(spec)) == spec


@pytest.mark.parametrize(("path", "value", "loc"), [
    (("spec", "replicas"), 0, ("spec", "replicas")),
    (("spec", "replicas"), -3, ("spec", "replicas")),
    (("spec", "kind"), "cron", ("spec", "kind")),
    (("spec", "resources"), {"gpu": -1}, ("spec", "resources", "gpu")),
    (("spec", "latencySloMs"), 0, ("spec", "latencySloMs")),
    (("metadata", "name"), "Bad_Name", ("metadata", "name")),
    (("apiVersion",), "v1", ("apiVersion",)),
    (("spec", "typo"), 1, ("spec", "typo")),
])
def test_invalid_manifests_name_the_field(path: tuple[str, ...], value: Any,
                                          loc: tuple[str, ...]) -> None:
    doc = {**TRAIN, "spec": dict(TRAIN["spec"]), "metadata": dict(TRAIN["metadata"])}
    target: dict[str, Any] = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    with pytest.raises(ValidationError) as err:
        WorkloadIn.model_validate(doc)
    assert tuple(err.value.errors()[0]["loc"]) == loc


def test_cluster_schema_defaults_max_nodes_to_nodes() -> None:
    c = ClusterIn.model_validate({
        "name": "c", "provider": "gcp", "region": "europe-west4",
        "pools": [{"name": "p", "instanceType": "n2-standard-8", "node": {"cpu": 8, "memory": 32},
                   "nodes": 3, "priceUsdPerHour": 0.38}]}).to_domain()
    assert c.pools[0].max_nodes == 3
    assert c.region_key == "gcp:europe-west4"


def test_tokens_are_random_and_hashed() -> None:
    a, b = new_token(), new_token()
    assert a != b
    assert a.startswith("sf_")
    assert len(a) > 40
    assert hash_token(a) == hash_token(a) != hash_token(b)
    assert len(hash_token(a)) == 64
    assert a not in hash_token(a)


def test_spec_hash_ignores_format_but_not_content() -> None:
    s = WorkloadIn.model_validate(TRAIN).to_domain()
    j = spec_to_json(s)
    assert spec_sha256(j) == spec_sha256(dict(reversed(list(j.items()))))
    assert spec_sha256(j) != spec_sha256({**j, "replicas": 2})


def test_spec_hash_bytes_do_not_depend_on_orjson() -> None:
    from broker.store import mapping

    j = spec_to_json(WorkloadIn.model_validate(TRAIN).to_domain())
    j["labels"] = {"owner": "zoë"}
    assert mapping._canonical(j) == mapping._canonical_stdlib(j)


def test_store_urls() -> None:
    su = parse_store_url("postgresql://u@h/db?schema=abc")
    assert su.url.drivername == "postgresql+asyncpg"
    assert su.schema == "abc"
    assert parse_store_url("sqlite:///x.db").url.drivername == "sqlite+aiosqlite"
    for bad in ("mysql://h/db", "postgresql://h/db?schema=a;drop", "sqlite:///x?schema=a",
                "not a url"):
        with pytest.raises(ConfigError):
            parse_store_url(bad)


def test_error_tree() -> None:
    assert issubclass(ConflictError, StoreError)
    assert ConflictError.status == 409
    e = NotFoundError(kind="workload", key="w-1")
    assert e.status == 404
    assert "w-1" in e.message


def test_cursor_roundtrip_and_garbage() -> None:
    assert decode_cursor(encode_cursor(12.5, "w-1")) == (12.5, "w-1")
    with pytest.raises(Exception, match="cursor"):
        decode_cursor("!!!")


async def test_manual_clock_wakes_sleepers_in_order() -> None:
    clock = ManualClock(100.0)
    woke: list[str] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append(name)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(sleeper("late", 5))
        tg.create_task(sleeper("early", 1))
        await asyncio.sleep(0)
        clock.advance(2)
        await asyncio.sleep(0)
        assert woke == ["early"]
        assert clock.now() == 102.0
        clock.advance(3)
    assert woke == ["early", "late"]
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    assert abs(SystemClock().now() - time.time()) < 5


class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.runs += 1
        if self.runs < 3:
            raise RuntimeError("boom")
        await stop.wait()


async def test_supervise_restarts_a_crashing_loop_and_stops(caplog: pytest.LogCaptureFixture,
                                                            ) -> None:
    loop, stop = Flaky(), asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(supervise(loop, stop, initial_backoff_s=0.01))
        for _ in range(200):
            if loop.runs >= 3:
                break
            await asyncio.sleep(0.01)
        stop.set()
    assert loop.runs == 3
    assert task.done()
    assert "loop flaky crashed" in caplog.text


def test_settings_default_to_sqlite_under_data_dir_and_env_overrides(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.settings import load_settings

    monkeypatch.setenv("SKYFED_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("SKYFED_STORE__URL", raising=False)
    monkeypatch.delenv("SKYFED_STORE_URL", raising=False)
    s = load_settings(data_dir=tmp_path)
    assert s.store_url == f"sqlite+aiosqlite:///{(tmp_path / 'skyfed.db').resolve()}"
    monkeypatch.setenv("SKYFED_STORE__URL", "postgresql+asyncpg://u@h/db")
    monkeypatch.setenv("SKYFED_API__MAX_BODY_BYTES", "2048")
    s = load_settings()
    assert s.store_url == "postgresql+asyncpg://u@h/db"
    assert s.api.max_body_bytes == 2048
