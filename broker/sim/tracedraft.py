"""Training scenarios from the real traces: random windows, scales and places of shared/data.

Why: a policy trained on randomize.random_draft's synthetic shapes (a sine plus bursts,
uniform job sizes) beat lp on those drafts and lost to lp on the real-trace scenarios
(docs/twin.md "The policy"). `trace_draft(catalog, data, seed)` builds a scenario the way
the shipped ones are built, from the same traces through the same conversions
(tracedata.py reads, sources.py converts), but never from a window a shipped scenario
replays (`tracedata.shipped_windows`), and with everything else drawn at random:

- kind: "services" (functions + batch jobs), "edge" (MEC sites around a metro, tight-SLO
  functions, ingest jobs), "gpu" (training jobs only) or "mixed" (functions + training);
- places: 2-5 catalog regions of the three clouds (their prices and node shapes), the
  CloudFront metros nearest to them as user regions, Local Zone coordinates as edge sites;
  an "edge" draft centres on one Local Zone metro, its MEC sites within ~5 km of it and its
  cloud regions the nearest ones;
- services: one window of the Azure Functions 2019 day, `horizon_s` long, outside the
  shipped minutes; functions drawn in proportion to their invocations in the window until
  their peak demand reaches a log-uniform vCPU budget; replicas per 10 minutes by Little's
  law at the HPA target (`sources.service_replicas`) times a random load scale (a larger or
  smaller tenant of the same shape), scale events as the shipped scenarios (`scale_rows`);
- training jobs: 1-3 windows of the Alibaba GPU 2023 pods or of Philly, overlaid (more
  tenants of the same trace), each placed at a random job's submit time minus a random
  offset, none clashing with a shipped window; rows by `sources.alibaba_pod` / `philly_job`,
  at most MAX_TRAIN_JOBS (a uniform subsample beyond);
- batch jobs (synthetic, as in the shipped scenarios: data/ has no per-job CPU trace):
  arrivals following the window's aggregate invocation curve at a random peak rate
  ("services", "mixed"), uniform ingest arrivals ("edge"); sizes and run times drawn;
- pools: CPU pools hold the services' t=0 demand times a random factor, `max_nodes` twice the
  peak over their count plus slack; GPU pools of 1-, 4- and 8-GPU types the regions sell,
  grown to hold a random 0.5-1.5 of the GPUs the jobs ask for;
- faults: `randomize.random_faults`.

Each draft lists the windows it replays (`TraceDraft.windows`) and notes them in its header.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.sim.randomize import Draft, pick_cpu_type, pick_gpu_type, random_faults
from broker.sim.sources import alibaba_pod, philly_job, scale_rows, service_replicas
from broker.sim.tracedata import (
    ALIBABA_TRACE,
    AZURE_TRACE,
    PHILLY_TRACE,
    Window,
    alibaba_gpu_pods,
    cloudfront_locations,
    functions_2019,
    local_zones,
    philly_jobs,
    philly_seconds,
    shipped_windows,
)
from providers.catalog import Catalog
from providers.geo import haversine_km

KINDS = ("services", "edge", "gpu", "mixed")
MAX_TRAIN_JOBS = 150
MAX_SERVICES = 60
MAX_GPU_POOL_NODES = 40
DATA_GB_PER_GPU = 20.0  # as the shipped GPU scenarios assume (their traces have no sizes)
WINDOW_TRIES = 50


@dataclass
class TraceDraft(Draft):
    """A Draft plus the real windows it replays."""

    windows: list[Window] = field(default_factory=list)


def trace_draft(catalog: Catalog, data: Path, seed: int, *, horizon_s: float = 7200.0,
                kind: str | None = None) -> TraceDraft:
    """A training scenario from random windows of the real traces (module docstring)."""
    rng = random.Random(seed)
    kind = kind or rng.choice(KINDS)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    shipped = shipped_windows(data)
    users, clusters = _places(catalog, data, rng, kind)
    clouds = [c for c in clusters if c["provider"] != "edge"]
    rows: list[dict[str, Any]] = []
    windows: list[Window] = []
    if kind != "gpu":
        win = _azure_window(rng, horizon_s, shipped)
        windows.append(win)
        rows += _service_rows(data, rng, win, users, edge=kind == "edge")
        rows += (_ingest_rows(rng, horizon_s, clouds) if kind == "edge"
                 else _batch_rows(data, rng, win, clouds))
    if kind in ("gpu", "mixed"):
        jobs, gpu_windows = _train_rows(data, rng, horizon_s, shipped, clouds)
        rows += jobs
        windows += gpu_windows
        _add_gpu_pools(catalog, rng, clouds, need_8=any(int(r["gpu"]) > 4 for r in jobs))
        _size_gpu_pools(catalog, rng, clouds,
                        sum(int(r["gpu"]) * int(r["replicas"]) for r in jobs))
    _size_cpu_pools(catalog, rng, clouds, rows, gpu_only=kind == "gpu")
    doc: dict[str, Any] = {
        "name": f"trace-{seed}", "seed": seed, "horizon_s": horizon_s,
        "epoch_s": rng.choice([15.0, 30.0]),
        "defaults": {"provision_delay_s": float(rng.choice([60, 90, 120, 180, 300])),
                     "image_pull_gbps": rng.choice([0.5, 1.0, 2.0]),
                     "network_gbps": rng.choice([5.0, 10.0, 25.0])},
        "clusters": clusters, "user_regions": users,
        "faults": random_faults(rng, clusters, horizon_s),
        "workloads": {"trace": "trace.csv.gz"},
    }
    notes = [f"kind {kind}; windows: " + ", ".join(
        f"{w.trace} [{w.start:g}, {w.end:g})" for w in windows)]
    return TraceDraft(doc=doc, rows=rows, notes=notes, windows=windows)


# ------------------------------------------------------------------ places


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


def _places(catalog: Catalog, data: Path, rng: random.Random, kind: str
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(user regions, clusters without sized pools); an edge draft's clouds nearest first."""
    regions = [(p, r) for p in ("aws", "gcp", "azure") for r in catalog.regions(p)
               if r.lat is not None and r.lon is not None]
    centre: tuple[float, float] | None = None
    if kind == "edge":
        zone = rng.choice(local_zones(data))
        centre = (float(zone["latitude"]), float(zone["longitude"]))
        regions.sort(key=lambda pr: haversine_km(centre[0], centre[1], pr[1].lat or 0.0,
                                                 pr[1].lon or 0.0))
        picked = regions[:rng.randint(2, 3)]
    else:
        rng.shuffle(regions)
        picked = regions[:rng.randint(2, 5)]
    clusters: list[dict[str, Any]] = []
    for provider, region in picked:
        cpu_type = pick_cpu_type(catalog, provider, region.name, rng)
        if cpu_type is None:
            continue
        pools: list[dict[str, Any]] = [{"instance_type": cpu_type, "nodes": 0, "max_nodes": 1}]
        if kind != "gpu" and rng.random() < 0.4:
            pools.append({"instance_type": cpu_type, "nodes": 0,
                          "max_nodes": rng.randint(10, 40), "spot": True})
        c: dict[str, Any] = {"name": f"{provider}-{region.name}", "provider": provider,
                             "region": region.name, "pools": pools}
        if rng.random() < 0.6:
            c["zones"] = [f"{region.name}-a", f"{region.name}-b", f"{region.name}-c"]
        if rng.random() < 0.2:
            c["quota_vcpu"] = float(rng.choice([512, 1024, 2000]))
        clusters.append(c)
    if centre is not None:
        users: list[dict[str, Any]] = [
            {"name": f"metro-{k}", "lat": round(centre[0] + rng.uniform(-0.08, 0.08), 5),
             "lon": round(centre[1] + rng.uniform(-0.08, 0.08), 5)}
            for k in range(rng.randint(3, 8))]
        clusters += [_edge_site(rng, f"mec-{k}", centre[0] + rng.uniform(-0.05, 0.05),
                                centre[1] + rng.uniform(-0.05, 0.05), small=True)
                     for k in range(rng.randint(4, 12))]
        return users, clusters
    users = _metros(data, rng, clusters, catalog)
    near = [z for z in local_zones(data) if any(
        haversine_km(float(z["latitude"]), float(z["longitude"]), u["lat"], u["lon"]) <= 150.0
        for u in users)]
    for k, z in enumerate(rng.sample(near, min(len(near), rng.randint(0, 2)))):
        clusters.append(_edge_site(rng, f"edge-{z['metro_code']}-{k}", float(z["latitude"]),
                                   float(z["longitude"]), small=False))
    return users, clusters


