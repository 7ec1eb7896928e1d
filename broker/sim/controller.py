"""The `lp+rl` controller: the twin's snapshot -> THE observation -> the policy's action.

The observation is placement/observe.py's, on the snapshot the planner gets
(`Engine.snapshot()`, built by the shared merge), exactly as the live broker observes its
own snapshot: there is no twin-only feature code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.domain import PolicyAction
from broker.placement.observe import observe
from broker.placement.policy import ActorCritic, GraphObs

if TYPE_CHECKING:
    from broker.sim.engine import Engine


def observe_engine(engine: Engine, model: ActorCritic) -> GraphObs:
    """`model`'s observation of the engine's state now (every pending workload), its
    demand forecast over the policy's decision interval (the time its action stands), its
    forecast features as the model was trained on them (`net_forecast_observed`)."""
    return observe(engine.snapshot(), forecast_window_s=engine.config.decision_interval_s,
                   net_forecast=model.net_forecast_observed)


class PolicyController:
    """Engine controller for `lp+rl`: observe -> policy mean action (deterministic)."""

    def __init__(self, model: ActorCritic) -> None:
        self.model = model
        self.visited: list[GraphObs] = []

    def act(self, engine: Engine, now_s: float) -> PolicyAction:
        obs = observe_engine(engine, self.model)
        self.visited.append(obs)
        return self.model.act(obs).action
