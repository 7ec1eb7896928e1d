"""Scenario and trace parsing: SCENARIO.md exactly (unknown keys, defaults, bad values)."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path
from typing import Any, ClassVar

import pytest

from broker.domain import Interconnect
from broker.sim.randomize import Draft, to_toml
from broker.sim.scenario import (
    SPOT_FRACTION_FALLBACK,
    ScenarioError,
    load_scenario,
    parse_scenario,
    parse_trace,
)
from providers.base import Offer, Region
from providers.errors import NotFoundError


class FakeCatalog:
    """Two instance types in one region; prices chosen to make formulas checkable."""

    OFFERS: ClassVar[dict[str, Offer]] = {
        "cpu4": Offer("aws", "r1", "cpu4", 4.0, 16.0, price_usd_per_hour=1.0),
        "gpu8": Offer("aws", "r1", "gpu8", 32.0, 256.0, 8, "A100", Interconnect.NVLINK_FULL,
                      price_usd_per_hour=10.0, spot_price_usd_per_hour=4.0),
        "gpu4pcie": Offer("aws", "r1", "gpu4pcie", 16.0, 64.0, 4, "T4", Interconnect.PCIE,
                          price_usd_per_hour=2.0),
    }

    def offer(self, provider: str, region: str, instance_type: str) -> Offer:
        if provider != "aws" or region != "r1" or instance_type not in self.OFFERS:
            raise NotFoundError(f"unknown {instance_type}")
        return self.OFFERS[instance_type]

    def region(self, provider: str, name: str) -> Region:
        if name != "r1":
            raise NotFoundError(f"unknown region {name}")
        return Region(provider, name, 40.0, -75.0)

    def rtt_ms(self, a: str, b: str) -> tuple[float, str]:
        return (1.0 if a == b else 50.0), "estimated"

    def egress_usd_per_gb(self, src: str, dst: str) -> float:
        return 0.0 if src == dst else 0.02

    def throughput_gbps(self, src: str, dst: str) -> float:
        return 10.0 if src == dst else 2.0


def base_doc() -> dict[str, Any]:
    return {
        "name": "tiny",
        "clusters": [{"name": "c1", "provider": "aws", "region": "r1",
                      "pools": [{"instance_type": "cpu4", "nodes": 1, "max_nodes": 3}]}],
        "user_regions": [{"name": "u", "lat": 40.0, "lon": -75.0}],
    }


HEADER = "id,submit_s,kind,replicas,cpu,memory_gib\n"


def parse(doc: dict[str, Any], trace: str = HEADER + "a,0,batch,1,1,1\n") -> Any:
    cat = FakeCatalog()
    probe = parse_scenario(doc, cat, events=())
    events = parse_trace(trace, user_regions={u.name for u in probe.user_regions},
                         clusters=probe.clusters)
    return parse_scenario(doc, cat, events=events)


def test_defaults_applied() -> None:
    scn = parse(base_doc())
    assert (scn.seed, scn.horizon_s, scn.epoch_s) == (0, 86400.0, 30.0)
    assert scn.defaults.provision_delay_s == 120.0
    assert scn.defaults.image_pull_gbps == 1.0
    assert scn.defaults.network_gbps == 10.0
    c = scn.clusters[0]
    assert c.zones == ("r1",)
    assert (c.lat, c.lon) == (40.0, -75.0)  # from the catalog
    pool = c.pools[0]
    assert pool.price_usd_per_hour == 1.0
    assert pool.node.cpu == 4.0
    assert not pool.spot
    ev = scn.events[0]
    assert ev.tenant == "default"
    assert ev.image_gb == 0.5
    assert ev.gpu == 0
    assert ev.priority == 0


def test_max_nodes_defaults_to_nodes_and_spot_price() -> None:
    doc = base_doc()
    doc["clusters"][0]["pools"] = [{"instance_type": "cpu4", "nodes": 2},
                                   {"instance_type": "gpu8", "max_nodes": 2, "spot": True},
                                   {"instance_type": "cpu4", "max_nodes": 2, "spot": True}]
    pools = parse(doc).clusters[0].pools
    assert pools[0].max_nodes == 2
    assert pools[1].price_usd_per_hour == 4.0  # catalog spot price
    assert pools[2].price_usd_per_hour == pytest.approx(1.0 * SPOT_FRACTION_FALLBACK)
    assert pools[1].interconnect is Interconnect.NVLINK_FULL


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d.update(colour="red"), "'colour' in the top level"),
    (lambda d: d["clusters"][0].update(flavour=1), "'flavour' in clusters[0]"),
    (lambda d: d["clusters"][0]["pools"][0].update(size=1), "'size' in clusters[0] (c1).pools[0]"),
    (lambda d: d.update(defaults={"boot_s": 1}), "'boot_s' in [defaults]"),
    (lambda d: d.update(faults=[{"at_s": 1, "target": "c1", "kind": "site_down", "x": 1}]),
     "'x' in faults[0]"),
    (lambda d: d["user_regions"][0].update(alt=3), "'alt' in user_regions[0]"),
])
def test_unknown_keys_are_errors_naming_the_key(mutate: Any, needle: str) -> None:
    doc = copy.deepcopy(base_doc())
    mutate(doc)
    with pytest.raises(ScenarioError, match="unknown key") as exc:
        parse(doc)
    assert needle in str(exc.value)


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d.update(horizon_s=-5), "horizon_s must be > 0"),
    (lambda d: d.update(epoch_s="fast"), "epoch_s must be a number"),
    (lambda d: d["clusters"][0].update(provider="ibm"), "provider must be"),
    (lambda d: d["clusters"][0]["pools"][0].update(instance_type="nope"), "'nope'"),
    (lambda d: d["clusters"][0]["pools"][0].update(nodes=5, max_nodes=2), "max_nodes"),
    (lambda d: d["clusters"][0]["pools"][0].update(spot="yes"), "spot must be true or false"),
    (lambda d: d.update(faults=[{"at_s": 1, "target": "zz", "kind": "site_down"}]),
     "not a cluster name"),
    (lambda d: d.update(faults=[{"at_s": 1, "target": "c1", "kind": "meteor"}]), "kind must be"),
    (lambda d: d.update(faults=[{"at_s": 1, "target": "c1", "kind": "site_down", "factor": 2}]),
     "does not apply"),
    (lambda d: d.update(faults=[{"at_s": 1, "target": "c1", "kind": "price_change"}]),
     "missing required key 'factor'"),
    (lambda d: d["clusters"].append({"name": "e", "provider": "edge", "lat": 1, "lon": 2}),
     "capacity is required"),
    (lambda d: d["clusters"].append({"name": "e", "provider": "edge", "lat": 1, "lon": 2,
                                     "capacity": {"cpu": 4, "memory_gib": 8,
                                                  "gpu_interconnect": "wifi"}}),
     "gpu_interconnect"),
])
def test_bad_values_name_the_field(mutate: Any, needle: str) -> None:
    doc = copy.deepcopy(base_doc())
    mutate(doc)
    with pytest.raises(ScenarioError) as exc:
        parse(doc)
    assert needle in str(exc.value)


def test_edge_capacity_defaults() -> None:
    doc = base_doc()
    doc["clusters"].append({"name": "e", "provider": "edge", "lat": 1.0, "lon": 2.0,
                            "capacity": {"cpu": 8, "memory_gib": 32}})
    e = parse(doc).cluster("e")
    p = e.pools[0]
    assert p.node.gpu == 0
    assert p.price_usd_per_hour == 0.0
    assert e.uplink_gbps == 1.0
    assert e.zones == ("e",)
    assert e.fixed


@pytest.mark.parametrize(("trace", "needle"), [
    ("id,submit_s,kind,colour\na,0,batch,red\n", "unknown column 'colour'"),
    ("id,kind\na,batch\n", "missing required column 'submit_s'"),
    (HEADER + "a,5,batch,1,1,1\nb,1,batch,1,1,1\n", "line 3: rows must be sorted"),
    (HEADER + "a,0,job,1,1,1\n", "column 'kind'"),
    (HEADER + "a,0,batch,x,1,1\n", "line 2: column 'replicas' must be an integer"),
    (HEADER + "a,0,batch,1,-1,1\n", "column 'cpu' must be >= 0"),
    (HEADER + "a,0,scale,2,,\n", "not an earlier service"),
    (HEADER + "a,0,batch,1,1,1\na,1,batch,1,1,1\n", "duplicate workload id"),
    ("id,submit_s,kind,user_region\na,0,service,mars\n", "user_region 'mars'"),
    ("id,submit_s,kind,data_gb,data_region\na,0,batch,1,nowhere\n", "data_region 'nowhere'"),
    ("id,submit_s,kind,latency_slo_ms\na,0,service,10\n", "needs a user_region"),
])
def test_bad_traces(trace: str, needle: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        parse(base_doc(), trace)
    assert needle in str(exc.value)


def test_load_from_files_with_gzip_trace(tmp_path: Path) -> None:
    doc = base_doc()
    doc["workloads"] = {"trace": "t.csv.gz"}
    (tmp_path / "s.toml").write_text(to_toml(doc))
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(
        (HEADER + "a,0,service,2,0.5,1\nb,3,batch,1,1,1\na,9,scale,4,,\n").encode()))
    scn = load_scenario(tmp_path / "s.toml", FakeCatalog())
    assert [e.kind for e in scn.events] == ["service", "batch", "scale"]
    assert scn.events[2].replicas == 4


def test_missing_files_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario(tmp_path / "none.toml", FakeCatalog())
    (tmp_path / "bad.toml").write_text("name = ")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(tmp_path / "bad.toml", FakeCatalog())
    doc = base_doc()
    doc["workloads"] = {"trace": "missing.csv"}
    (tmp_path / "s.toml").write_text(to_toml(doc))
    with pytest.raises(ScenarioError, match="trace file not found"):
        load_scenario(tmp_path / "s.toml", FakeCatalog())


def test_draft_roundtrip_writes_what_it_parses(tmp_path: Path) -> None:
    draft = Draft(doc=base_doc(), rows=[{"id": "a", "submit_s": 0.0, "kind": "batch",
                                         "replicas": 2, "cpu": 1.0, "memory_gib": 1.0,
                                         "duration_s": 60.0}],
                  notes=["Source: a test.", "GPUs: none to round."])
    path = draft.write(tmp_path / "d")
    assert path.read_text().startswith("# Source: a test.\n# GPUs: none to round.\n")
    scn = load_scenario(path, FakeCatalog())
    assert scn.events == draft.to_scenario(FakeCatalog()).events  # type: ignore[arg-type]
