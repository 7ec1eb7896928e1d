"""HiGHS's start-up banner never reaches stdout (`skyfed ... --json` stays pure JSON)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SOLVE_AND_PRINT = """
import json, threading
from broker.domain import FederationSnapshot, PolicyAction
from broker.placement import lp
from broker.placement.planner import PlannerConfig, plan_epoch
from tests.unit.placement_world import federation, workload

hs = []
threads = [threading.Thread(target=lambda: hs.append(lp.quiet_highs())) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
snap = FederationSnapshot(now_s=0.0, clusters=federation(), pending=(workload("w1"),))
plan = plan_epoch(snap, PolicyAction(), PlannerConfig())
print(json.dumps({"placed": [p.workload_id for p in plan.placements], "highs": len(hs)}))
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)


def test_solving_prints_only_our_json() -> None:
    out = _run(SOLVE_AND_PRINT)
    assert json.loads(out.stdout) == {"placed": ["w1"], "highs": 3}
    assert out.stdout.count("\n") == 1
    assert "HiGHS" not in out.stdout


def test_the_banner_exists_without_the_fix() -> None:
    """Control: a bare Highs() does print it, so the test above can fail."""
    out = _run("import highspy; highspy.Highs(); print('{}')")
    assert "HiGHS" in out.stdout
