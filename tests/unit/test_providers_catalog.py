"""The shipped catalog: real prices for all three clouds, GPUs, spot, RTT and fallbacks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from broker.cli import app
from providers import geo
from providers.base import Interconnect
from providers.catalog import INTRA_REGION_RTT_MS, Catalog
from providers.errors import NotFoundError


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return Catalog.load()


def test_load_is_cached(cat: Catalog) -> None:
    assert Catalog.load() is cat


def test_aws_p4d_price_matches_libcloud(cat: Catalog) -> None:
    o = cat.offer("aws", "us-east-1", "p4d.24xlarge")
    assert o.price_usd_per_hour == pytest.approx(36.04986)
    assert (o.gpu_count, o.gpu_model, o.interconnect) == (8, "A100", Interconnect.NVLINK_FULL)
    assert o.spot_price_usd_per_hour is None  # no offline AWS spot source


@pytest.mark.parametrize(
    ("provider", "region", "itype", "ic"),
    [
        ("aws", "us-east-1", "p3.16xlarge", Interconnect.NVLINK_PAIRS),
        ("aws", "us-east-1", "g4dn.12xlarge", Interconnect.PCIE),
        ("aws", "us-east-1", "m5.large", Interconnect.NONE),
        ("gcp", "us-central1", "a2-highgpu-8g", Interconnect.NVLINK_FULL),
        ("azure", "eastus", "Standard_ND96asr_v4", Interconnect.NVLINK_FULL),
        ("azure", "eastus", "Standard_NC64as_T4_v3", Interconnect.PCIE),
    ],
)
def test_interconnect_rules(cat: Catalog, provider: str, region: str, itype: str,
                            ic: Interconnect) -> None:
    assert cat.offer(provider, region, itype).interconnect is ic


def test_gcp_and_azure_have_gpu_spot_prices(cat: Catalog) -> None:
    for provider in ("gcp", "azure"):
        gpus = cat.offers(provider=provider, gpu="H100")
        assert gpus, provider
        with_spot = [o for o in gpus if o.spot_price_usd_per_hour is not None]
        assert with_spot
        assert all(o.spot_price_usd_per_hour < o.price_usd_per_hour * 1.5 for o in with_spot)


def test_gcp_gpu_price_includes_accelerator(cat: Catalog) -> None:
    o = cat.offer("gcp", "us-central1", "a2-highgpu-1g")
    assert o.price_usd_per_hour > 2.9  # VM 0.948 + A100 2.934: the GPU is not free


def test_unknown_things_raise_named_errors(cat: Catalog) -> None:
    with pytest.raises(NotFoundError, match="mars-1"):
        cat.region("aws", "mars-1")
    with pytest.raises(NotFoundError, match="'nope'"):
        cat.offers(provider="nope")
    with pytest.raises(NotFoundError, match="Z99"):
        cat.offers(gpu="Z99")
    with pytest.raises(NotFoundError, match=r"x9\.huge"):
        cat.offer("aws", "us-east-1", "x9.huge")


def test_rtt_measured_symmetric_and_estimated(cat: Catalog) -> None:
    ms, src = cat.rtt_ms("aws:us-east-1", "gcp:europe-west4")
    assert src == "measured"
    assert 60 < ms < 120
    assert cat.rtt_ms("gcp:europe-west4", "aws:us-east-1") == (ms, src)
    assert cat.rtt_ms("aws:us-east-1", "aws:us-east-1") == (INTRA_REGION_RTT_MS, "estimated")
    # a pair Skyplane did not measure but both have coordinates
    est = None
    regions = [r for r in cat.regions("gcp") if r.lat is not None]
    for a in regions:
        for b in regions:
            if a.name < b.name and cat.rtt_ms(a.key, b.key)[1] == "estimated":
                est = (a, b)
                break
        if est:
            break
    assert est is not None
    a, b = est
    ms, src = cat.rtt_ms(a.key, b.key)
    assert src == "estimated"
    assert ms == pytest.approx(geo.estimate_rtt_ms(a.lat, a.lon, b.lat, b.lon), abs=1e-2)


def test_geo_constants_match_the_recorded_fit(cat: Catalog) -> None:
    fit = cat.fit["regional"]
    assert pytest.approx(fit["inflation"], abs=1e-3) == geo.ROUTE_INFLATION
    assert pytest.approx(fit["floor_ms"], abs=1e-2) == geo.RTT_FLOOR_MS


def test_egress_and_throughput_fallbacks(cat: Catalog) -> None:
    assert cat.egress_usd_per_gb("aws:us-east-1", "aws:us-east-1") == 0.0
    assert cat.egress_usd_per_gb("aws:us-east-1", "aws:us-west-2") == pytest.approx(0.02)
    assert cat.egress_usd_per_gb("aws:us-east-1", "gcp:europe-west4") > 0.05
    assert cat.egress_usd_per_gb("edge:melbourne-1", "aws:us-east-1") == 0.0
    assert cat.throughput_gbps("aws:us-east-1", "gcp:europe-west4") > 0.5
    assert cat.throughput_gbps("x:a", "x:a") == 10.0


runner = CliRunner()


def test_cli_offers_json() -> None:
    res = runner.invoke(app, ["catalog", "offers", "--provider", "aws", "--region", "us-east-1",
                              "--gpu", "A100", "-o", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows
    assert {r["gpu_model"] for r in rows} == {"A100"}
    assert {"provider", "region", "instance_type", "vcpu", "memory_gib", "gpu_count",
            "gpu_model", "price_usd_per_hour", "spot_price_usd_per_hour"} <= set(rows[0])


def test_cli_rtt_json_and_errors() -> None:
    res = runner.invoke(app, ["catalog", "rtt", "aws:us-east-1", "gcp:europe-west4", "-o", "json"])
    assert res.exit_code == 0
    body = json.loads(res.stdout)
    assert body["source"] == "measured"
    assert body["rtt_ms"] > 0
    bad = runner.invoke(app, ["catalog", "offers", "--provider", "aws", "--region", "mars-1"])
    assert bad.exit_code != 0
    assert "mars-1" in bad.output
    assert "Traceback" not in bad.output
