"""Engines, sessions and the one place SQL errors become `BrokerError`s.

URLs are SQLAlchemy async URLs: `postgresql+asyncpg://...` or
`sqlite+aiosqlite:///path`. Plain `postgresql://` and `sqlite:///` are
upgraded to their async drivers. A `schema=NAME` query parameter (PostgreSQL
only) puts every table in that schema through `search_path`: tests and the
benchmark use it to get an isolated, throw-away database inside `test`.

SQLite runs in WAL mode with foreign keys on, `synchronous=FULL` (a 201 means
the row is on disk) and a busy timeout; its pool holds ONE connection, so
writers queue in the pool instead of failing with "database is locked".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from broker.errors import ConfigError, ConflictError, SpecError, StoreError

try:
    import orjson

    def _dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()
except ImportError:  # pragma: no cover - orjson is in the broker extra
    import json

    def _dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))

# asyncpg's own errors (the submission fast path talks to asyncpg directly).
try:
    import asyncpg

    _PG_UNIQUE: tuple[type[BaseException], ...] = (asyncpg.UniqueViolationError,)
    # InternalClientError: a connection killed mid-request (pg_terminate_backend, a
    # failover) surfaces as this, untranslated by SQLAlchemy (FACTS.md). Retryable.
    _PG_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError,
                                                    asyncpg.InterfaceError,
                                                    asyncpg.InternalClientError)
except ImportError:  # pragma: no cover - SQLite-only installs
    _PG_UNIQUE = ()
    _PG_ERRORS = ()

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed store URL: the SQLAlchemy URL plus our own `schema` option."""

    url: URL
    schema: str | None

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def sync_url(self) -> str:
        """The same database through a sync driver (only alembic's offline tools need it)."""
        drv = "sqlite" if self.is_sqlite else "postgresql+psycopg2"
        return self.url.set(drivername=drv).render_as_string(hide_password=False)


def parse_store_url(raw: str) -> StoreUrl:
    """Parse and normalise a store URL; raise `ConfigError` naming what is wrong."""
    try:
        url = make_url(raw)
    except exc.ArgumentError as e:
        raise ConfigError(f"store url {raw!r} is not a database URL: {e}") from e
    backend = url.get_backend_name()
    if backend == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    elif backend == "postgresql":
        url = url.set(drivername="postgresql+asyncpg")
    else:
        raise ConfigError(f"store url {raw!r}: only postgresql and sqlite are supported")
    query = dict(url.query)
    schema = query.pop("schema", None)
    if isinstance(schema, tuple):
        schema = schema[-1]
    if schema is not None:
        if backend != "postgresql":
            raise ConfigError(f"store url {raw!r}: schema= is only for PostgreSQL")
        if not _SCHEMA_RE.match(schema):
            raise ConfigError(f"store url {raw!r}: schema {schema!r} is not a plain identifier")
    return StoreUrl(url=url.set(query=query), schema=schema)


def create_engine(raw_url: str, *, pool_size: int = 10, echo: bool = False) -> AsyncEngine:
    """Build the async engine for `raw_url` (see module docstring for options)."""
    su = parse_store_url(raw_url)
    kwargs: dict[str, Any] = {"echo": echo, "json_serializer": json_dumps}
    if su.is_sqlite:
        if su.url.database and su.url.database != ":memory:":
            Path(su.url.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs |= {"pool_size": 1, "max_overflow": 0, "pool_timeout": 60,
                   "connect_args": {"timeout": 30}}
    else:
        server_settings = {"application_name": "skyfed"}
        if su.schema:
            server_settings["search_path"] = su.schema
        kwargs |= {"pool_size": pool_size, "max_overflow": pool_size, "pool_pre_ping": False,
                   "connect_args": {"server_settings": server_settings, "timeout": 10,
                                    "command_timeout": 30}}
    engine = create_async_engine(su.url, **kwargs)
    if su.is_sqlite:
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def json_dumps(obj: Any) -> str:
    """Compact JSON text (orjson when installed): the JSON columns' serializer."""
    return _dumps(obj)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=FULL",
                   "busy_timeout=30000"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def _is_unique_violation(e: exc.DBAPIError) -> bool:
    orig = e.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code == "23505":
        return True
    return "UNIQUE constraint failed" in str(orig)


@contextmanager
def mapped_errors(what: str) -> Iterator[None]:
    """Map SQLAlchemy/asyncpg/sqlite errors raised inside to the broker tree, once.

    Unique and foreign-key violations become `ConflictError`; a value the
    database refuses (SQLSTATE class 22, "data exception": a NUL character, a
    number out of range) becomes `SpecError` (422: retrying cannot help, and a
    503 would page someone); everything else that the database or driver raises
    becomes `StoreError` (503, retryable). The original error stays attached as
    `__cause__`.
    """
    try:
        yield
    except _PG_UNIQUE as e:
        raise ConflictError(f"{what}: duplicate violation: {_short(e)}") from e
    except _PG_ERRORS as e:
        if _is_data_exception(e):
            raise SpecError(f"the database refused a value: {_short(e)}") from e
        raise StoreError(f"{what}: {_short(e)}") from e
    except exc.IntegrityError as e:
        kind = "duplicate" if _is_unique_violation(e) else "integrity"
        raise ConflictError(f"{what}: {kind} violation: {_short(e)}") from e
    except (exc.DBAPIError, exc.SQLAlchemyError, OSError) as e:
        if _is_data_exception(e):
            raise SpecError(f"the database refused a value: {_short(e)}") from e
        raise StoreError(f"{what}: {_short(e)}") from e


def _is_data_exception(e: BaseException) -> bool:
    """SQLSTATE class 22 (PostgreSQL's "data exception"), raw or wrapped by SQLAlchemy."""
    for err in (e, getattr(e, "orig", None), getattr(e, "__cause__", None)):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(code, str) and code.startswith("22"):
            return True
    return False


def _short(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e)
    return text.splitlines()[0][:300] if text else type(e).__name__
