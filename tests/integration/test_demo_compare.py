"""The demo compares the baselines against the plan the live broker ran.

Seen before the fix: the comparison re-solved the batch on a snapshot built from the
registrations alone, while the live loop had solved it on its own snapshot (with the nodes
the simulated drivers reported and their observed spot reclaim rates), so the demo's
"traditional differs" line gave checkout-eu as "LP: gcp-euw4" right under a placements table
that showed checkout-eu at edge-paris. In process: the demo's stack (broker, loops,
simulated clusters, in-process MQTT; no agent processes) and its narrator.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from broker.demo.federation import load_demo_federation
from broker.demo.runner import Narrator, demo_settings
from broker.demo.stack import DemoStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# `name: <baseline's clusters> (LP: <lp's clusters>)` in a "differs on N:" line
DIFFERS = re.compile(r"([\w-]+): [\w+-]+ \(LP: ([\w+-]+)\)")


async def test_the_comparison_is_the_plan_the_live_loop_wrote(tmp_path: Path) -> None:
    fed = load_demo_federation(None)
    console = Console(record=True, width=1000)
    async with DemoStack(demo_settings(tmp_path, 0), fed, agents=False) as stack:
        n = Narrator(stack, fed, console)
        try:
            await n.submit()
            await stack.start_loops()
            assert await n.wait_placed()
            await n.show_placements(True)
        finally:
            await n.aclose()
    live = {name: "+".join(sorted({a["cluster"] for a in p["assignments"]}))
            for name, p in n.placements.items()}
    assert len(live) == len(fed.workloads)
    text = console.export_text()
    said = DIFFERS.findall(text)
    assert said  # the baselines place some workloads apart from the LP (so it saves)
    for name, lp_clusters in said:
        assert lp_clusters == live[name], name
    assert "the live plan (LP) vs the baselines" in text
    assert "lp = the plan the placement loop wrote in its epoch" in text

    cmp = n.comparison()
    assert cmp.live
    names = {w.id: w.spec.name for w in cmp.snapshot.pending}
    lp = cmp.results()["lp"]
    assert {names[wid]: where for wid, where in lp.where.items()} == live
    assert lp.usd_per_hour == pytest.approx(sum(p["costUsdPerHour"]
                                                for p in n.placements.values()))
