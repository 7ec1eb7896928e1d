"""GPU topology: allocation inside a node, NVLink summaries, predicted speedup."""

from __future__ import annotations

import dataclasses

import pytest

from broker.placement import topology as topo
from providers.base import Interconnect


def test_cube_mesh_8_gpu_ring_uses_only_double_links() -> None:
    alloc = topo.allocate(topo.cube_mesh_v100(), 8)
    assert alloc is not None
    assert alloc.ring_gbytes == pytest.approx(50.0)


def test_pair_prefers_a_double_nvlink_pair_on_one_numa_node() -> None:
    alloc = topo.allocate(topo.cube_mesh_v100(), 2)
    assert alloc is not None
    assert alloc.ring_gbytes == pytest.approx(50.0)
    assert alloc.numa_nodes == 1


def test_allocation_skips_used_gpus_and_keeps_nvlink() -> None:
    alloc = topo.allocate(topo.cube_mesh_v100(), 4, used=[0, 1])
    assert alloc is not None
    assert not set(alloc.gpus) & {0, 1}
    assert alloc.ring_gbytes >= topo.NVLINK2_LINK_GBYTES


def test_pcie_node_pays_the_socket_crossing() -> None:
    node = topo.pcie_only(8)
    local = topo.allocate(node, 4)
    spread = topo.allocate(node, 8)
    assert local is not None
    assert spread is not None
    assert local.ring_gbytes == pytest.approx(topo.PCIE3_GBYTES)
    assert spread.ring_gbytes == pytest.approx(topo.CROSS_SOCKET_GBYTES)


def test_topology_manager_single_numa_node_refuses_spanning_sets() -> None:
    node = dataclasses.replace(topo.pcie_only(8), topology_manager_policy="single-numa-node")
    assert topo.allocate(node, 4) is not None
    assert topo.allocate(node, 5) is None
    restricted = dataclasses.replace(node, topology_manager_policy="restricted")
    alloc = topo.allocate(restricted, 3, used=[0])
    assert alloc is not None
    assert alloc.numa_nodes == 1


def test_too_many_gpus_is_none() -> None:
    assert topo.allocate(topo.nvswitch(8), 9) is None
    assert topo.allocate(topo.nvswitch(8), 2, used=range(7)) is None


def test_largest_nvlink_set_and_fragmentation() -> None:
    cube = topo.cube_mesh_v100()
    assert topo.largest_nvlink_set(cube) == 8
    assert topo.largest_nvlink_set(topo.nvlink_pairs(4), used=[0]) == 2
    assert topo.largest_nvlink_set(topo.pcie_only(4)) == 1
    assert topo.fragmentation(topo.nvswitch(8), used=[0, 5]) == 0.0
    assert topo.fragmentation(topo.nvlink_pairs(4), used=[0]) == pytest.approx(1 / 3)


def test_speedup_orders_interconnects() -> None:
    full = topo.speedup(8, Interconnect.NVLINK_FULL)
    pcie = topo.speedup(8, Interconnect.PCIE)
    assert 7.5 < full <= 8.0
    assert pcie < full
    assert topo.speedup(1, Interconnect.PCIE) == 1.0
    big = topo.speedup(8, Interconnect.PCIE, model_params=7e9)
    assert big < pcie
    assert topo.efficiency(8, Interconnect.NVLINK_FULL) == pytest.approx(full / 8)


def test_allreduce_formula() -> None:
    # 2(k-1)/k * S / B with k=4, S=3 GB, B=15 GB/s -> 0.3 s
    assert topo.allreduce_s(4, 3.0, 15.0) == pytest.approx(0.3)
    assert topo.allreduce_s(1, 3.0, 15.0) == 0.0


def test_instance_topologies() -> None:
    p5 = topo.for_instance("p5.48xlarge", 8, "H100", Interconnect.NVLINK_FULL)
    assert topo.ring_bandwidth_gbytes(p5, range(8)) == pytest.approx(topo.NVLINK4_GBYTES)
    p3 = topo.for_instance("p3.16xlarge", 8, "V100", Interconnect.NVLINK_PAIRS)
    assert p3.interconnect is Interconnect.NVLINK_PAIRS
    assert topo.for_instance("m5.large", 0, None, Interconnect.NONE).gpu_count == 0
