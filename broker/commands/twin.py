"""`skyfed sim`, `skyfed train`, `skyfed policy rules|leverage`: the digital twin's commands.

Heavy imports (torch, HiGHS, the catalog) happen inside the command functions so that
`skyfed --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from broker.placement.policy import ActorCritic

policy_app = typer.Typer(no_args_is_help=True, help="The RL policy: explain it.")


def _fail(msg: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/] {msg}")
    return typer.Exit(code=2)


def sim(
    scenario: Annotated[Path, typer.Argument(help="scenario.toml (see SCENARIO.md)")],
    policy: Annotated[str, typer.Option(
        help="traditional | karpenter | greedy | lp | lp+rl")] = "lp",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    whatif: Annotated[str | None, typer.Option(
        help='counterfactual, e.g. "cluster=aws-use1:down@3600" (with vs without)')] = None,
    checkpoint: Annotated[str | None, typer.Option(
        help="policy checkpoint for lp+rl (default: shipped; 'none': fixed weights)")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Simulate one policy on a scenario and print SCENARIO.md's metrics."""
    from broker.sim import report
    from broker.sim.engine import POLICIES
    from broker.sim.runner import (
        RichProgress,
        RunResult,
        load_model,
        run_policy,
        stdout_to_stderr,
    )
    from broker.sim.scenario import ScenarioError, load_scenario
    from broker.sim.whatif import with_whatif
    from providers.catalog import Catalog

    if policy not in POLICIES:
        raise _fail(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    catalog = Catalog.load()
    try:
        scn = load_scenario(scenario, catalog)
        variants = [("baseline", scn)]
        if whatif:
            variants.append((f"whatif {whatif}", with_whatif(scn, whatif)))
    except (ScenarioError, ValueError) as exc:
        raise _fail(str(exc)) from None
    model = load_model(checkpoint) if policy == "lp+rl" else None
    _warn_fixed_weights(model)
    console = Console(stderr=as_json)
    results: list[RunResult] = []
    with stdout_to_stderr(as_json), RichProgress() as bar:
        for label, s in variants:
            cb = bar.task(f"{s.name} {policy} {label}", s.horizon_s) if progress else None
            r = run_policy(s, policy, catalog, model=model, progress=cb)
            r.policy = f"{policy} ({label})" if whatif else policy
            results.append(r)
    if as_json:
        eng = results[0].engine
        real = eng.scenario.realization if eng is not None else None
        doc: dict[str, object] = {
            "scenario": scn.name, "seed": scn.seed, "policy": policy,
            "duration_prediction_mape": real.duration_prediction_mape if real else None,
            "metrics": results[0].metrics, "cost_by_pool": report.pool_costs(results[0])}
        if whatif:
            doc["whatif"] = {"change": whatif, "metrics": results[1].metrics,
                             "delta": _delta(results[0].metrics, results[1].metrics),
                             "cost_by_pool": report.pool_costs(results[1])}
        typer.echo(json.dumps(doc, indent=2))
        return
    report.print_results(console, f"{scn.name} (seed {scn.seed})", results)
    for r in results:
        console.print(report.pool_table(f"where the money went: {r.policy}", r))
    if whatif:
        console.print("delta (whatif - baseline):",
                      _delta(results[0].metrics, results[1].metrics))


def _warn_fixed_weights(model: ActorCritic | None) -> list[str]:
    """Print (stderr) where the checkpoint's recorded fixed weights differ from today's."""
    warnings = list(model.fixed_weights_warnings()) if model is not None else []
    err = Console(stderr=True)
    for w in warnings:
        err.print(f"[yellow]warning:[/] checkpoint: {w}", soft_wrap=True)
    return warnings


def _delta(a: dict[str, object], b: dict[str, object]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, va in a.items():
        vb = b.get(k)
        if isinstance(va, int | float) and isinstance(vb, int | float):
            out[k] = round(float(vb) - float(va), 4)
    return out


def train(
    scenario: Annotated[list[Path] | None, typer.Option(
        help="optional scenario(s) mixed into the randomized training set")] = None,
    minutes: Annotated[float, typer.Option(help="wall-clock training budget")] = 3.0,
    seed: Annotated[int, typer.Option(help="seed: same seed, same checkpoint")] = 0,
    out: Annotated[Path, typer.Option(help="where to write the checkpoint")] = Path(
        "policy.pt"),
    episodes: Annotated[int | None, typer.Option(
        help="exact episode count instead of the time budget (bit-for-bit reproducible)")] = None,
    tune_trials: Annotated[int, typer.Option(
        help="optuna TPE trials tuning the reward weights against the operator target")] = 0,
    target: Annotated[Path | None, typer.Option(
        help="operator target TOML (default config/scenarios/operator_target.toml)")] = None,
    jobs: Annotated[int, typer.Option(
        min=1, max=64, help="rollout processes (an update's episodes run in parallel)")] = 1,
    lr: Annotated[float, typer.Option(min=1e-6, max=0.1, help="Adam learning rate")] = 3e-4,
    start: Annotated[Path | None, typer.Option(
        help="continue training from this checkpoint (its metadata is kept)")] = None,
    data: Annotated[Path | None, typer.Option(
        help="shared/data folder: draw most episodes from windows of its real traces")] = None,
    trace_share: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="share of episodes drawn from the real traces (with --data)")
    ] = 0.75,
    reward_weights: Annotated[str | None, typer.Option(
        help="reward weights, e.g. 'cost=1,slo=1,xzone=0.1,queue=0.1,gpu=0.1' (the rest "
             "default; --tune-trials tunes them instead)")] = None,
    algorithm: Annotated[str, typer.Option(
        help="ppo (per-decision rewards vs lp) or es (whole episodes in antithetic pairs, "
             "the actor heads' last layers; docs/twin.md 'The policy')")] = "ppo",
    es_pairs: Annotated[int, typer.Option(
        min=1, max=256, help="es: antithetic pairs (scenarios) per iteration")] = 8,
    es_sigma: Annotated[float, typer.Option(
        min=1e-4, max=10.0, help="es: noise scale of the parameter perturbations")] = 0.1,
    es_freeze: Annotated[str | None, typer.Option(
        help="es: comma-separated actions left at their start (the fixed weights from a "
             "fresh model), e.g. 'cluster_bias_usd_per_hour,spot_bias_usd_per_hour'")] = None,
    es_held_out: Annotated[int, typer.Option(
        min=1, max=2, help="es: held-out drafts of each kind that pick the result (1: six "
             "drafts, 2: twelve, about an eighth more episodes)")] = 1,
) -> None:
    """Train the actor-critic policy in the twin on randomized scenarios (PPO+GAE, or ES
    with --algorithm es). CPU only."""
    from broker.sim.rollout import RewardWeights
    from broker.sim.scenario import ScenarioError
    from broker.sim.train import TrainConfig, load_target, train_policy

    if data is not None and not (data / "traces").is_dir():
        raise _fail(f"--data {data}: no traces/ folder there (the shared/data layout)")
    try:
        tgt = load_target(target)
        weights = RewardWeights.parse(reward_weights) if reward_weights else RewardWeights()
        cfg = TrainConfig(minutes=minutes, seed=seed, scenarios=tuple(scenario or ()),
                          tune_trials=tune_trials, target=tgt, episodes=episodes, jobs=jobs,
                          lr=lr, start=start, data=data, trace_share=trace_share,
                          weights=weights, algorithm=algorithm, es_pairs=es_pairs,
                          es_sigma=es_sigma, es_freeze=_freeze(es_freeze),
                          es_held_out=es_held_out)
        summary = train_policy(cfg, out)
    except (ScenarioError, ValueError) as exc:
        raise _fail(str(exc)) from None
    Console().print(summary)


