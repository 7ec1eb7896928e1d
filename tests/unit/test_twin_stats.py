"""Statistics over seeds: Student-t intervals on known samples and the paired comparison rule."""

from __future__ import annotations

import math

import pytest

from broker.sim.stats import better, mean_ci95, summarize

# t(0.975, df) from any Student t table.
T975 = {1: 12.7062, 2: 4.3027, 4: 2.7764}


def test_interval_on_known_samples() -> None:
    iv = mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    hw = T975[4] * math.sqrt(2.5) / math.sqrt(5)
    assert iv.mean == pytest.approx(3.0)
    assert iv.low == pytest.approx(3.0 - hw, abs=1e-3)
    assert iv.high == pytest.approx(3.0 + hw, abs=1e-3)
    two = mean_ci95([0.0, 2.0])
    assert (two.low, two.high) == (pytest.approx(1.0 - T975[1], abs=1e-3),
                                   pytest.approx(1.0 + T975[1], abs=1e-3))


def test_one_sample_has_no_interval_and_bad_samples_are_refused() -> None:
    iv = mean_ci95([4.0])
    assert (iv.mean, iv.low, iv.high, iv.half_width) == (4.0, None, None, None)
    with pytest.raises(ValueError, match="finite"):
        mean_ci95([1.0, math.nan])
    with pytest.raises(ValueError, match="at least one"):
        mean_ci95([])


def test_paired_rule_uses_the_differences() -> None:
    a, b = [10.0, 11.0, 12.0], [9.0, 10.0, 11.5]
    # d = (1, 1, 0.5): mean 0.833, s 0.289, half-width 4.3027 * 0.289 / sqrt(3) = 0.717 > 0.
    assert better(a, b, higher_is_better=True)
    assert better(b, a, higher_is_better=False)
    assert not better(b, a, higher_is_better=True)
    # Marginal intervals overlap widely, yet every seed agrees: better.
    wide_a, wide_b = [10.0, 20.0, 30.0], [9.0, 19.0, 29.0]
    assert mean_ci95(wide_b).high is not None
    assert mean_ci95(wide_b).high > mean_ci95(wide_a).low  # type: ignore[operator]
    assert better(wide_a, wide_b, higher_is_better=True)
    # A tie is never better; noisy differences that straddle 0 are not either.
    assert not better([5.0, 6.0], [5.0, 6.0], higher_is_better=True)
    assert not better([1.0, 3.0, 2.0], [2.0, 2.0, 2.0], higher_is_better=True)
    assert not better([1.0], [0.0], higher_is_better=True)


def test_summary_keeps_single_seed_values_and_adds_intervals_over_seeds() -> None:
    one = summarize({"lp": [{"cost_usd": 10.0, "unplaced": 2, "speedup_8gpu": None}]})
    assert one["lp"].mean == {"cost_usd": 10.0, "unplaced": 2, "speedup_8gpu": None}
    assert one["lp"].ci95 == {}
    runs = {
        "lp": [{"cost_usd": 10.0, "utilization_cpu": 0.6, "speedup_8gpu": None,
                "decision_ms_p99": 1.0},
               {"cost_usd": 11.0, "utilization_cpu": 0.62, "speedup_8gpu": 7.0,
                "decision_ms_p99": 1.1},
               {"cost_usd": 12.0, "utilization_cpu": 0.64, "speedup_8gpu": None,
                "decision_ms_p99": 1.2}],
        "greedy": [{"cost_usd": 12.0, "utilization_cpu": 0.5, "speedup_8gpu": None,
                    "decision_ms_p99": 5.0},
                   {"cost_usd": 13.0, "utilization_cpu": 0.52, "speedup_8gpu": None,
                    "decision_ms_p99": 5.5},
                   {"cost_usd": 14.5, "utilization_cpu": 0.54, "speedup_8gpu": None,
                    "decision_ms_p99": 6.5}],
    }
    s = summarize(runs)
    assert s["lp"].mean["cost_usd"] == pytest.approx(11.0)
    low, high = s["lp"].ci95["cost_usd"]
    hw = T975[2] * 1.0 / math.sqrt(3)  # s = 1
    assert (low, high) == (pytest.approx(11.0 - hw, abs=1e-3), pytest.approx(11.0 + hw, abs=1e-3))
    # decision_ms_p99 (wall clock: the machine as much as the policy) gets an interval but
    # no verdict; lp's is lower in every seed and was reported as a win.
    assert s["lp"].better_than == {"cost_usd": ["greedy"], "utilization_cpu": ["greedy"]}
    assert s["greedy"].better_than == {}
    assert "decision_ms_p99" in s["lp"].ci95
    # A metric missing in some seeds: mean of the seeds that have it, no interval.
    assert s["lp"].mean["speedup_8gpu"] == 7.0
    assert "speedup_8gpu" not in s["lp"].ci95
    assert s["lp"].per_seed["cost_usd"] == [10.0, 11.0, 12.0]


def test_run_plan_and_process_count() -> None:
    import os

    from broker.sim.seeds import PARALLEL_MIN_EVENTS, RunSpec, default_jobs, plan_runs

    assert plan_runs(["lp", "greedy"], 7, 2) == [RunSpec("lp", 7), RunSpec("lp", 8),
                                                 RunSpec("greedy", 7), RunSpec("greedy", 8)]
    with pytest.raises(ValueError, match="seeds"):
        plan_runs(["lp"], 0, 0)
    assert default_jobs(10, PARALLEL_MIN_EVENTS - 1) == 1  # small: a worker costs more
    assert default_jobs(1, 10**6) == 1
    assert default_jobs(10, 10**6) == min(os.cpu_count() or 1, 10)
