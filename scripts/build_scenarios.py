"""Build the shipped twin scenarios under config/scenarios/ from real data in shared/data.

    .venv/bin/python scripts/build_scenarios.py [--data ../shared/data] [--out config/scenarios]
        [--only NAME ...]

Writes, each as `<name>/scenario.toml` + `<name>/trace.csv.gz` (SCENARIO.md format), with
its sources, sizes and conversions noted as comments at the top of scenario.toml. No
scenario compresses time: arrivals and run times are at the traces' own pace.

- retail-peak (6 h): AWS us-east-1, GCP us-central1, Azure eastus + two edge sites at AWS
  Local Zone metros (edge/aws_local_and_wavelength_zones_2023-06_latlon.csv). Services: the
  40 busiest functions of the Azure Functions 2019 sample (traces/azure_functions) over the
  real 6-hour window with the most invocations; replicas per 10-minute window =
  ceil(busiest minute's invocations / REQS_PER_REPLICA_PER_MIN) (-> `scale` events), memory
  from the same sample's AverageAllocatedMb. Batch jobs arrive in proportion to the aggregate
  invocation curve (synthetic sizes and run times: no public per-job CPU trace is in data/).
- gpu-training (24 h): GPU pools of the three clouds (A100 NVSwitch, V100 NVLink, T4 PCIe)
  fed by the Alibaba GPU 2023 pod list (traces/alibaba_gpu_v2023/openb_pod_list_default.csv):
  the GPU pods of the real 24-hour window with the most multi-GPU pods, at their real
  creation times, with their CPU/memory requests and run times (deletion - scheduled,
  clipped to 60 s..6 h: pods still running at the trace's end have no known end).
  Fractional GPUs (gpu_milli < 1000) are rounded up to whole GPUs, as Kubernetes'
  integer `nvidia.com/gpu` requires (broker/sim/sources.py::alibaba_pod). The trace has no
  data sizes: each job reads DATA_GB_PER_JOB x GPUs from its tenant's home region (an
  assumption, documented in docs/twin.md).
- edge-heavy (3 h): 16 real Optus base stations in Melbourne CBD (EUA dataset,
  edge/eua_edge_servers_optus_melbcbd.csv) as MEC sites, users from the EUA generated user
  locations grouped into 8 regions, Sydney/Melbourne cloud regions behind them;
  latency-bound services (10-20 ms SLO) following the 30 busiest Azure Functions over the
  real 3-hour window with the most invocations; faults: a site outage and a partition.
- federation-day (24 h, 53 clusters, ~3,900 nodes at t=0, ~21,300 events): see
  scripts/federation_day.py.

Prices, node shapes and region coordinates come from the catalog (providers/catalog.py).
Deterministic: fixed seeds; re-running gives the same files.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from federation_day import federation_day

from broker.sim.randomize import Draft
from broker.sim.sources import alibaba_pod
from broker.sim.tracedata import (
    EDGE_HEAVY_FUNCTIONS,
    EDGE_HEAVY_MINUTES,
    GPU_TRAINING_WINDOW_S,
    RETAIL_PEAK_FUNCTIONS,
    RETAIL_PEAK_MINUTES,
    Functions,
    alibaba_gpu_pods,
    busiest_gpu_window,
    busiest_window,
    functions_2019,
)
from providers.catalog import Catalog

REQS_PER_REPLICA_PER_MIN = 150.0
DATA_GB_PER_JOB = 20.0
# Batch jobs per minute when the aggregate invocation curve is at its daily peak (retail-peak).
BATCH_PER_MIN_AT_PEAK = 8.0


def _service_rows(rng: random.Random, fns: Functions, users: list[str], *, prefix: str,
                  count: int, slo: tuple[float, ...], window: tuple[int, int],
                  per_replica: float) -> list[dict[str, object]]:
    """Services replaying `window` = (first minute, minutes) of the day at real time."""
    m0, minutes = window
    rows: list[dict[str, object]] = []
    for k, i in enumerate(fns.busiest(count)):
        s = fns.series[i]
        sid = f"{prefix}-{k:02d}"
        mem_gib = max(0.5, round(fns.mem_mb_by_app.get(fns.rows[i]["HashApp"], 512.0)
                                 / 1024.0, 2))
        last_rep = 0
        for start in range(m0, m0 + minutes, 10):
            rep = max(1, math.ceil(max(s[start:start + 10]) / per_replica))
            t = float((start - m0) * 60)
            if start == m0:
                rows.append({"id": sid, "submit_s": t, "tenant": f"shop-{k % 6}",
                             "kind": "service", "replicas": rep, "cpu": 1.0,
                             "memory_gib": mem_gib, "user_region": rng.choice(users),
                             "latency_slo_ms": rng.choice(slo), "image_gb": 0.6,
                             "priority": 2})
            elif rep != last_rep:
                rows.append({"id": sid, "submit_s": t, "tenant": f"shop-{k % 6}",
                             "kind": "scale", "replicas": rep})
            last_rep = rep
    return rows


def retail_peak(data: Path) -> Draft:
    rng = random.Random(11)
    fns = functions_2019(data)
    users = ["new-york", "chicago", "los-angeles", "dallas"]
    _, m0 = busiest_window(fns, RETAIL_PEAK_FUNCTIONS, RETAIL_PEAK_MINUTES)
    rows = _service_rows(rng, fns, users, prefix="svc", count=RETAIL_PEAK_FUNCTIONS,
                         slo=(60.0, 80.0, 100.0), window=(m0, RETAIL_PEAK_MINUTES),
                         per_replica=REQS_PER_REPLICA_PER_MIN)
    total = [sum(s[m] for s in fns.series) for m in range(1440)]
    peak = max(total)
    n = 0
    for m in range(m0, m0 + RETAIL_PEAK_MINUTES):
        for _ in range(int(rng.random() + BATCH_PER_MIN_AT_PEAK * total[m] / peak)):
            n += 1
            rows.append({"id": f"batch-{n:05d}",
                         "submit_s": round((m - m0) * 60 + rng.uniform(0, 60), 1),
                         "tenant": f"analytics-{n % 4}", "kind": "batch",
                         "replicas": rng.randint(1, 6), "cpu": rng.choice([1.0, 2.0, 4.0]),
                         "memory_gib": rng.choice([2.0, 4.0, 8.0]),
                         "duration_s": round(rng.expovariate(1 / 600.0) + 60),
                         "data_gb": rng.choice([0.5, 2.0, 8.0]),
                         "data_region": rng.choice(["aws-use1", "gcp-usc1", "azure-eus"]),
                         "image_gb": 0.8, "priority": 0})
    doc: dict[str, object] = {
        "name": "retail-peak", "seed": 1, "horizon_s": 21600.0, "epoch_s": 30.0,
        "defaults": {"provision_delay_s": 120.0, "image_pull_gbps": 1.0, "network_gbps": 10.0},
        "clusters": [
            {"name": "aws-use1", "provider": "aws", "region": "us-east-1",
             "zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "quota_vcpu": 2000.0,
             "pools": [{"instance_type": "m5.2xlarge", "nodes": 8, "max_nodes": 120},
                       {"instance_type": "c5.4xlarge", "nodes": 0, "max_nodes": 40, "spot": True}]},
            {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
             "zones": ["us-central1-a", "us-central1-b"],
             "pools": [{"instance_type": "n2-standard-8", "nodes": 6, "max_nodes": 120},
                       {"instance_type": "n2-standard-8", "nodes": 0, "max_nodes": 60,
                        "spot": True}]},
            {"name": "azure-eus", "provider": "azure", "region": "eastus",
             "zones": ["eastus-1", "eastus-2", "eastus-3"],
             "pools": [{"instance_type": "Standard_D8s_v5", "nodes": 6, "max_nodes": 120}]},
            {"name": "edge-lax", "provider": "edge", "lat": 33.9425, "lon": -118.408,
             "capacity": {"cpu": 64.0, "memory_gib": 256.0, "gpu": 0, "price_per_hour": 2.4,
                          "uplink_gbps": 10.0}},
            {"name": "edge-chi", "provider": "edge", "lat": 41.9786, "lon": -87.9048,
             "capacity": {"cpu": 64.0, "memory_gib": 256.0, "gpu": 0, "price_per_hour": 2.4,
                          "uplink_gbps": 10.0}},
        ],
        "user_regions": [
            {"name": "new-york", "lat": 40.71, "lon": -74.01},
            {"name": "chicago", "lat": 41.88, "lon": -87.63},
            {"name": "los-angeles", "lat": 34.05, "lon": -118.24},
            {"name": "dallas", "lat": 32.78, "lon": -96.80},
        ],
        "faults": [
            {"at_s": 9000.0, "target": "aws-use1", "kind": "spot_reclaim", "nodes": 3},
            {"at_s": 12600.0, "target": "gcp-usc1", "kind": "price_change", "factor": 1.5,
             "duration_s": 3600.0},
            {"at_s": 14400.0, "target": "edge-chi", "kind": "site_down", "duration_s": 1800.0},
        ],
    }
    return Draft(doc=doc, rows=rows)


def gpu_training(data: Path) -> Draft:
    rng = random.Random(22)
    pods = alibaba_gpu_pods(data)
    window = GPU_TRAINING_WINDOW_S
    t0 = busiest_gpu_window(pods, window)
    chosen = [p for p in pods if t0 <= int(p["creation_time"]) < t0 + window]
    regions = ["aws-use1", "gcp-usc1", "azure-eus"]
    home = {f"team-{i}": rng.choice(regions) for i in range(8)}
    rows: list[dict[str, object]] = []
    for i, p in enumerate(sorted(chosen, key=lambda p: int(p["creation_time"]))):
        job = alibaba_pod(p)
        team = f"team-{i % 8}"
        rows.append({"id": p["name"], "submit_s": float(int(p["creation_time"]) - t0),
                     "tenant": team, "kind": "train", "replicas": 1,
                     "cpu": job.cpu, "memory_gib": job.memory_gib,
                     "gpu": job.gpus, "duration_s": job.run_s,
                     "data_gb": DATA_GB_PER_JOB * job.gpus, "data_region": home[team],
                     "image_gb": 8.0, "priority": job.priority})
    doc: dict[str, object] = {
        "name": "gpu-training", "seed": 2, "horizon_s": 86400.0, "epoch_s": 30.0,
        "defaults": {"provision_delay_s": 300.0, "image_pull_gbps": 2.0, "network_gbps": 25.0},
        "clusters": [
            {"name": "aws-use1", "provider": "aws", "region": "us-east-1",
             "pools": [{"instance_type": "p4d.24xlarge", "nodes": 1, "max_nodes": 6},
                       {"instance_type": "p3.16xlarge", "nodes": 1, "max_nodes": 6},
                       {"instance_type": "g4dn.12xlarge", "nodes": 2, "max_nodes": 12}]},
            {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
             "pools": [{"instance_type": "a2-highgpu-8g", "nodes": 1, "max_nodes": 6},
                       {"instance_type": "a2-highgpu-8g", "nodes": 0, "max_nodes": 4,
                        "spot": True}]},
            {"name": "azure-eus", "provider": "azure", "region": "eastus",
             "pools": [{"instance_type": "Standard_ND96asr_v4", "nodes": 0, "max_nodes": 4},
                       {"instance_type": "Standard_NC64as_T4_v3", "nodes": 2, "max_nodes": 12}]},
        ],
        "user_regions": [{"name": "research", "lat": 37.42, "lon": -122.08}],
        "faults": [
            {"at_s": 14400.0, "target": "gcp-usc1", "kind": "spot_reclaim", "nodes": 2},
            {"at_s": 21600.0, "target": "aws-use1", "kind": "quota_cut", "quota_vcpu": 200.0,
             "duration_s": 7200.0},
        ],
    }
    return Draft(doc=doc, rows=rows)


def edge_heavy(data: Path) -> Draft:
    rng = random.Random(33)
    with (data / "edge/eua_edge_servers_optus_melbcbd.csv").open() as fh:
        sites = list(csv.DictReader(fh))
    with (data / "edge/eua_users_melbcbd_generated.csv").open() as fh:
        people = [(float(r["Latitude"]), float(r["Longitude"])) for r in csv.DictReader(fh)]
    chosen = sites[:: max(1, len(sites) // 16)][:16]
    clusters: list[dict[str, object]] = [
        {"name": f"mec-{s['SITE_ID']}", "provider": "edge", "lat": float(s["LATITUDE"]),
         "lon": float(s["LONGITUDE"]),
         "capacity": {"cpu": 16.0, "memory_gib": 64.0, "gpu": 1 if i % 4 == 0 else 0,
                      **({"gpu_model": "T4"} if i % 4 == 0 else {}),
                      "price_per_hour": 0.9, "uplink_gbps": 1.0}}
        for i, s in enumerate(chosen)]
    clusters += [
        {"name": "aws-apse4", "provider": "aws", "region": "ap-southeast-4",
         "lat": -37.81, "lon": 144.96,
         "pools": [{"instance_type": "m5.2xlarge", "nodes": 2, "max_nodes": 40}]},
        {"name": "aws-apse2", "provider": "aws", "region": "ap-southeast-2",
         "pools": [{"instance_type": "m5.2xlarge", "nodes": 2, "max_nodes": 60}]},
        {"name": "azure-aue", "provider": "azure", "region": "australiaeast",
         "pools": [{"instance_type": "Standard_D8s_v5", "nodes": 2, "max_nodes": 60}]},
    ]
    people.sort()
    step = len(people) // 8
    users = []
    for k in range(8):
        grp = people[k * step:(k + 1) * step]
        users.append({"name": f"melb-{k}", "lat": round(sum(p[0] for p in grp) / len(grp), 5),
                      "lon": round(sum(p[1] for p in grp) / len(grp), 5)})
    fns = functions_2019(data)
    _, m0 = busiest_window(fns, EDGE_HEAVY_FUNCTIONS, EDGE_HEAVY_MINUTES)
    rows = _service_rows(rng, fns, [u["name"] for u in users], prefix="ar",
                         count=EDGE_HEAVY_FUNCTIONS, slo=(10.0, 15.0, 20.0),
                         window=(m0, EDGE_HEAVY_MINUTES),
                         per_replica=REQS_PER_REPLICA_PER_MIN * 4)
    for n in range(400):
        rows.append({"id": f"ingest-{n:04d}", "submit_s": round(rng.uniform(0, 10800), 1),
                     "tenant": "city", "kind": "batch", "replicas": rng.randint(1, 3),
                     "cpu": 2.0, "memory_gib": 4.0,
                     "duration_s": round(rng.expovariate(1 / 300.0) + 30),
                     "data_gb": 1.0, "data_region": "aws-apse4", "image_gb": 0.4})
    doc: dict[str, object] = {
        "name": "edge-heavy", "seed": 3, "horizon_s": 10800.0, "epoch_s": 15.0,
        "defaults": {"provision_delay_s": 90.0, "image_pull_gbps": 1.0, "network_gbps": 10.0},
        "clusters": clusters,
        "user_regions": users,
        "faults": [
            {"at_s": 3600.0, "target": str(clusters[0]["name"]), "kind": "site_down",
             "duration_s": 1200.0},
            {"at_s": 6000.0, "target": str(clusters[5]["name"]), "kind": "partition",
             "duration_s": 900.0},
        ],
    }
    return Draft(doc=doc, rows=rows)


NOTES = {
    "retail-peak": [
        "Services: the 40 busiest functions of the Azure Functions 2019 sample",
        "(shared/data/traces/azure_functions; Shahrad et al., ATC'20; CC-BY-4.0) over the real",
        "6-hour window with the most invocations, at real time (no compression); replicas per",
        "10-minute window = ceil(busiest minute's invocations / 150); memory: AverageAllocatedMb.",
        "Batch jobs: arrivals follow the aggregate invocation curve; sizes and run times are",
        "synthetic (no public per-job CPU trace in shared/data). No GPUs.",
    ],
    "gpu-training": [
        "GPU pods of the Alibaba GPU 2023 pod list (shared/data/traces/alibaba_gpu_v2023; FGD,",
        "ATC'23) created in the real 24-hour window with the most multi-GPU pods, at their real",
        "creation times (no compression). Run time = deletion - scheduled, clipped to 60 s..6 h",
        "(pods still running at the trace's end have no known end). CPU and memory as requested,",
        "capped at 11 vCPU and 110 GiB per GPU so every pod fits a node.",
        "GPU rounding: Kubernetes requests nvidia.com/gpu in whole devices, so a fractional",
        "request (gpu_milli < 1000: one GPU shared) is rounded up to 1 whole GPU per device.",
        "Data: 20 GB per GPU from the team's home region (an assumption: the trace has none).",
    ],
    "edge-heavy": [
        "MEC sites: 16 real Optus base stations in Melbourne CBD (EUA dataset, ICSOC'18; MIT);",
        "users: EUA's generated user locations grouped into 8 regions. Services: the 30 busiest",
        "Azure Functions 2019 functions over the real 3-hour window with the most invocations,",
        "at real time (no compression); replicas = ceil(busiest minute / 600) per 10 minutes.",
        "Ingest batch jobs: synthetic (uniform arrivals, exponential run times). No GPU jobs.",
    ],
    "federation-day": [
        "Services: all 1,000 functions of the Azure Functions 2019 sample over their real day;",
        "replicas per 10 min = invocations in flight in the busiest minute (count x mean",
        "execution time, `run` file) / 0.5 (HPA --cpu-percent=50), one 1-vCPU replica each;",
        "tenant = the function's owner; windows shifted by a seeded per-service phase < 600 s.",
        "GPU training: Microsoft Philly jobs (ATC'19, via Pollux) of 2017-10-20 at real submit",
        "and run times, tenant = virtual cluster, plus the jobs running at that midnight",
        "(submitted at t=0 with their remaining run time). Jobs over 8 GPUs run as replicas of",
        "<= 8 GPUs (GPUs per replica rounded up to whole GPUs). 8 vCPU + 30 GiB per GPU (median",
        "per-GPU request of the Alibaba GPU 2023 pods, rounded down to fit 1-GPU nodes).",
        "Data: 20 GB per GPU from the virtual cluster's home cluster (an assumption).",
        "Clusters: 16 regions per cloud (catalog prices) + AWS Local Zone metros as edge sites;",
        "users: 20 metros of the CloudFront edge location list. See scripts/federation_day.py.",
    ],
}
BUILDERS = {"retail-peak": retail_peak, "gpu-training": gpu_training, "edge-heavy": edge_heavy}


def size_line(draft: Draft, catalog: Catalog) -> str:
    """Clusters, nodes at t=0 (and the most pools may grow to), events, simulated hours."""
    scn = draft.to_scenario(catalog)  # validates against SCENARIO.md before writing
    nodes = sum(p.nodes for c in scn.clusters for p in c.pools)
    most = sum(p.max_nodes for c in scn.clusters for p in c.pools)
    return (f"{scn.name}: {len(scn.clusters)} clusters, {nodes:,} nodes at t=0 (max_nodes "
            f"{most:,}), {len(scn.events):,} events, {scn.horizon_s / 3600:g} simulated hours, "
            f"{len(scn.faults)} faults")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path, default=Path("config/scenarios"))
    ap.add_argument("--only", action="append", choices=[*BUILDERS, "federation-day"],
                    help="build only this scenario (repeatable)")
    args = ap.parse_args()
    catalog = Catalog.load()
    for name in args.only or [*BUILDERS, "federation-day"]:
        draft = (federation_day(args.data, catalog) if name == "federation-day"
                 else BUILDERS[name](args.data))
        size = size_line(draft, catalog)
        draft.notes = [size, "Built by scripts/build_scenarios.py from shared/data; "
                       "see docs/twin.md.", "", *NOTES[name]]
        path = draft.write(args.out / name)
        print(f"{path}: {size}")


if __name__ == "__main__":
    main()
