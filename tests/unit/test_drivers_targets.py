"""Registration -> driver target: which kind, which options, and the errors that name the cluster.

Pure: `target_for` reads only the registration (and the shipped catalog for pools without a
node size), so these run without a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from broker.domain import Cluster, Pool, PricingModel, Resources
from broker.federation.driver_targets import (
    DriverConfigError,
    DriverTarget,
    driver_kind,
    target_for,
)
from broker.federation.drivers import EdgeDriverFactory
from broker.store import ClusterRecord
from providers.base import ApplySpec, Interconnect, WorkloadPhase
from providers.errors import TransientError


def record(attrs: dict[str, Any] | None = None, *, provider: str = "aws",
           tenant: str = "admin", pools: tuple[Pool, ...] | None = None) -> ClusterRecord:
    if pools is None:
        pools = (Pool(name="cpu", instance_type="c5.xlarge", node=Resources(4, 8, 0), nodes=2,
                      max_nodes=5, price_usd_per_hour=0.17),)
    cluster = Cluster(name="c1", provider=provider, region="us-east-1", pools=pools,
                      labels={"tier": "prod"}, taints=("dedicated=ml:NoSchedule",))
    return ClusterRecord(cluster=cluster, tenant=tenant, attrs=attrs or {})


@pytest.mark.parametrize(("attrs", "provider", "kind"), [
    ({}, "aws", "simulated"),
    ({}, "onprem", "simulated"),
    ({}, "edge", "edge"),
    ({"kubeconfig": "/k"}, "aws", "kubernetes"),
    ({"in_cluster": True}, "gcp", "kubernetes"),
    ({"kubernetes": {"namespace": "x"}}, "azure", "kubernetes"),
    ({"driver": "simulated", "kubeconfig": "/k"}, "aws", "simulated"),
    ({"driver": "kubernetes"}, "edge", "kubernetes"),
    ({"telemetry": {"cpu": 1}}, "aws", "simulated"),
])
def test_driver_kind_rules(attrs: dict[str, Any], provider: str, kind: str) -> None:
    assert driver_kind(record(attrs, provider=provider)) == kind


def test_unknown_driver_kind_names_cluster_and_value() -> None:
    with pytest.raises(DriverConfigError, match=r"cluster 'c1'.*unknown driver 'nomad'") as ei:
        target_for(record({"driver": "nomad"}))
    assert ei.value.cluster == "c1"


def test_simulated_pool_starts_at_registered_nodes_the_actuator_scales_it() -> None:
    t = target_for(record())
    assert t.kind == "simulated"
    (pool,) = t.pools
    assert (pool.name, pool.nodes, pool.cpu_per_node, pool.memory_gib_per_node) == \
        ("cpu", 2, 4, 8)
    assert pool.labels == {"tier": "prod"}
    assert pool.taints == ("dedicated=ml:NoSchedule",)
    assert t.options == {"startup_s": 0.0, "seed": 0, "boot_s": 0.0, "prewarm_s": 0.0,
                         "error_rate": 0.0}


def test_a_simulated_pools_nodes_carry_its_registered_taints_after_the_clusters() -> None:
    gpu = Pool(name="gpu", instance_type="g6.48xlarge", node=Resources(192, 768, 8), nodes=1,
               max_nodes=2, price_usd_per_hour=13.35, gpu_model="L4",
               taints=("nvidia.com/gpu=true:NoSchedule",))
    (pool,) = target_for(record(pools=(gpu,))).pools
    assert pool.taints == ("dedicated=ml:NoSchedule", "nvidia.com/gpu=true:NoSchedule")


def test_edge_site_pools_stay_at_full_size() -> None:
    t = target_for(record({"driver": "edge"}))
    (pool,) = t.pools
    assert pool.nodes == 5


def test_simulated_pool_without_size_takes_it_from_the_catalog() -> None:
    gpu = Pool(name="a100", instance_type="p4d.24xlarge", node=Resources(), nodes=1,
               max_nodes=2, price_usd_per_hour=32.77)
    (pool,) = target_for(record(pools=(gpu,))).pools
    assert (pool.cpu_per_node, pool.memory_gib_per_node, pool.gpu_per_node) == (96, 1152, 8)
    assert pool.gpu_model == "A100"
    assert pool.interconnect is Interconnect.NVLINK_FULL


def test_pool_missing_from_catalog_names_pool_and_type() -> None:
    odd = Pool(name="odd", instance_type="zz9.huge", node=Resources(), nodes=1, max_nodes=1,
               price_usd_per_hour=1.0)
    with pytest.raises(DriverConfigError, match=r"cluster 'c1': pool 'odd'.*zz9\.huge"):
        target_for(record(pools=(odd,)))


def test_kubernetes_options_from_shorthand_and_nested() -> None:
    t = target_for(record({"kubeconfig": "~/kube.yaml", "context": "prod", "namespace": "team-a",
                           "kubernetes": {"timeout_s": 5}}))
    assert t.kind == "kubernetes"
    assert t.options["kubeconfig"].endswith("/kube.yaml")
    assert not t.options["kubeconfig"].startswith("~")
    assert (t.options["context"], t.options["namespace"], t.options["timeout_s"]) == \
        ("prod", "team-a", 5.0)
    assert t.options["in_cluster"] is False


@pytest.mark.parametrize(("attrs", "message"), [
    ({"kubeconfig": "/k", "kubernetes": {"kubeconfg": "/x"}}, r"unknown key\(s\).*kubeconfg"),
    ({"kubeconfig": "/k", "namespace": "Bad_NS"}, r"namespace 'Bad_NS'"),
    ({"kubeconfig": 42}, r"attrs\.kubeconfig must be a non-empty string"),
    ({"in_cluster": "yes"}, r"attrs\.in_cluster must be true or false"),
    ({"kubeconfig": "/k", "kubernetes": {"timeout_s": -1}}, r"timeout_s must be a number"),
    ({"kubeconfig": "/k", "kubernetes": {"max_concurrency": 0}}, r"max_concurrency must be > 0"),
    ({"simulated": {"startup": 1}}, r"unknown key\(s\) in attrs\.simulated: startup"),
    ({"edge": "site-1"}, r"attrs\.edge must be an object"),
    ({"simulated": {"error_rate": 1.5}}, r"error_rate must be within 0\.\.1"),
])
def test_bad_attrs_are_refused_by_name(attrs: dict[str, Any], message: str) -> None:
    provider = "edge" if "edge" in attrs else "aws"
    with pytest.raises(DriverConfigError, match=message):
        target_for(record(attrs, provider=provider))


def test_only_trusted_tenants_may_point_at_host_kubeconfigs() -> None:
    with pytest.raises(DriverConfigError, match=r"tenant 'acme' may not register a kubernetes"):
        target_for(record({"kubeconfig": "/etc/kube"}, tenant="acme"))
    assert target_for(record({"kubeconfig": "/k"}, tenant="acme"),
                      trusted_tenants=frozenset({"acme"})).kind == "kubernetes"
    assert target_for(record({"kubeconfig": "/k"}, tenant="acme"),
                      trusted_tenants=None).kind == "kubernetes"
    assert target_for(record(tenant="acme")).kind == "simulated"  # no host access needed
    shared = replace(record({"kubeconfig": "/k"}, tenant="ops"), shared=True)
    assert target_for(shared).kind == "kubernetes"  # an operator's federation-wide cluster


def test_fingerprint_ignores_what_does_not_change_the_driver() -> None:
    base = target_for(record())
    assert target_for(record({"telemetry": {"cpu": 3}})).fingerprint == base.fingerprint
    # The actuator grows pools: a new node count must not rebuild (and empty) the cluster.
    grown = Pool(name="cpu", instance_type="c5.xlarge", node=Resources(4, 8, 0), nodes=4,
                 max_nodes=9, price_usd_per_hour=0.17)
    assert target_for(record(pools=(grown,))).fingerprint == base.fingerprint
    bigger = Pool(name="cpu", instance_type="c5.2xlarge", node=Resources(8, 16, 0), nodes=2,
                  max_nodes=5, price_usd_per_hour=0.34)
    assert target_for(record(pools=(bigger,))).fingerprint != base.fingerprint
    assert DriverTarget(name="c1", kind="edge", tenant="t").fingerprint != base.fingerprint


class FakeHub:
    """The edge hub's EdgeTransport side, without MQTT: acks every command."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_command(self, **kw: Any) -> Mapping[str, Any]:
        self.sent.append(kw)
        return {"ok": True}

    def site_services(self, *, site: str) -> Mapping[str, str] | None:
        return {"w-1": "serving"} if self.sent else None


