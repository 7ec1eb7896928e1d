"""schemathesis against the API in-process (ASGI) on the real PostgreSQL, as the admin
and as a tenant: no 5xx, no answer the OpenAPI document does not describe (status,
media type, headers, body schema), and every request the schema calls invalid is
refused with a 4xx.

The run is seeded (`SKYFED_FUZZ_SEED`, default 13), so CI sees the same cases every
time and a failure reproduces; set another seed to explore. It prints one line:

    schemathesis: <cases> cases, <failures> failures (seed S) statuses {...}

Print it with:
    .venv/bin/python -m pytest tests/integration/test_api_fuzz.py -q -s
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from schemathesis import checks as st_checks
from schemathesis.core.failures import FailureGroup
from schemathesis.python import asgi as st_asgi

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.settings import load_settings
from broker.store import migrate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ADMIN = "fuzz-admin-" + secrets.token_hex(8)
SEED = int(os.environ.get("SKYFED_FUZZ_SEED", "13"))
MIN_CASES = 1000
# Examples per (operation, principal, mode); operations without inputs have fewer.
EXAMPLES = 45
CHECKS = [st_checks.not_a_server_error, st_checks.status_code_conformance,
          st_checks.content_type_conformance, st_checks.response_headers_conformance,
          st_checks.response_schema_conformance, st_checks.negative_data_rejection]
Startup = Callable[[], Awaitable[dict[str, str]]]


class _Lifespan:
    """The app plus ASGI lifespan: schemathesis runs every request on one event loop of
    its own, so the store's connections must be made (and closed) on that loop."""

    def __init__(self, app: Any, startup: Startup, shutdown: Callable[[], Awaitable[None]]):
        self.app = app
        self.startup = startup
        self.shutdown = shutdown
        self.tokens: dict[str, str] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.tokens = await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


@pytest.fixture(scope="module")
def fuzz_app(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Lifespan]:
    url = f"{pg_url}?schema=t_fuzz_{secrets.token_hex(5)}"
    asyncio.run(migrate.upgrade(url))
    settings = load_settings(store={"url": url}, data_dir=tmp_path_factory.mktemp("fuzz"),
                             api={"admin_token": ADMIN})
    rt = build_runtime(settings)

    async def startup() -> dict[str, str]:
        await ensure_admin_token(rt)
        async with rt.store.unit() as uow:
            _, tenant = await uow.tokens.create(tenant="fuzz-tenant")
        return {"admin": ADMIN, "tenant": tenant}

    app = _Lifespan(create_app(rt), startup, rt.store.close)
    try:
        yield app
    finally:
        st_asgi.shutdown_lifespans()
        asyncio.run(migrate.drop_schema(url))


@dataclass
class Report:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"schemathesis: {self.cases} cases, {len(self.failures)} failures "
                f"(seed {SEED}) statuses {dict(sorted(self.statuses.items()))}")


def _bounded_watch(case: Any) -> None:
    """A watch streams until `timeoutSeconds` (default 300): the fuzz asks for the listing
    only (0), unless the case is about an invalid timeout (then it is refused at once)."""
    query = case.query if isinstance(case.query, dict) else None
    if query is None or str(query.get("watch", "")).lower() not in ("true", "1"):
        return
    timeout = query.get("timeoutSeconds")
    if timeout is None or (isinstance(timeout, int) and 0 <= timeout <= 3600):
        query["timeoutSeconds"] = 0


def _fuzz(operation: Any, mode: schemathesis.GenerationMode, token: str, who: str,
          session: Any, report: Report) -> None:
    headers = {"Authorization": f"Bearer {token}"}

    @hsettings(max_examples=EXAMPLES, deadline=None, database=None,
               phases=[Phase.explicit, Phase.generate],
               suppress_health_check=list(HealthCheck))
    @hypothesis.seed(SEED)
    @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
    def one(case: Any) -> None:
        report.cases += 1
        _bounded_watch(case)
        try:
            response = case.call(session=session)
        except Exception as exc:  # the app raised through the test client: a 500
            report.statuses[500] += 1
            report.failures.append(f"[{who} {mode.value}] {operation.label}: raised "
                                   f"{type(exc).__name__}: {exc}")
            return
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as exc:
            if len(report.failures) < 200:
                report.failures.append(f"[{who} {mode.value}] {operation.label}: "
                                       f"{str(exc)[:1500]}")

    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        one()  # Unsatisfiable: nothing to negate in an operation without inputs


def test_schemathesis_finds_no_5xx_and_no_schema_violation(fuzz_app: _Lifespan) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    report = Report()
    with st_asgi.get_client(fuzz_app) as session:
        tokens = fuzz_app.tokens
        for result in schema.get_all_operations():
            operation = result.ok()
            for who, token in tokens.items():
                for mode in (schemathesis.GenerationMode.POSITIVE,
                             schemathesis.GenerationMode.NEGATIVE):
                    _fuzz(operation, mode, token, who, session, report)
    print("\n" + report.line())
    Path("artifacts").mkdir(exist_ok=True)
    (Path("artifacts") / "schemathesis.txt").write_text(
        report.line() + "\n\n" + "\n\n".join(report.failures))
    assert report.failures == [], "\n\n".join(report.failures[:10])
    assert report.cases >= MIN_CASES, report.line()
