"""Durable state: SQLAlchemy 2 (async) on PostgreSQL (asyncpg) or SQLite (aiosqlite).

The only package that speaks SQL. Everything outside uses the repository API
below and gets `broker.domain` values (or the small records in `records.py`)
back. Errors leave as `broker.errors.StoreError` / `ConflictError` /
`NotFoundError` / `SchemaOutdatedError`, never as SQLAlchemy or driver errors.

Usage (one unit of work = one AsyncSession = one transaction; only it commits):

    store = Store.from_url(settings.store_url, pool_size=settings.store.pool_size, clock=clock)
    await store.check_schema()                 # SchemaOutdatedError -> "run: skyfed db upgrade"
    async with store.unit() as uow:
        pending = await uow.workloads.list_pending(limit=500)
        clusters = await uow.clusters.list()   # list of broker.domain.Cluster with pools
        pid = await uow.placements.record(placement)         # + workload -> placed
        await uow.workloads.set_status(wid, WorkloadStatus.CANCELLED, message="...")
    # commit happens here; an exception rolls the whole unit back

Keep units short and free of other I/O (no driver or cloud calls inside one):
they hold a connection -- on SQLite *the* connection -- and an OSError inside
is reported as a StoreError.

URLs: `postgresql+asyncpg://user@host/db[?schema=NAME]` (schema= isolates all
tables in one PostgreSQL schema, created by `upgrade`), `sqlite+aiosqlite:///path`.

Repository API (`uow.<repo>.<method>`; `tenant=None` means "all tenants", for
the broker's loops and admin; a row of another tenant raises NotFoundError):

  uow.workloads   submit(tenant=, spec=, spec_json=None, idempotency_key=None,
                         request_sha256="") -> (WorkloadRecord, created: bool)
                  replay(tenant=, idempotency_key=, request_sha256=) -> WorkloadRecord
                  get(id, tenant=None) -> WorkloadRecord
                  list(tenant=, status=None, limit=50, cursor=None) -> Page[WorkloadRecord]
                  list_pending(limit=500) -> list[Workload]   # all tenants: due ones first
                                                  # (not_before_s passed), priority desc, oldest
                  set_retry(id, attempts=, last_attempt_s=, not_before_s=, reason=None)
                                                  # planner.Retry; set_retries for many
                  list_by_status([statuses], limit=1000) -> list[WorkloadRecord]
                  set_status(id, status, message="", event_data=None)   # + event workload.<status>
                  cancel(id, tenant=) -> WorkloadRecord                  # idempotent, + event
                  requeue(id, reason=, displaced_from=None)  # back to pending, placement
                                          # retired, + event; remembers the failed cluster
                  displaced(ids) -> {id: clusters} ; clear_displaced(id)
  uow.placements  record(placement, status=PLACED, message="", demand_tau_s=None)
                        -> placement_id | None
                        # retires the previous active placement, sets workload status, + event;
                        # None (nothing written) if the workload was cancelled/finished meanwhile;
                        # with demand_tau_s, counts its requests into each pool's demand EWMA
                  record_many([(placement, message)], status=PLACED, demand_tau_s=None,
                              extends=None) -> {workload_id: placement_id}
                        # record for a batch; extends={wid: (pid, added)}: grows active pid
                        # (only if still active), status kept, event workload.grown
                  get(id, tenant=None) -> PlacementRecord
                  get_active_for_workload(workload_id) -> PlacementRecord | None
                  list_undispatched(limit=500) -> list[PlacementRecord]  # no decision records;
                                                  # of placed or running workloads
                  mark_dispatched(id)                  # idempotent, + event placement.dispatched
                  record_dispatch_failure(id, error) -> attempts
                  list_active_on_cluster(cluster) -> list[PlacementRecord]  # placed/running
                  list_active(limit=10000) -> list[PlacementRecord]
                  list_to_withdraw(limit=500) -> list[PlacementRecord]  # cancelled but applied
                  retire(id)
                  move(workload_id, from_cluster=, to_cluster=, to_pool=, by=, cause="")
                        # someone else moved it (edge hub failover): new active, dispatched
                  get_decision(id, tenant=None) -> dict ; put_decision(id, decision)
  uow.clusters    upsert(cluster, tenant=, account=None, attrs=None) -> created: bool
                        # creates the tenant if missing; another tenant's name -> ConflictError
                  get(name, tenant=None) -> ClusterRecord
                  list(tenant=None) -> list[Cluster] ; list_records(tenant=None)
                  set_health(name, healthy=, reason="")
                  set_pool_usage(cluster, pool, nodes=, used_cpu=, used_memory_gib=,
                                 used_gpu=, largest_free_gpu_set=)
                  set_attrs(name, attrs) ; delete(name, tenant=None)
  uow.sites       upsert(site, tenant=, attrs=None) -> created: bool
                  set_health(name, health: SiteHealth, last_seen_s=None, reason="")
                  set_seen(name, last_seen_s)          # the hub heard it (no event)
                  get(name, tenant=None) -> SiteRecord
                  list(tenant=None) -> list[Site] ; list_records(tenant=None) ; set_attrs(name, a)
  uow.offers      upsert_many(offers) -> count ; list(provider=None, region=None) -> list[Offer]
                  updated_s(provider=, region=) -> float | None
                  with_times([(provider, region, type)]) -> {key: (Offer, updated_s)}
  uow.quotas      insert_snapshot(account=, provider=, quotas=, ok=True, error="", taken_s=None)
                  last_known_good(account) -> QuotaSnapshot | None
                  mark_account_stale(account, provider=, error=) -> consecutive failures
                  mark_account_fresh(account, provider=)
                  get_account(account) -> AccountState | None
                  (stale/fresh also set clusters.quota_stale where clusters.account == account)
  uow.inventory   put(member, nodes, reclaims=None, observed_s=None)   # the poller's newest
                  get(member) -> InventoryRecord | None ; list() -> {member: InventoryRecord}
                  record_error(member, error) ; delete(member)
  uow.demand      add(cluster, pool, cpu=, gpu=, tau_s=)   # placements.record calls it
                  list() -> {(cluster, pool): (cpu/s, gpu/s, at_s)}
  uow.events      append(kind, subject, data=None, tenant=None, ts=None)   # append-only
                  list(tenant=None, after_id=0, limit=100, kind=None, subject=None)
  uow.decisions   add(kind=, key=, spec=, tenant=None, cluster="", pool="", workload_id="")
                  get(id) ; list_open(kinds=None) ; list_due(limit=200) ; list(kind=, ...)
                  set_state(id, state, step=, error=, not_before_s=, attempt=, spec=)
                  supersede(key=, before_id=) -> ids   # the actuator's durable work queue
  uow.tenants     ensure(name, budget_usd_per_hour=None) ; get(name) ; list()
  uow.tokens      create(tenant=, is_admin=False, description="", token=None, role=None,
                         expires_s=None) -> (id, token)
                  resolve(token) -> Principal | None (unknown, revoked, expired: None)
                  has_admin() ; list(tenant=None) -> [TokenInfo] ; revoke(token_id, tenant=None)
  uow.now         the clock's time when the unit started (epoch s); uow.session (escape hatch)

Store: from_url(), unit(), ping(), check_schema(), close(), dialect, clock, and
submit_workload(tenant=, spec=, spec_json=, idempotency_key=None, request_sha256="")
(the API hot path: same contract as uow.workloads.submit, one statement on PostgreSQL).
Migrations (`broker.store.migrate`): upgrade(url), downgrade(url, rev="base"),
current(url), head_revision(), drop_schema(url). Conversions: `mapping.py`
(spec_to_json / spec_from_json, rows <-> Cluster/Pool/Site/Offer/Placement).
Extension without migrations: clusters, pools, sites and offers have an
`attrs` JSON column (`set_attrs`, `ClusterRecord.attrs`, `SiteRecord.attrs`).
"""

from __future__ import annotations

from broker.store.records import (
    AccountState,
    ClusterRecord,
    DecisionRecord,
    Event,
    InventoryRecord,
    Page,
    PlacementRecord,
    Principal,
    QuotaSnapshot,
    SiteRecord,
    TokenInfo,
    WorkloadRecord,
)
from broker.store.uow import Store, UnitOfWork

__all__ = [
    "AccountState",
    "ClusterRecord",
    "DecisionRecord",
    "Event",
    "InventoryRecord",
    "Page",
    "PlacementRecord",
    "Principal",
    "QuotaSnapshot",
    "SiteRecord",
    "Store",
    "TokenInfo",
    "UnitOfWork",
    "WorkloadRecord",
]
