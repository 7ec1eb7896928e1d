"""The public traces in shared/data as rows, and the windows the shipped scenarios replay.

Read by scripts/build_scenarios.py and scripts/federation_day.py (the shipped scenarios) and
by broker/sim/tracedraft.py (training scenarios from the same traces), so a trace is read,
and a shipped scenario's window chosen, in one place. SOURCES.md in the data folder names
each file's origin and licence:

- Azure Functions 2019 (traces/azure_functions; Shahrad et al., ATC'20): 1,000 functions,
  invocations per minute over one day (`inv`), mean execution time per function (`run`),
  memory per app (`mem`);
- Alibaba GPU 2023 pod list (traces/alibaba_gpu_v2023; FGD, ATC'23): GPU pods with creation,
  scheduled and deletion times in seconds, CPU, memory and GPU requests;
- Microsoft Philly (traces/philly, via Pollux; Jeon et al., ATC'19): submit time, run time,
  GPUs and virtual cluster of each job, 2017-09-04..2017-12-22;
- AWS Local Zones (edge/aws_local_and_wavelength_zones_2023-06_latlon.csv) as edge sites'
  coordinates, the CloudFront edge locations (edge/aws_cloudfront_edge_locations_latlon.csv)
  as user metros.

Windows the shipped scenarios replay (`shipped_windows`, which tracedraft.py never draws):
retail-peak's (the RETAIL_PEAK_FUNCTIONS busiest functions' busiest RETAIL_PEAK_MINUTES) and
edge-heavy's (EDGE_HEAVY_FUNCTIONS, EDGE_HEAVY_MINUTES) minutes of the Azure day,
gpu-training's busiest GPU_TRAINING_WINDOW_S of the Alibaba pods, federation-day's Philly
day FEDERATION_DAY. (federation-day also replays all 1,000 functions over the whole Azure
day, so no Azure window is outside every shipped scenario; training windows avoid the
minutes of the two scenarios the policy is gated on, of any function.)

Reads are cached per process (`functools.lru_cache`): a rollout process reads each file once.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import gzip
from dataclasses import dataclass
from pathlib import Path

AZURE = "traces/azure_functions"
ALIBABA_PODS = "traces/alibaba_gpu_v2023/openb_pod_list_default.csv"
PHILLY = "traces/philly/philly_jobs_pollux.csv.gz"
LOCAL_ZONES = "edge/aws_local_and_wavelength_zones_2023-06_latlon.csv"
CLOUDFRONT = "edge/aws_cloudfront_edge_locations_latlon.csv"
MINUTES_PER_DAY = 1440
RETAIL_PEAK_FUNCTIONS, RETAIL_PEAK_MINUTES = 40, 360
EDGE_HEAVY_FUNCTIONS, EDGE_HEAVY_MINUTES = 30, 180
GPU_TRAINING_WINDOW_S = 24 * 3600
FEDERATION_DAY = dt.datetime(2017, 10, 20)


def gz_rows(path: Path) -> list[dict[str, str]]:
    """A gzip-compressed CSV file as dict rows."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


@dataclass(frozen=True)
class Functions:
    """The Azure Functions 2019 sample, one entry per function in the file's order."""

    rows: tuple[dict[str, str], ...]  # the `inv` rows (HashFunction, HashApp, HashOwner, ...)
    series: tuple[tuple[int, ...], ...]  # invocations per minute, MINUTES_PER_DAY each
    mean_exec_s: dict[str, float]  # HashFunction -> mean execution time (`run` file), s
    mem_mb_by_app: dict[str, float]  # HashApp -> AverageAllocatedMb (`mem` file)

    def busiest(self, count: int) -> list[int]:
        """Indices of the `count` functions with the most invocations over the day."""
        return sorted(range(len(self.series)), key=lambda i: -sum(self.series[i]))[:count]


@functools.lru_cache(maxsize=2)
def functions_2019(data: Path) -> Functions:
    base = data / AZURE
    inv = gz_rows(base / "azure_functions_2019_sample1000_inv.csv.gz")
    run = {r["HashFunction"]: float(r["Average"]) / 1000.0
           for r in gz_rows(base / "azure_functions_2019_sample1000_run.csv.gz")}
    mem = {r["HashApp"]: float(r["AverageAllocatedMb"])
           for r in gz_rows(base / "azure_functions_2019_sample1000_mem.csv.gz")}
    series = tuple(tuple(int(r[f"minute_{m}"]) for m in range(1, MINUTES_PER_DAY + 1))
                   for r in inv)
    return Functions(tuple(inv), series, run, mem)


