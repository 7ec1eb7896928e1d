"""A loopback HTTP server that replays libcloud's own recorded GCE / Azure ARM fixtures.

The fixtures ship in the libcloud wheel (libcloud/test/compute/fixtures/{gce,azure_arm}).
File names derive from the request path (FACTS.md): GCE strips the project prefix and turns
`/` into `_` (mutating methods get a `_post`/`_delete` suffix); Azure turns `/`, `.`, `-`
into `_`. `extra` adds hand-written fixtures (documented API shapes libcloud has no recording
for, e.g. Azure compute usages), and `faults` makes the next N requests answer an error code.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import libcloud

FIXTURES = Path(libcloud.__file__).parent / "test" / "compute" / "fixtures"


@dataclass
class FixtureState:
    kind: str  # gce | azure_arm
    # [METHOD ]path -> JSON body, or (status, JSON body) for an error the API documents
    extra: dict[str, object] = field(default_factory=dict)
    faults: list[int] = field(default_factory=list)  # status codes to answer next, in order
    requests: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # each request's body, in order


def _candidates(kind: str, method: str, path: str) -> list[str]:
    if kind == "gce":
        own = "/compute/v1/projects/project_name"
        p = path[len(own):] if path.startswith(own) else re.sub(r"^/compute/v1/", "", path)
        base = p.strip("/").replace("/", "_") or "project"
        head, _, last = p.strip("/").rpartition("/")
        alt = "_".join(x for x in (head.replace("/", "_"), last.replace("-", "_")) if x)
        names = []
        if method != "GET":
            names.append(f"{base}_{method.lower()}")
        names += [base, alt]
        if "/operations/" in p:  # operation-zones-us-central1-a-instances-post
            op = re.sub(r"([a-z]+)_([a-z]+\d)_([a-z])(?=_|$)", r"\1-\2-\3", last.replace("-", "_"))
            names.append(f"operations_{op}")
        return [f"{n}.json" for n in names]
    base = re.sub(r"[/.\-]", "_", path)
    names = [base] if method == "GET" else [f"{base}_{method.lower()}", base]
    return [f"{n}.json" for n in names]


def _handler(state: FixtureState) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = urlparse(self.path).path
            state.requests.append(f"{self.command} {path}")
            state.bodies.append(body)
            if state.faults:
                code = state.faults.pop(0)
                self._send(code, {"error": {"code": code, "message": f"injected {code}"}})
                return
            for key in (f"{self.command} {path}", path):  # "METHOD /path" first, then any method
                if key in state.extra:
                    answer = state.extra[key]
                    code, reply = answer if isinstance(answer, tuple) else (200, answer)
                    self._send(code, reply)
                    return
            for name in _candidates(state.kind, self.command, path):
                f = FIXTURES / state.kind / name
                if f.is_file():
                    self._send(200, f.read_bytes())
                    return
            self._send(404, {"error": {"code": 404, "message": f"no fixture for {path}"}})

        def _send(self, code: int, body: object) -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _answer

    return H


@contextmanager
def serve(state: FixtureState) -> Iterator[int]:
    """Serve `state` on 127.0.0.1:<free port>; yields the port."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), name=f"fixtures-{state.kind}",
                         daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)
