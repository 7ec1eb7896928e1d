"""The agent's offline journal: SQLite in WAL mode (stdlib `sqlite3`, no ORM).

Why: an agent cut off from the broker must keep running what it runs and
remember what happened, then tell the broker on reconnect -- exactly once in
effect. Three tables:

- `events`: append-only, each with a unique `event_id`; `sent` flips to 1 only
  after the broker acknowledged the publish (QoS 1 PUBACK). Replay sends the
  unsent ones in order; the hub de-duplicates by `event_id`, so a crash between
  publish and `mark_sent` costs a duplicate on the wire, never a lost event.
- `commands`: command ids already executed with the ack given, so a command
  redelivered (QoS 1) or re-sent after a reconnect is answered, not re-run.
- `state`: the desired services (spec + role), so a restarted agent brings its
  services back before it can reach the broker.

Writes are small and synchronous (`synchronous=NORMAL` is durable across
process crashes in WAL mode, which is the failure the journal is for).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    ts_ms REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_unsent ON events(sent, seq);
CREATE TABLE IF NOT EXISTS commands (
    command_id TEXT PRIMARY KEY,
    ts_ms REAL NOT NULL,
    ack TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class Journal:
    """One SQLite file per agent. Not thread-safe; used from the event loop only."""

    def __init__(self, path: Path | str, *, max_commands: int = 10_000) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._max_commands = max_commands

    def close(self) -> None:
        self._db.close()

    # events
    def append(self, kind: str, ts_ms: float, data: dict[str, Any]) -> str:
        event_id = uuid.uuid4().hex
        self._db.execute("INSERT INTO events(event_id, ts_ms, kind, data) VALUES (?,?,?,?)",
                         (event_id, ts_ms, kind, json.dumps(data)))
        return event_id

    def unsent(self, limit: int = 1000) -> list[tuple[str, float, str, dict[str, Any]]]:
        rows = self._db.execute(
            "SELECT event_id, ts_ms, kind, data FROM events WHERE sent = 0 ORDER BY seq LIMIT ?",
            (limit,)).fetchall()
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    def mark_sent(self, event_id: str) -> None:
        self._db.execute("UPDATE events SET sent = 1 WHERE event_id = ?", (event_id,))

    def prune(self, *, keep_sent: int = 10_000) -> int:
        """Drop the oldest events already sent, keeping the last `keep_sent` of them
        (an agent runs for months: the journal must not grow without bound)."""
        cur = self._db.execute(
            "DELETE FROM events WHERE sent = 1 AND seq <= "
            "(SELECT seq FROM events WHERE sent = 1 ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (keep_sent,))
        return int(cur.rowcount or 0)

    def count(self, *, sent: bool | None = None) -> int:
        if sent is None:
            row = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
        else:
            row = self._db.execute("SELECT COUNT(*) FROM events WHERE sent = ?",
                                   (int(sent),)).fetchone()
        return int(row[0])

    def events(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        for r in self._db.execute("SELECT event_id, kind, data FROM events ORDER BY seq"):
            yield r[0], r[1], json.loads(r[2])

    # commands (idempotency)
    def seen(self, command_id: str) -> str | None:
        """The ack JSON already given for `command_id`, or None if it is new."""
        row = self._db.execute("SELECT ack FROM commands WHERE command_id = ?",
                               (command_id,)).fetchone()
        return None if row is None else str(row[0])

    def remember(self, command_id: str, ts_ms: float, ack_json: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO commands(command_id, ts_ms, ack) VALUES (?,?,?)",
                         (command_id, ts_ms, ack_json))
        # Bound the table: the oldest ids can no longer be redelivered.
        self._db.execute(
            "DELETE FROM commands WHERE command_id IN (SELECT command_id FROM commands "
            "ORDER BY ts_ms DESC LIMIT -1 OFFSET ?)", (self._max_commands,))

    # desired state
    def put_state(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO state(key, value) VALUES (?, ?)",
                         (key, json.dumps(value)))

    def drop_state(self, key: str) -> None:
        self._db.execute("DELETE FROM state WHERE key = ?", (key,))

    def state(self, prefix: str = "") -> dict[str, Any]:
        rows = self._db.execute("SELECT key, value FROM state ORDER BY key").fetchall()
        return {r[0]: json.loads(r[1]) for r in rows if str(r[0]).startswith(prefix)}
