"""The submission fast path: `Store.submit_workload`.

`POST /v1/workloads` is the API's hot path (goal: >= 1,000/s on 2 cores). On
PostgreSQL it runs ONE autocommitted statement on a small asyncpg pool of its
own: insert-unless-the-Idempotency-Key-exists plus its `workload.submitted`
event, as one data-modifying CTE. A single statement is atomic and, with
`synchronous_commit=on`, durable when it returns -- the same guarantee as a
unit of work -- for about a quarter of the CPU (measured: ~0.12-0.2 ms against
~0.9 ms through an ORM session with BEGIN/COMMIT round trips). Everything
else, and SQLite, goes through a normal unit of work (`WorkloadRepo.submit`),
which writes the same rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from broker.domain import Workload, WorkloadSpec, WorkloadStatus
from broker.store.engine import json_dumps, mapped_errors
from broker.store.records import WorkloadRecord
from broker.store.workloads import new_workload_id

if TYPE_CHECKING:
    from broker.store.uow import Store

# Same rows as WorkloadRepo.submit / _PG_SUBMIT, in asyncpg's $n notation.
_SQL = """
WITH w AS (
  INSERT INTO workloads (id, tenant, name, kind, status, priority, spec, idempotency_key,
                         request_sha256, placement_id, message, submitted_s, updated_s)
  VALUES ($1, $2, $3, $4, 'pending', $5, $6::jsonb, $7, $8, NULL, '', $9, $9)
  ON CONFLICT (tenant, idempotency_key) DO NOTHING
  RETURNING id, tenant)
INSERT INTO events (ts, tenant, kind, subject, data)
SELECT $9, tenant, 'workload.submitted', id, $10::jsonb FROM w
RETURNING subject
"""


async def _keep(_conn: Any) -> None:
    """Pool release hook: nothing to reset (see PgFastPath)."""


class PgFastPath:
    """A lazily created asyncpg pool for the hot path (owned and closed by `Store`)."""

    def __init__(self, url: URL, schema: str | None, size: int) -> None:
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._settings = {"application_name": "skyfed-fast"}
        if schema:
            self._settings["search_path"] = schema
        self._size = size
        self._pool: Any = None
        self._lock = asyncio.Lock()

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        if self._pool is None:
            async with self._lock:
                if self._pool is None:
                    import asyncpg

                    # reset=_keep: these connections only ever run autocommitted
                    # single statements, so asyncpg's reset round trip on every
                    # release (RESET ALL, UNLISTEN *, ...) would be pure cost.
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=1, max_size=self._size, command_timeout=30,
                        server_settings=self._settings, reset=_keep)
        return await self._pool.fetchrow(sql, *args)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


async def submit_workload(store: Store, *, tenant: str, spec: WorkloadSpec,
                          spec_json: Mapping[str, Any], idempotency_key: str | None,
                          request_sha256: str) -> tuple[WorkloadRecord, bool]:
    """Store a pending workload (see `WorkloadRepo.submit` for the contract)."""
    fast = store.fast_path
    if fast is None:
        async with store.unit() as uow:
            return await uow.workloads.submit(
                tenant=tenant, spec=spec, spec_json=spec_json,
                idempotency_key=idempotency_key, request_sha256=request_sha256)
    wid = new_workload_id()
    now = store.clock.now()
    with mapped_errors("submit workload"):
        row = await fast.fetchrow(_SQL, wid, tenant, spec.name, str(spec.kind), spec.priority,
                                  json_dumps(spec_json), idempotency_key, request_sha256, now,
                                  json_dumps({"name": spec.name}))
    if row is None:
        if idempotency_key is None:  # pragma: no cover - a NULL key never conflicts
            raise RuntimeError("insert without a key returned no row")
        async with store.unit() as uow:
            rec = await uow.workloads.replay(tenant=tenant, idempotency_key=idempotency_key,
                                             request_sha256=request_sha256)
        return rec, False
    return WorkloadRecord(workload=Workload(id=wid, tenant=tenant, spec=spec,
                                            status=WorkloadStatus.PENDING, submitted_s=now),
                          updated_s=now, idempotency_key=idempotency_key), True