def busiest_window(fns: Functions, count: int, minutes: int) -> tuple[list[int], int]:
    """The `count` busiest functions of the day and the start minute of the `minutes`-long
    window (on 10-minute marks) in which they are invoked the most together."""
    order = fns.busiest(count)
    total = [sum(fns.series[i][m] for i in order) for m in range(MINUTES_PER_DAY)]
    start = max(range(0, MINUTES_PER_DAY - minutes + 1, 10),
                key=lambda m0: (sum(total[m0:m0 + minutes]), -m0))
    return order, start


@functools.lru_cache(maxsize=2)
def alibaba_gpu_pods(data: Path) -> tuple[dict[str, str], ...]:
    """The GPU pods with a known run (scheduled and deleted), in the file's order."""
    with (data / ALIBABA_PODS).open(encoding="utf-8", newline="") as fh:
        return tuple(r for r in csv.DictReader(fh) if int(r["num_gpu"]) >= 1
                     and r["deletion_time"] and r["scheduled_time"])


def busiest_gpu_window(pods: tuple[dict[str, str], ...],
                       window_s: int = GPU_TRAINING_WINDOW_S) -> int:
    """Start (on an hour mark) of the `window_s` window with the most multi-GPU pods, then
    the most pods, then the earliest: gpu-training's window."""
    def busy(t0: int) -> tuple[int, int]:
        inside = [p for p in pods if t0 <= int(p["creation_time"]) < t0 + window_s]
        return sum(1 for p in inside if int(p["num_gpu"]) > 1), len(inside)

    starts = sorted({int(p["creation_time"]) // 3600 * 3600 for p in pods})
    return max(starts, key=lambda s: (*busy(s), -s))


@functools.lru_cache(maxsize=2)
def philly_jobs(data: Path) -> tuple[dict[str, str], ...]:
    """Philly jobs (timestamp, duration, num_gpus, gpu_time, cluster), the file's order."""
    return tuple(gz_rows(data / PHILLY))


def _rows(path: Path) -> tuple[dict[str, str], ...]:
    with path.open(encoding="utf-8", newline="") as fh:
        return tuple(csv.DictReader(fh))


@functools.lru_cache(maxsize=2)
def local_zones(data: Path) -> tuple[dict[str, str], ...]:
    """AWS Local Zones (zone_type local-zone), sorted by network border group."""
    return tuple(sorted((r for r in _rows(data / LOCAL_ZONES) if r["zone_type"] == "local-zone"),
                        key=lambda r: r["network_border_group"]))


@functools.lru_cache(maxsize=2)
def cloudfront_locations(data: Path) -> tuple[dict[str, str], ...]:
    """CloudFront edge locations (code, city, country, latitude, longitude, ...)."""
    return _rows(data / CLOUDFRONT)


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open window [start, end) of one trace, in the trace's own clock: minutes of the
    day for "azure-functions-2019", pod creation_time seconds for "alibaba-gpu-2023",
    submit seconds since FEDERATION_DAY for "philly"."""

    trace: str
    start: float
    end: float

    def clashes(self, other: Window) -> bool:
        """Same trace and the windows share a point."""
        return self.trace == other.trace and self.start < other.end and other.start < self.end


AZURE_TRACE, ALIBABA_TRACE, PHILLY_TRACE = "azure-functions-2019", "alibaba-gpu-2023", "philly"


@functools.lru_cache(maxsize=2)
def shipped_windows(data: Path) -> tuple[Window, ...]:
    """The windows retail-peak, edge-heavy, gpu-training and federation-day's Philly half
    replay (module docstring)."""
    fns = functions_2019(data)
    _, retail = busiest_window(fns, RETAIL_PEAK_FUNCTIONS, RETAIL_PEAK_MINUTES)
    _, edge = busiest_window(fns, EDGE_HEAVY_FUNCTIONS, EDGE_HEAVY_MINUTES)
    gpu = busiest_gpu_window(alibaba_gpu_pods(data))
    return (Window(AZURE_TRACE, retail, retail + RETAIL_PEAK_MINUTES),
            Window(AZURE_TRACE, edge, edge + EDGE_HEAVY_MINUTES),
            Window(ALIBABA_TRACE, gpu, gpu + GPU_TRAINING_WINDOW_S),
            Window(PHILLY_TRACE, 0.0, 86400.0))


def philly_seconds(timestamp: str) -> float:
    """A Philly `timestamp` as seconds since FEDERATION_DAY (the Philly trace's clock here)."""
    return (dt.datetime.fromisoformat(timestamp) - FEDERATION_DAY).total_seconds()
