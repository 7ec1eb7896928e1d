"""Prewarm: streaming download with Range resume, sha256 verify, atomic rename, LRU, retries.

A real HTTP server in a thread (httpx's own test style) serves the bytes; it can
cut a response short or fail with 503 to exercise resume and retries.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge_agent.prewarm import DataCache, PrewarmError, pull_image
from edge_agent.protocol import DataItem

BLOB = os.urandom(300_000)
SHA = hashlib.sha256(BLOB).hexdigest()


class _Server:
    def __init__(self) -> None:
        self.cut_first_at: int | None = None  # bytes; then the connection is dropped
        self.fail_503: int = 0
        self.ignore_range = False
        self.ranges: list[str | None] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.ranges.append(self.headers.get("Range"))
                if outer.fail_503 > 0:
                    outer.fail_503 -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and not outer.ignore_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}")
                else:
                    self.send_response(200)
                body = BLOB[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.cut_first_at is not None:
                    n, outer.cut_first_at = outer.cut_first_at, None
                    self.wfile.write(body[:n])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/blob"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


async def test_download_verifies_and_renames_atomically(server: _Server, tmp_path: Path) -> None:
    cache = DataCache(tmp_path, max_bytes=10_000_000)
    seen: list[int] = []
    path = await cache.fetch(DataItem(url=server.url, sha256=SHA, name="blob.bin"),
                             progress=lambda _n, done, _t: seen.append(done))
    await cache.aclose()
    assert path == tmp_path / "blob.bin"
    assert path.read_bytes() == BLOB
    assert seen[-1] == len(BLOB)
    assert not list((tmp_path / ".partial").iterdir())


async def test_resume_with_range_after_a_cut(server: _Server, tmp_path: Path) -> None:
    server.cut_first_at = 100_000
    cache = DataCache(tmp_path, max_bytes=10_000_000, retries=3)
    path = await cache.fetch(DataItem(url=server.url, sha256=SHA))
    await cache.aclose()
    assert path.read_bytes() == BLOB
    assert server.ranges[0] is None
    assert server.ranges[1] is not None
    assert int(server.ranges[1].split("=")[1][:-1]) > 0


async def test_server_ignoring_range_restarts_cleanly(server: _Server, tmp_path: Path) -> None:
    server.cut_first_at = 50_000
    server.ignore_range = True
    cache = DataCache(tmp_path, max_bytes=10_000_000, retries=3)
    path = await cache.fetch(DataItem(url=server.url, sha256=SHA))
    await cache.aclose()
    assert path.read_bytes() == BLOB


async def test_retries_5xx_then_gives_up(server: _Server, tmp_path: Path) -> None:
    server.fail_503 = 2
    cache = DataCache(tmp_path, max_bytes=10_000_000, retries=2)
    assert (await cache.fetch(DataItem(url=server.url, sha256=SHA))).exists()
    server.fail_503 = 10
    with pytest.raises(PrewarmError, match="gave up after 2 tries"):
        await DataCache(tmp_path / "b", max_bytes=10_000_000, retries=1).fetch(
            DataItem(url=server.url, sha256=SHA))
    await cache.aclose()


async def test_sha_mismatch_is_rejected_and_not_cached(server: _Server, tmp_path: Path) -> None:
    cache = DataCache(tmp_path, max_bytes=10_000_000)
    with pytest.raises(PrewarmError, match="sha256 mismatch"):
        await cache.fetch(DataItem(url=server.url, sha256="0" * 64, name="bad"))
    await cache.aclose()
    assert not (tmp_path / "bad").exists()


def test_lru_eviction_keeps_recently_used(tmp_path: Path) -> None:
    cache = DataCache(tmp_path, max_bytes=250)
    for i, name in enumerate(["a", "b", "c"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    assert cache.has(DataItem(url="", sha256="", name="a"))  # touch: a is now the newest
    evicted = cache.evict_for(100)
    assert evicted == ["b", "c"]
    assert (tmp_path / "a").exists()
    with pytest.raises(PrewarmError, match="exceed the cache limit"):
        cache.evict_for(251)


async def test_pull_image_runs_the_configured_command(tmp_path: Path) -> None:
    marker = tmp_path / "pulled"
    cmd = f'{sys.executable} -c "import sys; open(sys.argv[1], \'w\').write(sys.argv[2])" {marker}'
    await pull_image("registry/app:1", command=cmd)
    assert marker.read_text() == "registry/app:1"
    with pytest.raises(PrewarmError, match="exit 3"):
        await pull_image("x", command=f"{sys.executable} -c 'raise SystemExit(3)'")
    with pytest.raises(PrewarmError, match="no image pull command"):
        await pull_image("x", command="")
