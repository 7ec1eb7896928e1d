"""The planner's HiGHS runs on one thread (lp.HIGHS_THREADS), even after another library
started HiGHS's process-wide scheduler with its default thread count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FOREIGN_FIRST = """
import json
import numpy as np, highspy, scipy.sparse as sp
from broker.domain import FederationSnapshot, PolicyAction, WorkloadKind
from broker.placement import lp
from broker.placement.planner import PlannerConfig, plan_epoch
from tests.unit.placement_world import federation, workload

# Another library's instance, default threads, runs first: HiGHS's scheduler starts with them.
a = sp.csr_matrix(np.ones((1, 2)))
h = highspy.Highs()
h.setOptionValue("output_flag", False)
h.passModel(2, 1, 2, 1, 1, 0.0, np.array([-1.0, -2.0]), np.zeros(2), np.full(2, 3.0),
            np.array([-np.inf]), np.array([4.0]), a.indptr.astype(np.int32),
            a.indices.astype(np.int32), a.data, np.ones(2, dtype=np.int32))
h.run()
batch = tuple(workload(f"j{i}", kind=WorkloadKind.BATCH, replicas=3, cpu=3.0,
                       duration_s=3600.0) for i in range(6))
plan = plan_epoch(FederationSnapshot(now_s=0.0, clusters=federation(), pending=batch),
                  PolicyAction(), PlannerConfig(explain=False, deterministic=True))
ours = lp.quiet_highs()
print(json.dumps({"threads": ours.getOptionValue("threads")[1], "status": plan.stats.status,
                  "mip_used": plan.stats.mip_used, "unplaced": len(plan.unplaced)}))
"""


def test_planner_solves_on_one_thread_after_a_foreign_highs() -> None:
    out = subprocess.run([sys.executable, "-c", FOREIGN_FIRST], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["threads"], got["status"], got["unplaced"]) == (1, "optimal", 0)
