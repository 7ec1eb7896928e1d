"""What `skyfed demo` prints: rich tables and one-line steps, nothing else.

Kept apart from the orchestration so the narration reads top to bottom in
runner.py and every table here is a pure function of values (testable without
a broker). Lines that say a step was skipped start with `SKIPPED:` so a test
(and a reader) can find them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from broker.demo.compare import PolicyResult, saving_frac


@dataclass(frozen=True, slots=True)
class PlacementRow:
    workload: str
    kind: str
    status: str
    provider: str
    where: str  # region or edge site
    pool: str
    replicas: int
    usd_per_hour: float | None
    rtt_ms: float | None
    slo_ms: float | None
    placement_id: str | None = None


def step(console: Console, n: int | str, title: str) -> None:
    console.rule(f"[bold]{n}. {title}")


def skipped(console: Console, what: str, why: str) -> None:
    console.print(f"[yellow]SKIPPED:[/] {what}: {why}")


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def placement_table(rows: Sequence[PlacementRow], *,
                    title: str = "Placements (live broker, LP policy)") -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in [("workload", "left"), ("kind", "left"), ("status", "left"),
                      ("provider", "left"), ("region / site", "left"), ("pool", "left"),
                      ("replicas", "right"), ("USD/hour", "right"), ("RTT to users", "right")]:
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    total = 0.0
    for r in rows:
        if r.usd_per_hour is not None:
            total += r.usd_per_hour
        rtt = "-" if r.rtt_ms is None else f"{r.rtt_ms:.1f} ms"
        if r.rtt_ms is not None and r.slo_ms is not None:
            rtt += f" <= {r.slo_ms:g}"
        t.add_row(r.workload, r.kind, r.status, r.provider or "-", r.where or "-", r.pool or "-",
                  str(r.replicas) if r.replicas else "-", _fmt(r.usd_per_hour, 3), rtt)
    t.add_section()
    t.add_row("total", "", "", "", "", "", "", _fmt(total, 2), "")
    return t


def comparison_table(results: Mapping[str, PolicyResult], *,
                     title: str = "Same batch, same snapshot: LP vs the baselines") -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("policy", "USD/hour", "batch cost USD", "LP saves vs it", "placed",
                "unplaced", "SLO missed", "decide ms"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in results.items():
        s = saving_frac(results, name) if name != "lp" else None
        t.add_row(name, _fmt(r.usd_per_hour, 2), _fmt(r.objective, 2),
                  "-" if s is None else f"{100 * s:.1f} %", str(r.placed), str(r.unplaced),
                  str(r.slo_missed), _fmt(r.decide_ms, 1))
    return t


def comparison_caption() -> str:
    return ("batch cost = what the planner minimises for this batch: compute over each "
            "job's run time (services: 1 h) + one-off data egress + latency penalty "
            "+ a charge per node the plan opens (its price over boot + billing minimum or "
            "the work, up to 1 h) (+ a penalty per unplaced workload). traditional divides "
            "replicas as Karmada does, the residual ones by a weighted draw seeded by each "
            "workload's id: the broker's ids differ per run, so its row may too")


def explanation_lines(rec: Mapping[str, Any]) -> list[str]:
    """A decision record (broker/placement/explain.py) as a few readable lines."""
    out: list[str] = []
    chosen = rec.get("chosen")
    if isinstance(chosen, list) and chosen:
        for c in chosen:
            cost = c.get("cost_usd", {})
            parts = ", ".join(f"{k} {v:,.2f}" for k, v in cost.items()
                              if isinstance(v, int | float) and k != "total")
            out.append(f"chosen: {c.get('option')} x{c.get('replicas')} "
                       f"({c.get('pricing')}, {_fmt(c.get('usd_per_hour'), 3)} USD/h) "
                       f"cost {_fmt(cost.get('total'))} USD = {parts}")
    ru = rec.get("runner_up")
    if isinstance(ru, Mapping) and ru:
        total = ru.get("cost_usd", {}).get("total") if isinstance(ru.get("cost_usd"),
                                                                  Mapping) else None
        why = f", kept out by {ru['kept_out_by']}" if ru.get("kept_out_by") else ""
        out.append(f"runner-up: {ru.get('option')} cost {_fmt(total)} USD "
                   f"(difference {_fmt(ru.get('difference_usd'))} USD{why})")
    binding = rec.get("binding")
    if isinstance(binding, list) and binding:
        items = []
        for b in binding[:4]:
            price = b.get("shadow_price_usd", b.get("marginal_replica_usd"))
            items.append(f"{b.get('family')} {b.get('row')} ({_fmt(price, 3)} USD)")
        out.append("binding constraints: " + "; ".join(items))
    infeasible = rec.get("infeasible")
    if isinstance(infeasible, Mapping) and infeasible:
        out.append("options ruled out: " + ", ".join(f"{k} {v}" for k, v in infeasible.items()))
    solver = rec.get("solver")
    if isinstance(solver, Mapping):
        out.append(f"solver: {solver.get('status')}, gap {_fmt(solver.get('gap'), 4)}, "
                   f"from {solver.get('source')}")
    return out


def next_steps(console: Console, *, url: str | None, data_dir: str, token_file: str | None,
               elapsed_s: float, serve: bool, token: str = "") -> None:
    console.print(f"demo finished in {elapsed_s:.1f} s.")
    console.print("Where to look next:")
    if serve and url:
        # A throwaway token of a throwaway broker on loopback: printing it is the point.
        shown = token or f"(see {token_file})"
        console.print(f"  dashboard:   {url}/ui   token: {shown}")
        console.print(f"  API docs:    {url}/docs    metrics: {url}/metrics")
    else:
        console.print("  skyfed demo --serve       keep it running, with the dashboard at /ui")
    console.print("  skyfed serve              the broker on your own config (config/skyfed.toml)")
    console.print("  skyfed bench placement    LP vs greedy vs traditional at scale")
    console.print("  skyfed bench failover     edge failover timings with 50 agents")
    console.print("  skyfed bench twin         the digital twin: traditional/greedy/lp/lp+rl")
    console.print("  docs/operations.md        from zero to PostgreSQL, real clusters, edge sites")
    console.print(f"  data of this run:         {data_dir}")


def whatif_lines(d: Mapping[str, Any]) -> list[str]:
    """A what-if answer (broker/placement/explain.py::whatif) as a few lines."""
    if isinstance(d.get("whatif"), Mapping):
        d = d["whatif"]
    before, after = d.get("before") or {}, d.get("after") or {}
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return [str(dict(d))[:600]]
    out = [f"now:    {', '.join(before.get('clusters') or []) or 'unplaced'} "
           f"{_fmt(before.get('cost_usd_per_hour'), 3)} USD/h",
           f"forced: {', '.join(after.get('clusters') or []) or 'unplaced'} "
           f"{_fmt(after.get('cost_usd_per_hour'), 3)} USD/h"]
    delta = f"difference: {_fmt(d.get('delta_cost_usd_per_hour'), 3)} USD/h, " \
            f"{_fmt(d.get('delta_objective_usd'))} USD on the batch"
    if d.get("delta_rtt_ms") is not None:
        delta += f", RTT {_fmt(d.get('delta_rtt_ms'), 1)} ms"
    out.append(delta)
    if d.get("others_moved"):
        out.append(f"other workloads that would move: {', '.join(d['others_moved'])}")
    if d.get("forced_infeasible"):
        out.append(f"infeasible there: {', '.join(d.get('forbidden_by') or []) or 'unknown'}")
    return out


def data_lines(moves: Sequence[tuple[str, float, str, str, float, float]]) -> list[str]:
    """(workload, GB, from, to, USD egress, hours to move) as one line each."""
    out = []
    for name, gb, src, dst, usd, hours in moves:
        if usd <= 0 and src == dst:
            out.append(f"{name}: {gb:g} GB already in {src}: placed next to it, nothing to move")
        else:
            out.append(f"{name}: {gb:g} GB {src} -> {dst}: {usd:,.2f} USD egress, "
                       f"~{hours * 60:,.0f} min to prewarm before start")
    return out