def edge_record(attrs: dict[str, Any] | None = None) -> ClusterRecord:
    site = Pool(name="site", instance_type="edge", node=Resources(16, 64, 1), nodes=1,
                max_nodes=1, price_usd_per_hour=0.3, pricing=PricingModel.EDGE)
    return record(attrs, provider="edge", pools=(site,))


async def test_edge_driver_reaches_its_site_through_whatever_hub_runs_now() -> None:
    hub: list[FakeHub] = []
    target = target_for(edge_record({"edge": {"site": "muc-1", "commandTimeoutS": 2}}))
    assert target.options == {"site": "muc-1", "command_timeout_s": 2.0}
    driver = EdgeDriverFactory(lambda: hub[0] if hub else None)(target)
    assert driver.name == "muc-1"
    (node,) = await driver.inventory()
    assert (node.allocatable_cpu, node.allocatable_memory_gib, node.allocatable_gpu) == (16, 64, 1)
    spec = ApplySpec(workload_id="w-1", tenant="t", name="web", kind="service", image="x",
                     replicas=1, cpu=1, memory_gib=1)
    with pytest.raises(TransientError, match=r"no edge hub"):
        await driver.apply(spec=spec)  # the hub is not up yet: retryable
    hub.append(FakeHub())  # the hub started after the driver was built
    await driver.apply(spec=spec)
    assert hub[0].sent[0]["site"] == "muc-1"
    assert hub[0].sent[0]["kind"] == "start"
    assert hub[0].sent[0]["timeout_s"] == 2.0
    assert (await driver.status(workload_id="w-1")).phase is WorkloadPhase.RUNNING


