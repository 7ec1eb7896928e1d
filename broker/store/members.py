"""Federation members: clusters (with their pools), edge sites, and offers.

Clusters and sites belong to the tenant that registered them (`tenant=`
filters reads like every tenant row); the broker's loops read them all
(`tenant=None`). `upsert` replaces a member's description (pools included)
and keeps its `attrs` unless new ones are given.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from broker.domain import Cluster, Offer, Site, SiteHealth
from broker.errors import ConflictError, NotFoundError
from broker.limits import sanitize_json
from broker.store.auth import TenantRepo
from broker.store.events import EventRepo
from broker.store.mapping import (
    cluster_from_row,
    cluster_to_values,
    offer_from_row,
    offer_to_values,
    pool_to_values,
    site_from_row,
    site_to_values,
)
from broker.store.models import ClusterRow, OfferRow, PoolRow, SiteRow
from broker.store.records import ClusterRecord, SiteRecord


class ClusterRepo:
    def __init__(self, session: AsyncSession, now: float, events: EventRepo) -> None:
        self._s = session
        self._now = now
        self._events = events

    async def upsert(self, cluster: Cluster, *, tenant: str, account: str | None = None,
                     attrs: Mapping[str, Any] | None = None, shared: bool | None = None,
                     lent_to: Sequence[str] = ()) -> bool:
        """Create or replace `cluster` and its pools; True when created.

        `shared`: federation-wide (an admin's or operator's registration); None keeps the
        older rule, shared when the registering tenant is `admin`. Otherwise the cluster is
        private to `tenant` and the tenants in `lent_to`.
        Raises `ConflictError` when the name belongs to another tenant.
        """
        row = await self._s.get(ClusterRow, cluster.name)
        values = cluster_to_values(cluster) | {"tenant": tenant, "account": account,
                                               "updated_s": self._now,
                                               **scope_values(tenant, shared, lent_to)}
        if row is not None and row.tenant != tenant:
            raise ConflictError(f"cluster name {cluster.name!r} is taken by another tenant")
        if row is None:
            await TenantRepo(self._s, self._now).ensure(tenant)
            await self._s.execute(insert(ClusterRow).values(**values, attrs=dict(attrs or {})))
        else:
            if attrs is not None:
                values["attrs"] = dict(attrs)
            await self._s.execute(update(ClusterRow)
                                  .where(ClusterRow.name == cluster.name).values(**values))
            await self._s.execute(delete(PoolRow).where(PoolRow.cluster == cluster.name))
        for pool in cluster.pools:
            await self._s.execute(insert(PoolRow).values(**pool_to_values(cluster.name, pool),
                                                         attrs={}))
        await self._events.append("cluster.registered" if row is None else "cluster.updated",
                                  cluster.name, {"provider": cluster.provider,
                                                 "region": cluster.region}, tenant=tenant)
        return row is None

    async def get(self, name: str, *, tenant: str | None = None) -> ClusterRecord:
        row = await self._s.get(ClusterRow, name)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFoundError(kind="cluster", key=name)
        return (await self._records([row]))[0]

    async def list_records(self, *, tenant: str | None = None) -> builtins.list[ClusterRecord]:
        q = select(ClusterRow).order_by(ClusterRow.name)
        if tenant is not None:
            q = q.where(ClusterRow.tenant == tenant)
        return await self._records(list((await self._s.scalars(q)).all()))

    async def usable_names(self, tenant: str) -> frozenset[str]:
        """Names of the clusters and sites `tenant` may place onto: federation-wide ones,
        its own, and those lent to it (the planner's `feasibility.may_use`, read here)."""
        out: set[str] = set()
        for table in (ClusterRow, SiteRow):
            q = select(table.name, table.tenant, table.shared, table.lent_to)
            for name, owner, shared, lent in (await self._s.execute(q)).all():
                if shared or owner == tenant or tenant in _names(lent):
                    out.add(str(name))
        return frozenset(out)

    async def edge_names(self) -> builtins.list[str]:
        """Names of the clusters registered with provider `edge` (the edge hub's)."""
        q = select(ClusterRow.name).where(ClusterRow.provider == "edge")
        return [str(n) for n in (await self._s.scalars(q)).all()]

    async def unhealthy(self) -> builtins.list[str]:
        """Names of the clusters marked unhealthy (the reconciler's failover reads it)."""
        q = select(ClusterRow.name).where(ClusterRow.healthy.is_(False)).order_by(ClusterRow.name)
        return [str(n) for n in (await self._s.scalars(q)).all()]

    async def list(self, *, tenant: str | None = None) -> builtins.list[Cluster]:
        """Clusters with their pools as `broker.domain.Cluster` values (for placement)."""
        return [r.cluster for r in await self.list_records(tenant=tenant)]

    async def set_health(self, name: str, *, healthy: bool, reason: str = "") -> None:
        row = await self._s.get(ClusterRow, name)
        if row is None:
            raise NotFoundError(kind="cluster", key=name)
        if row.healthy != healthy:
            row.healthy = healthy
            row.updated_s = self._now
            await self._events.append("cluster.healthy" if healthy else "cluster.unhealthy",
                                      name, {"reason": reason}, tenant=row.tenant)

    async def set_pool_usage(self, cluster: str, pool: str, *, nodes: int | None = None,
                             used_cpu: float | None = None, used_memory_gib: float | None = None,
                             used_gpu: int | None = None,
                             largest_free_gpu_set: int | None = None) -> None:
        """Record observed pool state (from a driver's inventory); None leaves a field."""
        changes = {k: v for k, v in {
            "nodes": nodes, "used_cpu": used_cpu, "used_memory_gib": used_memory_gib,
            "used_gpu": used_gpu, "largest_free_gpu_set": largest_free_gpu_set}.items()
            if v is not None}
        if not changes:
            return
        res = await self._s.execute(update(PoolRow).where(
            PoolRow.cluster == cluster, PoolRow.name == pool).values(**changes))
        if getattr(res, "rowcount", 0) == 0:
            raise NotFoundError(kind="pool", key=f"{cluster}/{pool}")

    async def set_attrs(self, name: str, attrs: Mapping[str, Any]) -> None:
        """Merge `attrs` into the cluster's extension column."""
        row = await self._s.get(ClusterRow, name)
        if row is None:
            raise NotFoundError(kind="cluster", key=name)
        row.attrs = {**(row.attrs or {}), **attrs}

    async def delete(self, name: str, *, tenant: str | None = None) -> None:
        await self.get(name, tenant=tenant)
        await self._s.execute(delete(ClusterRow).where(ClusterRow.name == name))
        await self._events.append("cluster.deleted", name, {}, tenant=tenant)

    async def _records(self, rows: Sequence[ClusterRow]) -> builtins.list[ClusterRecord]:
        if not rows:
            return []
        pools = (await self._s.scalars(select(PoolRow).where(
            PoolRow.cluster.in_([r.name for r in rows])).order_by(PoolRow.id))).all()
        by_cluster: dict[str, list[PoolRow]] = {}
        for p in pools:
            by_cluster.setdefault(p.cluster, []).append(p)
        return [ClusterRecord(cluster=cluster_from_row(r, by_cluster.get(r.name, [])),
                              tenant=r.tenant, account=r.account, attrs=_attrs(r.attrs),
                              updated_s=r.updated_s, shared=bool(r.shared),
                              lent_to=_names(r.lent_to)) for r in rows]


class SiteRepo:
    def __init__(self, session: AsyncSession, now: float, events: EventRepo) -> None:
        self._s = session
        self._now = now
        self._events = events

    async def upsert(self, site: Site, *, tenant: str,
                     attrs: Mapping[str, Any] | None = None, shared: bool | None = None,
                     lent_to: Sequence[str] = ()) -> bool:
        """Create or replace an edge site; True when created. Another tenant's name: 409.
        `shared` and `lent_to` as for clusters (`ClusterRepo.upsert`)."""
        row = await self._s.get(SiteRow, site.name)
        if row is not None and row.tenant != tenant:
            raise ConflictError(f"site name {site.name!r} is taken by another tenant")
        values = site_to_values(site) | {"tenant": tenant, "updated_s": self._now,
                                         **scope_values(tenant, shared, lent_to)}
        if row is None:
            await TenantRepo(self._s, self._now).ensure(tenant)
            await self._s.execute(insert(SiteRow).values(**values, attrs=dict(attrs or {}),
                                                         last_seen_s=None))
        else:
            if attrs is not None:
                values["attrs"] = dict(attrs)
            await self._s.execute(update(SiteRow).where(SiteRow.name == site.name)
                                  .values(**values))
        await self._events.append("site.registered" if row is None else "site.updated",
                                  site.name, {}, tenant=tenant)
        return row is None

    async def set_health(self, name: str, health: SiteHealth, *,
                         last_seen_s: float | None = None, reason: str = "") -> None:
        """Record a site's health; logs `site.<health>` only when it changes."""
        row = await self._s.get(SiteRow, name)
        if row is None:
            raise NotFoundError(kind="site", key=name)
        if last_seen_s is not None:
            row.last_seen_s = last_seen_s
        if row.health != str(health):
            row.health = str(health)
            row.updated_s = self._now
            await self._events.append(f"site.{health}", name, {"reason": reason},
                                      tenant=row.tenant)

    async def set_seen(self, name: str, last_seen_s: float) -> None:
        """When the hub last heard the site (no event: heartbeats are routine)."""
        row = await self._s.get(SiteRow, name)
        if row is None:
            raise NotFoundError(kind="site", key=name)
        row.last_seen_s = last_seen_s

    async def set_attrs(self, name: str, attrs: Mapping[str, Any]) -> None:
        row = await self._s.get(SiteRow, name)
        if row is None:
            raise NotFoundError(kind="site", key=name)
        row.attrs = {**(row.attrs or {}), **attrs}

    async def get(self, name: str, *, tenant: str | None = None) -> SiteRecord:
        row = await self._s.get(SiteRow, name)
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFoundError(kind="site", key=name)
        return _site_record(row)

    async def list_records(self, *, tenant: str | None = None) -> builtins.list[SiteRecord]:
        q = select(SiteRow).order_by(SiteRow.name)
        if tenant is not None:
            q = q.where(SiteRow.tenant == tenant)
        return [_site_record(r) for r in (await self._s.scalars(q)).all()]

    async def list(self, *, tenant: str | None = None) -> builtins.list[Site]:
        return [r.site for r in await self.list_records(tenant=tenant)]

    async def delete(self, name: str, *, tenant: str | None = None) -> None:
        await self.get(name, tenant=tenant)
        await self._s.execute(delete(SiteRow).where(SiteRow.name == name))
        await self._events.append("site.deleted", name, {}, tenant=tenant)


def _site_record(r: SiteRow) -> SiteRecord:
    return SiteRecord(site=site_from_row(r), tenant=r.tenant, last_seen_s=r.last_seen_s,
                      attrs=_attrs(r.attrs), updated_s=r.updated_s, shared=bool(r.shared),
                      lent_to=_names(r.lent_to))


SHARED_BY_DEFAULT = frozenset({"admin"})


def scope_values(tenant: str, shared: bool | None, lent_to: Sequence[str]) -> dict[str, Any]:
    """The `shared`/`lent_to` columns of a registration (see `ClusterRepo.upsert`)."""
    wide = tenant in SHARED_BY_DEFAULT if shared is None else shared
    return {"shared": wide,
            "lent_to": None if wide else sorted(set(lent_to) - {tenant}) or None}


def _names(raw: Any) -> tuple[str, ...]:
    return tuple(sorted(str(n) for n in raw)) if isinstance(raw, list) else ()


class OfferRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def upsert_many(self, offers: Sequence[Offer]) -> int:
        """Insert or update offers by (provider, region, instance_type); returns the count."""
        for o in offers:
            values = offer_to_values(o) | {"updated_s": self._now}
            row = await self._s.get(OfferRow, (o.provider, o.region, o.instance_type))
            if row is None:
                await self._s.execute(insert(OfferRow).values(**values, attrs={}))
            else:
                for k, v in values.items():
                    setattr(row, k, v)
        return len(offers)

    async def list(self, *, provider: str | None = None,
                   region: str | None = None) -> builtins.list[Offer]:
        q = select(OfferRow).order_by(OfferRow.provider, OfferRow.region, OfferRow.instance_type)
        if provider is not None:
            q = q.where(OfferRow.provider == provider)
        if region is not None:
            q = q.where(OfferRow.region == region)
        return [offer_from_row(r) for r in (await self._s.scalars(q)).all()]

    async def with_times(self, keys: Sequence[tuple[str, str, str]]
                         ) -> builtins.dict[tuple[str, str, str], tuple[Offer, float]]:
        """(provider, region, instance type) -> (its offer, when sync last wrote it), for
        the keys that have one; one query whatever the number of keys."""
        wanted = set(keys)
        if not wanted:
            return {}
        q = select(OfferRow).where(OfferRow.instance_type.in_(sorted({k[2] for k in wanted})),
                                   OfferRow.region.in_(sorted({k[1] for k in wanted})))
        out = {}
        for r in (await self._s.scalars(q)).all():
            key = (r.provider, r.region, r.instance_type)
            if key in wanted:
                out[key] = (offer_from_row(r), r.updated_s)
        return out

    async def updated_s(self, *, provider: str, region: str) -> float | None:
        """When offers of (provider, region) were last refreshed, or None."""
        q = select(OfferRow.updated_s).where(OfferRow.provider == provider,
                                             OfferRow.region == region)
        vals = (await self._s.scalars(q)).all()
        return max(vals) if vals else None


def _attrs(raw: Any) -> dict[str, Any]:
    """Stored `attrs`, repaired if an older version kept what no JSON encoder can write."""
    clean, _ = sanitize_json(raw if isinstance(raw, Mapping) else {})
    return dict(clean)
