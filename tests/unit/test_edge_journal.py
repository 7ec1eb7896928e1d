"""The agent's SQLite journal: events, idempotent commands, desired state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edge_agent.journal import Journal


def test_events_replay_only_unsent_in_order(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    ids = [j.append("k", float(i), {"i": i}) for i in range(3)]
    j.mark_sent(ids[0])
    assert [e[0] for e in j.unsent()] == ids[1:]
    assert j.count(sent=False) == 2
    assert j.count() == 3
    j.close()
    again = Journal(tmp_path / "j.sqlite")  # survives a restart
    assert [e[3]["i"] for e in again.unsent()] == [1, 2]
    again.close()


def test_wal_mode_is_on(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    j.close()
    with sqlite3.connect(tmp_path / "j.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_commands_remembered_and_bounded(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite", max_commands=3)
    assert j.seen("c0") is None
    for i in range(5):
        j.remember(f"c{i}", float(i), f'{{"n": {i}}}')
    assert j.seen("c4") == '{"n": 4}'
    assert j.seen("c0") is None  # oldest evicted
    j.close()


def test_state_put_drop_prefix(tmp_path: Path) -> None:
    j = Journal(":memory:")
    j.put_state("svc/a", {"role": "standby"})
    j.put_state("svc/b", {"role": "serving"})
    j.put_state("other", 1)
    assert set(j.state("svc/")) == {"svc/a", "svc/b"}
    j.drop_state("svc/a")
    assert set(j.state("svc/")) == {"svc/b"}
    j.close()


def test_prune_keeps_unsent_and_the_newest_sent(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite")
    ids = [j.append("k", float(i), {"i": i}) for i in range(10)]
    for e in ids[:8]:
        j.mark_sent(e)
    assert j.prune(keep_sent=3) == 5
    assert j.count(sent=True) == 3
    assert j.count(sent=False) == 2
    assert [e[0] for e in j.unsent()] == ids[8:]
    assert j.prune(keep_sent=3) == 0
    j.close()
