"""Choose the serving, standby and failover sites of latency-critical edge services. Pure.

For one service with users at (lat, lon) and an RTT target, a site is
*feasible* when it is healthy, not excluded, one the service's tenant may use
(`allowed_sites`), has the free capacity, and its RTT to the users is within
the target. The RTT is the agent's measured value
when there is one (`measured_rtt_ms[(site, user_key)]`), else the estimate of
`providers.geo.estimate_rtt_ms`.

Among feasible sites we minimise, per service,

    score_usd_per_hour = price_usd_per_hour(site) * cpu_share(service, site)
                         + latency_weight_usd_per_ms * rtt_ms(site, users)

i.e. the same cost + lambda * latency trade-off as the placement LP
(DESIGN.md), restricted to edge sites; ties break on RTT, then name, so the
choice is deterministic. The standby is the best feasible site other than the
primary: on a failure the users land on the next-nearest good site.

`plan_standbys` does this for many services at once, tightest RTT target first,
deducting each chosen standby's reservation from the site's free capacity so a
failure of one site cannot promote more standbys onto another than it can hold.
This greedy pass is what the edge hub runs on its failure path (microseconds);
the placement LP (`broker/placement/lp.py`) is not used here because a
failover decision must not wait for a solver.

`should_rebalance` is the hysteresis rule: move a service back only when the
candidate's score beats the current one by more than the `hysteresis` fraction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.domain import Resources, Site, SiteHealth
from providers.geo import estimate_rtt_ms

__all__ = [
    "EdgeServiceNeed",
    "SiteChoice",
    "plan_standbys",
    "rank_sites",
    "should_rebalance",
    "site_rtt_ms",
]


@dataclass(frozen=True, slots=True)
class EdgeServiceNeed:
    """What a latency-critical edge service needs from the site that serves it."""

    name: str
    user_lat: float
    user_lon: float
    rtt_target_ms: float = 50.0
    resources: Resources = field(default_factory=Resources)
    user_key: str = ""  # probe-point name the agents' measured RTTs are keyed by
    latency_weight_usd_per_ms: float = 0.001
    # The sites the service's tenant may use (federation-wide, its own, lent to it);
    # None: every site. A failover never lands on another tenant's private site.
    allowed_sites: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class SiteChoice:
    site: str
    rtt_ms: float
    score_usd_per_hour: float


def site_rtt_ms(need: EdgeServiceNeed, site: Site,
                measured_rtt_ms: Mapping[tuple[str, str], float] | None = None) -> float:
    if measured_rtt_ms and need.user_key:
        measured = measured_rtt_ms.get((site.name, need.user_key))
        if measured is not None:
            return measured
    return estimate_rtt_ms(site.lat, site.lon, need.user_lat, need.user_lon)


def _score(need: EdgeServiceNeed, site: Site, rtt_ms: float) -> float:
    share = need.resources.cpu / site.capacity.cpu if site.capacity.cpu > 0 else 0.0
    return site.price_usd_per_hour * share + need.latency_weight_usd_per_ms * rtt_ms


def rank_sites(
    need: EdgeServiceNeed,
    sites: Sequence[Site],
    *,
    measured_rtt_ms: Mapping[tuple[str, str], float] | None = None,
    exclude: frozenset[str] | set[str] = frozenset(),
    free: Mapping[str, Resources] | None = None,
) -> list[SiteChoice]:
    """Feasible sites for `need`, best first (see module docstring).

    `free` is each site's free capacity (default: its whole capacity).
    """
    out: list[SiteChoice] = []
    for site in sites:
        if site.health is not SiteHealth.HEALTHY or site.name in exclude:
            continue
        if need.allowed_sites is not None and site.name not in need.allowed_sites:
            continue
        avail = free.get(site.name, site.capacity) if free is not None else site.capacity
        if not need.resources.fits_in(avail):
            continue
        rtt = site_rtt_ms(need, site, measured_rtt_ms)
        if rtt > need.rtt_target_ms:
            continue
        out.append(SiteChoice(site.name, rtt, _score(need, site, rtt)))
    out.sort(key=lambda c: (c.score_usd_per_hour, c.rtt_ms, c.site))
    return out


def plan_standbys(
    needs: Sequence[EdgeServiceNeed],
    sites: Sequence[Site],
    primaries: Mapping[str, str],
    *,
    measured_rtt_ms: Mapping[tuple[str, str], float] | None = None,
    free: Mapping[str, Resources] | None = None,
    keep: Mapping[str, str] | None = None,
) -> dict[str, SiteChoice | None]:
    """A standby site per service (None when no feasible site other than its primary).

    `primaries[name]` is where the service serves now. `keep[name]` is its
    current standby, kept when still feasible (a move costs a prewarm).
    Services with the tightest RTT target choose first.
    """
    remaining = dict(free) if free is not None else {s.name: s.capacity for s in sites}
    by_name = {s.name: s for s in sites}
    result: dict[str, SiteChoice | None] = {}
    for need in sorted(needs, key=lambda n: (n.rtt_target_ms, n.name)):
        primary = primaries.get(need.name, "")
        ranked = rank_sites(need, sites, measured_rtt_ms=measured_rtt_ms,
                            exclude={primary}, free=remaining)
        current = (keep or {}).get(need.name)
        choice = next((c for c in ranked if c.site == current), None) if current else None
        if choice is None and ranked:
            choice = ranked[0]
        result[need.name] = choice
        if choice is not None and choice.site in by_name:
            remaining[choice.site] = remaining.get(
                choice.site, by_name[choice.site].capacity) - need.resources
    return result


def should_rebalance(current: SiteChoice | None, candidate: SiteChoice | None,
                     hysteresis: float) -> bool:
    """Move from `current` to `candidate` only if it pays by more than `hysteresis`.

    A missing current site (nothing serves) always loses to a feasible candidate.
    """
    if candidate is None:
        return False
    if current is None:
        return True
    if candidate.site == current.site:
        return False
    return candidate.score_usd_per_hour < current.score_usd_per_hour * (1.0 - hysteresis)
