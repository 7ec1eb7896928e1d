"""The `federation-day` scenario: one real day, 53 clusters, 3,926 nodes at t=0, 21,333 events.

Built by scripts/build_scenarios.py from shared/data (SOURCES.md names each file's origin):

- Services: all 1,000 functions of the Azure Functions 2019 sample
  (traces/azure_functions, Shahrad et al., ATC'20; CC-BY-4.0) over their one real day, no
  time compression. Replicas per 10-minute window: invocations in flight in the window's
  busiest minute (per-minute count x the function's mean execution time from the `run` file),
  one 1-vCPU replica per invocation in flight at the Kubernetes HPA walkthrough's 50 % target
  (broker/sim/sources.py::service_replicas). Memory per replica: the app's AverageAllocatedMb
  (`mem` file). Tenant: the function's owner (HashOwner). Each service's windows are shifted by
  a seeded phase in [0, 600) s so that 1,000 autoscalers do not act in the same second.
- GPU training: the Microsoft Philly jobs (traces/philly, Jeon et al., ATC'19, via Pollux,
  OSDI'21) of the trace's busiest day, 2017-10-20 (3,712 jobs), at their real submit times
  and run times, tenant = Philly virtual cluster; plus the jobs still running at that day's
  midnight, submitted at t = 0 with their remaining run time (a warm start, not an empty
  federation). GPUs per job as recorded, split into replicas of at most 8 GPUs
  (sources.philly_job). CPU and memory per GPU: 8 vCPU and 30 GiB, the median request per
  GPU of the Alibaba GPU 2023 pods (9.8 vCPU, 30.5 GiB) rounded down so that a 1-GPU job fits
  the 8-vCPU, 32-GiB one-GPU instances all three clouds sell. Philly has no data sizes: each
  virtual cluster reads DATA_GB_PER_GPU per GPU from a home cluster (an assumption).
- Clusters: 16 regions per cloud (AWS, GCP, Azure; catalog prices and coordinates), each with
  an 8-vCPU general-purpose pool, a one-GPU pool, and the 4- and 8-GPU types the region sells;
  every third cluster also a spot pool of its CPU type. Edge sites at the AWS Local Zone
  metros within 100 km of a user metro (edge/aws_local_and_wavelength_zones_2023-06_latlon.csv;
  five: Chicago, Dallas, Los Angeles, New York, Singapore), priced like retail-peak's.
- Users: 20 metros of the CloudFront edge location list (edge/aws_cloudfront_...csv).
- Nodes at t = 0: CPU pools hold the services' t = 0 demand, spread evenly; GPU pools a few
  nodes each. Sizes are printed by the builder and noted at the top of scenario.toml.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.sim.randomize import Draft
from broker.sim.sources import philly_job, scale_rows, service_replicas
from broker.sim.tracedata import (
    FEDERATION_DAY,
    cloudfront_locations,
    functions_2019,
    local_zones,
    philly_jobs,
)
from providers.catalog import Catalog
from providers.errors import NotFoundError
from providers.geo import haversine_km

DAY = FEDERATION_DAY
DATA_GB_PER_GPU = 20.0
CLUSTERS_PER_CLOUD = 16
METROS = ("New York", "Chicago", "Los Angeles", "Dallas", "Toronto", "Sao Paulo", "London",
          "Frankfurt am Main", "Paris", "Stockholm", "Madrid", "Dubai", "Johannesburg",
          "Mumbai", "Singapore", "Tokyo", "Seoul", "Hong Kong", "Sydney", "Jakarta")
# Per cloud: CPU type, one-GPU types (first sold wins), 4-GPU types, 8-GPU types.
TYPES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "aws": ("m5.2xlarge", ("g4dn.2xlarge", "g4dn.4xlarge"), ("g4dn.12xlarge",),
            ("p4d.24xlarge", "g5.48xlarge")),
    "gcp": ("n2-standard-8", ("g2-standard-8",), ("g2-standard-48",),
            ("a2-highgpu-8g", "g2-standard-96")),
    "azure": ("Standard_D8s_v5", ("Standard_NC8as_T4_v3",), ("Standard_NC64as_T4_v3",),
              ("Standard_ND96amsr_A100_v4",)),
}


def _sells(catalog: Catalog, provider: str, region: str, itype: str) -> bool:
    try:
        return bool(catalog.offer(provider, region, itype).price_usd_per_hour)
    except NotFoundError:
        return False


def _first_sold(catalog: Catalog, provider: str, region: str,
                types: tuple[str, ...]) -> str | None:
    return next((t for t in types if _sells(catalog, provider, region, t)), None)


def _cloud_clusters(catalog: Catalog) -> Iterator[dict[str, Any]]:
    for provider, (cpu, one, four, eight) in TYPES.items():
        chosen = 0
        for region in sorted(catalog.regions(provider), key=lambda r: r.name):
            if chosen >= CLUSTERS_PER_CLOUD or region.lat is None or "-lax-" in region.name:
                continue
            gpu1 = _first_sold(catalog, provider, region.name, one)
            if not _sells(catalog, provider, region.name, cpu) or gpu1 is None:
                continue
            pools: list[dict[str, Any]] = [{"instance_type": cpu, "nodes": 0, "max_nodes": 0},
                                           {"instance_type": gpu1, "nodes": 2, "max_nodes": 60}]
            for types in (four, eight):
                big = _first_sold(catalog, provider, region.name, types)
                if big is not None:
                    pools.append({"instance_type": big, "nodes": 1, "max_nodes": 10})
            if chosen % 3 == 0:
                pools.append({"instance_type": cpu, "nodes": 0, "max_nodes": 40, "spot": True})
            chosen += 1
            yield {"name": f"{provider}-{region.name}", "provider": provider,
                   "region": region.name,
                   "zones": [f"{region.name}-a", f"{region.name}-b", f"{region.name}-c"],
                   "pools": pools}


def _metros(data: Path) -> list[dict[str, Any]]:
    by_city = {r["city"]: r for r in cloudfront_locations(data)}
    return [{"name": city.lower().replace(" ", "-"), "lat": float(by_city[city]["latitude"]),
             "lon": float(by_city[city]["longitude"])} for city in METROS]


def _edge_sites(data: Path, users: list[dict[str, Any]], count: int = 6
                ) -> list[dict[str, Any]]:
    zones = local_zones(data)
    sites: list[dict[str, Any]] = []
    for z in zones:
        lat, lon = float(z["latitude"]), float(z["longitude"])
        near = min(haversine_km(lat, lon, u["lat"], u["lon"]) for u in users)
        taken = any(s["name"] == f"edge-{z['metro_code']}" for s in sites)
        if near <= 100.0 and len(sites) < count and not taken:
            sites.append({"name": f"edge-{z['metro_code']}", "provider": "edge",
                          "lat": lat, "lon": lon,
                          "capacity": {"cpu": 64.0, "memory_gib": 256.0, "gpu": 0,
                                       "price_per_hour": 2.4, "uplink_gbps": 10.0}})
    return sites


def _service_rows(data: Path, users: list[dict[str, Any]], rng: random.Random
                  ) -> list[dict[str, Any]]:
    fns = functions_2019(data)
    run, mem = fns.mean_exec_s, fns.mem_mb_by_app
    home = {}
    rows: list[dict[str, Any]] = []
    for k, r in enumerate(fns.rows):
        owner = r["HashOwner"][:10]
        home.setdefault(owner, rng.choice(users)["name"])
        windows = service_replicas(fns.series[k], run.get(r["HashFunction"], 1.0))
        phase = rng.uniform(0.0, 600.0)
        sid = f"fn-{k:04d}"
        for i, (t, replicas) in enumerate(scale_rows(windows)):
            if i == 0:
                rows.append({"id": sid, "submit_s": t, "tenant": f"owner-{owner}",
                             "kind": "service", "replicas": replicas, "cpu": 1.0,
                             "memory_gib": max(0.5, round(mem.get(r["HashApp"], 512.0) / 1024,
                                                          2)),
                             "user_region": home[owner],
                             "latency_slo_ms": rng.choice([50.0, 100.0, 150.0, ""]),
                             "image_gb": 0.6, "priority": 2})
            else:
                rows.append({"id": sid, "submit_s": round(t + phase, 1), "kind": "scale",
                             "replicas": replicas})
    return rows


def _philly_rows(data: Path, homes: list[str], rng: random.Random) -> list[dict[str, Any]]:
    jobs = philly_jobs(data)
    start, end = DAY, DAY + dt.timedelta(days=1)
    vc_home: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for i, j in enumerate(jobs):
        submit = dt.datetime.fromisoformat(j["timestamp"])
        duration = max(1.0, float(j["duration"]))
        finish = submit + dt.timedelta(seconds=duration)
        if submit >= end or finish <= start or submit < start - dt.timedelta(days=60):
            continue
        if submit < start:  # still running at midnight: warm start with the remaining time
            t, duration = 0.0, (finish - start).total_seconds()
        else:
            t = (submit - start).total_seconds()
        vc = j["cluster"]
        home = vc_home.setdefault(vc, rng.choice(homes))
        job = philly_job(int(j["num_gpus"]), duration)
        rows.append({"id": f"philly-{i:05d}", "submit_s": t, "tenant": f"vc-{vc}",
                     "kind": "train", "replicas": job.replicas, "cpu": job.cpu,
                     "memory_gib": job.memory_gib, "gpu": job.gpus,
                     "duration_s": round(duration, 1),
                     "data_gb": DATA_GB_PER_GPU * job.gpus * job.replicas, "data_region": home,
                     "image_gb": 8.0, "priority": 0})
    return rows


def _size_cpu_pools(clusters: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """CPU pools at t=0 hold the services' t=0 demand; max_nodes twice the daily peak."""
    replicas: dict[str, int] = {}
    cpu = {r["id"]: float(r["cpu"]) for r in rows if r["kind"] == "service"}
    demand_t0 = sum(r["replicas"] * r["cpu"] for r in rows if r["kind"] == "service")
    peak = 0.0
    for r in sorted(rows, key=lambda r: float(r["submit_s"])):
        if r["kind"] in ("service", "scale"):
            replicas[r["id"]] = int(r["replicas"])
            peak = max(peak, sum(n * cpu[s] for s, n in replicas.items()))
    pools = [p for c in clusters for p in c.get("pools", [])
             if p["max_nodes"] == 0 and not p.get("spot")]
    for p in pools:
        p["nodes"] = math.ceil(demand_t0 / 8.0 / len(pools))
        p["max_nodes"] = math.ceil(2.0 * peak / 8.0 / len(pools))


