"""N `skyfed serve` replicas on one PostgreSQL schema, as processes: what the chaos bench
(`skyfed bench chaos`) and the replica tests (tests/e2e/test_ha_replicas.py) drive.

Every replica is a full broker (API and loops; the loops run only in the elected leader,
broker/federation/leader.py) on its own port and data directory. `prepare` (bench/e2e.py)
registers simulated clusters first. Counting is done on the database, which is the truth:
`placement_counts` says how many workloads were placed and how many more than once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.bench.api import free_port, wait_ready

# Fast elections for the bench and tests: a candidate tries every 0.2 s, the leader checks
# its session every 0.2 s (the shipped defaults are 0.5 s).
FAST_HA = {"SKYFED_HA__RETRY_S": "0.2", "SKYFED_HA__CHECK_S": "0.2",
           "SKYFED_HA__SESSION_TIMEOUT_S": "1.0", "SKYFED_HA__GRACE_S": "1.0"}


@dataclass
class ReplicaSet:
    """`n` replicas of `skyfed serve` on `url` (a PostgreSQL URL with `schema=`)."""

    url: str
    n: int
    work_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    log_level: str = "WARNING"
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = [free_port() for _ in range(self.n)]
        self.procs = [None] * self.n

    def base(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def start(self, i: int) -> subprocess.Popen[bytes]:
        """Start replica `i` (again, after a kill, on the same port and data dir)."""
        data_dir = self.work_dir / f"replica-{i}"
        data_dir.mkdir(parents=True, exist_ok=True)
        env = os.environ | FAST_HA | self.env | {
            "SKYFED_STORE__URL": self.url, "SKYFED_DATA_DIR": str(data_dir),
            "SKYFED_API__HOST": "127.0.0.1", "SKYFED_LOG_LEVEL": self.log_level}
        env.pop("SKYFED_STORE_URL", None)
        cmd = [sys.executable, "-m", "broker.cli", "serve", "--port", str(self.ports[i])]
        with (data_dir / "broker.log").open("ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        self.procs[i] = proc
        return proc

    async def start_all(self, timeout_s: float = 90.0) -> None:
        for i in range(self.n):
            self.start(i)
        for i in range(self.n):
            await self.wait_ready(i, timeout_s)

    async def wait_ready(self, i: int, timeout_s: float = 90.0) -> None:
        proc = self.procs[i]
        if proc is None:
            raise RuntimeError(f"replica {i} is not running")
        await wait_ready(self.base(i), proc, timeout_s)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def kill(self, i: int) -> None:
        """kill -9 replica `i` (no shutdown, no clean disconnect)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.procs[i] = None

    def index_of_pid(self, pid: int) -> int | None:
        for i, p in enumerate(self.procs):
            if p is not None and p.pid == pid:
                return i
        return None

    def stop_all(self, timeout_s: float = 20.0) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            self.procs[i] = None

    def logs(self) -> str:
        """Every replica's log, for a failed test's message."""
        out = []
        for i in range(self.n):
            path = self.work_dir / f"replica-{i}" / "broker.log"
            if path.exists():
                out.append(f"--- replica {i}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(out)


async def leader(url: str) -> tuple[int, int] | None:
    """(epoch, pid of the holder) of the current leader term, from `leader_epochs`."""
    rows = await query(url, "SELECT epoch, holder FROM leader_epochs WHERE name = 'broker'")
    if not rows:
        return None
    epoch, holder = rows[0]
    return int(epoch), int(str(holder).split(":")[1])


async def wait_leader(url: str, rs: ReplicaSet, *, not_epoch: int | None = None,
                      timeout_s: float = 30.0) -> tuple[int, int, float]:
    """Wait for a term newer than `not_epoch` held by a live replica: (epoch, index, s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        now = await leader(url)
        if now is not None and now[0] != not_epoch:
            i = rs.index_of_pid(now[1])
            if i is not None and i in rs.alive():
                return now[0], i, time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no new leader within {timeout_s} s\n{rs.logs()}")


# A workload the placement loop placed twice: more `workload.placed` events than 1 + its
# re-queues (a re-queue legitimately asks for a new placement; a migration or an edge
# failover moves it without a `workload.placed`), or more than one active placement.
DOUBLE_PLACED = """
SELECT count(*) FROM workloads w WHERE w.name LIKE $1 AND (
  (SELECT count(*) FROM events e WHERE e.subject = w.id AND e.kind = 'workload.placed')
    > 1 + (SELECT count(*) FROM events e WHERE e.subject = w.id
           AND e.kind = 'workload.requeued')
  OR (SELECT count(*) FROM placements p WHERE p.workload_id = w.id AND p.active) > 1)
"""


async def placement_counts(url: str, prefix: str) -> dict[str, int]:
    """Over workloads named `prefix*`: how many exist, are placed (have an active or past
    placement), were placed twice (`DOUBLE_PLACED`), and names stored more than once."""
    rows = await query(url, """
        SELECT count(*) FILTER (WHERE n >= 1), count(*)
        FROM (SELECT w.id, count(p.id) AS n FROM workloads w
              LEFT JOIN placements p ON p.workload_id = w.id
              WHERE w.name LIKE $1 GROUP BY w.id) per""", prefix + "%")
    dup = await query(url, """SELECT count(*) FROM (SELECT name FROM workloads
                               WHERE name LIKE $1 GROUP BY name HAVING count(*) > 1) d""",
                      prefix + "%")
    double = await query(url, DOUBLE_PLACED, prefix + "%")
    placed, total = (int(v or 0) for v in rows[0])
    return {"workloads": total, "placed": placed, "double_placed": int(double[0][0] or 0),
            "duplicated": int(dup[0][0] or 0)}


async def wait_placed(url: str, prefix: str, want: int, timeout_s: float) -> dict[str, int]:
    """Poll `placement_counts` until `want` workloads are placed or `timeout_s` passed."""
    t0 = time.monotonic()
    counts = await placement_counts(url, prefix)
    while counts["placed"] < want and time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(0.2)
        counts = await placement_counts(url, prefix)
    return counts


async def names_stored(url: str, names: list[str]) -> set[str]:
    rows = await query(url, "SELECT DISTINCT name FROM workloads WHERE name = ANY($1::text[])",
                        names)
    return {str(r[0]) for r in rows}


async def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """One query on a short-lived asyncpg connection (the bench reads, it never writes)."""
    import asyncpg

    from broker.store.engine import parse_store_url

    su = parse_store_url(url)
    dsn = su.url.set(drivername="postgresql").render_as_string(hide_password=False)
    settings = {"search_path": su.schema} if su.schema else {}
    conn = await asyncpg.connect(dsn, server_settings=settings, timeout=10)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()
