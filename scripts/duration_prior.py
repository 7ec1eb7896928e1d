"""Print the duration predictor's cold-start prior (broker/placement/durations.py) from its sources.

    .venv/bin/python scripts/duration_prior.py [--data ../shared/data]

- GPU size classes: median run time per class of the Microsoft Philly jobs
  (traces/philly/philly_jobs_pollux.csv.gz) submitted outside October 2017 (the month the
  federation-day scenario replays), run times clamped to >= 1 s.
- CPU size classes: median run time (deletion - scheduled) of the CPU-only pods of the Alibaba
  GPU 2023 pod list (traces/alibaba_gpu_v2023/openb_pod_list_default.csv).
The printed mapping is what PRIOR_MEDIAN_S holds; the script exits 1 if they differ.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.domain import Resources
from broker.placement.durations import PRIOR_MEDIAN_S, size_class


def philly_medians(data: Path) -> dict[str, float]:
    with gzip.open(data / "traces/philly/philly_jobs_pollux.csv.gz", "rt", newline="") as fh:
        jobs = [r for r in csv.DictReader(fh)
                if dt.datetime.fromisoformat(r["timestamp"]).month != 10]
    by: dict[str, list[float]] = {}
    for j in jobs:
        cls = size_class(Resources(gpu=int(j["num_gpus"])), 1)
        by.setdefault(cls, []).append(max(1.0, float(j["duration"])))
    print(f"philly: {len(jobs)} jobs outside October 2017", file=sys.stderr)
    return {cls: statistics.median(v) for cls, v in sorted(by.items())}


def alibaba_cpu_median(data: Path) -> float:
    with (data / "traces/alibaba_gpu_v2023/openb_pod_list_default.csv").open() as fh:
        pods = [r for r in csv.DictReader(fh) if r["num_gpu"] == "0"
                and r["deletion_time"] and r["scheduled_time"]]
    print(f"alibaba: {len(pods)} CPU-only pods", file=sys.stderr)
    return float(statistics.median(
        max(1, int(p["deletion_time"]) - int(p["scheduled_time"])) for p in pods))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = ap.parse_args()
    prior = philly_medians(args.data)
    cpu = alibaba_cpu_median(args.data)
    prior.update({cls: cpu for cls in PRIOR_MEDIAN_S if cls.startswith("cpu-")})
    for cls, median in prior.items():
        print(f'    "{cls}": {median},')
    if prior != dict(PRIOR_MEDIAN_S):
        print("differs from broker/placement/durations.py PRIOR_MEDIAN_S", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
