"""`replicaSplit: weighted` end to end (issue 14): the API accepts a PlacementPolicy's static
weight list or refuses it naming the field (storing nothing), and the placement loop +
dispatcher land each cluster's share on kmock's emulated members."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from broker.clock import ManualClock
from broker.federation.placement_loop import PlacementLoop
from broker.federation.runtime import Runtime
from broker.settings import PlacementSettings
from broker.store import Store
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)
from tests.integration.test_k8s_objects import (  # noqa: F401  (fixtures)
    DEPLOYMENTS,
    _cluster,
    _convert,
    _place_and_dispatch,
    members,
    store,
)
from tests.integration.test_k8s_submit import YAML, _yaml, api  # noqa: F401  (fixture)
from tests.unit.test_k8s_manifests import NGINX, POLICY

pytestmark = pytest.mark.integration
Api = tuple[httpx.AsyncClient, dict[str, str], Runtime]
WEIGHTS_LOC = ["body", 1, "spec", "placement", "weightPreference", "staticWeightList"]


def _policy(weights: dict[str, int], *, split: str = "weighted") -> dict[str, Any]:
    doc = copy.deepcopy(POLICY)
    doc["spec"] = {"resourceSelectors": POLICY["spec"]["resourceSelectors"], "placement": {
        "replicaSplit": split, "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": [name]}, "weight": w}
            for name, w in weights.items()]}}}
    return doc


def _nginx(replicas: int) -> dict[str, Any]:
    doc = copy.deepcopy(NGINX)
    doc["spec"]["replicas"] = replicas
    return doc


async def test_a_weighted_policy_is_stored_with_its_split_and_placed_by_it(
        api: Api) -> None:  # noqa: F811
    c, auth, rt = api
    r = await c.post("/v1/workloads", content=_yaml(NGINX, _policy({"cheap": 1, "dear": 2})),
                     headers={**auth, **YAML})
    assert r.status_code == 201, r.text
    spec = (await c.get(f"/v1/workloads/{r.json()['id']}", headers=auth)).json()["spec"]
    assert spec["replicaSplit"] == "weighted"
    assert [(e["targetCluster"]["clusterNames"], e["weight"]) for e in
            spec["staticWeightList"]] == [(["cheap"], 1), (["dear"], 2)]
    plan = await PlacementLoop(rt.store, ManualClock(1000.0), PlacementSettings(),
                               catalog=None).tick()
    assert plan is not None
    [placed] = plan.placements
    # 3 replicas at 1:2 (Karmada's Webster division), though "cheap" costs less than half.
    assert {a.cluster: a.replicas for a in placed.assignments} == {"cheap": 1, "dear": 2}
    # A merge patch of its replicas keeps the split (the view's weights are no Workload
    # fields: the stored ones carry over).
    r = await c.patch(f"/v1/workloads/{placed.workload_id}", json={"spec": {"replicas": 6}},
                      headers={**auth, "Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["replicas"] == 6
    assert r.json()["spec"]["staticWeightList"] == spec["staticWeightList"]


@pytest.mark.parametrize(("weights", "split", "loc"), [
    ({"nowhere": 1}, "weighted", [*WEIGHTS_LOC, 0, "targetCluster", "clusterNames", 0]),
    ({"cheap": 1, "elsewhere": 2}, "weighted",
     [*WEIGHTS_LOC, 1, "targetCluster", "clusterNames", 0]),
    ({"cheap": 0}, "weighted", [*WEIGHTS_LOC, 0, "weight"]),
    ({"cheap": 10**6}, "weighted", [*WEIGHTS_LOC, 0, "weight"]),
    ({"cheap": 1}, "cost", ["body", 1, "spec", "placement", "weightPreference"]),
])
async def test_bad_weights_name_the_field_and_store_nothing(
        api: Api, weights: dict[str, int], split: str,  # noqa: F811
        loc: list[Any]) -> None:
    c, auth, _ = api
    r = await c.post("/v1/workloads", content=_yaml(NGINX, _policy(weights, split=split)),
                     headers={**auth, **YAML})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == loc
    assert (await c.get("/v1/workloads", headers=auth)).json()["items"] == []


async def test_another_tenants_cluster_is_answered_like_an_unknown_one(
        api: Api) -> None:  # noqa: F811
    """alice's members are private to her: bob's weights naming one get the same 422 as a
    name that exists nowhere, so bob learns nothing about alice's clusters."""
    c, _, rt = api
    async with rt.store.unit() as uow:
        _, token = await uow.tokens.create(tenant="bob")
    bob = {"Authorization": f"Bearer {token}"}
    answers = []
    for name in ("cheap", "nowhere"):
        r = await c.post("/v1/workloads", content=_yaml(NGINX, _policy({name: 1})),
                         headers={**bob, **YAML})
        assert r.status_code == 422, r.text
        answers.append(r.json()["errors"][0]["msg"].replace(name, "X"))
    assert answers[0] == answers[1]


async def test_weighted_replicas_land_on_two_kmock_members(
        store: Store, members: Callable[[str], Any]) -> None:  # noqa: F811
    """10 replicas at a:3, b:1 -> 7 and 3 Deployment replicas on the two members, though
    "a" is the dearer one and "c", the cheapest, is on no weight list."""
    ka, da = await members("a")
    kb, db = await members("b")
    kc, dc = await members("c")
    wid = await _place_and_dispatch(
        store, [_cluster("a", ("p",), price=0.5), _cluster("b", ("p",), price=0.3),
                _cluster("c", ("p",), price=0.1)],
        _convert(_nginx(10), _policy({"a": 3, "b": 1})), {"a": da, "b": db, "c": dc})
    got = {}
    for name, k in (("a", ka), ("b", kb)):
        got[name] = sum(dict(obj.raw)["spec"]["replicas"] for key, obj in k.objects.items()
                        if key[0] == DEPLOYMENTS and not obj.deleted
                        and dict(obj.raw)["metadata"]["name"].startswith(f"skyfed-{wid}"))
    assert got == {"a": 7, "b": 3}
    assert not list(kc.objects)
