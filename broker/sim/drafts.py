"""Policies on held-out trace drafts, paired per draft (`skyfed bench drafts`).

The shipped scenarios are four; the scheduler is judged on others. This runs each policy on
`drafts` scenarios from tracedraft.trace_draft (random windows, scales and places of the real
traces, never a window a shipped scenario replays), the kinds (tracedraft.KINDS) in turn, at
seeds from `first_seed`. The default, HELD_OUT_FIRST_SEED, is none the trainers' held-out
sets use (es.held_out: 50,000,000 and up) nor the one-off checks of docs/twin.md (70,000,000
and 80,000,000 up); training draws its seeds at random below 2^30 (rollout.draw), so 10^4
episodes drew a given draft's seed with odds of about 1 in 10^5, and then with its own kind
and horizon only by chance as well.

Against the first policy, per kind and over all drafts (`paired`):
- cost keys (RATIO_KEYS): 100 x log(first / other) per draft, so drafts whose costs differ by
  100x weigh alike; its mean is about the percentage difference;
- DIFF_KEYS: first - other per draft;
each summarised by its mean and Student-t 95 % interval (stats.mean_ci95), n the drafts where
both runs have a value. The twin is deterministic per scenario, so a rerun gives the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.sim.parallel import in_order, spawned
from broker.sim.stats import mean_ci95
from broker.sim.tracedraft import KINDS

HELD_OUT_FIRST_SEED = 9_200_000
RATIO_KEYS = ("cost_usd", "cost_with_unfinished_usd")
DIFF_KEYS = ("slo_violation_frac", "user_rtt_ms_mean", "queued_replica_h", "unplaced")


@dataclass(frozen=True)
class DraftRun:
    seed: int
    kind: str
    policy: str
    metrics: Mapping[str, object]


def plan(first_seed: int, drafts: int, policies: Sequence[str]) -> list[tuple[int, str, str]]:
    """(seed, kind, policy) of every run: draft i has seed first_seed + i and kind
    KINDS[i % 4]; every policy runs every draft."""
    return [(first_seed + i, KINDS[i % len(KINDS)], p) for i in range(drafts) for p in policies]


def run_one(task: tuple[int, str, str], data: Path, horizon_s: float,
            checkpoint: str | None) -> DraftRun:
    """One policy on one draft (module-level: `spawn` pickles it by name)."""
    from broker.sim.runner import load_model, run_policy
    from broker.sim.tracedraft import trace_draft
    from providers.catalog import Catalog

    seed, kind, policy = task
    catalog = Catalog.load()
    scn = trace_draft(catalog, data, seed, horizon_s=horizon_s, kind=kind).to_scenario(catalog)
    model = load_model(checkpoint) if policy == "lp+rl" else None
    return DraftRun(seed, kind, policy, run_policy(scn, policy, catalog, model=model).metrics)


def run_all(tasks: Sequence[tuple[int, str, str]], data: Path, *, horizon_s: float,
            checkpoint: str | None, jobs: int,
            done: Callable[[DraftRun], None] | None = None) -> list[DraftRun]:
    """Every task, in `jobs` processes (in this one for 1); results in the order of `tasks`,
    `done` called as each finishes."""
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for t in tasks:
            out.append(run_one(t, data, horizon_s, checkpoint))
            if done is not None:
                done(out[-1])
        return out
    with spawned(jobs) as pool:
        assert pool is not None
        return in_order(pool, run_one, [(t, data, horizon_s, checkpoint) for t in tasks],
                        done=None if done is None else lambda _i, r: done(r))


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def paired(runs: Sequence[DraftRun], first: str, other: str,
           kind: str = "all") -> dict[str, list[float]]:
    """Per-draft samples of `first` against `other` (module docstring), drafts of `kind`
    ("all": every draft), in seed order."""
    by: dict[tuple[int, str], dict[str, Mapping[str, object]]] = {}
    for r in runs:
        by.setdefault((r.seed, r.kind), {})[r.policy] = r.metrics
    out: dict[str, list[float]] = {k: [] for k in RATIO_KEYS + DIFF_KEYS}
    for (_, k), pols in sorted(by.items()):
        if kind not in ("all", k) or first not in pols or other not in pols:
            continue
        a, b = pols[first], pols[other]
        for key in RATIO_KEYS:
            x, y = _number(a.get(key)), _number(b.get(key))
            if x is not None and y is not None and x > 0 and y > 0:
                out[key].append(100.0 * math.log(x / y))
        for key in DIFF_KEYS:
            x, y = _number(a.get(key)), _number(b.get(key))
            if x is not None and y is not None:
                out[key].append(x - y)
    return out


def summarize(runs: Sequence[DraftRun], policies: Sequence[str]
              ) -> dict[str, dict[str, dict[str, dict[str, float | int | None]]]]:
    """{other: {kind: {key: {mean, low, high, n, first_worse}}}} against policies[0];
    `first_worse`: drafts where the first policy's value is higher (worse: every key here is
    lower-is-better); low/high None for n < 2, mean too for n = 0."""
    kinds = [k for k in KINDS if any(r.kind == k for r in runs)] + ["all"]
    first = policies[0]
    out: dict[str, dict[str, dict[str, dict[str, float | int | None]]]] = {}
    for other in policies[1:]:
        out[other] = {}
        for kind in kinds:
            cells: dict[str, dict[str, float | int | None]] = {}
            for key, xs in paired(runs, first, other, kind).items():
                if not xs:
                    cells[key] = {"mean": None, "low": None, "high": None, "n": 0,
                                  "first_worse": 0}
                    continue
                ci = mean_ci95(xs)
                cells[key] = {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": len(xs),
                              "first_worse": sum(1 for x in xs if x > 1e-9)}
            out[other][kind] = cells
    return out
