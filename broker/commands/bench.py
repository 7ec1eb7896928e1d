"""`skyfed bench ...`: every benchmark prints a table, or JSON with `--json`.

Each subcommand is registered by the module that owns it
(`broker/bench/<name>.py` exposes `register(app)`), so adding a benchmark
touches only its own file and one line here.
"""

from __future__ import annotations

import typer

from broker.bench import api, chaos, drafts, e2e, failover, placement, twin

app = typer.Typer(no_args_is_help=True)

api.register(app)
placement.register(app)
failover.register(app)
twin.register(app)
drafts.register(app)
e2e.register(app)
chaos.register(app)