def _freeze(text: str | None) -> tuple[str, ...]:
    """--es-freeze's action names (checked against the actions by es.free_mask)."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


@policy_app.command("rules")
def rules(
    scenario: Annotated[Path | None, typer.Option(
        help="scenario to collect visited states from (default: randomized scenarios)")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="policy checkpoint")] = None,
    depth: Annotated[int, typer.Option(help="surrogate tree depth")] = 3,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Fit a shallow decision-tree surrogate to the policy's outputs and print its rules."""
    from broker.sim.explain import surrogate_rules
    from broker.sim.runner import load_model, stdout_to_stderr

    model = load_model(checkpoint)
    if model is None:
        raise _fail("no policy checkpoint: the fixed weights have no rules to explain")
    warnings = _warn_fixed_weights(model)
    with stdout_to_stderr(as_json):
        result = surrogate_rules(model, scenario=scenario, depth=depth)
    if warnings:
        result["checkpoint_warnings"] = warnings
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    console = Console()
    outputs = result["outputs"]
    if not isinstance(outputs, dict):
        raise _fail("surrogate fit returned no outputs")
    for out_name, info in outputs.items():
        console.print(f"[bold]{out_name}[/]  fidelity R^2 = {info['r2']:.3f} "
                      f"(held-out, {result['states']} visited states)")
        console.print(info["rules"])


@policy_app.command("leverage")
def leverage(
    scenario: Annotated[Path, typer.Option(help="scenario.toml to replay (see SCENARIO.md)")],
    checkpoint: Annotated[str | None, typer.Option(
        help="policy checkpoint (default: the shipped one)")] = None,
    decision_interval_s: Annotated[float, typer.Option(
        min=1.0, max=86400.0, help="seconds between the policy's decisions (as bench twin)")
    ] = 300.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Replay a scenario with the policy's mean action: how far its actions spread, and in
    what fraction of epochs they change a decision against the fixed weights."""
    from broker.sim.explain import leverage as measure
    from broker.sim.runner import load_model, stdout_to_stderr
    from broker.sim.scenario import ScenarioError, load_scenario
    from providers.catalog import Catalog

    model = load_model(checkpoint)
    if model is None:
        raise _fail("no policy checkpoint: the fixed weights have no leverage to measure")
    warnings = _warn_fixed_weights(model)
    catalog = Catalog.load()
    try:
        scn = load_scenario(scenario, catalog)
    except (ScenarioError, ValueError) as exc:
        raise _fail(str(exc)) from None
    with stdout_to_stderr(as_json):
        result = measure(model, scn, catalog, decision_interval_s=decision_interval_s)
    if warnings:
        result["checkpoint_warnings"] = warnings
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    console = Console()
    console.print(f"[bold]{scn.name}[/]: {result['states']} visited states, "
                  f"{result['epochs']} epochs, decisions changed in "
                  f"{float(result['decisions_changed_frac']):.1%} of epochs")  # type: ignore[arg-type]
    spread = result["action_spread"]
    if isinstance(spread, dict):
        for name, (lo, hi) in spread.items():
            console.print(f"  {name}: {lo} .. {hi}")


def register(app: typer.Typer) -> None:
    """Mount this module's commands on the root app."""
    app.command("sim")(sim)
    app.command("train")(train)
    app.add_typer(policy_app, name="policy", help="The RL policy: surrogate rules, leverage.")
