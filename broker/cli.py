"""`skyfed`: the one command-line entry point.

Each command family lives in its own module under `broker/commands/` and is
mounted here. Heavy imports (FastAPI, SQLAlchemy, torch, HiGHS) happen inside
the command functions, so `skyfed --help` stays fast.
"""

from __future__ import annotations

import typer

from broker.commands import (
    bench,
    catalog,
    core,
    demo,
    lifecycle,
    placement,
    providers,
    tenancy,
    twin,
)

app = typer.Typer(
    name="skyfed",
    help="Multi-cloud and edge federation broker.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

core.register(app)  # serve, db, submit, get, describe, cancel
tenancy.register(app)  # token create/list/revoke, budget set/get
lifecycle.register(app)  # apply
placement.register(app)  # explain, whatif
twin.register(app)  # sim, train, policy
demo.register(app)  # demo
app.add_typer(catalog.app, name="catalog", help="The offline price/region/RTT catalog.")
app.add_typer(providers.app, name="providers", help="Provider accounts: sync offers and quotas.")
app.add_typer(bench.app, name="bench", help="Benchmarks: api, placement, failover, twin.")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
