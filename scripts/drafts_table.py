"""Compare policies on held-out trace drafts, paired per draft, and print a Markdown table.

    .venv/bin/python scripts/drafts_table.py --drafts 40 [--first-seed 9200000] \
        [--policies lp,greedy,karpenter,traditional] [--data ../shared/data] [--json]

The shipped scenarios are four; the scheduler is judged on others. This runs each policy on
`--drafts` scenarios from broker/sim/tracedraft.py (random windows, scales and places of the
real traces, never a window a shipped scenario replays), 2 h each, the kinds (services,
edge, gpu, mixed) in turn, at seeds from `--first-seed` (the default is above every seed
training or the gate draws); lp+rl plans with the shipped checkpoint. Against the first
policy, per kind and over all drafts:

- cost: the mean of log(cost_first / cost_other) over drafts, as a percentage, with its
  Student-t 95 % interval (broker/sim/stats.py) — a paired ratio, since drafts differ in
  scale by 100x; `cost_usd` and `cost_with_unfinished_usd`;
- `slo_violation_frac` and `user_rtt_ms_mean`: the mean paired difference, with its interval
  (drafts where either run has no value are left out of that cell).

Runs go to `--jobs` processes (default 2); the twin is deterministic, so a rerun prints the
same numbers. The numbers are the twin's (broker/sim), not this script's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = ("cost_usd", "cost_with_unfinished_usd", "slo_violation_frac", "user_rtt_ms_mean",
        "unplaced")
RATIO_KEYS = ("cost_usd", "cost_with_unfinished_usd")
DIFF_KEYS = ("slo_violation_frac", "user_rtt_ms_mean")


def run_one(task: tuple[int, str, str, str]) -> tuple[int, str, str, dict[str, object]]:
    """One policy on one draft: the metrics in KEYS."""
    from broker.sim.rollout import _catalog
    from broker.sim.runner import load_model, run_policy, stdout_to_stderr
    from broker.sim.tracedraft import trace_draft

    seed, kind, policy, data = task
    catalog = _catalog()
    scn = trace_draft(catalog, Path(data), seed, horizon_s=7200.0,
                      kind=kind).to_scenario(catalog)
    # lp+rl plans with the shipped checkpoint (as `bench twin` does by default).
    model = load_model(None) if policy == "lp+rl" else None
    with stdout_to_stderr():
        metrics = run_policy(scn, policy, catalog, model=model).metrics
    return seed, kind, policy, {k: metrics.get(k) for k in KEYS}


def _cell(values: Sequence[float], digits: int, unit: str) -> str:
    from broker.sim.stats import mean_ci95

    if not values:
        return "-"
    ci = mean_ci95(values)
    if len(values) < 2:
        return f"{ci.mean:+.{digits}f}{unit} (n=1)"
    interval = f"[{ci.low:+.{digits}f}, {ci.high:+.{digits}f}]"
    return f"{ci.mean:+.{digits}f}{unit} {interval} (n={len(values)})"


def compare(runs: dict[tuple[int, str], dict[str, dict[str, object]]], first: str,
            other: str, kind: str) -> dict[str, list[float]]:
    """Paired per-draft samples of `first` against `other` (module docstring)."""
    out: dict[str, list[float]] = {k: [] for k in RATIO_KEYS + DIFF_KEYS}
    for (_, k), by in sorted(runs.items()):
        if kind not in ("all", k) or first not in by or other not in by:
            continue
        a, b = by[first], by[other]
        for key in RATIO_KEYS:
            x, y = a.get(key), b.get(key)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 and y > 0:
                out[key].append(100.0 * math.log(x / y))
        for key in DIFF_KEYS:
            x, y = a.get(key), b.get(key)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                out[key].append(float(x) - float(y))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from broker.sim.tracedraft import KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafts", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=9_200_000)
    ap.add_argument("--policies", default="lp,greedy,karpenter,traditional")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if len(policies) < 2 or args.drafts < 1 or args.jobs < 1:
        ap.error("give at least two policies, one draft and one job")
    if not (args.data / "traces").is_dir():
        ap.error(f"--data {args.data}: no traces/ folder there (the shared/data layout)")
    tasks = [(args.first_seed + i, KINDS[i % len(KINDS)], p, str(args.data))
             for i in range(args.drafts) for p in policies]
    runs: dict[tuple[int, str], dict[str, dict[str, object]]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for done, (seed, kind, policy, metrics) in enumerate(pool.map(run_one, tasks), 1):
            runs.setdefault((seed, kind), {})[policy] = metrics
            print(f"\r{done}/{len(tasks)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    first = policies[0]
    kinds = [k for k in KINDS if any(kk == k for _, kk in runs)] + ["all"]
    table = {other: {kind: compare(runs, first, other, kind) for kind in kinds}
             for other in policies[1:]}
    if args.json:
        print(json.dumps({"first": first, "seeds": [args.first_seed,
                                                     args.first_seed + args.drafts - 1],
                          "runs": [{"seed": s, "kind": k, "policy": p, **m}
                                   for (s, k), by in sorted(runs.items())
                                   for p, m in by.items()],
                          "paired": table}, indent=2))
        return 0
    print(f"{first} against each policy on {args.drafts} trace drafts (seeds "
          f"{args.first_seed}-{args.first_seed + args.drafts - 1}); cost: mean 100 x "
          f"log({first} / other) %, the rest: mean {first} - other; [95 % interval]\n")
    print("| against | kind | cost_usd | cost_with_unfinished_usd | slo_violation_frac "
          "| user_rtt_ms_mean |")
    print("|---|---|---|---|---|---|")
    for other, by_kind in table.items():
        for kind, cols in by_kind.items():
            print(f"| {other} | {kind} | {_cell(cols['cost_usd'], 2, ' %')} "
                  f"| {_cell(cols['cost_with_unfinished_usd'], 2, ' %')} "
                  f"| {_cell(cols['slo_violation_frac'], 4, '')} "
                  f"| {_cell(cols['user_rtt_ms_mean'], 1, ' ms')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
