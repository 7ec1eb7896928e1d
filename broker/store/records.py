"""Values the repositories return that carry more than a `broker.domain` type
(ids, bookkeeping); each wraps the domain value rather than copying it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.domain import Cluster, Placement, Role, Site, Workload
from broker.placement.observed import ObservedNode
from providers.base import Quota


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a bearer token speaks for, and in which role."""

    tenant: str
    role: Role
    token_id: str

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def registers_shared(self) -> bool:
        """Admins and operators register federation-wide members; tenants private ones."""
        return self.role in (Role.ADMIN, Role.OPERATOR)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as listed: never the token itself (only its hash is stored)."""

    id: str
    tenant: str
    role: Role
    description: str
    created_s: float
    expires_s: float | None
    revoked: bool


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    workload: Workload
    placement_id: str | None = None
    message: str = ""
    updated_s: float = 0.0
    idempotency_key: str | None = None
    # Fields repaired on read (stored by an older version outside today's limits).
    sanitized: tuple[str, ...] = ()
    # The planner's retry state besides `workload.attempts` and `last_attempt_s`: when it is
    # tried again and why the last attempt left it (partly) unplaced (planner.Retry).
    not_before_s: float | None = None
    retry_reason: str | None = None

    @property
    def retry_message(self) -> str:
        """Why it waits and when it is tried again ("" when it does not wait)."""
        w = self.workload
        if not self.retry_reason or w.attempts <= 0:
            return ""
        return retry_message(self.retry_reason, w.attempts, w.last_attempt_s, self.not_before_s)


def retry_message(reason: str, attempts: int, last_attempt_s: float | None,
                  not_before_s: float | None) -> str:
    """`<reason> (attempt N; next try in S s)`: the planner's reason and its backoff, measured
    from that attempt (it may come sooner once capacity grows: placement/decisions.py)."""
    if last_attempt_s is None or not_before_s is None:
        return f"{reason} (attempt {attempts})"
    return f"{reason} (attempt {attempts}; next try in {not_before_s - last_attempt_s:.0f} s)"


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    id: str
    tenant: str
    placement: Placement
    active: bool
    dispatched: bool
    dispatch_attempts: int
    last_error: str
    created_s: float
    updated_s: float
    # cluster -> {"ready", "desired", "phase", "message"}: the reconciler's last reading
    cluster_status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    cluster: Cluster
    tenant: str
    account: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    updated_s: float = 0.0
    shared: bool = False  # federation-wide; else private to `tenant` and `lent_to`
    lent_to: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SiteRecord:
    site: Site
    tenant: str
    last_seen_s: float | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    updated_s: float = 0.0
    shared: bool = False  # federation-wide; else private to `tenant` and `lent_to`
    lent_to: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    account: str
    provider: str
    taken_s: float
    quotas: tuple[Quota, ...]
    ok: bool = True
    error: str = ""


@dataclass(frozen=True, slots=True)
class AccountState:
    name: str
    provider: str
    stale: bool
    failures: int
    last_ok_s: float | None
    last_error: str


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    ts: float
    tenant: str | None
    kind: str
    subject: str
    data: Mapping[str, Any]
    # Paths in `data` repaired on read (numbers no encoder can write, control characters).
    sanitized: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One stored non-placement decision (models.DecisionRow) and the actuator's progress."""

    id: int
    kind: str  # scale | scale_in | prewarm | migration
    key: str
    tenant: str | None
    cluster: str
    pool: str
    workload_id: str
    spec: Mapping[str, Any]
    state: str  # pending | running | done | refused | failed | superseded
    step: str = ""
    attempts: int = 0
    not_before_s: float | None = None
    last_error: str = ""
    created_s: float = 0.0
    updated_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list; pass `next_cursor` back to get the next (None: last page)."""

    items: tuple[Any, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class InventoryRecord:
    """A member's newest observed nodes (see store/inventory.py)."""

    member: str
    observed_s: float
    since_s: float
    nodes: tuple[ObservedNode, ...]
    reclaims: Mapping[str, int] = field(default_factory=dict)
    error: str = ""
    error_s: float | None = None
