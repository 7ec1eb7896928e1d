"""SQLAlchemy 2 table models: the schema. Migrations in `migrations/` mirror it.

Conventions:
- Times are float epoch seconds from the injected clock (`*_s`), not DB clocks,
  so the twin and tests control them.
- JSON columns use JSONB on PostgreSQL, JSON text on SQLite.
- clusters, pools, sites and offers carry an `attrs` JSON column: other
  capabilities may keep extra per-row facts there without a migration.
- Every tenant-owned row has a `tenant` column; repositories filter by it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JsonType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL gets BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JsonType, list[Any]: JsonType}  # noqa: RUF012


class TenantRow(Base):
    __tablename__ = "tenants"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    budget_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    created_s: Mapped[float] = mapped_column(Float)


class ApiTokenRow(Base):
    """Only the sha256 of a token is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    description: Mapped[str] = mapped_column(String(200), default="")
    created_s: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    role: Mapped[str] = mapped_column(String(16), default="tenant", server_default="tenant")
    expires_s: Mapped[float | None] = mapped_column(Float)  # None: never expires


class ClusterRow(Base):
    __tablename__ = "clusters"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"), index=True)
    provider: Mapped[str] = mapped_column(String(32))
    region: Mapped[str] = mapped_column(String(64))
    account: Mapped[str | None] = mapped_column(String(128), index=True)
    zones: Mapped[list[Any]] = mapped_column(default=list)
    lat: Mapped[float | None] = mapped_column(Float)
    lon: Mapped[float | None] = mapped_column(Float)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    taints: Mapped[list[Any]] = mapped_column(default=list)
    quota_vcpu: Mapped[float | None] = mapped_column(Float)
    quota_gpu: Mapped[float | None] = mapped_column(Float)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    quota_stale: Mapped[bool] = mapped_column(Boolean, default=False)
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_s: Mapped[float] = mapped_column(Float)
    # Federation-wide (an admin's or operator's) or private to `tenant` and `lent_to`.
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    lent_to: Mapped[list[Any] | None] = mapped_column()