def federation_day(data: Path, catalog: Catalog) -> Draft:
    rng = random.Random(44)
    clusters = list(_cloud_clusters(catalog))
    users = _metros(data)
    clusters += _edge_sites(data, users)
    rows = _service_rows(data, users, rng)
    eight_gpu = [c["name"] for c in clusters if any(
        catalog.offer(c["provider"], c["region"], p["instance_type"]).gpu_count == 8
        for p in c.get("pools", []))]
    rows += _philly_rows(data, eight_gpu, rng)
    _size_cpu_pools(clusters, rows)
    spot = [c for c in clusters if any(p.get("spot") for p in c.get("pools", []))]
    faults: list[dict[str, Any]] = [
        {"at_s": 4.0 * 3600 * (k + 1), "target": c["name"], "kind": "spot_reclaim", "nodes": 3}
        for k, c in enumerate(spot[:5])]
    faults += [
        {"at_s": 9.0 * 3600, "target": clusters[1]["name"], "kind": "price_change",
         "factor": 1.5, "duration_s": 3.0 * 3600},
        {"at_s": 13.0 * 3600, "target": clusters[-1]["name"], "kind": "site_down",
         "duration_s": 1800.0},
        {"at_s": 17.0 * 3600, "target": clusters[20]["name"], "kind": "partition",
         "duration_s": 3600.0},
    ]
    doc: dict[str, Any] = {
        "name": "federation-day", "seed": 4, "horizon_s": 86400.0, "epoch_s": 30.0,
        "defaults": {"provision_delay_s": 120.0, "image_pull_gbps": 1.0, "network_gbps": 10.0},
        "clusters": clusters, "user_regions": users, "faults": faults,
    }
    return Draft(doc=doc, rows=rows)
