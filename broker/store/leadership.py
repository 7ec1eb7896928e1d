"""Leader election and fencing for broker replicas (PostgreSQL); one broker per SQLite file.

Why: every replica serves the API, but the loops that decide and act (placement,
dispatcher, actuator, reconciler, quota sync, inventory, telemetry, the edge hub) must run
in exactly one, or two replicas place the same workload twice (issue 13, finding 4).

- Election (`PgLease`): `pg_try_advisory_lock(key)` on a DEDICATED asyncpg connection,
  not a pooled one. A session-level advisory lock lives exactly as long as that session:
  when the leader is killed, its connection is terminated (`pg_terminate_backend`) or the
  network drops it, PostgreSQL releases the lock and another replica's next try wins.
  Losing the connection therefore means losing leadership; the leader checks it every
  `check_s` and stops its loops at once (broker/federation/leader.py). The session asks
  the server for short TCP keepalives, so a leader cut off by the network loses the lock
  too, after about 11 s, instead of the OS default two hours. `key` is derived
  from the schema, so throw-away test schemas in one database never contend.
- Fencing epoch: the winner increments `leader_epochs.epoch` in the same session, in one
  transaction with a `leader.elected` event, and keeps the new value in a `Fence`. The
  singleton loops write through `Store.fenced(fence)`: each unit of work reads that row
  `FOR SHARE` just before it commits and is refused (`FencedError`, rolled back) unless
  the row still holds its epoch. The share lock makes a new leader's increment wait for a
  commit already in flight, so every write of a deposed leader either committed before the
  new epoch existed or is refused. Placements and decisions also carry the epoch that
  wrote them (`leader_epoch` columns), for audit and for the tests.
- Wake across replicas: a submission on any replica sends `NOTIFY <channel>` (through the
  fast path's pool, `notify_wake`); the leader LISTENs on its dedicated connection and wakes
  its placement loop, so event-driven placement holds across replicas.
- SQLite (`SqliteLock`): one broker per database file. `skyfed serve` holds an exclusive
  `flock` on `<db>.lock` for its lifetime; a second one refuses to start, naming the pid
  that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from broker.errors import ConfigError, FencedError
from broker.store.engine import json_dumps, mapped_errors, parse_store_url
from broker.store.models import LeaderEpochRow

if TYPE_CHECKING:
    from broker.store.uow import Store

log = logging.getLogger("skyfed")

ELECTION = "broker"  # the leader_epochs row of the broker's singleton loops

__all__ = ["ELECTION", "Fence", "PgLease", "SqliteLock", "check_fence", "election_key",
           "notify_wake", "wake_channel"]


class Fence:
    """The fencing epoch this replica leads under; None while it does not lead.

    Set by the elector (broker/federation/leader.py) when it wins, cleared the moment it
    learns it lost. `Store.fenced(fence)` reads it at the start of every unit of work.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None

    def current(self) -> int:
        """The epoch; raises `FencedError` while this replica is not the leader."""
        if self.epoch is None:
            raise FencedError("this replica is not the leader: its loops may not write")
        return self.epoch


async def check_fence(session: AsyncSession, epoch: int, *, name: str = ELECTION) -> None:
    """Refuse (`FencedError`) unless `leader_epochs[name]` still holds `epoch`.

    Reads the row FOR SHARE, so it stays locked until this transaction ends: a new
    leader's increment waits for the commit right after this check.
    """
    q = select(LeaderEpochRow.epoch).where(LeaderEpochRow.name == name).with_for_update(
        read=True)
    now_epoch = (await session.execute(q)).scalar_one_or_none()
    if now_epoch != epoch:
        raise FencedError(f"leader epoch {epoch} was superseded by {now_epoch}: this "
                          "replica was deposed and its write is refused")


