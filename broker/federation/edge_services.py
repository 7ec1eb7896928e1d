"""Which placed workloads the edge hub keeps served with a warm standby.

A workload is *latency-critical at the edge* when it is a service with a
latency SLO whose active placement runs on an edge cluster. The placement LP
chose that site and the dispatcher started it there (as service
`<workload id>`, see providers/edge.py); the hub adopts it under the same name,
prefers the LP's site (`EdgeService.prefer_site`), keeps a warm standby at the
best other healthy site within the RTT target and fails over to it.

The workload's SLO governs where the LP puts the primary; the standby and any
failover site must meet `edge.rtt_target_ms` (the seed's < 50 ms target): a
standby a little farther than the SLO beats no standby when the site dies.
User coordinates resolve as in the placement loop: configured
`[[placement.user_regions]]`, edge sites by name, catalog regions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from broker.domain import Cluster, Placement, UserRegion, Workload, WorkloadKind
from broker.federation.edge_core import EdgeService
from broker.placement.snapshot import site_cluster
from broker.placement.standby import EdgeServiceNeed
from edge_agent.protocol import ServiceSpec

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime


def hub_serves(w: Workload) -> bool:
    """Whether the hub keeps `w` served on the edge (and so decides its failover)."""
    return w.spec.kind == WorkloadKind.SERVICE and w.spec.latency_slo_ms is not None


def edge_services(
    placements: Iterable[Placement], clusters: Mapping[str, Cluster],
    workloads: Mapping[str, Workload], users: Mapping[str, UserRegion], *,
    rtt_target_ms: float, site_tenants: Mapping[str, frozenset[str] | None] | None = None,
) -> list[EdgeService]:
    """The EdgeServices for the latency-critical edge placements (see module docstring).

    `site_tenants`: each site's allowed tenants (None: federation-wide); a service may only
    fail over to a site its tenant may use."""
    out: list[EdgeService] = []
    private = site_tenants is not None and any(v is not None for v in site_tenants.values())
    for p in placements:
        w = workloads.get(p.workload_id)
        if w is None or not hub_serves(w):
            continue
        edge = [a.cluster for a in p.assignments
                if (c := clusters.get(a.cluster)) is not None and c.is_edge]
        user = users.get(w.spec.user_region or "")
        if not edge or user is None:
            continue
        allowed = frozenset(n for n, ts in site_tenants.items() if ts is None or w.tenant in ts) \
            if private and site_tenants is not None else None
        need = EdgeServiceNeed(name=w.id, user_lat=user.lat, user_lon=user.lon,
                               rtt_target_ms=rtt_target_ms,
                               resources=w.spec.total, user_key=user.name,
                               allowed_sites=allowed)
        spec = ServiceSpec(name=w.id, command=tuple(w.spec.command), env=dict(w.spec.env))
        out.append(EdgeService(need=need, spec=spec, images=(w.spec.image,),
                               prefer_site=edge[0]))
    return out


def edge_services_loader(rt: Runtime) -> Callable[[], Awaitable[Sequence[EdgeService]]]:
    """An `EdgeHub.service_loader` reading the store (one unit of work per call)."""
    from broker.federation.snapshot import user_regions

    store = rt.loop_store()
    settings = rt.settings

    async def load() -> Sequence[EdgeService]:
        async with store.unit() as uow:
            clusters = {c.name: c for c in await uow.clusters.list()}
            sites = await uow.sites.list()
            for site in sites:  # a site registered once is an edge cluster (no shadow row)
                clusters.setdefault(site.name, site_cluster(site))
            edge_names = {n for n, c in clusters.items() if c.is_edge}
            if not edge_names:
                return []
            placed = [r.placement for r in await uow.placements.list_active()
                      if any(a.cluster in edge_names for a in r.placement.assignments)]
            if not placed:
                return []
            workloads = await uow.workloads.get_many([p.workload_id for p in placed])
            records = await uow.sites.list_records()
            sites = [r.site for r in records]
        users = {u.name: u for u in user_regions(settings.placement, rt.offline_catalog(),
                                                  list(workloads.values()), sites)}
        scopes = {r.site.name: None if r.shared else frozenset({r.tenant, *r.lent_to})
                  for r in records}
        return edge_services(placed, clusters, workloads, users,
                             rtt_target_ms=settings.edge.rtt_target_ms, site_tenants=scopes)

    return load

