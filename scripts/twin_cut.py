"""One twin run of a scenario cut at a horizon: its events and faults before the cut only.

    .venv/bin/python scripts/twin_cut.py config/scenarios/federation-day/scenario.toml \
        --horizon-s 3600 --policy lp

Prints the run's metrics as JSON (the keys of `skyfed bench twin --json`, one run, the
scenario's own seed). Why: a full federation-day run takes minutes of CPU per policy on the
shared machine; its first hour is the figure docs/twin.md compares across commits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from broker.sim.runner import run_policy
from broker.sim.scenario import load_scenario
from providers.catalog import Catalog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--horizon-s", type=float, default=3600.0)
    ap.add_argument("--policy", default="lp")
    args = ap.parse_args()
    catalog = Catalog.load()
    scn = load_scenario(args.scenario, catalog)
    h = min(args.horizon_s, scn.horizon_s)
    scn = dataclasses.replace(
        scn, horizon_s=h, events=tuple(e for e in scn.events if e.submit_s < h),
        faults=tuple(f for f in scn.faults if f.at_s < h))
    print(json.dumps(run_policy(scn, args.policy, catalog).metrics, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
