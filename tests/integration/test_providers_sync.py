"""Quota/price sync against the real PostgreSQL (own schema per test) with fault-injecting fakes."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.clock import SystemClock
from broker.federation.quota_sync import (
    Account,
    QuotaSync,
    RetryPolicy,
    load_accounts,
)
from broker.store import Store, migrate
from providers.catalog import Catalog
from providers.errors import ConfigError
from providers.simulated_cloud import SimulatedCloudOptions, SimulatedCloudProvider

pytestmark = pytest.mark.integration

TYPES = ("m5.large", "m5.2xlarge", "c5.2xlarge", "p4d.24xlarge", "g4dn.xlarge")
FAST = RetryPolicy(attempts=4, initial_s=0.001, max_s=0.005, jitter_s=0.001)


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[str]:
    url = f"{pg_url}?schema=t_prov_{secrets.token_hex(5)}"
    await migrate.upgrade(url)
    try:
        yield url
    finally:
        await migrate.drop_schema(url)


@pytest.fixture
async def store(db: str) -> AsyncIterator[Store]:
    s = Store.from_url(db, pool_size=2, clock=SystemClock())
    try:
        yield s
    finally:
        await s.close()


def account(name: str, **kw: object) -> Account:
    opts = SimulatedCloudOptions(provider="aws", regions=("us-east-1",), instance_types=TYPES,
                                 timeout_s=0.01, **kw)  # type: ignore[arg-type]
    return Account(name=name, provider=SimulatedCloudProvider(opts), regions=("us-east-1",))


def sync(store: Store, *accounts: Account, stale_after: int = 3) -> QuotaSync:
    return QuotaSync(store, accounts, SystemClock(), stale_after_failures=stale_after, retry=FAST)


async def test_sync_fills_offers_and_quotas_and_emits_changes(store: Store) -> None:
    acc = account("aws-main", quota_vcpu=500)
    loop = sync(store, acc)
    (res,) = await loop.sync_once()
    assert res.ok
    assert res.offers == len(TYPES)
    async with store.unit() as uow:
        offers = {o.instance_type: o for o in await uow.offers.list(provider="aws")}
        snap = await uow.quotas.last_known_good("aws-main")
        state = await uow.quotas.get_account("aws-main")
    cat = Catalog.load().offer("aws", "us-east-1", "p4d.24xlarge")
    assert offers["p4d.24xlarge"].price_usd_per_hour == pytest.approx(cat.price_usd_per_hour)
    assert snap is not None
    assert {q.metric: q.limit for q in snap.quotas}["vcpu"] == 500
    assert state is not None
    assert not state.stale

    acc.provider.options.price_factor = 1.25  # type: ignore[attr-defined]
    acc.provider.options.quota_vcpu = 100  # type: ignore[attr-defined]
    (res,) = await loop.sync_once()
    assert res.price_changes == len(TYPES)
    assert res.quota_cuts == 1
    async with store.unit() as uow:
        price_ev = await uow.events.list(kind="price.changed")
        cut_ev = await uow.events.list(kind="quota.cut")
        p4d = (await uow.offers.list(provider="aws", region="us-east-1"))
    assert len(price_ev) == 1
    assert price_ev[0].data["count"] == len(TYPES)
    assert cut_ev[0].data["cuts"] == [{"metric": "vcpu", "old_limit": 500, "new_limit": 100}]
    new = {o.instance_type: o.price_usd_per_hour for o in p4d}
    assert new["p4d.24xlarge"] == pytest.approx(cat.price_usd_per_hour * 1.25, rel=1e-6)


async def test_30_percent_faults_keep_catalog_and_quotas_consistent(store: Store) -> None:
    flaky = account("aws-flaky", error_rate=0.3, seed=11, quota_vcpu=800)
    loop = sync(store, flaky)
    outcomes = []
    for _ in range(8):
        (res,) = await loop.sync_once()
        outcomes.append(res.ok)
        async with store.unit() as uow:
            offers = await uow.offers.list(provider="aws", region="us-east-1")
            snap = await uow.quotas.last_known_good("aws-flaky")
        if any(outcomes):  # once one pass got through, the store is always whole
            assert sorted(o.instance_type for o in offers) == sorted(TYPES)
            assert all(o.price_usd_per_hour and o.price_usd_per_hour > 0 for o in offers)
            assert snap is not None
            assert {q.metric: q.limit for q in snap.quotas} == {"vcpu": 800, "gpu": 64.0}
    assert sum(outcomes) >= 6  # retries absorb nearly all of the 30 % faults
    assert flaky.provider.calls > 16  # type: ignore[attr-defined]  # faults were injected


async def test_repeated_failure_marks_stale_but_keeps_last_known_good(store: Store) -> None:
    good, bad = account("aws-good"), account("aws-bad", quota_vcpu=321)
    loop = sync(store, good, bad, stale_after=3)
    assert all(r.ok for r in await loop.sync_once())
    bad.provider.options.error_rate = 1.0  # type: ignore[attr-defined]
    for i in range(3):
        results = {r.account: r for r in await loop.sync_once()}
        assert results["aws-good"].ok
        assert not results["aws-bad"].ok
        async with store.unit() as uow:
            state = await uow.quotas.get_account("aws-bad")
        assert state is not None
        assert state.stale is (i == 2)
    async with store.unit() as uow:
        snap = await uow.quotas.last_known_good("aws-bad")
        good_state = await uow.quotas.get_account("aws-good")
        offers = await uow.offers.list(provider="aws")
    assert snap is not None
    assert {q.metric: q.limit for q in snap.quotas}["vcpu"] == 321
    assert good_state is not None
    assert not good_state.stale
    assert len(offers) == len(TYPES)
    assert loop.health("aws-bad") == (3, True)
    bad.provider.options.error_rate = 0.0  # type: ignore[attr-defined]
    await loop.sync_once()
    async with store.unit() as uow:
        state = await uow.quotas.get_account("aws-bad")
    assert state is not None
    assert not state.stale


async def test_unknown_region_fails_that_account_only(store: Store) -> None:
    wrong = Account(name="aws-typo", provider=account("x").provider, regions=("us-east-9",))
    results = {r.account: r for r in await sync(store, account("aws-ok"), wrong).sync_once()}
    assert results["aws-ok"].ok
    assert not results["aws-typo"].ok
    assert "us-east-9" in results["aws-typo"].error


def test_accounts_file_errors_name_the_account(tmp_path: Path) -> None:
    f = tmp_path / "accounts.toml"
    f.write_text('[[account]]\nname = "prod"\nprovider = "aws"\nregions = ["us-east-1"]\n'
                 '[account.options]\naccess_key_id = "env:SKYFED_TEST_NO_SUCH_VAR"\n'
                 'secret_access_key = "x"\n')
    with pytest.raises(ConfigError, match=r"'prod'.*SKYFED_TEST_NO_SUCH_VAR"):
        load_accounts(f)
    f.write_text('[[account]]\nname = "sim"\nprovider = "simulated"\nregions = ["eastus"]\n'
                 '[account.options]\nprovider = "azure"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="bogus"):
        load_accounts(f)


def test_cli_sync_fills_the_store(db: str, tmp_path: Path) -> None:
    from broker.cli import app

    f = tmp_path / "accounts.toml"
    f.write_text('[[account]]\nname = "sim-gcp"\nprovider = "simulated"\n'
                 'regions = ["us-central1"]\n[account.options]\nprovider = "gcp"\n'
                 'instance_types = ["n2-standard-4", "a2-highgpu-1g"]\n')
    res = CliRunner().invoke(app, ["providers", "sync", "--accounts", str(f), "--url", db,
                                   "-o", "json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["ok"]
    assert row["offers"] == 2


async def test_run_syncs_then_stops_promptly(store: Store) -> None:
    import asyncio

    from broker.clock import ManualClock

    acc = account("aws-loop")
    loop = QuotaSync(store, [acc], ManualClock(5000.0), interval_s=300, retry=FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    for _ in range(200):  # until the first pass has written its snapshot
        await asyncio.sleep(0.02)
        async with store.unit() as uow:
            if await uow.quotas.last_known_good("aws-loop") is not None:
                break
    stop.set()
    await asyncio.wait_for(task, timeout=5)  # the 300 s sleep is cut short by `stop`
    async with store.unit() as uow:
        snap = await uow.quotas.last_known_good("aws-loop")
    assert snap is not None
    assert snap.taken_s == 5000.0  # timestamped by the injected clock
