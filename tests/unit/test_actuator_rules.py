"""The actuator's pure rules: which way a pool scales, what the planner sees of pools that
cannot, nodes on order in the commitments, and the Kubernetes prewarm objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.domain import (
    Assignment,
    Cluster,
    Placement,
    Pool,
    PricingModel,
    Resources,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.federation.decision_log import ordered_nodes
from broker.federation.placement_loop import clamp_unscalable
from broker.federation.scaling import scalable_pools, scale_route
from broker.placement.commitments import with_commitments
from broker.store import ClusterRecord, DecisionRecord
from providers.base import ClusterDriver, PrewarmData, PrewarmSpec
from providers.kubernetes_prewarm import daemonset_ready, job_succeeded, render_all
from providers.simulated import SimPool, SimulatedClusterDriver
from providers.simulated_cloud import SimulatedCloudProvider


def _pool(nodes: int = 2, max_nodes: int = 5) -> Pool:
    return Pool(name="cpu", instance_type="m5.xlarge", node=Resources(4, 16, 0), nodes=nodes,
                max_nodes=max_nodes, price_usd_per_hour=0.2)


def _record(name: str, attrs: Mapping[str, Any] | None = None) -> ClusterRecord:
    return ClusterRecord(cluster=Cluster(name=name, provider="aws", region="us-east-1",
                                         pools=(_pool(),)), tenant="admin",
                         attrs=dict(attrs or {}))


def _sim(name: str) -> ClusterDriver:
    return SimulatedClusterDriver(name, [SimPool("cpu", 2, 4, 16)])


class _NoScale:
    """A driver without Capability.SCALE_POOL (the Kubernetes driver's case)."""

    name = "k8s"
    capabilities = frozenset[Any]()


def test_scale_route_prefers_the_declared_hook_then_the_driver_else_refuses() -> None:
    aws = SimulatedCloudProvider()
    drivers: dict[str, Any] = {"sim": _sim("sim"), "k8s": _NoScale(), "hooked": _NoScale()}
    accounts = {"aws-prod": aws}
    hooked = scale_route(_record("hooked", {"scaling": {"account": "aws-prod",
                                                        "groups": {"cpu": "ng-cpu"}}}),
                         "cpu", drivers=drivers, accounts=accounts)
    assert (hooked.how, hooked.account, hooked.group) == ("account", "aws-prod", "ng-cpu")
    assert scale_route(_record("sim"), "cpu", drivers=drivers, accounts=accounts).how == "driver"
    refused = scale_route(_record("k8s"), "cpu", drivers=drivers, accounts=accounts)
    assert refused.how == "refused"
    assert "attrs.scaling.account" in refused.reason
    unknown = scale_route(_record("k8s", {"scaling": {"account": "nope"}}), "cpu",
                          drivers=drivers, accounts=accounts)
    assert "'nope' is not configured" in unknown.reason
    pinned = scale_route(_record("sim", {"scaling": {"enabled": False}}), "cpu",
                         drivers=drivers, accounts=accounts)
    assert pinned.how == "refused"
    assert scalable_pools([_record("sim"), _record("k8s")], drivers=drivers,
                          accounts=accounts) == {("sim", "cpu")}


def test_pools_that_cannot_scale_show_max_nodes_equal_nodes() -> None:
    a = _record("a").cluster
    b = _record("b").cluster
    out = {c.name: c.pools[0] for c in clamp_unscalable([a, b], {("a", "cpu")})}
    assert (out["a"].nodes, out["a"].max_nodes) == (2, 5)
    assert (out["b"].nodes, out["b"].max_nodes) == (2, 2)


def _order(cluster: str, target: int, kind: str = "scale") -> DecisionRecord:
    return DecisionRecord(id=1, kind=kind, key=f"pool:{cluster}/cpu", tenant=None,
                          cluster=cluster, pool="cpu", workload_id="",
                          spec={"target_nodes": target}, state="running")


def test_nodes_on_order_count_once_and_placements_new_nodes_not_again() -> None:
    cluster = _record("c").cluster
    spec = WorkloadSpec(name="w", kind=WorkloadKind.SERVICE, image="i", replicas=3,
                        resources=Resources(4, 4, 0))
    w = Workload(id="w1", tenant="t", spec=spec)
    placed = Placement("w1", (Assignment("c", "cpu", PricingModel.ON_DEMAND, 3, 0.6,
                                         new_nodes=1),), 0.6)
    ordered = ordered_nodes([_order("c", 3), _order("c", 4, "prewarm"),
                             _order("x", 9, "scale_in")])
    assert ordered == {("c", "cpu"): 4}
    [with_orders] = with_commitments([cluster], [placed], {"w1": w}, ordered={("c", "cpu"): 3})
    assert with_orders.pools[0].nodes == 3  # max(registered 2, ordered 3): not 2 + 3 + 1
    [legacy] = with_commitments([cluster], [placed], {"w1": w})
    assert legacy.pools[0].nodes == 3  # without orders the placement's new node stands in


def test_prewarm_objects_are_named_by_key_and_check_what_they_copy() -> None:
    spec = PrewarmSpec(key="prewarm:c/gpu/w-1", pool="gpu", images=("a:1", "b:2"),
                       data=(PrewarmData(url="https://x/d.tar", sha256="ab" * 32),
                             PrewarmData(url="")))
    ds, job = render_all(spec, namespace="ns")  # a data set without a URL is not copied
    assert ds["kind"] == "DaemonSet"
    assert job["kind"] == "Job"
    assert len(ds["metadata"]["name"]) <= 63
    assert ds["metadata"]["name"] == render_all(spec, namespace="ns")[0]["metadata"]["name"]
    assert [c["image"] for c in ds["spec"]["template"]["spec"]["initContainers"]] == \
        ["a:1", "b:2"]
    assert not daemonset_ready({"status": {"desiredNumberScheduled": 0, "numberReady": 0}})
    assert daemonset_ready({"status": {"desiredNumberScheduled": 2, "numberReady": 2}})
    assert not job_succeeded({"status": {"active": 1}})
    assert job_succeeded({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
