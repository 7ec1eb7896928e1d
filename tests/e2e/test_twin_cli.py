"""`skyfed sim` and `skyfed bench twin` as processes on a tiny real-catalog scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.sim.metrics import METRIC_KEYS
from broker.sim.randomize import Draft

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def tiny(tmp_path: Path) -> Path:
    doc = {
        "name": "tiny-e2e", "seed": 5, "horizon_s": 1800.0, "epoch_s": 30.0,
        "clusters": [
            {"name": "aws-use1", "provider": "aws", "region": "us-east-1",
             "pools": [{"instance_type": "m5.2xlarge", "nodes": 1, "max_nodes": 4}]},
            {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
             "pools": [{"instance_type": "n2-standard-8", "nodes": 1, "max_nodes": 4}]},
        ],
        "user_regions": [{"name": "nyc", "lat": 40.7, "lon": -74.0}],
    }
    rows = [{"id": "web", "submit_s": 0.0, "kind": "service", "replicas": 2, "cpu": 1.0,
             "memory_gib": 2.0, "user_region": "nyc", "latency_slo_ms": 80.0, "image_gb": 0.5},
            {"id": "web", "submit_s": 600.0, "kind": "scale", "replicas": 6}]
    rows += [{"id": f"b{i}", "submit_s": 60.0 * i, "kind": "batch", "replicas": 2, "cpu": 2.0,
              "memory_gib": 4.0, "duration_s": 300.0, "data_gb": 2.0, "data_region": "gcp-usc1"}
             for i in range(10)]
    return Draft(doc=doc, rows=rows).write(tmp_path / "tiny", gz=False)


def skyfed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False)


def test_bench_twin_json_and_plots(tmp_path: Path) -> None:
    scn = tiny(tmp_path)
    out = skyfed("bench", "twin", "--scenario", str(scn), "--json", "--no-progress",
                 "--plot", str(tmp_path / "plots"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["scenario"] == "tiny-e2e"
    assert set(doc["policies"]) == {"traditional", "karpenter", "greedy", "lp", "lp+rl"}
    for metrics in doc["policies"].values():
        assert set(METRIC_KEYS) <= set(metrics)
        assert metrics["cost_usd"] > 0
        assert metrics["unplaced"] == 0
    assert (tmp_path / "plots" / "tiny-e2e-cost.png").stat().st_size > 1000


def test_sim_whatif_and_errors(tmp_path: Path) -> None:
    scn = tiny(tmp_path)
    out = skyfed("sim", str(scn), "--policy", "lp", "--json", "--no-progress",
                 "--whatif", "cluster=aws-use1:down@300")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["whatif"]["change"] == "cluster=aws-use1:down@300"
    assert doc["duration_prediction_mape"] > 0.0  # ten batch jobs, predicted and run
    assert doc["metrics"] != doc["whatif"]["metrics"]
    # Where the money went, per variant: the rows sum to the cost without the data moves'
    # egress (ten 2 GB copies from GCP at most 0.09 USD/GB), most expensive first, and once
    # aws-use1 is down its pool stops costing.
    for variant in (doc, doc["whatif"]):
        rows, cost = variant["cost_by_pool"], variant["metrics"]["cost_usd"]
        assert -0.01 <= cost - sum(r["usd"] for r in rows) <= 10 * 2 * 2.0 * 0.09 + 0.01
        assert [r["usd"] for r in rows] == sorted((r["usd"] for r in rows), reverse=True)
    usd = {v: {r["cluster"]: r["usd"] for r in d["cost_by_pool"]}
           for v, d in (("base", doc), ("down", doc["whatif"]))}
    assert usd["down"].get("aws-use1", 0.0) < usd["base"]["aws-use1"]
    out = skyfed("sim", str(scn), "--policy", "lp", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "where the money went: lp" in out.stdout
    bad = tmp_path / "tiny" / "scenario.toml"
    bad.write_text(bad.read_text() + "\nbogus = 1\n")
    out = skyfed("sim", str(bad), "--no-progress")
    assert out.returncode == 2
    assert "unknown key 'bogus'" in out.stderr


def test_bench_twin_seeds_report_intervals_and_comparisons(tmp_path: Path) -> None:
    scn = tiny(tmp_path)
    out = skyfed("bench", "twin", "--scenario", str(scn), "--json", "--no-progress",
                 "--seeds", "2", "--policies", "lp,traditional", "--jobs", "2")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["seed"], doc["seeds"]) == (5, [5, 6])
    assert 0.0 < doc["duration_prediction_mape"] < 10.0
    assert set(doc["policies"]) == {"lp", "traditional"}
    lp = doc["policies"]["lp"]
    assert set(METRIC_KEYS) <= set(lp)
    for key in METRIC_KEYS:
        values = lp["per_seed"][key]
        assert len(values) == 2
        if all(isinstance(v, int | float) for v in values):
            low, high = lp["ci95"][key]
            assert low <= lp[key] <= high
            assert lp[key] == pytest.approx(sum(values) / 2, abs=1e-5)
    # Seeds move the twin's random parts: some metric differs between seeds.
    assert any(len(set(map(str, lp["per_seed"][k]))) > 1 for k in METRIC_KEYS
               if k != "decision_ms_p99")
    # better_than only names policies of this run and is paired-t (checked in unit tests).
    for entry in doc["policies"].values():
        for beaten in entry["better_than"].values():
            assert set(beaten) <= {"lp", "traditional"}
    # The table form, in-process (the default for a scenario this small).
    table = skyfed("bench", "twin", "--scenario", str(scn), "--no-progress", "--seeds", "2",
                   "--policies", "greedy")
    assert table.returncode == 0, table.stderr
    assert "±" in table.stdout
    assert "duration_prediction_mape" in table.stdout


def test_bench_twin_unknown_policy_lists_the_known_ones(tmp_path: Path) -> None:
    out = skyfed("bench", "twin", "--scenario", str(tiny(tmp_path)), "--policies",
                 "lp,kubeflow")
    assert out.returncode == 2
    assert "unknown kubeflow" in out.stderr
    assert "known policies: traditional, karpenter, greedy, lp, lp+rl" in out.stderr


def test_policy_leverage_json(tmp_path: Path) -> None:
    scn = tiny(tmp_path)
    out = skyfed("policy", "leverage", "--scenario", str(scn), "--json",
                 "--decision-interval-s", "120")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {"states", "action_spread", "decisions_changed_frac"} <= set(doc)
    assert 0 < doc["states"] <= 15  # at most one decision per 120 s of 1800 s
    assert 0.0 <= doc["decisions_changed_frac"] <= 1.0
    for name in ("headroom", "prewarm_lead_s", "cluster_bias_usd_per_hour"):
        lo, hi = doc["action_spread"][name]
        assert lo <= hi
    out = skyfed("policy", "leverage", "--scenario", str(tmp_path / "nope.toml"), "--json")
    assert out.returncode == 2
