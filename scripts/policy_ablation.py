"""Which of a checkpoint's actions costs or saves: replay a scenario under lp+rl with only
one PolicyAction field taken from the policy (the others at the fixed weights), per seed.

    python scripts/policy_ablation.py config/scenarios/retail-peak/scenario.toml \
        --seeds 1,2,3 [--checkpoint PATH]

Prints one line per variant: `lp`, `all` (the policy as it is), then `only:<field>`, each
with cost_usd and slo_violation_frac per seed (docs/twin.md "The policy" quotes it).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from broker.domain import PolicyAction
from broker.placement.policy import ACTIONS, ActorCritic
from broker.sim.controller import observe_engine
from broker.sim.engine import Engine, SimConfig
from broker.sim.runner import load_model
from broker.sim.scenario import load_scenario
from providers.catalog import Catalog

FIXED = PolicyAction()


class Masked:
    """lp+rl controller that keeps only the fields in `keep` from the policy's action."""

    def __init__(self, model: ActorCritic, keep: set[str]) -> None:
        self.model, self.keep = model, keep

    def act(self, engine: Engine, now_s: float) -> PolicyAction:
        a = self.model.act(observe_engine(engine, self.model)).action
        return dataclasses.replace(FIXED, **{f: getattr(a, f) for f in self.keep})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    catalog = Catalog.load()
    base = load_scenario(args.scenario, catalog)
    model = load_model(args.checkpoint)
    if model is None:
        raise SystemExit("no checkpoint")
    names = [a.field for a in ACTIONS]
    for variant in ["lp", "all", *(f"only:{n}" for n in names)]:
        costs, slo = [], []
        for seed in (int(s) for s in args.seeds.split(",")):
            scn = dataclasses.replace(base, seed=seed)
            if variant == "lp":
                eng = Engine(scn, catalog, SimConfig(policy="lp"))
            else:
                keep = set(names) if variant == "all" else {variant.removeprefix("only:")}
                eng = Engine(scn, catalog, SimConfig(policy="lp+rl"),
                             controller=Masked(model, keep))
            m = eng.run()
            costs.append(round(float(m["cost_usd"]), 2))  # type: ignore[arg-type]
            slo.append(round(float(m["slo_violation_frac"]), 4))  # type: ignore[arg-type]
        print(variant, costs, slo, flush=True)


if __name__ == "__main__":
    main()
