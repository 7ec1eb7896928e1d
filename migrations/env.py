"""Alembic environment for skyfed.

Normally driven by `skyfed db upgrade|downgrade|current` (`broker/store/migrate.py`),
which hands in an open connection through `config.attributes["connection"]`.
The plain `alembic` command works too (`alembic -c alembic.ini upgrade head`),
reading the URL from `$SKYFED_STORE__URL` / `$SKYFED_STORE_URL` or `sqlalchemy.url`.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from broker.store.engine import create_engine
from broker.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite",
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


def _main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = (os.environ.get("SKYFED_STORE__URL") or os.environ.get("SKYFED_STORE_URL")
           or config.get_main_option("sqlalchemy.url") or "")
    if not url:
        raise SystemExit("set SKYFED_STORE__URL (or use `skyfed db upgrade`)")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    asyncio.run(_run_async(url))


_main()
