"""Run policies on a scenario: the shell shared by `skyfed sim`, `skyfed bench twin`, training.

`lp+rl` uses the checkpoint given, else the one shipped in broker/policy_data, else (no
checkpoint at all) the fixed weights — in which case it equals `lp` and the report says so.
A checkpoint trained against other fixed weights than today's (policy.fixed_weights_warnings)
runs as it is, and each run's notes say what differs (`bench twin` prints them).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from broker.sim.engine import Engine, PlannerFn, SimConfig
from broker.sim.scenario import CatalogLike, Scenario

if TYPE_CHECKING:  # torch is imported where a policy runs (lp+rl), not to run the others
    from broker.placement.policy import ActorCritic


@dataclass
class RunResult:
    policy: str
    metrics: dict[str, object]
    series: list[dict[str, float]]
    notes: list[str] = field(default_factory=list)
    engine: Engine | None = None


def load_model(checkpoint: str | Path | None) -> ActorCritic | None:
    """`checkpoint`: a path, "none" for fixed weights, or None for the shipped default."""
    if checkpoint is not None and str(checkpoint).lower() == "none":
        return None
    from broker.placement.policy import ActorCritic

    if checkpoint:
        return ActorCritic.load(Path(checkpoint))
    return ActorCritic.load_default()


def run_policy(scenario: Scenario, policy: str, catalog: CatalogLike | None, *,
               model: ActorCritic | None = None, planner: PlannerFn | None = None,
               progress: Callable[[float], None] | None = None,
               config: SimConfig | None = None) -> RunResult:
    cfg = config or SimConfig()
    notes: list[str] = []
    controller = None
    if policy == "lp+rl":
        if model is None:
            notes.append("no policy checkpoint: lp+rl ran with the fixed weights (= lp)")
            policy_cfg = replace(cfg, policy="lp")
            eng = Engine(scenario, catalog, policy_cfg, planner=planner, progress=progress)
            return RunResult("lp+rl", eng.run(), eng.metrics.series, notes, eng)
        from broker.sim.controller import PolicyController

        controller = PolicyController(model)
        notes += [f"checkpoint: {w}" for w in model.fixed_weights_warnings()]
    eng = Engine(scenario, catalog, replace(cfg, policy=policy),
                 planner=planner, controller=controller, progress=progress)
    return RunResult(policy, eng.run(), eng.metrics.series, notes, eng)


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """Send file descriptor 1 to stderr while simulating, so `--json` stdout stays pure JSON.

    Why fd-level: HiGHS prints its banner from C++ straight to fd 1 when a `Highs()` is
    created (before `output_flag` can be set), which Python's redirect_stdout cannot catch.
    """
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class RichProgress:
    """A rich progress bar over simulated seconds, one task per run."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}% sim"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), transient=True)

    def __enter__(self) -> RichProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def task(self, label: str, horizon_s: float) -> Callable[[float], None]:
        tid = self.progress.add_task(label, total=horizon_s)

        def update(t: float) -> None:
            self.progress.update(tid, completed=min(t, horizon_s))

        return update
