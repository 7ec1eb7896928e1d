"""`skyfed catalog ...`: browse the offline catalog (providers/catalog.py).

Output is a rich table by default or JSON with ``-o json`` (machine-readable, stable keys).
Unknown provider/region/GPU prints one line naming it and exits 2.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from providers.errors import NotFoundError

app = typer.Typer(no_args_is_help=True)

OutputOpt = typer.Option("table", "--output", "-o", help="table | json")


def _fail(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2)


def _check_output(output: str) -> None:
    if output not in ("table", "json"):
        _fail(ValueError(f"unknown output format {output!r} (use table or json)"))


@app.command("offers")
def offers_cmd(
    provider: str | None = typer.Option(None, "--provider", "-p", help="aws | gcp | azure"),
    region: str | None = typer.Option(None, "--region", "-r"),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU model, e.g. A100, H100, T4"),
    instance_type: str | None = typer.Option(None, "--instance-type", "-t"),
    limit: int = typer.Option(0, "--limit", help="show at most N offers (0: all)"),
    output: str = OutputOpt,
) -> None:
    """Instance types with on-demand and spot prices (USD/hour)."""
    from providers.catalog import Catalog

    _check_output(output)
    try:
        found = Catalog.load().offers(
            provider=provider, region=region, gpu=gpu, instance_type=instance_type
        )
    except NotFoundError as exc:
        _fail(exc)
        return
    if limit > 0:
        found = found[:limit]
    rows: list[dict[str, Any]] = [
        {**dataclasses.asdict(o), "interconnect": o.interconnect.value} for o in found
    ]
    if output == "json":
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table("provider", "region", "instance_type", "vcpu", "memory_gib", "gpus",
                  "interconnect", "usd/h", "spot usd/h")
    for r in rows:
        gpus = f"{r['gpu_count']}x{r['gpu_model']}" if r["gpu_count"] else "-"
        sp = r["spot_price_usd_per_hour"]
        spot = "-" if sp is None else f"{sp:.4f}"
        table.add_row(r["provider"], r["region"], r["instance_type"], f"{r['vcpu']:g}",
                      f"{r['memory_gib']:g}", gpus, r["interconnect"],
                      f"{r['price_usd_per_hour']:.4f}", spot)
    Console().print(table)
    typer.echo(f"{len(rows)} offers")


@app.command("rtt")
def rtt_cmd(
    a: str = typer.Argument(..., help="provider:region, e.g. aws:us-east-1"),
    b: str = typer.Argument(..., help="provider:region, e.g. gcp:europe-west4"),
    output: str = OutputOpt,
) -> None:
    """Round-trip time between two regions: Skyplane-measured or estimated from coordinates."""
    from providers.catalog import Catalog

    _check_output(output)
    cat = Catalog.load()
    try:
        ms, source = cat.rtt_ms(a, b)
        egress = cat.egress_usd_per_gb(a, b)
        gbps = cat.throughput_gbps(a, b)
    except NotFoundError as exc:
        _fail(exc)
        return
    if output == "json":
        typer.echo(json.dumps({"a": a, "b": b, "rtt_ms": ms, "source": source,
                               "egress_usd_per_gb": egress, "throughput_gbps": gbps}))
    else:
        typer.echo(f"{a} <-> {b}: {ms:.1f} ms ({source}); egress {egress:.4f} USD/GB; "
                   f"{gbps:.2f} Gbps")


@app.command("regions")
def regions_cmd(
    provider: str | None = typer.Option(None, "--provider", "-p"),
    output: str = OutputOpt,
) -> None:
    """Regions with coordinates (city-level approximations)."""
    from providers.catalog import Catalog

    _check_output(output)
    try:
        regions = Catalog.load().regions(provider)
    except NotFoundError as exc:
        _fail(exc)
        return
    rows = [dataclasses.asdict(r) for r in regions]
    if output == "json":
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table("provider", "region", "lat", "lon", "where")
    for r in rows:
        lat = "-" if r["lat"] is None else f"{r['lat']:.2f}"
        lon = "-" if r["lon"] is None else f"{r['lon']:.2f}"
        table.add_row(r["provider"], r["name"], lat, lon, r["display_name"])
    Console().print(table)
