"""Workload lifecycle (issue 14 part 3) through the API on a real store, applied to kmock:
PUT upsert by name (skyfed apply), PATCH merge patch, `{ref}` = id or name, watch (SSE)."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
import yaml
from kubernetes import client

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.clock import ManualClock
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.federation.runtime import Runtime
from broker.settings import PlacementSettings, load_settings
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)
from tests.integration.test_k8s_submit import _cluster
from tests.unit.test_k8s_manifests import NGINX

pytestmark = pytest.mark.integration
YAML = {"Content-Type": "application/yaml"}
NS = "skyfed"
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")


@dataclass
class World:
    c: httpx.AsyncClient
    auth: dict[str, str]
    rt: Runtime
    k: Any
    driver: KubernetesDriver
    clock: ManualClock

    async def settle(self) -> None:
        """One epoch, one dispatch pass, one reconcile pass."""
        await PlacementLoop(self.rt.store, self.clock, PlacementSettings(),
                            catalog=None).tick()
        drivers = {"cheap": self.driver}
        await Dispatcher(self.rt.store, drivers, self.clock).dispatch_once()
        await Reconciler(self.rt.store, drivers, self.clock).reconcile_once()

    def deployment(self, wid: str) -> dict[str, Any]:
        return dict(self.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].raw)


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:  # noqa: F811
    rt = build_runtime(load_settings(store={"url": db_url}, data_dir=tmp_path,
                                     api={"watch_poll_s": 0.05}))
    admin = await ensure_admin_token(rt)
    async with Emulator() as k, kmock.Server(k) as srv:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
        driver = KubernetesDriver("cheap", KubernetesOptions(namespace=NS, timeout_s=5),
                                  api_client=api)
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post("/v1/tokens", json={"tenant": "alice"},
                             headers={"Authorization": f"Bearer {admin}"})
            auth = {"Authorization": f"Bearer {r.json()['token']}"}
            r = await c.post("/v1/clusters", json=_cluster("cheap", 0.2), headers=auth)
            assert r.status_code == 201, r.text
            yield World(c, auth, rt, k, driver, ManualClock(1000.0))
        await asyncio.to_thread(api.close)
    assert denied(calls_of(k), namespace=NS) == []  # deploy/member-rbac.yaml grants each call
    await rt.store.close()


def _nginx(replicas: int, image: str = "nginx:1.14.2") -> str:
    doc = json.loads(json.dumps(NGINX))
    doc["spec"]["replicas"] = replicas
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return yaml.safe_dump(doc)


async def _put(w: World, body: str, ref: str = "nginx-deployment") -> httpx.Response:
    return await w.c.put(f"/v1/workloads/{ref}", content=body, headers={**w.auth, **YAML})


async def test_apply_with_changed_replicas_scales_the_same_workload(world: World) -> None:
    w = world
    r = await _put(w, _nginx(3))
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    await w.settle()
    assert w.deployment(wid)["spec"]["replicas"] == 3
    r = await _put(w, _nginx(3))  # the same again: nothing to do
    assert (r.status_code, r.json()["change"]) == (200, "unchanged")
    r = await _put(w, _nginx(5))
    assert (r.status_code, r.json()["id"], r.json()["change"]) == (200, wid, "replanned")
    await w.settle()
    assert w.deployment(wid)["spec"]["replicas"] == 5
    r = await _put(w, _nginx(2))  # fewer: in place, no re-plan
    assert r.json()["change"] == "scale-down"
    await w.settle()
    assert w.deployment(wid)["spec"]["replicas"] == 2
    listed = (await w.c.get("/v1/workloads", headers=w.auth)).json()["items"]
    assert [x["id"] for x in listed] == [wid]  # no duplicate
    r = await _put(w, _nginx(2, image="nginx:1.27"))  # only the pod template: a rollout
    assert r.json()["change"] == "rollout"
    await w.settle()
    pod = w.deployment(wid)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "nginx:1.27"


async def test_ref_is_an_id_or_a_name_and_patch_merges(world: World) -> None:
    w = world
    wid = (await _put(w, _nginx(3))).json()["id"]
    await w.settle()
    by_name = await w.c.get("/v1/workloads/nginx-deployment", headers=w.auth)
    assert by_name.json()["id"] == wid
    r = await w.c.patch(f"/v1/workloads/{wid}", json={"spec": {"replicas": 1}},
                        headers={**w.auth, "Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    assert (r.json()["spec"]["replicas"], r.json()["change"]) == (1, "scale-down")
    r = await w.c.patch("/v1/workloads/nginx-deployment",
                        json={"spec": {"image": "httpd"}}, headers=w.auth)
    assert r.status_code == 422  # the manifests own the pod template
    assert r.json()["errors"][0]["loc"] == ["body", "spec", "image"]
    r = await _put(w, _nginx(1), ref="w-0123456789abcdef")
    assert r.status_code == 404  # an id that does not exist
    bad = _nginx(1).replace("name: nginx-deployment", "name: w-0123456789abcdef", 1)
    r = await w.c.post("/v1/workloads", content=bad, headers={**w.auth, **YAML})
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", 0, "metadata", "name"]
    assert (await w.c.delete("/v1/workloads/nginx-deployment", headers=w.auth)).json()[
        "status"]["phase"] == "cancelled"


async def test_watch_streams_the_status_transitions(world: World) -> None:
    w = world

    async def watch() -> str:
        # ASGITransport hands the body over only when the stream ends, so the stream must
        # outlast the epoch, dispatch and reconcile below; 2 s did not on a loaded 2-core
        # machine (the stream ended at "pending").
        r = await w.c.get("/v1/workloads", params={"watch": "true", "timeoutSeconds": 6},
                          headers=w.auth)
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.text

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.3)
    wid = (await _put(w, _nginx(2))).json()["id"]
    await w.settle()
    w.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].patch({"status": {"readyReplicas": 2}})
    await Reconciler(w.rt.store, {"cheap": w.driver}, w.clock).reconcile_once()
    text = await watcher
    phases = [json.loads(line[6:])["status"]["phase"] for line in text.splitlines()
              if line.startswith("data: ")]
    assert phases[0] == "pending"
    assert "placed" in phases
    assert phases[-1] == "running"
    assert "event: MODIFIED" in text


async def test_conditions_and_per_cluster_replicas(world: World) -> None:
    w = world
    wid = (await _put(w, _nginx(2))).json()["id"]
    got = (await w.c.get(f"/v1/workloads/{wid}", headers=w.auth)).json()["status"]
    assert [(c["type"], c["status"], c["reason"]) for c in got["conditions"]] == [
        ("Scheduled", "False", "Pending"), ("Dispatched", "False", "NotScheduled"),
        ("Ready", "False", "NotScheduled"), ("Degraded", "False", "AsExpected")]
    await w.settle()
    w.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].patch({"status": {"readyReplicas": 1}})
    await Reconciler(w.rt.store, {"cheap": w.driver}, w.clock).reconcile_once()
    got = (await w.c.get("/v1/workloads/nginx-deployment", headers=w.auth)).json()["status"]
    conds = {c["type"]: c for c in got["conditions"]}
    assert (conds["Scheduled"]["status"], conds["Scheduled"]["message"]) == ("True", "on cheap")
    assert conds["Dispatched"]["reason"] == "Applied"
    assert got["clusters"] == [{"cluster": "cheap", "desired": 2, "ready": 1,
                                "phase": "pending", "message": ""}]
    assert conds["Ready"]["status"] == "False"
    w.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].patch({"status": {"readyReplicas": 2}})
    await Reconciler(w.rt.store, {"cheap": w.driver}, w.clock).reconcile_once()
    got = (await w.c.get("/v1/workloads/nginx-deployment", headers=w.auth)).json()["status"]
    conds = {c["type"]: c for c in got["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "Running")
    assert conds["Ready"]["message"] == "cheap 2/2"
    assert got["readyReplicas"] == 2


async def test_deleting_a_cluster_moves_its_workloads_elsewhere_first(world: World) -> None:
    """DELETE /v1/clusters/{name} drains: a migration (decision of the epoch, carried out by
    the actuator) starts the workload elsewhere, then the member is removed."""
    from broker.federation.actuator import Actuator
    from providers.simulated import SimPool, SimulatedClusterDriver

    w = world
    r = await w.c.post("/v1/clusters", json=_cluster("dear", 0.9), headers=w.auth)
    assert r.status_code == 201, r.text
    dear = SimulatedClusterDriver("dear", [SimPool("p", 2, 8, 32)], clock=w.clock.now)
    drivers: dict[str, Any] = {"cheap": w.driver, "dear": dear}
    wid = (await _put(w, _nginx(2))).json()["id"]
    await w.settle()
    w.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].patch({"status": {"readyReplicas": 2}})
    await Reconciler(w.rt.store, drivers, w.clock).reconcile_once()
    r = await w.c.delete("/v1/clusters/cheap", headers=w.auth)
    assert (r.status_code, r.json()["draining"], r.json()["workloads"]) == (202, True, 1)
    loop = PlacementLoop(w.rt.store, w.clock, PlacementSettings(), catalog=None)
    await loop.tick()
    assert loop.last_plan is not None
    [move] = loop.last_plan.migrations
    assert (move.workload_id, move.reason) == (wid, "drain")
    assert {a.cluster for a in move.target.assignments} == {"dear"}
    act = Actuator(w.rt.store, drivers, w.clock)
    await act.act_once()  # started on dear; cheap still serves
    assert (await dear.status(workload_id=wid)).ready_replicas == 2
    assert (DEPLOYMENTS, NS, f"skyfed-{wid}") in w.k.objects
    listed = [c["name"] for c in (await w.c.get("/v1/clusters", headers=w.auth)).json()[
        "items"]]
    assert "cheap" in listed  # not removed while its workload is there
    await act.act_once()  # switched
    await act.act_once()  # drained: deleted on cheap
    assert w.k.objects[DEPLOYMENTS, NS, f"skyfed-{wid}"].deleted
    await loop.tick()  # nothing left on cheap: removed
    listed = [c["name"] for c in (await w.c.get("/v1/clusters", headers=w.auth)).json()[
        "items"]]
    assert listed == ["dear"]
    got = (await w.c.get(f"/v1/workloads/{wid}", headers=w.auth)).json()
    assert got["status"]["phase"] == "running"
    assert {c["cluster"] for c in got["status"]["clusters"]} == {"dear"}


async def test_names_watches_and_drains_are_per_tenant(world: World) -> None:
    """Another tenant's workload of the same name is its own; a watch shows only the
    caller's workloads; a tenant cannot drain a member it did not register."""
    w = world
    admin = await ensure_admin_token(w.rt)  # None: it exists; make a second tenant instead
    assert admin is None
    async with w.rt.store.unit() as uow:
        _, token = await uow.tokens.create(tenant="bob")
    bob = {"Authorization": f"Bearer {token}"}
    mine = (await _put(w, _nginx(2))).json()["id"]
    r = await w.c.put("/v1/workloads/nginx-deployment", content=_nginx(4),
                      headers={**bob, **YAML})
    assert r.status_code == 201, r.text  # bob's own, not alice's changed
    theirs = r.json()["id"]
    assert theirs != mine
    r = await w.c.get("/v1/workloads", params={"watch": "true", "timeoutSeconds": 0},
                      headers=w.auth)
    ids = [json.loads(line[6:])["id"] for line in r.text.splitlines()
           if line.startswith("data: ")]
    assert ids == [mine]
    r = await w.c.get(f"/v1/workloads/{theirs}", headers=w.auth)
    assert r.status_code == 404
    r = await w.c.delete("/v1/clusters/cheap", headers=bob)
    assert r.status_code == 404
    listed = [c["name"] for c in (await w.c.get("/v1/clusters", headers=w.auth)).json()[
        "items"]]
    assert listed == ["cheap"]


