"""Print docs/twin.md's results table: `skyfed bench twin --json` over scenarios, as Markdown.

    .venv/bin/python scripts/twin_table.py --seeds 5 [--policies lp,greedy] \
        config/scenarios/retail-peak config/scenarios/gpu-training config/scenarios/edge-heavy \
        config/scenarios/federation-day:2

Each scenario is one `skyfed bench twin --scenario S/scenario.toml --seeds N --json` run (all
policies, same seeds, paired); every cell is the mean over seeds with its Student-t 95 %
interval `[low, high]` when N > 1. `PATH:N` gives that scenario its own seed count (the
day-long one costs minutes of CPU per run). The numbers are the command's, not this script's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

METRICS = ("cost_usd", "utilization_cpu", "utilization_gpu", "gpu_util_std", "speedup_8gpu",
           "gpu_job_start_s_p50", "scale_out_response_s_p50", "slo_violation_frac",
           "cross_zone_traffic_frac", "queued_replica_h", "unfinished_gpu_h",
           "cost_with_unfinished_usd", "user_rtt_ms_mean", "unplaced")


def _cell(value: object, ci: object) -> str:
    if value is None:
        return "-"
    digits = 1 if isinstance(value, float) and abs(value) >= 100 else 3
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    if isinstance(ci, list) and len(ci) == 2 and None not in ci:
        text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return text


def bench(scenario: Path, seeds: int, skyfed: str,
          policies: str | None = None, jobs: int | None = None) -> dict[str, object]:
    toml = scenario / "scenario.toml" if scenario.is_dir() else scenario
    extra = ["--policies", policies] if policies else []
    extra += ["--jobs", str(jobs)] if jobs else []
    out = subprocess.run([skyfed, "bench", "twin", "--scenario", str(toml), "--seeds",
                          str(seeds), "--json", "--no-progress", *extra], check=True,
                         capture_output=True, text=True)
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


def _seeds_of(arg: str, default: int) -> tuple[Path, int]:
    """`PATH` or `PATH:N` -> (path, seeds)."""
    path, sep, n = arg.rpartition(":")
    if sep and n.isdigit() and int(n) > 0:
        return Path(path), int(n)
    return Path(arg), default


def table(docs: list[dict[str, object]]) -> str:
    head = "| scenario | policy | " + " | ".join(METRICS) + " |"
    lines = [head, "|" + "---|" * (len(METRICS) + 2)]
    for doc in docs:
        policies = doc["policies"]
        if not isinstance(policies, dict):
            raise SystemExit(f"{doc['scenario']}: no policies in the bench JSON")
        for name, m in policies.items():
            ci = m.get("ci95", {})
            cells = [_cell(m.get(k), ci.get(k)) for k in METRICS]
            lines.append(f"| {doc['scenario']} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+", help="scenario folders or files, PATH[:SEEDS]")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policies", help="comma-separated policies (default: all the twin knows)")
    ap.add_argument("--skyfed", default=str(Path(sys.executable).with_name("skyfed")))
    ap.add_argument("--save", type=Path, help="also write the bench JSON documents here")
    ap.add_argument("--jobs", type=int, help="bench twin's --jobs (default: its own)")
    args = ap.parse_args()
    if args.save is not None and (args.save.is_dir() or not args.save.parent.is_dir()):
        # Checked before the runs (a long table's worth of CPU), not after them.
        ap.error(f"--save {args.save}: expected a file in an existing folder")
    docs = [bench(path, seeds, args.skyfed, args.policies, args.jobs)
            for path, seeds in (_seeds_of(s, args.seeds) for s in args.scenarios)]
    if args.save:
        args.save.write_text(json.dumps(docs, indent=1))
    print(table(docs))
    for d in docs:
        policies = d["policies"]
        if not isinstance(policies, dict):
            continue
        for name in ("lp+rl", "lp", "karpenter", "greedy"):
            wins = policies.get(name, {}).get("better_than", {})
            rivals = {k: [p for p in v if p != name]
                      for k, v in wins.items()}
            rivals = {k: v for k, v in rivals.items() if v}
            if rivals:
                text = "; ".join(f"{k} vs {', '.join(v)}" for k, v in sorted(rivals.items()))
                print(f"- {d['scenario']}: {name} better (paired 95 %): {text}")
    mape = ", ".join(f"{d['scenario']} {d.get('duration_prediction_mape')}" for d in docs)
    seeds = ", ".join(f"{d['scenario']} {d.get('seeds')}" for d in docs)
    print(f"\nseeds: {seeds}; duration_prediction_mape: {mape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
