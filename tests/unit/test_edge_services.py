"""The hub adopts latency-critical services the LP put on edge sites, where the LP put them."""

from __future__ import annotations

from dataclasses import replace

from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    PricingModel,
    Resources,
    UserRegion,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.federation.edge_hub import HubCore, Send
from broker.federation.edge_services import edge_services
from tests.unit.test_edge_hub_core import SETTINGS, _boot, _svc

CLUSTERS = {
    "kobe": Cluster(name="kobe", provider="edge", region="kobe", lat=34.69, lon=135.19),
    "aws-apne1": Cluster(name="aws-apne1", provider="aws", region="ap-northeast-1"),
}
USERS = {"osaka": UserRegion("osaka", 34.69, 135.50)}


def _workload(wid: str, kind: WorkloadKind = WorkloadKind.SERVICE,
              slo: float | None = 10.0) -> Workload:
    spec = WorkloadSpec(name=f"name-{wid}", kind=kind, image="img:1", replicas=2,
                        resources=Resources(1, 2), user_region="osaka", latency_slo_ms=slo,
                        command=("serve",), env={"A": "1"})
    return Workload(id=wid, tenant="t", spec=spec)


def _placement(wid: str, cluster: str) -> Placement:
    return Placement(workload_id=wid, cost_usd_per_hour=0.1, assignments=(
        Assignment(cluster=cluster, pool="site", pricing=PricingModel.EDGE, replicas=2,
                   price_usd_per_hour=0.1),))


def test_only_slo_services_on_edge_clusters_are_adopted_under_their_workload_id() -> None:
    workloads = {w.id: w for w in (_workload("w-edge"), _workload("w-cloud"),
                                   _workload("w-batch", WorkloadKind.BATCH),
                                   _workload("w-noslo", slo=None))}
    placements = [_placement("w-edge", "kobe"), _placement("w-cloud", "aws-apne1"),
                  _placement("w-batch", "kobe"), _placement("w-noslo", "kobe"),
                  _placement("w-gone", "kobe")]
    (svc,) = edge_services(placements, CLUSTERS, workloads, USERS, rtt_target_ms=50.0)
    assert svc.spec.name == "w-edge"  # the name the dispatcher started it under
    assert svc.prefer_site == "kobe"
    assert svc.need.rtt_target_ms == 50.0
    assert svc.need.resources == Resources(2, 4)
    assert (svc.spec.command, svc.spec.env) == (("serve",), {"A": "1"})
    assert (svc.need.user_lat, svc.need.user_lon) == (34.69, 135.50)


def test_unknown_user_region_is_not_adopted() -> None:
    w = _workload("w-edge")
    w = replace(w, spec=replace(w.spec, user_region="mars"))
    assert edge_services([_placement("w-edge", "kobe")], CLUSTERS, {w.id: w}, USERS,
                         rtt_target_ms=50.0) == []


def test_the_hub_serves_where_the_lp_placed_it_not_where_it_would_rank_first() -> None:
    core = HubCore(SETTINGS)
    _boot(core)
    # osaka ranks first for these users; the LP chose kyoto (e.g. for cost).
    actions = core.add_service(replace(_svc(), prefer_site="kyoto"), 0.0)
    starts = [(a.site, a.command.kind, a.command.standby) for a in actions
              if isinstance(a, Send)]
    assert starts == [("kyoto", "start", False)]
    assert core.services["web"].primary == "kyoto"
