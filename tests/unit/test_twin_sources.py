"""Trace conversions of the scenario builder: GPU rounding, job splitting, service replicas."""

from __future__ import annotations

import pytest

from broker.sim.sources import (
    ALIBABA_CPU_PER_GPU_CAP,
    ALIBABA_MEM_GIB_PER_GPU_CAP,
    ALIBABA_RUN_S,
    PHILLY_CPU_PER_GPU,
    PHILLY_MEM_GIB_PER_GPU,
    alibaba_pod,
    kube_gpus,
    philly_job,
    scale_rows,
    service_replicas,
    split_gpu_job,
)


@pytest.mark.parametrize(("num_gpu", "milli", "whole"), [
    (1, 1000, 1), (1, 470, 1), (1, 1, 1), (0, 0, 0), (1, 0, 0), (2, 1000, 2), (8, 1000, 8),
    (2, 500, 2),  # two devices, each shared: still two whole GPUs
])
def test_fractional_gpus_round_up_to_whole_devices(num_gpu: int, milli: int, whole: int) -> None:
    assert kube_gpus(num_gpu, milli) == whole


@pytest.mark.parametrize(("gpus", "split"), [
    (1, (1, 1)), (8, (1, 8)), (12, (2, 6)), (16, (2, 8)), (24, (3, 8)), (20, (3, 7)),
    (128, (16, 8)), (0, (1, 0)),
])
def test_large_jobs_split_into_node_sized_replicas(gpus: int, split: tuple[int, int]) -> None:
    replicas, per = split_gpu_job(gpus)
    assert (replicas, per) == split
    assert per <= 8
    assert replicas * per >= gpus


def test_service_replicas_follow_invocations_in_flight() -> None:
    # 600 invocations in the busiest minute x 2 s each = 20 in flight; at 50 % -> 40 replicas.
    per_minute = [0] * 9 + [600] + [0] * 10
    windows = service_replicas(per_minute, 2.0, window_min=10)
    assert windows == [(0, 40), (10, 1)]
    assert scale_rows(windows) == [(0.0, 40), (600.0, 1)]
    # Unchanged windows write no row; t0 shifts the clock to the scenario's start.
    assert scale_rows([(30, 3), (40, 3), (50, 5)], t0_min=30) == [(0.0, 3), (1200.0, 5)]
    with pytest.raises(ValueError, match="target_utilization"):
        service_replicas(per_minute, 1.0, target_utilization=0.0)


def test_load_scale_multiplies_the_invocation_rate() -> None:
    per_minute = [0] * 9 + [600] + [0] * 10
    assert service_replicas(per_minute, 2.0, load_scale=0.5) == [(0, 20), (10, 1)]
    assert service_replicas(per_minute, 2.0, load_scale=1.0) == service_replicas(per_minute, 2.0)
    with pytest.raises(ValueError, match="load_scale"):
        service_replicas(per_minute, 2.0, load_scale=-1.0)


def test_an_alibaba_pod_becomes_a_job_that_fits_a_node() -> None:
    pod = {"num_gpu": "2", "gpu_milli": "460", "cpu_milli": "64000", "memory_mib": "409600",
           "scheduled_time": "100", "deletion_time": "50000", "qos": "LS"}
    job = alibaba_pod(pod)
    assert (job.replicas, job.gpus) == (1, 2)  # shared GPUs -> whole devices
    assert job.cpu == 2 * ALIBABA_CPU_PER_GPU_CAP  # 64 vCPU asked, capped per GPU
    assert job.memory_gib == 2 * ALIBABA_MEM_GIB_PER_GPU_CAP
    assert job.run_s == ALIBABA_RUN_S[1]  # 49,900 s clipped to 6 h
    assert job.priority == 1
    short = alibaba_pod({**pod, "deletion_time": "110", "qos": "BE"})
    assert (short.run_s, short.priority) == (ALIBABA_RUN_S[0], 0)


def test_a_philly_job_splits_with_cpu_and_memory_per_gpu() -> None:
    job = philly_job(16, 3600.0)
    assert (job.replicas, job.gpus, job.run_s) == (2, 8, 3600.0)
    assert job.cpu == 8 * PHILLY_CPU_PER_GPU
    assert job.memory_gib == 8 * PHILLY_MEM_GIB_PER_GPU
