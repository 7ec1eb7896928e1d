"""Prewarm: fetch a service's data and image before the site has to serve it.

Data sets are downloaded with httpx (imported lazily: it costs ~7 MB RSS, and
an agent that never prewarms should not pay for it):

- streamed to `<cache>/.partial/<name>.part`, hashed while streaming;
- resumed with an HTTP `Range` request when a partial file exists (a 200
  answer instead of 206 means the server ignores ranges: start over);
- verified against the expected sha256, then renamed atomically into the cache
  (a reader never sees a half-written file under the final name);
- retried with exponential backoff on transport errors and 5xx (tenacity);
- at most `max_concurrent` downloads at a time (a semaphore);
- the cache is an LRU bounded by `max_bytes`: using a file touches its mtime,
  and the least recently used files are evicted to make room.

Images are pre-pulled through a configurable command (`crictl pull {image}`,
`docker pull {image}`, ...), so the agent needs no container runtime library.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.protocol import DataItem

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int | None], None]  # (name, bytes done, total or None)
CHUNK = 256 * 1024


class PrewarmError(Exception):
    """A download or pull that failed for good; names the item."""

    def __init__(self, item: str, reason: str) -> None:
        super().__init__(f"prewarm of {item} failed: {reason}")
        self.item = item
        self.reason = reason


class _Retryable(Exception):
    pass


class DataCache:
    """A directory of verified files, bounded in bytes, evicted least recently used."""

    def __init__(self, root: Path, *, max_bytes: int, max_concurrent: int = 2,
                 retries: int = 4, timeout_s: float = 30.0) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.retries = retries
        self.timeout_s = timeout_s
        self._partial = root / ".partial"
        self._partial.mkdir(parents=True, exist_ok=True)
        self._sem = asyncio.Semaphore(max_concurrent)
        self._client: Any = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def path(self, item: DataItem) -> Path:
        name = item.name or item.sha256
        if not name or "/" in name or name.startswith("."):
            raise PrewarmError(item.url, f"bad cache file name {name!r}")
        return self.root / name

    def has(self, item: DataItem) -> bool:
        p = self.path(item)
        if p.exists():
            os.utime(p)  # LRU touch
            return True
        return False

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.iterdir() if p.is_file())

    def evict_for(self, incoming_bytes: int) -> list[str]:
        """Remove least recently used files until `incoming_bytes` fit; returns their names."""
        if incoming_bytes > self.max_bytes:
            raise PrewarmError("cache", f"{incoming_bytes} bytes exceed the cache "
                                        f"limit of {self.max_bytes}")
        files = sorted((p for p in self.root.iterdir() if p.is_file()),
                       key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        evicted: list[str] = []
        for p in files:
            if total + incoming_bytes <= self.max_bytes:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
            evicted.append(p.name)
        return evicted

    async def fetch(self, item: DataItem, *, progress: Progress | None = None) -> Path:
        """Download `item` into the cache (or find it there) and return its path."""
        final = self.path(item)
        if self.has(item):
            return final
        async with self._sem:
            if self.has(item):
                return final
            import tenacity

            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(self.retries + 1),
                wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
                retry=tenacity.retry_if_exception_type(_Retryable),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._download(item, final, progress)
            except _Retryable as exc:
                raise PrewarmError(item.url, f"gave up after {self.retries + 1} tries: "
                                             f"{exc}") from exc
        return final

    async def _download(self, item: DataItem, final: Path, progress: Progress | None) -> None:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=True)
        part = self._partial / (final.name + ".part")
        have = part.stat().st_size if part.exists() else 0
        digest = hashlib.sha256()
        if have:
            with part.open("rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    digest.update(chunk)
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            async with self._client.stream("GET", item.url, headers=headers) as resp:
                if resp.status_code >= 500:
                    raise _Retryable(f"HTTP {resp.status_code}")
                if resp.status_code == 416 and have:  # nothing left to fetch
                    pass
                elif resp.status_code >= 400:
                    raise PrewarmError(item.url, f"HTTP {resp.status_code}")
                elif resp.status_code == 200 and have:
                    have, digest = 0, hashlib.sha256()  # range ignored: start over
                total = _total_size(resp, have) or item.size_bytes
                if total is not None:
                    self.evict_for(total)
                mode = "ab" if have else "wb"
                done = have
                if resp.status_code != 416:
                    with part.open(mode) as f:
                        async for chunk in resp.aiter_bytes():  # as it arrives: resumable
                            f.write(chunk)
                            digest.update(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(final.name, done, total)
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if digest.hexdigest() != item.sha256.lower():
            part.unlink(missing_ok=True)
            raise PrewarmError(item.url, f"sha256 mismatch (got {digest.hexdigest()})")
        self.evict_for(part.stat().st_size)
        os.replace(part, final)


def _total_size(resp: Any, have: int) -> int | None:
    cr = resp.headers.get("content-range")  # bytes 100-199/200
    if cr and "/" in cr:
        tail = cr.rsplit("/", 1)[1]
        return int(tail) if tail.isdigit() else None
    cl = resp.headers.get("content-length")
    if cl and cl.isdigit():
        return int(cl) + (have if resp.status_code == 206 else 0)
    return None


async def pull_image(image: str, *, command: str, timeout_s: float = 600.0) -> None:
    """Run the configured pull command (`{image}` is substituted) and check its exit code."""
    if not command:
        raise PrewarmError(image, "no image pull command configured (--pull-command)")
    argv = [a.replace("{image}", image) for a in shlex.split(command)]
    if "{image}" not in command:
        argv.append(image)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise PrewarmError(image, f"cannot run {argv[0]!r}: {exc}") from exc
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PrewarmError(image, f"pull timed out after {timeout_s} s") from None
    if proc.returncode != 0:
        raise PrewarmError(image, f"exit {proc.returncode}: {err.decode(errors='replace')[-300:]}")
