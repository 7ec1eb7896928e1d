"""Rebuild providers/data/catalog.json.gz from the offline reference data.

Usage::

    python scripts/build_catalog.py [--data /work/shared/data] \
        [--out providers/data/catalog.json.gz]

Sources (see /work/shared/data/SOURCES.md and docs/providers.md for licences):

- AWS on-demand prices + specs: apache-libcloud 3.9.1 ``pricing.json`` (``compute.ec2_linux``)
  joined with ``libcloud/compute/constants/ec2_instance_types.py``
  (``pricing/aws_ec2_ondemand_linux_libcloud.csv``, ``aws_ec2_instance_specs_libcloud.csv``).
  AWS spot prices are not in any offline source: they stay null.
- Azure: SkyPilot-format catalog ``pricing/skypilot_format_azure_vms_2026-05-20.csv.gz``
  (on-demand and spot).
- GCP: SkyPilot-format catalog ``pricing/skypilot_format_gcp_vms_2026-05-20.csv.gz``; GPU prices
  are separate accelerator rows that are added to the VM price (a2/a3/a4/g2 bundle their GPUs;
  N1 + T4/V100/P100/P4 are synthesised as ``n1-standard-<4*n>+<n>x<GPU>``, 4 vCPU per GPU).
  Zone rows are collapsed per region (cheapest zone).
- RTT, egress, throughput: Skyplane (NSDI'23) measured matrices in ``network/``.
- Region coordinates: ``regions/cloud_regions_latlon_*`` (GuGuss/cloud-providers for Azure/GCP/AWS,
  npm cloud-regions-country-flags for GCP and AWS regions missing there); regions newer than both
  lists get their named city's centre from ``_EXTRA_CITY_COORDS`` (flagged "hand-entered").

GPU model + interconnect per instance type come from the vendors' instance-type pages (AWS
"Accelerated computing instances", GCP "GPU machine types", Azure "GPU-accelerated VM sizes"),
encoded as the family rules in ``_aws_gpu``/``_gcp_gpu``/``_azure_interconnect`` below.

The RTT estimator's constants (providers/geo.py) are refitted here by least squares on every
measured pair whose two regions have coordinates; the fit is stored in the catalog (``fit``) and
printed, and recorded in docs/providers.md.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from providers.geo import V_FIBER_KM_PER_MS, haversine_km  # noqa: E402

# AWS family -> (GPU model, interconnect for multi-GPU sizes). Accelerator families that are not
# GPUs (inf/trn/dl1) are left without GPUs: nothing in skyfed schedules them.
_AWS_FAMILY_GPU = {
    "p2": ("K80", "pcie"), "p3": ("V100", "nvlink-pairs"), "p3dn": ("V100", "nvlink-pairs"),
    "p4d": ("A100", "nvlink-full"), "p4de": ("A100-80GB", "nvlink-full"),
    "p5": ("H100", "nvlink-full"), "p5e": ("H200", "nvlink-full"), "p5en": ("H200", "nvlink-full"),
    "g2": ("K520", "pcie"), "g3": ("M60", "pcie"), "g3s": ("M60", "pcie"),
    "g4dn": ("T4", "pcie"), "g4ad": ("V520", "pcie"), "g5": ("A10G", "pcie"),
    "g5g": ("T4G", "pcie"), "g6": ("L4", "pcie"), "g6e": ("L40S", "pcie"), "gr6": ("L4", "pcie"),
}

# GCP accelerator-optimised VM families: (GPU catalog name, GPUs per size rule, interconnect)
_GCP_BUNDLED = {
    "a2-highgpu": "A100", "a2-megagpu": "A100", "a2-ultragpu": "A100-80GB",
    "a3-highgpu": "H100", "a3-edgegpu": "H100", "a3-megagpu": "H100-MEGA",
    "a3-ultragpu": "H200", "a4-highgpu": "B200",
}
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_GCP_N1_GPUS = ("T4", "V100", "P100", "P4")

_AWS_FALLBACK_EGRESS_INTERNET = 0.09


def _interconnect(gpu_count: int, multi: str) -> str:
    if gpu_count <= 0:
        return "none"
    return "pcie" if gpu_count == 1 else multi


def _aws_gpu(itype: str, gpu_count: int) -> tuple[int, str | None, str]:
    family = itype.split(".")[0]
    if family not in _AWS_FAMILY_GPU or gpu_count <= 0:
        return 0, None, "none"
    model, multi = _AWS_FAMILY_GPU[family]
    if family == "p3" and gpu_count < 4:
        multi = "pcie"
    return gpu_count, model, _interconnect(gpu_count, multi)


def _azure_interconnect(itype: str, gpu_count: int) -> str:
    t = itype.lower()
    if re.search(r"nd\d+a?m?s?r_(a100|h100|h200|mi300x)_v\d|nd96asr_v4|nd96amsr", t):
        multi = "nvlink-full"  # NVSwitch (A100/H100/H200) or Infinity Fabric full mesh (MI300X)
    elif "nd40rs_v2" in t or ("_h100_v5" in t and t.startswith("standard_nc")):
        multi = "nvlink-pairs"  # NDv2 hybrid cube-mesh; NC H100 v5 NVL pairs
    else:
        multi = "pcie"
    return _interconnect(gpu_count, multi)


def _f(v: str) -> float | None:
    v = (v or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _rows(path: Path) -> Iterator[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)


def build_aws(data: Path, types: dict, prices: list) -> None:
    spec_csv = data / "pricing/aws_ec2_instance_specs_libcloud.csv"
    specs = {r["InstanceType"]: r for r in _rows(spec_csv)}
    for r in _rows(data / "pricing/aws_ec2_ondemand_linux_libcloud.csv"):
        it = r["InstanceType"]
        spec = specs.get(it, r)
        vcpu, mem = _f(spec.get("vCPUs", "")), _f(spec.get("MemoryGiB", ""))
        price = _f(r["PriceUSDPerHour"])
        if vcpu is None or mem is None or not price:
            continue
        gc, model, ic = _aws_gpu(it, int(_f(spec.get("GPUCount", "")) or 0))
        types[it] = [vcpu, mem, gc, model, ic]
        prices.append([it, r["Region"], round(price, 6), None])


def build_azure(data: Path, types: dict, prices: list) -> None:
    for r in _rows(data / "pricing/skypilot_format_azure_vms_2026-05-20.csv.gz"):
        it, vcpu, mem, price = r["InstanceType"], _f(r["vCPUs"]), _f(r["MemoryGiB"]), _f(r["Price"])
        if not it or vcpu is None or mem is None or not price:
            continue
        count = _f(r["AcceleratorCount"]) or 0.0
        gc = int(count) if count >= 1 else 0  # fractional (vGPU) sizes are not schedulable GPUs
        model = r["AcceleratorName"] or None if gc else None
        types[it] = [vcpu, mem, gc, model, _azure_interconnect(it, gc)]
        prices.append([it, r["Region"], round(price, 6), _f(r["SpotPrice"])])


def _cheapest(rows: dict, key: tuple, price: float, spot: float | None) -> None:
    old = rows.get(key)
    if old is None or price < old[0]:
        rows[key] = (price, spot)


def build_gcp(data: Path, types: dict, prices: list) -> None:
    vm: dict[tuple[str, str], tuple[float, float | None]] = {}
    gpu: dict[tuple[str, int, str], tuple[float, float | None]] = {}
    specs: dict[str, tuple[float, float]] = {}
    for r in _rows(data / "pricing/skypilot_format_gcp_vms_2026-05-20.csv.gz"):
        price = _f(r["Price"])
        if price is None:
            continue
        if r["InstanceType"]:
            vcpu, mem = _f(r["vCPUs"]), _f(r["MemoryGiB"])
            if vcpu is None or mem is None:
                continue
            specs[r["InstanceType"]] = (vcpu, mem)
            _cheapest(vm, (r["InstanceType"], r["Region"]), price, _f(r["SpotPrice"]))
        elif not r["AcceleratorName"].startswith("tpu"):
            count = int(_f(r["AcceleratorCount"]) or 0)
            _cheapest(gpu, (r["AcceleratorName"], count, r["Region"]), price, _f(r["SpotPrice"]))

    def add(it: str, region: str, gc: int, model: str | None, ic: str,
            base: tuple[float, float | None], extra: tuple[float, float | None] | None) -> None:
        vcpu, mem = specs[it.split("+")[0]]
        price, spot = base
        if extra is not None:
            price += extra[0]
            spot = None if spot is None or extra[1] is None else spot + extra[1]
        types[it] = [vcpu, mem, gc, model, ic]
        prices.append([it, region, round(price, 6), None if spot is None else round(spot, 6)])

    for (it, region), base in vm.items():
        family = "-".join(it.split("-")[:2])
        if family in _GCP_BUNDLED:
            model = _GCP_BUNDLED[family]
            m = re.search(r"-(\d+)g", it)
            gc = int(m.group(1)) if m else 0
            extra = gpu.get((model, gc, region))
            if extra is None:
                continue  # GPU not sold in this region: the VM alone is not an offer
            add(it, region, gc, model, _interconnect(gc, "nvlink-full"), base, extra)
        elif family == "g2-standard":
            gc = _G2_GPUS.get(int(it.rsplit("-", 1)[1]), 1)
            extra = gpu.get(("L4", gc, region))
            if extra is None:
                continue
            add(it, region, gc, "L4", _interconnect(gc, "pcie"), base, extra)
        else:
            add(it, region, 0, None, "none", base, None)
    for (model, gc, region), extra in gpu.items():
        if model not in _GCP_N1_GPUS:
            continue
        host = f"n1-standard-{max(4, 4 * gc)}"
        base = vm.get((host, region))
        if base is None or host not in specs:
            continue
        add(f"{host}+{gc}x{model}", region, gc, model, _interconnect(gc, "pcie"), base, extra)


# Regions newer than the 2022 coordinate lists: the city each provider names for the region
# (its public region page), at that city's centre. Flagged "(city, hand-entered)" in the catalog.
_EXTRA_CITY_COORDS = {
    ("aws", "ca-west-1"): (51.05, -114.07, "Calgary"),
    ("aws", "il-central-1"): (32.08, 34.78, "Tel Aviv"),
    ("aws", "mx-central-1"): (20.59, -100.39, "Queretaro"),
    ("aws", "ap-southeast-5"): (3.14, 101.69, "Kuala Lumpur"),
    ("aws", "ap-southeast-7"): (13.75, 100.50, "Bangkok"),
    ("aws", "us-west-2-lax-1"): (34.05, -118.24, "Los Angeles"),
    ("azure", "westus3"): (33.45, -112.07, "Phoenix"),
    ("azure", "swedencentral"): (60.67, 17.14, "Gavle"),
    ("azure", "norwayeast"): (59.91, 10.75, "Oslo"),
    ("azure", "norwaywest"): (58.97, 5.73, "Stavanger"),
    ("azure", "germanywestcentral"): (50.11, 8.68, "Frankfurt"),
    ("azure", "germanynorth"): (52.52, 13.40, "Berlin"),
    ("azure", "switzerlandnorth"): (47.37, 8.54, "Zurich"),
    ("azure", "switzerlandwest"): (46.20, 6.14, "Geneva"),
    ("azure", "polandcentral"): (52.23, 21.01, "Warsaw"),
    ("azure", "italynorth"): (45.46, 9.19, "Milan"),
    ("azure", "spaincentral"): (40.42, -3.70, "Madrid"),
    ("azure", "qatarcentral"): (25.29, 51.53, "Doha"),
    ("azure", "israelcentral"): (32.08, 34.78, "Tel Aviv"),
    ("azure", "mexicocentral"): (20.59, -100.39, "Queretaro"),
    ("azure", "brazilsoutheast"): (-22.91, -43.17, "Rio de Janeiro"),
    ("azure", "austriaeast"): (48.21, 16.37, "Vienna"),
    ("azure", "belgiumcentral"): (50.85, 4.35, "Brussels"),
    ("azure", "chilecentral"): (-33.45, -70.67, "Santiago"),
    ("azure", "denmarkeast"): (55.68, 12.57, "Copenhagen"),
    ("azure", "indonesiacentral"): (-6.21, 106.85, "Jakarta"),
    ("azure", "malaysiawest"): (3.14, 101.69, "Kuala Lumpur"),
    ("azure", "newzealandnorth"): (-36.85, 174.76, "Auckland"),
    ("azure", "jioindiacentral"): (21.15, 79.09, "Nagpur"),
    ("azure", "jioindiawest"): (22.47, 70.06, "Jamnagar"),
    ("gcp", "us-west4"): (36.17, -115.14, "Las Vegas"),
    ("gcp", "me-central1"): (25.29, 51.53, "Doha"),
    ("gcp", "me-central2"): (26.43, 50.10, "Dammam"),
    ("gcp", "europe-west10"): (52.52, 13.40, "Berlin"),
    ("gcp", "europe-west12"): (45.07, 7.69, "Turin"),
    ("gcp", "europe-north2"): (59.33, 18.07, "Stockholm"),
    ("gcp", "africa-south1"): (-26.20, 28.05, "Johannesburg"),
    ("gcp", "northamerica-south1"): (20.59, -100.39, "Queretaro"),
    ("gcp", "asia-southeast3"): (13.75, 100.50, "Bangkok"),
}


def build_regions(data: Path, used: dict[str, set[str]]) -> list[list]:
    coords: dict[tuple[str, str], tuple[float, float, str]] = {}
    pmap = {"aws": "aws", "azure": "azure", "google": "gcp"}
    for r in _rows(data / "regions/cloud_regions_latlon_gugus_cloud-providers_2022.csv"):
        p = pmap.get(r["provider"])
        lat, lon = _f(r["latitude"]), _f(r["longitude"])
        if p and lat is not None and lon is not None:
            coords[(p, r["region_code_api"])] = (lat, lon, f"{r['city']}, {r['country']}")
    for r in _rows(data / "regions/cloud_regions_latlon_npm_cloud-regions-country-flags_1.1.4.csv"):
        p = {"AWS": "aws", "GCP": "gcp"}.get(r["provider"])
        lat, lon = _f(r["latitude"]), _f(r["longitude"])
        if p and lat is not None and lon is not None and (p, r["region"]) not in coords:
            coords[(p, r["region"])] = (lat, lon, r["location"])
    for (p, n), (lat, lon, city) in _EXTRA_CITY_COORDS.items():
        coords.setdefault((p, n), (lat, lon, f"{city} (city, hand-entered)"))
    out = []
    for p, names in used.items():
        for n in sorted(names):
            c = coords.get((p, n))
            out.append([p, n, c[0] if c else None, c[1] if c else None, c[2] if c else ""])
    return out


def _key(region_id: str) -> str:
    """Skyplane ids -> provider:region (GCP zones `us-west1-a` collapse to `us-west1`)."""
    p, _, r = region_id.partition(":")
    if p == "gcp" and re.search(r"-[a-z]$", r):
        r = r[:-2]
    return f"{p}:{r}"


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def build_network(data: Path) -> tuple[list, list, list]:
    rtt: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in _rows(data / "network/skyplane_intercloud_rtt_2022.csv"):
        v = _f(r["avg_rtt"])
        if v is None or r["src_tier"] != "PREMIUM" or r["dst_tier"] != "PREMIUM":
            continue
        a, b = _key(r["src_region"]), _key(r["dst_region"])
        if a != b:
            rtt[_pair(a, b)].append(v)
    egress: dict[tuple[str, str], float] = {}
    for r in _rows(data / "network/skyplane_aws_transfer_costs_per_gb.csv"):
        c = _f(r["cost"])
        if c is not None:
            dst = "internet" if r["dst"] == "internet" else f"aws:{r['dst']}"
            egress[(f"aws:{r['src']}", dst)] = c
    for r in _rows(data / "network/skyplane_intercloud_egress_cost_per_gb_2022-11.csv"):
        c = _f(r["cost"])
        if c is not None:
            egress[(_key(r["src"]), _key(r["dest"]))] = c
    tput: dict[tuple[str, str], list[float]] = defaultdict(list)
    for name in ("skyplane_intercloud_throughput_2022-11.csv",
                 "skyplane_intercloud_throughput_2022-01.csv"):
        seen = set(tput)
        for r in _rows(data / "network" / name):
            v = _f(r["throughput_received"])
            k = (_key(r["src_region"]), _key(r["dst_region"]))
            if v and r.get("success") == "True" and k not in seen:  # newer file wins
                tput[k].append(v / 1e9)
    return (
        [[a, b, round(statistics.median(v), 3)] for (a, b), v in sorted(rtt.items())],
        [[a, b, c] for (a, b), c in sorted(egress.items())],
        [[a, b, round(statistics.median(v), 3)] for (a, b), v in sorted(tput.items())],
    )


def _lsq(xs: list[float], ys: list[float]) -> dict[str, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    floor = my - slope * mx
    resid = [y - (slope * x + floor) for x, y in zip(xs, ys, strict=True)]
    rmse = math.sqrt(sum(e * e for e in resid) / n)
    mape = statistics.median(abs(e) / y for e, y in zip(resid, ys, strict=True) if y > 0)
    r2 = 1.0 - sum(e * e for e in resid) / sum((y - my) ** 2 for y in ys)
    return {"inflation": round(slope, 4), "floor_ms": round(floor, 3), "pairs": n,
            "rmse_ms": round(rmse, 2), "median_abs_rel_error": round(mape, 4), "r2": round(r2, 4)}


REGIONAL_FIT_MAX_KM = 3000.0


def fit_rtt(rtt: list, regions: list) -> dict[str, dict[str, float]]:
    """Least squares rtt = INFLATION * (2 d / v_fibre) + FLOOR over measured pairs.

    Two fits: over all pairs, and over pairs closer than REGIONAL_FIT_MAX_KM. Intercontinental
    pairs (e.g. South Africa <-> South America routed through Europe) inflate the all-pairs
    intercept to ~26 ms, which would be wrong for the short paths where RTT SLOs bind; geo.py uses
    the regional fit.
    """
    where = {f"{p}:{n}": (lat, lon) for p, n, lat, lon, _ in regions if lat is not None}
    pts = []
    for a, b, ms in rtt:
        if a in where and b in where:
            pts.append((haversine_km(*where[a], *where[b]), ms))
    def xs(sel: list[tuple[float, float]]) -> list[float]:
        return [2.0 * d / V_FIBER_KM_PER_MS for d, _ in sel]
    near = [p for p in pts if p[0] < REGIONAL_FIT_MAX_KM]
    return {"all": _lsq(xs(pts), [ms for _, ms in pts]),
            "regional": {**_lsq(xs(near), [ms for _, ms in near]),
                         "max_km": REGIONAL_FIT_MAX_KM}}


def build(data: Path) -> dict:
    types: dict[str, dict] = {"aws": {}, "azure": {}, "gcp": {}}
    prices: dict[str, list] = {"aws": [], "azure": [], "gcp": []}
    build_aws(data, types["aws"], prices["aws"])
    build_azure(data, types["azure"], prices["azure"])
    build_gcp(data, types["gcp"], prices["gcp"])
    rtt, egress, tput = build_network(data)
    used: dict[str, set[str]] = {p: {row[1] for row in rows} for p, rows in prices.items()}
    for a, b, _ in rtt:
        for k in (a, b):
            p, _, r = k.partition(":")
            used.setdefault(p, set()).add(r)
    regions = build_regions(data, used)
    return {
        "version": 1,
        "sources": {
            "aws": "apache-libcloud 3.9.1 pricing.json compute.ec2_linux + ec2_instance_types.py",
            "azure": "SkyPilot-format catalog anycloud-sh/catalog azure/vms.csv @62ff0a98",
            "gcp": "SkyPilot-format catalog anycloud-sh/catalog gcp/vms.csv @62ff0a98",
            "network": "skyplane-project/skyplane profiles (latency.csv, throughput.csv, cost.csv)",
            "regions": "GuGuss/cloud-providers @a2ec9f57; npm cloud-regions-country-flags@1.1.4",
        },
        "fit": fit_rtt(rtt, regions),
        "regions": regions,
        "types": types,
        "prices": prices,
        "rtt": rtt,
        "egress": egress,
        "throughput": tput,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--out", type=Path, default=ROOT / "providers/data/catalog.json.gz")
    args = ap.parse_args()
    cat = build(args.data)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(json.dumps(cat, separators=(",", ":"), sort_keys=True).encode())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(buf.getvalue())
    counts = {p: len(v) for p, v in cat["prices"].items()}
    print(f"wrote {args.out} ({len(buf.getvalue()) / 1e6:.2f} MB) offers={counts} "
          f"regions={len(cat['regions'])} rtt_pairs={len(cat['rtt'])} fit={cat['fit']}")


if __name__ == "__main__":
    main()
