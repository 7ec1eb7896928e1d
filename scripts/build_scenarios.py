"""Build the shipped twin scenarios under config/scenarios/ from real data in shared/data.

    .venv/bin/python scripts/build_scenarios.py [--data ../shared/data] [--out config/scenarios]

Writes, each as `<name>/scenario.toml` + `<name>/trace.csv.gz` (SCENARIO.md format):

- retail-peak: AWS us-east-1, GCP us-central1, Azure eastus + two edge sites at AWS Local
  Zone metros (edge/aws_local_and_wavelength_zones_2023-06_latlon.csv). Demand shape: the
  Azure Functions 2019 per-minute invocation counts (traces/azure_functions, 1,000-function
  sample): the 40 busiest functions become services whose replica count follows their
  invocations (one replica per REQS_PER_REPLICA_PER_MIN, re-evaluated every 10 min -> `scale`
  events), memory from the same sample's AverageAllocatedMb; batch jobs arrive in proportion to
  the aggregate invocation curve. The 24 h day is compressed into 6 h (x4).
- gpu-training: GPU pools of the three clouds (A100 NVSwitch, V100 NVLink, T4 PCIe) fed by the
  Alibaba GPU 2023 pod list (traces/alibaba_gpu_v2023/openb_pod_list_default.csv): GPU pods of
  the busiest 48 h window, their CPU/memory/GPU requests and run times (deletion - scheduled,
  clipped to 60 s..6 h), time compressed x4 into 12 h. Fractional GPUs (gpu_milli < 1000) are
  rounded up to one whole GPU. The trace has no data sizes: each job reads DATA_GB_PER_JOB from
  its tenant's home region (an assumption, documented in docs/twin.md).
- edge-heavy: 16 real Optus base stations in Melbourne CBD (EUA dataset,
  edge/eua_edge_servers_optus_melbcbd.csv) as MEC sites, users from the EUA generated user
  locations grouped into 8 regions, Sydney/Melbourne cloud regions behind them; latency-bound
  services (10-20 ms SLO) with scale events shaped like the Azure Functions curve; faults: a
  site outage and a partition.

Prices, node shapes and region coordinates come from the catalog (providers/catalog.py).
Deterministic: fixed seeds; re-running gives the same files.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.sim.randomize import Draft, random_draft
from providers.catalog import Catalog

REQS_PER_REPLICA_PER_MIN = 150.0
DATA_GB_PER_JOB = 20.0
COMPRESS = 4.0


def _read_gz_csv(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _functions(data: Path) -> tuple[list[list[int]], dict[str, float], list[dict[str, str]]]:
    inv = _read_gz_csv(data / "traces/azure_functions/azure_functions_2019_sample1000_inv.csv.gz")
    mem = _read_gz_csv(data / "traces/azure_functions/azure_functions_2019_sample1000_mem.csv.gz")
    mem_by_app = {r["HashApp"]: float(r["AverageAllocatedMb"]) for r in mem}
    series = [[int(r[f"minute_{m}"]) for m in range(1, 1441)] for r in inv]
    return series, mem_by_app, inv


def _service_rows(rng: random.Random, series: list[list[int]], apps: list[str],
                  mem_by_app: dict[str, float], users: list[str], *, prefix: str,
                  count: int, slo: tuple[float, ...], compress: float,
                  per_replica: float) -> list[dict[str, object]]:
    order = sorted(range(len(series)), key=lambda i: -sum(series[i]))[:count]
    rows: list[dict[str, object]] = []
    for k, i in enumerate(order):
        s = series[i]
        sid = f"{prefix}-{k:02d}"
        mem_gib = max(0.5, round(mem_by_app.get(apps[i], 512.0) / 1024.0, 2))
        first = None
        last_rep = 0
        for start in range(0, 1440, 10):
            rate = max(s[start:start + 10]) if s[start:start + 10] else 0
            rep = max(1, math.ceil(rate / per_replica))
            t = round(start * 60 / compress, 1)
            if first is None:
                first = t
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
    series, mem_by_app, inv = _functions(data)
    apps = [r["HashApp"] for r in inv]
    users = ["new-york", "chicago", "los-angeles", "dallas"]
    rows = _service_rows(rng, series, apps, mem_by_app, users, prefix="svc", count=40,
                         slo=(60.0, 80.0, 100.0), compress=COMPRESS,
                         per_replica=REQS_PER_REPLICA_PER_MIN)
    total = [sum(s[m] for s in series) for m in range(1440)]
    peak = max(total)
    n = 0
    for m in range(1440):
        for _ in range(int(rng.random() + 2.0 * total[m] / peak)):
            n += 1
            rows.append({"id": f"batch-{n:05d}", "submit_s": round((m * 60 + rng.uniform(0, 60))
                                                                   / COMPRESS, 1),
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
    with (data / "traces/alibaba_gpu_v2023/openb_pod_list_default.csv").open() as fh:
        pods = [r for r in csv.DictReader(fh) if int(r["num_gpu"]) >= 1
                and r["deletion_time"] and r["scheduled_time"]]
    window = 48 * 3600

    def multi(t0: int) -> int:
        return sum(1 for p in pods if t0 <= int(p["creation_time"]) < t0 + window
                   and int(p["num_gpu"]) > 1)

    starts = sorted({int(p["creation_time"]) // 3600 * 3600 for p in pods})
    t0 = max(starts, key=lambda s: (multi(s), -s))
    chosen = [p for p in pods if t0 <= int(p["creation_time"]) < t0 + window]
    regions = ["aws-use1", "gcp-usc1", "azure-eus"]
    home = {f"team-{i}": rng.choice(regions) for i in range(8)}
    rows: list[dict[str, object]] = []
    for i, p in enumerate(sorted(chosen, key=lambda p: int(p["creation_time"]))):
        gpus = int(p["num_gpu"])
        run = min(6 * 3600, max(60, int(p["deletion_time"]) - int(p["scheduled_time"])))
        team = f"team-{i % 8}"
        rows.append({"id": p["name"], "submit_s": round((int(p["creation_time"]) - t0)
                                                        / COMPRESS, 1),
                     "tenant": team, "kind": "train", "replicas": 1,
                     "cpu": round(min(int(p["cpu_milli"]) / 1000.0, 11.0 * gpus), 2),
                     "memory_gib": round(min(int(p["memory_mib"]) / 1024.0, 110.0 * gpus), 2),
                     "gpu": gpus, "duration_s": float(run),
                     "data_gb": DATA_GB_PER_JOB * gpus, "data_region": home[team],
                     "image_gb": 8.0, "priority": 1 if p["qos"] == "LS" else 0})
    doc: dict[str, object] = {
        "name": "gpu-training", "seed": 2, "horizon_s": 43200.0, "epoch_s": 30.0,
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
    series, mem_by_app, inv = _functions(data)
    apps = [r["HashApp"] for r in inv]
    rows = _service_rows(rng, series, apps, mem_by_app, [u["name"] for u in users],
                         prefix="ar", count=30, slo=(10.0, 15.0, 20.0),
                         compress=COMPRESS * 2,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path, default=Path("config/scenarios"))
    ap.add_argument("--speed-out", type=Path, default=None,
                    help="also write the speed scenario (50 clusters, 20,000 events, one day, "
                         "randomized; not shipped: ~0.5 MB) into this folder")
    args = ap.parse_args()
    catalog = Catalog.load()
    if args.speed_out is not None:
        draft = random_draft(catalog, 50, n_clusters=46, n_edge=4, horizon_s=86400.0,
                             n_events=20_000)
        draft.doc["name"] = "speed-50x20k"
        path = draft.write(args.speed_out)
        print(f"{path}: 50 clusters, {len(draft.rows)} events")
    for build in (retail_peak, gpu_training, edge_heavy):
        draft = build(args.data)
        scn = draft.to_scenario(catalog)  # validates against SCENARIO.md before writing
        path = draft.write(args.out / str(draft.doc["name"]))
        print(f"{path}: {len(scn.clusters)} clusters, {len(scn.events)} events, "
              f"{len(scn.faults)} faults")


if __name__ == "__main__":
    main()
