"""`skyfed bench twin`: policies x seeds on one scenario, means with 95 % intervals (SCENARIO.md).

The trace stays fixed; seeds `seed, seed+1, ...` vary the twin's random parts
(broker/sim/realize.py). Every policy runs every seed, so comparisons are paired
(broker/sim/stats.py). Several runs of a large scenario go to parallel processes (`--jobs`;
default one per core, at most one per run, in-process below 2,000 events where a worker's
start-up costs more than it saves; broker/sim/seeds.py).

Policies are the engine's (`broker.sim.engine.POLICIES`): a policy added there is known
here and in the default set, with no change to this file.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def _policies(raw: str | None, known: tuple[str, ...]) -> list[str]:
    """The --policies list; unknown names are an error that lists the known ones."""
    names = list(known) if raw is None else [p.strip() for p in raw.split(",") if p.strip()]
    bad = [p for p in names if p not in known]
    if bad or not names:
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error:[/] --policies: unknown {', '.join(bad) or '(empty list)'}; "
            f"known policies: {', '.join(known)}")
        raise typer.Exit(code=2)
    return list(dict.fromkeys(names))


def twin(
    scenario: Annotated[Path, typer.Option(help="scenario.toml (see SCENARIO.md)")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    plot: Annotated[Path | None, typer.Option(
        help="write PNG charts (first seed) into this folder")] = None,
    policies: Annotated[str | None, typer.Option(
        help="comma-separated policies (default: all the twin knows)")] = None,
    seeds: Annotated[int, typer.Option(
        min=1, max=1000, help="run each policy over seeds seed, seed+1, ... (95 % intervals)")
    ] = 1,
    seed: Annotated[int | None, typer.Option(
        min=0, max=2**31 - 1, help="first seed (default: the scenario's `seed`)")] = None,
    jobs: Annotated[int | None, typer.Option(
        min=1, max=256,
        help="parallel processes (default: cores, at most one per run; 1 under 2,000 events)")
    ] = None,
    checkpoint: Annotated[str | None, typer.Option(
        help="policy checkpoint for lp+rl (default: shipped; 'none': fixed weights)")] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Run the policies over seeds and compare SCENARIO.md's metrics (mean ± 95 % interval)."""
    from broker.sim import report
    from broker.sim.engine import POLICIES
    from broker.sim.runner import RichProgress, RunResult, stdout_to_stderr
    from broker.sim.scenario import ScenarioError, load_scenario
    from broker.sim.seeds import default_jobs, plan_runs, run_all
    from broker.sim.stats import summarize
    from providers.catalog import Catalog

    names = _policies(policies, POLICIES)
    err = Console(stderr=True)
    catalog = Catalog.load()
    try:
        scn = load_scenario(scenario, catalog)
    except ScenarioError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(code=2) from None
    first = scn.seed if seed is None else seed
    specs = plan_runs(names, first, seeds)
    workers = jobs or default_jobs(len(specs), len(scn.events))
    with stdout_to_stderr(as_json), RichProgress() as bar:
        runs = run_all(scn, specs, catalog, checkpoint=checkpoint, jobs=workers,
                       progress=bar if progress else None)
    by_policy = {n: [r.metrics for r in runs if r.spec.policy == n] for n in names}
    summaries = summarize(by_policy)
    notes = {n: sorted({note for r in runs if r.spec.policy == n for note in r.notes})
             for n in names}
    mapes = [r.duration_prediction_mape for r in runs
             if r.spec.policy == names[0] and r.duration_prediction_mape is not None]
    mape = statistics.fmean(mapes) if mapes else None
    if plot is not None:
        firsts = [RunResult(r.spec.policy, r.metrics, r.series, r.notes)
                  for r in runs if r.spec.seed == first]
        for path in report.plot(plot, scn.name, firsts):
            err.print(f"wrote {path}")
    seed_list = list(range(first, first + seeds))
    if as_json:
        typer.echo(report.bench_json(scn.name, seed_list, summaries, notes, mape))
        return
    # Piped output is not cut to 80 columns: five policies of "mean ± hw" need ~150.
    out = Console() if sys.stdout.isatty() else Console(width=200)
    report.print_seeds(out, f"{scn.name} (seeds {seed_list[0]}..{seed_list[-1]}, "
                       f"{len(scn.events)} events, {len(scn.clusters)} clusters, "
                       f"{workers} process(es))", summaries, seeds, notes, mape)


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("twin")(twin)
