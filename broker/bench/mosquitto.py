"""A bench's own Mosquitto on a free loopback port, never the system one (bench chaos).

Split from chaos.py.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from pathlib import Path

from broker.bench.api import free_port


class Mosquitto:
    """The bench's own Mosquitto (anonymous, loopback, persistence in its directory)."""

    def __init__(self, work_dir: Path) -> None:
        self.port = free_port()
        self.dir = work_dir / "mosquitto"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                             f"set_tcp_nodelay true\npersistence true\n"
                             f"persistence_location {self.dir}/\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def start(self) -> None:
        self.launch()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                await asyncio.sleep(0.02)
        raise RuntimeError("the bench's mosquitto did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