def _metros(data: Path, rng: random.Random, clusters: list[dict[str, Any]],
            catalog: Catalog) -> list[dict[str, Any]]:
    """The CloudFront metro nearest to each cluster, plus up to three within 3000 km."""
    locs = cloudfront_locations(data)
    spots = [(catalog.region(c["provider"], c["region"]).lat or 0.0,
              catalog.region(c["provider"], c["region"]).lon or 0.0) for c in clusters]

    def dist(loc: dict[str, str], at: tuple[float, float]) -> float:
        return haversine_km(float(loc["latitude"]), float(loc["longitude"]), *at)

    chosen = {min(locs, key=lambda loc: dist(loc, at))["code"] for at in spots}
    close = sorted(loc["code"] for loc in locs if loc["code"] not in chosen
                   and min(dist(loc, at) for at in spots) <= 3000.0)
    chosen |= set(rng.sample(close, min(len(close), rng.randint(0, 3))))
    by_code = {loc["code"]: loc for loc in locs}
    return [{"name": _slug(f"{by_code[c]['city']}-{c}"),
             "lat": float(by_code[c]["latitude"]), "lon": float(by_code[c]["longitude"])}
            for c in sorted(chosen)]


def _edge_site(rng: random.Random, name: str, lat: float, lon: float, *,
               small: bool) -> dict[str, Any]:
    gpu = 1 if small and rng.random() < 0.25 else 0
    cap: dict[str, Any] = {
        "cpu": float(rng.choice([8, 16, 32] if small else [32, 64])),
        "memory_gib": float(rng.choice([32, 64, 128] if small else [128, 256])),
        "gpu": gpu, "price_per_hour": round(rng.uniform(0.5, 1.5) if small
                                            else rng.uniform(1.0, 3.0), 2),
        "uplink_gbps": 1.0 if small else rng.choice([1.0, 10.0])}
    if gpu:
        cap["gpu_model"] = "T4"
    return {"name": name, "provider": "edge", "lat": round(lat, 5), "lon": round(lon, 5),
            "capacity": cap}


