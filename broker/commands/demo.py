"""`skyfed demo`: the whole system on embedded defaults, narrated (broker/demo/)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Mount `skyfed demo` on the root app."""

    @app.command()
    def demo(
        serve: bool = typer.Option(False, "--serve",
                                   help="keep everything running, dashboard at /ui"),
        port: int = typer.Option(0, "--port", help="API port (0: a free one)"),
        config: Path | None = typer.Option(None, "--config",
                                           help="demo federation TOML (default config/demo.toml)"),
        data_dir: Path | None = typer.Option(None, "--data-dir",
                                             help="keep the run's data here (default: a temp dir)"),
        no_agents: bool = typer.Option(False, "--no-agents",
                                       help="do not start skyfed-edge agent processes"),
    ) -> None:
        """Run skyfed end to end: place a realistic mix, explain it, fail an edge site over."""
        import asyncio

        from rich.console import Console

        from broker.demo.federation import DemoConfigError
        from broker.demo.runner import DemoOptions, run_demo

        console = Console()
        if not console.is_terminal:
            console = Console(width=140)  # logs and CI: keep the tables readable
        opts = DemoOptions(config=config, data_dir=data_dir, serve=serve, port=port,
                           agents=not no_agents)
        try:
            code = asyncio.run(run_demo(opts, console))
        except DemoConfigError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from exc
        raise typer.Exit(code)
