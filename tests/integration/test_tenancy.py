"""Tenancy (issue 13, item 2; findings 2 and 6) through the API on PostgreSQL and SQLite.

Finding 2: tenants placed onto each other's clusters, and other tenants' cluster names
leaked through placement, explain, events, what-if (200 vs 422) and an unauthenticated
/metrics. Finding 6: no token list/revoke, two roles only, budgets per epoch only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.clock import ManualClock
from broker.federation.placement_loop import PlacementLoop
from broker.federation.quota_sync import QuotaSync
from broker.federation.runtime import Runtime
from broker.settings import PlacementSettings, load_settings
from broker.store.models import TenantRow
from tests.integration.test_foundation_store import db_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

H = dict[str, str]


def cluster(name: str, price: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "provider": "aws", "region": "us-east-1", **extra,
            "pools": [{"name": "cpu", "instanceType": "m5.xlarge",
                       "node": {"cpu": 4, "memory": "16Gi"}, "nodes": 2, "maxNodes": 2,
                       "priceUsdPerHour": price}]}


def job(name: str, cpu: float = 1.0) -> dict[str, Any]:
    return {"apiVersion": "skyfed.io/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"kind": "batch", "image": "busybox:1", "replicas": 1, "durationS": 3600,
                     "resources": {"cpu": cpu, "memory": "1Gi"}}}


@dataclass
class World:
    c: httpx.AsyncClient
    rt: Runtime
    admin: H
    alice: H
    bob: H
    carol: H

    async def operator(self) -> H:
        return await _token(self.c, self.admin, "ops", "operator")


async def _token(c: httpx.AsyncClient, admin: H, tenant: str, role: str | None = None) -> H:
    r = await c.post("/v1/tokens", json={"tenant": tenant} | ({"role": role} if role else {}),
                     headers=admin)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:  # noqa: F811
    # The shipped checkpoint, for the test that installs a learned policy (the default is
    # the fixed weights, which record no observation).
    rt = build_runtime(load_settings(store={"url": db_url}, data_dir=tmp_path,
                                     policy={"checkpoint": "shipped"}))
    admin_token = await ensure_admin_token(rt)
    admin = {"Authorization": f"Bearer {admin_token}"}
    transport = httpx.ASGITransport(app=create_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield World(c, rt, admin, *[await _token(c, admin, t) for t in ("alice", "bob", "carol")])
    await rt.store.close()


async def _placed_on(w: World, h: H, name: str) -> tuple[str, list[str]]:
    """Submit `name` as `h`, run one placement epoch; (placement id, its clusters)."""
    r = await w.c.post("/v1/workloads", json=job(name), headers=h)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    loop = PlacementLoop(w.rt.store, ManualClock(1000.0), PlacementSettings(), catalog=None)
    await loop.tick()
    pid = (await w.c.get(f"/v1/workloads/{wid}", headers=h)).json()["status"]["placementId"]
    if pid is None:
        return "", []
    placement = (await w.c.get(f"/v1/placements/{pid}", headers=h)).json()
    return str(pid), sorted({a["cluster"] for a in placement["assignments"]})


async def _register(w: World, **alice_extra: Any) -> None:
    """alice: a $0.001/h cluster of her own; the admin: a federation-wide one."""
    r = await w.c.post("/v1/clusters", json=cluster("alice-cheap", 0.001, **alice_extra),
                       headers=w.alice)
    assert r.status_code == 201, r.text
    r = await w.c.post("/v1/clusters", json=cluster("fed-aws", 0.192), headers=w.admin)
    assert r.status_code == 201, r.text


async def test_finding2_a_tenant_is_never_placed_on_another_tenants_private_cluster(
        world: World) -> None:
    await _register(world)
    _, bob = await _placed_on(world, world.bob, "bob-job")
    _, alice = await _placed_on(world, world.alice, "alice-job")
    assert bob == ["fed-aws"]  # not the 0.001 USD/h cluster alice registered
    assert alice == ["alice-cheap"]


async def test_a_tenant_lends_its_cluster_to_named_tenants_only(world: World) -> None:
    await _register(world, lendTo=["carol"])
    mine = (await world.c.get("/v1/clusters", headers=world.alice)).json()["items"]
    assert [(c["name"], c["shared"], c["lentTo"]) for c in mine] == [
        ("alice-cheap", False, ["carol"])]
    fed = (await world.c.get("/v1/clusters/fed-aws", headers=world.admin)).json()
    assert fed["shared"] is True
    _, carol = await _placed_on(world, world.carol, "carol-job")
    _, bob = await _placed_on(world, world.bob, "bob-job")
    assert carol == ["alice-cheap"]  # lent to carol by name
    assert bob == ["fed-aws"]
    r = await world.c.post("/v1/clusters", json=cluster("op-fed", 0.05),
                           headers=await world.operator())
    assert r.status_code == 201
    _, bob2 = await _placed_on(world, world.bob, "bob-job-2")
    assert bob2 == ["op-fed"]  # an operator's registration is federation-wide


async def test_finding2_names_do_not_leak_through_explain_events_whatif_or_get(
        world: World) -> None:
    await _register(world)
    pid, _ = await _placed_on(world, world.bob, "bob-job")
    assert pid
    r = await world.c.get(f"/v1/placements/{pid}/explain", headers=world.bob)
    assert r.status_code == 200
    assert "alice-cheap" not in r.text
    assert r.json()["decision"]["options"] == 1  # fed-aws/cpu: the only one bob may see
    events = (await world.c.get("/v1/events", headers=world.bob)).text
    assert "alice-cheap" not in events
    assert "workload.placed" in events

    async def whatif(name: str) -> httpx.Response:
        return await world.c.post(f"/v1/placements/{pid}/whatif", json={"cluster": name},
                                  headers=world.bob)

    foreign, missing = await whatif("alice-cheap"), await whatif("no-such-one")
    assert foreign.status_code == missing.status_code == 422
    assert foreign.json()["detail"].replace("alice-cheap", "X") == \
        missing.json()["detail"].replace("no-such-one", "X")
    own = await world.c.post(f"/v1/placements/{pid}/whatif", json={"cluster": "fed-aws"},
                             headers=world.bob)
    assert own.status_code == 200, own.text
    foreign_get = await world.c.get("/v1/clusters/alice-cheap", headers=world.bob)
    missing_get = await world.c.get("/v1/clusters/no-such-one", headers=world.bob)
    assert foreign_get.status_code == missing_get.status_code == 404


async def test_finding2_metrics_without_a_token_name_no_tenant_or_cluster(
        world: World) -> None:
    await _register(world)
    await _placed_on(world, world.alice, "alice-job")
    await QuotaSync(world.rt.store, [], ManualClock(1000.0)).sync_once()  # burn-rate gauges
    r = await world.c.get("/metrics")
    assert r.status_code == 200
    for name in ("alice", "alice-cheap", "fed-aws", "carol"):
        assert name not in r.text
    assert 'skyfed_burn_rate_usd_per_hour{provider="aws"}' in r.text  # the aggregate stays


async def test_operator_registers_federation_wide_members_and_nothing_admin(
        world: World) -> None:
    operator = await world.operator()
    r = await world.c.post("/v1/clusters", json=cluster("op-x", 0.1, lendTo=["bob"]),
                           headers=operator)
    assert r.status_code == 422
    assert r.json()["errors"][0]["loc"] == ["body", "lendTo"]
    for method, path, body in (("POST", "/v1/tokens", {"tenant": "x"}),
                               ("PUT", "/v1/tenants/bob/budget", {"budgetUsdPerHour": 1})):
        for who in (operator, world.alice):
            r = await world.c.request(method, path, json=body, headers=who)
            assert r.status_code == 403, (path, r.text)
    r = await world.c.post("/v1/tokens", json={"tenant": "x", "role": "root"},
                           headers=world.admin)
    assert r.status_code == 422


async def test_finding6_tokens_list_and_revoke(world: World) -> None:
    await world.operator()
    listed = (await world.c.get("/v1/tokens", headers=world.admin)).json()["items"]
    assert {(t["tenant"], t["role"]) for t in listed} >= {
        ("admin", "admin"), ("ops", "operator"), ("alice", "tenant"), ("bob", "tenant")}
    assert all("token" not in t for t in listed)
    own = (await world.c.get("/v1/tokens", headers=world.alice)).json()["items"]
    assert [t["tenant"] for t in own] == ["alice"]
    bob_id = next(t["id"] for t in listed if t["tenant"] == "bob")
    alice_id = own[0]["id"]
    r = await world.c.delete(f"/v1/tokens/{bob_id}", headers=world.alice)
    assert r.status_code == 404  # another tenant's token: as if it did not exist
    assert (await world.c.get("/v1/workloads", headers=world.bob)).status_code == 200
    r = await world.c.delete(f"/v1/tokens/{alice_id}", headers=world.alice)
    assert r.status_code == 200
    assert r.json()["revoked"] is True
    assert (await world.c.get("/v1/workloads", headers=world.alice)).status_code == 401
    r = await world.c.delete(f"/v1/tokens/{bob_id}", headers=world.admin)
    assert r.json()["revoked"] is True
    assert (await world.c.get("/v1/workloads", headers=world.bob)).status_code == 401


async def test_finding6_tokens_expire(world: World) -> None:
    r = await world.c.post("/v1/tokens", json={"tenant": "dave", "expiresInS": 3600},
                           headers=world.admin)
    assert r.status_code == 201
    async with world.rt.store.unit() as uow:
        now = uow.now
        _, stale = await uow.tokens.create(tenant="dave", expires_s=now - 1.0)
    assert abs(r.json()["expiresS"] - (now + 3600)) < 60
    fresh = {"Authorization": f"Bearer {r.json()['token']}"}
    assert (await world.c.get("/v1/workloads", headers=fresh)).status_code == 200
    expired = {"Authorization": f"Bearer {stale}"}
    assert (await world.c.get("/v1/workloads", headers=expired)).status_code == 401
    r = await world.c.post("/v1/tokens", json={"tenant": "dave", "expiresInS": 0},
                           headers=world.admin)
    assert r.status_code == 422


async def test_finding6_budget_set_get_and_refused_values(world: World) -> None:
    r = await world.c.put("/v1/tenants/alice/budget", json={"budgetUsdPerHour": 0.05},
                          headers=world.admin)
    assert r.status_code == 200, r.text
    got = (await world.c.get("/v1/tenants/alice/budget", headers=world.alice)).json()
    assert got["budgetUsdPerHour"] == 0.05
    assert got["committedUsdPerHour"] == 0.0
    assert got["leftUsdPerHour"] == 0.05
    assert (await world.c.get("/v1/tenants/alice/budget", headers=world.bob)).status_code == 404
    for raw in ('{"budgetUsdPerHour": Infinity}', '{"budgetUsdPerHour": 1e400}',
                '{"budgetUsdPerHour": -1}', '{"budgetUsdPerHour": NaN}'):
        r = await world.c.put("/v1/tenants/alice/budget", content=raw,
                              headers={**world.admin, "Content-Type": "application/json"})
        assert r.status_code == 422, raw
        assert r.json()["errors"][0]["loc"][-1] == "budgetUsdPerHour"
    got = (await world.c.get("/v1/tenants/alice/budget", headers=world.admin)).json()
    assert got["budgetUsdPerHour"] == 0.05  # nothing stored by the refused ones
    r = await world.c.put("/v1/tenants/alice/budget", json={"budgetUsdPerHour": None},
                          headers=world.admin)
    assert r.json()["budgetUsdPerHour"] is None


async def test_finding6_budget_holds_across_epochs(world: World) -> None:
    """Five 0.031 USD/h workloads, one per epoch, under a 0.05 USD/h cap: one runs."""
    body = cluster("fed-small", 0.031)
    body["pools"][0]["node"] = {"cpu": 1, "memory": "4Gi"}
    body["pools"][0]["nodes"] = body["pools"][0]["maxNodes"] = 8
    assert (await world.c.post("/v1/clusters", json=body, headers=world.admin)
            ).status_code == 201
    async with world.rt.store.unit() as uow:  # (the row, as the PUT below writes it)
        await uow.session.execute(update(TenantRow).where(TenantRow.name == "bob")
                                  .values(budget_usd_per_hour=0.05))
    placed = [(await _placed_on(world, world.bob, f"b{i}"))[1] for i in range(5)]
    assert placed.count(["fed-small"]) == 1
    assert placed.count([]) == 4
    r = await world.c.put("/v1/tenants/bob/budget", json={"budgetUsdPerHour": 0.05},
                          headers=world.admin)
    assert r.status_code == 200
    got = (await world.c.get("/v1/tenants/bob/budget", headers=world.bob)).json()
    assert got["committedUsdPerHour"] == pytest.approx(0.031)
    assert got["leftUsdPerHour"] == pytest.approx(0.019)
    assert got["spentUsd"] >= 0.0


async def test_spend_to_date_integrates_the_run_rate(world: World) -> None:
    await _register(world)
    await _placed_on(world, world.alice, "alice-job")
    async with world.rt.store.unit() as uow:
        committed, _ = await uow.tenants.spend("alice")
        placements = await uow.placements.list_active(decisions=False)
    created = min(p.created_s for p in placements)
    assert committed > 0
    from broker.store.auth import TenantRepo

    async with world.rt.store.unit() as uow:
        later = TenantRepo(uow.session, created + 7200.0)
        committed2, spent = await later.spend("alice")
    assert committed2 == pytest.approx(committed)
    assert spent == pytest.approx(committed * 2.0, rel=1e-6)



async def test_finding6_a_revocation_reaches_another_replica_within_1s(
        pg_url: str, tmp_path: Path) -> None:
    """Two app instances (replicas) on one PostgreSQL database: a token revoked through
    one is refused by the other once 1 s has passed, though the other had just cached it.
    The other replica's cache runs on a clock the test moves, so a loaded machine's slow
    requests do not count against the 1 s (they made the wall-clock version flaky)."""
    import secrets

    from broker.store import migrate

    url = f"{pg_url}?schema=t_tenancy_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    runtimes = [build_runtime(load_settings(store={"url": url}, data_dir=tmp_path / str(i)))
                for i in (1, 2)]
    now = [1000.0]
    try:
        admin = {"Authorization": f"Bearer {await ensure_admin_token(runtimes[0])}"}
        apps = [create_app(rt) for rt in runtimes]
        cache = apps[1].state.token_cache
        cache.clock = lambda: now[0]
        one, two = (httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://t") for app in apps)
        async with one, two:
            bob = await _token(one, admin, "bob")
            assert (await two.get("/v1/workloads", headers=bob)).status_code == 200  # cached
            token_id = (await one.get("/v1/tokens", headers=bob)).json()["items"][0]["id"]
            assert (await one.delete(f"/v1/tokens/{token_id}", headers=admin)
                    ).status_code == 200
            now[0] += 0.5
            within = (await two.get("/v1/workloads", headers=bob)).status_code
            now[0] += 0.5
            after_1s = (await two.get("/v1/workloads", headers=bob)).status_code
            now[0] += 60.0
            later = (await two.get("/v1/workloads", headers=bob)).status_code
        assert cache.ttl_s <= 1.0
        assert within == 200  # the other replica still trusts its cache for up to 1 s
        assert after_1s == 401  # and no longer
        assert later == 401  # the refusal is not itself cached
    finally:
        for rt in runtimes:
            await rt.store.close()
        await migrate.drop_schema(url)


async def test_edge_events_of_a_private_site_go_to_its_owner_only(world: World) -> None:
    from broker.federation.edge_hub import StoreRecorder

    site = {"name": "alice-edge", "lat": 48.1, "lon": 11.6,
            "capacity": {"cpu": 4, "memory": 8}}
    assert (await world.c.post("/v1/sites", json=site, headers=world.alice)).status_code == 201
    shared = dict(site, name="fed-edge")
    assert (await world.c.post("/v1/sites", json=shared, headers=world.admin)).status_code == 201
    record = StoreRecorder(world.rt.store)
    for name in ("alice-edge", "fed-edge"):
        await record("edge_site_health", {"site": name, "health": "down", "cause": "lwt"})
    bob = (await world.c.get("/v1/events", params={"kind": "edge.site_health"},
                             headers=world.bob)).json()["items"]
    alice = (await world.c.get("/v1/events", params={"kind": "edge.site_health"},
                               headers=world.alice)).json()["items"]
    assert [e["subject"] for e in bob] == ["fed-edge"]
    assert sorted(e["subject"] for e in alice) == ["alice-edge", "fed-edge"]


async def test_an_admin_draining_a_private_cluster_tells_its_owner_only(world: World) -> None:
    await _register(world)
    await _placed_on(world, world.alice, "alice-job")
    r = await world.c.delete("/v1/clusters/alice-cheap", headers=world.admin)
    assert r.status_code == 202, r.text
    kind = {"kind": "cluster.draining"}
    bob = (await world.c.get("/v1/events", params=kind, headers=world.bob)).json()["items"]
    alice = (await world.c.get("/v1/events", params=kind, headers=world.alice)).json()["items"]
    assert bob == []
    assert [e["subject"] for e in alice] == ["alice-cheap"]


async def test_a_learned_policys_observation_is_not_shown_to_tenants(world: World) -> None:
    """The epoch's observation (every cluster, by name) is stored in one placement's decision
    record: the admin sees it, a tenant reading its placement or explain does not."""
    from broker.federation.placement_loop import make_placement_loop
    from broker.federation.policy_runtime import install_policy

    await _register(world)
    await install_policy(world.rt)
    wid = (await world.c.post("/v1/workloads", json=job("bob-job"), headers=world.bob)
           ).json()["id"]
    await make_placement_loop(world.rt).tick()
    pid = (await world.c.get(f"/v1/workloads/{wid}", headers=world.bob)
           ).json()["status"]["placementId"]
    as_admin = (await world.c.get(f"/v1/placements/{pid}", headers=world.admin)).json()
    assert "alice-cheap" in as_admin["decision"]["policy_action"]["observation"]["names"]
    for path in (f"/v1/placements/{pid}", f"/v1/placements/{pid}/explain",
                 f"/v1/placements/{pid}/explain?policy=true"):
        r = await world.c.get(path, headers=world.bob)
        assert r.status_code == 200, r.text
        assert "alice-cheap" not in r.text, path
        assert "observation" not in r.json()["decision"]["policy_action"]
