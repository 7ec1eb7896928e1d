"""The RL policy in the live shell: start-up step -> placement loop -> stored decision -> explain.

Real store (PostgreSQL schema per test, or a SQLite file); the shipped checkpoint steers.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.domain import Cluster, Pool, Resources, WorkloadKind, WorkloadSpec
from broker.errors import ConfigError
from broker.federation.placement_loop import make_placement_loop
from broker.federation.policy_runtime import PolicyRuntime, install_policy
from broker.federation.runtime import Runtime
from broker.settings import load_settings
from broker.store import Store, migrate

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "postgresql":
        u = f"{request.getfixturevalue('pg_url')}?schema=t_polrt_{secrets.token_hex(5)}"
    else:
        u = f"sqlite+aiosqlite:///{tmp_path / 'skyfed.db'}"
    await migrate.upgrade(u)
    try:
        yield u
    finally:
        if request.param == "postgresql":
            await migrate.drop_schema(u)


def _cluster(name: str, region: str, lat: float, lon: float, price: float) -> Cluster:
    pool = Pool(name="cpu", instance_type="m5.2xlarge", node=Resources(8, 32, 0), nodes=2,
                max_nodes=4, price_usd_per_hour=price)
    return Cluster(name=name, provider="aws", region=region, pools=(pool,), lat=lat, lon=lon)


async def _seed(store: Store) -> list[str]:
    ids = []
    async with store.unit() as uow:
        await uow.tenants.ensure("acme")
        await uow.clusters.upsert(_cluster("cheap", "us-east-1", 38.9, -77.4, 0.3),
                                  tenant="acme")
        await uow.clusters.upsert(_cluster("dear", "us-west-2", 45.6, -121.2, 0.5),
                                  tenant="acme")
        for n in ("web", "api"):
            spec = WorkloadSpec(name=n, kind=WorkloadKind.SERVICE, image="nginx:1.27",
                                replicas=2, resources=Resources(1.0, 2.0, 0))
            rec, _ = await uow.workloads.submit(tenant="acme", spec=spec)
            ids.append(rec.workload.id)
    return ids


async def _runtime(url: str, tmp_path: Path, **policy: object) -> Runtime:
    return build_runtime(load_settings(store={"url": url}, data_dir=tmp_path, policy=policy))


async def test_decision_records_policy_and_explain_attributes(url: str, tmp_path: Path) -> None:
    rt = await _runtime(url, tmp_path, checkpoint="shipped")
    try:
        admin = await ensure_admin_token(rt)
        await install_policy(rt)
        runtime = rt.policy
        assert isinstance(runtime, PolicyRuntime)
        ids = await _seed(rt.store)
        loop = make_placement_loop(rt)
        plan = await loop.tick()
        assert plan is not None
        assert len(plan.placements) == 2
        pids, records = [], []
        async with rt.store.unit() as uow:
            for wid in ids:
                pid = (await uow.workloads.get(wid)).placement_id
                assert pid is not None
                rec = await uow.placements.get(pid)
                pa = (await uow.placements.get_decision(pid))["policy_action"]
                assert pa["source"] == "checkpoint"
                assert pa["sha256"] == runtime.sha256
                assert set(pa["bias_usd_per_hour"]) == {
                    a.cluster for a in rec.placement.assignments}
                assert 0.6 <= pa["headroom"] <= 1.0
                pids.append(pid)
                records.append(pa)
        # The epoch's observation is stored once; the other placement points at it.
        [holder] = [i for i, pa in enumerate(records) if "observation" in pa]
        assert records[holder]["observation"]["names"] == ["cheap", "dear"]
        assert records[1 - holder]["observation_in"] == pids[holder]
        assert "observation" not in records[1 - holder]

        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            h = {"Authorization": f"Bearer {admin}"}
            r = await c.get(f"/v1/placements/{pid}/explain", headers=h)
            assert r.status_code == 200, r.text
            assert "policyExplanation" not in r.json()
            for pid, pa in zip(pids, records, strict=True):
                r = await c.get(f"/v1/placements/{pid}/explain?policy=true", headers=h)
                assert r.status_code == 200, r.text
                pe = r.json()["policyExplanation"]
                assert pe["available"] is True, pe
                assert pe["sha256"] == runtime.sha256
                chosen = sorted(pa["bias_usd_per_hour"])
                assert set(pe["outputs"]) == {"headroom", "prewarm_lead_s",
                                              *(f"bias[{c}]" for c in chosen)}
                top = pe["outputs"]["headroom"]["top_features"]
                assert top
                assert {"feature", "shap"} <= set(top[0])
            r = await c.post(f"/v1/placements/{pid}/whatif", json={"cluster": "dear"},
                             headers=h)
            assert r.status_code == 200, r.text
    finally:
        await rt.store.close()


async def test_fixed_weights_recorded_and_explain_says_why(url: str, tmp_path: Path) -> None:
    rt = await _runtime(url, tmp_path, checkpoint="none")
    try:
        admin = await ensure_admin_token(rt)
        await install_policy(rt)
        ids = await _seed(rt.store)
        await make_placement_loop(rt).tick()
        async with rt.store.unit() as uow:
            pid = (await uow.workloads.get(ids[0])).placement_id
            stored = await uow.placements.get_decision(str(pid))
        assert stored["policy_action"]["source"] == "fixed"
        assert stored["policy_action"]["headroom"] == rt.settings.placement.headroom
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.get(f"/v1/placements/{pid}/explain?policy=true",
                            headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200, r.text
        pe = r.json()["policyExplanation"]
        assert pe["available"] is False
        assert "no learned policy" in pe["reason"]
    finally:
        await rt.store.close()


async def test_missing_operator_checkpoint_stops_the_hook(url: str, tmp_path: Path) -> None:
    rt = await _runtime(url, tmp_path, checkpoint=str(tmp_path / "gone.pt"))
    try:
        with pytest.raises(ConfigError, match=r"gone\.pt"):
            await install_policy(rt)
        assert rt.policy is None
    finally:
        await rt.store.close()
