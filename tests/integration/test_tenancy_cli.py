"""`skyfed token create|list|revoke` (the database) and `skyfed budget set|get` (HTTP, against
a real server in a thread) on SQLite (issue 13 finding 6: no way to list or revoke tokens,
no way to set a budget)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from broker.app import build_runtime, create_app
from broker.cli import app
from broker.settings import load_settings
from broker.store import migrate

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    asyncio.run(migrate.upgrade(url))
    return url


@pytest.fixture
def server(db: str, tmp_path: Path) -> Iterator[str]:
    rt = build_runtime(load_settings(store={"url": db}, data_dir=tmp_path))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(rt), host="127.0.0.1", port=port,
                                        lifespan="off", log_level="warning"))

    async def serve() -> None:
        try:
            await srv.serve()
        finally:
            await rt.store.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        threading.Event().wait(0.02)
    assert srv.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)


def skyfed(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def test_finding6_token_create_list_revoke(db: str) -> None:
    code, out = skyfed("token", "create", "--tenant", "ops", "--role", "operator",
                       "--expires-in", "600", "--url", db)
    assert code == 0, out
    assert out.strip().startswith("sf_")
    code, out = skyfed("token", "list", "--url", db, "-o", "json")
    assert code == 0, out
    [tok] = json.loads(out)
    assert (tok["tenant"], tok["role"], tok["revoked"]) == ("ops", "operator", False)
    assert tok["expiresS"] == pytest.approx(tok["createdS"] + 600)
    code, out = skyfed("token", "revoke", tok["id"], "--url", db)
    assert code == 0, out
    assert json.loads(skyfed("token", "list", "--url", db, "-o", "json")[1])[0]["revoked"]
    code, out = skyfed("token", "revoke", "tok-nope", "--url", db)
    assert code == 1
    assert "not found" in out
    code, out = skyfed("token", "create", "--tenant", "x", "--role", "root", "--url", db)
    assert code == 1


def test_finding6_budget_set_and_get_through_the_api(db: str, server: str) -> None:
    admin = skyfed("token", "create", "--tenant", "admin", "--role", "admin", "--url", db)[1]
    bob = skyfed("token", "create", "--tenant", "bob", "--url", db)[1]
    code, out = skyfed("budget", "set", "bob", "0.05", "--server", server,
                       "--token", admin.strip())
    assert code == 0, out
    assert "budget     0.05 USD/h" in out
    code, out = skyfed("budget", "get", "bob", "--server", server, "--token", bob.strip(),
                       "-o", "json")
    assert code == 0, out
    assert json.loads(out) == {"tenant": "bob", "budgetUsdPerHour": 0.05,
                               "committedUsdPerHour": 0.0, "leftUsdPerHour": 0.05,
                               "spentUsd": 0.0}
    code, out = skyfed("budget", "set", "bob", "0.05", "--server", server,
                       "--token", bob.strip())
    assert code == 1
    assert "403" in out
    code, out = skyfed("budget", "set", "bob", "--clear", "--server", server,
                       "--token", admin.strip())
    assert code == 0, out
    assert "budget     no cap" in out
