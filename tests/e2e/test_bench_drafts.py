"""`skyfed bench drafts` as a process, on small traces in shared/data's layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from broker.sim import drafts
from broker.sim.tracedraft import KINDS
from tests.e2e.test_twin_cli import skyfed
from tests.unit.test_trace_draft import tiny_data

pytestmark = pytest.mark.e2e


def test_bench_drafts_pairs_each_draft_and_reports_per_kind(tmp_path: Path) -> None:
    data = tiny_data(tmp_path / "data")
    out = skyfed("bench", "drafts", "--data", str(data), "--drafts", "4", "--first-seed", "11",
                 "--horizon-s", "1800", "--policies", "lp,greedy", "--jobs", "1", "--json",
                 "--no-progress")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["first"] == "lp"
    assert doc["seeds"] == [11, 14]
    runs = doc["runs"]
    assert sorted((r["seed"], r["kind"], r["policy"]) for r in runs) == sorted(
        (11 + i, KINDS[i], p) for i in range(4) for p in ("lp", "greedy"))
    # The paired cost over all drafts is the mean of 100 x log(lp / greedy) per draft.
    cost = {(r["seed"], r["policy"]): r["cost_usd"] for r in runs}
    logs = [100.0 * math.log(cost[(s, "lp")] / cost[(s, "greedy")]) for s in range(11, 15)]
    cell = doc["paired"]["greedy"]["all"]["cost_usd"]
    assert cell["n"] == 4
    assert cell["mean"] == pytest.approx(sum(logs) / 4)
    assert cell["low"] <= cell["mean"] <= cell["high"]
    assert cell["first_worse"] == sum(1 for x in logs if x > 1e-9)
    assert set(doc["paired"]["greedy"]) == {*KINDS, "all"}
    assert doc["paired"]["greedy"]["gpu"]["cost_usd"]["n"] == 1
    assert doc["paired"]["greedy"]["gpu"]["cost_usd"]["low"] is None


def test_bench_drafts_refuses_bad_input_naming_the_option(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = skyfed("bench", "drafts", "--data", str(empty), "--drafts", "1")
    assert out.returncode == 2
    assert "--data" in out.stderr
    assert "traces/" in out.stderr
    (empty / "traces").mkdir()  # the layout, but not the files: the missing one is named
    out = skyfed("bench", "drafts", "--data", str(empty), "--drafts", "1", "--jobs", "1")
    assert out.returncode == 2
    assert "--data" in out.stderr
    assert "No such file" in out.stderr
    assert "Traceback" not in out.stderr
    out = skyfed("bench", "drafts", "--data", str(empty), "--policies", "lp")
    assert out.returncode == 2
    assert "at least two" in out.stderr
    out = skyfed("bench", "drafts", "--data", str(empty), "--policies", "lp,nope")
    assert out.returncode == 2
    assert "nope" in out.stderr
    out = skyfed("bench", "drafts", "--data", str(empty), "--drafts", "0")
    assert out.returncode == 2


def test_paired_skips_drafts_missing_a_run_or_a_value() -> None:
    runs = [drafts.DraftRun(1, "edge", "lp", {"cost_usd": 2.0, "user_rtt_ms_mean": None}),
            drafts.DraftRun(1, "edge", "greedy", {"cost_usd": 1.0, "user_rtt_ms_mean": 5.0}),
            drafts.DraftRun(2, "gpu", "lp", {"cost_usd": 3.0, "user_rtt_ms_mean": 4.0})]
    p = drafts.paired(runs, "lp", "greedy")
    assert p["cost_usd"] == [pytest.approx(100.0 * math.log(2.0))]
    assert p["user_rtt_ms_mean"] == []
    assert drafts.paired(runs, "lp", "greedy", "gpu")["cost_usd"] == []
    s = drafts.summarize(runs, ["lp", "greedy"])
    assert s["greedy"]["edge"]["user_rtt_ms_mean"]["mean"] is None
    assert s["greedy"]["all"]["cost_usd"]["first_worse"] == 1
