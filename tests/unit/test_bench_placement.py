"""`skyfed bench placement`: the reference bound and the sizes past one cluster per region."""

from __future__ import annotations

import pytest

from broker.bench.placement import generate, run_size
from broker.placement.planner import PlannerConfig, plan_epoch
from providers.catalog import Catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_proven_bound_is_a_bound_and_the_gap_is_measured_against_it(catalog: Catalog) -> None:
    said: list[str] = []
    row = run_size(catalog, "120x30", repeats=1, seed=3, config=PlannerConfig(),
                   proven_mip_s=2.0, say=said.append)
    assert row["proven_bound_source"] == "mip"
    assert row["proven_bound"] >= row["lp_bound_full"] - 1e-6
    # The reference solves the model plan_epoch solves (packing included): the timed run's
    # bound (the LP, or the weaker Lagrangian one) is never above the untimed LP's.
    assert row["lp_bound"] <= row["lp_bound_full"] + 1e-6
    # A bound of the integer program: no plan, the default path's included, is below it.
    assert row["objective"] >= row["proven_bound"] - 0.01
    assert row["default_path_gap_vs_proven_bound"] == pytest.approx(
        (row["objective"] - row["proven_bound"]) / row["proven_bound"], abs=1e-4)
    assert row["cpu_s_median"] > 0
    assert len(row["total_s_all"]) == 1
    assert row["objective_all"] == [row["objective"]]
    assert row["default_path_gap_vs_proven_bound_all"] == [
        row["default_path_gap_vs_proven_bound"]]
    assert any("default path run 1/1" in m for m in said)
    assert any("reference bound" in m for m in said)
    # The packing model opens fewer nodes than the per-replica model on the same batch
    # (this seed: 96 vs 105), and reports both.
    opened = row["new_nodes"]
    assert opened["lp"]["nodes"] < opened["lp_per_replica_model"]["nodes"]
    assert opened["lp"]["usd_per_hour"] < opened["lp_per_replica_model"]["usd_per_hour"]


def test_above_the_workload_cap_the_reference_is_the_lp_bound(catalog: Catalog) -> None:
    row = run_size(catalog, "60x20", repeats=1, seed=2, config=PlannerConfig(),
                   proven_mip_s=2.0, proven_max_workloads=10)
    assert row["proven_bound_source"] == "lp"
    assert row["proven_mip_s"] == 0.0
    assert row["proven_bound"] == row["lp_bound_full"]


def test_more_options_than_regions_hold_get_more_clusters_per_region(catalog: Catalog) -> None:
    snap = generate(catalog, 5, 1500, seed=1)
    names = [c.name for c in snap.clusters]
    assert sum(len(c.pools) for c in snap.clusters) == 1500
    assert len(set(names)) == len(names)
    assert len({c.region_key for c in snap.clusters}) < len(names)


def test_reference_pricing_cut_short_gives_the_lagrangian_bound(catalog: Catalog) -> None:
    """--proven-pricing-s bounds the reference's pricing (20000x2000 needs it): cut at once,
    the bound is the Lagrangian one of the first restricted LP, never above the LP's."""
    full = run_size(catalog, "60x20", repeats=1, seed=2, config=PlannerConfig(),
                    proven_max_workloads=10)
    cut = run_size(catalog, "60x20", repeats=1, seed=2, config=PlannerConfig(),
                   proven_max_workloads=10, proven_pricing_s=0.0)
    assert full["pricing_converged_for_reference"]
    assert not cut["pricing_converged_for_reference"]
    assert cut["proven_bound"] <= full["proven_bound"] + 1e-6
    assert cut["objective"] >= cut["proven_bound"] - 0.01


def test_the_reference_solves_the_batch_plan_epoch_solves() -> None:
    """A 10 ms SLO service beside its users' edge site (RTT 8.48 ms, the floor) runs as 3
    replicas under queueing (feasibility.size_for_slo): the reference's LP prices those 3,
    as plan_epoch's does, not the 1 asked (it did, and bounded a smaller program)."""
    from broker.bench.placement import reference_bound
    from broker.domain import PolicyAction

    from .placement_world import snapshot, workload

    svc = workload("svc", user_region="nyc", latency_slo_ms=10.0)
    snap = snapshot((svc,))
    config = PlannerConfig(deterministic=True)
    plan = plan_epoch(snap, PolicyAction(), config)
    assert plan.slo_extra_replicas == {"svc": 2}
    ref = reference_bound(snap, PolicyAction(), config, mip_s=0.0)
    assert ref.pricing_converged
    assert plan.stats.lp_bound is not None
    assert ref.lp_bound_full == pytest.approx(plan.stats.lp_bound, rel=1e-9)


