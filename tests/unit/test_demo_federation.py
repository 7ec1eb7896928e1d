"""The demo federation file, its API payloads and the baseline comparison."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from broker.api.schemas import ClusterIn, SiteIn, WorkloadIn
from broker.demo import report
from broker.demo.compare import compare_policies, demo_snapshot, differences, saving_frac
from broker.demo.federation import DemoConfigError, load_demo_federation
from broker.domain import PolicyAction, PricingModel
from broker.placement.planner import PlannerConfig, plan_epoch
from providers.catalog import Catalog


@pytest.fixture(scope="module")
def fed():  # type: ignore[no-untyped-def]
    return load_demo_federation()


def test_demo_clusters_are_in_real_regions_at_catalog_prices(fed) -> None:  # type: ignore[no-untyped-def]
    cat = Catalog.load()
    assert {c.provider for c in fed.clusters} == {"aws", "gcp", "azure"}
    for c in fed.clusters:
        region = cat.region(c.provider, c.region)
        assert (c.lat, c.lon) == (region.lat, region.lon)
        for p in c.pools:
            offer = cat.offer(c.provider, c.region, p.instance_type)
            want = offer.spot_price_usd_per_hour if p.pricing is PricingModel.SPOT \
                else offer.price_usd_per_hour
            assert p.price_usd_per_hour == want
            assert p.node.cpu == offer.vcpu
    assert len(fed.sites) == 3


def test_demo_mix_has_slo_services_batch_and_an_8gpu_job_with_data(fed) -> None:  # type: ignore[no-untyped-def]
    specs = [w.spec for w in fed.workloads]
    regions = {s.user_region for s in specs if s.latency_slo_ms is not None}
    assert len(regions) >= 3
    assert any(s.kind == "batch" for s in specs)
    train = [s for s in specs if s.kind == "train"]
    assert any(s.resources.gpu == 8 and s.data for s in train)


def test_payloads_are_accepted_by_the_api_schemas(fed) -> None:  # type: ignore[no-untyped-def]
    for body in fed.cluster_payloads():
        assert ClusterIn.model_validate(body).to_domain().pools
    for body in fed.site_payloads():
        SiteIn.model_validate(body)
    specs = {w.spec.name: w.spec for w in fed.workloads}
    for body in fed.workload_manifests():
        got = WorkloadIn.model_validate(body).to_domain()
        want = specs[got.name]
        assert (got.replicas, got.resources, got.latency_slo_ms, got.data) == \
            (want.replicas, want.resources, want.latency_slo_ms, want.data)


def test_unknown_keys_and_regions_are_errors_naming_them(tmp_path: Path) -> None:
    bad = tmp_path / "demo.toml"
    bad.write_text('[[clusters]]\nname = "x"\nprovider = "aws"\nregion = "us-east-1"\n'
                   'replica = 3\n')
    with pytest.raises(DemoConfigError, match="replica"):
        load_demo_federation(bad)
    bad.write_text('[[clusters]]\nname = "x"\nprovider = "aws"\nregion = "mars-1"\n')
    with pytest.raises(DemoConfigError, match="mars-1"):
        load_demo_federation(bad)
    bad.write_text('[[workloads]]\nname = "w"\nkind = "service"\nimage = "i"\n'
                   'user_region = "atlantis"\n')
    with pytest.raises(DemoConfigError, match="atlantis"):
        load_demo_federation(bad)


def test_lp_is_never_worse_than_the_baselines_on_the_demo_batch(fed) -> None:  # type: ignore[no-untyped-def]
    results = compare_policies(demo_snapshot(fed), action=PolicyAction())
    assert set(results) == {"lp", "greedy", "traditional"}
    assert results["lp"].unplaced == 0
    assert results["lp"].objective <= results["greedy"].objective + 1e-6
    assert results["lp"].objective <= results["traditional"].objective + 1e-6
    s = saving_frac(results, "greedy")
    assert s is not None
    assert s >= 0


def test_report_renders_a_real_decision_record(fed) -> None:  # type: ignore[no-untyped-def]
    plan = plan_epoch(demo_snapshot(fed), PolicyAction(), PlannerConfig())
    rec = next(p.decision for p in plan.placements if p.workload_id.endswith("llm-finetune"))
    lines = report.explanation_lines(rec)
    assert lines[0].startswith("chosen: ")
    assert any(ln.startswith("runner-up: ") for ln in lines)
    console = Console(record=True, width=160)
    console.print(report.comparison_table(compare_policies(demo_snapshot(fed),
                                                           action=PolicyAction())))
    text = console.export_text()
    assert "traditional" in text
    assert "%" in text


def test_whatif_lines_show_the_difference() -> None:
    lines = report.whatif_lines({
        "before": {"clusters": ["a"], "cost_usd_per_hour": 1.0},
        "after": {"clusters": ["b"], "cost_usd_per_hour": 3.5},
        "delta_cost_usd_per_hour": 2.5, "delta_objective_usd": 10.0, "delta_rtt_ms": None,
        "others_moved": ["w2"], "forced_infeasible": False})
    assert lines[1].startswith("forced: b 3.500")
    assert "2.500 USD/h" in lines[2]
    assert "w2" in lines[3]


def test_differences_name_the_workloads_placed_apart(fed) -> None:  # type: ignore[no-untyped-def]
    snapshot = demo_snapshot(fed)
    results = compare_policies(snapshot, action=PolicyAction())
    names = {w.id: w.spec.name for w in snapshot.pending}
    diff = differences(results, "greedy", names)
    if results["greedy"].objective > results["lp"].objective + 1e-6:
        assert diff  # a cheaper plan must place something elsewhere
    for line in diff:
        name = line.split(":")[0]
        assert name in names.values()
    assert differences(results, "lp", names) == []
