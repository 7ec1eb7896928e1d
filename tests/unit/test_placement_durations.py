"""The duration predictor: no future information, the cold-start prior, the formula, isolation."""

from __future__ import annotations

import math

import pytest

from broker.domain import Resources
from broker.placement.durations import (
    PRIOR_MEDIAN_S,
    PRIOR_WEIGHT,
    DurationPredictor,
    FinishedJob,
    mape,
    size_class,
)

ONE_GPU = Resources(cpu=4.0, memory_gib=16.0, gpu=1)


def job(duration_s: float, finished_s: float, tenant: str = "a",
        cls: str = "gpu-1") -> FinishedJob:
    return FinishedJob(tenant=tenant, size_class=cls, duration_s=duration_s,
                       finished_s=finished_s)


def shrunk(durations: list[float], cls: str = "gpu-1") -> float:
    """The documented formula, written out independently of the implementation."""
    k = PRIOR_WEIGHT
    mu = (k * math.log(PRIOR_MEDIAN_S[cls]) + sum(math.log(d) for d in durations)) / (
        k + len(durations))
    return math.exp(mu)


def test_a_job_that_finishes_after_the_submission_is_not_used() -> None:
    p = DurationPredictor()
    p.record(job(100.0, finished_s=500.0))
    p.record(job(90_000.0, finished_s=2000.0))  # long job, still running at t=1000
    est = p.predict("a", ONE_GPU, 1, at_s=1000.0)
    assert est.jobs == 1
    assert est.duration_s == pytest.approx(shrunk([100.0]))
    # Once it has finished, it counts.
    later = p.predict("a", ONE_GPU, 1, at_s=2000.5)
    assert later.jobs == 2
    assert later.duration_s == pytest.approx(shrunk([100.0, 90_000.0]))


def test_finishing_exactly_at_the_submission_is_not_before_it() -> None:
    p = DurationPredictor()
    p.record(job(100.0, finished_s=1000.0))
    assert p.predict("a", ONE_GPU, 1, at_s=1000.0).jobs == 0


def test_an_earlier_query_after_a_later_one_still_sees_no_future() -> None:
    p = DurationPredictor()
    p.record_all([job(100.0, 500.0), job(5000.0, 3000.0)])
    assert p.predict("a", ONE_GPU, 1, at_s=4000.0).jobs == 2
    past = p.predict("a", ONE_GPU, 1, at_s=1000.0)
    assert past.jobs == 1
    assert past.duration_s == pytest.approx(shrunk([100.0]))
    # A job recorded late but finished in the past joins the fast path at once.
    p.record(job(700.0, 600.0))
    assert p.predict("a", ONE_GPU, 1, at_s=5000.0).jobs == 3


def test_cold_start_is_the_public_prior_per_size_class() -> None:
    p = DurationPredictor()
    for cls, median in PRIOR_MEDIAN_S.items():
        est = p.predict_class("new-tenant", cls, at_s=0.0)
        assert est.jobs == 0
        assert est.duration_s == pytest.approx(median)
    eight = p.predict("t", Resources(cpu=32.0, memory_gib=256.0, gpu=8), 1, at_s=0.0)
    assert eight.size_class == "gpu-5-8"
    assert eight.duration_s == pytest.approx(PRIOR_MEDIAN_S["gpu-5-8"])


def test_own_history_outweighs_the_prior_as_it_grows() -> None:
    p = DurationPredictor()
    p.record_all(job(7200.0, finished_s=float(i)) for i in range(200))
    est = p.predict("a", ONE_GPU, 1, at_s=1e6)
    assert est.duration_s == pytest.approx(shrunk([7200.0] * 200))
    assert abs(est.duration_s - 7200.0) / 7200.0 < 0.05


def test_other_tenants_jobs_do_not_move_an_estimate() -> None:
    p = DurationPredictor()
    p.record_all(job(50_000.0, finished_s=float(i), tenant="b") for i in range(50))
    assert p.predict("a", ONE_GPU, 1, at_s=1e6).duration_s == pytest.approx(
        PRIOR_MEDIAN_S["gpu-1"])


@pytest.mark.parametrize(("res", "replicas", "cls"), [
    (Resources(1.0, 2.0, 0), 1, "cpu-1-4"),
    (Resources(2.0, 2.0, 0), 2, "cpu-1-4"),
    (Resources(2.0, 2.0, 0), 3, "cpu-5-16"),
    (Resources(4.0, 8.0, 0), 5, "cpu-17+"),
    (Resources(4.0, 8.0, 1), 1, "gpu-1"),
    (Resources(4.0, 8.0, 2), 2, "gpu-2-4"),
    (Resources(4.0, 8.0, 8), 1, "gpu-5-8"),
    (Resources(4.0, 8.0, 8), 2, "gpu-9+"),
])
def test_size_classes(res: Resources, replicas: int, cls: str) -> None:
    assert size_class(res, replicas) == cls


@pytest.mark.parametrize("bad", [
    job(math.nan, 1.0), job(-1.0, 1.0), job(10.0, math.inf),
])
def test_bad_history_is_refused(bad: FinishedJob) -> None:
    with pytest.raises(ValueError, match="finite"):
        DurationPredictor().record(bad)


def test_unknown_class_and_bad_prior_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown size class"):
        DurationPredictor().predict_class("a", "gpu-3000", at_s=0.0)
    with pytest.raises(ValueError, match="prior median"):
        DurationPredictor(prior_median_s={"gpu-1": 0.0})


def test_mape_on_known_pairs() -> None:
    assert mape([(110.0, 100.0), (50.0, 100.0)]) == pytest.approx((0.1 + 0.5) / 2)
    assert mape([]) is None


def test_a_job_past_its_estimate_is_expected_to_run_as_long_again() -> None:
    # Consolidation judges a node's remaining paid time by its jobs' remaining run time: a
    # job that outlived its estimate was counted as ending now, so lp's drain rule never
    # paid on gpu-training (estimates of minutes, jobs of hours).
    from broker.placement.durations import remaining_s

    assert remaining_s(3600.0, 600.0) == 3000.0  # before its estimate: what it leaves
    assert remaining_s(600.0, 5400.0) == 5400.0  # past it: as long again as it has run
    assert remaining_s(None, 120.0) == 120.0
    assert remaining_s(600.0, -5.0) == 600.0  # a clock skew never makes a negative age