def test_the_reference_seeding_changes_where_pricing_starts_not_the_bound(
        catalog: Catalog) -> None:
    """Where proven_bound is the LP alone, the reference seeds from a larger sample
    (REFERENCE_SAMPLE_DIV): another start for pricing (cut at once, the two Lagrangian bounds
    differ), the same converged LP bound."""
    from broker.bench.placement import reference_bound
    from broker.domain import PolicyAction

    snap = generate(catalog, 400, 60, seed=2)
    config = PlannerConfig()
    plain = reference_bound(snap, PolicyAction(), config, mip_s=0.0)  # 400 < 8 x 250: unseeded
    seeded = reference_bound(snap, PolicyAction(), config, mip_s=0.0, seed_sample=50,
                             seed_columns=8)
    assert plain.pricing_converged
    assert seeded.pricing_converged
    # Converged = no column prices below -1e-6 USD per replica (pricing.py), so two converged
    # bounds may differ by that over the batch's replicas (1,618 here: 1.6e-3 USD of ~5,981).
    replicas = sum(w.spec.replicas for w in snap.pending)
    assert seeded.lp_bound_full == pytest.approx(plain.lp_bound_full, abs=1e-6 * replicas)
    cut_plain = reference_bound(snap, PolicyAction(), config, mip_s=0.0, pricing_s=0.0)
    cut_seeded = reference_bound(snap, PolicyAction(), config, mip_s=0.0, pricing_s=0.0,
                                 seed_sample=50, seed_columns=8)
    assert cut_seeded.lp_bound_full != pytest.approx(cut_plain.lp_bound_full, rel=1e-6)
    assert max(cut_plain.lp_bound_full, cut_seeded.lp_bound_full) <= plain.lp_bound_full + 1e-6


def test_family_batches_run_no_pricing_round(catalog: Catalog) -> None:
    """On a batch decomposed by pool family (FAMILY_MIN_BATCH x seed_sample workloads: 80 and
    more with a sample of 2) no pricing round runs, however long pricing's box: at
    20000x2000 the round took the time the family MIP needs, and in one bench run of three
    the MIP returned nothing (3.81 % above the proven bound instead of 2.54 %). The same
    batch, not decomposed, prices in the same box."""
    from broker.domain import PolicyAction

    snap = generate(catalog, 200, 40, seed=1)
    family = plan_epoch(snap, PolicyAction(), PlannerConfig(seed_sample=2, pricing_time_frac=10.0,
                                                            explain=False))
    plain = plan_epoch(snap, PolicyAction(), PlannerConfig(seed_sample=1000,
                                                           pricing_time_frac=10.0, explain=False))
    assert family.stats.pricing_rounds == 0
    assert plain.stats.pricing_rounds >= 1


def test_the_bench_times_plans_under_the_collector_settings_of_skyfed_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live placement loop plans in `skyfed serve`, which freezes its start-up heap and
    collects the young generation every SERVE_YOUNG_THRESHOLD allocations (broker/heap.py);
    at the interpreter's defaults a full collection of the warm heap fell into every third
    or fourth timed plan. The bench's plans see serve's settings, and the caller's are
    restored after."""
    import gc

    from typer.testing import CliRunner

    import broker.bench.placement as bench
    from broker.cli import app
    from broker.heap import SERVE_YOUNG_THRESHOLD

    before = gc.get_threshold()
    gc.unfreeze()
    seen: list[tuple[int, int]] = []

    def recording(*args: object, **kwargs: object) -> object:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
        return plan_epoch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bench, "plan_epoch", recording)
    out = CliRunner().invoke(app, ["bench", "placement", "--sizes", "30x10", "--repeats", "1",
                                   "--proven-mip-s", "0.5", "--json"])
    assert out.exit_code == 0, out.output
    assert len(seen) >= 2  # the warm-up and the timed run
    assert all(young >= SERVE_YOUNG_THRESHOLD and frozen > 0 for young, frozen in seen)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
