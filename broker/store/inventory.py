"""Observed inventory (the newest node list each driver reported, the inventory poller's)
and the per-pool demand EWMA (kept as placements are recorded).

One row per member (cluster or edge site): written by every poll, so every broker replica
(API, placement loop) reads the same observation; `observed_s` advances with each poll. The
poller keeps per-node timers in it (`idle_since_s`, `ever_ready`), so they survive restarts.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from broker.placement.observed import ObservedNode, decayed
from broker.store.mapping import node_from_json, node_to_json
from broker.store.models import InventoryRow, PoolDemandRow
from broker.store.records import InventoryRecord


def _record(r: InventoryRow) -> InventoryRecord:
    return InventoryRecord(member=r.member, observed_s=r.observed_s, since_s=r.since_s,
                           nodes=tuple(node_from_json(n) for n in r.nodes or ()),
                           reclaims={str(k): int(v) for k, v in (r.reclaims or {}).items()},
                           error=r.error, error_s=r.error_s)


class InventoryRepo:
    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def get(self, member: str) -> InventoryRecord | None:
        row = await self._s.get(InventoryRow, member)
        return None if row is None else _record(row)

    async def list(self) -> builtins.dict[str, InventoryRecord]:
        rows = (await self._s.scalars(select(InventoryRow).order_by(InventoryRow.member))).all()
        return {r.member: _record(r) for r in rows}

    async def put(self, member: str, nodes: Sequence[ObservedNode], *,
                  reclaims: Mapping[str, int] | None = None,
                  observed_s: float | None = None) -> None:
        """Replace `member`'s observation (a poll succeeded); the first one sets `since_s`."""
        at = self._now if observed_s is None else observed_s
        row = await self._s.get(InventoryRow, member)
        if row is None:
            row = InventoryRow(member=member, since_s=at, error="", error_s=None)
            self._s.add(row)
        row.observed_s = at
        row.nodes = [node_to_json(n) for n in nodes]
        if reclaims is not None:
            row.reclaims = dict(reclaims)
        row.error, row.error_s = "", None

    async def record_error(self, member: str, error: str) -> None:
        """A poll failed: keep the last observation (its age shows), remember why."""
        row = await self._s.get(InventoryRow, member)
        if row is not None:
            row.error, row.error_s = error[:2000], self._now

    async def delete(self, member: str) -> None:
        await self._s.execute(delete(InventoryRow).where(InventoryRow.member == member))


class DemandRepo:
    """Per-pool demand EWMA rows (models.PoolDemandRow)."""

    def __init__(self, session: AsyncSession, now: float) -> None:
        self._s = session
        self._now = now

    async def add(self, cluster: str, pool: str, *, cpu: float, gpu: float,
                  tau_s: float) -> None:
        """Count `cpu` vCPUs and `gpu` GPUs requested now: decay to now, add amount / tau."""
        row = await self._s.get(PoolDemandRow, (cluster, pool))
        if row is None:
            row = PoolDemandRow(cluster=cluster, pool=pool, cpu_per_s=0.0, gpu_per_s=0.0,
                                at_s=self._now)
            self._s.add(row)
        row.cpu_per_s = decayed(row.cpu_per_s, row.at_s, self._now, tau_s) + cpu / tau_s
        row.gpu_per_s = decayed(row.gpu_per_s, row.at_s, self._now, tau_s) + gpu / tau_s
        row.at_s = max(row.at_s, self._now)

    async def list(self) -> builtins.dict[tuple[str, str], tuple[float, float, float]]:
        """(cluster, pool) -> (vCPU/s, GPU/s, as of when): decay to your now before use."""
        rows = (await self._s.scalars(select(PoolDemandRow))).all()
        return {(r.cluster, r.pool): (r.cpu_per_s, r.gpu_per_s, r.at_s) for r in rows}
