"""The bounds in one place (`broker/limits.py`) and what relies on them: the planner never
overflows on validated input, the cluster sanity check, repair-on-read, and the store's
error mapping (a killed connection is a retryable 503; a NUL is a 422, never a 503)."""

from __future__ import annotations

import math
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from broker import limits as lim
from broker.api.problems import error_response
from broker.api.schemas import ClusterIn, WorkloadIn
from broker.domain import (
    Cluster,
    FederationSnapshot,
    PolicyAction,
    Pool,
    Resources,
    Tenant,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.errors import SpecError, StoreError
from broker.placement.planner import PlannerConfig, plan_epoch
from broker.placement.sanity import partition
from broker.store.engine import mapped_errors
from broker.store.mapping import read_spec, spec_to_json
from edge_agent.protocol import ServiceSpec


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/v1/workloads", "headers": []})


def test_a_killed_connection_is_a_retryable_503() -> None:
    """asyncpg raises InternalClientError for the request caught in flight by
    pg_terminate_backend; on main it escaped the mapping and answered 500."""
    with pytest.raises(StoreError) as info, mapped_errors("list workloads"):
        raise asyncpg.InternalClientError("cannot perform operation: connection is closed")
    answer = error_response(_request(), info.value)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["content-type"] == "application/problem+json"


def test_a_value_the_database_refuses_is_a_422_not_a_503() -> None:
    with pytest.raises(SpecError) as info, mapped_errors("submit workload"):
        raise asyncpg.exceptions.CharacterNotInRepertoireError(
            "invalid byte sequence for encoding \"UTF8\": 0x00")
    assert error_response(_request(), info.value).status_code == 422


def test_check_json_refuses_what_no_encoder_or_database_can_keep() -> None:
    lim.check_json({"a": [1, 2.5, "x\ty", None, True, {"b": -(2**53)}]})
    for bad, where in [({"a": math.inf}, "a"), ({"a": [1, 10**20]}, "a[1]"),
                       ({"a": {"b": "x\u0000"}}, "a.b"), ({"k\u001b": 1}, "k"),
                       ({"a": float("nan")}, "a")]:
        with pytest.raises(ValueError, match=r"\w"):
            lim.check_json(bad)
        del where
    deep: Any = 1
    for _ in range(lim.JSON_DEPTH_MAX + 2):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper"):
        lim.check_json(deep)


def test_sanitize_json_repairs_and_names_every_change() -> None:
    clean, changed = lim.sanitize_json({"ts": 10**308, "n": 10**400, "ok": 5, "f": math.nan,
                                        "s": "a\u0000b", "l": [1, -(10**20)]})
    assert clean == {"ts": 1e308, "n": 1e308, "ok": 5, "f": None, "s": "a\ufffdb",
                     "l": [1, -1e20]}
    assert sorted(changed) == ["f", "l[1]", "n", "s", "ts"]


def test_read_spec_clips_an_old_row_to_todays_limits() -> None:
    spec = WorkloadSpec(name="old", kind=WorkloadKind.BATCH, image="x", replicas=1,
                        resources=Resources(1, 1, 0))
    raw = spec_to_json(spec) | {"duration_s": 10**300, "budget_usd_per_hour": 10**400,
                                "replicas": 10**30, "env": {"K": "v\u0000"},
                                "command": ["x" * 40_000] * 1200}
    repaired, changed = read_spec(raw)
    assert repaired.duration_s == lim.DURATION_S_MAX
    assert repaired.budget_usd_per_hour == lim.BUDGET_USD_PER_HOUR_MAX
    assert repaired.replicas == lim.REPLICAS_MAX
    assert repaired.env == {"K": "v\ufffd"}
    assert len(repaired.command) == lim.ENV_MAX
    assert {len(a) for a in repaired.command} == {lim.ARG_CHARS_MAX}
    # what an edge agent is sent from it fits the MQTT model
    ServiceSpec(name="w-1", command=repaired.command, env=dict(repaired.env))
    assert {"durationS", "budgetUsdPerHour", "replicas", "env.K", "command"} <= set(changed)
    assert read_spec(spec_to_json(spec)) == (spec, [])


def test_sanity_leaves_out_only_the_absurd_cluster() -> None:
    def cluster(name: str, **pool: Any) -> Cluster:
        p = Pool(**{"name": "p", "instance_type": "x", "node": Resources(8, 32), "nodes": 1,
                    "max_nodes": 2, "price_usd_per_hour": 0.2, **pool})
        return Cluster(name=name, provider="aws", region="r", pools=(p,))
    good, bad = partition([cluster("ok"), cluster("inf", price_usd_per_hour=math.inf),
                           cluster("nan", node=Resources(math.nan, 32)),
                           cluster("tiny", node=Resources(5e-324, 32)),
                           cluster("neg", nodes=-1)])
    assert [c.name for c in good] == ["ok"]
    assert set(bad) == {"inf", "nan", "tiny", "neg"}
    assert "priceUsdPerHour=inf" in bad["inf"]
    # The demand and release rates beside the pools are screened too (the net forecast).
    good, bad = partition([cluster("ok"), cluster("hot"), cluster("cold")],
                          {("hot", "p"): (math.nan, 0.0), ("ok", "p"): (0.5, 0.0)},
                          {("cold", "p"): (0.0, math.inf), ("ok", "p"): (0.4, 0.0)})
    assert [c.name for c in good] == ["ok"]
    assert "demandCpuPerS=nan" in bad["hot"]
    assert "freedGpuPerS=inf" in bad["cold"]


# The planner on anything the API accepts: extremes of every bound, and the tiny values
# (5e-324 CPUs, a 1e-300 price) that made its node and budget bounds overflow.
def _amount(hi: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 1e-9, 0.001, hi]),
                     st.floats(0, hi, allow_nan=False))