# ------------------------------------------------------------------ windows


def _azure_window(rng: random.Random, horizon_s: float, shipped: tuple[Window, ...]) -> Window:
    minutes = max(10, math.ceil(horizon_s / 60.0))
    starts = [m for m in range(0, 1440 - minutes + 1, 10)
              if not any(Window(AZURE_TRACE, m, m + minutes).clashes(w) for w in shipped)]
    if not starts:
        raise ValueError(f"no {minutes}-minute window of the Azure day is outside the "
                         "shipped scenarios' windows")
    m0 = rng.choice(starts)
    return Window(AZURE_TRACE, m0, m0 + minutes)


def _gpu_window(rng: random.Random, trace: str, times: list[float], horizon_s: float,
                shipped: tuple[Window, ...], taken: list[Window]) -> Window | None:
    """A window at a random job's time minus a random offset, clashing with no shipped (or
    already taken) window; None after WINDOW_TRIES tries."""
    for _ in range(WINDOW_TRIES):
        start = rng.choice(times) - rng.uniform(0.0, horizon_s)
        w = Window(trace, start, start + horizon_s)
        if not any(w.clashes(s) for s in (*shipped, *taken)):
            return w
    return None


@functools.lru_cache(maxsize=2)
def _philly_times(data: Path) -> tuple[float, ...]:
    return tuple(philly_seconds(j["timestamp"]) for j in philly_jobs(data))


# ------------------------------------------------------------------ rows


def _service_rows(data: Path, rng: random.Random, win: Window, users: list[dict[str, Any]],
                  *, edge: bool) -> list[dict[str, Any]]:
    fns = functions_2019(data)
    m0, minutes = int(win.start), int(win.end - win.start)
    scale = math.exp(rng.uniform(math.log(0.3), math.log(3.0)))
    budget = math.exp(rng.uniform(math.log(20.0), math.log(400.0)))  # peak vCPU
    volume = [sum(s[m0:m0 + minutes]) for s in fns.series]
    # Weighted sampling without replacement (Efraimidis & Spirakis 2006): key u^(1/w).
    keys = sorted(((rng.random() ** (1.0 / v), i) for i, v in enumerate(volume) if v > 0),
                  reverse=True)
    rows: list[dict[str, Any]] = []
    peak_total = 0.0
    for _, i in keys:
        r = fns.rows[i]
        windows = service_replicas(fns.series[i][m0:m0 + minutes],
                                   fns.mean_exec_s.get(r["HashFunction"], 1.0), load_scale=scale)
        peak = max(n for _, n in windows)
        if peak_total + peak > budget:
            continue
        peak_total += peak
        sid = f"fn-{i:04d}"
        slo = rng.choice([10.0, 15.0, 20.0, 25.0] if edge else ["", 50.0, 100.0, 150.0])
        for k, (t, replicas) in enumerate(scale_rows(windows)):
            if k == 0:
                rows.append({"id": sid, "submit_s": t, "tenant": f"owner-{r['HashOwner'][:8]}",
                             "kind": "service", "replicas": replicas, "cpu": 1.0,
                             "memory_gib": max(0.5, round(fns.mem_mb_by_app.get(
                                 r["HashApp"], 512.0) / 1024.0, 2)),
                             "user_region": rng.choice(users)["name"], "latency_slo_ms": slo,
                             "image_gb": rng.choice([0.3, 0.6, 1.0]), "priority": 2})
            else:
                rows.append({"id": sid, "submit_s": round(t + rng.uniform(0.0, 60.0), 1),
                             "kind": "scale", "replicas": replicas})
        if len({row["id"] for row in rows}) >= MAX_SERVICES or peak_total >= budget - 1:
            break
    return rows


