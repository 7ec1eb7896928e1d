"""Training scenarios from the real traces (broker/sim/tracedraft.py): valid scenarios of every
kind, deterministic per seed, and never a window the shipped scenarios replay.

The traces here are small files in shared/data's layout and columns, built so the shipped
windows fall in the middle of the day (not at its start, where any rule would miss them)."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import random
from pathlib import Path

import pytest

from broker.sim.rollout import Draw, draw, scenario_of
from broker.sim.tracedata import (
    ALIBABA_TRACE,
    AZURE_TRACE,
    FEDERATION_DAY,
    PHILLY_TRACE,
    Window,
    shipped_windows,
)
from broker.sim.tracedraft import KINDS, trace_draft
from providers.catalog import Catalog

BUSY = (600, 960)  # minutes of the day where the busiest functions peak
DENSE_DAY = 6  # the Alibaba day with the most multi-GPU pods


def _write(path: Path, header: list[str], rows: list[list[object]], *, gz: bool) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.write_bytes(gzip.compress(buf.getvalue().encode()))
    else:
        path.write_text(buf.getvalue())


def tiny_data(root: Path) -> Path:
    rng = random.Random(0)
    az = root / "traces/azure_functions"
    inv = []
    for f in range(50):
        busy = f < 40
        series = [(rng.randint(200, 400) if busy and BUSY[0] <= m < BUSY[1] else
                   rng.randint(1, 30)) for m in range(1440)]
        inv.append([f"fn{f}", f"app{f % 7}", f"owner{f % 5}", "http", *series])
    _write(az / "azure_functions_2019_sample1000_inv.csv.gz",
           ["HashFunction", "HashApp", "HashOwner", "Trigger",
            *(f"minute_{m}" for m in range(1, 1441))], inv, gz=True)
    _write(az / "azure_functions_2019_sample1000_run.csv.gz", ["HashFunction", "Average"],
           [[f"fn{f}", rng.choice([200, 1500, 8000])] for f in range(50)], gz=True)
    _write(az / "azure_functions_2019_sample1000_mem.csv.gz", ["HashApp", "AverageAllocatedMb"],
           [[f"app{a}", 256 + 128 * a] for a in range(7)], gz=True)
    pods = []
    for i in range(400):
        day = DENSE_DAY if i < 150 else rng.randrange(10)
        ct = day * 86400 + rng.randrange(86400)
        gpus = rng.choice([1, 1, 2, 8]) if day == DENSE_DAY else 1
        pods.append([f"pod-{i}", 8000 * gpus, 32768 * gpus, gpus, rng.choice([1000, 500]), "",
                     rng.choice(["LS", "BE"]), "Running", ct, ct + rng.randint(300, 20000), ct])
    _write(root / "traces/alibaba_gpu_v2023/openb_pod_list_default.csv",
           ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
            "pod_phase", "creation_time", "deletion_time", "scheduled_time"], pods, gz=False)
    jobs = []
    for _ in range(600):
        at = FEDERATION_DAY + dt.timedelta(seconds=rng.uniform(-5 * 86400, 5 * 86400))
        jobs.append([at.isoformat(sep=" ", timespec="seconds"), rng.randint(60, 30000),
                     rng.choice([1, 1, 1, 2, 4, 8, 16]), 0, f"vc{rng.randrange(4)}"])
    _write(root / "traces/philly/philly_jobs_pollux.csv.gz",
           ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"], jobs, gz=True)
    _write(root / "edge/aws_local_and_wavelength_zones_2023-06_latlon.csv",
           ["network_border_group", "parent_region", "zone_type", "metro_code",
            "airport_iata_for_coords", "city", "country", "latitude", "longitude"],
           [["us-east-1-nyc-1", "us-east-1", "local-zone", "nyc", "JFK", "New York", "US",
             40.64, -73.78],
            ["us-west-2-lax-1", "us-west-2", "local-zone", "lax", "LAX", "Los Angeles", "US",
             33.94, -118.41],
            ["eu-central-1-ham-1", "eu-central-1", "local-zone", "ham", "HAM", "Hamburg", "DE",
             53.63, 9.99]], gz=False)
    _write(root / "edge/aws_cloudfront_edge_locations_latlon.csv",
           ["code", "city", "country", "country_code", "latitude", "longitude",
            "pricing_region"],
           [["JFK", "New York", "United States", "US", 40.64, -73.78, "NA"],
            ["ORD", "Chicago", "United States", "US", 41.98, -87.90, "NA"],
            ["LAX", "Los Angeles", "United States", "US", 33.94, -118.41, "NA"],
            ["FRA", "Frankfurt am Main", "Germany", "DE", 50.03, 8.57, "EU"],
            ["NRT", "Tokyo", "Japan", "JP", 35.76, 140.39, "AP"],
            ["GRU", "Sao Paulo", "Brazil", "BR", -23.43, -46.47, "SA"]], gz=False)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_the_shipped_windows_are_the_busiest_ones(data: Path) -> None:
    retail, edge, gpu, philly = shipped_windows(data)
    assert (retail.trace, edge.trace) == (AZURE_TRACE, AZURE_TRACE)
    assert BUSY[0] <= retail.start
    assert retail.end <= BUSY[1] + 10
    assert retail.end - retail.start == 360
    assert BUSY[0] <= edge.start
    assert edge.end <= BUSY[1]
    assert gpu.trace == ALIBABA_TRACE
    assert DENSE_DAY * 86400 - 3600 < gpu.start < (DENSE_DAY + 1) * 86400
    assert philly == Window(PHILLY_TRACE, 0.0, 86400.0)


def test_drafts_never_replay_a_shipped_window(data: Path, catalog: Catalog) -> None:
    shipped = shipped_windows(data)
    kinds, windows = set(), 0
    for seed in range(40):
        d = trace_draft(catalog, data, seed, horizon_s=7200.0)
        kinds.add(d.notes[0].split(";")[0].removeprefix("kind "))
        assert d.windows, seed
        for w in d.windows:
            windows += 1
            assert w.end - w.start == pytest.approx(7200.0 if w.trace != AZURE_TRACE else 120)
            assert not any(w.clashes(s) for s in shipped), (seed, w)
        scn = d.to_scenario(catalog)  # a valid SCENARIO.md scenario
        assert scn.events
        assert all(0.0 <= e.submit_s < 7200.0 + 61.0 for e in scn.events)
    assert kinds == set(KINDS)
    assert windows >= 40


def test_a_window_clashing_with_a_shipped_one_is_refused() -> None:
    shipped = Window(AZURE_TRACE, 600, 960)
    assert Window(AZURE_TRACE, 950, 1070).clashes(shipped)
    assert not Window(AZURE_TRACE, 960, 1080).clashes(shipped)  # half-open: touching is fine
    assert not Window(PHILLY_TRACE, 600, 960).clashes(shipped)  # another trace


def test_each_kind_has_its_shape(data: Path, catalog: Catalog) -> None:
    gpu = [trace_draft(catalog, data, s, kind="gpu").to_scenario(catalog) for s in range(8)]
    assert all({e.kind for e in g.events} == {"train"} for g in gpu)
    big = [g for g in gpu if any(e.gpu > 4 for e in g.events)]
    assert big  # drafts whose jobs need an 8-GPU node get one, else they could never run
    assert all(any(p.node.gpu == 8 for c in g.clusters for p in c.pools) for g in big)
    edge = trace_draft(catalog, data, 2, kind="edge").to_scenario(catalog)
    assert sum(1 for c in edge.clusters if c.provider == "edge") >= 4
    slos = {e.latency_slo_ms for e in edge.events if e.kind == "service"}
    assert slos
    assert max(s for s in slos if s is not None) <= 25.0
    services = trace_draft(catalog, data, 3, kind="services").to_scenario(catalog)
    assert {"service", "batch"} <= {e.kind for e in services.events}
    assert not any(c.pools and any(p.node.gpu for p in c.pools)
                   for c in services.clusters if c.provider != "edge")
    with pytest.raises(ValueError, match="kind must be one of"):
        trace_draft(catalog, data, 4, kind="quantum")


def test_same_seed_same_draft(data: Path, catalog: Catalog) -> None:
    a, b = trace_draft(catalog, data, 7), trace_draft(catalog, data, 7)
    assert a.trace_csv() == b.trace_csv()
    assert a.doc == b.doc
    assert a.trace_csv() != trace_draft(catalog, data, 8).trace_csv()


def test_training_draws_trace_drafts_when_given_the_data(data: Path,
                                                         catalog: Catalog) -> None:
    rng = random.Random(0)
    draws = [draw(rng, 0, trace_share=0.5) for _ in range(40)]
    assert 5 < sum(d.trace for d in draws) < 35
    assert not any(draw(random.Random(1), 0).trace for _ in range(10))  # no share, no trace
    d = next(d for d in draws if d.trace)
    assert scenario_of(d, catalog, [], data).name == f"trace-{d.seed}"
    with pytest.raises(ValueError, match="needs the data folder"):
        scenario_of(Draw(1, 0, 0, 3600.0, 0, trace=True), catalog, [])
    # A draw that names its kind gets that kind (ES's held-out drafts, one of each).
    gpu = scenario_of(Draw(d.seed, 0, 0, 3600.0, 0, trace=True, kind="gpu"), catalog, [], data)
    assert {e.kind for e in gpu.events} == {"train"}
    services = scenario_of(Draw(d.seed, 0, 0, 3600.0, 0, trace=True, kind="services"),
                           catalog, [], data)
    assert "service" in {e.kind for e in services.events}


def test_training_runs_on_trace_drafts(data: Path, catalog: Catalog) -> None:
    from broker.sim.train import TrainConfig, train_model

    cfg = TrainConfig(seed=0, episodes=2, episodes_per_update=2, data=data, trace_share=1.0)
    out = train_model(catalog, cfg, budget_s=0.0)
    assert out.episodes == 2
    assert out.steps > 0