@st.composite
def hostile_snapshots(draw: st.DrawFn) -> FederationSnapshot:
    pools = [{"name": f"p{i}", "instanceType": "x",
              "node": {"cpu": draw(_amount(lim.CPU_MAX)),
                       "memory": draw(_amount(lim.MEMORY_GIB_MAX)),
                       "gpu": draw(st.sampled_from([0, 1, 8, lim.GPU_MAX]))},
              "nodes": draw(st.sampled_from([0, 1, lim.NODES_MAX])),
              "maxNodes": draw(st.sampled_from([0, 3, lim.NODES_MAX])),
              "priceUsdPerHour": draw(_amount(lim.PRICE_USD_PER_HOUR_MAX)),
              "pricing": draw(st.sampled_from(["on-demand", "spot"])),
              "reclaimRatePerHour": draw(_amount(lim.RECLAIM_RATE_PER_HOUR_MAX))}
             for i in range(draw(st.integers(1, 2)))]
    cluster = ClusterIn.model_validate({
        "name": "c1", "provider": draw(st.sampled_from(["aws", "onprem", "edge"])),
        "region": "r", "lat": 10.0, "lon": 20.0, "pools": pools,
        "quotaVcpu": draw(st.none() | _amount(lim.QUOTA_VCPU_MAX)),
        "quotaGpu": draw(st.none() | _amount(lim.QUOTA_GPU_MAX))}).to_domain()
    pending = []
    for j in range(draw(st.integers(1, 3))):
        spec = WorkloadIn.model_validate({
            "apiVersion": "skyfed.io/v1", "kind": "Workload", "metadata": {"name": f"w{j}"},
            "spec": {"kind": draw(st.sampled_from(["service", "batch", "train"])),
                     "image": "i", "replicas": draw(st.sampled_from([1, 3, lim.REPLICAS_MAX])),
                     "resources": {"cpu": draw(_amount(lim.CPU_MAX)),
                                   "memory": draw(_amount(lim.MEMORY_GIB_MAX)),
                                   "gpu": draw(st.sampled_from([0, 1, lim.GPU_MAX]))},
                     "durationS": draw(st.none() | st.sampled_from(
                         [5e-324, 1.0, lim.DURATION_S_MAX])),
                     "budgetUsdPerHour": draw(st.none() | _amount(lim.BUDGET_USD_PER_HOUR_MAX)),
                     "latencySloMs": draw(st.none() | st.sampled_from(
                         [5e-324, 1.0, lim.LATENCY_SLO_MS_MAX])),
                     "userRegion": "u", "imageGb": draw(_amount(lim.IMAGE_GB_MAX)),
                     "data": draw(st.sampled_from([[], [{"sizeGb": lim.DATA_GB_MAX,
                                                         "location": "aws:us-east-1"}]]))}}
        ).to_domain()
        pending.append(Workload(id=f"w{j}", tenant="t", spec=spec))
    budget = draw(st.none() | st.sampled_from([0.0, 1e-6, lim.BUDGET_USD_PER_HOUR_MAX]))
    return FederationSnapshot(now_s=0.0, clusters=(cluster,), pending=tuple(pending),
                              user_regions=(UserRegion("u", 11.0, 21.0),),
                              tenants=(Tenant("t", budget),))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=hostile_snapshots())
def test_the_planner_never_overflows_on_validated_input(snapshot: FederationSnapshot) -> None:
    # filterwarnings=error: numpy overflow/invalid warnings fail this test too
    plan = plan_epoch(snapshot, PolicyAction(), PlannerConfig(time_limit_s=1.0))
    for p in plan.placements:
        assert math.isfinite(p.cost_usd_per_hour)
    assert partition(snapshot.clusters)[1] == {}  # validated input is always fit to plan


def test_the_mqtt_models_keep_the_same_text_and_size_rules_as_the_api() -> None:
    """edge_agent may not import broker, so protocol.py keeps its own copy of the rules
    that a workload's env and command must pass on their way to an agent."""
    schema = ServiceSpec.model_json_schema()
    command, env = schema["properties"]["command"], schema["properties"]["env"]
    assert command["maxItems"] == env["maxProperties"] == lim.ENV_MAX
    assert command["items"]["maxLength"] == lim.ARG_CHARS_MAX
    assert command["items"]["pattern"] == lim.MULTILINE_PATTERN
    (value,) = env["patternProperties"].values()
    assert value["maxLength"] == lim.ARG_CHARS_MAX
    assert value["pattern"] == lim.MULTILINE_PATTERN
