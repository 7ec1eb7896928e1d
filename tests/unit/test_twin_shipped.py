"""The shipped scenarios load under SCENARIO.md, and federation-day has the promised size."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.scenario import load_scenario
from providers.catalog import Catalog

SCENARIOS = Path(__file__).resolve().parents[2] / "config" / "scenarios"


@pytest.mark.parametrize("name", ["retail-peak", "gpu-training", "edge-heavy", "federation-day"])
def test_shipped_scenario_loads(name: str) -> None:
    scn = load_scenario(SCENARIOS / name / "scenario.toml", Catalog.load())
    assert scn.name == name
    assert scn.events
    assert all(0.0 <= e.submit_s <= scn.horizon_s for e in scn.events)
    text = (SCENARIOS / name / "scenario.toml").read_text()
    assert text.startswith(f"# {name}: ")  # sizes and sources noted at the top


def test_federation_day_is_a_day_of_a_realistic_federation() -> None:
    scn = load_scenario(SCENARIOS / "federation-day" / "scenario.toml", Catalog.load())
    assert scn.horizon_s >= 86400.0
    assert len(scn.clusters) >= 50
    assert sum(p.nodes for c in scn.clusters for p in c.pools) >= 2000
    assert len(scn.events) >= 20000
    kinds = {e.kind for e in scn.events}
    assert kinds == {"service", "scale", "train"}
    assert max(e.gpu for e in scn.events) <= 8  # big jobs split into node-sized replicas
