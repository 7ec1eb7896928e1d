"""Quota snapshots and provider-account sync health (the quota/price sync loop).

A snapshot is one sync of one account: its quotas, or the error it hit. The
"last known good" is the newest snapshot with `ok=True`; marking an account
stale also flags its clusters (`clusters.account == name`) `quota_stale`, which
placement treats conservatively.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from broker.store.events import EventRepo
from broker.store.mapping import quota_from_json, quota_to_json
from broker.store.models import ClusterRow, ProviderAccountRow, QuotaSnapshotRow
from broker.store.records import AccountState, QuotaSnapshot
from providers.base import Quota


class QuotaRepo:
    def __init__(self, session: AsyncSession, now: float, events: EventRepo) -> None:
        self._s = session
        self._now = now
        self._events = events

    async def insert_snapshot(self, *, account: str, provider: str, quotas: Sequence[Quota],
                              ok: bool = True, error: str = "",
                              taken_s: float | None = None) -> None:
        await self._s.execute(insert(QuotaSnapshotRow).values(
            account=account, provider=provider, taken_s=self._now if taken_s is None else taken_s,
            ok=ok, quotas=[quota_to_json(q) for q in quotas], error=error))

    async def last_known_good(self, account: str) -> QuotaSnapshot | None:
        q = (select(QuotaSnapshotRow).where(QuotaSnapshotRow.account == account,
                                            QuotaSnapshotRow.ok.is_(True))
             .order_by(QuotaSnapshotRow.taken_s.desc(), QuotaSnapshotRow.id.desc()).limit(1))
        row = (await self._s.scalars(q)).first()
        if row is None:
            return None
        return QuotaSnapshot(account=row.account, provider=row.provider, taken_s=row.taken_s,
                             quotas=tuple(quota_from_json(x) for x in row.quotas), ok=row.ok,
                             error=row.error)

    async def mark_account_stale(self, account: str, *, provider: str, error: str) -> int:
        """Count a failed sync; returns consecutive failures. Flags the account's clusters."""
        row = await self._account(account, provider)
        row.failures += 1
        row.last_error = error
        row.updated_s = self._now
        if not row.stale:
            row.stale = True
            await self._events.append("account.stale", account, {"error": error})
        await self._s.execute(update(ClusterRow).where(ClusterRow.account == account)
                              .values(quota_stale=True))
        return row.failures

    async def mark_account_fresh(self, account: str, *, provider: str) -> None:
        row = await self._account(account, provider)
        was_stale = row.stale
        row.stale = False
        row.failures = 0
        row.last_error = ""
        row.last_ok_s = self._now
        row.updated_s = self._now
        await self._s.execute(update(ClusterRow).where(ClusterRow.account == account)
                              .values(quota_stale=False))
        if was_stale:
            await self._events.append("account.fresh", account, {})

    async def get_account(self, account: str) -> AccountState | None:
        row = await self._s.get(ProviderAccountRow, account)
        if row is None:
            return None
        return AccountState(name=row.name, provider=row.provider, stale=row.stale,
                            failures=row.failures, last_ok_s=row.last_ok_s,
                            last_error=row.last_error)

    async def list_accounts(self) -> builtins.list[AccountState]:
        """Every provider account's sync health, by name."""
        rows = (await self._s.scalars(select(ProviderAccountRow)
                                      .order_by(ProviderAccountRow.name))).all()
        return [AccountState(name=r.name, provider=r.provider, stale=r.stale,
                             failures=r.failures, last_ok_s=r.last_ok_s,
                             last_error=r.last_error) for r in rows]

    async def _account(self, account: str, provider: str) -> ProviderAccountRow:
        row = await self._s.get(ProviderAccountRow, account)
        if row is None:
            row = ProviderAccountRow(name=account, provider=provider, stale=False, failures=0,
                                     last_ok_s=None, last_error="", updated_s=self._now)
            self._s.add(row)
            await self._s.flush()
        return row
