"""Clusters the placement loop leaves out, and the events that say so.

`Quarantine.screen(uow, clusters)` runs the pure check of
`broker/placement/sanity.py` over what the loop just read and returns the
clusters fit to plan with. A cluster that fails it is left out of the epoch,
logged, and recorded once (not every epoch) as the event `cluster.quarantined`
(`{"reason": ...}`) for the tenant that owns it; when it passes again (the
owner re-registered it with sane values) the event `cluster.released` follows.
Every other cluster, and every other tenant's work, is planned as usual.

The memory of what was reported lives in the loop's process: after a restart a
still-bad cluster is reported once more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from broker.domain import Cluster
from broker.errors import NotFoundError
from broker.placement.sanity import partition
from broker.store import UnitOfWork

__all__ = ["Quarantine"]

log = logging.getLogger(__name__)


class Quarantine:
    """See the module docstring."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}  # cluster -> why it is left out now

    async def screen(self, uow: UnitOfWork, clusters: Sequence[Cluster]) -> list[Cluster]:
        good, bad = partition(clusters)
        await self.record(uow, bad)
        return good

    def changed(self, bad: Mapping[str, str]) -> bool:
        """Whether `record` would write anything for `bad` (so callers can skip a unit)."""
        return dict(bad) != self.reasons

    async def record(self, uow: UnitOfWork, bad: Mapping[str, str]) -> None:
        """Events for clusters newly left out (or left out for a new reason) and released."""
        for name, reason in bad.items():
            if self.reasons.get(name) != reason:
                log.warning("placement leaves out cluster %s: %s", name, reason)
                await self._event(uow, "cluster.quarantined", name, {"reason": reason})
        for name in self.reasons.keys() - bad.keys():
            await self._event(uow, "cluster.released", name, {})
        self.reasons = dict(bad)

    @staticmethod
    async def _event(uow: UnitOfWork, kind: str, name: str, data: dict[str, str]) -> None:
        try:
            tenant: str | None = (await uow.clusters.get(name)).tenant
        except NotFoundError:  # deleted meanwhile: nothing left to tell its owner
            return
        await uow.events.append(kind, name, data, tenant=tenant)
