"""`skyfed-edge`: the edge agent's command line (placeholder)."""

from __future__ import annotations

import typer

app = typer.Typer(name="skyfed-edge", no_args_is_help=True, add_completion=False)


@app.command()
def version() -> None:
    """Print the agent's version."""
    typer.echo("skyfed-edge 0.1.0")


def main() -> None:
    app()
