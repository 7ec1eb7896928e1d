"""`skyfed bench drafts`: policies on held-out trace drafts, paired per draft (sim/drafts.py).

`bench twin` varies a shipped scenario's random parts; this varies the scenario itself:
`--drafts` scenarios drawn from the real traces (`--data`, the shared/data folder), none a
window a shipped scenario replays, by default at seeds no held-out set uses. The first policy
of `--policies` is compared with each other one, per kind and over all drafts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from broker.bench.twin import _policies

DEFAULT_POLICIES = "lp,greedy,karpenter,traditional"
COLUMNS = (("cost_usd", 2, " %"), ("cost_with_unfinished_usd", 2, " %"),
           ("slo_violation_frac", 4, ""), ("user_rtt_ms_mean", 1, " ms"))


def _cell(c: dict[str, float | int | None], digits: int, unit: str) -> str:
    mean, low, high, n = c["mean"], c["low"], c["high"], c["n"]
    if mean is None:
        return "-"
    text = f"{mean:+.{digits}f}{unit}"
    if low is not None and high is not None:
        text += f" [{low:+.{digits}f}, {high:+.{digits}f}]"
    return f"{text} ({c['first_worse']}/{n})"


def drafts(
    data: Annotated[Path, typer.Option(
        help="the shared/data folder (its traces/ are drafted from)")],
    count: Annotated[int, typer.Option(
        "--drafts", min=1, max=1000, help="how many drafts (kinds in turn)")] = 40,
    first_seed: Annotated[int | None, typer.Option(
        min=0, max=2**31 - 1, help="seed of the first draft (default: held out, 9200000)")
    ] = None,
    horizon_s: Annotated[float, typer.Option(
        min=600.0, max=86400.0, help="each draft's simulated seconds")] = 7200.0,
    policies: Annotated[str, typer.Option(
        help="comma-separated policies; the first is compared with each other one")
    ] = DEFAULT_POLICIES,
    jobs: Annotated[int, typer.Option(min=1, max=256, help="parallel processes")] = 2,
    checkpoint: Annotated[str | None, typer.Option(
        help="policy checkpoint for lp+rl (default: shipped; 'none': fixed weights)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    progress: Annotated[bool, typer.Option(help="show progress")] = True,
) -> None:
    """Compare policies on held-out trace drafts, paired per draft (mean ± 95 % interval)."""
    from broker.sim import drafts as sim_drafts
    from broker.sim.engine import POLICIES
    from broker.sim.runner import stdout_to_stderr

    names = _policies(policies, POLICIES)
    err = Console(stderr=True, soft_wrap=True)
    if len(names) < 2:
        err.print("[red]error:[/] --policies: give at least two (the first is compared "
                  "with the others)")
        raise typer.Exit(code=2)
    if not (data / "traces").is_dir():
        err.print(f"[red]error:[/] --data {data}: no traces/ folder there "
                  "(the shared/data layout)")
        raise typer.Exit(code=2)
    first = sim_drafts.HELD_OUT_FIRST_SEED if first_seed is None else first_seed
    tasks = sim_drafts.plan(first, count, names)
    finished = [0]

    def done(_: sim_drafts.DraftRun) -> None:
        finished[0] += 1
        if progress:
            err.print(f"{finished[0]}/{len(tasks)} runs", end="\r")

    try:
        with stdout_to_stderr(as_json):
            runs = sim_drafts.run_all(tasks, data, horizon_s=horizon_s, checkpoint=checkpoint,
                                      jobs=jobs, done=done)
    except OSError as exc:  # a trace file missing or unreadable under --data
        err.print(f"[red]error:[/] --data {data}: {exc}")
        raise typer.Exit(code=2) from None
    if progress:
        err.print()
    table = sim_drafts.summarize(runs, names)
    seeds = [first, first + count - 1]
    if as_json:
        typer.echo(json.dumps({
            "first": names[0], "seeds": seeds, "horizon_s": horizon_s,
            "paired": table,
            "runs": [{"seed": r.seed, "kind": r.kind, "policy": r.policy,
                      **{k: r.metrics.get(k) for k in sim_drafts.RATIO_KEYS
                         + sim_drafts.DIFF_KEYS}} for r in runs],
        }, indent=2))
        return
    out = Console() if sys.stdout.isatty() else Console(width=200)
    t = Table(title=f"{names[0]} against each policy on {count} trace drafts (seeds "
                    f"{seeds[0]}..{seeds[1]}): cost 100 x log({names[0]} / other), the rest "
                    f"{names[0]} - other; mean [95 %] ({names[0]} worse in / drafts)")
    t.add_column("against")
    t.add_column("kind")
    for key, _, _ in COLUMNS:
        t.add_column(key, justify="right")
    for other, by_kind in table.items():
        for kind, cells in by_kind.items():
            t.add_row(other, kind, *(_cell(cells[key], d, u) for key, d, u in COLUMNS))
    out.print(t)


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
    app.command("drafts")(drafts)
