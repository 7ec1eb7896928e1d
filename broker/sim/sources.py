"""Public trace rows -> SCENARIO.md trace rows: the conversions scripts/build_scenarios.py uses.

Pure and small so each rule is tested and documented once (docs/twin.md, "Shipped
scenarios"), while the builder script only reads shared/data and picks windows:

- `kube_gpus`: Kubernetes' `nvidia.com/gpu` is an extended resource, requested in whole
  units (the device plugin cannot hand out 0.47 of a GPU), so a fractional request (the
  Alibaba GPU 2023 trace's `gpu_milli` < 1000) becomes the next whole GPU: ceil.
- `split_gpu_job`: a job wanting more GPUs than one node has (Philly has 16-128-GPU jobs;
  the largest cloud nodes have 8) runs as several replicas of at most 8 GPUs, each rounded up
  to a whole GPU: replicas = ceil(g / 8), GPUs per replica = ceil(g / replicas).
- `alibaba_pod`: an Alibaba GPU 2023 pod as a training job: whole GPUs (`kube_gpus`), run
  time = deletion - scheduled clipped to ALIBABA_RUN_S (pods still running at the trace's
  end have no known end), CPU and memory as requested but capped per GPU at
  ALIBABA_CPU_PER_GPU_CAP / ALIBABA_MEM_GIB_PER_GPU_CAP so every pod fits a node, priority 1
  for latency-sensitive (`qos` LS) pods;
- `philly_job`: a Philly job's replicas (`split_gpu_job`) and per-replica CPU and memory:
  PHILLY_CPU_PER_GPU and PHILLY_MEM_GIB_PER_GPU per GPU (Philly records none: the Alibaba
  GPU 2023 pods' median request per GPU, 9.8 vCPU and 30.5 GiB, rounded down so a 1-GPU job
  fits the 8-vCPU, 32-GiB one-GPU instances all three clouds sell);
- `service_replicas`: the replicas an autoscaled function needs in each window, from its
  per-minute invocations and mean execution time (Azure Functions 2019): by Little's law
  the invocations in flight are `rate * mean time`; one 1-vCPU replica runs one at a time,
  and the autoscaler keeps replicas at `target_utilization` (the Kubernetes HPA walkthrough's
  `--cpu-percent=50`), sizing each window on its busiest minute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_GPUS_PER_NODE = 8  # the largest GPU nodes of AWS, GCP and Azure (p4d/p5, a2/a3, ND96)
HPA_TARGET_UTILIZATION = 0.5  # kubernetes.io HPA walkthrough: kubectl autoscale --cpu-percent=50
ALIBABA_RUN_S = (60, 6 * 3600)
ALIBABA_CPU_PER_GPU_CAP = 11.0
ALIBABA_MEM_GIB_PER_GPU_CAP = 110.0
PHILLY_CPU_PER_GPU = 8.0
PHILLY_MEM_GIB_PER_GPU = 30.0


def kube_gpus(num_gpu: int, gpu_milli: float = 1000.0) -> int:
    """Whole GPUs Kubernetes requests for `num_gpu` GPUs shared `gpu_milli`/1000 each.

    Each requested GPU is a device of its own, so the per-GPU share rounds up per GPU:
    `num_gpu * ceil(gpu_milli / 1000)` (the trace's share is at most 1000 per GPU).
    """
    if num_gpu <= 0 or gpu_milli <= 0:
        return 0
    return num_gpu * math.ceil(gpu_milli / 1000.0 - 1e-9)


def split_gpu_job(gpus: int, per_node: int = MAX_GPUS_PER_NODE) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a job of `gpus` GPUs on nodes of `per_node` GPUs."""
    if gpus <= 0:
        return 1, 0
    replicas = math.ceil(gpus / per_node)
    return replicas, math.ceil(gpus / replicas)


@dataclass(frozen=True, slots=True)
class Job:
    """One training job's trace row values: replicas of `gpus` GPUs, `cpu` and `memory_gib`
    each, for `run_s` seconds."""

    replicas: int
    gpus: int
    cpu: float
    memory_gib: float
    run_s: float
    priority: int = 0


def alibaba_pod(pod: Mapping[str, str]) -> Job:
    """An Alibaba GPU 2023 pod list row as a job (see the module docstring)."""
    gpus = kube_gpus(int(pod["num_gpu"]), float(pod["gpu_milli"] or 1000))
    lo, hi = ALIBABA_RUN_S
    run = min(hi, max(lo, int(pod["deletion_time"]) - int(pod["scheduled_time"])))
    return Job(1, gpus, round(min(int(pod["cpu_milli"]) / 1000.0,
                                  ALIBABA_CPU_PER_GPU_CAP * gpus), 2),
               round(min(int(pod["memory_mib"]) / 1024.0, ALIBABA_MEM_GIB_PER_GPU_CAP * gpus), 2),
               float(run), 1 if pod["qos"] == "LS" else 0)


def philly_job(num_gpus: int, run_s: float) -> Job:
    """A Philly job of `num_gpus` GPUs as replicas (see the module docstring)."""
    replicas, per = split_gpu_job(num_gpus)
    return Job(replicas, per, PHILLY_CPU_PER_GPU * per, PHILLY_MEM_GIB_PER_GPU * per, run_s)


def service_replicas(per_minute: Sequence[int], mean_exec_s: float, *, window_min: int = 10,
                     target_utilization: float = HPA_TARGET_UTILIZATION,
                     load_scale: float = 1.0) -> list[tuple[int, int]]:
    """(first minute of the window, replicas) per window; at least one replica each.
    `load_scale` multiplies the invocation rate (a larger or smaller tenant of the same
    shape; training drafts draw it, the shipped scenarios keep 1)."""
    if window_min <= 0 or not 0 < target_utilization <= 1 or mean_exec_s < 0 or load_scale < 0:
        raise ValueError("window_min > 0, 0 < target_utilization <= 1, mean_exec_s >= 0, "
                         "load_scale >= 0")
    out = []
    for start in range(0, len(per_minute), window_min):
        busiest = max(per_minute[start:start + window_min])
        in_flight = busiest * load_scale / 60.0 * mean_exec_s
        out.append((start, max(1, math.ceil(in_flight / target_utilization - 1e-9))))
    return out


def scale_rows(windows: Sequence[tuple[int, int]], t0_min: int = 0
               ) -> list[tuple[float, int]]:
    """(submit_s, replicas) rows: the first window, then only the windows that change it."""
    rows: list[tuple[float, int]] = []
    for minute, replicas in windows:
        if not rows or replicas != rows[-1][1]:
            rows.append(((minute - t0_min) * 60.0, replicas))
    return rows
