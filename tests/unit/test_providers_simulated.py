"""SimulatedClusterDriver: idempotent apply, packing, clock, faults, inventory."""

from __future__ import annotations

import pytest

from providers.base import (
    ApplySpec,
    ClusterDriver,
    Interconnect,
    PoolScalingDriver,
    PrewarmingDriver,
    PrewarmSpec,
    WorkloadPhase,
)
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


async def test_gpu_pool_taint_admits_gpu_pods_only_and_reports_topology() -> None:
    """The GPU pool's nodes carry nvidia.com/gpu:NoSchedule. A pod that asks no GPU needs
    its own toleration; one that requests GPUs tolerates it as the Kubernetes driver's pod
    template makes it (kubernetes_objects.py) without asking."""
    d = make()
    await d.apply(spec=spec("c", pool="gpu", replicas=1, cpu=8))
    assert (await d.status(workload_id="c")).ready_replicas == 0  # taint not tolerated
    await d.apply(spec=spec("c", pool="gpu", replicas=1, cpu=8,
                            tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},)))
    assert (await d.status(workload_id="c")).ready_replicas == 1
    await d.delete(workload_id="c")
    await d.apply(spec=spec("g", pool="gpu", replicas=1, cpu=8, gpu=8, kind="train"))
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


async def test_scaled_up_nodes_boot_before_they_join_and_take_replicas() -> None:
    clock = FakeClock()
    d = make(clock, boot_s=60)
    assert isinstance(d, PoolScalingDriver)
    await d.apply(spec=spec(replicas=6))  # 2 nodes x 2 replicas fit; 2 wait for room
    assert (await d.status(workload_id="w1")).ready_replicas == 4
    assert await d.scale_pool(pool="cpu", nodes=3) == 3
    assert len([n for n in await d.inventory() if n.pool == "cpu"]) == 2  # still booting
    clock.t += 59
    assert (await d.status(workload_id="w1")).ready_replicas == 4
    clock.t += 1
    assert len([n for n in await d.inventory() if n.pool == "cpu"]) == 3
    st = await d.status(workload_id="w1")
    assert (st.ready_replicas, st.phase) == (6, WorkloadPhase.RUNNING)
    # Shrinking removes empty nodes only: every node runs replicas, so none goes.
    assert await d.scale_pool(pool="cpu", nodes=1) == 3
    assert await d.remove_nodes(pool="cpu", nodes=["c1-cpu-2"]) == 3


async def test_remove_nodes_takes_only_the_named_empty_ones() -> None:
    d = make()
    await d.scale_pool(pool="cpu", nodes=4)
    await d.apply(spec=spec(replicas=1))  # on c1-cpu-0
    assert await d.remove_nodes(pool="cpu", nodes=["c1-cpu-0", "c1-cpu-3"]) == 3
    assert d.nodes_of("cpu") == ["c1-cpu-0", "c1-cpu-1", "c1-cpu-2"]


async def test_termination_taint_and_cordon_keep_new_replicas_off_running_ones_stay() -> None:
    d = make()
    await d.apply(spec=spec("a", replicas=1))
    assert d.replicas_on("c1-cpu-0") == 1
    d.taint_node("c1-cpu-0", "aws-node-termination-handler/spot-itn=true:NoSchedule")
    d.cordon_node("c1-cpu-1")
    await d.apply(spec=spec("b", replicas=1))
    assert (await d.status(workload_id="b")).ready_replicas == 0  # nowhere to go
    assert d.replicas_on("c1-cpu-0") == 1  # what ran there still runs
    inv = {n.name: n for n in await d.inventory()}
    assert "aws-node-termination-handler/spot-itn=true:NoSchedule" in inv["c1-cpu-0"].taints
    assert inv["c1-cpu-1"].unschedulable
    d.remove_node("c1-cpu-0")  # the instance goes: its replica is pending again
    assert (await d.status(workload_id="a")).ready_replicas == 0


async def test_a_patch_rolls_out_new_replicas_before_the_old_end() -> None:
    clock = FakeClock()
    d = make(clock, startup_s=10)
    await d.apply(spec=spec(replicas=1))
    clock.t += 10
    assert (await d.status(workload_id="w1")).ready_replicas == 1
    await d.apply(spec=spec(replicas=1, image="nginx:2"))  # another template: a rollout
    assert d.replicas_on("c1-cpu-0") == 2  # old and new side by side
    assert (await d.status(workload_id="w1")).ready_replicas == 1  # the old one serves
    clock.t += 10
    assert (await d.status(workload_id="w1")).ready_replicas == 1
    assert d.replicas_on("c1-cpu-0") == 1  # the new one is ready: the old one ended


async def test_prewarm_is_recorded_and_done_after_prewarm_s() -> None:
    clock = FakeClock()
    d = make(clock, prewarm_s=30)
    assert isinstance(d, PrewarmingDriver)
    pw = PrewarmSpec(key="k1", pool="gpu", images=("pytorch:24",))
    await d.prewarm(spec=pw)
    await d.prewarm(spec=pw)
    assert await d.prewarm_done(key="k1") is False
    clock.t += 30
    assert await d.prewarm_done(key="k1") is True
    with pytest.raises(NotFoundError):
        await d.prewarm(spec=PrewarmSpec(key="k2", pool="nope"))


async def test_an_injected_timeout_hangs_then_fails_and_changes_nothing() -> None:
    """`skyfed bench chaos`'s provider timeouts: the call hangs, then fails retryably."""
    import time

    d = make(failures=FailureInjection(apply_error_rate=1.0, timeout_share=1.0,
                                       timeout_s=0.05))
    t0 = time.monotonic()
    with pytest.raises(TransientError, match="injected timeout on apply") as err:
        await d.apply(spec=spec())
    assert time.monotonic() - t0 >= 0.05
    assert err.value.retryable
    with pytest.raises(NotFoundError):
        await d.status(workload_id="w1")
