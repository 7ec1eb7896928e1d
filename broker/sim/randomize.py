"""Scenario drafts: write SCENARIO.md files, and draw randomized scenarios for training.

A `Draft` is a scenario as data: the TOML document (a dict) plus trace rows. Both the shipped
scenarios (scripts/build_scenarios.py) and the randomized training scenarios go through
`to_scenario` -> `scenario.parse_scenario`, so every generated scenario obeys the same public
contract a user's file does.

Why randomize: the policy is evaluated on scenarios it never saw (other regions, GPU mixes,
fault schedules, demand shapes), so training draws all of those at random from the catalog
instead of reusing the shipped scenarios. Nothing here reads the shipped scenarios.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import io
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.sim.scenario import TRACE_COLUMNS, Scenario, parse_scenario, parse_trace
from providers.catalog import Catalog


@dataclass
class Draft:
    doc: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    # Written as `# ` comment lines at the top of scenario.toml: sources, rounding, sizes.
    notes: list[str] = field(default_factory=list)

    def trace_csv(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(TRACE_COLUMNS), lineterminator="\n")
        w.writeheader()
        for r in sorted(self.rows, key=lambda r: (float(r["submit_s"]), str(r["id"]))):
            w.writerow({k: _fmt(r.get(k, "")) for k in TRACE_COLUMNS})
        return buf.getvalue()

    def to_scenario(self, catalog: Catalog) -> Scenario:
        doc = {k: v for k, v in self.doc.items() if k != "workloads"}
        probe = parse_scenario(doc, catalog, events=())
        events = parse_trace(self.trace_csv(), user_regions={u.name for u in probe.user_regions},
                             clusters=probe.clusters, where=f"{self.doc['name']} trace")
        return parse_scenario(doc, catalog, events=events, source=f"draft:{self.doc['name']}")

    def write(self, directory: Path, *, gz: bool = True) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        trace_name = "trace.csv.gz" if gz else "trace.csv"
        doc = dict(self.doc)
        doc["workloads"] = {"trace": trace_name}
        header = "".join(f"# {line}".rstrip() + "\n" for line in self.notes)
        (directory / "scenario.toml").write_text(header + to_toml(doc), encoding="utf-8")
        data = self.trace_csv().encode()
        if gz:
            (directory / trace_name).write_bytes(gzip.compress(data, mtime=0))
        else:
            (directory / trace_name).write_bytes(data)
        return directory / "scenario.toml"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if not v.is_integer() else str(int(v))
    return str(v)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(doc: dict[str, Any]) -> str:
    """A minimal TOML writer for scenario documents (scalars, tables, arrays of tables)."""
    out: list[str] = []

    def scalars(d: dict[str, Any]) -> None:
        for k, v in d.items():
            if not isinstance(v, dict) and not (isinstance(v, list) and v
                                                and isinstance(v[0], dict)):
                out.append(f"{k} = {_toml_value(v)}")

    def tables(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                out.append(f"\n[{name}]")
                scalars(v)
                tables(v, name + ".")
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    out.append(f"\n[[{name}]]")
                    scalars(item)
                    tables(item, name + ".")

    scalars(doc)
    tables(doc, "")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------ random scenarios

CPU_SHAPES = ((8.0, 32.0), (16.0, 64.0), (4.0, 16.0))


def pick_cpu_type(catalog: Catalog, provider: str, region: str,
                  rng: random.Random) -> str | None:
    """A priced CPU-only type of one of CPU_SHAPES in the region (None: none)."""
    offers = catalog.offers(provider=provider, region=region)
    for vcpu, mem in rng.sample(CPU_SHAPES, len(CPU_SHAPES)):
        ok = sorted(o.instance_type for o in offers if o.gpu_count == 0 and o.vcpu == vcpu
                    and o.memory_gib == mem and o.price_usd_per_hour)
        if ok:
            return rng.choice(ok[: min(4, len(ok))])
    return None


def pick_gpu_type(catalog: Catalog, provider: str, region: str, rng: random.Random, *,
                  gpus: tuple[int, ...] = (4, 8), min_memory_gib: float = 96.0) -> str | None:
    """A priced instance type of the region with one of `gpus` GPUs per node (None: none)."""
    offers = [o for o in catalog.offers(provider=provider, region=region)
              if o.gpu_count in gpus and o.price_usd_per_hour
              and o.memory_gib >= min_memory_gib]
    if not offers:
        return None
    return rng.choice(sorted(o.instance_type for o in offers))


def random_draft(catalog: Catalog, seed: int, *, n_clusters: int = 8, n_edge: int = 2,
                 horizon_s: float = 7200.0, n_events: int = 400,
                 epoch_s: float = 30.0) -> Draft:
    """A random federation, trace and fault schedule (see module docstring)."""
    rng = random.Random(seed)
    # Pool limits grow with events per cluster-hour so large drafts stay mostly feasible.
    load = max(1, math.ceil(n_events / max(1, n_clusters) / (horizon_s / 3600.0) / 20))
    clusters: list[dict[str, Any]] = []
    regions = [(p, r) for p in ("aws", "gcp", "azure") for r in catalog.regions(p)
               if r.lat is not None and r.lon is not None]
    rng.shuffle(regions)
    gpu_clusters = 0
    for provider, region in regions:
        if len(clusters) >= n_clusters:
            break
        cpu_type = pick_cpu_type(catalog, provider, region.name, rng)
        if cpu_type is None:
            continue
        nodes = rng.randint(0, 6)
        pools: list[dict[str, Any]] = [
            {"instance_type": cpu_type, "nodes": nodes,
             "max_nodes": nodes + rng.randint(20, 80) * load}]
        if rng.random() < 0.4:
            pools.append({"instance_type": cpu_type, "nodes": 0, "max_nodes": 20, "spot": True})
        if gpu_clusters < max(1, n_clusters // 3) and rng.random() < 0.5:
            gtype = pick_gpu_type(catalog, provider, region.name, rng)
            if gtype:
                pools.append({"instance_type": gtype, "nodes": rng.randint(0, 2),
                              "max_nodes": rng.randint(3, 8)})
                gpu_clusters += 1
        c: dict[str, Any] = {"name": f"{provider}-{region.name}", "provider": provider,
                             "region": region.name, "pools": pools}
        if rng.random() < 0.3:
            c["quota_vcpu"] = float(rng.choice([256, 512, 1024]))
        if rng.random() < 0.5:
            c["zones"] = [f"{region.name}-a", f"{region.name}-b", f"{region.name}-c"]
        clusters.append(c)
    users: list[dict[str, Any]] = []
    anchors = list(clusters)
    for i in range(max(2, n_edge + 1)):
        a = rng.choice(anchors)
        reg = catalog.region(a["provider"], a["region"])
        lat, lon = reg.lat or 0.0, reg.lon or 0.0
        users.append({"name": f"users-{i}", "lat": round(lat + rng.uniform(-2, 2), 3),
                      "lon": round(lon + rng.uniform(-2, 2), 3)})
    for i in range(n_edge):
        u = users[i % len(users)]
        gpu = rng.choice([0, 0, 2, 4])
        cap: dict[str, Any] = {"cpu": float(rng.choice([32, 64, 96])),
                               "memory_gib": float(rng.choice([128, 256])), "gpu": gpu,
                               "price_per_hour": round(rng.uniform(1.0, 4.0), 2),
                               "uplink_gbps": rng.choice([1.0, 2.5, 10.0])}
        if gpu:
            cap["gpu_model"] = "T4"
        clusters.append({"name": f"edge-{i}", "provider": "edge",
                         "lat": round(u["lat"] + rng.uniform(-0.2, 0.2), 4),
                         "lon": round(u["lon"] + rng.uniform(-0.2, 0.2), 4), "capacity": cap})
    rows = _random_rows(rng, clusters, users, horizon_s, n_events, has_gpu=gpu_clusters > 0)
    faults = random_faults(rng, clusters, horizon_s)
    doc: dict[str, Any] = {
        "name": f"random-{seed}", "seed": seed, "horizon_s": horizon_s, "epoch_s": epoch_s,
        "defaults": {"provision_delay_s": float(rng.choice([60, 90, 120, 180, 240])),
                     "image_pull_gbps": rng.choice([0.5, 1.0, 2.0]),
                     "network_gbps": rng.choice([5.0, 10.0, 25.0])},
        "clusters": clusters, "user_regions": users, "faults": faults,
        "workloads": {"trace": "trace.csv.gz"},
    }
    return Draft(doc=doc, rows=rows)


def _demand_shape(rng: random.Random, horizon_s: float) -> list[float]:
    """Relative arrival intensity per minute: diurnal-ish sine + random bursts."""
    minutes = max(1, int(horizon_s // 60))
    period = rng.uniform(0.5, 2.0) * horizon_s
    phase = rng.uniform(0, 2 * math.pi)
    shape = [1.0 + 0.6 * math.sin(2 * math.pi * m * 60 / period + phase) for m in range(minutes)]
    for _ in range(rng.randint(0, 3)):
        at, width, height = rng.randrange(minutes), rng.randint(5, 30), rng.uniform(1.5, 4.0)
        for m in range(at, min(minutes, at + width)):
            shape[m] *= height
    return shape


def _random_rows(rng: random.Random, clusters: list[dict[str, Any]],
                 users: list[dict[str, Any]], horizon_s: float,
                 n_events: int, *, has_gpu: bool) -> list[dict[str, Any]]:
    shape = _demand_shape(rng, horizon_s)
    total = sum(shape)
    cum, acc = [], 0.0
    for s in shape:
        acc += s / total
        cum.append(acc)
    rows: list[dict[str, Any]] = []
    services: list[tuple[str, int]] = []
    mix = {"service": rng.uniform(0.03, 0.1), "scale": rng.uniform(0.2, 0.4),
           "batch": rng.uniform(0.2, 0.4), "train": rng.uniform(0.05, 0.15) if has_gpu else 0.0}
    kinds, weights = list(mix), list(mix.values())
    times = []
    for _ in range(n_events):
        minute = bisect.bisect_left(cum, rng.random())
        times.append(round(min(minute, len(cum) - 1) * 60 + rng.uniform(0, 60), 1))
    times.sort()
    for i, t in enumerate(times):
        kind = rng.choices(kinds, weights)[0]
        user = rng.choice(users)["name"]
        data_src = rng.choice(clusters)["name"]
        if kind == "scale" and services:
            sid, _ = rng.choice(services)
            rows.append({"id": sid, "submit_s": t, "tenant": "t", "kind": "scale",
                         "replicas": rng.randint(1, 12), "user_region": user})
            continue
        if kind in ("scale", "service"):
            sid = f"svc-{i}"
            services.append((sid, 2))
            rows.append({"id": sid, "submit_s": t, "tenant": f"t{i % 5}", "kind": "service",
                         "replicas": rng.randint(1, 4), "cpu": rng.choice([0.5, 1.0, 2.0]),
                         "memory_gib": rng.choice([1.0, 2.0, 4.0]), "user_region": user,
                         "latency_slo_ms": rng.choice(["", 50.0, 100.0, 150.0]),
                         "image_gb": rng.choice([0.2, 0.5, 1.0]), "priority": 1})
        elif kind == "batch":
            rows.append({"id": f"batch-{i}", "submit_s": t, "tenant": f"t{i % 5}",
                         "kind": "batch", "replicas": rng.randint(1, 8),
                         "cpu": rng.choice([1.0, 2.0, 4.0]), "memory_gib": rng.choice([2.0, 8.0]),
                         "duration_s": round(rng.expovariate(1 / 900.0) + 60, 0),
                         "data_gb": rng.choice([0.0, 1.0, 10.0]), "data_region": data_src,
                         "image_gb": 0.5})
        else:
            gpus = rng.choice([1, 2, 4, 8, 8])
            rows.append({"id": f"train-{i}", "submit_s": t, "tenant": f"t{i % 5}",
                         "kind": "train", "replicas": 1, "cpu": 4.0 * gpus,
                         "memory_gib": 16.0 * gpus, "gpu": gpus,
                         "duration_s": round(rng.expovariate(1 / 1800.0) + 300, 0),
                         "data_gb": rng.choice([5.0, 20.0, 50.0]), "data_region": data_src,
                         "image_gb": rng.choice([5.0, 10.0])})
    return rows


def random_faults(rng: random.Random, clusters: list[dict[str, Any]],
                  horizon_s: float) -> list[dict[str, Any]]:
    """0-4 faults at random times on random clusters (spot reclaims only where spot pools
    are; durations 300 s..30 % of the horizon)."""
    faults: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 4)):
        c = rng.choice(clusters)
        at = round(rng.uniform(0.1, 0.9) * horizon_s, 0)
        spot = [p for p in c.get("pools", []) if p.get("spot")]
        kind = rng.choice(["site_down", "partition", "price_change", "quota_cut"]
                          + (["spot_reclaim"] * 2 if spot else []))
        f: dict[str, Any] = {"at_s": at, "target": c["name"], "kind": kind}
        if kind in ("site_down", "partition", "price_change", "quota_cut"):
            f["duration_s"] = round(rng.uniform(300, 0.3 * horizon_s), 0)
        if kind == "price_change":
            f["factor"] = round(rng.uniform(0.5, 2.5), 2)
        if kind == "quota_cut":
            f["quota_vcpu"] = float(rng.choice([0, 64, 128]))
        if kind == "spot_reclaim":
            f["nodes"] = rng.randint(1, 3)
        faults.append(f)
    return faults
