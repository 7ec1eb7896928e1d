"""Tables, JSON and charts of twin runs (rich, json, matplotlib Agg). Output only; no logic."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from broker.sim.metrics import METRIC_KEYS
from broker.sim.runner import RunResult
from broker.sim.stats import PolicySummary


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if 0 < abs(v) < 0.001:  # SLO fractions: 0.000 would hide a real difference
            return f"{v:.2g}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def table(title: str, results: Sequence[RunResult]) -> Table:
    """Metrics as rows, policies as columns (fits a terminal with four policies)."""
    t = Table(title=title)
    t.add_column("metric", style="bold")
    for r in results:
        t.add_column(r.policy, justify="right")
    for k in METRIC_KEYS:
        t.add_row(k, *(_cell(r.metrics.get(k)) for r in results))
    return t


# Metrics.pool_costs' keys, in the table's order.
POOL_COLUMNS = ("cluster", "pool", "usd", "node_h", "utilization_cpu", "utilization_gpu")


def pool_costs(result: RunResult) -> list[dict[str, object]]:
    """The run's cost per pool, most expensive first (Metrics.pool_costs)."""
    return result.engine.metrics.pool_costs() if result.engine is not None else []


def pool_table(title: str, result: RunResult, top: int = 10) -> Table:
    """The `top` most expensive pools of a run, and the rest as one row."""
    rows = pool_costs(result)
    t = Table(title=title)
    for name in POOL_COLUMNS:
        t.add_column(name, justify="left" if name in ("cluster", "pool") else "right")
    for r in rows[:top]:
        t.add_row(*(_cell(r[k]) for k in POOL_COLUMNS))
    rest = rows[top:]
    if rest:
        usd = sum(v for r in rest if isinstance(v := r["usd"], int | float))
        t.add_row(f"{len(rest)} more pools", "", _cell(usd), "", "", "")
    return t


def print_results(console: Console, title: str, results: Sequence[RunResult]) -> None:
    console.print(table(title, results))
    for r in results:
        for note in r.notes:
            console.print(f"[yellow]note[/] {r.policy}: {note}")


def seeds_table(title: str, summaries: Mapping[str, PolicySummary], seeds: int) -> Table:
    """Metrics as rows, policies as columns: mean, and +- the 95 % half-width over seeds."""
    t = Table(title=title)
    t.add_column("metric", style="bold")
    for name in summaries:
        t.add_column(name, justify="right")
    for k in METRIC_KEYS:
        row = []
        for s in summaries.values():
            cell = _cell(s.mean.get(k))
            ci = s.ci95.get(k)
            mean = s.mean.get(k)
            if ci is not None and isinstance(mean, int | float):
                cell += f" ± {_cell(float(ci[1]) - float(mean))}"
            row.append(cell)
        t.add_row(k, *row)
    if seeds > 1:
        t.caption = ("± = half-width of the Student-t 95 % interval over "
                     f"{seeds} seeds; 'better' = paired-t 95 % interval of the difference")
    return t


def better_lines(summaries: Mapping[str, PolicySummary]) -> list[str]:
    """One line per policy: the policies it beats, per metric (stats.better, paired-t)."""
    lines = []
    for name, s in summaries.items():
        parts = [f"{metric} ({', '.join(others)})" for metric, others in s.better_than.items()]
        lines.append(f"{name} better than: " + ("; ".join(parts) if parts else "-"))
    return lines


def print_seeds(console: Console, title: str, summaries: Mapping[str, PolicySummary],
                seeds: int, notes: Mapping[str, Sequence[str]],
                duration_mape: float | None) -> None:
    console.print(seeds_table(title, summaries, seeds))
    mape = "-" if duration_mape is None else f"{duration_mape:.3f}"
    console.print(f"duration_prediction_mape: {mape} (same predictions for every policy)")
    if seeds > 1:
        for line in better_lines(summaries):
            console.print(line)
    for policy, ns in notes.items():
        for note in ns:
            console.print(f"[yellow]note[/] {policy}: {note}")


def bench_json(scenario: str, seeds: Sequence[int], summaries: Mapping[str, PolicySummary],
               notes: Mapping[str, Sequence[str]], duration_mape: float | None) -> str:
    """SCENARIO.md's `bench twin --json`: every metric key as before (the mean over seeds),
    plus `seeds`, `duration_prediction_mape` and, with more than one seed, `ci95`,
    `better_than` and `per_seed` per policy."""
    policies: dict[str, dict[str, object]] = {}
    for name, s in summaries.items():
        entry: dict[str, object] = dict(s.mean)
        if len(seeds) > 1:
            entry["ci95"] = s.ci95
            entry["better_than"] = s.better_than
            entry["per_seed"] = s.per_seed
        policies[name] = entry
    doc: dict[str, object] = {
        "scenario": scenario, "seed": seeds[0], "seeds": list(seeds),
        "duration_prediction_mape": None if duration_mape is None else round(duration_mape, 4),
        "policies": policies,
    }
    if any(notes.values()):
        doc["notes"] = {k: list(v) for k, v in notes.items() if v}
    return json.dumps(doc, indent=2)


def plot(directory: Path, scenario: str, results: Sequence[RunResult]) -> list[Path]:
    """PNG charts of cumulative cost and utilisation over simulated time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    charts: Mapping[str, tuple[str, str]] = {
        "cost": ("cost_usd", "cumulative cost (USD)"),
        "utilization_cpu": ("utilization_cpu", "CPU utilisation (requested / provisioned)"),
        "utilization_gpu": ("utilization_gpu", "GPU utilisation (requested / provisioned)"),
    }
    for name, (key, ylabel) in charts.items():
        fig, ax = plt.subplots(figsize=(8, 4))
        for r in results:
            xs = [p["t_s"] / 3600.0 for p in r.series]
            ax.plot(xs, [p[key] for p in r.series], label=r.policy)
        ax.set_xlabel("simulated hours")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{scenario}: {ylabel}")
        ax.legend()
        ax.grid(alpha=0.3)
        path = directory / f"{scenario}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