async def test_watch_resumes_after_last_event_id_without_the_listing(world: World) -> None:
    w = world
    wid = (await _put(w, _nginx(2))).json()["id"]
    r = await w.c.get("/v1/workloads", params={"watch": "true", "timeoutSeconds": 1},
                      headers=w.auth)
    assert "event: ADDED" in r.text
    async with w.rt.store.unit() as uow:
        last = await uow.events.last_id()
    await w.settle()  # placed after `last`
    r = await w.c.get("/v1/workloads", params={"watch": "true", "timeoutSeconds": 1},
                      headers={**w.auth, "Last-Event-ID": str(last)})
    assert "event: ADDED" not in r.text
    ids = [int(line[4:]) for line in r.text.splitlines() if line.startswith("id: ")]
    assert ids
    assert min(ids) > last
    phases = [json.loads(line[6:])["status"]["phase"] for line in r.text.splitlines()
              if line.startswith("data: ")]
    assert "placed" in phases
    assert wid in r.text


async def test_a_scale_down_in_place_keeps_the_replicas_slo_sizing_added(
        tmp_path: Path) -> None:
    """The README tour's shop-frontend asks 3 replicas and the planner places 4 for its
    30 ms SLO under queueing (feasibility.size_for_slo). Scaled down to 2 in place, it keeps
    the added replica (3 placed, as the twin's scale event keeps them); shrinking to the
    asked 2 dropped it until the next re-plan. And it keeps both clusters of its spread."""
    from broker.app import start_up
    from broker.federation.placement_loop import make_placement_loop
    from tests.integration.test_drivers_wiring import _tour_documents

    url = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    from broker.store import migrate
    await migrate.upgrade(url)
    rt = build_runtime(load_settings(store={"url": url}, data_dir=tmp_path,
                                     policy={"checkpoint": "none"}))
    try:
        h = {"Authorization": f"Bearer {await ensure_admin_token(rt)}"}
        await start_up(rt)
        clusters, workloads = _tour_documents()
        [shop] = [d for d in workloads if d["metadata"]["name"] == "shop-frontend"]
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            for body in clusters:
                assert (await c.post("/v1/clusters", json=body, headers=h)).status_code == 201
            wid = (await c.post("/v1/workloads", json=shop, headers=h)).json()["id"]
            plan = await make_placement_loop(rt).tick()
            assert plan is not None
            assert plan.slo_extra_replicas == {wid: 1}
            [before] = plan.placements
            assert before.placed_replicas == 4
            r = await c.patch(f"/v1/workloads/{wid}", json={"spec": {"replicas": 2}},
                              headers={**h, "Content-Type": "application/merge-patch+json"})
            assert (r.status_code, r.json()["change"]) == (200, "scale-down"), r.text
            assert r.json()["spec"]["replicas"] == 2
            pid = r.json()["status"]["placementId"]
            after = (await c.get(f"/v1/placements/{pid}", headers=h)).json()
        assert sum(a["replicas"] for a in after["assignments"]) == 3
        # Spread over >= 2 clusters: the replica comes off the larger assignment.
        # Which of the two clusters gets 3 is the planner's price-vs-RTT call (it changed
        # with the latency weight); the scale-down's rule is what this test pins.
        placed = {a.cluster: a.replicas for a in before.assignments}
        assert sorted(placed.values()) == [1, 3]
        [larger] = [name for name, n in placed.items() if n == 3]
        expected = {(name, n - 1 if name == larger else n) for name, n in placed.items()}
        assert {(a["cluster"], a["replicas"]) for a in after["assignments"]} == expected
    finally:
        if rt.driver_registry is not None:
            await rt.driver_registry.aclose()
        await rt.store.close()


@pytest.mark.parametrize(("spread", "keep", "expected"), [
    (False, 3, [("a", 3)]),  # off the last assignments first
    (False, 5, [("a", 3), ("b", 2)]),
    (True, 3, [("a", 1), ("b", 1), ("c", 1)]),  # off the largest: every domain keeps one
    (True, 2, [("a", 1), ("b", 1)]),  # fewer than the domains: the later ones go first
    (True, 5, [("a", 2), ("b", 2), ("c", 1)]),
    (True, 0, []),
])
def test_a_shrunk_placement_keeps_a_spread_s_domains(spread: bool, keep: int,
                                                     expected: list[tuple[str, int]]) -> None:
    from broker.api.lifecycle import shrunk
    from broker.domain import Assignment, PricingModel

    placed = tuple(Assignment(cluster=c, pool="p", pricing=PricingModel.ON_DEMAND, replicas=n,
                              price_usd_per_hour=0.1) for c, n in (("a", 3), ("b", 2), ("c", 1)))
    got = shrunk(placed, keep, spread=spread)
    assert [(a.cluster, a.replicas) for a in got] == expected
