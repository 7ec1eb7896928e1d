"""`skyfed bench twin`: every policy on one scenario, same seed, one run (SCENARIO.md table)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

DEFAULT_POLICIES = "traditional,greedy,lp,lp+rl"


def twin(
    scenario: Annotated[Path, typer.Option(help="scenario.toml (see SCENARIO.md)")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    plot: Annotated[Path | None, typer.Option(help="write PNG charts into this folder")] = None,
    policies: Annotated[str, typer.Option(help="comma-separated policies")] = DEFAULT_POLICIES,
    checkpoint: Annotated[str | None, typer.Option(
        help="policy checkpoint for lp+rl (default: shipped; 'none': fixed weights)")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Run traditional, greedy, lp and lp+rl on the scenario and compare SCENARIO.md's metrics."""
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
    from providers.catalog import Catalog

    names = [p.strip() for p in policies.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    err = Console(stderr=True)
    if bad:
        err.print(f"[red]error:[/] unknown policies {bad}; choose from {POLICIES}")
        raise typer.Exit(code=2)
    catalog = Catalog.load()
    try:
        scn = load_scenario(scenario, catalog)
    except ScenarioError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    model = load_model(checkpoint) if "lp+rl" in names else None
    results: list[RunResult] = []
    with stdout_to_stderr(as_json), RichProgress() as bar:
        for name in names:
            cb = bar.task(f"{scn.name} {name}", scn.horizon_s) if progress else None
            results.append(run_policy(scn, name, catalog, model=model, progress=cb))
    if plot is not None:
        for path in report.plot(plot, scn.name, results):
            err.print(f"wrote {path}")
    if as_json:
        typer.echo(report.bench_json(scn.name, scn.seed, results))
        return
    report.print_results(Console(), f"{scn.name} (seed {scn.seed}, {len(scn.events)} events, "
                         f"{len(scn.clusters)} clusters)", results)


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("twin")(twin)
