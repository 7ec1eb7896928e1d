"""Tables, JSON and charts of twin runs (rich, json, matplotlib Agg). Output only; no logic."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from broker.sim.metrics import METRIC_KEYS
from broker.sim.runner import RunResult


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
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


def print_results(console: Console, title: str, results: Sequence[RunResult]) -> None:
    console.print(table(title, results))
    for r in results:
        for note in r.notes:
            console.print(f"[yellow]note[/] {r.policy}: {note}")


def bench_json(scenario: str, seed: int, results: Sequence[RunResult]) -> str:
    doc: dict[str, object] = {
        "scenario": scenario, "seed": seed,
        "policies": {r.policy: r.metrics for r in results},
    }
    notes = {r.policy: r.notes for r in results if r.notes}
    if notes:
        doc["notes"] = notes
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
