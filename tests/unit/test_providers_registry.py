"""The adapter registry: lazy lookup, typed options from mappings, errors that name things."""

from __future__ import annotations

import pytest

from providers.base import CloudProvider, Interconnect
from providers.catalog import Catalog
from providers.errors import ConfigError, NotFoundError, QuotaExceededError
from providers.registry import build_options, cluster_driver_class, make_provider
from providers.simulated import SimPool, SimulatedClusterDriver


def test_make_provider_from_mapping_and_errors() -> None:
    p = make_provider("simulated", {"provider": "gcp", "regions": ["us-central1"]})
    assert isinstance(p, CloudProvider)
    assert p.name == "gcp"
    with pytest.raises(ConfigError, match="'nope'"):
        make_provider("nope", {})
    with pytest.raises(ConfigError, match="bogus"):
        build_options("aws", {"access_key_id": "a", "secret_access_key": "b", "bogus": 1})
    with pytest.raises(ConfigError, match="secret_access_key"):
        build_options("aws", {"access_key_id": "a"})
    opts = build_options("aws", {"access_key_id": "AKID", "secret_access_key": "hush"})
    assert "hush" not in repr(opts)


def test_cluster_driver_lookup() -> None:
    assert cluster_driver_class("simulated") is SimulatedClusterDriver
    with pytest.raises(ConfigError, match="'k3s'"):
        cluster_driver_class("k3s")


async def test_simulated_cloud_quota_and_prices() -> None:
    p = make_provider("simulated", {"provider": "aws", "regions": ["us-east-1"],
                                    "quota_vcpu": 100, "price_factor": 2.0,
                                    "instance_types": ["m5.large"]})
    (offer,) = await p.list_offers(region="us-east-1")
    base = Catalog.load().offer("aws", "us-east-1", "m5.large").price_usd_per_hour
    assert offer.price_usd_per_hour == pytest.approx(2 * base)
    assert await p.scale_pool(region="us-east-1", pool="a", instance_type="m5.large", nodes=50,
                              labels={}) == 50
    with pytest.raises(QuotaExceededError, match="quota 100"):
        await p.scale_pool(region="us-east-1", pool="b", instance_type="m5.large", nodes=1,
                           labels={})
    with pytest.raises(NotFoundError, match="eu-west-1"):
        await p.get_quotas(region="eu-west-1")


async def test_simulated_cloud_removes_exactly_the_named_machines() -> None:
    from providers.simulated_cloud import SimulatedCloudOptions, SimulatedCloudProvider

    p = SimulatedCloudProvider(SimulatedCloudOptions(quota_vcpu=6))
    assert await p.scale_pool(region="us-east-1", pool="a", instance_type="m5.large", nodes=3,
                              labels={}) == 3
    assert p.machines("us-east-1", "a") == ["skyfed-a-0", "skyfed-a-1", "skyfed-a-2"]
    assert await p.remove_nodes(region="us-east-1", pool="a",
                                nodes=["skyfed-a-1", "skyfed-b-0"]) == 2
    assert p.machines("us-east-1", "a") == ["skyfed-a-0", "skyfed-a-2"]
    (vcpu, _gpu) = await p.get_quotas(region="us-east-1")
    assert vcpu.used == 4  # the removed machine's 2 vCPUs went back to the quota
    # The next order fills the gap; the quota holds exactly the three machines again.
    assert await p.scale_pool(region="us-east-1", pool="a", instance_type="m5.large", nodes=3,
                              labels={}) == 3
    assert p.machines("us-east-1", "a") == ["skyfed-a-0", "skyfed-a-1", "skyfed-a-2"]
    with pytest.raises(QuotaExceededError):
        await p.scale_pool(region="us-east-1", pool="a", instance_type="m5.large", nodes=4,
                           labels={})
    # Another cluster's group of the same name is another group, with names of its own.
    other = {"skyfed.io/cluster": "staging"}
    assert await p.remove_nodes(region="us-east-1", pool="a", nodes=["skyfed-a-0"]) == 2
    assert await p.scale_pool(region="us-east-1", pool="a", instance_type="m5.large", nodes=1,
                              labels=other) == 1
    assert p.machines("us-east-1", "a", other) == ["skyfed-a-0"]  # the free name in the region
    assert await p.remove_nodes(region="us-east-1", pool="a", nodes=["skyfed-a-1"],
                                labels=other) == 1
    assert p.machines("us-east-1", "a") == ["skyfed-a-1", "skyfed-a-2"]


def test_sim_pool_from_offer() -> None:
    pool = SimPool.from_offer("gpu", Catalog.load().offer("aws", "us-east-1", "p4d.24xlarge"),
                              nodes=2)
    assert (pool.gpu_per_node, pool.interconnect) == (8, Interconnect.NVLINK_FULL)
    assert pool.taints == ("nvidia.com/gpu=present:NoSchedule",)
