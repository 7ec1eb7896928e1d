"""Schema migrations (Alembic), driven from Python so `skyfed db ...` works from
any directory: the scripts live in the repository's `migrations/` folder, found
relative to this package.

`check_schema` is what the broker runs before it serves: a database that is not
at the code's head revision is refused with the command that fixes it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations as _migrations_pkg  # the Alembic scripts ship as a package
from broker.errors import ConfigError, SchemaOutdatedError
from broker.store.engine import create_engine, mapped_errors, parse_store_url
from broker.store.leadership import election_key

MIGRATIONS_DIR = Path(_migrations_pkg.__file__).resolve().parent
# Alembic announces its context on every schema check; only the steps are news.
logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)


def alembic_config() -> Config:
    if not (MIGRATIONS_DIR / "env.py").exists():
        raise ConfigError(f"migrations not found at {MIGRATIONS_DIR}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise ConfigError("no migration revisions found")
    return head


async def _with_connection(url: str, fn_name: str, revision: str) -> None:
    su = parse_store_url(url)
    engine = create_engine(url, pool_size=1)
    cfg = alembic_config()

    def run(conn: Connection) -> None:
        cfg.attributes["connection"] = conn
        getattr(command, fn_name)(cfg, revision)

    try:
        with mapped_errors(f"db {fn_name}"):
            async with engine.begin() as conn:
                if not su.is_sqlite:  # replicas' init containers migrate one at a time
                    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                                       {"k": election_key(url) ^ 1})
                if su.schema:
                    await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{su.schema}"'))
                await conn.run_sync(run)
    finally:
        await engine.dispose()


async def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (creates the schema= schema if needed)."""
    await _with_connection(url, "upgrade", revision)


async def downgrade(url: str, revision: str = "base") -> None:
    await _with_connection(url, "downgrade", revision)


async def current_revision_of(engine: AsyncEngine) -> str | None:
    def read(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    with mapped_errors("read schema revision"):
        async with engine.connect() as conn:
            return await conn.run_sync(read)


async def current(url: str) -> str | None:
    engine = create_engine(url, pool_size=1)
    try:
        return await current_revision_of(engine)
    finally:
        await engine.dispose()


async def check_schema(engine: AsyncEngine) -> None:
    """Raise `SchemaOutdatedError` unless the database is at the head revision."""
    have = await current_revision_of(engine)
    want = head_revision()
    if have != want:
        state = "is not migrated" if have is None else f"is at revision {have}"
        raise SchemaOutdatedError(
            f"database {engine.url.render_as_string(hide_password=True)} {state} "
            f"(this broker needs {want}); run: skyfed db upgrade")


async def drop_schema(url: str) -> None:
    """Drop the `schema=` schema of a PostgreSQL URL (tests, benchmark clean-up)."""
    su = parse_store_url(url)
    if not su.schema:
        raise ConfigError(f"store url {url!r} names no schema= to drop")
    engine = create_engine(url.split("?")[0], pool_size=1)
    try:
        with mapped_errors("drop schema"):
            async with engine.begin() as conn:
                await conn.execute(text(f'DROP SCHEMA IF EXISTS "{su.schema}" CASCADE'))
    finally:
        await engine.dispose()
