"""SimulatedClusterDriver: idempotent apply, packing, clock, faults, inventory."""

from __future__ import annotations

import pytest

from providers.base import ApplySpec, ClusterDriver, Interconnect, WorkloadPhase
from providers.errors import NotFoundError, ProviderError, TransientError
from providers.simulated import FailureInjection, SimPool, SimulatedClusterDriver


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(clock: FakeClock | None = None, **kw: object) -> SimulatedClusterDriver:
    pools = [
        SimPool(name="cpu", nodes=2, cpu_per_node=4, memory_gib_per_node=16),
        SimPool(name="gpu", nodes=1, cpu_per_node=96, memory_gib_per_node=1152, gpu_per_node=8,
                gpu_model="A100", interconnect=Interconnect.NVLINK_FULL,
                taints=("nvidia.com/gpu=present:NoSchedule",)),
    ]
    return SimulatedClusterDriver(
        "c1", pools, clock=clock or FakeClock(), **kw  # type: ignore[arg-type]
    )


def spec(wid: str = "w1", **kw: object) -> ApplySpec:
    base: dict[str, object] = {
        "workload_id": wid, "tenant": "t", "name": "web", "kind": "service",
        "image": "nginx", "replicas": 2, "cpu": 2, "memory_gib": 4, "pool": "cpu",
    }
    base.update(kw)
    return ApplySpec(**base)  # type: ignore[arg-type]


def test_is_a_cluster_driver() -> None:
    assert isinstance(make(), ClusterDriver)


async def test_apply_twice_is_once_and_startup_uses_clock() -> None:
    clock = FakeClock()
    d = make(clock, startup_s=30)
    await d.apply(spec=spec())
    await d.apply(spec=spec())
    inv = {n.name: n for n in await d.inventory()}
    assert sum(n.used_cpu for n in inv.values()) == 4  # 2 replicas x 2 cpu, not 4 replicas
    st = await d.status(workload_id="w1")
    assert st.phase is WorkloadPhase.PENDING
    assert st.ready_replicas == 0
    clock.t += 30
    st = await d.status(workload_id="w1")
    assert (st.phase, st.ready_replicas, st.desired_replicas) == (WorkloadPhase.RUNNING, 2, 2)


async def test_changed_spec_repacks_and_overflow_stays_pending() -> None:
    d = make()
    await d.apply(spec=spec(replicas=2))
    await d.apply(spec=spec(replicas=5))  # 4 fit (2 nodes x 2), 1 pending
    st = await d.status(workload_id="w1")
    assert st.ready_replicas == 4
    assert st.phase is WorkloadPhase.PENDING
    assert "1 replica" in st.message
    await d.delete(workload_id="w1")
    await d.delete(workload_id="w1")  # gone is fine
    assert all(n.used_cpu == 0 for n in await d.inventory())
    with pytest.raises(NotFoundError, match="w1"):
        await d.status(workload_id="w1")


async def test_gpu_pool_needs_toleration_and_reports_topology() -> None:
    d = make()
    await d.apply(spec=spec("g", pool="gpu", replicas=1, cpu=8, gpu=8, kind="train"))
    assert (await d.status(workload_id="g")).ready_replicas == 0  # taint not tolerated
    await d.apply(spec=spec("g", pool="gpu", replicas=1, cpu=8, gpu=8, kind="train",
                            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},)))
    assert (await d.status(workload_id="g")).phase is WorkloadPhase.RUNNING
    gpu_node = next(n for n in await d.inventory() if n.pool == "gpu")
    assert gpu_node.used_gpu == 8
    assert gpu_node.topology.interconnect is Interconnect.NVLINK_FULL
    d.finish("g")
    assert (await d.status(workload_id="g")).phase is WorkloadPhase.SUCCEEDED


async def test_unknown_pool_names_it() -> None:
    with pytest.raises(NotFoundError, match="'nope'"):
        await make().apply(spec=spec(pool="nope"))


async def test_injected_faults_never_half_apply() -> None:
    d = make(seed=7, failures=FailureInjection(apply_error_rate=0.5))
    failures = 0
    retryable: list[bool] = []
    for i in range(40):
        try:
            await d.apply(spec=spec(f"w{i}", replicas=1, cpu=0.1, memory_gib=0.1))
        except ProviderError as exc:
            retryable.append(exc.retryable)
            failures += 1
    assert all(retryable)
    ok = len(await d.list_status())
    assert 5 < failures < 35
    assert ok == 40 - failures
    assert sum(n.used_cpu for n in await d.inventory()) == pytest.approx(0.1 * ok)


async def test_down_cluster_and_node_failure() -> None:
    d = make()
    await d.apply(spec=spec(replicas=2, cpu=3))
    d.fail_node("c1-cpu-0")
    st = await d.status(workload_id="w1")
    assert st.ready_replicas == 1  # one replica lost its node and cannot fit elsewhere
    d.set_down(True)
    with pytest.raises(TransientError, match="unreachable"):
        await d.list_status()
    d.set_down(False)
    assert d.scale(pool="cpu", nodes=3) == 3
    assert (await d.status(workload_id="w1")).ready_replicas == 2