def _batch_rows(data: Path, rng: random.Random, win: Window,
                clouds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fns = functions_2019(data)
    m0, m1 = int(win.start), int(win.end)
    total = [sum(s[m] for s in fns.series) for m in range(m0, m1)]
    peak = max(total) or 1
    per_min = rng.uniform(0.3, 5.0)
    mean_run = rng.uniform(300.0, 1800.0)
    rows: list[dict[str, Any]] = []
    for m, inv in enumerate(total):
        for _ in range(int(rng.random() + per_min * inv / peak)):
            rows.append({"id": f"batch-{len(rows):05d}",
                         "submit_s": round(m * 60 + rng.uniform(0, 60), 1),
                         "tenant": f"analytics-{len(rows) % 4}", "kind": "batch",
                         "replicas": rng.randint(1, 6), "cpu": rng.choice([1.0, 2.0, 4.0]),
                         "memory_gib": rng.choice([2.0, 4.0, 8.0]),
                         "duration_s": round(rng.expovariate(1 / mean_run) + 60),
                         "data_gb": rng.choice([0.0, 0.5, 2.0, 8.0]),
                         "data_region": rng.choice(clouds)["name"], "image_gb": 0.8})
    return rows


def _ingest_rows(rng: random.Random, horizon_s: float, clouds: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    home = clouds[0]["name"]  # the cloud region nearest to the edge draft's centre
    return [{"id": f"ingest-{n:04d}", "submit_s": round(rng.uniform(0, horizon_s), 1),
             "tenant": "city", "kind": "batch", "replicas": rng.randint(1, 3),
             "cpu": rng.choice([1.0, 2.0]), "memory_gib": rng.choice([2.0, 4.0]),
             "duration_s": round(rng.expovariate(1 / rng.uniform(120.0, 600.0)) + 30),
             "data_gb": 1.0, "data_region": home, "image_gb": 0.4}
            for n in range(rng.randint(30, 250))]


def _train_rows(data: Path, rng: random.Random, horizon_s: float, shipped: tuple[Window, ...],
                clouds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Window]]:
    trace = rng.choice([ALIBABA_TRACE, PHILLY_TRACE])
    if trace == ALIBABA_TRACE:
        pods = alibaba_gpu_pods(data)
        times = [float(p["creation_time"]) for p in pods]
    else:
        jobs = philly_jobs(data)
        times = list(_philly_times(data))
    windows: list[Window] = []
    for _ in range(rng.randint(1, 3)):
        w = _gpu_window(rng, trace, times, horizon_s, shipped, windows)
        if w is not None:
            windows.append(w)
    homes = {f"team-{k}": rng.choice(clouds)["name"] for k in range(8)}
    rows: list[dict[str, Any]] = []
    for k, w in enumerate(windows):
        for i, t in enumerate(times):
            if not w.start <= t < w.end:
                continue
            if trace == ALIBABA_TRACE:
                job = alibaba_pod(pods[i])
            else:
                job = philly_job(int(jobs[i]["num_gpus"]), max(1.0, float(jobs[i]["duration"])))
            team = f"team-{(i + k) % 8}"
            rows.append({"id": f"train-{k}-{i:05d}", "submit_s": round(t - w.start, 1),
                         "tenant": team, "kind": "train", "replicas": job.replicas,
                         "cpu": job.cpu, "memory_gib": job.memory_gib, "gpu": job.gpus,
                         "duration_s": round(job.run_s, 1),
                         "data_gb": DATA_GB_PER_GPU * job.gpus * job.replicas,
                         "data_region": homes[team], "image_gb": rng.choice([5.0, 8.0]),
                         "priority": job.priority})
    if len(rows) > MAX_TRAIN_JOBS:
        rows = rng.sample(rows, MAX_TRAIN_JOBS)
    return rows, windows


# ------------------------------------------------------------------ pools


def _add_gpu_pools(catalog: Catalog, rng: random.Random, clouds: list[dict[str, Any]], *,
                   need_8: bool) -> None:
    """1-3 GPU pools (1-, 4-, 8-GPU types the region sells) on most clouds; an 8-GPU pool
    somewhere when a job needs more than 4 GPUs (else it could never run)."""
    have_8 = False
    for c in clouds:
        if rng.random() >= 0.8:
            continue
        for gpus, mem in rng.sample([((1,), 16.0), ((4,), 96.0), ((8,), 96.0)],
                                    rng.randint(1, 3)):
            gtype = pick_gpu_type(catalog, c["provider"], c["region"], rng, gpus=gpus,
                                  min_memory_gib=mem)
            if gtype is None:
                continue
            have_8 |= gpus == (8,)
            c["pools"].append({"instance_type": gtype, "nodes": rng.randint(0, 2),
                               "max_nodes": rng.randint(3, 10)})
            if gpus == (8,) and rng.random() < 0.15:
                c["pools"].append({"instance_type": gtype, "nodes": 0,
                                   "max_nodes": rng.randint(2, 4), "spot": True})
    if need_8 and not have_8:
        for c in rng.sample(clouds, len(clouds)):
            gtype = pick_gpu_type(catalog, c["provider"], c["region"], rng, gpus=(8,))
            if gtype is not None:
                c["pools"].append({"instance_type": gtype, "nodes": 1,
                                   "max_nodes": rng.randint(3, 8)})
                return


def _size_gpu_pools(catalog: Catalog, rng: random.Random, clouds: list[dict[str, Any]],
                    gpus_asked: int) -> None:
    """Grow the GPU pools' max_nodes, in proportion, until they hold a random 0.5-1.5 of the
    GPUs the jobs ask for in all (each at most MAX_GPU_POOL_NODES): the traces come from
    fleets of thousands of GPUs, the drafts' pools from 3-10 nodes."""
    pools = [(c, p, catalog.offer(c["provider"], c["region"], p["instance_type"]).gpu_count)
             for c in clouds for p in c["pools"]]
    pools = [(c, p, g) for c, p, g in pools if g > 0]
    have = sum(p["max_nodes"] * g for _, p, g in pools)
    want = gpus_asked * rng.uniform(0.5, 1.5)
    if not pools or have <= 0 or want <= have:
        return
    for _, p, _ in pools:
        p["max_nodes"] = min(MAX_GPU_POOL_NODES, max(p["max_nodes"],
                                                     math.ceil(p["max_nodes"] * want / have)))


def _size_cpu_pools(catalog: Catalog, rng: random.Random, clouds: list[dict[str, Any]],
                    rows: list[dict[str, Any]], *, gpu_only: bool) -> None:
    """Each cloud's first (on-demand CPU) pool: the services' t=0 demand times a random
    factor at t=0, spread evenly; max_nodes that plus twice the peak service demand, spread
    evenly, plus 5-30 nodes of slack for batch jobs; a GPU draft's CPU pools stay small."""
    cpu = {r["id"]: float(r["cpu"]) for r in rows if r["kind"] == "service"}
    replicas: dict[str, int] = {}
    t0 = peak = 0.0
    for r in sorted(rows, key=lambda r: float(r["submit_s"])):
        if r["kind"] in ("service", "scale"):
            replicas[str(r["id"])] = int(r["replicas"])
            demand = sum(n * cpu[s] for s, n in replicas.items())
            peak = max(peak, demand)
            if float(r["submit_s"]) <= 0.0:
                t0 = demand
    n = len(clouds)
    for c in clouds:
        p = c["pools"][0]
        vcpu = catalog.offer(c["provider"], c["region"], p["instance_type"]).vcpu
        if gpu_only:
            p["nodes"], p["max_nodes"] = rng.randint(0, 1), rng.randint(4, 12)
            continue
        p["nodes"] = math.ceil(t0 * rng.uniform(0.5, 1.2) / vcpu / n)
        p["max_nodes"] = p["nodes"] + math.ceil(2.0 * peak / vcpu / n) + rng.randint(5, 30)
