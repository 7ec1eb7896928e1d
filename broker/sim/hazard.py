"""Spot reclaims as a per-pool hazard, besides the scenario's scripted faults. Pure.

Why: with scripted `spot_reclaim` faults only, a policy that buys spot capacity pays nothing
for the risk it takes; providers reclaim spot nodes all the time. shared/data has spot prices
but no reclaim records, so the rates come from what the providers publish:

- aws: the Spot Instance Advisor bands "frequency of interruption" as <5 %, 5-10 %, 10-15 %,
  15-20 % and >20 % of instances interrupted over the past month; the lowest band covers most
  general-purpose and GPU types. Used: 5 % per 30 days, `-ln(0.95) / 720` per node-hour.
- azure: Spot VM eviction-rate bands (0-5 % ... 20+ %), the same banding. Used: as AWS.
- gcp: the preemptible VM documentation cited preemption of 5-15 % of VMs per day. Used:
  10 % per day, `-ln(0.90) / 24` per node-hour.

Each node is an independent Poisson process at its provider's rate (exponential time to
reclaim, memoryless: Spot gives no age guarantee). In a step of `dt_s` seconds a node is
reclaimed with probability `1 - exp(-rate_per_hour x dt_s / 3600)`, drawn from the run's
`spot_hazard` stream (sim/realize.py), so the reclaims vary with the seed and not with the
policy's other draws. The engine handles a hazard reclaim exactly as a scripted one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

RECLAIM_PER_HOUR = {
    "aws": -math.log(0.95) / 720.0,
    "azure": -math.log(0.95) / 720.0,
    "gcp": -math.log(0.90) / 24.0,
}


def rate_per_hour(provider: str, rates: Mapping[str, float] | None = None) -> float:
    """Reclaim hazard of one spot node of `provider` (0 for providers without spot)."""
    return (RECLAIM_PER_HOUR if rates is None else rates).get(provider, 0.0)


def draw_reclaims(nodes: int, provider: str, dt_s: float, rng: random.Random,
                  rates: Mapping[str, float] | None = None) -> int:
    """How many of `nodes` spot nodes are reclaimed in a step of `dt_s` seconds."""
    rate = rate_per_hour(provider, rates)
    if nodes <= 0 or rate <= 0 or dt_s <= 0:
        return 0
    p = 1.0 - math.exp(-rate * dt_s / 3600.0)
    return sum(1 for _ in range(nodes) if rng.random() < p)


def victims(count: int, candidates: Sequence[int], rng: random.Random) -> list[int]:
    """Which nodes go (indexes into `candidates`), uniformly without replacement."""
    k = max(0, min(count, len(candidates)))
    return sorted(rng.sample(list(candidates), k))