def test_edge_attrs_are_checked() -> None:
    assert target_for(edge_record()).options == {"site": "c1", "command_timeout_s": 5.0}
    with pytest.raises(DriverConfigError, match=r"unknown key\(s\) in attrs\.edge: mqtt"):
        target_for(edge_record({"edge": {"mqtt": "x"}}))


def test_camel_case_attrs_as_the_api_writes_them() -> None:
    t = target_for(record({"inCluster": True, "kubernetes": {"timeoutS": 3, "maxConcurrency": 2},
                           "namespace": "ml"}))
    assert t.kind == "kubernetes"
    assert (t.options["in_cluster"], t.options["timeout_s"], t.options["max_concurrency"],
            t.options["namespace"]) == (True, 3.0, 2, "ml")
    assert isinstance(t.options["max_concurrency"], int)
    made = target_for(record({"kubeconfig": "/k", "kubernetes": {"createNamespace": True}}))
    assert made.options["create_namespace"] is True
    with pytest.raises(DriverConfigError, match=r"create_namespace must be true or false"):
        target_for(record({"kubeconfig": "/k", "kubernetes": {"createNamespace": "yes"}}))
    sim = target_for(record({"simulated": {"startupS": 0.5}}))
    assert sim.options["startup_s"] == 0.5


def test_a_simulated_clusters_injected_provider_error_rate() -> None:
    """What `skyfed bench chaos` registers: 30 % of provider calls fail (429 or 5xx)."""
    assert target_for(record()).options["error_rate"] == 0.0
    t = target_for(record({"simulated": {"errorRate": 0.3}}))
    assert t.options["error_rate"] == 0.3