class PoolRow(Base):
    __tablename__ = "pools"
    __table_args__ = (UniqueConstraint("cluster", "name"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(ForeignKey("clusters.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    instance_type: Mapped[str] = mapped_column(String(64))
    node_cpu: Mapped[float] = mapped_column(Float)
    node_memory_gib: Mapped[float] = mapped_column(Float)
    node_gpu: Mapped[int] = mapped_column(Integer, default=0)
    nodes: Mapped[int] = mapped_column(Integer, default=0)
    max_nodes: Mapped[int] = mapped_column(Integer, default=0)
    price_usd_per_hour: Mapped[float] = mapped_column(Float)
    pricing: Mapped[str] = mapped_column(String(16))
    gpu_model: Mapped[str | None] = mapped_column(String(64))
    interconnect: Mapped[str] = mapped_column(String(16), default="none")
    used_cpu: Mapped[float] = mapped_column(Float, default=0.0)
    used_memory_gib: Mapped[float] = mapped_column(Float, default=0.0)
    used_gpu: Mapped[int] = mapped_column(Integer, default=0)
    largest_free_gpu_set: Mapped[int] = mapped_column(Integer, default=0)
    reclaim_rate_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # `key=value:Effect` strings every node of the pool carries, as registered (None: none;
    # rows written before the column).
    taints: Mapped[list[Any] | None] = mapped_column(default=None)


class SiteRow(Base):
    __tablename__ = "sites"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"), index=True)
    lat: Mapped[float] = mapped_column(Float)
    lon: Mapped[float] = mapped_column(Float)
    cpu: Mapped[float] = mapped_column(Float)
    memory_gib: Mapped[float] = mapped_column(Float)
    gpu: Mapped[int] = mapped_column(Integer, default=0)
    price_usd_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_model: Mapped[str | None] = mapped_column(String(64))
    interconnect: Mapped[str] = mapped_column(String(16), default="pcie")
    uplink_gbps: Mapped[float] = mapped_column(Float, default=1.0)
    health: Mapped[str] = mapped_column(String(16), default="healthy")
    last_seen_s: Mapped[float | None] = mapped_column(Float)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_s: Mapped[float] = mapped_column(Float)
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    lent_to: Mapped[list[Any] | None] = mapped_column()


class OfferRow(Base):
    __tablename__ = "offers"
    provider: Mapped[str] = mapped_column(String(32), primary_key=True)
    region: Mapped[str] = mapped_column(String(64), primary_key=True)
    instance_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    vcpu: Mapped[float] = mapped_column(Float)
    memory_gib: Mapped[float] = mapped_column(Float)
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    gpu_model: Mapped[str | None] = mapped_column(String(64))
    interconnect: Mapped[str] = mapped_column(String(16), default="none")
    price_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    spot_price_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16), default="catalog")
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_s: Mapped[float] = mapped_column(Float)


class ProviderAccountRow(Base):
    """Sync health of one provider account (quota/price sync marks it stale)."""

    __tablename__ = "provider_accounts"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    provider: Mapped[str] = mapped_column(String(32))
    stale: Mapped[bool] = mapped_column(Boolean, default=False)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    last_ok_s: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    updated_s: Mapped[float] = mapped_column(Float)


class QuotaSnapshotRow(Base):
    """One sync's quotas for one account; `ok=False` rows record failed syncs."""

    __tablename__ = "quota_snapshots"
    __table_args__ = (Index("ix_quota_snapshots_account_taken", "account", "taken_s"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account: Mapped[str] = mapped_column(String(128))
    provider: Mapped[str] = mapped_column(String(32))
    taken_s: Mapped[float] = mapped_column(Float)
    ok: Mapped[bool] = mapped_column(Boolean, default=True)
    quotas: Mapped[list[Any]] = mapped_column(default=list)
    error: Mapped[str] = mapped_column(Text, default="")


class InventoryRow(Base):
    """The newest inventory one driver reported for a cluster or edge site (the poller's).

    `nodes` is a list of node objects (docs/snapshot.md); `reclaims` counts, per spot pool,
    nodes that went away after a termination notice since `since_s` (first observation).
    No foreign key: an edge site registered only as a site has inventory too.
    """

    __tablename__ = "inventory"
    member: Mapped[str] = mapped_column(String(128), primary_key=True)
    observed_s: Mapped[float] = mapped_column(Float)
    since_s: Mapped[float] = mapped_column(Float)
    nodes: Mapped[list[Any]] = mapped_column(default=list)
    reclaims: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str] = mapped_column(Text, default="")
    error_s: Mapped[float | None] = mapped_column(Float)


class PoolDemandRow(Base):
    """The demand EWMA of one pool (placement/observed.py): requested vCPUs and GPUs per
    second as of `at_s`, kept incrementally as placements are recorded (decay to now, then
    add amount / tau: the twin's `SimPool.add_demand`). Keyed by names, not a foreign key:
    an edge site registered only as a site has a pool (`site`) but no pool row."""

    __tablename__ = "pool_demand"
    cluster: Mapped[str] = mapped_column(String(128), primary_key=True)
    pool: Mapped[str] = mapped_column(String(128), primary_key=True)
    cpu_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    at_s: Mapped[float] = mapped_column(Float)


# The rows the unique (tenant, applied_name) index covers: created by name and not finished.
LIVE_APPLIED = "applied_name IS NOT NULL AND status NOT IN ('succeeded', 'failed', 'cancelled')"


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_workloads_tenant_idem"),
        Index("ix_workloads_queue", "status", "priority", "submitted_s"),
        Index("ix_workloads_tenant_order", "tenant", "submitted_s", "id"),
        # The workloads that ended lately (WorkloadRepo.ended_since: the net forecast).
        Index("ix_workloads_status_updated", "status", "updated_s"),
        # One live workload per (tenant, name) created by name (PUT, `skyfed apply`): two
        # concurrent PUTs of a new name cannot both insert (lifecycle.upsert). POST keeps
        # accepting several workloads of one name (applied_name NULL).
        Index("uq_workloads_tenant_applied_name", "tenant", "applied_name", unique=True,
              postgresql_where=text(LIVE_APPLIED), sqlite_where=text(LIVE_APPLIED)),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column()
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_sha256: Mapped[str] = mapped_column(String(64), default="")
    placement_id: Mapped[str | None] = mapped_column(String(40))
    message: Mapped[str] = mapped_column(Text, default="")
    submitted_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    # The planner's retry/backoff state (planner.Retry): epochs that left it unplaced, when
    # the last was, and before when it is not tried again (NULL: now).
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_attempt_s: Mapped[float | None] = mapped_column(Float)
    not_before_s: Mapped[float | None] = mapped_column(Float)
    # Why the last attempt left it (partly) unplaced (planner.Retry.reason; NULL: none), so a
    # workload's conditions name it whatever else later wrote `message`.
    retry_reason: Mapped[str | None] = mapped_column(Text)
    # Clusters a failover moved it off (the reconciler): a "recovered" migration may take
    # it back there once they are healthy; cleared when it moved back.
    displaced_from: Mapped[list[Any] | None] = mapped_column()
    # The name, for a workload created by name (PUT); NULL for one created by POST.
    applied_name: Mapped[str | None] = mapped_column(String(253))


class PlacementRow(Base):
    """A decision for one workload. `active` marks the current one; re-queueing
    a workload deactivates it (history stays). `clusters_csv` is `,a,b,` so
    "placements on cluster X" is a portable LIKE."""

    __tablename__ = "placements"
    __table_args__ = (Index("ix_placements_pending_dispatch", "active", "dispatched"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workload_id: Mapped[str] = mapped_column(
        ForeignKey("workloads.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(64))
    assignments: Mapped[list[Any]] = mapped_column()
    clusters_csv: Mapped[str] = mapped_column(Text, default=",")
    cost_usd_per_hour: Mapped[float] = mapped_column(Float)
    rtt_ms: Mapped[float | None] = mapped_column(Float)
    decision: Mapped[dict[str, Any]] = mapped_column(default=dict)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    dispatched: Mapped[bool] = mapped_column(Boolean, default=False)
    dispatch_attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    # the fencing epoch of the leader that wrote it (store/leadership.py); None: written
    # outside leadership (SQLite's single broker, the API, a one-shot command)
    leader_epoch: Mapped[int | None] = mapped_column(BigInteger)
    # cluster -> {"ready", "desired", "phase", "message"} as the reconciler last saw it
    cluster_status: Mapped[dict[str, Any] | None] = mapped_column()


class DecisionRow(Base):
    """One non-placement decision of an epoch (scale, scale-in, prewarm, migration), written
    with the epoch's placements in one transaction and carried out by the actuator.

    `state`: pending -> running -> done | refused | failed | superseded; `step` is the
    progress inside a multi-step decision (a migration: started, ready, switched), so an
    actuator that crashed resumes where it stopped. `key` names what the decision acts on
    (`pool:<cluster>/<pool>`, `workload:<id>`): a newer pending decision supersedes an older
    one with the same key.
    """

    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decisions_state_id", "state", "id"),
                      Index("ix_decisions_key_state", "key", "state"))
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(400))
    tenant: Mapped[str | None] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(128), default="")
    pool: Mapped[str] = mapped_column(String(128), default="")
    workload_id: Mapped[str] = mapped_column(String(40), default="")
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[str] = mapped_column(String(32), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    not_before_s: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_s: Mapped[float] = mapped_column(Float)
    updated_s: Mapped[float] = mapped_column(Float)
    leader_epoch: Mapped[int | None] = mapped_column(BigInteger)  # as PlacementRow's


class LeaderEpochRow(Base):
    """The fencing epoch of one election (store/leadership.py): +1 each time a replica
    becomes leader. A singleton loop's unit of work commits only while this row still holds
    the epoch its replica was elected with, so a deposed leader's late write is refused."""

    __tablename__ = "leader_epochs"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(253))
    elected_s: Mapped[float] = mapped_column(Float)


class EventRow(Base):
    """Append-only: rows are inserted, never updated or deleted by the broker."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_tenant_id", "tenant", "id"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    tenant: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(253))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