def election_key(url: str) -> int:
    """The advisory-lock key of the election on `url`'s schema (a signed 64-bit int)."""
    schema = parse_store_url(url).schema or "public"
    digest = hashlib.sha256(f"skyfed-leader:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def wake_channel(url: str) -> str:
    """The LISTEN/NOTIFY channel that wakes the leader's placement loop on `url`."""
    return f"skyfed_wake_{election_key(url) & 0xFFFFFFFFFFFF:012x}"


async def notify_wake(store: Store, channel: str) -> None:
    """`NOTIFY channel` through the store's fast-path pool (PostgreSQL only)."""
    fast = store.fast_path
    if fast is None:
        return
    with mapped_errors("notify"):
        await fast.fetchrow("SELECT pg_notify($1, '')", channel)


_BUMP = """
INSERT INTO leader_epochs (name, epoch, holder, elected_s) VALUES ($1, 1, $2, $3)
ON CONFLICT (name) DO UPDATE SET epoch = leader_epochs.epoch + 1, holder = EXCLUDED.holder,
  elected_s = EXCLUDED.elected_s
RETURNING epoch
"""
_EVENT = """
INSERT INTO events (ts, tenant, kind, subject, data) VALUES ($1, NULL, 'leader.elected', $2,
  $3::jsonb)
"""


class PgLease:
    """One replica's candidacy: a dedicated connection that holds (or tries for) the lock.

    Not safe for concurrent use: the elector calls it from one task. Errors leave as
    `StoreError` (the connection failed) and never as asyncpg's own.
    """

    def __init__(self, url: str, *, holder: str, name: str = ELECTION,
                 timeout_s: float = 2.0) -> None:
        su = parse_store_url(url)
        self._dsn = su.url.set(drivername="postgresql").render_as_string(hide_password=False)
        # PostgreSQL must notice a leader cut off by the network (not killed) soon, or it
        # keeps the session and so the lock: TCP keepalives after 5 s idle, every 2 s, 3
        # missed = dead (~11 s; the server default is the OS's two hours), and unacked
        # data gives up after 10 s.
        self._settings = {"application_name": "skyfed-leader", "tcp_keepalives_idle": "5",
                          "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                          "tcp_user_timeout": "10000"}
        if su.schema:
            self._settings["search_path"] = su.schema
        self.key = election_key(url)
        self.channel = wake_channel(url)
        self.holder = holder
        self.name = name
        self.timeout_s = timeout_s
        self._conn: Any = None
        self.lost = asyncio.Event()  # set when the session ended under us

    async def connect(self) -> None:
        """Open the dedicated session (closing any old one first)."""
        import asyncpg

        await self.close()
        self.lost.clear()
        with mapped_errors("leader connect"):
            conn = await asyncpg.connect(self._dsn, timeout=self.timeout_s,
                                         server_settings=self._settings,
                                         command_timeout=self.timeout_s)
        conn.add_termination_listener(lambda _c: self.lost.set())
        self._conn = conn

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend of the session (for operators and the chaos bench)."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else int(conn.get_server_pid())

    async def try_acquire(self, now_s: float) -> int | None:
        """Take the lock if free: then bump and return the new epoch; else None."""
        conn = self._require()
        with mapped_errors("leader election"):
            got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key)
            if not got:
                return None
            async with conn.transaction():
                epoch = int(await conn.fetchval(_BUMP, self.name, self.holder, now_s))
                await conn.execute(_EVENT, now_s, self.name,
                                   json_dumps({"epoch": epoch, "holder": self.holder}))
        return epoch

    async def alive(self) -> bool:
        """Whether the session (and so the lock) still stands: one round trip, bounded."""
        conn = self._conn
        if conn is None or conn.is_closed() or self.lost.is_set():
            return False
        try:
            await asyncio.wait_for(conn.fetchval("SELECT 1"), timeout=self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the session is a lost lease
            log.warning("leader session check failed: %s", e)
            return False
        return True

    async def listen(self, callback: Callable[[], None]) -> None:
        """Call `callback` on every NOTIFY of the wake channel (until the session ends)."""
        conn = self._require()
        with mapped_errors("leader listen"):
            await conn.add_listener(self.channel, lambda *_a: callback())

    async def close(self) -> None:
        """Close the session: releases the lock (if held) at once."""
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        try:
            await asyncio.wait_for(conn.close(), timeout=self.timeout_s)
        except asyncio.CancelledError:
            conn.terminate()
            raise
        except Exception:  # noqa: BLE001 - a broken session is simply dropped
            conn.terminate()

    def _require(self) -> Any:
        if self._conn is None:
            raise FencedError("leader session is not connected")
        return self._conn


class SqliteLock:
    """An exclusive `flock` on `<database>.lock`: one broker per SQLite database file."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".lock")
        self._file: IO[str] | None = None

    @classmethod
    def for_url(cls, url: str) -> SqliteLock | None:
        """The lock for a file-backed SQLite `url`; None for PostgreSQL or `:memory:`."""
        su = parse_store_url(url)
        db = su.url.database
        if not su.is_sqlite or not db or db == ":memory:":
            return None
        return cls(Path(db).resolve())

    def acquire(self) -> None:
        """Take the lock or raise `ConfigError` naming the broker that holds it."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ConfigError(
                f"another skyfed broker (pid {holder}) already serves the SQLite database "
                f"{self.path.with_suffix('')}: SQLite supports one broker; run replicas on "
                "PostgreSQL (store.url = postgresql://...)") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()  # closing the descriptor drops the flock
