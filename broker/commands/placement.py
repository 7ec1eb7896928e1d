"""`skyfed explain ID` and `skyfed whatif ID --cluster X`: placement decisions, from the API.

ID is a placement id or a workload id (its active placement is used). Output
is a short human summary, or the full record with `-o json|yaml`. `explain
--policy` adds SHAP attributions of the RL policy's outputs (headroom, prewarm
lead, bias of the chosen clusters) for the state the placement was decided on.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from broker.commands.core import (
    ConfigOpt,
    OutputOpt,
    ServerOpt,
    TokenOpt,
    _client,
    _run,
)

IdArg = Annotated[str, typer.Argument(metavar="ID", help="Placement id or workload id.")]


def _emit(obj: Any, output: str) -> None:
    if output == "yaml":
        import yaml

        typer.echo(yaml.safe_dump(obj, sort_keys=False))
    else:
        typer.echo(json.dumps(obj, indent=2, default=str))


def _placement_id(c: Any, ident: str) -> str:
    """Accept a workload id too: use its active placement."""
    try:
        w = c.request("GET", f"/v1/workloads/{ident}")
    except Exception:  # noqa: BLE001 - not a workload id: treat it as a placement id
        return ident
    pid = (w.get("status") or {}).get("placementId")
    return str(pid) if pid else ident


def _explain_lines(out: dict[str, Any]) -> list[str]:
    d = out.get("decision") or {}
    lines = [f"placement {out['placementId']} of workload {out['workloadId']}: "
             f"{d.get('placed', '?')}/{d.get('replicas', '?')} replicas, "
             f"{out.get('costUsdPerHour', 0):.4f} USD/h"]
    for ch in d.get("chosen", []):
        cost = ch["cost_usd"]
        lines.append(f"  chosen {ch['option']} ({ch['pricing']}) x{ch['replicas']}: "
                     f"compute {cost['compute']} + egress {cost['egress']} + latency "
                     f"{cost['latency']} + bias {cost['bias']} = {cost['total']} USD")
    ru = d.get("runner_up")
    if ru:
        lines.append(f"  runner-up {ru['option']}: {ru['cost_usd']['total']} USD "
                     f"(+{ru['difference_usd']}), kept out by {ru['kept_out_by']}")
    for b in d.get("binding", []):
        if "shadow_price_usd" in b:
            lines.append(f"  binding {b['family']} {b['row']}: shadow price "
                         f"{b['shadow_price_usd']} USD")
    if d.get("infeasible"):
        lines.append("  ruled out: " + ", ".join(f"{k} {v}" for k, v in d["infeasible"].items()))
    if d.get("unplaced_reason"):
        lines.append(f"  unplaced: {d['unplaced_reason']}")
    pa = d.get("policy_action")
    if pa:
        steer = (f"checkpoint {pa.get('checkpoint')} (sha256 {pa.get('sha256')})"
                 if pa.get("source") == "checkpoint" else f"{pa.get('source')} weights")
        bias = ", ".join(f"{c} {b:+.4f}" for c, b in (pa.get("bias_usd_per_hour") or {}).items())
        lines.append(f"  policy: {steer}; headroom {pa.get('headroom')}, prewarm lead "
                     f"{pa.get('prewarm_lead_s')} s, bias USD/h: {bias or 'none'}")
        if pa.get("fallback"):
            lines.append(f"  policy fell back to fixed weights: {pa['fallback']}")
    return lines + _policy_lines(out.get("policyExplanation"))


def _policy_lines(pe: dict[str, Any] | None) -> list[str]:
    if pe is None:
        return []
    if not pe.get("available"):
        return [f"  policy attributions: not available ({pe.get('reason')})"]
    lines = ["  policy attributions (SHAP vs. clusters at their mean and the usual batch):"]
    for name, o in (pe.get("outputs") or {}).items():
        lines.append(f"    {name} = {o['value']} (baseline {o['baseline']})")
        lines.extend(f"      {t['shap']:+.5f}  {t['feature']}" for t in o["top_features"])
    return lines


def register(app: typer.Typer) -> None:
    """Mount this module's commands on the root app."""

    @app.command("explain")
    def explain(ident: IdArg, config: ConfigOpt = None, server: ServerOpt = None,
                token: TokenOpt = None, output: OutputOpt = "table",
                policy: Annotated[bool, typer.Option(
                    "--policy", help="Add SHAP attributions of the RL policy's outputs.")
                ] = False) -> None:
        """Why a placement went where it went (decision record)."""
        query = "?policy=true" if policy else ""
        with _client(config, server, token) as c:
            pid = _run(lambda: _placement_id(c, ident))
            out = _run(lambda: c.request("GET", f"/v1/placements/{pid}/explain{query}"))
        if output == "table":
            typer.echo("\n".join(_explain_lines(out)))
        else:
            _emit(out, output)

    @app.command("whatif")
    def whatif(ident: IdArg,
               cluster: Annotated[str, typer.Option("--cluster", help="Cluster to force.")],
               config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
               output: OutputOpt = "table") -> None:
        """Re-solve with the workload forced onto a cluster and show the difference."""
        with _client(config, server, token) as c:
            pid = _run(lambda: _placement_id(c, ident))
            out = _run(lambda: c.request("POST", f"/v1/placements/{pid}/whatif",
                                         json={"cluster": cluster}))
        if output != "table":
            _emit(out, output)
            return
        before, after = out["before"], out["after"]
        typer.echo(f"workload {out['workload']} forced onto {cluster}:")
        typer.echo(f"  now:    {before.get('clusters')} {before.get('cost_usd_per_hour')} USD/h "
                   f"rtt {before.get('rtt_ms')} ms")
        typer.echo(f"  forced: {after.get('clusters')} {after.get('cost_usd_per_hour')} USD/h "
                   f"rtt {after.get('rtt_ms')} ms")
        typer.echo(f"  delta:  {out['delta_cost_usd_per_hour']} USD/h, objective "
                   f"{out['delta_objective_usd']} USD, rtt {out['delta_rtt_ms']} ms")
        if out.get("forced_infeasible"):
            typer.echo(f"  not allowed there: {', '.join(out.get('forbidden_by') or [])} "
                       f"({after.get('unplaced_reason')})")
        if out.get("others_moved"):
            typer.echo(f"  others moved: {', '.join(out['others_moved'])}")
